"""PEP 249 (DB-API 2.0) driver: ``dpgate.connect(...)`` in front of a :class:`~dpgate.Gateway`.

(Over 500 lines on purpose: about 130 are this docstring, which records every
decision PEP 249 leaves open; the rest is ``connect``, ``Connection`` and
``Cursor``, which are each other's only users — a cursor runs its statements
through its connection's session.  Type objects and result-set rows live in
``dpgate._dbapi_rows``.)

Any DB-API client — ``pandas.read_sql_query``, a notebook, a BI tool's Python
bridge — can ask dpgate counting queries as if it were a read-only database::

    >>> import dpgate.datasets
    >>> from dpgate.dbapi import connect
    >>> df, schema = dpgate.datasets.load_pums()
    >>> con = connect(df, schema=schema, budget=1.0, accuracy=25, seed=0)
    >>> cur = con.cursor()
    >>> cur.execute("SELECT sex, COUNT(*) AS n FROM pums WHERE sex IN ('0', '1') GROUP BY sex").description[0][:2]
    ('sex', 'VARCHAR')
    >>> [(sex, round(n, -2)) for sex, n in cur.fetchall()][:2]
    [('0', 500.0), ('1', 500.0)]
    >>> cur.answers[0].source, cur.answers[0].high - cur.answers[0].value <= 25
    ('fresh', True)
    >>> con.close()

Rows look like a normal database's: one column per SELECT item, one row per
*declared* GROUP BY key (empty groups included; NULL / ``<other>`` only where the
schema declares them; keys the WHERE clause cannot reach left out), HAVING / ORDER BY /
LIMIT applied to the released rows.  Keys are Python ``int`` / ``bool`` / ``str`` as
their column.  Values are the released (noisy) estimates as ``float`` (``int`` with
``SET dpgate.round = on``); an answer that could not be released (``allow_partial``)
is NULL.  ``SELECT k FROM t GROUP BY k`` returns the declared keys, free.

Accuracy and confidence
=======================

dpgate needs, for every statement, the half-width ``accuracy`` of the interval
you want and its ``confidence`` (default 0.95).  Three levels, the most specific
wins — **statement hint > session SET > connection argument**:

* per connection: ``connect(..., accuracy=25, confidence=0.95)``;
* per session (this connection, until changed): ``SET dpgate.accuracy = 25``,
  ``SET dpgate.confidence = 0.9``, ``SET dpgate.intervals = on``,
  ``SET dpgate.allow_partial = on``, ``SET dpgate.round = on`` (integer counts,
  :meth:`dpgate.Result.rounded`);
* per statement: a comment hint anywhere in the text,
  ``SELECT /*+ dpgate accuracy=10 confidence=0.99 */ COUNT(*) FROM pums``.

``method`` (same three levels; default ``exact``) switches to free, *biased*
model-based estimates (:meth:`dpgate.Gateway.estimate`): ``SET dpgate.method =
pca`` or ``maxent`` (Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers
for Improving Data Utility under Differential Privacy", EDBT 2016), or
``/*+ dpgate method=mmse */`` (the MMSE of Xiao, Xiong & Yuan, "ISPE: Adaptive
Differentially Private Data Release and Query Estimation", Emory TR-2011-005,
2011, §4, over an ISPE warm start of the connection's gateway).  Their rows carry
``source = 'model'`` and a heuristic band, never a guaranteed interval; no
accuracy is needed and nothing is spent or recorded in the ledger.

With no accuracy at any level, ``execute`` raises
:class:`~dpgate.errors.InvalidRequirement` (a ``DataError``) saying how to set
one; nothing is read and nothing is spent.

Quotes: EXPLAIN
===============

``EXPLAIN SELECT …`` runs nothing and spends nothing: it returns the quote of
:meth:`dpgate.Gateway.explain` as rows, one per (group, output), with columns
``output, group, source, epsilon, halfwidth, confidence, remaining, note``
(``source`` ``'history'`` = free, ``'fresh'`` = paid; ``remaining`` = the budget
left after that output).  The requirement is resolved as for the SELECT itself,
and the next identical SELECT charges exactly the quoted ``epsilon``.

Intervals
=========

``SET dpgate.intervals = on`` adds, after every aggregate column ``c``, the
columns ``c_low``, ``c_high`` (the ``confidence`` interval) and ``c_source``
(``'history'``: answered free from earlier releases; ``'fresh'``: a new noisy
measurement was paid for; ``'exact'``: a public constant; ``'unavailable'``).
Whatever the setting, :attr:`Cursor.answers` holds the
:class:`~dpgate.result.Answer` objects of the returned rows and
:attr:`Cursor.result` the whole :class:`~dpgate.result.Result`.

Decisions where PEP 249 leaves a choice
=======================================

* **Read-only, SELECT-only.** ``INSERT``, ``CREATE``, ``DROP``, ``COPY``,
  ``ATTACH``, several statements … raise :class:`~dpgate.errors.UnsupportedQuery`
  (a ``NotSupportedError`` and ``ProgrammingError``) before anything is read.
  The user's SQL is never executed against the data.
* **Parameters** (``paramstyle = "qmark"``; PEP 249 allows one value): ``?`` with a
  sequence; ``$1`` and psycopg's ``%s`` with a sequence, ``:name`` and ``%(name)s``
  with a mapping also work, so code written for psycopg or sqlite3 runs unchanged.
  Values are bound as sqlglot literal nodes (never pasted into SQL text), so
  ``"1; DROP TABLE pums"`` is just a string literal, compared with a column as SQL
  would (``educ = ?`` with ``'8'`` is ``educ = 8``).  Another style (``%d``,
  ``@name``) raises ``QuerySyntaxError`` naming the accepted ones.  Accepted value
  types: None, bool, int, float, Decimal, Fraction, str.
* **commit()** is a no-op: every release is already committed — written durably to
  the ledger *before* the answer is returned — and nothing else is ever written.
* **rollback()** raises ``NotSupportedError`` (PEP 249 allows this): a released
  answer and the budget it cost cannot be taken back.
* **Context manager**: ``with connect(...) as con:`` closes the connection on exit
  (like duckdb and psycopg 3; there is no transaction to commit or roll back).
* **Closed objects**: any operation on a closed cursor or on a cursor or
  connection whose connection is closed raises ``InterfaceError``; closing twice is
  allowed.  Fetching before any ``execute`` or after a ``SET`` raises
  ``ProgrammingError``.
* **rowcount** is the number of rows of the current result set (known up front),
  and -1 before any execute and after ``SET``.
* **executemany** runs the statement once per parameter set (each is a separate
  query, answered or charged on its own) and keeps one result set per run: the
  cursor starts on the first; :meth:`Cursor.nextset` moves on.  If a run fails,
  runs before it stay released and charged (there is no rollback), and the error
  propagates.
* **BudgetExhausted** is an ``OperationalError`` (the database cannot perform the
  operation in its current state; retrying does not help until the budget
  changes).  Its ``needed``, ``remaining`` and ``estimate`` attributes say what the
  query would cost, what is left, and what history alone gives.  With
  ``SET dpgate.allow_partial = on`` the query instead returns history's best
  estimates, NULL where history knows nothing.
* **threadsafety = 2**: threads may share the module and connections, not
  cursors.  The gateway serialises decisions under a lock and its ledger
  serialises writers (also across processes), so concurrent queries never
  overspend; a connection's session settings (``SET``) are shared by every
  thread using that connection, as in any database session.
"""

