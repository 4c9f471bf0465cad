"""SELECT items → linear combinations of aggregates; GROUP BY columns; weights per group.

Used by the stages in :mod:`dpgate.compile.stages`: :func:`linear` splits a SELECT
item into ``Σ coef·aggregate + offset``, :func:`group_columns` resolves GROUP BY,
and :func:`group_weights` turns one output into one LinearQuery per group key.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, NamedTuple, cast

import numpy as np
from sqlglot import exp

from dpgate.compile._padded import padded_query
from dpgate.compile.bounds import check_deadline
from dpgate.compile.cells import NULL, NUM, Val, constant, walk
from dpgate.compile.evaluate import Evaluator
from dpgate.compile.query import MAX_GRID_BOXES, LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.schema.domains import Column, Table

__all__ = [
    "Aggregate", "DERIVED_KINDS", "Derivation", "derived_kind", "SelectItem", "linear",
    "no_aggregates", "unparen", "group_columns", "group_weights",
]

_AGG_ADVICE = {
    "Avg": "AVG is answered from SUM and COUNT only as a whole output column (SELECT AVG(x) … , optionally "
    "aliased or with FILTER); arithmetic on it is post-processing of the released value",
    "Min": "MIN / MAX are not supported (one row can move them arbitrarily); ask for counts per value with "
    "GROUP BY, or COUNT(*) FILTER (WHERE x >= t) for a threshold",
    "Median": "medians and quantiles are not linear; ask for counts per value or per bin with GROUP BY and "
    "read the quantile off the released histogram",
    "Stddev": "VAR and STDDEV are answered from SUM(x*x), SUM(x) and COUNT(x) only as whole output columns "
    "(optionally aliased or with FILTER); arithmetic on them is post-processing of the released value",
    "Distinct": "distinct counts are not linear (one row can change them by more than any weight); count rows "
    "per value with GROUP BY instead",
}
for _k in ("Max",):
    _AGG_ADVICE[_k] = _AGG_ADVICE["Min"]
for _k in ("Quantile", "PercentileCont", "PercentileDisc", "ApproxQuantile", "Mode"):
    _AGG_ADVICE[_k] = _AGG_ADVICE["Median"]
for _k in ("StddevPop", "StddevSamp", "Variance", "VariancePop"):
    _AGG_ADVICE[_k] = _AGG_ADVICE["Stddev"]
for _k in ("ApproxDistinct", "CountDistinct"):
    _AGG_ADVICE[_k] = _AGG_ADVICE["Distinct"]


def unparen(node: exp.Expr) -> exp.Expr:
    """``node`` without enclosing parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def no_aggregates(node: exp.Expr, clause: str, candidates: list[exp.Expr] | None = None) -> None:
    """Refuse an aggregate inside ``node``; ``candidates``: the aggregates of an enclosing
    tree already walked (breadth-first), to check by ancestry instead of walking again."""
    subs = walk(node) if candidates is None else [a for a in candidates if _within(a, node)]
    for sub in subs:
        if isinstance(sub, (exp.AggFunc, exp.Filter)):
            raise UnsupportedQuery(
                f"{clause} cannot use the aggregate {sub.sql()!r}; filter rows in WHERE and groups in HAVING."
            )


def _within(sub: exp.Expr | None, node: exp.Expr) -> bool:
    while sub is not None:
        if sub is node:
            return True
        sub = sub.parent
    return False


# -- derived (non-linear) aggregates: see dpgate.compile.derived ------------------------------------
#: Derived kinds and the SQL name shown in messages.
DERIVED_KINDS = {"avg": "AVG", "var_samp": "VAR_SAMP", "var_pop": "VAR_POP", "stddev_samp": "STDDEV_SAMP",
                 "stddev_pop": "STDDEV_POP"}
_DERIVED_NODES: dict[type[exp.Expr], str] = {
    exp.Avg: "avg", exp.Variance: "var_samp", exp.VariancePop: "var_pop", exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop",
}
_DERIVED_FUNCTIONS = {"VAR": "var_samp", "MEAN": "avg"}  # parsed as anonymous functions


def derived_kind(node: exp.Expr) -> str | None:
    """The derived kind (a key of :data:`DERIVED_KINDS`) of an AVG / VAR / STDDEV node, else None."""
    kind = _DERIVED_NODES.get(type(node))
    if kind is None and isinstance(node, exp.Anonymous):
        kind = _DERIVED_FUNCTIONS.get(node.name.upper())
    return kind


