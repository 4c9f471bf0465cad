"""Algorithm 2 (discrete probability calculation) with certified error bounds.

The algorithm is from Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012), §4.3.

Each term ``a_k L_k`` is rounded to the grid ``h ℤ`` (``h`` = ``step``) and its
probability mass vector truncated to ``|j| ≤ J_k`` with
``J_k = ceil(a_k ln(m/γ)/h − 1/2)``, so the mass lost per term is
``exp(−(J_k + 1/2) h / a_k) ≤ γ/m`` and in total ≤ γ (Xiao & Xiong (2012), Lemma 4.15).
The vectors are convolved from the shortest to the longest (§4.3.2).

What the result guarantees.  Let ``R = Σ R_k`` be the rounded sum and ``u`` the
computed sub-probability vector, ``u_j = P(R = jh, no term truncated)``.  The
rounding errors ``δ_k = a_k L_k − R_k ∈ [−h/2, h/2]`` are independent and
symmetric, so by Hoeffding ``P(|Σδ_k| > w) ≤ η`` for
``w = h √(m ln(2/η) / 2)`` (or deterministically ``w = m h / 2``, whichever is
smaller).  Hence, rigorously,

    P(|E| ≤ kh + w) ≥ Σ_{|j| ≤ k} u_j − η.

The paper's own error measure (Theorem 4.16) ignores the rounding; it is only
small when ``h`` is small against the spread of E.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = ["ConvolutionLaw"]

HOEFFDING_ETA = 1e-9
_DIRECT_LIMIT = 256  # shorter operand below this: direct convolution is faster than FFT


def _term_pmf(a: float, step: float, reach: float) -> NDArray[np.float64]:
    """Mass of ``a L`` in the bins ``[(j − 1/2)h, (j + 1/2)h)`` for ``|j| ≤ J``."""
    J = max(0, math.ceil(a * reach / step - 0.5))
    j = np.arange(0, J + 1, dtype=np.float64)
    upper = np.exp(-(j + 0.5) * step / a)  # P(aL > (j + 1/2) h) · 2
    lower = np.concatenate(([1.0], upper[:-1]))
    half = 0.5 * (lower - upper)
    half[0] = 1.0 - upper[0]  # the central bin is symmetric around 0
    return np.concatenate((half[:0:-1], half))


class ConvolutionLaw:
    """Discretised law of ``E = Σ a_k L_k`` (Xiao & Xiong (2012), Algorithm 2).

    Args:
        a: Positive term scales ``|c_k| b_k``.
        gamma: Total probability mass the truncation may lose (the paper's γ).
        step: Grid step h; ``None`` picks ``sd/64`` but never so small that the
            support exceeds about two million points.
    """

    def __init__(self, a: NDArray[np.float64], gamma: float, step: float | None) -> None:
        m = a.size
        sd = math.sqrt(2.0 * float(np.dot(a, a)))
        reach = math.log(m / gamma)
        if step is None:
            step = max(sd / 64.0, 2.0 * reach * float(a.sum()) / 2e6)
        self.step = float(step)
        self.gamma = float(gamma)
        pieces = [_term_pmf(float(ak), self.step, reach) for ak in a]
        pieces.sort(key=len)  # shortest to longest, as the paper prescribes
        u = np.ones(1)
        for v in pieces:
            if v.size == 1:  # a term far narrower than the grid: only its cut mass matters
                u = u * v[0]
                continue
            if min(u.size, v.size) < _DIRECT_LIMIT:
                u = np.convolve(u, v)
            else:
                u = np.maximum(_fftconvolve(u, v), 0.0)
        self.pmf = u
        self.center = (u.size - 1) // 2
        self.mass = float(u.sum())
        self.rounding_width = min(
            m * self.step / 2.0, self.step * math.sqrt(m * math.log(2.0 / HOEFFDING_ETA) / 2.0)
        )
        # Cumulative mass of |R| ≤ kh, k = 0, 1, ...
        half = u[self.center :].copy()
        half[1:] += u[self.center - 1 :: -1][: half.size - 1]
        self._abs_cum = np.cumsum(half)
        self._cum = np.cumsum(u)

    def cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Central estimate of ``P(E ≤ x)``: the rounded law, renormalised,
        interpolated linearly between bin edges (exact at the edges for one term)."""
        pos = x / self.step + self.center + 0.5  # bin edges at integers
        edges = np.concatenate(([0.0], self._cum / self.mass))
        return np.interp(pos, np.arange(edges.size), edges, left=0.0, right=1.0)

    def abs_cdf_bounds(self, q: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Rigorous lower and upper bounds on ``P(|E| ≤ q)``."""
        cum = self._abs_cum

        def mass_within(r: NDArray[np.float64]) -> NDArray[np.float64]:
            k = np.floor(r / self.step + 1e-12).astype(np.int64)
            out = np.where(k < 0, 0.0, cum[np.clip(k, 0, cum.size - 1)])
            return out

        w = self.rounding_width
        lower = np.maximum(mass_within(q - w) - HOEFFDING_ETA, 0.0)
        # Upper: |E| ≤ q implies |R| ≤ q + w unless the rounding exceeds w or a term was cut.
        upper = np.minimum(mass_within(q + w) + HOEFFDING_ETA + (1.0 - self.mass), 1.0)
        return lower, upper

    def halfwidth(self, confidence: float) -> float:
        """Certified: smallest ``kh + w`` with ``Σ_{|j|≤k} u_j − η ≥ confidence``."""
        k = int(np.searchsorted(self._abs_cum, confidence + HOEFFDING_ETA, side="left"))
        if k >= self._abs_cum.size:
            return math.inf
        return k * self.step + self.rounding_width


def _fftconvolve(u: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    # scipy.signal costs seconds to import; only this cross-check method needs it.
    from scipy.signal import fftconvolve

    return np.asarray(fftconvolve(u, v), dtype=np.float64)