from __future__ import annotations

import numbers
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from dpgate._dbapi_rows import (
    BINARY,
    DATETIME,
    NO_ROWS,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    ResultSet,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    explain_set,
    result_set,
)
from dpgate.compile import CompiledStatement, SetOption, compile_statement
from dpgate.decide import check_policy
from dpgate.errors import (
    BudgetExhausted,
    DatabaseError,
    DataError,
    DPGateInternalError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    InvalidArgument,
    InvalidArgumentType,
    InvalidRequirement,
    LedgerError,
    NotEstimable,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    QuerySyntaxError,
    QueryTooComplex,
    SchemaError,
    UnsupportedQuery,
    Warning,
)
from dpgate.explain import Explanation, strip_explain
from dpgate.gateway import DEFAULT_MAX_OUTPUTS, Gateway
from dpgate.requirement import Requirement, hinted, resolve_accuracy, resolve_confidence, resolve_requirement
from dpgate.result import Answer, Result
from dpgate.state import DEFAULT_MAX_ATOMS

__all__ = [
    "apilevel",
    "threadsafety",
    "paramstyle",
    "connect",
    "Connection",
    "Cursor",
    "Date",
    "Time",
    "Timestamp",
    "DateFromTicks",
    "TimeFromTicks",
    "TimestampFromTicks",
    "Binary",
    "STRING",
    "BINARY",
    "NUMBER",
    "DATETIME",
    "ROWID",
    # PEP 249: the exception classes are module attributes (every class of dpgate.errors;
    # tests/test_dbapi20.py checks that none is missing).
    "Warning",
    "Error",
    "InterfaceError",
    "DatabaseError",
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
    "InvalidArgument",
    "InvalidArgumentType",
    "SchemaError",
    "UnsupportedQuery",
    "QuerySyntaxError",
    "QueryTooComplex",
    "BudgetExhausted",
    "LedgerError",
    "InvalidRequirement",
    "NotEstimable",
    "DPGateInternalError",
]

