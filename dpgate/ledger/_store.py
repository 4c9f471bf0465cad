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

import hashlib
import hmac
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["AppendHook", "AppendedRecord", "Connection", "Cursor", "LedgerStore", "ProvenanceRow",
           "ProvenanceWriter", "provenance_key", "provenance_mac"]


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
        """The row's values in :data:`INSERT_PROVENANCE`'s order (without its MAC)."""
        return (self.analyst, self.kind, self.record_id, float(self.epsilon), self.statement, self.source,
                self.created_at)


#: The provenance statements every store runs as they are (``?`` placeholders).
INSERT_PROVENANCE = ("INSERT INTO dpgate_provenance(analyst, kind, record_id, epsilon, statement, source, "
                     "created_at, mac) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
HISTORY = ("SELECT id, created_at, kind, statement, source, epsilon, record_id FROM dpgate_provenance "
           "WHERE analyst = ? ORDER BY id")
LAST_MAC = "SELECT mac FROM dpgate_provenance ORDER BY id DESC LIMIT 1"
#: The rows after a verified one, with what each charge is bound to (its record's MAC) and
#: charged for (the record's table, query, α and S), for :mod:`dpgate.ledger._provenance`.
ROWS_AFTER = ("SELECT p.id, p.analyst, p.kind, p.record_id, p.epsilon, p.statement, p.source, p.created_at, p.mac, "
              "r.mac, r.table_name, r.query, r.alpha, r.sensitivity FROM dpgate_provenance p "
              "LEFT JOIN dpgate_records r ON r.id = p.record_id WHERE p.id > ? ORDER BY p.id")
MAC_OF = "SELECT mac FROM dpgate_provenance WHERE id = ?"
LAST_ID = "SELECT MAX(id) FROM dpgate_provenance"


def provenance_key(ledger_key: bytes) -> bytes:
    """The key of the provenance MACs, derived from the ledger's (never the ledger's own key)."""
    return hmac.new(ledger_key, b"dpgate provenance v1", hashlib.sha256).digest()


def provenance_mac(key: bytes, previous: str, values: tuple[Any, ...], record_mac: str | None) -> str:
    """The MAC of a provenance row: chained to the previous row's MAC (``""`` for the first) and,
    for a charge, bound to the MAC of the ledger record it charges, so that a row deleted, edited,
    reordered or moved to another release breaks the chain (:mod:`dpgate.ledger._provenance`)."""
    text = json.dumps([previous, *values, record_mac or ""], separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class AppendedRecord(Protocol):
    """What an append hook sees of a record just appended (a :class:`~dpgate.ledger.core.LedgerRecord`)."""

    id: int
    table: str
    query: str
    alpha: float
    sensitivity: float
    cost_after: float


class ProvenanceWriter:
    """Provenance inside one open ledger transaction (under the write lock): what a ledger's
    append hook (:meth:`dpgate.ledger.core.Ledger.on_append`) may read and write, committed or
    rolled back with the records the transaction appends.  ``key``: :func:`provenance_key`."""

    def __init__(self, conn: Connection, key: bytes) -> None:
        self._conn, self._key = conn, key
        self.wrote = False  # whether this transaction wrote a row (its reads then see them)
        #: ``(id, MAC)`` of the last charge written, for the provenance anchor after the commit.
        self.last_charge: tuple[int, str] | None = None

    def rows_after(self, verified: int) -> list[Any]:
        """The rows with ``id > verified`` (:data:`ROWS_AFTER`), this transaction's included."""
        return list(self._conn.execute(ROWS_AFTER, (verified,)).fetchall())

    def mac_of(self, row_id: int) -> str | None:
        """The stored MAC of row ``row_id`` (``None`` when it is gone)."""
        found = self._conn.execute(MAC_OF, (row_id,)).fetchone()
        return None if found is None else found[0]

    def add(self, row: ProvenanceRow, record_mac: str | None = None) -> None:
        """Write ``row`` in this transaction, chained to the last row (and bound to ``record_mac``,
        the MAC of the record a charge is for)."""
        last = self._conn.execute(LAST_MAC).fetchone()
        mac = provenance_mac(self._key, (last[0] or "") if last else "", row.values(), record_mac)
        self._conn.execute(INSERT_PROVENANCE, (*row.values(), mac))
        self.wrote = True
        if row.kind == "charge":  # under the write lock: the newest row is this one
            self.last_charge = (int(self._conn.execute(LAST_ID).fetchone()[0]), mac)


#: A ledger's append hook: ``hook(provenance, record, mac)`` after each appended record (``mac``: its MAC).
AppendHook = Callable[[ProvenanceWriter, AppendedRecord, str], None]


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

    def add_provenance(self, row: ProvenanceRow, *, fsync: bool, key: bytes) -> None:
        """Write ``row`` in its own transaction, serialised with releases and chained to the last
        row under ``key`` (:func:`provenance_key`); with ``fsync=False`` the commit survives a
        crash of the process but not of the machine."""
        ...

    def provenance_rows(self, verified: int) -> tuple[str | None, list[Any]]:
        """In one snapshot: the stored MAC of row ``verified`` (``None`` when it is gone), and the
        committed rows with ``id > verified`` (:data:`ROWS_AFTER`)."""
        ...

    def analyst_history(self, analyst: str) -> list[tuple[Any, ...]]:
        """``analyst``'s rows: ``(id, created_at, kind, statement, source, epsilon, record_id)``."""
        ...

