"""The per-query ask counter of a gateway: at which confidence a statement's intervals are computed.

Under ``Gateway(reasks="simultaneous")`` (the default) the ``k``-th distinct interval of one
linear query is computed at ``1 − δ_k`` (:mod:`dpgate.plan.asks`), so that all the intervals
a gateway gives for that query hold together with probability ≥ ``1 − δ``.

*Which query*: keyed by :func:`~dpgate.plan.state.isolation_key` — the table and the weights up
to a non-zero factor; the offset, label and group do not matter (``COUNT(*) + 1`` and
``2*COUNT(*)`` miss exactly when ``COUNT(*)`` does).  *Which intervals are distinct*: an answer
computed on the same history as the query's previous interval (no release on its table since,
none now) is the same estimate at the same level, so the same interval again: it keeps its
level, and a free repeat stays free.  Anything else — a fresh release, or a release on the table
since (the BLUE may have moved) — is a new interval at the next level, unless that would need a
fresh release while the query's previous interval still meets the requirement: then that
interval is given again (free; no new event, it is the same one).  A statement with several
outputs (GROUP BY, AVG's components) uses the largest level any of its queries needs (an
earlier interval is given again only for a statement of plain linear outputs, all of them
asked before).

The counts live in this object, so per gateway (per process): a new gateway on the same ledger
starts them again (``README``, "Adaptivity and selective re-asking").  Every answer of
:meth:`Gateway.query` / :meth:`Gateway.run` counts — the DB-API cursor, the pandas accessor and
``dpgate serve`` all go through them; ``explain`` and ``quote`` only look.  Memory: one entry per
distinct query answered, for the gateway's life (a large GROUP BY's groups share one record and keep
no answers, :data:`KEPT_OUTPUTS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dpgate.answer.result import Answer
from dpgate.compile import CompiledStatement
from dpgate.compile.query import LinearQuery
from dpgate.ledger._history import LedgerHistory
from dpgate.plan.asks import ReaskMode, ask_confidence, check_reasks
from dpgate.plan.decide import Plan
from dpgate.plan.explain import Explanation, Quote
from dpgate.plan.plan import meets
from dpgate.plan.requirement import Requirement
from dpgate.plan.state import isolation_key

__all__ = ["KEPT_OUTPUTS", "Asked", "Asks", "ReaskMode", "check_reasks"]

#: A statement's answers are kept (to be given again) when it has at most this many outputs; a larger
#: GROUP BY keeps only its level per key (memory: a long session's every group would be held).
KEPT_OUTPUTS = 64


@dataclass(frozen=True)
class Asked:
    """One statement's asks as planned: its table, its non-zero queries and their keys, whether all
    its outputs are those queries' (plain linear, no exact one), the table's history version, the
    level its intervals are computed at (0 under ``"independent"``) and that confidence, whether the
    plan releases, the confidence the analyst stated, the level of its estimates as they are (what
    it is answered at when nothing is released after all: a refusal with ``allow_partial``), and —
    when an earlier interval of every query is given again instead of a release — those answers."""

    table: str
    queries: tuple[LinearQuery, ...]
    keys: tuple[str, ...]
    linear: bool
    version: int
    level: int
    confidence: float
    fresh: bool
    stated: float
    unchanged: int = 0
    accuracy: float = math.inf
    again: tuple[Answer, ...] | None = None


@dataclass(frozen=True)
class _Seen:
    """A query's latest distinct interval: its level, the table version it was computed on, for a plain
    linear output the answer given (to give it again; without its query, which a wide one's weights
    would keep for the gateway's life: the query's :attr:`~LinearQuery.key` instead), and the accuracy
    and confidence it was asked at."""

    level: int
    version: int
    answer: Answer | None
    accuracy: float = math.inf
    stated: float = 1.0
    query_key: tuple[object, ...] | None = None


class Asks:
    """Per query key, its latest distinct interval (:class:`_Seen`)."""

    def __init__(self, mode: ReaskMode, history: LedgerHistory) -> None:
        self.mode, self._history = mode, history
        self._seen: dict[str, _Seen] = {}

    def _version(self, table: str) -> int:
        """How many statements the table's history holds (synced by the caller): its estimates change
        only when this does."""
        return len(self._history.runs.get(self._history.schema.table(table).name.lower(), ()))

    def _level(self, keys: Sequence[str], version: int, fresh: bool) -> int:
        """The level a statement's intervals need: per key its last level when its estimate is unchanged
        (same version, nothing fresh), else one more; the largest of these."""
        need = 1
        for key in keys:
            seen = self._seen.get(key)
            level = seen.level if seen is not None else 0
            need = max(need, level if seen is not None and seen.version == version and not fresh else level + 1)
        return need

    def planned(self, stmt: CompiledStatement, req: Requirement, policy: str,
                plan_at: Callable[[float], Plan]) -> tuple[Plan, Asked]:
        """``plan_at(c)`` for ``req`` (under ``policy``) at the confidence of the statement's asks: first at
        the level of unchanged estimates (when no query is asked tighter than before, :meth:`_no_tighter`);
        when that plan releases, at the level of new ones; when that one releases too and every query's
        previous interval meets the requirement, none (``Asked.again``: those intervals, and a plan
        without steps; never under ``"no_reuse"``).  Records nothing (:meth:`served` does), so
        ``explain`` quotes what the next ``query`` does.  Reads only the design of history and the
        requirements asked, never a value."""
        accuracy, confidence = req.accuracy, req.confidence
        queries = tuple(q for q in stmt.queries if not q.is_zero)
        linear = not stmt.derived and len(queries) == len(stmt.queries)
        if self.mode == "independent":
            return plan_at(confidence), Asked(stmt.table, (), (), linear, 0, 0, confidence, False, confidence)
        keys = tuple(isolation_key(q)[0] for q in queries)
        version = self._version(stmt.table)
        unchanged, level = self._level(keys, version, fresh=False), self._level(keys, version, fresh=True)
        fresh = True
        if unchanged != level and self._no_tighter(keys, version, accuracy, confidence):
            planned = plan_at(ask_confidence(confidence, unchanged))  # perhaps free, at the level as it is
            fresh = any(s.kind == "fresh" for s in planned.steps)
            level = level if fresh else unchanged
        if fresh:
            planned = plan_at(ask_confidence(confidence, level))
            fresh = any(s.kind == "fresh" for s in planned.steps)
        asked = Asked(stmt.table, queries, keys, linear, version, level, ask_confidence(confidence, level), fresh,
                      confidence, unchanged, accuracy)
        if fresh and linear and policy != "no_reuse":
            given = self._again(asked, accuracy)
            if given is not None:
                return replace(planned, steps=()), replace(asked, fresh=False, again=given)
        return planned, asked

    def _no_tighter(self, keys: Sequence[str], version: int, accuracy: float, confidence: float) -> bool:
        """Whether no key whose estimate is unchanged is asked tighter (a smaller accuracy, a higher
        confidence) than its interval was: only then may the level as it is answer free, so only then
        is it planned (planning a large statement twice costs seconds).  Public inputs only."""
        for key in keys:
            seen = self._seen.get(key)
            if seen is not None and seen.version == version and (
                    accuracy < seen.accuracy * (1 - 1e-12) or confidence > seen.stated + 1e-12):
                return False
        return True

    def _again(self, asked: Asked, accuracy: float) -> tuple[Answer, ...] | None:
        """Each query's previous answer, for ``accuracy`` and its label and group, when every one meets
        ``accuracy`` at (at least) its level's confidence for the stated confidence; else None."""
        out = []
        secure = self._history.secure(asked.table)
        for q, key in zip(asked.queries, asked.keys, strict=True):
            seen = self._seen.get(key)
            a = seen.answer if seen is not None else None
            if (seen is None or a is None or seen.query_key is None or seen.query_key != q.key
                    or a.interval_confidence < ask_confidence(asked.stated, seen.level) or not meets(a.certified_halfwidth, accuracy)):
                return None
            out.append(replace(a, source="history", epsilon_spent=0.0, accuracy=accuracy, label=q.label, group=q.group,
                               query=q, confidence=asked.stated, meets_requirement=True, secure=secure))
        return tuple(out)

    def served(self, asked: Asked, answered: Callable[[float], Sequence[Answer]]) -> tuple[Answer, ...]:
        """The answers of ``asked`` — ``answered(c)`` at confidence ``c``: ``asked.confidence``, or, when
        nothing was released after all, the level of the estimates as they are; or the earlier ones given
        again — with the stated confidence (each interval was computed at a confidence ≥ it, so it
        covers at least as often: ``Answer.interval_confidence``); records the intervals given."""
        if asked.again is not None:
            return asked.again
        if self.mode == "independent":
            return tuple(answered(asked.confidence))
        now = self._version(asked.table)
        level = asked.level if now != asked.version else asked.unchanged  # nothing released: the same estimates
        out = tuple(_stated(a, asked.stated) for a in answered(ask_confidence(asked.stated, level)))
        keep = asked.linear and len(out) <= KEPT_OUTPUTS
        shared = _Seen(level, now, None, asked.accuracy, asked.stated)  # a large GROUP BY's keys share one record
        for i, key in enumerate(asked.keys):
            seen = self._seen.get(key)
            new = seen is None or seen.version != asked.version or now != asked.version
            answer = out[i] if keep and out[i].source in ("fresh", "history") and out[i].meets_requirement else None
            query_key = None if answer is None or answer.query is None else answer.query.key
            if answer is not None:
                answer = _without_query(answer)
            if new:
                self._seen[key] = shared if answer is None else _Seen(level, now, answer, asked.accuracy, asked.stated,
                                                                      query_key)
            elif seen is not None and seen.answer is None and answer is not None:
                self._seen[key] = replace(seen, answer=answer, query_key=query_key)  # the same estimate, at a level ≥ its own
        return out

    def quoted(self, asked: Asked, spent: float, budget: float, stmt: CompiledStatement) -> Explanation:
        """``explain``'s quote of an ``asked`` whose earlier intervals are given again: free."""
        assert asked.again is not None
        quotes = tuple(Quote(a.label, a.group, "history", 0.0, a.certified_halfwidth, a.interval_confidence, budget - spent)
                       for a in asked.again)
        return Explanation(quotes, 0.0, spent, budget, stmt)


def _without_query(a: Answer) -> Answer:
    """``a`` without its query (the frozen fields copied as they are; :meth:`Asks._again` sets the
    asking statement's query again)."""
    out = object.__new__(Answer)
    out.__dict__.update(a.__dict__, query=None)
    return out


def _stated(a: Answer, confidence: float) -> Answer:
    """``a`` with the stated ``confidence``; its ``interval_confidence`` stays the one its interval was
    computed at (the frozen fields copied as they are: no re-clipping)."""
    out = object.__new__(Answer)
    out.__dict__.update(a.__dict__, confidence=confidence)
    return out