#: PEP 249: the DB-API level supported.
apilevel = "2.0"
#: PEP 249: threads may share the module and connections, but not cursors (see module docs).
threadsafety = 2
#: PEP 249: question-mark placeholders (``WHERE age < ?``); ``$1``, ``:name``, ``%s`` and
#: ``%(name)s`` also work (PEP 249 lets a module name only one style).
paramstyle = "qmark"


# -- connect ---------------------------------------------------------------------------------------
def connect(
    database: Any,
    *,
    schema: Any = None,
    budget: float | None = None,
    ledger: Any = None,
    ledger_key: Any = None,
    new_ledger: bool = False,
    accuracy: float | None = None,
    confidence: float = 0.95,
    intervals: bool = False,
    allow_partial: bool = False,
    round: bool = False,  # noqa: A002 - the name Gateway.query uses
    policy: str | None = None,
    seed: int | None = None,
    dialect: str = "duckdb",
    max_atoms: int | None = None,
    max_outputs: int | None = None,
) -> Connection:
    """Open a DB-API connection that answers counting queries with differential privacy.

    Args:
        database: a DuckDB database file path (opened **read-only**; never modified),
            a ``duckdb`` connection, a pandas DataFrame (one-table schema), a dict
            ``{table: DataFrame}``, a PostgreSQL ``postgresql://`` URL / SQLAlchemy engine /
            DB-API connection, a Spark DataFrame or ``(SparkSession, table)`` (see
            ``dpgate.backends``), or an existing :class:`~dpgate.Gateway` (then
            ``schema``, ``budget``, ``ledger``, ``policy`` and ``seed`` must be omitted;
            closing the connection does not close that gateway).
        schema: the public domain: a ``dpgate.Schema``, a dict or a YAML path. Required.
        budget: total privacy budget ε (default 1.0); must equal a ledger's stored budget.
        ledger: ``None`` (in memory, lost at exit), a path (durable SQLite ledger,
            shared safely by processes), a ``postgresql://`` URL (shared by gateways on
            several hosts; needs ``ledger_key``) or an open ``dpgate.ledger.Ledger``.
        ledger_key: the secret binding the ledger to its data (bytes or a key file path);
            default: ``<ledger>.key``, created owner-only with the ledger.
        new_ledger: start a new ledger although the key store shows one existed (after
            an operator deliberately archived or deleted it).
        accuracy: default half-width of every answer's interval (connection level).
        confidence: default confidence 1−δ (connection level), in [0.5, 1).
        intervals: start with ``SET dpgate.intervals = on``.
        allow_partial: start with ``SET dpgate.allow_partial = on``.
        round: start with ``SET dpgate.round = on`` (integers for counts).
        policy: ``"minimal"`` (default), ``"paper"`` or ``"no_reuse"``.
        seed: reproducible, **insecure** noise for tests (recorded as such in the ledger).
        dialect: sqlglot dialect of incoming SQL.
        max_atoms: the most atoms a table's history may split its domain into (see
            :class:`~dpgate.Gateway`; default 200 000); finer queries are answered on their own.
        max_outputs: the most outputs one statement may have (default 4 096); larger
            statements raise ``QueryTooComplex`` before any data is read.

    Raises:
        OperationalError: the database file cannot be opened.
        SchemaError: the schema is invalid or the data lack a declared table or column.
        LedgerError: the ledger is bound to other data, another schema or budget.
        InvalidRequirement: bad budget, accuracy or confidence.
    """
    if isinstance(database, Gateway):
        given = [n for n, v in (("schema", schema), ("budget", budget), ("ledger", ledger),
                                ("ledger_key", ledger_key), ("policy", policy), ("seed", seed),
                                ("max_atoms", max_atoms), ("max_outputs", max_outputs)) if v is not None]
        given += ["new_ledger"] if new_ledger else []
        if given:
            raise InterfaceError(
                f"connect() got an existing Gateway and also {', '.join(given)}; those are the gateway's "
                "own settings — pass them to dpgate.Gateway(...) instead."
            )
        gateway, owns = database, False
    else:
        if schema is None:
            raise InterfaceError(
                "connect() needs schema= (a dpgate.Schema, a dict or a YAML path declaring each table's public "
                "domain); dpgate never reads domains from the private data."
            )
        _check_database(database)
        try:
            gateway = Gateway(
                database,
                schema,
                budget=1.0 if budget is None else budget,
                ledger=ledger,
                ledger_key=ledger_key,
                new_ledger=new_ledger,
                policy=check_policy(policy or "minimal"),
                seed=seed,
                dialect=dialect,
                max_atoms=DEFAULT_MAX_ATOMS if max_atoms is None else max_atoms,
                max_outputs=DEFAULT_MAX_OUTPUTS if max_outputs is None else max_outputs,
            )
        except TypeError as exc:
            raise InterfaceError(str(exc)) from None
        owns = True
    # Checked now, by the resolver every statement uses, so that a bad argument fails at connect().
    settings = {
        "accuracy": resolve_accuracy({"accuracy": accuracy}),
        "confidence": resolve_confidence({"confidence": confidence}),
        "intervals": _check_flag("intervals", intervals),
        "allow_partial": _check_flag("allow_partial", allow_partial),
        "round": _check_flag("round", round),
        "method": None,
    }
    return Connection(gateway, settings, owns_gateway=owns)


