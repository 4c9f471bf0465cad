"""Posterior of a query answer θ given the released history.

From Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012), §4 and §5.2.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpgate._validate import finite, points
from dpgate.errors import InvalidArgument
from dpgate.inference._law import ErrorLaw
from dpgate.inference._support import Support

__all__ = ["Posterior"]


class Posterior:
    """Law of θ under the uninformative prior: ``θ = θ̂ − E`` (Xiao & Xiong (2012), Lemma 4.1).

    Looks like a frozen ``scipy.stats`` distribution.  Because E is symmetric,
    ``P(θ ≤ x) = P(E ≤ x − θ̂)``.  The narrowest (1 − δ) credible interval is
    ``θ̂ ± q`` with q the certified (1 − δ) quantile of ``|E|``; over repeated
    releases it is also a frequentist confidence interval with coverage
    ≥ 1 − δ.

    With a ``support`` (where the truth can lie: :mod:`dpgate.inference._support`) the law is
    censored to it: impossible events have probability 0, the cdf is unchanged at every
    possible value, and intervals are cut to the support (never below the coverage of
    ``θ̂ ± q``, never wider).  :meth:`mean` stays θ̂, the unbiased estimate, for averaging.

    Args:
        center: The point estimate θ̂ (finite).
        law: The law of the error E.
        support: Where θ can lie, or ``None`` for the real line.

    Raises:
        InvalidArgument: If center is not finite.

    Example:
        >>> post = Posterior(10.0, ErrorLaw([1.0], [1.0]))
        >>> lo, hi = post.interval(0.95)
        >>> round(hi - 10.0, 6)
        2.995732
        >>> round(post.probability(low=10.0), 6)
        0.5
    """

    def __init__(self, center: float, law: ErrorLaw, support: Support | None = None) -> None:
        self.center = finite(center, "The posterior centre")
        self.law = law
        self.support = support

    def __repr__(self) -> str:
        where = "" if self.support is None else f", support=[{self.support.low!r}, {self.support.high!r}]"
        return f"Posterior(center={self.center!r}, std={self.std()!r}, method={self.law.method!r}{where})"

    # ------------------------------------------------------------------ scipy-like
    def cdf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """``P(θ ≤ x)``.

        Raises:
            InvalidArgument: If x contains NaN.
        """
        xx, scalar = points(x)
        s = self.support
        if s is None:
            out = np.asarray(self.law.cdf(xx - self.center))
        else:
            out = s.censor(xx, np.asarray(self.law.cdf(xx - self.center), dtype=float))
        return float(out[0]) if scalar else out

    def sf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """``P(θ > x)``.

        Raises:
            InvalidArgument: If x contains NaN.
        """
        xx, scalar = points(x)
        s = self.support
        if s is None:
            out = np.asarray(self.law.sf(xx - self.center))
        else:
            out = s.censor(xx, np.asarray(self.law.sf(xx - self.center), dtype=float), 1.0, 0.0)
        return float(out[0]) if scalar else out

    def pdf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """Density of θ at x (of the unrestricted law; 0 outside the support).

        Raises:
            InvalidArgument: If x contains NaN, or θ is known exactly (no density).
        """
        xx, scalar = points(x)
        out = np.asarray(self.law.pdf(xx - self.center))
        if self.support is not None:
            out = np.where((xx < self.support.low) | (xx > self.support.high), 0.0, out)
        return float(out[0]) if scalar else out

    def ppf(self, q: ArrayLike) -> float | NDArray[np.float64]:
        """Quantile function of θ.

        Raises:
            InvalidArgument: If q is outside [0, 1] or NaN.
        """
        qq, scalar = points(q, "q")
        out = self.center + np.asarray(self.law.ppf(qq))
        if self.support is not None:
            out = np.clip(out, self.support.low, self.support.high)
        return float(out[0]) if scalar else out

    def interval(self, confidence: float) -> tuple[float, float]:
        """Narrowest credible interval ``(θ̂ − q, θ̂ + q)`` with certified coverage
        (on the support when there is one: :meth:`Support.interval`).

        Raises:
            InvalidArgument: If confidence is not in (0, 1).
        """
        q = self.law.halfwidth(confidence)
        if self.support is not None:
            return self.support.interval(self.center, q)
        return self.center - q, self.center + q

    def certified_interval(self, confidence: float) -> tuple[float, float]:
        """``(θ̂ − q, θ̂ + q)``: the certified interval before any cut to the support.

        Raises:
            InvalidArgument: If confidence is not in (0, 1).
        """
        q = self.law.halfwidth(confidence)
        return self.center - q, self.center + q

    def halfwidth(self, confidence: float) -> float:
        """The q of ``θ̂ ± q`` (before any cut to the support).

        Raises:
            InvalidArgument: If confidence is not in (0, 1).
        """
        return self.law.halfwidth(confidence)

    def mean(self) -> float:
        """θ̂: the unrestricted posterior's mean, an unbiased estimate (also with a support, so that
        averages of answers stay unbiased)."""
        return self.center

    def median(self) -> float:
        """Posterior median (θ̂ by symmetry, moved into the support)."""
        return self.center if self.support is None else self.support.clip(self.center)

    def var(self) -> float:
        """Posterior variance ``2 Σ (A_k b_k)²``."""
        return self.law.variance

    def std(self) -> float:
        """Posterior standard deviation."""
        return self.law.std

    def probability(self, low: float | None = None, high: float | None = None) -> float:
        """``P(low ≤ θ ≤ high)`` for claims such as ``P(θ > 0)`` (Xiao & Xiong (2012), §5.2).

        Args:
            low: Lower end, or ``None`` for −∞.
            high: Upper end, or ``None`` for +∞.

        Raises:
            InvalidArgument: If an end is NaN or ``low > high``.
        """
        lo = -math.inf if low is None else float(low)
        hi = math.inf if high is None else float(high)
        if math.isnan(lo) or math.isnan(hi):
            raise InvalidArgument("low and high must not be NaN; pass None for an open end.")
        if lo > hi:
            raise InvalidArgument(f"low ({lo}) must not exceed high ({hi}); swap them.")
        upper = 1.0 if hi == math.inf else float(self.cdf(hi))
        if self.support is not None and lo > self.support.high:
            return 0.0
        if lo == -math.inf or (self.support is not None and lo <= self.support.low):
            below = 0.0  # nothing of the (censored) law lies below the support
        else:
            below = float(self.cdf(lo)) - self._atom(lo)
        return float(min(max(upper - below, 0.0), 1.0))

    def _atom(self, x: float) -> float:
        """``P(θ = x)``: non-zero only for a point mass or exact discrete noise."""
        return self.law.point_mass(self.center - x)  # θ = θ̂ − E

