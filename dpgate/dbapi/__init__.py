"""PEP 249 (DB-API 2.0) driver: ``dpgate.connect(...)`` in front of a :class:`~dpgate.Gateway`.

(This module is the driver's front: this docstring, which records every decision
PEP 249 leaves open, the module globals and :func:`connect`.  ``Connection`` lives in
``dpgate.dbapi._connection``, ``Cursor`` in ``dpgate.dbapi._cursor``, type objects and
result-set rows in ``dpgate.dbapi._rows``; all are re-exported here.  The SQLAlchemy
dialect ``dpgate://`` — pandas, Core and ORM without warnings — is
``dpgate.dbapi.sqlalchemy_dialect``.)

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
:class:`~dpgate.answer.result.Answer` objects of the returned rows and
:attr:`Cursor.result` the whole :class:`~dpgate.answer.result.Result`.

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

import os
from collections.abc import Mapping
from typing import Any

from dpgate import errors
from dpgate.compile.bounds import DEFAULT_MAX_MEMORY
from dpgate.dbapi._connection import Connection
from dpgate.dbapi._cursor import Cursor
from dpgate.dbapi._rows import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
)
from dpgate.errors import *  # noqa: F403  (PEP 249: the exception classes, errors.__all__)
from dpgate.errors import InterfaceError, InvalidRequirement
from dpgate.gateway import DEFAULT_MAX_OUTPUTS, Gateway
from dpgate.plan.asks import check_reasks
from dpgate.plan.decide import check_policy
from dpgate.plan.requirement import resolve_accuracy, resolve_confidence
from dpgate.plan.state import DEFAULT_MAX_ATOMS

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
]
# PEP 249: the exception classes are module attributes (all of dpgate.errors', listed there once).
__all__ += errors.__all__

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
    fixed_latency: float | None = None,
    max_memory: int | None = None,
    reasks: str | None = None,
    privacy: str | None = None,
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
        budget: total privacy budget ε (default 1.0); must equal a ledger's stored budget.  With
            ``privacy="zcdp"``, ρ (or a pair ``(ε, δ)``, converted to ρ).
        ledger: ``None`` (in memory, lost at exit), a path (durable SQLite ledger,
            shared safely by processes), a ``postgresql://`` URL (shared by gateways on
            several hosts; needs ``ledger_key``) or an open ``dpgate.ledger.core.Ledger``.
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
            :class:`~dpgate.Gateway`; default 20 000); finer statements are answered on their own.
        max_outputs: the most outputs one statement may have (default 4 096); larger
            statements raise ``QueryTooComplex`` before any data is read.
        fixed_latency: seconds S: a statement that reads data is answered S after it began
            (the next multiple of S if its work overruns), whatever the data (see
            :class:`~dpgate.Gateway` and the README's threat model); default: as soon as ready.
        max_memory: bytes of large arrays one statement may build while it is compiled and
            planned (default 1 GiB); a larger one raises ``QueryTooComplex``, nothing spent.
        reasks: ``"simultaneous"`` (default): all the intervals given for one query hold together at
            ``confidence`` (its k-th distinct interval is computed at ``1 − δ_k``, ``Σ δ_k ≤ δ``), so
            stopping on what you see is honest; ``"independent"``: each holds on its own
            (see :class:`~dpgate.Gateway` and ``dpgate.plan.asks``).
        privacy: ``"pure"`` (default, ε-DP) or ``"zcdp"`` (ρ-zCDP; see :class:`~dpgate.Gateway`).

    Raises:
        OperationalError: the database file cannot be opened.
        SchemaError: the schema is invalid or the data lack a declared table or column.
        LedgerError: the ledger is bound to other data, another schema or budget.
        InvalidRequirement: bad budget, accuracy, confidence, policy or reasks.
    """
    if isinstance(database, Gateway):
        given = [n for n, v in (("schema", schema), ("budget", budget), ("ledger", ledger),
                                ("ledger_key", ledger_key), ("policy", policy), ("seed", seed),
                                ("max_atoms", max_atoms), ("max_outputs", max_outputs),
                                ("fixed_latency", fixed_latency), ("max_memory", max_memory),
                                ("reasks", reasks), ("privacy", privacy)) if v is not None]
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
                fixed_latency=fixed_latency,
                max_memory=DEFAULT_MAX_MEMORY if max_memory is None else max_memory,
                reasks=check_reasks("simultaneous" if reasks is None else reasks),
                privacy="pure" if privacy is None else privacy,
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
