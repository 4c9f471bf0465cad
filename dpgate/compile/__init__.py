"""Compile SQL counting queries to :class:`~dpgate.compile.query.LinearQuery` objects.

The package's modules are the compiler's stages: :mod:`~dpgate.compile.statement`
(tokens, hints, SET, parameters, parse) with :mod:`~dpgate.compile.placeholders` (client
placeholder styles rewritten on tokens), :mod:`~dpgate.compile.stages` (the
:data:`~dpgate.compile.stages.STAGES` tuple that :func:`compile_tree` runs),
:mod:`~dpgate.compile.aggregates` (SELECT items → linear combinations, GROUP BY,
weights), :mod:`~dpgate.compile.evaluate` and :mod:`~dpgate.compile.nodes`
(row-level expressions on cells, one handler per node type),
:mod:`~dpgate.compile.cells` (values, constants, bins),
:mod:`~dpgate.compile.post` (ORDER BY / LIMIT / HAVING on released rows) and
:mod:`~dpgate.compile.bounds` (numbers, parameters and messages bounded on their text, first);
:mod:`~dpgate.compile.query` holds the result, with :mod:`~dpgate.compile._runs` (its compact
ledger JSON), :mod:`~dpgate.compile._wide` (helpers that keep 500 000-cell columns cheap) and
:mod:`~dpgate.compile._padded` (a wide GROUP BY's group queries held as their groups' blocks).

The compiler reads SQL with sqlglot (DuckDB dialect by default) and turns each
output column of each group into a linear query ``θ = Σ_cells w(cell)·count(cell) + c``
over one declared table.  It never runs the SQL and needs no database: the
weights are computed from the public schema alone.

Supported SQL
=============

One ``SELECT`` from one declared table (``pums``, ``main.pums``, ``"PUMS"``, or
``PUMS.pums`` when the table declares ``schema: PUMS``; names are
case-insensitive, quoted or not) — or from a join along declared paths
(:mod:`dpgate.compile._join`: compiled as one table) — whose output columns are

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
* the ``GROUP BY`` columns themselves (aliases allowed);
* ``AVG``, ``VAR``/``VAR_SAMP``/``VARIANCE``, ``VAR_POP``, ``STDDEV``/``STDDEV_SAMP``,
  ``STDDEV_POP`` of a cell expression as whole output columns (with FILTER too):
  compiled into their ``COUNT``/``SUM``/``SUM(x*x)`` components
  (:mod:`dpgate.compile.derived`; answered by :mod:`dpgate.answer.combine`).

Dates and timestamps (``DATE '…'``, ISO strings, ``EXTRACT``, ``date_trunc``, also in ``GROUP BY``):
:mod:`dpgate.compile._dates` and :mod:`dpgate.compile._time_groups`.

``WHERE`` / ``FILTER`` conditions may use ``= <> != < <= > >=`` (constants on
either side), ``BETWEEN``, ``IN (…)``, ``NOT``, ``AND``, ``OR``, ``IS [NOT] NULL``,
``IS [NOT] TRUE/FALSE``, ``LIKE`` / ``ILIKE`` / ``NOT LIKE`` (with ``ESCAPE``) on
categorical columns, and boolean columns as conditions (``WHERE married``,
``married = true``, ``married = 1``).  A string constant takes the type of what it
is compared with (``educ = '8'`` is ``educ = 8``, ``married = 'true'`` is
``married``), as a number takes a categorical's (``sex = 1`` is ``sex = '1'``);
a string that is not a number / boolean is refused naming the column's type.

``GROUP BY`` takes declared columns by name, alias or position (and ``GROUP BY
ALL``) and returns one row per *declared* key (:meth:`Column.group_cells`: the
declared values, then ``<other>`` when the column declares ``other: true``, then
NULL when it declares ``nullable: true``), in row-major order over the columns as
written — keys never come from the data, empty groups included, except the keys
the WHERE clause cannot reach on any cell (decided from the query and the schema:
``WHERE age < 3 GROUP BY age`` has the groups 0, 1, 2).  A SELECT of GROUP BY
columns alone (``SELECT educ FROM pums GROUP BY educ``) lists those keys: no
aggregate, nothing to measure.  ``HAVING``, ``ORDER BY``,
``LIMIT`` and ``OFFSET`` are post-processing of the released noisy rows (see
:meth:`CompiledStatement.apply_postprocessing`).  Parameters (``?``, ``$1``,
``:name``, psycopg's ``%s`` and ``%(name)s``) are bound as literal nodes, and a ``/*+ dpgate accuracy=25
confidence=0.95 */`` comment anywhere in the text (keys: accuracy, confidence,
method, allow_partial) is returned as hints.  ``SET dpgate.accuracy = 25``,
``SET dpgate.confidence = 0.95``, ``SET dpgate.intervals = on|off`` (also
``method``, ``allow_partial``, ``round``) compile to a :class:`SetOption`.

Semantics of cells, NULL, ``other`` and clamping
================================================

Queries are evaluated on a row's *cell* (see :mod:`dpgate.schema.domains`), i.e. on its
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
* Rows whose value is NULL or undeclared in a column that does not declare
  ``nullable`` / ``other`` keep their cells: every predicate that matches them
  counts them (``COUNT(*)``, ``sex IS NULL``, ``sex <> '1'``), and so does a
  ``GROUP BY`` on other columns; only ``GROUP BY`` on that column has no group
  for them.
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
MIN/MAX/MEDIAN and other aggregates, arithmetic on AVG/VAR/STDDEV, DISTINCT, joins, subqueries,
CTEs, set operations, window functions, table functions, non-SELECT statements,
several statements, undeclared tables and columns (``SchemaError``), GROUP BY
expressions, non-constant LIMIT/OFFSET, ``SELECT`` without ``FROM``.  Parse
errors raise :class:`~dpgate.errors.QuerySyntaxError` with line and column.

Example:
    >>> schema = {"tables": {"pums": {"columns": {
    ...     "age": {"type": "integer", "min": 0, "max": 100},
    ...     "sex": {"type": "categorical", "values": ["0", "1"], "other": True}}}}}
    >>> (q,) = compile_sql("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", schema)
    >>> q == compile_sql("SELECT COUNT(*) FROM pums WHERE age >= 20 AND age < 30", schema)[0]
    True
    >>> q.sensitivity
    1.0
    >>> qs = compile_sql("SELECT sex, 2*COUNT(*) - 10 AS n FROM pums GROUP BY sex", schema)
    >>> [(dict(q.group)["sex"], q.label, q.sensitivity, q.offset) for q in qs]
    [('0', 'n', 2.0, Fraction(-10, 1)), ('1', 'n', 2.0, Fraction(-10, 1)), ('<other>', 'n', 2.0, Fraction(-10, 1))]
    >>> [k for (k,) in compile_statement("SELECT age FROM pums WHERE age < 3 GROUP BY age", schema).group_keys]
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpgate.compile._join import rewrite_joins
from dpgate.compile._time_groups import (
    check_merged_size,
    coarse_schema,
    fine_queries,
    merge_time_groups,
    rewrite_time_groups,
)
from dpgate.compile.bounds import MAX_MESSAGE, bounded_message, too_many_outputs
from dpgate.compile.derived import compile_derived, has_derived
from dpgate.compile.placeholders import placeholders
from dpgate.compile.post import PostProcess
from dpgate.compile.query import LinearQuery
from dpgate.compile.stages import MAX_GROUPS, STAGES, CompiledStatement, Output, compile_tree
from dpgate.compile.statement import (
    HINT_KEYS,
    METHOD_VALUES,
    MODEL_METHODS,
    SET_OPTIONS,
    SetOption,
    bind,
    check_complexity,
    check_length,
    dialect_of,
    hints,
    parse,
    set_option,
    split_check,
    tokenize,
)
from dpgate.errors import (
    DPGateInternalError,
    Error,
    InvalidArgumentType,
    QuerySyntaxError,
    QueryTooComplex,
    UnsupportedQuery,
    map_exceptions,
)
from dpgate.schema.domains import Schema

__all__ = [
    "compile_sql",
    "compile_statement",
    "compile_tree",
    "CompiledStatement",
    "Output",
    "PostProcess",
    "SetOption",
    "STAGES",
    "HINT_KEYS",
    "SET_OPTIONS",
    "METHOD_VALUES",
    "MODEL_METHODS",
    "MAX_GROUPS",
]


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
    *,
    max_outputs: int | None = None,
) -> CompiledStatement | SetOption:
    """Compile one statement: a SELECT (→ CompiledStatement) or ``SET dpgate.x = v`` (→ SetOption).

    ``params`` binds PEP 249 placeholders (``?``, ``$1`` and psycopg's ``%s`` with a
    sequence, ``:name`` and ``%(name)s`` with a mapping) as literal nodes of the parsed
    tree, never as SQL text; a mismatch raises ``ProgrammingError``, an unknown style
    (``%d``, ``@name``) ``QuerySyntaxError`` naming the accepted ones.

    ``max_outputs``: refuse (``QueryTooComplex``) a SELECT of more outputs (groups ×
    aggregates) before its groups are weighed — unless a hint routes it to a model-based
    method (``/*+ dpgate method=pca */``: those estimates are not bound by the limit).
    """
    try:
        return _compile_statement(sql, schema, dialect, params, max_outputs)
    except Error as exc:  # refusals quote SQL and parameters: bounded, however long the statement or its values
        if len(message := str(exc)) > MAX_MESSAGE:
            exc.args = (bounded_message(message), *exc.args[1:])
        raise


def _compile_statement(
    sql: str,
    schema: Schema | Mapping[str, Any] | str,
    dialect: str,
    params: Sequence[Any] | Mapping[str, Any] | None,
    max_outputs: int | None,
) -> CompiledStatement | SetOption:
    if not isinstance(sql, str):
        raise InvalidArgumentType(f"the SQL must be a string, got {type(sql).__name__}.")
    schema = Schema.load(schema)
    if not sql.strip():
        raise UnsupportedQuery("the SQL text is empty; send one SELECT statement.")
    check_length(sql)
    d = dialect_of(dialect)
    # The limits are checked on the tokens before the parser recurses; the mapping
    # is the last line of defence, so that no exception of sqlglot (nor a recursion
    # error from a shape the limits did not foresee) reaches the caller.
    with map_exceptions(_SQLGLOT_FAILURES, _sqlglot_failure):
        text, tokens = placeholders(sql, tokenize(sql, d), d)
        check_complexity(tokens)
        found = hints(tokens, text)
        split_check(tokens)
        tree = bind(parse(text, d), params)
    if isinstance(tree, exp.Set):
        return set_option(tree)
    # Past the parser, a plain ValueError/TypeError/KeyError/AttributeError is a
    # dpgate bug, not a refusal: say so rather than blame the user's SQL.
    limit = max_outputs if str(found.get("method", "exact")).lower() == "exact" else None
    with map_exceptions(_COMPILER_FAILURES, _sqlglot_failure):
        tree = rewrite_joins(tree, schema, dialect)  # a declared join: one SELECT over the table it makes
        regroup = rewrite_time_groups(tree)  # GROUP BY date_trunc(…) / EXTRACT(…): merged granules
        if regroup and isinstance(tree, exp.Select) and (coarse := coarse_schema(tree, regroup, schema)):
            try:
                if has_derived(tree):
                    stmt = compile_derived(tree.copy(), coarse[0], dialect, hints=found, sql=sql, max_outputs=limit)
                else:
                    stmt = compile_tree(tree.copy(), coarse[0], dialect, hints=found, sql=sql, max_outputs=limit)
                return fine_queries(stmt, coarse[0], coarse[1])
            except QueryTooComplex:
                raise
            except UnsupportedQuery:  # e.g. a literal off the coarse cells' boundaries: per granule, merged
                pass
        if regroup:
            check_merged_size(tree, regroup, schema, MAX_GROUPS)
        inner = None if regroup else limit  # the limit is on the merged groups
        if isinstance(tree, exp.Select) and has_derived(tree):
            stmt = compile_derived(tree, schema, dialect, hints=found, sql=sql, max_outputs=inner)
        else:
            stmt = compile_tree(tree, schema, dialect, hints=found, sql=sql, max_outputs=inner)
        if not regroup:
            return stmt
        stmt = merge_time_groups(stmt, regroup, schema)
        if limit is not None and len(stmt.queries) > limit:
            raise too_many_outputs(len(stmt.queries), limit)
        return stmt


# sqlglot raises its own errors, and plain ValueError / TypeError / KeyError /
# AttributeError (e.g. "Unsupported expression type Final" when a dialect-specific
# node is rendered), and Python a RecursionError on a tree deeper than the limits foresee.
_SQLGLOT_FAILURES: dict[type[BaseException], type[UnsupportedQuery]] = {
    RecursionError: QueryTooComplex,
    SqlglotError: QuerySyntaxError,
    ValueError: UnsupportedQuery,
    TypeError: UnsupportedQuery,
    KeyError: UnsupportedQuery,
    AttributeError: UnsupportedQuery,
}
_COMPILER_FAILURES: dict[type[BaseException], type[Error]] = {
    RecursionError: QueryTooComplex,
    SqlglotError: UnsupportedQuery,
    ValueError: DPGateInternalError,
    TypeError: DPGateInternalError,
    KeyError: DPGateInternalError,
    AttributeError: DPGateInternalError,
}


def _sqlglot_failure(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return (
            "the SQL text is nested too deeply for the parser (Python's recursion limit was reached); "
            "remove redundant parentheses, NOTs or nested CASEs, or split the query."
        )
    if isinstance(exc, SqlglotError):
        return f"SQL syntax error: {str(exc)[:300]}. Check the statement's syntax."
    return (
        f"dpgate cannot compile this SQL ({type(exc).__name__}: {str(exc)[:300]}); it uses a construct the "
        "compiler does not support — write one SELECT of COUNT/SUM over one declared table."
    )
