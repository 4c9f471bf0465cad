"""The smallest budget that meets an accuracy target: the largest noise scale of a new release.

Searches over the scale b of a new measurement for the BLUE of a query from the
history of an :class:`~dpgate.inference.IncrementalBLUE` plus that measurement
(``minimal_scale``), or for a single release alone (``single_release_scale``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from dpgate._validate import finite_array, positive_finite, probability, real
from dpgate.errors import InvalidArgument
from dpgate.inference._incremental import IncrementalBLUE
from dpgate.inference._law import ErrorLaw, Method
from dpgate.inference._pricer import Pricer

__all__ = ["minimal_scale", "single_release_scale"]

# minimal_scale treats a scale below this as failing the target: far below the
# finest noise lattice (2^-60 / 1024), where 1/b overflows the error law's arithmetic.
_MIN_SEARCH_SCALE = 1e-30


def minimal_scale(
    state: IncrementalBLUE,
    Q: ArrayLike,
    h_new: ArrayLike,
    accuracy: float,
    confidence: float,
    max_scale: float = math.inf,
    *,
    lattice: float | Callable[[float], float] = 0.0,
    method: Method = "exact",
    rel_tol: float = 1e-4,
    gaussian: bool = False,
) -> float | None:
    """Largest Laplace scale b (Gaussian: deviation σ) for a new measurement ``h_new`` meeting the target.

    "Meeting the target" means the certified ``confidence`` half-width of the
    BLUE of Q from history plus the new answer is ≤ ``accuracy``.  The returned
    b always meets it (it is checked, not extrapolated); it is within about a
    factor ``1 + rel_tol`` of the crossing found by bracketing and Brent's method
    in log b (the half-width grows with b in every case we know of, but the BLUE
    is not peakedness-optimal, so monotonicity is not proven).  The caller
    charges ``α = S/b``.

    Args:
        state: History so far (not modified).
        Q: The query over the atoms of ``state``.
        h_new: The query to measure freshly (usually Q itself).
        accuracy: Target half-width (> 0).
        confidence: Target level 1 − δ in (0, 1).
        max_scale: Upper cap on b; returned if it already meets the target.
        lattice: Lattice step of the new noise: a callable ``b ↦ γ(b)`` or a
            float ratio (``γ = lattice · b``); 0 for continuous noise.
        method: Error-law method (``"exact"`` recommended).
        rel_tol: Relative precision of the search in b.
        gaussian: The new release's noise is (discrete) Gaussian of deviation b (zCDP);
            the law is then normal when the history's is, a Gil-Pelaez mixture otherwise.

    Returns:
        The scale b, or ``None`` if no scale can meet the target (Q not
        estimable even with ``h_new``, or the history's own noise already too
        wide where ``h_new`` cannot help).  ``max_scale`` (possibly inf) if
        history alone meets the target.

    Raises:
        InvalidArgument: On invalid accuracy, confidence, max_scale or rel_tol.
    """
    acc = positive_finite(accuracy, "accuracy")
    conf = probability(confidence, "confidence")
    if not real(max_scale, "max_scale") > 0:  # inf is allowed: no cap
        raise InvalidArgument(f"max_scale must be positive; got {max_scale!r}.")
    probability(rel_tol, "rel_tol")
    Qv = finite_array(Q, "Q", ndim=1, size=state.n_atoms)
    pr = state.pricer(Qv, h_new)
    if not pr.estimable:
        return None
    gamma: Callable[[float], float] = lattice if callable(lattice) else (lambda b: float(lattice) * b)
    fresh = _Fresh(state, gamma, gaussian)

    if pr.extends and pr.same:
        # Measuring Q itself extends the row space, so history alone cannot estimate Q
        # and the BLUE gives it zero weight (up to rounding): the law is the fresh
        # release alone.  Its closed form answers the search; the full law confirms it.
        c = float(pr.ce_over_rho)
        if c != 0.0 and method == "exact":
            b = _largest_meeting(_single_excess(c, acc, conf, gamma, gaussian), acc, conf, max_scale, rel_tol)
            if b is not None and _excess_at(pr, fresh, acc, conf, method, b) <= 0.0:
                return b
    else:
        hist = state.estimate(Qv, method)
        if hist.estimable and hist.halfwidth(conf) <= acc:
            return float(max_scale)
    return _largest_meeting(lambda b: _excess_at(pr, fresh, acc, conf, method, b),
                            acc, conf, max_scale, rel_tol)


class _Fresh:
    """The history's noise and how a new release at scale b joins it: its BLUE weight scale
    (``b/√2`` for a Gaussian release: the Laplace scale of variance b²), lattice and family."""

    def __init__(self, state: IncrementalBLUE, gamma: Callable[[float], float], gaussian: bool) -> None:
        self.weight_scales, self.steps = state.scales, state.lattice
        self.scales, mask = state.law_scales()
        self.gamma, self.gaussian = gamma, gaussian
        self.mask = None if mask is None and not gaussian else np.append(
            np.zeros(state.n_rows, dtype=bool) if mask is None else mask, gaussian)

    def law(self, pr: Pricer, b: float, method: Method) -> ErrorLaw:
        """The BLUE's error law with the new row at scale b."""
        w = b / math.sqrt(2.0) if self.gaussian else b
        u_hist, u_new = pr.at(w)
        return ErrorLaw(
            np.append(u_hist / self.weight_scales, u_new / w),
            np.append(self.scales, b),
            np.append(self.steps, self.gamma(b)),
            method,
            gaussian=self.mask,
        )


