"""Where a true answer can lie, and what that does to its posterior and interval.

A linear query's truth is ``θ = offset + Σ_c w_c·n_c`` over the cell counts ``n_c``, which
are integers ≥ 0 (at most the table's rows when a row count is declared).  So θ lies
within ``[offset + rows·min(w, 0), offset + rows·max(w, 0)]`` — a half-line without a
declared row count when every weight has one sign, else the whole line.

The flat-prior posterior of Xiao & Xiong, "Bayesian Inference under Differential Privacy"
(2012), §4, lives on the real line.  :class:`Support` restricts it to where θ can be:

* **censoring, not renormalising**: the posterior mass below ``low`` (above ``high``) is put
  on ``low`` (``high``), so ``P(θ ≤ x)`` is unchanged at every possible ``x`` — above all
  at the truth, where ``P(θ ≤ θ_true)`` stays exactly uniform over repeated releases (the
  calibration of the unrestricted posterior) — while every event outside the support gets
  probability exactly 0.  Renormalising (the flat prior restricted to the support) or
  rounding to the integer lattice would both break that uniformity on small counts
  (measured: tests/inference/test_support.py), so between its bounds the law stays
  continuous: an event strictly between two integers keeps a small positive probability.
* **intervals**: the certified ``θ̂ ± q`` intersected with ``[low, high]``, and, when that
  cuts it, stretched to ``[low, low + q]`` at least (``[high − q, high]`` at the top): the
  truth lies in the support, so the result contains the truth whenever ``θ̂ ± q`` does
  (coverage cannot drop), it is never wider than ``2q``, and it never collapses to a
  point the truth need not be at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from dpgate.compile.query import LinearQuery

__all__ = ["Support", "support_of"]


@dataclass(frozen=True)
class Support:
    """The values a true answer can take: ``[low, high]`` (``±inf`` when unbounded).

    Example:
        >>> s = Support(0.0)
        >>> s.interval(-30.0, 20.0)  # θ̂ ± q entirely below 0: [0, q], not [0, 0]
        (0.0, 20.0)
        >>> s.interval(5.0, 20.0)
        (0.0, 25.0)
    """

    low: float = -math.inf
    high: float = math.inf

    def clip(self, value: float) -> float:
        """``value`` moved into ``[low, high]`` (NaN stays NaN)."""
        return value if math.isnan(value) else min(max(value, self.low), self.high)

    def interval(self, center: float, q: float) -> tuple[float, float]:
        """The interval ``center ± q`` on the support (module docstring): it contains every
        point of the support that ``center ± q`` contains, and is at most ``2q`` wide."""
        lo, hi = center - q, center + q
        if math.isfinite(lo) and math.isfinite(hi):
            if lo < self.low:
                lo, hi = self.low, max(hi, self.low + q)
            if hi > self.high:
                lo, hi = min(lo, self.high - q), self.high
        return max(lo, self.low), min(hi, self.high)

    def censor(self, x: NDArray[np.float64], cdf: NDArray[np.float64], below: float = 0.0,
               above: float = 1.0) -> NDArray[np.float64]:
        """A cdf (or, with ``below=1, above=0``, an sf) read at ``x``, censored to the support."""
        return np.where(x < self.low, below, np.where(x >= self.high, above, cdf))


def support_of(q: LinearQuery, rows: int | None = None) -> Support:
    """Where ``q``'s truth can lie, given the table's declared row count (module docstring).
    Memoised on the query per ``rows`` (every answer of a query reads it)."""
    memo = q.__dict__.setdefault("_support", {})
    found = memo.get(rows)
    if found is None:
        found = memo[rows] = _support(q, rows)
    return found


def _support(q: LinearQuery, rows: int | None) -> Support:
    off = float(q.offset)
    if q.is_zero:  # a public constant
        return Support(off, off)
    if rows is None:  # a half-line when every weight has one sign (cached on the query)
        return Support(off if q.weight_sign > 0 else -math.inf, off if q.weight_sign < 0 else math.inf)
    w = q.numerators
    return Support(off + float(Fraction(rows * min(int(w.min()), 0), q.denominator)),
                   off + float(Fraction(rows * max(int(w.max()), 0), q.denominator)))
