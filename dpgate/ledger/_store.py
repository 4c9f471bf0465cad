"""The ledger's storage interface (internal): what a store gives the ledger and ``dpgate serve``.

A :class:`LedgerStore` keeps a ledger's tables in one database — a SQLite file or memory
(:class:`dpgate.ledger._sqlite.SqliteStore`) or a PostgreSQL database
(:class:`dpgate.ledger._postgres.PostgresStore`) — and offers, in that database's own terms:

* **transactions** for :class:`dpgate.ledger.core.Ledger`, which keeps the records' format,
  chain and checks above any store: :meth:`LedgerStore.write_locked` serialises one writer
  against every other thread, process and host and commits (durably) on success; reads go
  through :meth:`LedgerStore.read`;
* **provenance** for ``dpgate serve`` (:mod:`dpgate.ledger._provenance`): the table
  ``dpgate_provenance`` in the same database, its deliveries and an analyst's charges and
  history, and — through :class:`ProvenanceWriter`, handed to a ledger's append hook — the
  charge of a release written in the release's own transaction, so that the two commit or
  roll back together and a cap check made under the write lock is race-safe across processes
  and hosts.

Callers outside the stores see a :class:`Connection` only as an opaque handle of an open
transaction, never a driver's connection.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["AppendHook", "Connection", "Cursor", "LedgerStore", "ProvenanceRow", "ProvenanceWriter"]


class Cursor(Protocol):
    """The result of :meth:`Connection.execute`."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """The few methods of ``sqlite3.Connection`` the ledger uses: ``?`` placeholders, and errors
    raised as ``sqlite3`` exception classes (the PostgreSQL store translates psycopg's), so that
    one error mapping and one lock-retry rule serve every store."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


@dataclass(frozen=True)
class ProvenanceRow:
    """One row of ``dpgate_provenance`` (see :mod:`dpgate.ledger._provenance`).

    Attributes:
        analyst: who the release was made for, or who received the answers.
        kind: ``"charge"`` (ε a fresh release cost the analyst) or ``"delivery"``.
        record_id: the ledger record charged (``None`` for a delivery).
        epsilon: ε charged to the analyst.
        statement: the statement's hash (never its values).
        source: ``"fresh"``, ``"history"`` or ``"mixed"``.
        created_at: UTC ISO 8601.
    """

    analyst: str
    kind: str
    record_id: int | None
    epsilon: float
    statement: str
    source: str
    created_at: str

    def values(self) -> tuple[Any, ...]:
        """The row's values in :data:`INSERT_PROVENANCE`'s order."""
        return (self.analyst, self.kind, self.record_id, float(self.epsilon), self.statement, self.source,
                self.created_at)


#: The provenance statements every store runs as they are (``?`` placeholders).
INSERT_PROVENANCE = ("INSERT INTO dpgate_provenance(analyst, kind, record_id, epsilon, statement, source, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
SPENT = "SELECT COALESCE(SUM(epsilon), 0.0) FROM dpgate_provenance WHERE analyst = ? AND kind = 'charge'"
HISTORY = ("SELECT id, created_at, kind, statement, source, epsilon, record_id FROM dpgate_provenance "
           "WHERE analyst = ? ORDER BY id")
COST_BEFORE = "SELECT cost_after FROM dpgate_records WHERE id < ? ORDER BY id DESC LIMIT 1"


class ProvenanceWriter:
    """Provenance inside one open ledger transaction (under the write lock): what a ledger's
    append hook (:meth:`dpgate.ledger.core.Ledger.on_append`) may read and write, committed or
    rolled back with the records the transaction appends."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def cost_before(self, record_id: int) -> float:
        """The ledger's cost after the record before ``record_id`` (0 before the first)."""
        row = self._conn.execute(COST_BEFORE, (record_id,)).fetchone()
        return float(row[0]) if row else 0.0

    def spent(self, analyst: str) -> float:
        """ε charged to ``analyst``: every committed charge, and this transaction's."""
        return float(self._conn.execute(SPENT, (analyst,)).fetchone()[0])

    def add(self, row: ProvenanceRow) -> None:
        """Write ``row`` in this transaction."""
        self._conn.execute(INSERT_PROVENANCE, row.values())


#: A ledger's append hook: ``hook(provenance, record_id, cost_after)`` after each appended record.
AppendHook = Callable[[ProvenanceWriter, int, float], None]


class LedgerStore(Protocol):
    """Where a ledger keeps its tables (see the module docstring).

    Attributes:
        path: the SQLite file (absolute), ``None`` in memory, or the PostgreSQL URL without
            its password.
        schema: the DDL of a new ledger's tables, in this database's dialect.
    """

    path: str | None
    schema: tuple[str, ...]

    # -- what the ledger core drives ---------------------------------------------------
    def connection(self) -> Connection:
        """This thread's connection (opened on first use, and again after ``fork``)."""
        ...

    def prepare(self, conn: Connection, where: str) -> None:
        """Make the database ready to hold a ledger (SQLite: the WAL journal)."""
        ...

    def read_meta(self, conn: Connection, where: str) -> dict[str, str] | None:
        """The stored metadata, or ``None`` if the database holds no ledger yet."""
        ...

    def write_locked(self, conn: Connection, committed: Callable[[], None] | None = None
                     ) -> AbstractContextManager[None]:
        """The writers' critical section: the write lock, one transaction, commit (durable) on
        success and rollback on any error; ``committed()`` runs after the commit, still locked."""
        ...

    def retry(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, retried while the database is busy, up to the store's timeout."""
        ...

    def read(self, fn: Callable[[Connection], Any]) -> Any:
        """``fn(conn)`` on committed data, without the write lock (errors as :class:`LedgerError`)."""
        ...

    def read_failed(self, exc: BaseException) -> str:
        """The message of a read that failed with ``exc``."""
        ...

    def replaced(self) -> bool:
        """Whether the database was deleted or replaced since it was opened (a file store)."""
        ...

    def close(self) -> None:
        """Close every connection this store opened in this process (idempotent)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ...

    # -- provenance (dpgate serve) -------------------------------------------------------
    def ensure_provenance(self) -> None:
        """Create ``dpgate_provenance`` (append-only) in this database if it is not there yet."""
        ...

    def add_provenance(self, row: ProvenanceRow, *, fsync: bool) -> None:
        """Write ``row`` in its own transaction, serialised with releases; with ``fsync=False``
        the commit survives a crash of the process but not of the machine."""
        ...

    def analyst_spent(self, analyst: str) -> float:
        """ε charged to ``analyst`` so far (committed charges)."""
        ...

    def analyst_history(self, analyst: str) -> list[tuple[Any, ...]]:
        """``analyst``'s rows: ``(id, created_at, kind, statement, source, epsilon, record_id)``."""
        ...

