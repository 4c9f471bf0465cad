"""SQL engines behind a PEP 249 (DB-API) connection, and PostgreSQL (internal).

:class:`DbapiBackend` runs each generated SELECT in its own short transaction
(opened by :meth:`DbapiBackend._begin`, always rolled back) and fetches only its
result rows — per-cell counts; the aggregation happens on the server.
:class:`PostgresBackend` makes those transactions ``READ ONLY`` with a
``statement_timeout``, so even a statement that tried to write would be refused by
the server itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any, cast

from sqlglot import exp

from dpgate.backends._base import TableBinding, checked_select, columns_of, engine_failure, information_schema_catalog
from dpgate.errors import InvalidArgument, OperationalError

__all__ = ["DbapiBackend", "PostgresBackend"]

#: Default ``statement_timeout`` of a generated statement on PostgreSQL (seconds).
DEFAULT_STATEMENT_TIMEOUT = 600.0


class DbapiBackend:
    """An engine reached through a DB-API connection, with SQL in ``dialect``.

    Subclasses set :attr:`dialect`, :meth:`row_hash` and, where the engine has them,
    a read-only transaction in :meth:`_begin`.

    Args:
        connection: an open DB-API connection, used by dpgate alone while the gateway is
            open (each statement ends with a rollback); closed by :meth:`close` only if ``owns``.
        owns: whether this backend closes it.
        on_close: called by :meth:`close` (e.g. disposing of an engine this backend made).
    """

    dialect = "postgres"

    def __init__(self, connection: Any, *, owns: bool = False, on_close: Any = None) -> None:
        self.con = connection
        self.owns = owns
        self._on_close = on_close
        self._lock = threading.Lock()  # DB-API connections are not safe for concurrent use

    def _begin(self, cur: Any) -> None:
        """Start the statement's transaction (default: the driver's implicit one)."""

    def _end(self, cur: Any) -> None:
        """End it: roll back (the statement only read; a driver without transactions may refuse)."""
        with contextlib.suppress(Exception):
            self.con.rollback()

    def _fetch(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            cur = self.con.cursor()
            try:
                self._begin(cur)
                cur.execute(sql)
                rows = [tuple(r) for r in cur.fetchall()]
                names = [d[0] for d in cur.description]
            except Exception as exc:
                raise engine_failure(self.dialect, exc) from None
            finally:
                try:
                    self._end(cur)
                finally:
                    cur.close()
        return names, rows

    def catalog(self, tables: Sequence[str]) -> dict[str, TableBinding]:
        """Declared tables found through ``information_schema`` (metadata only)."""
        return information_schema_catalog(lambda e: self._fetch(e.sql(dialect=self.dialect))[1], tables)

    def run(self, select: exp.Select, *, numpy: bool = False) -> Any:
        """Run one generated SELECT in its own transaction; rows, or columns as numpy arrays."""
        names, rows = self._fetch(checked_select(select, self.dialect))
        return columns_of(names, rows) if numpy else rows

    def row_hash(self, columns: Sequence[exp.Expression]) -> exp.Expression:
        """The engine's 64-bit hash of a row's ``columns`` (each engine has its own; see subclasses)."""
        raise NotImplementedError(f"{type(self).__name__} must define row_hash for the ledger binding")

    def close(self) -> None:
        """Close the connection if this backend opened it."""
        if self.owns:
            self.con.close()
        if self._on_close is not None:
            self._on_close()


class PostgresBackend(DbapiBackend):
    """PostgreSQL: a SQLAlchemy URL (``postgresql://…``, ``postgresql+psycopg://…``), a
    SQLAlchemy ``Engine``, or a DB-API connection (psycopg 3, psycopg2, pg8000).

    Every generated statement runs in its own ``READ ONLY`` transaction with
    ``SET LOCAL statement_timeout``, and is rolled back afterwards.

    Args:
        source: the URL, engine or connection.
        statement_timeout: seconds before the server cancels a statement (> 0).

    Example:
        >>> PostgresBackend("postgresql://dpgate@db.internal/warehouse")  # doctest: +SKIP
    """

    dialect = "postgres"

    def __init__(self, source: Any, *, statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT) -> None:
        if not (isinstance(statement_timeout, (int, float)) and 0 < statement_timeout < 2**31 / 1000):
            raise InvalidArgument(f"statement_timeout must be a positive number of seconds, got {statement_timeout!r}.")
        self._timeout_ms = max(1, round(statement_timeout * 1000))
        owns, on_close = False, None
        if isinstance(source, str) or type(source).__module__.startswith("sqlalchemy"):
            import sqlalchemy

            if isinstance(source, str):
                try:
                    engine = sqlalchemy.create_engine(source, poolclass=sqlalchemy.pool.NullPool)
                except Exception as exc:  # a malformed URL or a missing driver
                    raise OperationalError(f"cannot open the PostgreSQL URL: {exc}") from None
                on_close = engine.dispose
            else:
                engine = source
            if engine.dialect.name != "postgresql":
                raise InvalidArgument(
                    f"the SQLAlchemy engine is for {engine.dialect.name!r}; dpgate's SQL backends are PostgreSQL "
                    "and DuckDB (add another dialect as the README's 'Backends' section shows)."
                )
            try:
                connection = engine.raw_connection()
            except Exception as exc:
                raise OperationalError(f"cannot connect to PostgreSQL: {exc}") from None
            owns = True
        else:
            connection = source
        super().__init__(connection, owns=owns, on_close=on_close)

    def _begin(self, cur: Any) -> None:
        # An autocommit connection has no implicit transaction: open one explicitly.
        cur.execute("BEGIN READ ONLY" if getattr(self.con, "autocommit", False) else "SET TRANSACTION READ ONLY")
        cur.execute(f"SET LOCAL statement_timeout = {int(self._timeout_ms)}")

    def _end(self, cur: Any) -> None:
        if getattr(self.con, "autocommit", False):
            cur.execute("ROLLBACK")
        else:
            self.con.rollback()

    def row_hash(self, columns: Sequence[exp.Expression]) -> exp.Expression:
        """``hashtextextended(ROW(…)::text, 0)``: PostgreSQL's 64-bit hash of the row's text form."""
        row = exp.Cast(this=exp.Anonymous(this="ROW", expressions=list(columns)), to=exp.DataType.build("TEXT"))
        return cast(exp.Expression, exp.func("hashtextextended", row, exp.Literal.number(0)))
