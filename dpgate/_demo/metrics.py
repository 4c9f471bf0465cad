"""The metrics of Xiao & Xiong, "Bayesian Inference under Differential Privacy"
(2012), definitions 6.1–6.3, as pure functions of a list of :class:`QueryRecord`.

* answering ratio ``Ra`` (def. 6.1): answers whose interval meets the
  requirement, over all queries;
* system cost ``α̅`` (Theorem 5.5): ``gw.spent`` after the last query;
* coverage ``Ri`` (def. 6.2): over answered queries, the share whose *reported*
  interval ``[low, high]`` contains the truth.  The paper's definition checks
  ``L ≤ θ ≤ L + 2ε``, which is wider whenever the reported interval is narrower
  than ``2ε`` (answers from history); it is available as
  :func:`coverage_paper` and is never smaller than :func:`coverage`;
* relative error ``E`` (def. 6.3): mean over answered queries of
  ``|θ̂ − θ| / (2ε)``.

Example:
    >>> recs = [QueryRecord(0, 100.0, 10.0, 0.8, "fresh", 104.0, 94.0, 114.0, True),
    ...         QueryRecord(1, 50.0, 10.0, 0.8, "refused")]
    >>> answering_ratio(recs), coverage(recs), relative_error(recs)
    (0.5, 1.0, 0.2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "QueryRecord",
    "answering_ratio",
    "system_cost",
    "coverage",
    "coverage_paper",
    "coverage_se",
    "released_share",
    "relative_error",
    "free_share",
    "summarize",
]


@dataclass(frozen=True)
class QueryRecord:
    """What happened to one workload query (one row of a benchmark's raw results).

    ``source`` is the answer's source, or ``"refused"`` when the gateway raised
    ``BudgetExhausted``.  ``spent`` is ``gw.spent`` right after the query;
    ``seconds`` the wall-clock time of ``gw.query``.
    """

    index: int
    truth: float
    accuracy: float
    confidence: float
    source: str
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    meets_requirement: bool = False
    epsilon_spent: float = 0.0
    spent: float = 0.0
    seconds: float = 0.0

    @property
    def answered(self) -> bool:
        """Answered within the requirement (counts towards ``Ra``)."""
        return self.source in ("history", "fresh", "exact") and self.meets_requirement

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (``QueryRecord(**d)`` reads it back)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _answered(records: Sequence[QueryRecord]) -> list[QueryRecord]:
    return [r for r in records if r.answered]


def answering_ratio(records: Sequence[QueryRecord]) -> float:
    """``Ra`` (def. 6.1): answers meeting their requirement over all queries (NaN if none)."""
    return len(_answered(records)) / len(records) if records else math.nan


def system_cost(records: Sequence[QueryRecord]) -> float:
    """``α̅`` (Theorem 5.5): the system privacy cost after the last query."""
    return float(records[-1].spent) if records else 0.0


def _contains(low: float, high: float, truth: float) -> bool:
    # Relative slack of 1e-9 absorbs float dust in the interval ends, nothing more.
    tol = 1e-9 * max(1.0, abs(truth))
    return low - tol <= truth <= high + tol


def _released(records: Sequence[QueryRecord]) -> list[QueryRecord]:
    return [r for r in records if r.source in ("history", "fresh", "exact") and math.isfinite(r.value)]


def released_share(records: Sequence[QueryRecord]) -> float:
    """Share of queries that received an estimate at all, meeting the requirement or not."""
    return len(_released(records)) / len(records) if records else math.nan


def coverage(records: Sequence[QueryRecord], *, released: bool = False) -> float:
    """``Ri``: share of answered queries whose reported ``[low, high]`` holds the truth
    (``released=True``: over every released estimate, including those whose interval
    is wider than asked)."""
    ans = _released(records) if released else _answered(records)
    return sum(_contains(r.low, r.high, r.truth) for r in ans) / len(ans) if ans else math.nan


def coverage_paper(records: Sequence[QueryRecord]) -> float:
    """Def. 6.2 as printed: share of answered queries with ``L ≤ θ ≤ L + 2ε`` (≥ :func:`coverage`)."""
    ans = _answered(records)
    return sum(_contains(r.low, r.low + 2 * r.accuracy, r.truth) for r in ans) / len(ans) if ans else math.nan


def coverage_se(records: Sequence[QueryRecord]) -> float:
    """Standard error of :func:`coverage` under the hypothesis that it equals the stated
    confidence ``c``: ``sqrt(c(1−c)/N)`` over the ``N`` answered queries.  Answers of
    one session share history noise and are positively correlated, so this
    *understates* the spread of one session's coverage; compare sessions with
    independent noise for a sound test."""
    ans = _answered(records)
    if not ans:
        return math.nan
    c = float(np.mean([r.confidence for r in ans]))
    return math.sqrt(c * (1 - c) / len(ans))


def relative_error(records: Sequence[QueryRecord]) -> float:
    """``E`` (def. 6.3): mean of ``|θ̂ − θ| / (2ε)`` over answered queries."""
    ans = _answered(records)
    return sum(abs(r.value - r.truth) / (2 * r.accuracy) for r in ans) / len(ans) if ans else math.nan


def free_share(records: Sequence[QueryRecord]) -> float:
    """Share of all queries answered from history at zero cost."""
    return sum(r.answered and r.source == "history" for r in records) / len(records) if records else math.nan


def summarize(records: Sequence[QueryRecord]) -> dict[str, float]:
    """All metrics of one run, plus the median and p95 of ``gw.query`` time (seconds)."""
    secs = np.array([r.seconds for r in records]) if records else np.array([math.nan])
    return {
        "queries": float(len(records)),
        "Ra": answering_ratio(records),
        "alpha_bar": system_cost(records),
        "Ri": coverage(records),
        "Ri_se": coverage_se(records),
        "Ri_paper": coverage_paper(records),
        "released": released_share(records),
        "Ri_released": coverage(records, released=True),
        "E": relative_error(records),
        "free": free_share(records),
        "fresh": sum(r.answered and r.source == "fresh" for r in records) / len(records) if records else math.nan,
        "median_seconds": float(np.median(secs)),
        "p95_seconds": float(np.percentile(secs, 95)),
    }
