"""AVG, VAR and STDDEV: compiled into the linear queries they are made of.

``AVG(x) = SUM(x) / COUNT(x)``; ``VAR_POP(x) = SUM(x²)/COUNT(x) − (SUM(x)/COUNT(x))²``;
``VAR_SAMP(x) = (SUM(x²) − SUM(x)²/COUNT(x)) / (COUNT(x) − 1)``; the standard
deviations are their square roots.  None is linear, so :func:`compile_derived`
rewrites each such SELECT item into its *components* — ``COUNT(x)``, ``SUM(x)``
and, for variances, ``SUM(x*x)``, each with the item's FILTER — compiles that
linear SELECT with the ordinary stages, centres the sums on the middle ``c`` of
``x``'s declared range (``SUM(x − c)``, ``SUM((x − c)²)``: same information,
smaller sensitivity), and records in
:attr:`CompiledStatement.derived` how every output is put back together.  The
gateway answers the components like any other linear query (history reused,
minimal budget) and :mod:`dpgate.answer.combine` turns their intervals into an honest
interval for the derived quantity.

Accepted: ``AVG``/``MEAN``, ``VAR``/``VARIANCE``/``VAR_SAMP``, ``VAR_POP``,
``STDDEV``/``STDDEV_SAMP``, ``STDDEV_POP`` of a cell expression, alone as a
SELECT item (optionally aliased, with ``FILTER (WHERE …)``), next to other
outputs and with GROUP BY; HAVING / ORDER BY may refer to them.  Arithmetic on
them (``AVG(x) + 1``) is refused: compute it from the released value, it is free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.compile._padded import nonzero_box, padded_query
from dpgate.compile.aggregates import DERIVED_KINDS, Derivation, derived_kind, unparen
from dpgate.compile.bounds import check_deadline
from dpgate.compile.cells import walk
from dpgate.compile.post import build as build_post
from dpgate.compile.query import LinearQuery, union_grid
from dpgate.compile.stages import STAGES, Compilation, CompiledStatement, named_outputs
from dpgate.compile.statement import Hints
from dpgate.errors import UnsupportedQuery
from dpgate.schema.domains import Schema, Table

__all__ = ["compile_derived", "has_derived", "refuse_derived"]

# Component suffixes, in the order dpgate.answer.combine reads them.
_PARTS = {"avg": ("n", "s"), "var_samp": ("n", "s", "q"), "var_pop": ("n", "s", "q"),
          "stddev_samp": ("n", "s", "q"), "stddev_pop": ("n", "s", "q")}
_PREFIX = "__dpgate_part"
#: Grids (boxes) from which a group's centred components are built from their non-zero box alone.
_PADDED_FROM = 2**16


def has_derived(tree: exp.Expr) -> bool:
    """Whether a SELECT tree uses AVG / VAR / STDDEV anywhere."""
    return isinstance(tree, exp.Select) and any(derived_kind(n) is not None for n in walk(tree))


def compile_derived(
    tree: exp.Select, schema: Schema | Mapping[str, Any] | str, dialect: str, *,
    hints: Mapping[str, str] | None = None, sql: str = "", max_outputs: int | None = None,
) -> CompiledStatement:
    """Compile a SELECT with AVG / VAR / STDDEV outputs into their linear components.

    The returned statement's ``queries`` are the components, per group in the order
    of ``derived`` (``queries[g * n_components + j]``); its ``outputs`` and
    ``postprocess`` are those of the SELECT as written.  ``max_outputs``: as ``compile_tree``'s
    (the components are the outputs counted).
    """
    schema = Schema.load(schema)
    linear_tree = tree.copy()
    for key in ("having", "order", "limit", "offset"):
        linear_tree.set(key, None)  # post-processing is built below over the outputs as written
    items: list[exp.Expr] = []
    derivations: list[Derivation] = []
    originals = list(tree.expressions)
    start = 0  # the next component's position in a group's block of queries
    for i, item in enumerate(originals):
        body = unparen(_body(item))
        kind, arg, cond = _split(body)
        if kind is None:
            if any(derived_kind(n) is not None for n in walk(body)):
                raise UnsupportedQuery(
                    f"{item.sql(dialect=dialect)!r}: AVG, VAR and STDDEV must be whole output columns (optionally "
                    "aliased or with FILTER); arithmetic on them is post-processing — compute it from the released value."
                )
            if _is_column(body):
                derivations.append(Derivation("group", ()))
            else:
                derivations.append(Derivation("linear", (start,)))
                start += 1
            items.append(item.copy())
            continue
        assert arg is not None
        derivations.append(Derivation(kind, tuple(range(start, start + len(_PARTS[kind])))))
        start += len(_PARTS[kind])
        for part in _PARTS[kind]:
            x = arg.copy()
            agg: exp.Expr = (exp.Count(this=x) if part == "n" else
                             exp.Sum(this=x) if part == "s" else exp.Sum(this=exp.Mul(this=exp.Paren(this=x),
                                                                                       expression=exp.Paren(this=arg.copy()))))
            if cond is not None:
                agg = exp.Filter(this=agg, expression=exp.Where(this=cond.copy()))
            items.append(exp.alias_(agg, f"{_PREFIX}{i}_{part}", quoted=True))
    linear_tree.set("expressions", items)
    _remap_group_positions(linear_tree, originals)
    c = Compilation(linear_tree, schema, dialect, max_outputs)
    for stage in STAGES:
        check_deadline()
        stage(c)
    # The outputs as written: group outputs keep the compiled name, derived ones their alias or SQL text.
    compiled = iter(o for o in c.outputs if not o.name.startswith(_PREFIX))
    named: list[tuple[str, str | None]] = []
    for item, d in zip(originals, derivations, strict=True):
        if d.kind in ("group", "linear"):
            o = next(compiled)
            named.append((o.name, o.column))
        else:
            named.append((item.alias if isinstance(item, exp.Alias) else _body(item).sql(dialect=dialect), None))
    outputs = named_outputs(named, [g.name for g in c.group_columns])
    queries, derived = _centred(c.queries, [d for d in derivations if d.kind != "group"], c.table)
    post_items = [(o.name, unparen(_body(it)), o.column)
                  for o, it in zip(outputs, originals, strict=True)]
    postprocess = build_post(tree, c.table, c.qualifiers, post_items, dialect)
    return CompiledStatement(
        table=c.table.name,
        queries=queries,
        group_columns=tuple(col.name for col in c.group_columns),
        group_keys=c.group_keys,
        outputs=tuple(outputs),
        postprocess=postprocess,
        hints=Hints(hints),
        sql=sql,
        derived=derived,
    )


def _centred(
    queries: tuple[LinearQuery, ...], derived: list[Derivation], table: Table
) -> tuple[tuple[LinearQuery, ...], tuple[Derivation, ...]]:
    """Components of ``x − c`` instead of ``x``: ``SUM(x − c) = SUM(x) − c·COUNT(x)`` and
    ``SUM((x − c)²) = SUM(x²) − 2c·SUM(x) + c²·COUNT(x)``, with ``c`` the (integer) middle
    of the range of ``x`` over the cells counted in any group — public, from the weights.

    The variance is the same for ``x − c``, and the mean is ``c`` plus that of ``x − c``;
    but the centred sums have sensitivity ``max|x − c|`` (half the range) instead of
    ``max|x|``, so the same budget pins them down several times more tightly.
    """
    n = sum(len(d.parts) for d in derived)
    out = list(queries)
    centred = []
    for d in derived:
        if d.kind == "linear":
            centred.append(d)
            continue
        groups = range(len(out) // n)
        # Each group's components on their common grid, expanded once for the range and the shift.
        grids = [_expanded(table, [out[g * n + p] for p in d.parts]) for g in groups]
        ranges = [_value_range(comps, w) for comps, _, _, w, _ in grids]
        found = [r for r in ranges if r is not None]
        c = math.floor((min(r[0] for r in found) + max(r[1] for r in found)) / 2) if found else 0
        shifted_ranges = tuple(None if r is None else (r[0] - c, r[1] - c) for r in ranges)
        if c:
            for g, (comps, cols, bps, expanded, origin) in zip(groups, grids, strict=True):
                w: list[np.ndarray] = [e / q.denominator for q, e in zip(comps, expanded, strict=True)] \
                    if not _integral(comps, expanded, c) else list(expanded)
                shifted = [w[0], w[1] - c * w[0], *([w[2] - 2 * c * w[1] + c * c * w[0]] if len(w) > 2 else [])]
                for p, q, wi in zip(d.parts, comps, shifted, strict=True):
                    out[g * n + p] = LinearQuery.from_grid(table, cols, bps, wi, label=q.label, group=q.group) \
                        if origin is None else padded_query(table, cols, bps, wi, origin, label=q.label, group=q.group)[0]
        centred.append(Derivation(d.kind, d.parts, c, shifted_ranges))
    return tuple(out), tuple(centred)


def _integral(comps: list[LinearQuery], expanded: list[np.ndarray], c: int) -> bool:
    """Whether the shifted weights can be computed on the integer numerators: every denominator 1
    and every intermediate value below 2⁵², where float arithmetic is exact too — the same
    weights, without float copies of a wide column's arrays."""
    if any(q.denominator != 1 for q in comps):
        return False
    # On each query's own grid: its expansion repeats the same numerators (no |·| of a wide union grid).
    top = max((int(np.abs(q.numerators).max(initial=0)) for q in comps), default=0)
    return (abs(c) + 1) ** (len(comps) - 1) * (top + 1) < 2**52


