"""The ledger's SQLite storage: connections, write locks and transactions (internal).

:class:`SqliteStore` is the :class:`~dpgate.ledger._store.LedgerStore` of a SQLite file or a
private in-memory database, held by a :class:`~dpgate.ledger.core.Ledger` (whose module
docstring states the guarantees): one connection per thread (re-opened after ``fork``), a WAL
journal with ``synchronous=FULL``, and :meth:`SqliteStore.write_locked`, the writers' critical
section — the process lock (:mod:`dpgate.ledger._lock`), ``BEGIN IMMEDIATE``, commit on success
and rollback on any error.  The database hooks (``schema``, ``provenance_schema``, ``prepare``,
``_connect``, ``_begin``, ``_process_lock``, ``read_meta``, ``_durable``) are what
:mod:`dpgate.ledger._postgres` overrides to keep the same ledger in PostgreSQL.

Storage choice — SQLite (stdlib ``sqlite3``) rather than DuckDB:

* **Cross-process writers.**  ``BEGIN IMMEDIATE`` takes SQLite's write lock
  up front, so a spend decision (read history → check budget → append) made by
  one process is serialised against every other process and thread using the
  same file; the loser waits (busy timeout, 60 s by default).  DuckDB allows a
  single read-write process per database file, so several gateway processes
  could not share one ledger at all.
* **Durability.**  WAL journal with ``synchronous=FULL`` fsyncs the WAL at every
  commit, so a committed release survives a process crash *and* a power loss.
  WAL also lets readers (:meth:`dpgate.ledger.core.Ledger.records`) proceed while a writer holds the
  lock, and they see only committed records.
* **Stdlib, tiny, append-heavy.**  The ledger is a few thousand small rows
  written one at a time — an OLTP load, not DuckDB's analytical one.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dpgate.errors import LedgerError, map_exceptions
from dpgate.ledger._lock import MemoryLock, PathLock, lock_for
from dpgate.ledger._records import SCHEMA
from dpgate.ledger._store import HISTORY, MAC_OF, ROWS_AFTER, Connection, ProvenanceRow, ProvenanceWriter

__all__ = ["SqliteStore", "file_id"]


#: The provenance table of dpgate serve (see :mod:`dpgate.ledger._provenance`), append-only.
PROVENANCE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS dpgate_provenance (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        analyst    TEXT    NOT NULL,
        kind       TEXT    NOT NULL CHECK (kind IN ('charge', 'delivery')),
        record_id  INTEGER,
        epsilon    REAL    NOT NULL,
        statement  TEXT    NOT NULL,
        source     TEXT    NOT NULL,
        created_at TEXT    NOT NULL,
        mac        TEXT
    ) STRICT""",
    "CREATE INDEX IF NOT EXISTS dpgate_provenance_analyst ON dpgate_provenance(analyst, kind)",
    """CREATE TRIGGER IF NOT EXISTS dpgate_provenance_no_update BEFORE UPDATE ON dpgate_provenance
       BEGIN SELECT RAISE(ABORT, 'dpgate provenance is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS dpgate_provenance_no_delete BEFORE DELETE ON dpgate_provenance
       BEGIN SELECT RAISE(ABORT, 'dpgate provenance is append-only'); END""",
)