def _check_database(database: Any) -> None:
    import duckdb
    import pandas as pd

    from dpgate.backends import is_external

    if is_external(database):  # PostgreSQL, Spark or a custom backend
        return
    if isinstance(database, (str, os.PathLike, duckdb.DuckDBPyConnection, pd.DataFrame, Mapping)):
        if isinstance(database, (str, os.PathLike)) and os.fspath(database) in ("", ":memory:"):
            raise InterfaceError(
                "an in-memory DuckDB path holds no data; pass a database file, a duckdb connection or DataFrames."
            )
        return
    raise InterfaceError(
        "database must be a DuckDB file path, a duckdb connection, a pandas DataFrame, a dict of DataFrames, "
        "a PostgreSQL URL/engine/connection, a Spark DataFrame or (SparkSession, table), or a dpgate.Gateway, "
        f"got {type(database).__name__}."
    )


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequirement(f"{name} must be True or False, got {value!r}.")
    return value


# -- Connection --------------------------------------------------------------------------------------
class Connection:
    """A PEP 249 connection: one session of SQL over a :class:`~dpgate.Gateway`.

    Create with :func:`connect`.  Beyond PEP 249 it offers :meth:`execute`
    (sqlite3-style shortcut), :attr:`gateway`, :attr:`settings`, and the budget
    views :attr:`budget`, :attr:`spent`, :attr:`remaining` and :attr:`history`.
    The PEP 249 exception classes are attributes (``con.Error``, ``con.OperationalError`` …).
    """

    Warning = Warning
    Error = Error
    InterfaceError = InterfaceError
    DatabaseError = DatabaseError
    DataError = DataError
    OperationalError = OperationalError
    IntegrityError = IntegrityError
    InternalError = InternalError
    ProgrammingError = ProgrammingError
    NotSupportedError = NotSupportedError

    def __init__(self, gateway: Gateway, settings: dict[str, Any], *, owns_gateway: bool) -> None:
        self._gateway = gateway
        self._owns = owns_gateway
        self._settings = dict(settings)
        self._closed = False
        self._lock = threading.Lock()

    # -- PEP 249 ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (and the gateway it opened); later operations raise InterfaceError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._owns:
            self._gateway.close()

    def commit(self) -> None:
        """No-op: every release was committed to the ledger before its answer was returned."""
        self._check_open()

    def rollback(self) -> None:
        """Always raises ``NotSupportedError``: released answers and spent budget cannot be undone."""
        self._check_open()
        raise NotSupportedError(
            "rollback is not supported: dpgate is read-only, and every answer it returned was recorded in the "
            "ledger first — a release and the privacy budget it cost cannot be taken back."
        )

    def cursor(self) -> Cursor:
        """A new cursor on this connection."""
        self._check_open()
        return Cursor(self)

    def __enter__(self) -> Connection:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- extensions ------------------------------------------------------------------------------
    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        """sqlite3-style shortcut: a new cursor, executed."""
        return self.cursor().execute(operation, parameters)

    def explain(self, operation: str, parameters: Any = None) -> Explanation:
        """The quote of ``operation`` (what ``EXPLAIN`` returns as rows), under this connection's
        ``SET dpgate.*`` settings and the statement's hints; free: reads no data, spends nothing."""
        self._check_open()
        return self._quote(operation, _params(parameters))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def gateway(self) -> Gateway:
        """The :class:`~dpgate.Gateway` answering this connection's queries."""
        self._check_open()
        return self._gateway

    @property
    def settings(self) -> Mapping[str, Any]:
        """This session's current options (read-only view): accuracy, confidence, intervals,
        allow_partial, round, method.  Change them with ``SET dpgate.<option> = <value>``."""
        return MappingProxyType(dict(self._settings))

    @property
    def budget(self) -> float:
        """The total privacy budget ε."""
        return self.gateway.budget

    @property
    def spent(self) -> float:
        """Privacy budget spent so far (by every user of the same ledger)."""
        return self.gateway.spent

    @property
    def remaining(self) -> float:
        """``budget − spent``."""
        return self.gateway.remaining

    @property
    def history(self) -> Any:
        """Every release so far, as a pandas DataFrame."""
        return self.gateway.history

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<dpgate.dbapi.Connection {state} tables={[t.name for t in self._gateway.schema.tables]}>"

    # -- internals -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this dpgate connection is closed.")

    def _run(self, operation: str, parameters: Any) -> ResultSet:
        """Compile one statement; apply a SET, or answer a SELECT through the gateway."""
        self._check_open()
        params = _params(parameters)
        gw = self._gateway
        try:
            inner = strip_explain(operation)
            if inner is not None:
                return explain_set(self._quote(inner, params))
            stmt = compile_statement(operation, gw.schema, dialect=gw.dialect, params=params)
            if isinstance(stmt, SetOption):
                with self._lock:
                    self._settings[stmt.name] = stmt.value
                return NO_ROWS
            settings = dict(self._settings)
            if not stmt.queries:  # SELECT k … GROUP BY k: the declared keys, free and unrecorded
                return result_set(Result((), stmt, 0.0), bool(settings["intervals"]), gw.schema)
            method, req = _resolved(stmt, settings)
            if isinstance(req, float):  # a free, model-based estimate (Gateway.estimate): no accuracy needed
                result = gw.estimate(operation, method, confidence=req, params=params)
                return result_set(result, bool(settings["intervals"]), gw.schema)
            result = gw.query(operation, req.accuracy, req.confidence, params=params, allow_partial=req.allow_partial,
                              round=bool(settings["round"]))
            return result_set(result, bool(settings["intervals"]), gw.schema)
        except Error:
            raise
        except Exception as exc:  # the DB-API contract: every failure is a dpgate.Error
            raise DPGateInternalError(f"unexpected {type(exc).__name__} while running a statement: {exc}") from exc

    def _quote(self, operation: str, params: Sequence[Any] | Mapping[str, Any] | None) -> Explanation:
        """The quote of a statement under this connection's settings and its hints (:meth:`Gateway.explain`)."""
        gw = self._gateway
        stmt = compile_statement(operation, gw.schema, dialect=gw.dialect, params=params)
        if isinstance(stmt, SetOption):
            raise UnsupportedQuery("EXPLAIN takes a SELECT; SET dpgate.* changes a setting and costs nothing.")
        method, req = _resolved(stmt, dict(self._settings))
        if isinstance(req, float):
            return gw.explain(operation, confidence=req, params=params, method=method)
        return gw.explain(operation, req.accuracy, req.confidence, params=params)


