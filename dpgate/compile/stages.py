"""The compiler's stages, run in order from one tuple, :data:`STAGES`.

Why one module of about 500 lines: the stages share one :class:`Compilation` whose field
ownership is listed below; split, each would import the record of the others.

:func:`compile_tree` turns a parsed, bound SELECT into a :class:`CompiledStatement`
by running each stage of :data:`STAGES` on one :class:`Compilation` (as sqlglot's
optimizer walks its ``RULES``).  Each stage is a small function that reads the
fields earlier stages wrote and writes its own fields — the ownership is listed
on :class:`Compilation`; no stage writes another stage's fields.  The order is
the order of the checks: a statement with several faults is refused for the
first one found.

1. :func:`check_shape` — one plain SELECT (no set operations, subqueries, windows, joins,
   CTEs, DISTINCT, unknown clauses); collects the aggregate nodes.
2. :func:`resolve_table` — the one declared table and its qualifiers.
3. :func:`select_items` — each SELECT item is a declared column or ``Σ coef·aggregate + offset``.
4. :func:`group_by` — the GROUP BY columns; raw columns must be grouped; one aggregate at least.
5. :func:`output_columns` — output names (duplicates numbered) and :class:`Output` descriptions.
6. :func:`post_process` — HAVING / ORDER BY / LIMIT / OFFSET on the released rows.
7. :func:`bind_where` — the WHERE condition, evaluated on single-column cells.
8. :func:`prepare_cells` — aggregate arguments and FILTERs on cells, unit slabs for group columns.
9. :func:`weigh` — one :class:`~dpgate.compile.query.LinearQuery` per (group key, aggregate output).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from sqlglot import exp

from dpgate.compile._join import public_alone
from dpgate.compile.aggregates import (
    Derivation,
    SelectItem,
    group_columns,
    group_weights,
    linear,
    no_aggregates,
    unparen,
)
from dpgate.compile.bounds import check_deadline, too_many_outputs
from dpgate.compile.cells import walk
from dpgate.compile.evaluate import Evaluator
from dpgate.compile.post import PostProcess
from dpgate.compile.post import build as build_post
from dpgate.compile.query import MAX_GRID_BOXES, LinearQuery
from dpgate.compile.statement import Hints
from dpgate.errors import DPGateInternalError, SchemaError, UnsupportedQuery
from dpgate.schema.domains import Column, Schema, Table

__all__ = [
    "MAX_GROUPS",
    "STAGES",
    "Compilation",
    "CompiledStatement",
    "Output",
    "compile_tree",
    "check_shape",
    "resolve_table",
    "select_items",
    "group_by",
    "output_columns",
    "named_outputs",
    "post_process",
    "bind_where",
    "prepare_cells",
    "weigh",
]

#: Largest number of GROUP BY keys (product of the group columns' cells) one query may have.
MAX_GROUPS = 65_536

#: SELECT clauses dpgate accepts ("hint": optimizer hints some dialects parse; never executed, ignored).
_ALLOWED_CLAUSES = {"expressions", "from_", "where", "group", "having", "order", "limit", "offset", "hint"}

#: Node types check_shape looks at more closely (one isinstance test skips all other nodes).
_AGGREGATE_NODES = (exp.AggFunc, exp.Filter)
_REFUSED_NODES = (exp.Select, exp.Subquery, exp.Exists, exp.SetOperation, exp.In, exp.Window, exp.Join, exp.Lateral)
#: The offset of a group output (which has no aggregate terms).
_ZERO = Fraction(0)


@dataclass(frozen=True)
class Output:
    """One SELECT item.

    Attributes:
        name: output column name (alias, or the item's SQL; duplicates get ``_1``, ``_2`` … suffixes).
        kind: ``"group"`` (a GROUP BY column) or ``"aggregate"``.
        column: the declared column of a group output, else None.
        index: position in ``group_columns`` (group outputs) or among the aggregates (aggregate outputs).
    """

    name: str
    kind: Literal["group", "aggregate"]
    column: str | None
    index: int


@dataclass(frozen=True)
class CompiledStatement:
    """A compiled SELECT.

    Attributes:
        table: the declared table's name.
        queries: one LinearQuery per (group key, aggregate output), groups in domain order,
            aggregates in SELECT order within each group (``queries[g * n_aggregates + j]``).
        group_columns: declared names of the GROUP BY columns, in the order written.
        group_keys: one tuple of cell labels per group, in order (``((),)`` without GROUP BY).
        outputs: the SELECT items in order.
        postprocess: HAVING / ORDER BY / LIMIT / OFFSET on the released rows.
        hints: ``/*+ dpgate key=value */`` hints found in the text.
        sql: the statement as given.
        derived: empty for a statement of linear outputs (one query per group and output);
            with AVG / VAR / STDDEV (:mod:`dpgate.compile.derived`), one
            :class:`~dpgate.compile.aggregates.Derivation` per aggregate output, and
            ``queries`` holds the linear components, ``n_components`` per group.
    """

    table: str
    queries: tuple[LinearQuery, ...]
    group_columns: tuple[str, ...]
    group_keys: tuple[tuple[Any, ...], ...]
    outputs: tuple[Output, ...]
    postprocess: PostProcess = field(default_factory=PostProcess)
    hints: Mapping[str, str] = field(default_factory=Hints)
    sql: str = ""
    derived: tuple[Derivation, ...] = ()

    @property
    def n_aggregates(self) -> int:
        """Number of aggregate outputs per group."""
        return sum(o.kind == "aggregate" for o in self.outputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Output column names in SELECT order."""
        return tuple(o.name for o in self.outputs)

    def query(self, group: int, aggregate: int) -> LinearQuery:
        """The linear query of group number ``group`` and aggregate number ``aggregate``."""
        return self.queries[group * self.n_aggregates + aggregate]

    def apply_postprocessing(self, df: Any) -> Any:
        """Apply HAVING, ORDER BY, LIMIT and OFFSET to the released table.

        ``df`` has one row per group (in ``group_keys`` order) and one column per
        output name holding released (noisy) values and group labels.  This is
        public data; it runs in a fresh in-memory DuckDB without external access.
        Rows without ORDER BY keep the domain order.
        """
        return self.postprocess.apply(df, self.output_names)


@dataclass(slots=True, eq=False, repr=False)
class Compilation:
    """The working state of one compile, filled in by the stages in order.

    The inputs are set by :func:`compile_tree`; every other field is written by
    exactly one stage (named in the comment above it) and only read by later
    stages.  A field is absent (AttributeError) until its stage has run.  The
    evaluator is the one mutable object: stages 7–8 record breakpoints in it and
    stage 9 evaluates on the grid they define.
    """

    tree: exp.Expr
    schema: Schema
    dialect: str
    max_outputs: int | None = None  # more outputs are refused before any is weighed (``weigh``)
    # check_shape
    select: exp.Select = field(init=False)
    aggregate_nodes: list[exp.Expr] = field(init=False)
    # resolve_table
    table: Table = field(init=False)
    qualifiers: set[str] = field(init=False)
    evaluator: Evaluator = field(init=False)
    # select_items
    items: tuple[SelectItem, ...] = field(init=False)
    # group_by
    group_columns: tuple[Column, ...] = field(init=False)
    aggregates: tuple[SelectItem, ...] = field(init=False)
    # output_columns
    outputs: tuple[Output, ...] = field(init=False)
    # post_process
    postprocess: PostProcess = field(init=False)
    # bind_where
    where: exp.Expr | None = field(init=False)
    # prepare_cells
    n_groups: int = field(init=False)
    # weigh
    queries: tuple[LinearQuery, ...] = field(init=False)
    group_keys: tuple[tuple[Any, ...], ...] = field(init=False)


#: A stage reads the fields earlier stages wrote and writes its own.
Stage = Callable[[Compilation], None]


def compile_tree(
    tree: exp.Expr,
    schema: Schema | Mapping[str, Any] | str,
    dialect: str = "duckdb",
    *,
    hints: Mapping[str, str] | None = None,
    sql: str = "",
    max_outputs: int | None = None,
) -> CompiledStatement:
    """Compile a parsed (and bound) SELECT tree, not modified, by running :data:`STAGES` (``max_outputs``: :func:`weigh`)."""
    c = Compilation(tree, Schema.load(schema), dialect, max_outputs)
    for stage in STAGES:
        check_deadline()
        stage(c)
    return CompiledStatement(
        table=c.table.name,
        queries=c.queries,
        group_columns=tuple(col.name for col in c.group_columns),
        group_keys=c.group_keys,
        outputs=c.outputs,
        postprocess=c.postprocess,
        hints=Hints(hints),
        sql=sql,
    )


# -- the stages, in order -----------------------------------------------------------------------------
def check_shape(c: Compilation) -> None:
    """Refuse what is not one plain SELECT; collect its aggregate nodes (breadth-first)."""
    tree = c.tree
    if isinstance(tree, exp.SetOperation):
        raise UnsupportedQuery(
            f"{type(tree).__name__.upper()} combines several queries; send each SELECT separately "
            "(sums of released answers are free post-processing)."
        )
    if isinstance(tree, exp.Subquery):
        raise UnsupportedQuery("subqueries are not supported (even a parenthesised SELECT); send the bare SELECT.")
    if not isinstance(tree, exp.Select):
        kind = tree.key.upper() if hasattr(tree, "key") else type(tree).__name__
        raise UnsupportedQuery(
            f"dpgate answers only SELECT queries (and SET dpgate.<option> = <value>); {kind} statements are "
            "refused and nothing was executed."
        )
    if tree.args.get("with_"):
        raise UnsupportedQuery("common table expressions (WITH …) are not supported; write one SELECT over one table.")
    aggregates: list[exp.Expr] = []
    for node in walk(tree)[1:]:
        if not isinstance(node, _REFUSED_NODES):
            if isinstance(node, _AGGREGATE_NODES):
                aggregates.append(node)
            continue
        if isinstance(node, (exp.Select, exp.Subquery, exp.Exists, exp.SetOperation)) or (
            isinstance(node, exp.In) and node.args.get("query") is not None
        ):
            raise UnsupportedQuery(
                f"subqueries are not supported ({node.sql()!r}); write one SELECT over one declared table."
            )
        if isinstance(node, exp.Window):
            raise UnsupportedQuery(
                f"window functions (OVER …) are not supported ({node.sql()!r}); ask for grouped counts instead."
            )
        if isinstance(node, (exp.Join, exp.Lateral)):
            raise UnsupportedQuery("joins are not supported; dpgate answers queries over one declared table.")
    if tree.args.get("distinct"):
        raise UnsupportedQuery(
            "SELECT DISTINCT is not supported; every output is already one aggregate row per group — drop DISTINCT."
        )
    if tree.args.get("joins"):
        raise UnsupportedQuery("joins are not supported; dpgate answers queries over one declared table.")
    for key, value in tree.args.items():
        if value and key not in _ALLOWED_CLAUSES:
            raise UnsupportedQuery(
                f"the {key.rstrip('_').upper()} clause is not supported; dpgate accepts SELECT … FROM … WHERE … "
                "GROUP BY … HAVING … ORDER BY … LIMIT … OFFSET …."
            )
    c.select, c.aggregate_nodes = tree, aggregates


def resolve_table(c: Compilation) -> None:
    """The one declared table in FROM (``main.`` allowed), its qualifiers, and an evaluator over it."""
    select, schema = c.select, c.schema
    src = select.args.get("from_")
    if src is None:
        raise UnsupportedQuery(
            "SELECT without FROM: name a declared table, e.g. SELECT COUNT(*) FROM "
            f"{schema.tables[0].name if schema.tables else 'table'}."
        )
    if src.expressions:
        raise UnsupportedQuery("joins are not supported; dpgate answers queries over one declared table.")
    t = src.this
    if isinstance(t, exp.Subquery):
        raise UnsupportedQuery("subqueries are not supported in FROM; query a declared table directly.")
    if not isinstance(t, exp.Table) or not isinstance(t.this, exp.Identifier):
        fn = t.this if isinstance(t, exp.Table) else t
        name = fn.sql_name() if isinstance(fn, exp.Func) and not isinstance(fn, exp.Anonymous) else getattr(fn, "name", "")
        raise UnsupportedQuery(
            f"table functions and non-table sources such as {(name or type(fn).__name__).upper()!s} are not supported "
            "(dpgate never reads files or URLs named in a query); query a declared table."
        )
    extra = {k for k, v in t.args.items() if v} - {"this", "db", "catalog", "alias"}
    if extra:
        raise UnsupportedQuery(
            f"{t.sql()!r}: {', '.join(sorted(extra)).upper()} on a table is not supported (e.g. TABLESAMPLE); "
            "query the declared table as is."
        )
    table = schema.table(t.name)
    table.bound()  # a privacy unit declared without its bound: refused before anything is read
    if table.links.public:
        raise public_alone(table)
    if t.args.get("catalog") or (t.args.get("db") and not table.addressable_as(t.db)):
        declared = f"'main', 'public' and its declared schema {table.schema!r}" if table.schema else "'main' and 'public'"
        prefix = ".".join(p for p in (t.catalog, t.db) if p)
        raise SchemaError(
            f"schema {prefix!r} in {t.sql()!r} is not declared for table {table.name!r}, which accepts {declared}; "
            f"write the bare name {table.name}, or declare 'schema: {t.db}' on the table in the schema file."
        )
    alias = t.args.get("alias")
    quals = {table.name.lower()}
    if alias is not None:
        if alias.args.get("columns"):
            raise UnsupportedQuery("column aliases on the table (AS t(a, b)) are not supported; use declared names.")
        quals = {alias.name.lower()}
    c.table, c.qualifiers, c.evaluator = table, quals, Evaluator(table, quals)


def select_items(c: Compilation) -> None:
    """Classify each SELECT item: a declared column, or a linear combination of aggregates."""
    items = []
    for item in c.select.expressions:
        body = item.this if isinstance(item, exp.Alias) else item
        if isinstance(body, exp.Star) or (isinstance(body, exp.Column) and isinstance(body.this, exp.Star)):
            raise UnsupportedQuery(
                "SELECT * would release raw rows; ask for aggregates such as COUNT(*) or SUM(col), "
                "grouped by declared columns if needed."
            )
        inner = unparen(body)
        if isinstance(inner, exp.Column):
            items.append(SelectItem(item, body, c.evaluator.column(inner), [], _ZERO))
            continue
        terms, offset = linear(inner)
        if not terms:
            raise UnsupportedQuery(
                f"the output {item.sql()!r} is a constant that aggregates no rows; the SELECT lists no "
                "aggregate — use COUNT(*) or SUM(...)."
            )
        items.append(SelectItem(item, body, None, terms, offset))
    c.items = tuple(items)


def group_by(c: Compilation) -> None:
    """The GROUP BY columns; every raw column must be one of them, and some output must aggregate."""
    cols = group_columns(c.select, c.items, c.evaluator)
    names = [col.name for col in cols]
    for it in c.items:
        if it.column is not None and it.column.name not in names:
            raise UnsupportedQuery(
                f"the raw column {it.node.sql()!r} is not aggregated; dpgate releases only aggregates — use "
                f"COUNT(*) … GROUP BY {it.column.name} for counts per value."
            )
    aggregates = tuple(it for it in c.items if it.column is None)
    if not aggregates and not cols:
        raise UnsupportedQuery("the SELECT lists no aggregate; add COUNT(*) or SUM(...) to SELECT.")
    c.group_columns, c.aggregates = tuple(cols), aggregates


def output_columns(c: Compilation) -> None:
    """Output names (alias, column name or SQL text; repeats get ``_1``, ``_2`` …) and descriptions."""
    named = []
    for it in c.items:
        if isinstance(it.node, exp.Alias):
            name = it.node.alias
        elif it.column is not None:
            name = unparen(it.body).name
        else:
            name = _output_name(it.body, c.dialect)
        named.append((name, None if it.column is None else it.column.name))
    c.outputs = named_outputs(named, [col.name for col in c.group_columns])


def named_outputs(named: Sequence[tuple[str, str | None]], group_columns: Sequence[str]) -> tuple[Output, ...]:
    """The outputs of ``(name, GROUP BY column or None for an aggregate)`` pairs in SELECT order:
    a name already taken (case-insensitively) gets ``_1``, ``_2`` …; aggregates are numbered in order."""
    outputs, seen = [], set()
    agg_index = 0
    for name, column in named:
        base, k = name, 0
        while name.lower() in seen:
            k += 1
            name = f"{base}_{k}"
        seen.add(name.lower())
        if column is not None:
            outputs.append(Output(name, "group", column, list(group_columns).index(column)))
        else:
            outputs.append(Output(name, "aggregate", None, agg_index))
            agg_index += 1
    return tuple(outputs)


def post_process(c: Compilation) -> None:
    """HAVING / ORDER BY / LIMIT / OFFSET, rewritten over the output columns."""
    post_items = [(o.name, it.body, o.column) for o, it in zip(c.outputs, c.items, strict=True)]
    c.postprocess = build_post(c.select, c.table, c.qualifiers, post_items, c.dialect)


def bind_where(c: Compilation) -> None:
    """The WHERE condition (no aggregates), evaluated on the cells of each column it reads alone."""
    where = c.select.args.get("where")
    cond = where.this if where is not None else None
    if cond is not None:
        no_aggregates(cond, "WHERE", c.aggregate_nodes)
        c.evaluator.prepare(cond)
    c.where = cond


def prepare_cells(c: Compilation) -> None:
    """Aggregate arguments and FILTERs on cells; unit slabs for the GROUP BY columns, within MAX_GROUPS."""
    ev = c.evaluator
    for it in c.aggregates:
        for _, agg in it.terms:
            for part in (agg.arg, agg.cond):
                if part is not None:
                    ev.prepare(part)
    for col in c.group_columns:
        ev.need_unit(col)
    n_groups = math.prod(len(col.group_cells()) for col in c.group_columns)
    if n_groups > MAX_GROUPS:
        raise UnsupportedQuery(
            f"GROUP BY {', '.join(col.name for col in c.group_columns)} has {n_groups} declared domain keys, more than "
            f"the limit of {MAX_GROUPS}; group by fewer or coarser (binned) columns."
        )
    c.n_groups = n_groups


def weigh(c: Compilation) -> None:
    """The groups WHERE can reach (over ``max_outputs`` outputs: refused), then a LinearQuery per (group, aggregate)."""
    cols = c.group_columns
    keys = reachable_keys(c.evaluator, c.where, cols) if cols else [()]
    if c.max_outputs is not None and len(keys) * len(c.aggregates) > c.max_outputs:  # before any per-group work
        raise too_many_outputs(len(keys) * len(c.aggregates), c.max_outputs)
    names = [o.name for o in c.outputs if o.kind == "aggregate"]
    per_output = [
        group_weights(c.evaluator, c.where, it.terms, it.offset, cols, c.table, name, keys=keys)
        for it, name in zip(c.aggregates, names, strict=True)
    ]
    c.queries = tuple(per_output[j][g] for g in range(len(keys)) for j in range(len(per_output)))
    labels = [col.labels() for col in cols]
    c.group_keys = tuple(tuple(lab[k] for lab, k in zip(labels, key, strict=True)) for key in keys)


def reachable_keys(ev: Evaluator, where: exp.Expr | None, cols: tuple[Column, ...]) -> list[tuple[int, ...]]:
    """The declared group keys (cell tuples, row-major over ``cols`` as written) some row could reach.

    A key is dropped when the WHERE condition is not TRUE on any cell of its group —
    decided from the query and the schema alone, never from data — so ``WHERE age < 3
    GROUP BY age`` has the groups 0, 1, 2, as SQL would (SQL emits no empty group).
    """
    declared = list(itertools.product(*[col.group_cells() for col in cols]))
    if where is None:
        return declared
    names = {col.name for col in cols} | set(ev.columns_in(where))
    group_names = {col.name for col in cols}
    if ev.grid_boxes(names) > MAX_GRID_BOXES and ev.grid_boxes(names - group_names) <= MAX_GRID_BOXES:
        # A wide column cut for an aggregate (SUM(income)) and read by WHERE: one group at a time.
        return [key for key in declared if _reaches(ev, where, sorted(names), cols, key)]
    grid_cols, bps = ev.set_grid(sorted(names))
    truth = np.broadcast_to(np.asarray(ev.truth(where), dtype=bool), ev.shape)
    group_axes = [grid_cols.index(col.name) for col in cols]
    others = tuple(ax for ax in range(len(grid_cols)) if ax not in group_axes)
    reach = np.asarray(truth.any(axis=others) if others else truth)
    # ``any`` keeps the group axes in grid order; index them in the order written.
    order = sorted(range(len(cols)), key=lambda i: group_axes[i])
    # Group columns have unit slabs (need_unit), so a slab index is a cell index.
    if any(len(bps[ax]) != col.n_cells for ax, col in zip(group_axes, cols, strict=True)):
        raise DPGateInternalError("a GROUP BY column lost its unit slabs")
    return [key for key in declared if reach[tuple(key[i] for i in order)]]


def _reaches(ev: Evaluator, where: exp.Expr, names: list[str], cols: tuple[Column, ...], key: tuple[int, ...]) -> bool:
    """Whether ``where`` is TRUE on some cell of group ``key`` (its columns held at its cells)."""
    check_deadline()
    fixed: dict[str, int] = {}
    for col, k in zip(cols, key, strict=True):
        if fixed.setdefault(col.name, k) != k:  # GROUP BY a, a: one cell cannot hold two values
            return False
    ev.set_grid(names, fixed=fixed)
    return bool(np.asarray(ev.truth(where), dtype=bool).any())


#: The compiler, stage by stage (see the module docstring); compile_tree runs them in this order.
STAGES: tuple[Stage, ...] = (
    check_shape,
    resolve_table,
    select_items,
    group_by,
    output_columns,
    post_process,
    bind_where,
    prepare_cells,
    weigh,
)


def _output_name(body: exp.Expr, dialect: str) -> str:
    """The column name of an unaliased output: its SQL text, as the database would show it.

    A bare ``COUNT(*)`` — most outputs — skips sqlglot's generator (a tenth of a
    compile), for the default dialect only, where the text is known.
    """
    if (
        dialect == "duckdb"
        and type(body) is exp.Count
        and type(body.this) is exp.Star
        and not any(body.this.args.values())  # no EXCLUDE / REPLACE / RENAME / ILIKE on the star
        and not body.expressions
        and not body.comments
        and not body.this.comments
    ):
        return "COUNT(*)"
    return body.sql(dialect=dialect)