def _expanded(
    table: Table, comps: list[LinearQuery]
) -> tuple[list[LinearQuery], list[str], list[tuple[int, ...]], list[np.ndarray], list[int] | None]:
    """``comps``, their coarsest common grid, and each one's numerators on it (read-only views),
    with None; on a large grid (a wide group's), only on the box holding their non-zero weights
    (copies: every group's are kept until the centre is known), with the box's first slabs."""
    cols, bps = union_grid(table, comps)
    expanded = [q.expand(table, cols, bps) for q in comps]
    box = nonzero_box(expanded) if expanded and expanded[0].size > _PADDED_FROM else None
    if box is None:
        return comps, cols, bps, expanded, None
    return comps, cols, bps, [np.array(e[box]) for e in expanded], [s.start for s in box]


def _value_range(comps: list[LinearQuery], expanded: list[np.ndarray]) -> tuple[float, float] | None:
    """``[a, b]``: the range of ``x`` over the cells ``COUNT(x)`` counts, read off the numerators of
    ``COUNT(x)`` and ``SUM(x)`` (public weights) on a common grid; None when no cell is counted."""
    count, total = comps[0], comps[1]
    if count.is_zero:
        return None
    xs = expanded[1][expanded[0] != 0] / total.denominator
    return float(xs.min()), float(xs.max())