def _resolved(stmt: CompiledStatement, settings: Mapping[str, Any]) -> tuple[str, Requirement | float]:
    """A statement's method and what it must meet — hint > session SET > connect(): a
    :class:`Requirement` for exact answers, only a confidence for a free model-based estimate."""
    method = (stmt.hints.get("method") or settings["method"] or "exact").lower()
    if method != "exact":
        return method, resolve_confidence(hinted(stmt.hints), settings)
    return method, resolve_requirement(hinted(stmt.hints), settings, missing=_NO_ACCURACY)


def _params(parameters: Any) -> Sequence[Any] | Mapping[str, Any] | None:
    if parameters is None or isinstance(parameters, Mapping):
        return parameters
    if isinstance(parameters, (str, bytes)) or not hasattr(parameters, "__iter__"):
        raise ProgrammingError(
            f"parameters must be a sequence (for ?, $1) or a mapping (for :name), got {type(parameters).__name__}; "
            "write execute(sql, (value,)) for one parameter."
        )
    return list(parameters)


_NO_ACCURACY = (
    "no accuracy requirement: say how close the answer must be, as the half-width of its interval — "
    "per statement with a hint /*+ dpgate accuracy=25 */, per session with SET dpgate.accuracy = 25, "
    "or per connection with dpgate.connect(..., accuracy=25). Nothing was read or spent."
)


