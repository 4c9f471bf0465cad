"""The per-query ask counter of a gateway: at which confidence a statement's intervals are computed.

Under ``Gateway(reasks="simultaneous")`` (the default) the ``k``-th distinct interval of one
linear query is computed at ``1 − δ_k`` (:mod:`dpgate.plan.asks`), so that all the intervals
a gateway gives for that query hold together with probability ≥ ``1 − δ``.

*Which query*: keyed by :func:`~dpgate.plan.state.isolation_key` — the table and the weights up
to a positive factor; the offset, label and group do not matter (``COUNT(*) + 1`` and
``2*COUNT(*)`` miss exactly when ``COUNT(*)`` does).  *Which intervals are distinct*: an answer
computed on the same history as the query's previous interval (no release on its table since,
none now) is the same estimate at the same level, so the same interval again: it keeps its
level, and a free repeat stays free.  Anything else — a fresh release, or a release on the table
since (the BLUE may have moved) — is a new interval at the next level.  A statement with
several outputs (GROUP BY, AVG's components) uses the largest level any of its queries needs.

The counts live in this object, so per gateway (per process): a new gateway on the same ledger
starts them again (``README``, "Adaptivity and selective re-asking").  Every answer of
:meth:`Gateway.query` / :meth:`Gateway.run` counts — the DB-API cursor, the pandas accessor and
``dpgate serve`` all go through them; ``explain`` and ``quote`` only look.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dpgate.answer.result import Answer
from dpgate.compile import CompiledStatement
from dpgate.ledger._history import LedgerHistory
from dpgate.plan.asks import ReaskMode, ask_confidence, check_reasks
from dpgate.plan.decide import Plan
from dpgate.plan.state import isolation_key

__all__ = ["Asked", "Asks", "ReaskMode", "check_reasks"]


@dataclass(frozen=True)
class Asked:
    """One statement's asks as planned: its table, the queries' keys, the table's history version,
    the level its intervals are computed at (0 under ``"independent"``), that confidence, whether
    the plan releases, and the confidence the analyst stated."""

    table: str
    keys: tuple[str, ...]
    version: int
    level: int
    confidence: float
    fresh: bool
    stated: float


class Asks:
    """Per query key, the level of its latest distinct interval and the table version it was computed on."""

    def __init__(self, mode: ReaskMode, history: LedgerHistory) -> None:
        self.mode, self._history = mode, history
        self._levels: dict[str, tuple[int, int]] = {}

    def _version(self, table: str) -> int:
        """How many statements the table's history holds (synced by the caller): its estimates change
        only when this does."""
        return len(self._history.runs.get(self._history.schema.table(table).name.lower(), ()))

    def _level(self, keys: Sequence[str], version: int, fresh: bool) -> int:
        """The level a statement's intervals need: per key its last level when its estimate is unchanged
        (same version, nothing fresh), else one more; the largest of these."""
        need = 1
        for key in keys:
            level, seen = self._levels.get(key, (0, -1))
            need = max(need, level if level and seen == version and not fresh else level + 1)
        return need

    def planned(self, stmt: CompiledStatement, confidence: float,
                plan_at: Callable[[float], Plan]) -> tuple[Plan, Asked]:
        """``plan_at(c)`` at the confidence of the statement's asks: first at the level of unchanged
        estimates; when that plan releases, again at the level of new ones.  Records nothing
        (:meth:`served` does), so ``explain`` quotes what the next ``query`` does."""
        if self.mode == "independent":
            return plan_at(confidence), Asked(stmt.table, (), 0, 0, confidence, False, confidence)
        keys = tuple(isolation_key(q)[0] for q in stmt.queries if not q.is_zero)
        version = self._version(stmt.table)
        level = self._level(keys, version, fresh=False)
        planned = plan_at(ask_confidence(confidence, level))
        fresh = any(s.kind == "fresh" for s in planned.steps)
        if fresh and (again := self._level(keys, version, fresh=True)) != level:
            level, planned = again, plan_at(ask_confidence(confidence, again))
        return planned, Asked(stmt.table, keys, version, level, ask_confidence(confidence, level), fresh, confidence)

    def served(self, asked: Asked, answers: Sequence[Answer]) -> tuple[Answer, ...]:
        """Record that ``asked``'s intervals were given; ``answers`` with the stated confidence (each
        interval was computed at ``asked.confidence`` ≥ it, so it covers at least as often)."""
        if self.mode == "independent":
            return tuple(answers)
        now = self._version(asked.table)
        for key in asked.keys:
            level, seen = self._levels.get(key, (0, -1))
            if asked.fresh or seen != asked.version or now != asked.version or not level:
                self._levels[key] = (asked.level, now)
        return tuple(_stated(a, asked.stated) for a in answers)


def _stated(a: Answer, confidence: float) -> Answer:
    """``a`` with ``confidence`` (the frozen fields copied as they are: no re-clipping)."""
    out = object.__new__(Answer)
    out.__dict__.update(a.__dict__, confidence=confidence)
    return out