def _excess_at(pr: Pricer, fresh: _Fresh, acc: float, conf: float, method: Method, b: float) -> float:
    """Certified half-width of the BLUE with the new row at scale b, minus the target."""
    if b < _MIN_SEARCH_SCALE:  # an extreme accuracy drives the bracket below any usable scale
        return math.inf
    return fresh.law(pr, b, method).halfwidth(conf) - acc


def single_release_scale(
    accuracy: float,
    confidence: float,
    lattice: float | Callable[[float], float] = 0.0,
    max_scale: float = math.inf,
    *,
    rel_tol: float = 1e-4,
    gaussian: bool = False,
) -> float | None:
    """Largest scale b at which one fresh release of the query certifies ``±accuracy``
    (``gaussian``: its deviation σ, the law a (discrete) normal, closed form too).

    The law is a single (discrete, on its lattice ``γ(b)``) Laplace term with
    coefficient 1, whose certified half-width has a closed form, so the search
    costs microseconds.  It is the same search as :func:`minimal_scale` and
    returns what that returns for a query measured on an empty history (or
    whenever measuring it extends the row space, so history gets no weight):
    every history-free group of a GROUP BY can share this one scale.

    Args:
        accuracy: Target half-width (> 0).
        confidence: Target level 1 − δ in (0, 1).
        lattice: A callable ``b ↦ γ(b)`` or a float ratio (``γ = lattice · b``);
            0 for continuous noise.
        max_scale: Upper cap on b.
        rel_tol: Relative precision of the search in b.

    Returns:
        The scale b, or ``None`` if no scale meets the target.

    Raises:
        InvalidArgument: On invalid accuracy, confidence, max_scale or rel_tol.

    Example:
        >>> b = single_release_scale(10.0, 0.95)  # continuous: 10 / ln 20
        >>> bool(abs(b - 10.0 / math.log(20.0)) < 1e-3 * b)
        True
    """
    acc = positive_finite(accuracy, "accuracy")
    conf = probability(confidence, "confidence")
    if not real(max_scale, "max_scale") > 0:
        raise InvalidArgument(f"max_scale must be positive; got {max_scale!r}.")
    probability(rel_tol, "rel_tol")
    gamma: Callable[[float], float] = lattice if callable(lattice) else (lambda b: float(lattice) * b)
    return _largest_meeting(_single_excess(1.0, acc, conf, gamma, gaussian), acc, conf, max_scale, rel_tol)


def _single_excess(c: float, acc: float, conf: float, gamma: Callable[[float], float],
                   gaussian: bool = False) -> Callable[[float], float]:
    """Excess of one fresh release with weight c: the law :func:`minimal_scale` builds on an
    empty history (a closed form, discrete or continuous)."""
    coef = np.array([c])
    mask = np.ones(1, dtype=bool) if gaussian else None

    def excess(b: float) -> float:
        if b < _MIN_SEARCH_SCALE:
            return math.inf
        return ErrorLaw(coef, np.array([b]), np.array([gamma(b)]), gaussian=mask).halfwidth(conf) - acc

    return excess


def _largest_meeting(excess: Callable[[float], float], acc: float, conf: float, max_scale: float,
                     rel_tol: float) -> float | None:
    """The search of :func:`minimal_scale`: bracket by factors of 4 from the continuous
    single-Laplace scale, Brent's method in log b, then step onto the meeting side."""

    def meets(b: float) -> bool:
        return excess(b) <= 0.0

    b0 = min(acc / -math.log1p(-conf), float(max_scale))
    # Not even 1e-12 of the closed-form scale (nor any usable scale) meets it: none does.
    floor = max(b0 * 1e-12, _MIN_SEARCH_SCALE)
    if not b0 > floor:  # an accuracy so fine that b0 underflows below any usable scale
        return None
    # Bracket [lo, hi] with lo meeting the target and hi not, by factors of 4.
    if meets(b0):
        lo, hi = b0, math.inf
        while hi == math.inf:
            b = lo * 4.0
            if b >= max_scale:
                if meets(float(max_scale)):
                    return float(max_scale)
                hi = float(max_scale)
            elif meets(b):
                lo = b
            else:
                hi = b
    else:
        hi = b0
        while True:
            b = hi / 4.0
            if b < floor:
                if not meets(floor):
                    return None
                lo = floor
                break
            if meets(b):
                lo = b
                break
            hi = b
    # Brent's method on log b (the half-width is close to linear in b), then make
    # sure the answer is on the meeting side: never return a b that fails.
    try:
        root = math.exp(brentq(lambda lb: excess(math.exp(lb)), math.log(lo), math.log(hi),
                               xtol=rel_tol / 4.0, rtol=1e-15))
    except ValueError:
        # The certified half-width is a step function when one discrete term
        # dominates; exp(log(b)) may land on the other side of a step.  Bisect.
        a, z = lo, hi
        while z / a > 1.0 + rel_tol / 4.0:
            mid = math.sqrt(a * z)
            a, z = (mid, z) if meets(mid) else (a, mid)
        root = a
    b = min(root * (1.0 - rel_tol / 4.0), hi)
    while b > lo and not meets(b):
        b *= 1.0 - rel_tol / 2.0
    return max(b, lo)
