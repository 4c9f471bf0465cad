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

The storage adapter presents a psycopg connection with the few methods of
``sqlite3.Connection`` the ledger uses (``?`` placeholders, ``sqlite3`` exception
classes), so the ledger's single error mapping and lock-retry logic apply as they are.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, cast

from dpgate.errors import InvalidArgumentType, LedgerError
from dpgate.ledger._key import key_from_bytes, read_key
from dpgate.ledger._lock import MemoryLock, thread_lock_for
from dpgate.ledger.core import Ledger

__all__ = ["PostgresLedger"]

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
            return sqlite3.OperationalError(f"database is locked ({exc})")  # retried by Ledger._retry
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


class PostgresLedger(Ledger):
    """A :class:`~dpgate.ledger.core.Ledger` stored in PostgreSQL (see the module docstring).

    Open with ``Ledger.open("postgresql://…", fingerprint=…, budget=…, key=…)``
    (or ``Gateway(..., ledger="postgresql://…", ledger_key=…)``).  ``path`` is the URL
    without its password.
    """

    _SCHEMA = _SCHEMA_PG
    _url = ""

    @classmethod
    def open_url(
        cls, url: str, *, fingerprint: str, budget: float, timeout: float, key: Any, new: bool
    ) -> PostgresLedger:
        """Open (creating if needed) the ledger in the database at ``url``.

        Args:
            url: ``postgresql://…`` or ``postgresql+psycopg://…``; the ledger's tables
                (``dpgate_meta``, ``dpgate_records``) live in the connection's current schema.
            fingerprint, budget, timeout, new: as for :meth:`Ledger.open`.
            key: required — a key file path shared by every gateway host (created with a
                new ledger if missing; its anchor is ``<key>.anchor``), or the key bytes
                (then there is no anchor file: a rollback is only detected by a running process).

        Raises:
            LedgerError: no key, the server is unreachable, or the ledger fails its checks.
        """
        if not isinstance(new, bool):
            raise InvalidArgumentType(f"new must be True or False, not {new!r}.")
        where = _redacted(url)
        if key is None:
            raise LedgerError(
                f"The PostgreSQL ledger {where!r} needs ledger_key=: the path of a key file that every gateway "
                "host shares (created with a new ledger), or the key bytes. The key stays outside the database."
            )
        key_path: str | None = None
        if isinstance(key, (bytes, bytearray)):
            secret: bytes | None = key_from_bytes(bytes(key))
        elif isinstance(key, (str, os.PathLike)):
            key_path = os.path.abspath(os.fspath(key))
            secret = read_key(key_path) if os.path.lexists(key_path) else None
        else:
            raise InvalidArgumentType(f"ledger_key must be bytes or a key file path, not {type(key).__name__}.")
        ledger = cls(where, float(budget), float(timeout), secret)
        ledger._url = _libpq_url(url)
        ledger._key_path = key_path
        ledger._anchor_path = None if key_path is None else key_path + ".anchor"
        return ledger._initialised(fingerprint, new=new)

    # -- storage hooks of Ledger ---------------------------------------------------
    def _prepare(self, conn: sqlite3.Connection, where: str) -> None:
        """Nothing to prepare: the server's WAL and fsync make commits durable."""

    def _connect(self, target: str) -> sqlite3.Connection:
        import psycopg

        try:
            raw = psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, int(min(self._timeout, 60))),
                                  application_name="dpgate-ledger")
        except psycopg.Error as exc:
            raise LedgerError(f"Cannot connect to the PostgreSQL ledger {self.path!r}: {exc}") from None
        conn = _PgConnection(raw)
        conn.execute("SET synchronous_commit = on")
        with self._conns_guard:
            self._conns.append((os.getpid(), cast(sqlite3.Connection, conn)))
        return cast(sqlite3.Connection, conn)

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN``, then the ledger's advisory lock (waiting at most the ledger's timeout)."""
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        try:
            wait_ms = 0 if self._timeout == float("inf") else max(1, int(self._timeout * 1000))
            conn.execute(f"SET LOCAL lock_timeout = {min(wait_ms, 2**31 - 1)}")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_ID,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _process_lock(self) -> MemoryLock:
        return thread_lock_for(self._url)

    @staticmethod
    def _read_meta(conn: sqlite3.Connection, where: str) -> dict[str, str] | None:
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
