"""Certified quantiles of ``|Σ a_k L_k|``, computed once per distinct law.

A GROUP BY prices every group at the same candidate scales, so the same laws
come back many times — equal in exact arithmetic, but with BLUE weights that
differ in the last bits and with history weights of order 1e-17 that are zero
in exact arithmetic.  Two rigorous reductions make them one memo entry:

* **Negligible terms.**  Split ``E = E_main + E_rest`` where ``Σ_rest a_k ≤ 1e-12 max a``.
  With ``η = 1e-12 (1 − conf)`` and ``r = Σ_rest a_k ln(n_rest/η)``,
  ``P(|E| > q + r) ≤ P(|E_main| > q) + Σ_rest P(|a_k L_k| > a_k ln(n_rest/η))
  = P(|E_main| > q) + η``, so the ``conf + η`` quantile of ``E_main`` plus r is
  certified for E.  Both shifts are below the 1e-11 precision of the search.
* **Rounding scales up.**  For ``a' ≥ a``, ``Laplace(a')`` is ``Laplace(a) + W`` with
  W independent and symmetric (its characteristic function
  ``(1 + a²t²)/(1 + a'²t²) = a²/a'² + (1 − a²/a'²)/(1 + a'²t²)`` is that of a
  mixture of 0 and ``Laplace(a')``).  E is log-concave, hence symmetric
  unimodal, and by Anderson's theorem adding W cannot raise the mass of
  ``[−q, q]``: a quantile of the law with every ``a_k`` rounded *up* bounds the
  true one.  Rounding to 36 significant bits widens it by at most 1.5e-11
  relative and makes bit-level differences vanish from the memo key.

A normal part ``N(0, v)`` (the Gaussian releases, one normal however many) is kept
whole; its variance is rounded up too (``N(0, v') = N(0, v) + N(0, v' − v)``, the same
argument), and the negligible terms are measured against ``max(max a, √v)``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import NDArray
from scipy.special import erfinv

from dpgate.inference._gilpelaez import ABS_CDF_ERROR, LaplaceSum

__all__ = ["sum_quantile"]

NEGLIGIBLE = 1e-12
"""Terms whose scales add up to at most this fraction of the largest are bounded, not inverted."""

_KEY_BITS = 36  # significant bits kept (rounding up) in the memo key
_MEMO_SIZE = 4096


def sum_quantile(a: NDArray[np.float64], conf: float, normal_var: float = 0.0) -> float:
    """Certified upper bound on the ``conf`` quantile of ``|Σ a_k L_k + N(0, normal_var)|`` (Gil-Pelaez).

    Within 1e-10 relative of :meth:`LaplaceSum.abs_quantile` at
    ``margin = ABS_CDF_ERROR`` and never below it by more than its own search
    tolerance; memoised on the reduced law (see the module docs).

    Args:
        a: Positive, finite term scales, at least two (or at least one with a normal part).
        conf: The level, in (0, 1).
        normal_var: Variance of the independent normal part, ≥ 0.
    """
    srt = np.sort(a)  # ascending: the negligible terms come first
    top = float(srt[-1]) if not normal_var else max(float(srt[-1]), math.sqrt(normal_var))
    n_rest = int(np.searchsorted(np.cumsum(srt), NEGLIGIBLE * top, side="right"))
    main, rest = srt[n_rest:], srt[:n_rest]
    eta, r = 0.0, 0.0
    if n_rest:
        eta = NEGLIGIBLE * (1.0 - conf)
        r = float(rest.sum()) * math.log(n_rest / eta) * (1.0 + 1e-12)
    if not normal_var:
        return _memo_quantile(_round_up(main).tobytes(), conf + eta) + r
    v = float(_round_up(np.array([normal_var]))[0])
    return _memo_quantile(_round_up(main).tobytes(), conf + eta, v) + r


def _round_up(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """Every value rounded up to :data:`_KEY_BITS` significant bits (exact float operations)."""
    m, e = np.frexp(a)
    return np.ldexp(np.ceil(np.ldexp(m, _KEY_BITS)), e - _KEY_BITS)


@functools.lru_cache(maxsize=_MEMO_SIZE)
def _memo_quantile(key: bytes, conf: float, normal_var: float = 0.0) -> float:
    a = np.frombuffer(key, dtype=np.float64)
    if normal_var:
        if a.size == 0:  # the normal alone: its closed form, nudged up for rounding
            return math.sqrt(2.0 * normal_var) * float(erfinv(conf)) * (1.0 + 1e-12)
        return LaplaceSum(a, normal_var).abs_quantile(conf, margin=ABS_CDF_ERROR)
    if a.size == 1:  # a single Laplace: P(|E| > q) = exp(−q/a), nudged up for rounding
        return float(a[0]) * -math.log1p(-conf) * (1.0 + 1e-12)
    return LaplaceSum(a).abs_quantile(conf, margin=ABS_CDF_ERROR)
