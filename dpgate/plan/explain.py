"""A price before paying: what a query would do, per output, without doing it.

:meth:`dpgate.Gateway.explain` plans a statement exactly as :meth:`~dpgate.Gateway.query`
would — on a copy of the table's state, through the same planner
(:func:`dpgate.plan.decide.plan`) — and reports per output whether it would be answered
from history, the ε it would charge, the half-width its interval would have, and
the budget left after it.  Nothing is read or recorded.

Why it is free: the plan depends only on the query vectors, the requirement and
the *design* of history (which queries were released, at which noise scales),
all public or post-processing of released answers — never on data or on noise
values.  A certified half-width is a quantile of the estimator's error law,
which depends on the design alone; so the quote reveals nothing that the
analyst could not compute from the public ledger, and it is exactly what the
next identical query then charges (unless someone releases in between).

SQL: ``EXPLAIN SELECT …`` on the DB-API (and so the shell) returns the quote as
rows; the command line has ``dpgate query --explain``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dpgate.answer.combine import component_confidence, output_parts
from dpgate.answer.result import Answer
from dpgate.compile import CompiledStatement
from dpgate.compile.bounds import skip_blank
from dpgate.compile.query import LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.plan.budget import fits
from dpgate.plan.decide import Step
from dpgate.plan.zcdp import DEFAULT_DELTA, epsilon_of

if TYPE_CHECKING:
    import pandas as pd

    from dpgate.plan.accounting import CellCosts

__all__ = ["Quote", "Explanation", "quote", "zero_valued", "strip_explain", "COLUMNS"]

#: The columns of :meth:`Explanation.to_pandas` and of ``EXPLAIN`` rows.
COLUMNS = ("output", "group", "source", "epsilon", "halfwidth", "confidence", "remaining", "note")


@dataclass(frozen=True)
class Quote:
    """What one output of a statement would do.

    Attributes:
        output: the output column's name.
        group: its GROUP BY key as ``((column, key), …)``.
        source: ``"history"`` (free), ``"fresh"`` (a new measurement), ``"exact"`` (a
            public constant) or ``"model"`` (a free model-based estimate).
        epsilon: the ε its own fresh releases charge the people in its cells — the
            per-cell accounting's charge of this group, as if it were released alone (every
            group of a GROUP BY shows its own; the statement's total, in which disjoint groups
            share one charge, is :attr:`Explanation.epsilon`).
        halfwidth: the half-width its interval would have at ``confidence`` (NaN for
            AVG / VAR / STDDEV: their interval depends on the released components,
            see ``note``; and for model estimates).
        confidence: the confidence the half-width is stated at.
        remaining: the budget left after this output and every output before it (0 when
            the statement is over budget: ``note`` says so).
        note: for a derived output, its components' half-widths.
        increase: the increase of the system privacy cost it causes in planning order (the
            first of disjoint groups carries their shared charge; these sum to the total).
    """

    output: str
    group: tuple[tuple[str, Any], ...]
    source: str
    epsilon: float
    halfwidth: float
    confidence: float
    remaining: float
    note: str = ""
    increase: float = 0.0


@dataclass(frozen=True)
class Explanation:
    """The quote of a whole statement: one :class:`Quote` per (group, output).

    Attributes:
        quotes: per output, in the order ``Result.answers`` would have.
        epsilon: the total ε the statement would charge (``Result.epsilon_spent``).
        spent, budget: the gateway's cost so far and its total budget.
        statement: the compiled statement.
        releases: the fresh releases it would make, ``(query, α)`` in the order they would be
            recorded (what ``dpgate serve`` prices against an analyst's own charge).
        privacy: the gateway's accounting; for ``"zcdp"`` every ``epsilon`` above is a ρ, and
            :meth:`rows` ends with the statement stated as ε at δ = 1e-6 (:attr:`epsilon_at_delta`).
    """

    quotes: tuple[Quote, ...]
    epsilon: float
    spent: float
    budget: float
    statement: CompiledStatement = field(repr=False)
    releases: tuple[tuple[LinearQuery, float], ...] = field(default=(), repr=False)
    privacy: str = field(default="pure", repr=False)

    @property
    def epsilon_at_delta(self) -> float:
        """What the statement adds to the gateway's ε at δ = 1e-6: ``epsilon`` when pure; for zCDP
        the increase of the converted spend (:func:`dpgate.plan.zcdp.epsilon_of`)."""
        if self.privacy != "zcdp":
            return self.epsilon
        return max(0.0, epsilon_of(self.spent + self.epsilon) - epsilon_of(self.spent))

    @property
    def remaining(self) -> float:
        """The budget left after the statement (negative: it would be refused)."""
        return self.budget - self.spent - self.epsilon

    @property
    def affordable(self) -> bool:
        """Whether the budget can pay for the statement (else ``query`` raises ``BudgetExhausted``)."""
        return fits(self.spent, self.epsilon, self.budget)

    @property
    def free(self) -> bool:
        """Whether the statement would spend nothing."""
        return self.epsilon == 0.0

    def rows(self) -> list[tuple[Any, ...]]:
        """The quotes as tuples in :data:`COLUMNS` order (the group as ``col=key, …`` text), and after
        several a statement total: output ``(statement)``, the ε the statement charges, what remains."""
        rows = [(q.output, _group_text(q.group), q.source, q.epsilon, q.halfwidth, q.confidence, q.remaining, q.note)
                for q in self.quotes]
        if len(self.quotes) > 1:
            sources = {q.source for q in self.quotes}
            source = next((k for k in ("fresh", "model", "history", "exact") if k in sources), "")
            note = "the statement's total: people in disjoint groups are charged once"
            note += "" if self.affordable else "; over budget: it would be refused"
            rows.append(("(statement)", "", source, self.epsilon, math.nan, self.quotes[0].confidence,
                         max(self.remaining, 0.0), note))
        if self.privacy == "zcdp" and self.quotes:
            after = self.spent + self.epsilon
            rows.append((f"(as ε at δ={DEFAULT_DELTA:g})", "", "", self.epsilon_at_delta, math.nan,
                         self.quotes[0].confidence, max(epsilon_of(self.budget) - epsilon_of(after), 0.0),
                         f"zCDP: the epsilon column above is ρ; ρ spent {after:.6g} of {self.budget:g} after it, "
                         f"ε {epsilon_of(after):.6g} of {epsilon_of(self.budget):.6g} at δ={DEFAULT_DELTA:g}"))
        return rows

    def to_pandas(self) -> pd.DataFrame:
        """One row per output, columns :data:`COLUMNS`."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=list(COLUMNS))

    def __repr__(self) -> str:
        verdict = "free" if self.free else f"ε = {self.epsilon:.6g}"
        if self.privacy == "zcdp" and not self.free:
            verdict = f"ρ = {self.epsilon:.6g} (ε = {self.epsilon_at_delta:.6g} at δ={DEFAULT_DELTA:g})"
        pay = "" if self.affordable else " — over budget, would be refused"
        return (f"<dpgate.Explanation {len(self.quotes)} outputs, {verdict}; "
                f"{max(self.remaining, 0.0):.6g} of {self.budget:g} would remain{pay}>")

    def _repr_html_(self) -> str:
        return f"<p>{_html_escape(repr(self))}</p>" + self.to_pandas().to_html(index=False)


def _html_escape(text: str) -> str:
    import html

    return html.escape(text)


def _group_text(group: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{c}={'NULL' if k is None else k}" for c, k in group)


def quote(
    stmt: CompiledStatement,
    steps: Sequence[Step],
    answers_at: Callable[[float], Sequence[Answer]],
    confidence: float,
    spent: float,
    budget: float,
    costs: CellCosts | None = None,
) -> Explanation:
    """The quote of a planned statement.

    ``answers_at(c)`` answers the planned steps at confidence ``c`` with every planned
    release valued 0: an interval's width depends on the design only, never on the
    values, so these widths are the ones the query will carry.  ``costs``: the table's
    costs before the statement, which price each output's own releases (its ``epsilon``;
    without them, its increase).
    """
    quotes = []
    left = budget - spent
    at = functools.cache(answers_at)  # one replay per confidence level

    for name, d, _, idx in output_parts(stmt):
        parts = [steps[i] for i in idx]
        increase = float(sum(s.increase for s in parts))
        left -= increase
        own = [m for s in parts if s.kind == "fresh" for m in s.measurements]
        eps = increase if costs is None or not own else \
            costs.charge_with([(*m.c, m.alpha, m.sensitivity) for m in own]) - costs.charge
        shown, over = max(left, 0.0), "over budget: the statement would be refused" if left < -1e-12 else ""
        kinds = {s.kind for s in parts}
        source = "fresh" if "fresh" in kinds else "history" if "history" in kinds else "exact"
        group = stmt.queries[idx[0]].group
        if d.kind == "linear":
            quotes.append(Quote(name, group, source, eps, at(confidence)[idx[0]].certified_halfwidth, confidence, shown, over,
                                increase))
            continue
        c = component_confidence(d, confidence)
        x = f"x − {d.centre}" if d.centre > 0 else f"x + {-d.centre}" if d.centre else "x"
        comps = []
        for label, i in zip(("COUNT(x)", f"SUM({x})", f"SUM(({x})²)"), idx, strict=False):
            q = stmt.queries[i]
            comps.append(f"{label} ±{at(c)[i].certified_halfwidth * (q.sensitivity or 1.0):.6g}")
        note = f"{d.kind.upper()} from {', '.join(comps)} at {c:.4g}; its interval depends on their values"
        quotes.append(Quote(name, group, source, eps, math.nan, confidence, shown, "; ".join(filter(None, (note, over))),
                            increase))
    releases = tuple((m.query, m.alpha) for s in steps if s.kind == "fresh" for m in s.measurements)
    return Explanation(tuple(quotes), float(sum(s.increase for s in steps)), spent, budget, stmt, releases)


def zero_valued(steps: Sequence[Step]) -> list[Step]:
    """The planned steps with every planned release valued 0 (for widths only)."""
    return [replace(s, values=tuple(0.0 for _ in s.measurements)) for s in steps]


def strip_explain(sql: str) -> str | None:
    """``sql`` without a leading ``EXPLAIN`` keyword (comments and hints kept), or None if it has none.

    >>> strip_explain("/*+ dpgate accuracy=5 */ EXPLAIN SELECT COUNT(*) FROM t")
    '/*+ dpgate accuracy=5 */  SELECT COUNT(*) FROM t'
    >>> strip_explain("-- why\\nexplain SELECT 1")
    '-- why\\n SELECT 1'
    >>> strip_explain("SELECT 1") is None
    True

    Raises:
        UnsupportedQuery: ``EXPLAIN ANALYZE`` (it would run the query; plain EXPLAIN is the free quote).
    """
    if not isinstance(sql, str):
        return None
    # A scan, not a regular expression: ``(?:\s+|/\*.*?\*/)*EXPLAIN`` backtracks exponentially
    # on a run of comments without EXPLAIN after it, and this runs on every statement.
    start = skip_blank(sql)
    end = start + len("EXPLAIN")
    if sql[start:end].upper() != "EXPLAIN" or _word_char(sql[end:end + 1]):
        return None
    after = end
    while after < len(sql) and sql[after].isspace():
        after += 1
    if after > end and sql[after:after + 7].upper() in ("ANALYZE", "ANALYSE") and not _word_char(sql[after + 7:after + 8]):
        raise UnsupportedQuery("EXPLAIN ANALYZE would run the query; use EXPLAIN SELECT … for the free quote.")
    rest = sql[end:]
    return sql[:start] + (rest if rest[:1].isspace() else " " + rest)  # a "--" comment keeps its newline


def _word_char(ch: str) -> bool:
    """Whether ``ch`` (one character or none) continues a word, as ``\\w`` in a regular expression."""
    return bool(ch) and (ch.isalnum() or ch == "_")
