"""Compile SQL counting queries to :class:`~dpgate.query.LinearQuery` objects.

The compiler reads SQL with sqlglot (DuckDB dialect by default) and turns each
output column of each group into a linear query ``θ = Σ_cells w(cell)·count(cell) + c``
over one declared table.  It never runs the SQL and needs no database: the
weights are computed from the public schema alone.

Supported SQL
=============

One ``SELECT`` from one declared table (``pums``, ``main.pums``, ``"PUMS"``;
names are case-insensitive, quoted or not) whose output columns are

* ``COUNT(*)``, ``COUNT(1)``, ``COUNT(expr)`` (rows where ``expr`` is not NULL),
  ``COUNT_IF(cond)``;
* ``SUM(expr)`` where ``expr`` depends only on the row's cell: numeric and boolean
  columns (booleans count 0/1), constants, ``+ - * /`` and ``%``, ``ABS``,
  ``CASE WHEN … THEN … ELSE … END`` (also the ``CASE x WHEN v`` form), ``IF``,
  ``COALESCE``, ``CAST(… AS INTEGER | DOUBLE | BOOLEAN)`` and comparisons
  (a condition counts 0/1);
* any of these with ``FILTER (WHERE cond)``;
* linear combinations of those with numeric constants, e.g.
  ``2*COUNT(*) - 10`` or ``COUNT(*) FILTER (WHERE a) - COUNT(*) FILTER (WHERE b)``;
  the constants go to the query's offset and do not change its sensitivity;
* the ``GROUP BY`` columns themselves (aliases allowed).

``WHERE`` / ``FILTER`` conditions may use ``= <> != < <= > >=`` (constants on
either side), ``BETWEEN``, ``IN (…)``, ``NOT``, ``AND``, ``OR``, ``IS [NOT] NULL``,
``IS [NOT] TRUE/FALSE``, ``LIKE`` / ``ILIKE`` / ``NOT LIKE`` (with ``ESCAPE``) on
categorical columns, and boolean columns as conditions (``WHERE married``,
``married = true``, ``married = 1``).  ``GROUP BY`` takes declared columns by
name, alias or position (and ``GROUP BY ALL``) and returns one row per *domain*
key (``Column.labels()``), in row-major order over the columns as written —
keys never come from the data, empty groups included.  ``HAVING``, ``ORDER BY``,
``LIMIT`` and ``OFFSET`` are post-processing of the released noisy rows (see
:meth:`CompiledStatement.apply_postprocessing`).  Parameters (``?``, ``$1``,
``:name``) are bound as literal nodes, and a ``/*+ dpgate accuracy=25
confidence=0.95 */`` comment anywhere in the text (keys: accuracy, confidence,
method, allow_partial) is returned as hints.  ``SET dpgate.accuracy = 25``,
``SET dpgate.confidence = 0.95``, ``SET dpgate.intervals = on|off`` (also
``method``, ``allow_partial``) compile to a :class:`SetOption`.

Semantics of cells, NULL, ``other`` and clamping
================================================

Queries are evaluated on a row's *cell* (see :mod:`dpgate.schema`), i.e. on its
value after the schema's mapping: integer values are floored and clamped to
``[min, max]``; binned values are clamped into the first / last bin; categorical
values outside the declared list are ``other``; a boolean is true when non-zero.
So on ``age`` declared ``0..100`` a raw age of 130 counts as 100 and
``age < 29.5`` means ``age <= 29``.

* SQL three-valued logic: a comparison with NULL is unknown, unknown rows are
  not counted, and ``NOT`` keeps unknown unknown — ``NOT (age < 30)`` does not
  count NULL ages.  ``COUNT(*)`` counts NULL rows; ``COUNT(col)`` and ``SUM``
  skip them.  ``SUM`` over no rows is 0, not NULL (a linear query).
* ``other`` equals no declared value (so ``sex <> '1'`` counts it, ``sex = '1'``
  and ``sex IN ('0', '1')`` do not) and matches no ``LIKE`` pattern.
* Categorical columns support only ``=``, ``<>``, ``IN``, ``LIKE`` and
  ``IS NULL``, against declared values; any other literal is refused (also in
  ``<>`` / ``NOT IN``), listing the declared values.  A numeric literal is
  compared by its text (``sex = 1`` means ``sex = '1'``).
* Binned columns may only be compared with constants, and every comparison must
  keep each bin whole; a comparison that splits a bin is refused naming the bin
  and the edges.  Bins of an integer-valued binned column (declared with
  ``min``/``max``) hold integers, so ``income <= 24999`` keeps ``[10000, 25000)``
  whole.
* Weights must be finite rationals (constants with at most six decimals):
  a division by a value that can be 0 is refused unless guarded by CASE/FILTER.

Refused, before any data is touched: ``SELECT *``, raw (ungrouped) columns,
MIN/MAX/AVG/MEDIAN/STDDEV and other aggregates, DISTINCT, joins, subqueries,
CTEs, set operations, window functions, table functions, non-SELECT statements,
several statements, undeclared tables and columns (``SchemaError``), GROUP BY
expressions, non-constant LIMIT/OFFSET, ``SELECT`` without ``FROM``.  Parse
errors raise :class:`~dpgate.errors.QuerySyntaxError` with line and column.

Example:
    >>> schema = {"tables": {"pums": {"columns": {
    ...     "age": {"type": "integer", "min": 0, "max": 100},
    ...     "sex": {"type": "categorical", "values": ["0", "1"]}}}}}
    >>> (q,) = compile_sql("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", schema)
    >>> q == compile_sql("SELECT COUNT(*) FROM pums WHERE age >= 20 AND age < 30", schema)[0]
    True
    >>> q.sensitivity
    1.0
    >>> qs = compile_sql("SELECT sex, 2*COUNT(*) - 10 AS n FROM pums GROUP BY sex", schema)
    >>> [(dict(q.group)["sex"], q.label, q.sensitivity, q.offset) for q in qs]
    [('0', 'n', 2.0, Fraction(-10, 1)), ('1', 'n', 2.0, Fraction(-10, 1)), ('<other>', 'n', 2.0, Fraction(-10, 1)), (None, 'n', 2.0, Fraction(-10, 1))]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlglot import exp

from dpgate._compile_aggregates import _group_columns, _linear, _no_aggregates, _unparen, _weights
from dpgate._compile_cells import walk
from dpgate._compile_eval import Evaluator
from dpgate._compile_post import PostProcess
from dpgate._compile_post import build as _build_post
from dpgate._compile_statement import (
    HINT_KEYS,
    SET_OPTIONS,
    SetOption,
    bind,
    dialect_of,
    hints,
    parse,
    set_option,
    split_check,
    tokenize,
)
from dpgate.errors import ProgrammingError, SchemaError, UnsupportedQuery
from dpgate.query import LinearQuery
from dpgate.schema import Schema, Table

__all__ = [
    "compile_sql",
    "compile_statement",
    "compile_tree",
    "CompiledStatement",
    "Output",
    "PostProcess",
    "SetOption",
    "HINT_KEYS",
    "SET_OPTIONS",
    "MAX_GROUPS",
]

#: Largest number of GROUP BY keys (product of the group columns' cells) one query may have.
MAX_GROUPS = 65_536

#: SELECT clauses dpgate accepts ("hint": optimizer hints some dialects parse; never executed, ignored).
_ALLOWED_CLAUSES = {"expressions", "from_", "where", "group", "having", "order", "limit", "offset", "hint"}

#: Node types _check_shape looks at more closely (one isinstance test skips all other nodes).
_AGGREGATE_NODES = (exp.AggFunc, exp.Filter)
_REFUSED_NODES = (exp.Select, exp.Subquery, exp.Exists, exp.SetOperation, exp.In, exp.Window, exp.Join, exp.Lateral)


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
    """

    table: str
    queries: tuple[LinearQuery, ...]
    group_columns: tuple[str, ...]
    group_keys: tuple[tuple[Any, ...], ...]
    outputs: tuple[Output, ...]
    postprocess: PostProcess = field(default_factory=PostProcess)
    hints: dict[str, str] = field(default_factory=dict)
    sql: str = ""

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


