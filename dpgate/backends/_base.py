"""The backend interface and what the SQL backends share (internal).

See :mod:`dpgate.backends` for the interface; this module holds its protocol,
the catalog lookup through ``information_schema`` (DuckDB and PostgreSQL), and
the guard every backend applies before running a statement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from sqlglot import exp

from dpgate.errors import DPGateInternalError, OperationalError, SchemaError

__all__ = ["Backend", "TableBinding", "checked_select", "columns_of", "engine_failure", "information_schema_catalog"]


@dataclass(frozen=True)
class TableBinding:
    """A declared table found in the source: its reference and its columns.

    Attributes:
        ref: the fully qualified table the generated SQL reads.
        columns: lower-cased name → (physical name, engine type name).
    """

    ref: exp.Table
    columns: dict[str, tuple[str, str]] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """What the cube needs from an engine (see :mod:`dpgate.backends`).

    Internal: everything ``run`` returns is exact private data.
    """

    #: sqlglot dialect the generated SQL is written in.
    dialect: str

    def catalog(self, tables: Sequence[str]) -> dict[str, TableBinding]:
        """Lower-cased declared name → its binding, for the declared tables found (metadata only)."""
        ...

    def run(self, select: exp.Select, *, numpy: bool = False) -> Any:
        """Run one generated, read-only SELECT: a list of row tuples, or with ``numpy``
        a mapping of output column name → numpy array."""
        ...

    def row_hash(self, columns: Sequence[exp.Expression]) -> exp.Expression:
        """A 64-bit integer hash of a row's values of ``columns``, computed by the engine."""
        ...

    def close(self) -> None:
        """Release what the backend opened (never a caller-owned connection)."""
        ...


def checked_select(select: exp.Expression, dialect: str) -> str:
    """The SQL text of a generated statement, after checking it can only read.

    Every statement dpgate runs on data is a sqlglot ``SELECT`` built from the schema;
    anything else (a DML/DDL node, a ``SELECT … INTO``, a locking clause) is an
    internal error and never reaches the engine.  The tree is built for this one statement
    (the cube copies every shared piece into it), so it is written out in place, not copied.
    """
    if not isinstance(select, exp.Select) or select.args.get("into") or select.args.get("locks"):
        raise DPGateInternalError(f"refusing to run a non-SELECT statement ({type(select).__name__}) on the data")
    for node in select.walk():
        if isinstance(node, (exp.DML, exp.DDL, exp.Command, exp.Into, exp.Lock)):
            raise DPGateInternalError(f"refusing to run a statement containing {type(node).__name__} on the data")
    return select.sql(dialect=dialect, copy=False)


#: Classes of engine failure: (what failed, what the data owner should check).  The message of
#: each is fixed, so it says nothing about the rows the statement read.
_FAILURES = {
    "timeout": ("the statement was canceled by the statement timeout or an interruption",
                "the engine's load, or raise the statement timeout"),
    "read-only": ("a write in a read-only transaction", "dpgate's SQL (a write is a bug in dpgate)"),
    "data": ("a stored value could not be read as its column's type",
             "that the declared columns hold values of their declared types, and that the files behind "
             "the tables (a CSV or Parquet file, a view) have not changed since the gateway opened them"),
    "source": ("the engine refused a statement on the declared tables",
               "that the declared tables and columns exist with the types the schema expects, "
               "and that dpgate's account may read them"),
    "connection": ("the data source is unreachable or its files unreadable",
                   "the connection, the database server and the files behind the declared tables"),
    "resources": ("the engine ran out of resources", "its memory, disk and connection limits"),
    "internal": ("the engine failed", "the engine's own log"),
}
#: The SQLSTATE ``dpgate serve`` sends for each class of failure (PostgreSQL's codes for the same
#: conditions: query_canceled, read_only_sql_transaction, data_exception, system_error,
#: connection_failure, insufficient_resources).
FAILURE_SQLSTATES = {"timeout": "57014", "read-only": "25006", "data": "22000", "source": "58000",
                     "connection": "08006", "resources": "53000", "internal": "58000"}
_ENGINE_NAMES = {"postgres": "PostgreSQL", "duckdb": "DuckDB", "spark": "Spark"}
#: SQLSTATE (PostgreSQL, Spark) or its two-character class → class of failure.
_SQLSTATE_FAILURES = {"57014": "timeout", "25006": "read-only", "22": "data", "42": "source", "3D": "source",
                      "3F": "source", "08": "connection", "58": "connection", "53": "resources", "54": "resources"}
