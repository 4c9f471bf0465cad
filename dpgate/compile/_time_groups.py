"""``GROUP BY date_trunc('month', d)`` and ``GROUP BY EXTRACT(dow FROM d)``: groups of granules.

A GROUP BY key that is ``date_trunc(unit, col)`` or ``EXTRACT(unit FROM col)`` of a declared
date/timestamp column is compiled as ``GROUP BY col`` (one group per declared granule) and the
groups are then merged: the queries of the granules with the same truncated (or extracted)
value are summed, aggregate by aggregate.  So the keys come from the declaration, never from
the data: every month (or weekday …) some declared granule falls in, except those the WHERE
clause reaches on no cell.  Each merged query is a sum of per-granule queries, so it is a
query on the cells like any other: history and inference combine it with the others.

:func:`rewrite_time_groups` rewrites the parsed tree (the GROUP BY key, and a SELECT item
equal to it, become the bare column) and returns what :func:`merge_time_groups` needs.
AVG / VAR / STDDEV outputs with such a key are refused (their components would be merged
after their combination) — except on the fast path: when the key is ``date_trunc`` and the
column's other uses mean the same on the coarser cells (:func:`_exact_on_coarse`), the statement is compiled on the
column declared at that unit (:func:`coarse_schema`) and its queries mapped back onto the
declared cells (:func:`fine_queries`), without a group per granule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.compile._dates import date_trunc, extract, shown
from dpgate.compile.aggregates import unparen
from dpgate.compile.cells import NULL, TIME, Val
from dpgate.compile.query import LinearQuery, union_grid
from dpgate.compile.stages import CompiledStatement
from dpgate.errors import SchemaError, UnsupportedQuery
from dpgate.schema._temporal import (
    EPOCH,
    GROUPING_UNITS,
    TEMPORAL_KINDS,
    finer_or_equal,
    granule_start,
    ordinal,
    parse_instant,
)
from dpgate.schema.domains import Column, Schema, Table

__all__ = ["rewrite_time_groups", "merge_time_groups", "coarse_schema", "fine_queries", "check_merged_size"]

_FUNCS = (exp.TimestampTrunc, exp.DateTrunc, exp.Extract)


def _time_column(node: exp.Expr) -> exp.Column | None:
    """The bare column of ``date_trunc(unit, col)`` / ``EXTRACT(unit FROM col)``, else None."""
    node = unparen(node)
    if not isinstance(node, _FUNCS):
        return None
    arg = unparen(node.expression if isinstance(node, exp.Extract) else node.this)
    return arg if isinstance(arg, exp.Column) and not isinstance(arg.this, exp.Star) else None


def rewrite_time_groups(tree: exp.Expr) -> dict[str, exp.Expr]:
    """Replace every GROUP BY ``date_trunc`` / ``EXTRACT`` of a column (written there, or named
    by the alias or position of a SELECT item) by the column, in GROUP BY and SELECT; returns
    column name (lower case) → the function node."""
    group = tree.args.get("group") if isinstance(tree, exp.Select) else None
    if group is None:
        return {}
    found: dict[str, exp.Expr] = {}
    items = list(tree.expressions)

    def record(fn: exp.Expr) -> exp.Column:
        col = _time_column(fn)
        assert col is not None
        name = col.name.lower()
        if name in found and found[name].sql() != unparen(fn).sql():
            raise UnsupportedQuery(
                f"GROUP BY groups column {col.name!r} by {shown(found[name])} and by {shown(unparen(fn))}; group a date "
                "column by one function of it."
            )
        found[name] = unparen(fn).copy()
        return col.copy()

    aliases = {it.alias.lower(): it for it in items if isinstance(it, exp.Alias)}
    for e in list(group.expressions):
        target = unparen(e)
        if _time_column(target) is not None:
            e.replace(record(target))
            continue
        item = None
        if isinstance(target, exp.Column) and not target.table and target.name.lower() in aliases:
            item = aliases[target.name.lower()]
        elif isinstance(target, exp.Literal) and not target.is_string and target.this.isdigit() \
                and 1 <= int(target.this) <= len(items):
            item = items[int(target.this) - 1]
        if item is not None:
            body = item.this if isinstance(item, exp.Alias) else item
            if _time_column(body) is not None:
                body.replace(record(body))
    wanted = {fn.sql() for fn in found.values()}
    for it in items:
        body = it.this if isinstance(it, exp.Alias) else it
        if _time_column(body) is not None and unparen(body).sql() in wanted:
            col = _time_column(body)
            assert col is not None
            body.replace(col.copy())
    return found


def merge_time_groups(stmt: CompiledStatement, found: dict[str, exp.Expr], schema: Schema) -> CompiledStatement:
    """The statement with the groups of each rewritten column merged by the function's value."""
    if stmt.derived:
        raise UnsupportedQuery(
            "AVG, VAR and STDDEV are not supported with GROUP BY date_trunc(…) / EXTRACT(…); group by the "
            "column itself, or compute SUM(x) and COUNT(x) per group and divide."
        )
    table = schema.table(stmt.table)
    maps: list[Callable[[Any], Any] | None] = []
    for name in stmt.group_columns:
        fn = found.get(name.lower())
        col = table.column(name)
        if fn is None:
            maps.append(None)
            continue
        if col.kind not in TEMPORAL_KINDS:
            raise UnsupportedQuery(f"{shown(fn)}: column {col.name!r} is {col.kind}, not a date or timestamp.")
        labels = col.labels()
        secs = np.array([0.0 if v is None else (parse_instant(v) - EPOCH).total_seconds()  # type: ignore[operator]
                         for v in labels])
        null = np.array([v is None for v in labels])
        val = Val(TIME, secs, null, col)
        out = extract(val, fn) if isinstance(fn, exp.Extract) else date_trunc(val, fn)
        mapped = _labels(out, col.kind if not isinstance(fn, exp.Extract) else "number")
        maps.append(dict(zip(labels, mapped, strict=True)).__getitem__)
    n_agg = stmt.n_aggregates
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for g, key in enumerate(stmt.group_keys):
        new = tuple(v if f is None else f(v) for v, f in zip(key, maps, strict=True))
        buckets.setdefault(new, []).append(g)
    keys = sorted(buckets, key=_order(list(buckets), maps))
    queries = []
    for key in keys:
        groups = buckets[key]
        for j in range(n_agg):
            parts = [stmt.queries[g * n_agg + j] for g in groups]
            queries.append(_sum(table, parts, tuple(zip(stmt.group_columns, key, strict=True))))
    return replace(stmt, queries=tuple(queries), group_keys=tuple(keys))