# -- entry points ----------------------------------------------------------------------------------
def compile_sql(sql: str, schema: Schema | Mapping[str, Any] | str, dialect: str = "duckdb") -> tuple[LinearQuery, ...]:
    """Compile one SELECT to its linear queries (one per group key and output column).

    Raises:
        UnsupportedQuery: the SQL is not a supported counting query (the message says what to write).
        QuerySyntaxError: the SQL does not parse.
        SchemaError: an undeclared table or column.
    """
    stmt = compile_statement(sql, schema, dialect)
    if isinstance(stmt, SetOption):
        raise UnsupportedQuery(
            f"SET dpgate.{stmt.name} is a session option, not a query; pass it to the gateway / cursor."
        )
    return stmt.queries


def compile_statement(
    sql: str,
    schema: Schema | Mapping[str, Any] | str,
    dialect: str = "duckdb",
    params: Sequence[Any] | Mapping[str, Any] | None = None,
) -> CompiledStatement | SetOption:
    """Compile one statement: a SELECT (→ CompiledStatement) or ``SET dpgate.x = v`` (→ SetOption).

    ``params`` binds PEP 249 placeholders (``?`` with a sequence, ``$1`` with a
    sequence, ``:name`` with a mapping); a mismatch raises ``ProgrammingError``.
    """
    if not isinstance(sql, str):
        raise ProgrammingError(f"the SQL must be a string, got {type(sql).__name__}.")
    schema = Schema.load(schema)
    if not sql.strip():
        raise UnsupportedQuery("the SQL text is empty; send one SELECT statement.")
    d = dialect_of(dialect)
    tokens = tokenize(sql, d)
    found = hints(tokens, sql)
    split_check(tokens)
    tree = bind(parse(sql, d), params)
    if isinstance(tree, exp.Set):
        return set_option(tree)
    return compile_tree(tree, schema, dialect, hints=found, sql=sql)