@dataclass(frozen=True)
class Derivation:
    """How one output of a statement is computed from its compiled linear queries.

    Attributes:
        kind: ``"linear"`` (the output is its one query), ``"group"`` (a GROUP BY column, no
            query) or a derived kind of :data:`DERIVED_KINDS`.
        parts: indices, within one group's block of queries, of the linear queries it
            reads: ``(COUNT(x), SUM(x − c)[, SUM((x − c)²)])`` for a derived kind.
        centre: ``c``, the public centre the sums are taken around (0: not centred).
        ranges: per group, the range ``[a − c, b − c]`` of ``x − c`` over the cells it counts
            (None: no cell can be counted), read off the public weights.
    """

    kind: str
    parts: tuple[int, ...]
    centre: int = 0
    ranges: tuple[tuple[float, float] | None, ...] = ()


# -- aggregates ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Aggregate:
    """One COUNT / SUM of a SELECT item: its argument (None: every row) and FILTER condition."""

    kind: Literal["count", "sum"]
    arg: exp.Expr | None  # None: COUNT(*)
    cond: exp.Expr | None  # FILTER (WHERE …)
    node: exp.Expr


Terms = list[tuple[Fraction, Aggregate]]


class SelectItem(NamedTuple):
    """One SELECT item, classified (a NamedTuple: immutable, and built in a fraction of a frozen
    dataclass's time — compile is on the hot path).

    Attributes:
        node: the item as written (with its alias, if any).
        body: the item without its alias.
        column: the declared column a bare column reference names (a GROUP BY output), else None.
        terms: for an aggregate output, its linear combination ``Σ coef·aggregate``.
        offset: for an aggregate output, its constant term.
    """

    node: exp.Expr
    body: exp.Expr
    column: Column | None
    terms: Terms
    offset: Fraction


def linear(node: exp.Expr) -> tuple[Terms, Fraction]:
    """Split a SELECT item into Σ coef·aggregate + offset, or refuse."""
    node = unparen(node)
    c = constant(node)
    if c is not None:
        return [], c
    if isinstance(node, exp.Neg):
        terms, off = linear(node.this)
        return [(-k, a) for k, a in terms], -off
    if isinstance(node, (exp.Add, exp.Sub)):
        t1, o1 = linear(node.this)
        t2, o2 = linear(node.expression)
        s = 1 if isinstance(node, exp.Add) else -1
        return t1 + [(s * k, a) for k, a in t2], o1 + s * o2
    if isinstance(node, (exp.Mul, exp.Div)):
        left, right = constant(node.this), constant(node.expression)
        if isinstance(node, exp.Div):
            if right is None:
                raise UnsupportedQuery(
                    f"{node.sql()!r} divides by a non-constant; ratios of aggregates are not linear — ask for "
                    "numerator and denominator as two outputs and divide the released values."
                )
            if right == 0:
                raise UnsupportedQuery(f"{node.sql()!r} divides by zero.")
            terms, off = linear(node.this)
            return [(k / right, a) for k, a in terms], off / right
        if left is not None:
            k0, sub = left, node.expression
        elif right is not None:
            k0, sub = right, node.this
        else:
            raise UnsupportedQuery(
                f"{node.sql()!r} multiplies two non-constant terms; outputs must be linear combinations of "
                "aggregates with numeric constants (e.g. 2*COUNT(*) - 10)."
            )
        terms, off = linear(sub)
        return [(k0 * k, a) for k, a in terms], k0 * off
    if isinstance(node, exp.Filter):
        inner = unparen(node.this)
        cond = node.expression.this if isinstance(node.expression, exp.Where) else node.expression
        no_aggregates(cond, "FILTER")
        ((k, agg),), _ = _linear_agg(inner)
        if agg.cond is not None:
            cond = exp.and_(agg.cond.copy(), cond.copy())
        return [(k, Aggregate(agg.kind, agg.arg, cond, node))], Fraction(0)
    return _linear_agg(node)