def _labels(val: Val, kind: str) -> list[Any]:
    """Group labels of a merged column: a date, a datetime, or an integer (EXTRACT); None for NULL."""
    if val.kind == NULL:
        return [None] * len(np.atleast_1d(val.v))
    out: list[Any] = []
    for v, null in zip(np.atleast_1d(val.v).tolist(), np.atleast_1d(val.null).tolist(), strict=True):
        if null:
            out.append(None)
        elif kind == "number":
            out.append(int(v))
        else:
            t = EPOCH + dt.timedelta(seconds=v)
            out.append(t.date() if kind == "date" else t)
    return out


def _order(keys: list[tuple[Any, ...]], maps: list[Any]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """Row-major order: merged columns by value (NULL last), the others in their declared order."""
    ranks: list[dict[Any, int]] = []
    for i, f in enumerate(maps):
        seen = list(dict.fromkeys(k[i] for k in keys))
        if f is not None:
            seen = sorted((v for v in seen if v is not None)) + [v for v in seen if v is None]
        ranks.append({v: r for r, v in enumerate(seen)})
    return lambda key: tuple(r[v] for r, v in zip(ranks, key, strict=True))


def _sum(table: Any, parts: list[LinearQuery], group: tuple[tuple[str, Any], ...]) -> LinearQuery:
    """One query: the sum of the per-granule queries' weights; their common offset once."""
    if len(parts) == 1:
        q = parts[0]
        return LinearQuery.from_grid(table, q.columns, q.breakpoints, q.numerators / q.denominator, q.offset,
                                     label=q.label, group=group)
    cols, bps = union_grid(table, parts)
    w = sum(q.expand(table, cols, bps) / q.denominator for q in parts)
    return LinearQuery.from_grid(table, cols, bps, np.asarray(w, dtype=float), parts[0].offset,
                                 label=parts[0].label, group=group)


# -- the fast path: a coarser declaration, its queries mapped back onto the declared cells ------------
def coarse_schema(tree: exp.Expr, found: dict[str, exp.Expr], schema: Schema) -> tuple[Schema, Table] | None:
    """When every grouped ``date_trunc(unit, col)`` has ``col``'s other uses exact on the unit's
    cells (:func:`_exact_on_coarse`): the schema with ``col`` declared at that unit (and the declared
    table), so that its groups are compiled directly; else None (per-granule groups are merged).

    A coarse cell is a run of consecutive declared cells, so a query on the coarse cells is the
    same query on the declared ones (:func:`fine_queries`)."""
    if not isinstance(tree, exp.Select) or (ref := tree.find(exp.Table)) is None:
        return None
    try:
        table = schema.table(ref.name)
    except SchemaError:
        return None
    if not any(t is table for t in schema.tables):  # a join's table: its groups are merged per granule
        return None
    coarse: dict[str, Column] = {}
    for name, fn in found.items():
        unit = fn.args.get("unit")
        unit_name = unit.name.lower() if isinstance(unit, (exp.Var, exp.Literal)) else ""
        if not isinstance(fn, (exp.TimestampTrunc, exp.DateTrunc)) or not table.has_column(name):
            return None
        col = table.column(name)
        gran = col.granularity or "day"
        if col.kind not in TEMPORAL_KINDS or unit_name not in GROUPING_UNITS or not finer_or_equal(gran, unit_name):
            return None
        lo, hi = col.int_range()
        coarse[name] = replace(col, min=ordinal(granule_start(lo, gran), unit_name),
                               max=ordinal(granule_start(hi, gran), unit_name), granularity=unit_name)
    for node in tree.find_all(exp.Column):
        if node.name.lower() in coarse:
            child, parent = _context(node)
            if not isinstance(parent, (exp.Group, exp.Select)) and not _exact_on_coarse(child, parent):
                return None
    cols = tuple(coarse.get(c.name.lower(), c) for c in table.columns)
    out = Schema(tuple(replace(t, columns=cols) if t is table else t for t in schema.tables))
    return out, table


def _context(node: exp.Expr) -> tuple[exp.Expr, exp.Expr | None]:
    """``node`` (or the parentheses around it) and the node it is an operand of (past an alias)."""
    child, parent = node, node.parent
    while isinstance(parent, exp.Paren):
        child, parent = parent, parent.parent
    if isinstance(parent, exp.Alias):
        return parent, parent.parent
    return child, parent


def _exact_on_coarse(child: exp.Expr, parent: exp.Expr | None) -> bool:
    """Whether a use of the grouped column means the same on its coarse cells as on the declared
    ones: ``IS NULL``; ``EXTRACT`` and ``date_trunc`` (the compiler refuses a unit finer than the
    coarse cells); ``col >= c`` and ``col < c`` with a constant ``c`` (the compiler refuses one off
    the coarse boundaries), not ``<=``, ``>``, ``=``: ``ts <= '2024-03-01'`` holds on one hour of
    March 1st, not on the whole day."""
    if isinstance(parent, exp.Is):
        return parent.this is child
    if isinstance(parent, exp.Extract):
        return parent.expression is child
    if isinstance(parent, (exp.TimestampTrunc, exp.DateTrunc)):
        return parent.this is child
    if isinstance(parent, (exp.GTE, exp.LT, exp.LTE, exp.GT)):
        below = isinstance(parent, (exp.GTE, exp.LT)) == (parent.this is child)  # col >= c, col < c, c <= col, c > col
        other = parent.expression if parent.this is child else parent.this
        return below and other.find(exp.Column) is None
    return False


def fine_queries(stmt: CompiledStatement, coarse: Schema, table: Table) -> CompiledStatement:
    """The statement compiled on :func:`coarse_schema` with each query on the declared cells."""
    small = coarse.table(table.name)
    maps: dict[str, np.ndarray] = {}
    for fine, c in zip(table.columns, small.columns, strict=True):
        if fine is c:
            continue
        lo, _ = fine.int_range()
        clo, _ = c.int_range()
        gran, unit = fine.granularity or "day", c.granularity or "day"
        starts = [max(0, ordinal(granule_start(clo + j, unit), gran) - lo) for j in range(c.n_cells - 1)]
        maps[fine.name] = np.array([*starts, fine.null_cell], dtype=np.int64)
    queries = []
    for q in stmt.queries:
        bps = [maps[c][list(bp)].tolist() if c in maps else list(bp) for c, bp in zip(q.columns, q.breakpoints,
                                                                                     strict=True)]
        queries.append(LinearQuery.from_grid(table, q.columns, bps, q.numerators / q.denominator, q.offset,
                                             label=q.label, group=q.group))
    return replace(stmt, queries=tuple(queries))


def check_merged_size(tree: exp.Expr, found: dict[str, exp.Expr], schema: Schema, max_groups: int) -> None:
    """Refuse, naming what to write, a merged ``GROUP BY date_trunc(…)`` / ``EXTRACT(…)`` whose
    column has more granules than the compiler's group limit (before it is compiled per granule)."""
    ref = tree.find(exp.Table)
    try:
        table = schema.table(ref.name) if ref is not None else None
    except SchemaError:
        return  # the compiler names the undeclared table
    for name, fn in found.items():
        if table is None or not table.has_column(name):
            continue
        col = table.column(name)
        if col.kind in TEMPORAL_KINDS and col.n_cells - 1 > max_groups:
            raise UnsupportedQuery(
                f"GROUP BY {shown(fn)} with {col.name!r} also elsewhere in the query is compiled one group per "
                f"{col.granularity} ({col.n_cells - 1} of them), more than the limit of {max_groups}; group by "
                f"date_trunc(…) of a column the query uses nowhere else (drop the condition on {col.name!r}, or ask "
                f"one query per period: WHERE {col.name} >= … AND {col.name} < …), or declare a coarser granularity."
            )