class SqliteStore:
    """Where a :class:`~dpgate.ledger.core.Ledger` keeps its records: a SQLite file, or a private
    in-memory database (``path=None``: one connection, guarded by a re-entrant lock).

    Attributes:
        path: absolute path of the SQLite file, or ``None`` for in-memory.
        timeout: seconds a writer waits for the write lock (and a reader for a busy database).
    """

    #: The DDL of a new ledger (SQLite; the PostgreSQL store has its own).
    schema: tuple[str, ...] = SCHEMA
    #: The DDL of the provenance table, run when it is missing.
    provenance_schema: tuple[str, ...] = PROVENANCE_SCHEMA

    def __init__(self, path: str | None, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._file_id: tuple[int, int] | None = None
        self._closed = False
        self._local = threading.local()
        self._conns: list[tuple[int, Any]] = []
        self._conns_guard = threading.Lock()
        self._pid = os.getpid()
        self._mem_lock = MemoryLock()  # in-memory: one connection, guarded
        self._mem_conn: Connection | None = None

    def prepare(self, conn: Connection, where: str) -> None:
        """A ledger file: WAL journal, and the file's identity (to notice its replacement)."""
        if self.path is None:
            return
        mode = self.retry(lambda: conn.execute("PRAGMA journal_mode").fetchone()[0])
        if str(mode).lower() != "wal":  # switching needs the lock; once set, it persists
            mode = self.retry(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        if str(mode).lower() != "wal":
            raise LedgerError(
                f"The ledger {where!r} cannot use SQLite's WAL mode (got {mode!r}); "
                "put it on a local file system."
            )
        self._file_id = file_id(self.path)

    @staticmethod
    def read_meta(conn: Connection, where: str) -> dict[str, str] | None:
        """The stored metadata, or ``None`` if this is an empty database (a new ledger)."""
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()}
        if not names:
            return None
        if "dpgate_meta" not in names or "dpgate_records" not in names:
            raise LedgerError(
                f"{where!r} is an SQLite database but not a dpgate ledger "
                f"(it has tables {sorted(names)}); choose another ledger path."
            )
        return dict(conn.execute("SELECT key, value FROM dpgate_meta").fetchall())

    def connection(self) -> Connection:
        if self._closed:
            raise LedgerError(f"The ledger {self.path or '(in memory)'!r} is closed.")
        pid = os.getpid()
        if self.path is None:
            if self._pid != pid:  # forked: keep the (copied, private) database, renew the lock
                self._pid = pid
                self._mem_lock = MemoryLock()
            if self._mem_conn is None:
                self._mem_conn = self._connect(":memory:")
            return self._mem_conn
        cached = getattr(self._local, "conn", None)
        if cached is not None and cached[0] == pid:
            return cached[1]
        conn = self._connect(self.path)
        self._local.conn = (pid, conn)
        return conn

    def _connect(self, target: str) -> Connection:
        if target != ":memory:":
            _create_private(target)
        with map_exceptions({sqlite3.DatabaseError: LedgerError}, f"Cannot open the ledger {target!r}: {{exc}}."):
            conn = sqlite3.connect(
                target, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA synchronous=FULL")
        with self._conns_guard:
            self._conns.append((os.getpid(), conn))
        return conn

    def retry(self, fn: Any) -> Any:
        """Run ``fn`` retrying SQLITE_BUSY/LOCKED until the timeout (beyond the busy handler)."""
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                msg = str(exc).lower()
                if ("locked" not in msg and "busy" not in msg) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _process_lock(self) -> PathLock | MemoryLock:
        if self.path is None:
            self.connection()  # re-creates the lock after fork
            return self._mem_lock
        return lock_for(self.path)

    def _begin(self, conn: Connection) -> None:
        """Start a write transaction holding the store's write lock (SQLite: ``BEGIN IMMEDIATE``)."""
        conn.execute("BEGIN IMMEDIATE")

    @contextlib.contextmanager
    def write_locked(self, conn: Connection, committed: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the in-process lock and SQLite's write lock; commit on success, then call
        ``committed()`` still under the lock (it advances the anchor)."""
        if getattr(self._local, "in_transaction", False):
            raise LedgerError(
                "A ledger transaction is already open in this thread; transactions do not nest."
            )
        lock = self._process_lock()
        if not lock.acquire(timeout=self.timeout):
            raise LedgerError(
                f"Timed out after {self.timeout:g} s waiting for the ledger lock "
                f"({self.path or 'in memory'}); another thread or process holds it."
            )
        self._local.in_transaction = True
        try:
            with map_exceptions(
                {sqlite3.OperationalError: LedgerError},
                f"Could not lock the ledger {self.path!r} within {self.timeout:g} s: {{exc}}.",
            ):
                self.retry(lambda: self._begin(conn))
            try:
                yield
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            with map_exceptions(
                {sqlite3.Error: LedgerError},
                f"Committing to the ledger {self.path or '(in memory)'!r} failed ({{exc}}); "
                "nothing from this transaction was recorded.",
            ):
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error:
                    # Roll back before the error leaves (and before the lock is
                    # released), so no half-committed state outlives this block.
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            if committed is not None:
                committed()
        finally:
            self._local.in_transaction = False
            lock.release()

    def read_failed(self, exc: BaseException) -> str:
        return (
            f"Reading the ledger {self.path!r} failed ({exc}), even after waiting "
            f"{self.timeout:g} s for other writers; retry, or raise the ledger timeout."
        )

    def read(self, fn: Callable[[Connection], Any]) -> Any:
        """Run ``fn(conn)`` on a committed snapshot of the ledger's database (no write lock)."""
        conn = self.connection()
        with map_exceptions({sqlite3.OperationalError: LedgerError}, self.read_failed):
            if self.path is not None:
                return self.retry(lambda: fn(conn))
            if not self._mem_lock.acquire(self.timeout):
                raise LedgerError(f"Timed out after {self.timeout:g} s waiting for the in-memory ledger.")
            try:
                return fn(conn)
            finally:
                self._mem_lock.release()

    def replaced(self) -> bool:
        """Whether the ledger file was deleted or replaced since it was opened."""
        return self.path is not None and self._file_id is not None and file_id(self.path) != self._file_id

    def _durable(self, conn: Connection, durable: bool) -> None:
        """Set whether the next commits are fsync'd (outside a transaction): SQLite's
        ``synchronous=FULL``, or ``NORMAL`` in WAL mode (a commit survives a crash of the
        process, not of the machine)."""
        conn.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")

    def write(self, fn: Callable[[Connection], Any], *, fsync: bool = True) -> Any:
        """Run ``fn(conn)`` in its own write transaction, serialised with releases (for the
        provenance table only: the records and the metadata stay append-only through their
        triggers).  Committed on return; with ``fsync=False`` not fsync'd — never for a release."""
        conn = self.connection()
        if not fsync:
            self._durable(conn, False)
        try:
            with self.write_locked(conn):
                with map_exceptions({sqlite3.Error: LedgerError}, "Writing to the ledger failed: {exc}."):
                    return fn(conn)
        finally:
            if not fsync:
                self._durable(conn, True)

    # -- provenance (dpgate serve) ---------------------------------------------------

    def ensure_provenance(self) -> None:
        """Create the provenance table in the ledger's database if it is not there yet."""
        def create(conn: Connection) -> None:
            for ddl in self.provenance_schema:
                conn.execute(ddl)
            columns = [r[1] for r in conn.execute("PRAGMA table_info(dpgate_provenance)").fetchall()]
            if "mac" not in columns:  # a table of dpgate < 0.27: its rows stay unchained (a legacy prefix)
                conn.execute("ALTER TABLE dpgate_provenance ADD COLUMN mac TEXT")
        self.write(create)

    def add_provenance(self, row: ProvenanceRow, *, fsync: bool, key: bytes) -> None:
        """Write ``row`` in its own transaction, chained (see :meth:`write` for ``fsync``)."""
        self.write(lambda conn: ProvenanceWriter(conn, key).add(row), fsync=fsync)

    def provenance_rows(self, verified: int) -> tuple[str | None, list[Any]]:
        """The MAC of row ``verified`` and the committed rows after it, in one read."""
        def fetch(conn: Connection) -> tuple[str | None, list[Any]]:
            head = conn.execute(MAC_OF, (verified,)).fetchone() if verified > 0 else ("",)
            return (None if head is None else head[0] or ""), list(conn.execute(ROWS_AFTER, (verified,)).fetchall())
        found: tuple[str | None, list[Any]] = self.read(fetch)
        return found

    def analyst_history(self, analyst: str) -> list[tuple[Any, ...]]:
        """``analyst``'s rows: ``(id, created_at, kind, statement, source, epsilon, record_id)``."""
        return [tuple(r) for r in self.read(lambda conn: conn.execute(HISTORY, (analyst,)).fetchall())]

    def close(self) -> None:
        """Close every connection this ledger opened in this process (idempotent)."""
        self._closed = True
        pid = os.getpid()
        with self._conns_guard:
            conns, self._conns = self._conns, []
        for owner, conn in conns:
            if owner == pid:  # never touch a connection inherited across fork
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        self._mem_conn = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed


def _create_private(path: str) -> None:
    """Create the ledger file owner-only (mode 0o600 whatever the umask) if it is not there yet:
    SQLite would create it with the umask's mode, and gives its ``-wal`` and ``-shm`` files the
    mode of the database file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:  # there already (or not creatable: sqlite3 then says why)
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def file_id(path: str) -> tuple[int, int] | None:
    """The identity (device, inode) of the file at ``path``, or ``None`` if there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
