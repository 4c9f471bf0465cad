"""The ledger in PostgreSQL: one budget shared by gateways on several hosts (internal).

``Gateway(..., ledger="postgresql://user@host/db", ledger_key="/etc/dpgate/ledger.key")``.
The crash, concurrency and tamper logic is :class:`dpgate.ledger.core.Ledger`'s,
unchanged; this module supplies only the storage underneath it:

* **Writers are serialised across processes and hosts** by a transaction-scoped
  advisory lock, ``pg_advisory_xact_lock``, taken first in every write transaction
  (``READ COMMITTED``: each read after the lock sees every commit before it).  The
  read → check budget → append step of one gateway therefore never interleaves with
  another's, exactly as SQLite's ``BEGIN IMMEDIATE`` does for a file; the lock is
  released by the server at commit, rollback or a lost connection.  Waiting is bounded
  by ``lock_timeout`` (the ledger's timeout).  Record ids are also a primary key, so
  even a writer that bypassed the lock could not fork the chain.
* **Commit before release**: the gateway releases an answer only after ``COMMIT``
  returned; sessions run ``synchronous_commit = on``, so a committed record is on the
  server's disk (and its synchronous standbys, if configured).  A ``COMMIT`` that the
  server turned into a rollback (an aborted transaction) raises.
* **Tamper evidence**: the keyed hash chain and header MAC are the same as the SQLite
  ledger's; triggers refuse ``UPDATE``, ``DELETE`` and ``TRUNCATE`` of the tables.  The
  key lives outside the database, in a key file every gateway host has a copy of
  (``ledger_key=``; created with a new ledger when the file does not exist), and the
  anchor (``<key file>.anchor``) on each host records the chain head that host last
  committed, so a database rolled back behind it (an older backup restored) is refused.
  A database administrator who also holds the key can rewrite history; one without it
  cannot do so undetected.

* **dpgate serve's provenance** (:mod:`dpgate.ledger._provenance`) lives in the same
  database, in ``dpgate_provenance`` (append-only through the same triggers).  An analyst's
  charge is written in the release's own transaction, under the advisory lock, so the cap
  check (the sum of their charges, read under the lock) is race-safe across sessions on
  several hosts, and the charge and the release commit or roll back together.

:class:`PostgresStore` is the :class:`~dpgate.ledger._store.LedgerStore` of a PostgreSQL
database: the SQLite store's connections, transactions and retries, with the database hooks
overridden.  Its adapter presents a psycopg connection with the few methods of
``sqlite3.Connection`` the ledger uses (``?`` placeholders, ``sqlite3`` exception classes), so
the ledger's single error mapping and lock-retry logic apply as they are.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from dpgate.errors import InvalidArgumentType, LedgerError
from dpgate.ledger._key import key_from_bytes, read_key
from dpgate.ledger._lock import MemoryLock, thread_lock_for
from dpgate.ledger._sqlite import SqliteStore
from dpgate.ledger._store import Connection

__all__ = ["PostgresStore", "is_ledger_url"]

#: The advisory lock of dpgate ledgers (a fixed 64-bit key: "dpgate" in ASCII).
_LOCK_ID = 0x647067617465

_SCHEMA_PG = (
    """
CREATE TABLE dpgate_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
)
    """,
    """
CREATE TABLE dpgate_records (
    id          BIGINT PRIMARY KEY,
    kind        TEXT    NOT NULL,
    table_name  TEXT    NOT NULL,
    query       TEXT    NOT NULL,
    sql         TEXT    NOT NULL,
    alpha       DOUBLE PRECISION NOT NULL,
    sensitivity DOUBLE PRECISION NOT NULL,
    scale       DOUBLE PRECISION NOT NULL,
    lattice     DOUBLE PRECISION NOT NULL,
    noise       TEXT    NOT NULL,
    value       DOUBLE PRECISION NOT NULL,
    cost_after  DOUBLE PRECISION NOT NULL,
    secure      INTEGER NOT NULL CHECK (secure IN (0, 1)),
    created_at  TEXT    NOT NULL,
    session     TEXT    NOT NULL,
    mac         TEXT    NOT NULL
)
    """,
    """