# -- Cursor -------------------------------------------------------------------------------------------
class Cursor:
    """A PEP 249 cursor.  Not to be shared between threads.

    Attributes:
        connection: the :class:`Connection` this cursor belongs to (PEP 249 extension).
        arraysize: default number of rows :meth:`fetchmany` returns (1).
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self._closed = False
        self._sets: list[ResultSet] = []
        self._set = -1
        self._pos = 0

    # -- PEP 249 attributes ------------------------------------------------------------------------
    @property
    def description(self) -> tuple[tuple[Any, ...], ...] | None:
        """One 7-tuple ``(name, type_code, display_size, internal_size, precision, scale, null_ok)``
        per column; ``None`` before any execute and after ``SET``.  ``type_code`` is a DuckDB-style
        type name (``"DOUBLE"``, ``"BIGINT"``, ``"VARCHAR"``, ``"BOOLEAN"``) that compares equal to
        :data:`NUMBER` or :data:`STRING`; sizes, precision and scale are ``None``."""
        return self._current.description

    @property
    def rowcount(self) -> int:
        """Rows in the current result set; -1 before any execute and after ``SET``."""
        return self._current.rowcount

    @property
    def rownumber(self) -> int | None:
        """0-based index of the next row to fetch (PEP 249 extension); None without a result set."""
        return None if self._current.description is None else self._pos

    lastrowid = None  #: PEP 249 extension: always None (nothing is ever inserted).

    @property
    def result(self) -> Result | None:
        """The :class:`~dpgate.result.Result` of the last statement: every answer it released, for
        every domain group, before HAVING / ORDER BY / LIMIT; None before execute and after SET."""
        return self._current.result

    @property
    def answers(self) -> tuple[Answer, ...]:
        """The :class:`~dpgate.result.Answer` behind each value of the current result set's rows, in
        row order (for each row, its aggregate columns in SELECT order): ``value``, ``low``, ``high``,
        ``confidence``, ``source``, ``epsilon_spent``, ``posterior``.  Empty before execute and after SET."""
        return self._current.answers

    # -- PEP 249 methods ---------------------------------------------------------------------------
    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        """Run one statement: a counting SELECT, or ``SET dpgate.<option> = <value>``.

        Returns the cursor itself (so ``cur.execute(sql).fetchall()`` works).

        Privacy: each aggregate of each group is answered free from history when the
        released answers already pin it within ``accuracy`` at ``confidence``; otherwise
        a fresh measurement of that linear query (sensitivity ``S = max|weight|``) gets
        discrete Laplace noise of scale ``S/α`` at the smallest α that meets the
        requirement, charging ``(α/S)|q_j|`` to each cell ``j`` under add/remove-one-row
        DP (see :class:`~dpgate.Gateway`).  Nothing is charged if the statement fails.

        Raises:
            UnsupportedQuery: the SQL is not a supported counting query or SET (nothing read).
            SchemaError: undeclared table or column.
            InvalidRequirement: missing or bad accuracy / confidence.
            BudgetExhausted: answering would overspend (an ``OperationalError``).
            ProgrammingError: parameters do not match the placeholders.
            InterfaceError: the cursor or connection is closed.
        """
        self._check_open()
        self._sets, self._set, self._pos = [], -1, 0
        rs = self.connection._run(operation, parameters)
        self._sets, self._set = [rs], 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Any) -> Cursor:
        """Run ``operation`` once per parameter set; one result set per run (see :meth:`nextset`)."""
        self._check_open()
        self._sets, self._set, self._pos = [], -1, 0
        if isinstance(seq_of_parameters, (str, bytes, Mapping)) or not hasattr(seq_of_parameters, "__iter__"):
            raise ProgrammingError(
                f"executemany needs a sequence of parameter sets, got {type(seq_of_parameters).__name__}."
            )
        sets = [self.connection._run(operation, p) for p in seq_of_parameters]
        self._sets, self._set = sets, (0 if sets else -1)
        return self

    def nextset(self) -> bool | None:
        """Move to the next result set of :meth:`executemany`; True if there is one, else None."""
        self._check_open()
        if self._set < 0:
            raise ProgrammingError("no result sets: call execute() or executemany() first.")
        if self._set + 1 >= len(self._sets):
            return None
        self._set += 1
        self._pos = 0
        return True

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None when the result set is exhausted."""
        rows = self._rows()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``size`` (default :attr:`arraysize`) next rows; an empty list when exhausted."""
        rows = self._rows()
        n = self.arraysize if size is None else size
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ProgrammingError(f"fetchmany size must be a non-negative integer, got {n!r}.")
        out = list(rows[self._pos : self._pos + int(n)])
        self._pos += len(out)
        return out

    def fetchall(self) -> list[tuple[Any, ...]]:
        """All remaining rows."""
        rows = self._rows()
        out = list(rows[self._pos :])
        self._pos = len(rows)
        return out

    def close(self) -> None:
        """Close the cursor; later operations raise InterfaceError.  Closing twice is allowed."""
        self._closed = True
        self._sets, self._set = [], -1

    def setinputsizes(self, sizes: Any) -> None:
        """PEP 249: accepted and ignored."""
        self._check_open()

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """PEP 249: accepted and ignored."""
        self._check_open()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dpgate.dbapi.Cursor {'closed' if self._closed else 'open'} rowcount={self.rowcount}>"

    # -- internals ----------------------------------------------------------------------------------
    @property
    def _current(self) -> ResultSet:
        return self._sets[self._set] if self._set >= 0 else NO_ROWS

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this dpgate cursor is closed.")
        self.connection._check_open()

    def _rows(self) -> tuple[tuple[Any, ...], ...]:
        self._check_open()
        if self._set < 0:
            raise ProgrammingError("no result set to fetch from: call execute() with a SELECT first.")
        rs = self._sets[self._set]
        if rs.description is None:
            raise ProgrammingError("the last statement (SET dpgate.…) returns no rows; there is nothing to fetch.")
        return rs.rows