def compile_tree(
    tree: exp.Expression,
    schema: Schema | Mapping[str, Any] | str,
    dialect: str = "duckdb",
    *,
    hints: Mapping[str, str] | None = None,
    sql: str = "",
) -> CompiledStatement:
    """Compile an already parsed (and bound) SELECT tree; the tree is not modified."""
    schema = Schema.load(schema)
    select, agg_nodes = _check_shape(tree)
    table, qualifiers = _table(select, schema)
    ev = Evaluator(table, qualifiers)
    items = select.expressions
    kinds: list[tuple[str, Any]] = []
    for item in items:
        body = item.this if isinstance(item, exp.Alias) else item
        if isinstance(body, exp.Star) or (isinstance(body, exp.Column) and isinstance(body.this, exp.Star)):
            raise UnsupportedQuery(
                "SELECT * would release raw rows; ask for aggregates such as COUNT(*) or SUM(col), "
                "grouped by declared columns if needed."
            )
        inner = _unparen(body)
        if isinstance(inner, exp.Column):
            kinds.append(("column", ev.column(inner)))
        else:
            terms, offset = _linear(inner)
            if not terms:
                raise UnsupportedQuery(
                    f"the output {item.sql()!r} is a constant that aggregates no rows; the SELECT lists no "
                    "aggregate — use COUNT(*) or SUM(...)."
                )
            kinds.append(("aggregate", (terms, offset)))
    group_cols = _group_columns(select, items, kinds, ev)
    for (kind, what), item in zip(kinds, items):
        if kind == "column" and what.name not in [c.name for c in group_cols]:
            raise UnsupportedQuery(
                f"the raw column {item.sql()!r} is not aggregated; dpgate releases only aggregates — use "
                f"COUNT(*) … GROUP BY {what.name} for counts per value."
            )
    aggregates = [what for kind, what in kinds if kind == "aggregate"]
    if not aggregates:
        raise UnsupportedQuery("the SELECT lists no aggregate; add COUNT(*) or SUM(...) to SELECT.")

    # Output names and descriptions.
    outputs, post_items, seen = [], [], set()
    agg_index = 0
    for (kind, what), item in zip(kinds, items):
        body = item.this if isinstance(item, exp.Alias) else item
        if isinstance(item, exp.Alias):
            name = item.alias
        elif kind == "column":
            name = _unparen(body).name
        else:
            name = _output_name(body, dialect)
        base, k = name, 0
        while name.lower() in seen:
            k += 1
            name = f"{base}_{k}"
        seen.add(name.lower())
        if kind == "column":
            idx = [c.name for c in group_cols].index(what.name)
            outputs.append(Output(name, "group", what.name, idx))
            post_items.append((name, body, what.name))
        else:
            outputs.append(Output(name, "aggregate", None, agg_index))
            post_items.append((name, body, None))
            agg_index += 1
    post = _build_post(select, table, qualifiers, post_items, dialect)

    # Phase 1: single-column sub-expressions and breakpoints.
    where = select.args.get("where")
    where_cond = where.this if where is not None else None
    if where_cond is not None:
        _no_aggregates(where_cond, "WHERE", agg_nodes)
        ev.prepare(where_cond)
    for terms, _ in aggregates:
        for _, agg in terms:
            for part in (agg.arg, agg.cond):
                if part is not None:
                    ev.prepare(part)
    for col in group_cols:
        ev.need_unit(col)
    n_groups = math.prod(c.n_cells for c in group_cols)
    if n_groups > MAX_GROUPS:
        raise UnsupportedQuery(
            f"GROUP BY {', '.join(c.name for c in group_cols)} has {n_groups} domain keys, more than the limit "
            f"of {MAX_GROUPS}; group by fewer or coarser (binned) columns."
        )

    # Phase 2: weights per aggregate output on its grid, then one LinearQuery per group.
    per_output = [
        [(q, name) for q in _weights(ev, where_cond, terms, offset, group_cols, table, name)]
        for (terms, offset), name in zip(aggregates, [o.name for o in outputs if o.kind == "aggregate"])
    ]
    queries = [per_output[j][g][0] for g in range(n_groups) for j in range(len(aggregates))]
    keys = tuple(itertools.product(*[c.labels() for c in group_cols])) if group_cols else ((),)
    return CompiledStatement(
        table=table.name,
        queries=tuple(queries),
        group_columns=tuple(c.name for c in group_cols),
        group_keys=keys,
        outputs=tuple(outputs),
        postprocess=post,
        hints=dict(hints or {}),
        sql=sql,
    )