def _linear_agg(node: exp.Expr) -> tuple[Terms, Fraction]:
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Distinct) or node.args.get("distinct"):
            raise UnsupportedQuery(f"{node.sql()!r}: {_AGG_ADVICE['Distinct']}.")
        if arg is None or isinstance(arg, exp.Star):
            return [(Fraction(1), Aggregate("count", None, None, node))], Fraction(0)
        no_aggregates(arg, "COUNT's argument")
        return [(Fraction(1), Aggregate("count", arg, None, node))], Fraction(0)
    if isinstance(node, exp.CountIf):
        no_aggregates(node.this, "COUNT_IF")
        return [(Fraction(1), Aggregate("count", None, node.this, node))], Fraction(0)
    if isinstance(node, exp.Sum):
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise UnsupportedQuery(f"{node.sql()!r}: {_AGG_ADVICE['Distinct']}.")
        if isinstance(arg, exp.Star) or arg is None:
            raise UnsupportedQuery(f"{node.sql()!r}: SUM needs an expression, e.g. SUM(age).")
        no_aggregates(arg, "SUM's argument")
        return [(Fraction(1), Aggregate("sum", arg, None, node))], Fraction(0)
    if isinstance(node, exp.Column):
        raise UnsupportedQuery(
            f"the column {node.sql()!r} appears outside an aggregate in an arithmetic output; use SUM({node.sql()}) "
            "or GROUP BY it and select it on its own."
        )
    if isinstance(node, exp.Window):
        raise UnsupportedQuery(f"window functions (OVER …) are not supported ({node.sql()!r}).")
    name = type(node).__name__
    if isinstance(node, exp.AggFunc) or name in _AGG_ADVICE:
        advice = _AGG_ADVICE.get(name, "only COUNT and SUM (and linear combinations of them) are supported")
        raise UnsupportedQuery(f"{node.sql()!r}: {advice}.")
    if isinstance(node, exp.Anonymous):
        raise UnsupportedQuery(
            f"function {node.name.upper()} is not supported in {node.sql()!r}; outputs must be linear "
            "combinations of COUNT and SUM."
        )
    raise UnsupportedQuery(
        f"the output {node.sql()!r} is not a linear combination of COUNT(...) and SUM(...) aggregates "
        "with numeric constants."
    )


# -- GROUP BY ----------------------------------------------------------------------------------------
def group_columns(select: exp.Select, items: Sequence[SelectItem], ev: Evaluator) -> list[Column]:
    """The declared GROUP BY columns (by name, SELECT alias, position or ALL), without repeats, in order."""
    group = select.args.get("group")
    if group is None:
        return []
    for key in ("rollup", "cube", "grouping_sets", "totals"):
        if group.args.get(key):
            raise UnsupportedQuery(
                f"GROUP BY {key.upper().replace('_', ' ')} is not supported; group by declared columns."
            )
    cols: list[Column] = []
    if group.args.get("all"):
        cols = [it.column for it in items if it.column is not None]
    aliases = {
        it.node.alias.lower(): it.column
        for it in items
        if isinstance(it.node, exp.Alias) and it.column is not None
    }
    for e in group.expressions:
        e = unparen(e)
        if isinstance(e, exp.Literal) and not e.is_string:
            k = constant(e)
            if k is None or k.denominator != 1 or not 1 <= k <= len(items):
                raise UnsupportedQuery(f"GROUP BY {e.sql()} is not a position in the SELECT list (1..{len(items)}).")
            picked = items[int(k) - 1]
            if picked.column is None:
                raise UnsupportedQuery(
                    f"GROUP BY {e.sql()} refers to an aggregate ({picked.node.sql()!r}); group by columns."
                )
            cols.append(picked.column)
        elif isinstance(e, exp.Column) and not isinstance(e.this, exp.Star):
            if not e.table and not ev.table.has_column(e.name) and e.name.lower() in aliases:
                cols.append(aliases[e.name.lower()])
            else:
                cols.append(ev.column(e))
        elif isinstance(e, (exp.Rollup, exp.Cube, exp.GroupingSets)):
            raise UnsupportedQuery(f"GROUP BY {e.sql()} is not supported; group by declared columns.")
        else:
            raise UnsupportedQuery(
                f"GROUP BY expression {e.sql()!r} is not supported; group by declared columns (declare bins in "
                "the schema for coarser groups), or use CASE WHEN inside COUNT/SUM FILTERs."
            )
    out: list[Column] = []
    for c in cols:
        if c.name not in [o.name for o in out]:
            out.append(c)
    return out