CREATE OR REPLACE FUNCTION dpgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'dpgate ledger table % is append-only', TG_TABLE_NAME; END $$
    """,
    "CREATE TRIGGER dpgate_records_append_only BEFORE UPDATE OR DELETE ON dpgate_records "
    "FOR EACH ROW EXECUTE FUNCTION dpgate_append_only()",
    "CREATE TRIGGER dpgate_meta_append_only BEFORE UPDATE OR DELETE ON dpgate_meta "
    "FOR EACH ROW EXECUTE FUNCTION dpgate_append_only()",
    "CREATE TRIGGER dpgate_records_no_truncate BEFORE TRUNCATE ON dpgate_records "
    "FOR EACH STATEMENT EXECUTE FUNCTION dpgate_append_only()",
    "CREATE TRIGGER dpgate_meta_no_truncate BEFORE TRUNCATE ON dpgate_meta "
    "FOR EACH STATEMENT EXECUTE FUNCTION dpgate_append_only()",
)

#: The provenance table of dpgate serve, as :data:`dpgate.ledger._sqlite.PROVENANCE_SCHEMA` in
#: PostgreSQL (created with the ledger's ``dpgate_append_only`` trigger function).
_PROVENANCE_SCHEMA_PG = (
    """
CREATE TABLE dpgate_provenance (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    analyst    TEXT    NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('charge', 'delivery')),
    record_id  BIGINT,
    epsilon    DOUBLE PRECISION NOT NULL,
    statement  TEXT    NOT NULL,
    source     TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    mac        TEXT
)
    """,
    "CREATE INDEX dpgate_provenance_analyst ON dpgate_provenance(analyst, kind)",
    "CREATE TRIGGER dpgate_provenance_append_only BEFORE UPDATE OR DELETE ON dpgate_provenance "
    "FOR EACH ROW EXECUTE FUNCTION dpgate_append_only()",
    "CREATE TRIGGER dpgate_provenance_no_truncate BEFORE TRUNCATE ON dpgate_provenance "
    "FOR EACH STATEMENT EXECUTE FUNCTION dpgate_append_only()",
)


def is_ledger_url(path: str) -> bool:
    """Whether ``path`` names a PostgreSQL ledger (``postgresql://``, ``postgres://``, ``postgresql+…://``)."""
    return path.lower().startswith(("postgresql://", "postgres://", "postgresql+"))


def _libpq_url(url: str) -> str:
    """``postgresql+psycopg://…`` (SQLAlchemy) → ``postgresql://…`` (libpq)."""
    scheme, sep, rest = url.partition("://")
    return "postgresql" + sep + rest if scheme.lower().startswith(("postgresql", "postgres")) else url


def _redacted(url: str) -> str:
    """The URL without its password, for messages and ``Ledger.path``."""
    from sqlalchemy.engine import make_url

    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # not parseable: say only where it points to
        return "postgresql://…"


class _PgConnection:
    """A psycopg connection (autocommit; transactions are explicit) with ``sqlite3``'s interface."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def _translated(self, exc: Exception) -> Exception:
        import psycopg

        if isinstance(exc, (psycopg.errors.LockNotAvailable, psycopg.errors.SerializationFailure,
                            psycopg.errors.DeadlockDetected)):
            return sqlite3.OperationalError(f"database is locked ({exc})")  # retried by SqliteStore.retry
        if isinstance(exc, psycopg.OperationalError):
            return sqlite3.OperationalError(str(exc))
        return sqlite3.DatabaseError(str(exc))

    def execute(self, sql: str, params: Any = None) -> Any:
        import psycopg

        try:
            cur = self.raw.execute(sql if params is None else sql.replace("?", "%s"), params)
        except psycopg.Error as exc:
            raise self._translated(exc) from exc
        if sql == "COMMIT" and cur.statusmessage != "COMMIT":
            # PostgreSQL answers COMMIT of an aborted transaction with ROLLBACK.
            raise sqlite3.OperationalError("the transaction was rolled back by the server, not committed")
        return cur

    def executemany(self, sql: str, rows: Any) -> None:
        import psycopg

        try:
            with self.raw.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), list(rows))
        except psycopg.Error as exc:
            raise self._translated(exc) from exc

    def close(self) -> None:
        import psycopg

        try:
            self.raw.close()
        except psycopg.Error:
            pass


class PostgresStore(SqliteStore):
    """The store of a :class:`~dpgate.ledger.core.Ledger` kept in PostgreSQL (see the module docstring).

    Open with ``Ledger.open("postgresql://…", fingerprint=…, budget=…, key=…)``
    (or ``Gateway(..., ledger="postgresql://…", ledger_key=…)``).  ``path`` is the URL
    without its password; the tables (``dpgate_meta``, ``dpgate_records``,
    ``dpgate_provenance``) live in the connection's current schema.
    """

    schema: tuple[str, ...] = _SCHEMA_PG
    provenance_schema: tuple[str, ...] = _PROVENANCE_SCHEMA_PG

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(_redacted(url), timeout)
        self._url = _libpq_url(url)

    def ledger_key(self, key: Any) -> tuple[bytes | None, str | None]:
        """The ledger's key and its file (``None`` for key bytes: then there is no anchor file, and
        a rollback is only detected by a running process).  ``key`` is required: a key file path
        shared by every gateway host (created with a new ledger if missing; its anchor is
        ``<key>.anchor``), or the key bytes.

        Raises:
            LedgerError: no key.
            InvalidArgumentType: a key that is neither bytes nor a path.
        """
        if key is None:
            raise LedgerError(
                f"The PostgreSQL ledger {self.path!r} needs ledger_key=: the path of a key file that every gateway "
                "host shares (created with a new ledger), or the key bytes. The key stays outside the database."
            )
        if isinstance(key, (bytes, bytearray)):
            return key_from_bytes(bytes(key)), None
        if isinstance(key, (str, os.PathLike)):
            key_path = os.path.abspath(os.fspath(key))
            return (read_key(key_path) if os.path.lexists(key_path) else None), key_path
        raise InvalidArgumentType(f"ledger_key must be bytes or a key file path, not {type(key).__name__}.")

    # -- database hooks of SqliteStore ---------------------------------------------
    def prepare(self, conn: Connection, where: str) -> None:
        """Nothing to prepare: the server's WAL and fsync make commits durable."""

    def replaced(self) -> bool:
        """A database is not a file: its replacement shows as records lost (the head and anchor checks)."""
        return False

    def _connect(self, target: str) -> Connection:
        import psycopg

        try:
            raw = psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, int(min(self.timeout, 60))),
                                  application_name="dpgate-ledger")
        except psycopg.Error as exc:
            raise LedgerError(f"Cannot connect to the PostgreSQL ledger {self.path!r}: {exc}") from None
        conn = _PgConnection(raw)
        conn.execute("SET synchronous_commit = on")
        with self._conns_guard:
            self._conns.append((os.getpid(), conn))
        return conn

    def _begin(self, conn: Connection) -> None:
        """``BEGIN``, then the ledger's advisory lock (waiting at most the ledger's timeout)."""
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        try:
            wait_ms = 0 if self.timeout == float("inf") else max(1, int(self.timeout * 1000))
            conn.execute(f"SET LOCAL lock_timeout = {min(wait_ms, 2**31 - 1)}")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_ID,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _process_lock(self) -> MemoryLock:
        return thread_lock_for(self._url)

    def _durable(self, conn: Connection, durable: bool) -> None:
        """``synchronous_commit`` on, or off: a commit then returns before the server flushed its WAL
        (it survives a crash of this process, not of the database server's machine)."""
        conn.execute("SET synchronous_commit = on" if durable else "SET synchronous_commit = off")

    @staticmethod
    def read_meta(conn: Connection, where: str) -> dict[str, str] | None:
        """The stored metadata, or ``None`` if the schema holds no ledger yet."""
        names = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_name IN ('dpgate_meta', 'dpgate_records')"
        ).fetchall()}
        if not names:
            return None
        if len(names) != 2:
            raise LedgerError(
                f"{where!r} holds only the table {sorted(names)} of a dpgate ledger; choose another database or "
                "schema, or restore the ledger."
            )
        return dict(conn.execute("SELECT key, value FROM dpgate_meta").fetchall())

    def ensure_provenance(self) -> None:
        """Create the provenance table if the ledger's schema has none (under the ledger's lock, so
        gateways starting together create it once)."""
        def create(conn: Connection) -> None:
            if conn.execute("SELECT to_regclass('dpgate_provenance')").fetchone()[0] is None:
                for ddl in self.provenance_schema:
                    conn.execute(ddl)
            else:  # a table of dpgate < 0.27: its rows stay unchained (a legacy prefix)
                conn.execute("ALTER TABLE dpgate_provenance ADD COLUMN IF NOT EXISTS mac TEXT")
        self.write(create)