def _split(body: exp.Expr) -> tuple[str | None, exp.Expr | None, exp.Expr | None]:
    """``(kind, argument, FILTER condition)`` of a derived aggregate item, else ``(None, None, None)``."""
    cond = None
    if isinstance(body, exp.Filter):
        cond = body.expression.this if isinstance(body.expression, exp.Where) else body.expression
        body = unparen(body.this)
    kind = derived_kind(body)
    if kind is None:
        return None, None, None
    arg = body.this if not isinstance(body, exp.Anonymous) else (body.expressions[0] if len(body.expressions) == 1 else None)
    if arg is None or isinstance(arg, exp.Star) or isinstance(body, exp.Anonymous) and len(body.expressions) != 1:
        raise UnsupportedQuery(f"{body.sql()!r} needs exactly one argument, e.g. {DERIVED_KINDS[kind]}(age).")
    if isinstance(arg, exp.Distinct) or body.args.get("distinct"):
        raise UnsupportedQuery(f"{body.sql()!r}: DISTINCT inside {DERIVED_KINDS[kind]} is not supported (not linear).")
    return kind, arg, cond


def _body(item: exp.Expr) -> exp.Expr:
    """A SELECT item without its alias."""
    return item.this if isinstance(item, exp.Alias) else item


def _is_column(body: exp.Expr) -> bool:
    return isinstance(body, exp.Column) and not isinstance(body.this, exp.Star)


def _remap_group_positions(tree: exp.Select, originals: list[exp.Expr]) -> None:
    """``GROUP BY 1`` counts the SELECT items as written; the expanded list has more, so
    positions are replaced by the (column) item they name."""
    group = tree.args.get("group")
    if group is None:
        return
    new = []
    for e in group.expressions:
        u = unparen(e)
        if isinstance(u, exp.Literal) and not u.is_string and u.this.isdigit() and 1 <= int(u.this) <= len(originals):
            picked = originals[int(u.this) - 1]
            body = unparen(_body(picked))
            if not _is_column(body):
                raise UnsupportedQuery(f"GROUP BY {u.sql()} refers to an aggregate ({picked.sql()!r}); group by columns.")
            new.append(body.copy())
        else:
            new.append(e)
    group.set("expressions", new)


def refuse_derived(stmt: CompiledStatement, what: str) -> None:
    """AVG / VAR / STDDEV answers are Bonferroni boxes, not distributions: ``what`` needs a linear query."""
    if stmt.derived:
        raise UnsupportedQuery(
            f"{what} needs linear outputs; AVG, VAR and STDDEV are not linear (their answers carry an interval "
            "but no posterior) — ask for their components, e.g. SUM(x) and COUNT(x), instead."
        )