# -- weights -------------------------------------------------------------------------------------------
#: Largest number of weights (numerators) the per-group queries of one statement may hold in memory
#: (their groups' blocks, :mod:`~dpgate.compile._padded`) when its grid is too large to evaluate at
#: once (512 MiB of int64): :func:`_weights_by_group`.
MAX_WIDE_BOXES = 2**26


def group_weights(
    ev: Evaluator,
    where: exp.Expr | None,
    terms: Terms,
    offset: Fraction,
    group_cols: Sequence[Column],
    table: Table,
    label: str,
    *,
    keys: Sequence[tuple[int, ...]] | None = None,
) -> list[LinearQuery]:
    """The LinearQuery of every group key (``keys``: cell tuples; default every cell) for one aggregate output.

    When the grid of every column used is larger than the compiler's limit but is within it with
    the group columns held at one cell (``SUM(income) … GROUP BY educ``: 17 × 500 002 boxes, or
    500 002 per group), each group is evaluated on its own slice: the same queries, never the
    whole grid at once."""
    used: set[str] = {c.name for c in group_cols}
    for part in [where, *[p for _, a in terms for p in (a.arg, a.cond)]]:
        if part is not None:
            used |= ev.columns_in(part)
    if group_cols and ev.grid_boxes(used) > MAX_GRID_BOXES \
            and ev.grid_boxes(used - {c.name for c in group_cols}) <= MAX_GRID_BOXES:
        return _weights_by_group(ev, where, terms, offset, group_cols, table, label, sorted(used), keys)
    cols, bps = ev.set_grid(sorted(used))
    w = _weights(ev, where, terms)
    shape = ev.shape
    w = np.broadcast_to(w, shape)
    if not group_cols:
        return [LinearQuery.from_grid(table, cols, _ints(bps), w, offset, label=label)]
    gax = [cols.index(c.name) for c in group_cols]
    out = []
    labels = [c.labels() for c in group_cols]  # once: a column's labels list all its cells
    for key in keys if keys is not None else itertools.product(*[range(c.n_cells) for c in group_cols]):
        sel: list[Any] = [slice(None)] * len(cols)
        for ax, k in zip(gax, key, strict=True):
            sel[ax] = slice(k, k + 1)
        out.append(_group_query(table, cols, bps, gax, key, group_cols, labels, w[tuple(sel)], offset, label))
    return out


def _weights_by_group(
    ev: Evaluator, where: exp.Expr | None, terms: Terms, offset: Fraction, group_cols: Sequence[Column],
    table: Table, label: str, used: list[str], keys: Sequence[tuple[int, ...]] | None,
) -> list[LinearQuery]:
    """:func:`group_weights` one group at a time: the grid with the group columns held at the
    group's cells (each a one-slab axis), so its weights are that group's slice of the full grid.

    Each group's query is dense on its grid (up to three slabs per group column times the other
    columns' slabs) but holds in memory only its group's block (:func:`_padded_group_query`);
    the blocks of the statement's queries together are bounded by :data:`MAX_WIDE_BOXES` — a
    clean refusal before memory runs out, not after."""
    key_list = list(keys if keys is not None else itertools.product(*[range(c.n_cells) for c in group_cols]))
    out: list[LinearQuery] = []
    labels = [c.labels() for c in group_cols]
    smallest = 0  # the fewest weights a group of this output held so far
    for key in key_list:
        # The groups left are projected at the smallest so far: a huge GROUP BY is refused after one group.
        if ev.wide_boxes + (len(key_list) - len(out)) * smallest > MAX_WIDE_BOXES:
            raise UnsupportedQuery(
                f"this statement's queries would hold more than {MAX_WIDE_BOXES} weights ({len(out)} of the "
                f"{len(key_list)} groups of GROUP BY {', '.join(c.name for c in group_cols)} hold {ev.wide_boxes}, "
                f"the other {len(key_list) - len(out)} about {smallest} each), more than the limit; group by fewer "
                "columns, filter on fewer columns, or split the statement by group (WHERE col = …)."
            )
        check_deadline()
        cols, bps = ev.set_grid(used, fixed={c.name: k for c, k in zip(group_cols, key, strict=True)})
        w = np.broadcast_to(_weights(ev, where, terms), ev.shape)
        full_bps = [ev.grid_breakpoints(c) for c in cols]
        gax = [cols.index(c.name) for c in group_cols]
        query, held = _padded_group_query(table, cols, full_bps, gax, key, group_cols, labels, w, offset, label)
        smallest = held if not out else min(smallest, held)
        out.append(query)
        ev.wide_boxes += held
    return out