# -- structure checks ------------------------------------------------------------------------------
def _output_name(body: exp.Expression, dialect: str) -> str:
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


def _check_shape(tree: exp.Expression) -> tuple[exp.Select, list[exp.Expression]]:
    """Refuse what is not one plain SELECT; also return its aggregate nodes (breadth-first)."""
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
    aggregates = []
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
    return tree, aggregates


def _table(select: exp.Select, schema: Schema) -> tuple[Table, set[str]]:
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
            f"table functions and non-table sources such as {(name or fn.sql()).upper()!s} are not supported "
            "(dpgate never reads files or URLs named in a query); query a declared table."
        )
    extra = {k for k, v in t.args.items() if v} - {"this", "db", "catalog", "alias"}
    if extra:
        raise UnsupportedQuery(
            f"{t.sql()!r}: {', '.join(sorted(extra)).upper()} on a table is not supported (e.g. TABLESAMPLE); "
            "query the declared table as is."
        )
    if t.args.get("db") and t.db.lower() != "main":
        raise SchemaError(
            f"schema {t.db!r} in {t.sql()!r} is not supported; declared tables live in 'main' (or write the bare name)."
        )
    table = schema.table(t.name)
    alias = t.args.get("alias")
    quals = {table.name.lower()}
    if alias is not None:
        if alias.args.get("columns"):
            raise UnsupportedQuery("column aliases on the table (AS t(a, b)) are not supported; use declared names.")
        quals = {alias.name.lower()}
    return table, quals