#: Exception class names (DuckDB's, Java's through PySpark) → class of failure.
_NAME_FAILURES = {
    "InterruptException": "timeout", "QueryCanceledException": "timeout", "ConversionException": "data",
    "OutOfRangeException": "data", "TypeMismatchException": "data", "InvalidInputException": "data",
    "NumberFormatException": "data", "ArithmeticException": "data", "DateTimeException": "data",
    "CatalogException": "source", "BinderException": "source", "PermissionException": "source",
    "ParserException": "source", "AnalysisException": "source", "IOException": "connection",
    "HTTPException": "connection", "ConnectionException": "connection", "OutOfMemoryException": "resources",
    # Drivers' errors without a SQLSTATE (a lost connection, a stopped Spark session).
    "OperationalError": "connection", "InterfaceError": "connection", "Py4JNetworkError": "connection",
}


def _failure_class(exc: BaseException) -> str:
    code = getattr(exc, "sqlstate", None)  # psycopg
    if code is None and exc.args and isinstance(exc.args[0], dict):  # pg8000
        code = exc.args[0].get("C")
    if code is None and callable(getattr(exc, "getSqlState", None)):  # PySpark
        try:
            code = exc.getSqlState()  # type: ignore[attr-defined]
        except Exception:  # a failed JVM call names nothing
            code = None
    code = str(code or "")
    found = _SQLSTATE_FAILURES.get(code) or _SQLSTATE_FAILURES.get(code[:2])
    if found:
        return found
    for cls in type(exc).__mro__:
        if cls.__name__ in _NAME_FAILURES:
            return _NAME_FAILURES[cls.__name__]
    return "internal"


def engine_failure(engine: str, exc: BaseException) -> OperationalError:
    """The error for a statement the engine refused: the class of failure and what the data
    owner should check, in a fixed message.  The engine's own message is withheld — from the
    analyst and from dpgate's logs: it can quote row values (``"1e400" is out of range …``,
    a CSV file's line), and which statement failed can depend on rows.  The engine's own log
    (PostgreSQL, Spark) has the rest; raise it ``from None`` so no traceback carries it."""
    failure = _failure_class(exc)
    what, check = _FAILURES[failure]
    engine = _ENGINE_NAMES.get(engine, engine)
    err = OperationalError(f"the {engine} data source failed: {what}; the data owner should check {check}. "
                           "(The engine's message is withheld: it may quote row values.)")
    err.sqlstate = FAILURE_SQLSTATES[failure]  # for dpgate serve: the class of failure, never the engine's code
    return err


def columns_of(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
    """Fetched rows as ``{column name: numpy array}`` (``fetchnumpy`` for DB-API results)."""
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    return {str(n).lower(): np.asarray(c) for n, c in zip(names, cols, strict=True)}


def information_schema_catalog(
    describe: Callable[[exp.Expression], list[tuple[Any, ...]]], tables: Sequence[str]
) -> dict[str, TableBinding]:
    """Find ``tables`` through the SQL-standard ``information_schema`` (metadata only).

    A name found in several schemas resolves to the one in the current database and
    schema (or DuckDB's ``temp``), else it is ambiguous.  ``describe`` runs a
    metadata statement and returns its rows.

    Raises:
        SchemaError: a name is ambiguous.
    """
    names = [t.lower() for t in tables]
    try:
        cur = tuple(describe(exp.select(exp.func("current_database"), exp.func("current_schema")))[0])
    except Exception:  # an engine without these functions (Trino): a name in several schemas is ambiguous
        cur = ()
    q = (
        exp.select("table_catalog", "table_schema", "table_name", "column_name", "data_type")
        .from_(exp.Table(this=exp.to_identifier("columns"), db=exp.to_identifier("information_schema")))
        .where(exp.In(this=exp.func("lower", exp.column("table_name")), expressions=[exp.Literal.string(n) for n in names]))
    )
    found: dict[str, dict[tuple[str, str, str], dict[str, tuple[str, str]]]] = {}
    for cat, sch, tab, col, typ in describe(q):
        found.setdefault(tab.lower(), {}).setdefault((cat, sch, tab), {})[col.lower()] = (col, str(typ))
    out: dict[str, TableBinding] = {}
    for table in tables:
        name = table.lower()
        cands = found.get(name, {})
        if not cands:
            continue
        if len(cands) > 1:
            pref = [k for k in cands if (k[0], k[1]) == cur] or [k for k in cands if k[0] == "temp"]
            if len(pref) != 1:
                raise SchemaError(
                    f"table {table!r} is ambiguous in the data source: found "
                    f"{['.'.join(k) for k in sorted(cands)]}; keep one or rename."
                )
            key = pref[0]
        else:
            key = next(iter(cands))
        ref = exp.Table(
            this=exp.to_identifier(key[2], quoted=True),
            db=exp.to_identifier(key[1], quoted=True),
            catalog=exp.to_identifier(key[0], quoted=True),
        )
        out[name] = TableBinding(ref, cands[key])
    return out