def _padded_group_query(
    table: Table, cols: list[str], bps: list[np.ndarray], gax: list[int], key: tuple[int, ...],
    group_cols: Sequence[Column], labels: list[list[Any]], slab: np.ndarray, offset: Fraction, label: str,
) -> tuple[LinearQuery, int]:
    """:func:`_group_query` without its padding in memory (:func:`~dpgate.compile._padded.padded_query`:
    the same query), and the numerators it holds (its block's)."""
    new_bps = list(bps)
    origin = [0] * len(cols)
    for ax, k, c in zip(gax, key, group_cols, strict=True):
        small = sorted({0, k, k + 1} - {c.n_cells})
        new_bps[ax] = np.array(small)
        origin[ax] = small.index(k)
    group = tuple((c.name, names[k]) for c, names, k in zip(group_cols, labels, key, strict=True))
    return padded_query(table, cols, _ints(new_bps), slab, origin, offset, label=label, group=group)


def _group_query(
    table: Table, cols: list[str], bps: list[np.ndarray], gax: list[int], key: tuple[int, ...],
    group_cols: Sequence[Column], labels: list[list[Any]], slab: np.ndarray, offset: Fraction, label: str,
) -> LinearQuery:
    """The query of group ``key``: ``slab`` (the weights with one slab on each group axis ``gax``)
    placed in the group's slab of the grid ``bps`` with the group axes cut at ``{0, k, k + 1}``."""
    index: list[Any] = [slice(None)] * len(cols)
    new_bps = list(bps)
    new_shape = [len(b) for b in bps]
    for ax, k, c in zip(gax, key, group_cols, strict=True):
        small = sorted({0, k, k + 1} - {c.n_cells})
        new_bps[ax] = np.array(small)
        new_shape[ax] = len(small)
        index[ax] = small.index(k)
    weights = np.zeros(new_shape)
    weights[tuple(slice(i, i + 1) if isinstance(i, int) else i for i in index)] = slab
    group = tuple((c.name, names[k]) for c, names, k in zip(group_cols, labels, key, strict=True))
    return LinearQuery.from_grid(table, cols, _ints(new_bps), weights, offset, label=label, group=group)


def _weights(ev: Evaluator, where: exp.Expr | None, terms: Terms) -> Any:
    """``Σ coef · contribution`` of an output's terms on the evaluator's current grid (cells where
    ``where`` holds; elsewhere 0)."""
    base = ev.truth(where)
    w: Any = np.zeros(ev.shape)
    for coef, agg in terms:
        mask = base if agg.cond is None else np.logical_and(base, ev.truth(agg.cond))
        if agg.arg is None:
            contrib: Any = 1.0
        elif agg.kind == "count":
            val = ev.ev(agg.arg)
            _finite_where(val, mask, agg.node)
            contrib = np.logical_not(val.null).astype(float)
        else:
            val = ev.as_num(ev.ev(agg.arg), agg.arg, agg.node)
            if val.kind == NULL:
                continue
            _finite_where(val, mask, agg.node)
            contrib = np.where(val.null, 0.0, val.v)
        w = w + float(coef) * np.where(mask, contrib, 0.0)
    return w


def _ints(breakpoints: list[np.ndarray]) -> Sequence[Sequence[int]]:
    # from_grid reads any sequences of integers; numpy's stubs do not make an int64 array a Sequence[int].
    return cast("Sequence[Sequence[int]]", breakpoints)


def _finite_where(val: Val, mask: Any, node: exp.Expr) -> None:
    if val.kind != NUM:
        return
    bad = np.logical_and(np.logical_and(mask, np.logical_not(val.null)), ~np.isfinite(val.v))
    if np.any(bad):
        raise UnsupportedQuery(
            f"{node.sql()!r} is not a finite number for some rows (division by a value that can be 0, or an "
            "overflow); guard it, e.g. CASE WHEN x <> 0 THEN … / x ELSE 0 END, or FILTER (WHERE x <> 0)."
        )
