"""AVG, VAR and STDDEV answers from the answers of their linear components.

A derived output (see :mod:`dpgate.compile.derived`) reads ``k`` linear
components — ``N = COUNT(x)``, ``S = SUM(x)`` and, for variances,
``Q = SUM(x²)`` — answered by the gateway like any other query.

The sums are centred on the middle ``c`` of ``x``'s range (``SUM(x − c)``,
``SUM((x − c)²)``, see :mod:`dpgate.compile.derived`); the formulas below read
``x`` as ``x − c`` and the mean is shifted back by ``c``.

Requirement.  The analyst's ``accuracy`` applies to the *components*, in rows:
each component is planned as the query divided by its sensitivity (``COUNT(x)``
as is, ``SUM(x − c)/max|x − c|``, ``SUM((x − c)²)/max (x − c)²``), so every component is pinned
down to within ``accuracy`` rows' worth of contribution.  The derived half-width
is then roughly ``accuracy·(max|x − c| + |mean − c|)/N`` for AVG — it shrinks with the
number of rows, which the planner may not look at (a plan that depended on the
data would break the exactness of the intervals).  The cost is that of the
``k`` component queries at confidence ``1 − δ/k`` each, with the usual reuse of
history: a repeated AVG, or one whose COUNT or SUM was released before, costs
less or nothing.  In a statement that mixes derived and plain outputs, the plain
ones are planned at the same split confidence (slightly dearer; send them
separately to avoid it) and reported at ``1 − δ``.

Interval (Bonferroni box).  Each component's interval is an exact
``1 − δ/k`` interval, so by the union bound all ``k`` hold together with
probability at least ``1 − δ`` (no independence needed — they come from the same
history).  On that event the true derived value lies in the range of the
derived function over the box of component intervals; dpgate reports that
range exactly (the function's extremes over a box sit on its corners or where a
partial derivative vanishes, and those points are enumerated), intersected with
what the public schema implies: a mean lies in ``[a, b]``, the range of ``x``
over the counted cells, a population variance in ``[0, (b−a)²/4]``
(Popoviciu), a sample variance in ``[0, (b−a)²/4 · n/(n−1)]``.  When the count
interval reaches down to 0 (or 1 for a sample variance) those schema bounds are
the interval.  So coverage ≥ ``1 − δ`` holds whatever the data; the test suite
measures it.  A derived answer has no posterior (``Answer.posterior`` is None;
its components, in ``Answer.components``, give the linear answers it was made of).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import product

import numpy as np

from dpgate.answer.result import Answer, Source
from dpgate.compile import CompiledStatement
from dpgate.compile.aggregates import Derivation
from dpgate.compile.query import LinearQuery

__all__ = [
    "measured_queries", "plan_confidence", "output_parts", "assemble", "component_confidence", "mean_range",
    "variance_range",
]


def _normalized(q: LinearQuery) -> LinearQuery:
    """``q / max|q|``: sensitivity 1 (same atoms and reuse; only the unit changes).  Kept on ``q``
    (a cached statement's components are normalised once, so a repeat finds the weight
    digests and hashes of the first planning already computed)."""
    found = q.__dict__.get("_normalized")
    if found is not None:
        return found
    top = int(np.max(np.abs(q.numerators), initial=0))
    if top == 0:
        return q
    g = math.gcd(int(np.gcd.reduce(q.numerators.ravel())), top)
    found = q.__dict__["_normalized"] = LinearQuery(
        q.table, q.columns, q.breakpoints, q.numerators if g == 1 else q.numerators // g, top // g, q.offset,
        label=q.label, group=q.group)  # g == 1 (SUM(income)): the same read-only weights, not a copy
    return found


def measured_queries(stmt: CompiledStatement) -> tuple[LinearQuery, ...]:
    """The linear queries the gateway plans for ``stmt``: components normalised to sensitivity 1."""
    if not stmt.derived:
        return stmt.queries
    comp = {p for d in stmt.derived if d.kind != "linear" for p in d.parts}
    n = _n_components(stmt)
    return tuple(_normalized(q) if i % n in comp else q for i, q in enumerate(stmt.queries))


def plan_confidence(stmt: CompiledStatement, confidence: float) -> float:
    """The confidence every query of ``stmt`` is planned at: ``1 − δ/k`` for the most components ``k``."""
    k = max((len(d.parts) for d in stmt.derived), default=1)
    return 1.0 - (1.0 - confidence) / k


def _n_components(stmt: CompiledStatement) -> int:
    return sum(len(d.parts) for d in stmt.derived)


def output_parts(stmt: CompiledStatement) -> list[tuple[str, Derivation, int, tuple[int, ...]]]:
    """Per (group, aggregate output), in answer order: its name, its :class:`Derivation`, its
    group's number and the indices of the queries of ``stmt.queries`` it reads."""
    if not stmt.derived:
        return [(q.label, Derivation("linear", (0,)), i, (i,)) for i, q in enumerate(stmt.queries)]
    n = _n_components(stmt)
    names = [o.name for o in stmt.outputs if o.kind == "aggregate"]
    return [(name, d, g, tuple(g * n + p for p in d.parts))
            for g in range(len(stmt.queries) // n) for d, name in zip(stmt.derived, names, strict=True)]


def assemble(
    stmt: CompiledStatement, answers_at: Callable[[float], Sequence[Answer]], confidence: float,
) -> tuple[Answer, ...]:
    """One answer per (group, output) of a statement.

    ``answers_at(c)`` answers ``measured_queries(stmt)`` with intervals at confidence ``c``;
    a derived output reads its components at ``1 − δ/k`` and combines them.
    """
    if not stmt.derived:
        return tuple(answers_at(confidence))
    at = functools.cache(answers_at)  # one replay per confidence level
    out: list[Answer] = []
    for name, d, g, idx in output_parts(stmt):
        if d.kind == "linear":
            out.append(at(confidence)[idx[0]])
            continue
        c = component_confidence(d, confidence)
        comps = tuple(_rescale(at(c)[i], stmt.queries[i]) for i in idx)
        out.append(_combine(d.kind, comps, d.ranges[g], confidence, name, d.centre))
    return tuple(out)


def component_confidence(d: Derivation, confidence: float) -> float:
    """``1 − δ/k``: the confidence each of a derived output's ``k`` components is read at."""
    return 1.0 - (1.0 - confidence) / len(d.parts)


def _rescale(a: Answer, q: LinearQuery) -> Answer:
    """A normalised component's answer in the component's own units."""
    s = q.sensitivity if not q.is_zero else 1.0
    return replace(a, value=a.value * s, low=a.low * s, high=a.high * s, accuracy=a.accuracy * s,
                   posterior=None, query=q)


def _combine(
    kind: str, comps: tuple[Answer, ...], bounds: tuple[float, float] | None, confidence: float, label: str,
    centre: int,
) -> Answer:
    """The derived answer from its components (``bounds``: the range of ``x − centre``)."""
    first = comps[0]
    sources = {a.source for a in comps}
    source: Source = ("unavailable" if "unavailable" in sources else "fresh" if "fresh" in sources
                      else "history" if "history" in sources else "exact")
    boxes = [(a.low, a.high) for a in comps]
    vals = [a.value for a in comps]
    if bounds is None:  # no cell can be counted: the aggregate is NULL on any data
        value = low = high = math.nan
        source = "exact"
    elif kind == "avg":  # the mean of x − c, then shifted back
        low, high = mean_range(boxes[1], boxes[0], bounds)
        value = _point(vals[1] / vals[0] if vals[0] > 0 else math.nan, low, high)
        value, low, high = value + centre, low + centre, high + centre
    else:
        sample = kind.endswith("_samp")
        low, high = variance_range(boxes[2], boxes[1], boxes[0], bounds, sample=sample)
        n, s, q = vals
        point = (q - s * s / n) / (n - 1 if sample else n) if n > (1 if sample else 0) else math.nan
        value = _point(point, low, high)
        if kind.startswith("stddev"):
            value, low, high = math.sqrt(value), math.sqrt(low), math.sqrt(high)
    if source == "unavailable":
        value = math.nan
    return Answer(
        value, low, high, confidence, first.accuracy, source, float(sum(a.epsilon_spent for a in comps)),
        None, all(a.meets_requirement for a in comps), label=label, group=first.group, query=None,
        secure=all(a.secure for a in comps), isolated=any(a.isolated for a in comps), components=comps,
    )


def _point(v: float, low: float, high: float) -> float:
    """The plug-in estimate, kept inside the interval (the midpoint when it is undefined)."""
    if not math.isfinite(v):
        return (low + high) / 2
    return min(max(v, low), high)


def mean_range(
    s: tuple[float, float], n: tuple[float, float], bounds: tuple[float, float]
) -> tuple[float, float]:
    """Range of ``S/N`` over the box ``s × n``, within ``bounds`` (all of ``bounds`` when ``n`` reaches 0).

    >>> mean_range((900.0, 1100.0), (90.0, 110.0), (0.0, 100.0))
    (8.181818181818182, 12.222222222222221)
    >>> mean_range((900.0, 1100.0), (-5.0, 110.0), (0.0, 100.0))
    (0.0, 100.0)
    """
    a, b = bounds
    if not (n[0] > 0 and math.isfinite(n[1]) and all(map(math.isfinite, s))):
        return a, b
    ratios = [x / y for x in s for y in n]
    low, high = max(a, min(ratios)), min(b, max(ratios))
    return (low, high) if low <= high else (a, b)


def variance_range(
    q: tuple[float, float], s: tuple[float, float], n: tuple[float, float], bounds: tuple[float, float],
    *, sample: bool,
) -> tuple[float, float]:
    """Range of the (sample or population) variance ``(Q − S²/N)/(N − [1])`` over the box ``q × s × n``.

    The extremes over a box lie where each coordinate is at a bound or its partial
    derivative vanishes: ``Q`` always at a bound (increasing), ``S`` at a bound or 0,
    ``N`` at a bound or a root of ``∂/∂N`` (``2S²/Q`` for the population variance,
    ``(S² ± |S|√(S² − Q))/Q`` for the sample one).  Intersected with the schema's bound.

    >>> lo, hi = variance_range((9000.0, 11000.0), (900.0, 1100.0), (99.0, 101.0), (0.0, 20.0), sample=False)
    >>> 0 <= lo < hi <= 100
    True
    """
    a, b = bounds
    span2 = (b - a) ** 2 / 4
    floor_n = 1.0 if sample else 0.0
    cap = span2 * (min(2.0, n[0] / (n[0] - 1)) if sample and n[0] > 1 else 2.0 if sample else 1.0)
    if not (n[0] > floor_n and all(map(math.isfinite, (*q, *s, n[1])))):
        return 0.0, cap
    qs = (max(q[0], 0.0), max(q[1], 0.0))  # a sum of squares is non-negative: so is its truth
    ss = [s[0], s[1]] + ([0.0] if s[0] < 0 < s[1] else [])
    values = []
    for qq, sv in product(qs, ss):
        ns = [n[0], n[1]]
        if qq > 0:
            if sample:
                disc = sv * sv - qq
                if disc >= 0:
                    ns += [(sv * sv + r * abs(sv) * math.sqrt(disc)) / qq for r in (-1.0, 1.0)]
            else:
                ns.append(2 * sv * sv / qq)
        for nv in ns:
            if n[0] <= nv <= n[1]:
                values.append((qq - sv * sv / nv) / (nv - 1 if sample else nv))
    low, high = max(0.0, min(values)), min(cap, max(values))
    return (low, high) if low <= high else (0.0, cap)
