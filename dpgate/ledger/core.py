"""Ledger: the durable, append-only, multi-process record of every release.

Why one module of about 530 lines: opening, binding to a data source, the key and anchor
checks and appending are the ledger's guarantee, stated and enforced in one place; the
record format, the stores and the locks are the package's other modules.

Every noisy answer dpgate releases is first appended here and committed
(fsync'd); only then may the gateway return it.  A crash at any instant can
therefore lose at most answers that were never shown, never budget that was.

Where the parts live: this module is the ``Ledger`` API — opening and binding, the
tamper checks, and the read-decide-append transaction.  The records' format,
:class:`LedgerTransaction`, the header and the keyed chain are in
:mod:`dpgate.ledger._records`; the SQLite storage (why SQLite; connections,
``BEGIN IMMEDIATE``, commit before release, rollback on any error) in
:mod:`dpgate.ledger._sqlite`; the writer locks in :mod:`dpgate.ledger._lock`; the
key, MACs and anchor files in :mod:`dpgate.ledger._key`.

Guarantees:

* Records are append-only: there is no update or delete API, and triggers make
  the database itself abort any ``UPDATE`` or ``DELETE`` of a record or of the
  metadata.
* Record ids increase in commit order (writers are serialised), so a reader
  that remembers the last id it saw misses nothing with
  ``records(since=last_id)``.
* A ledger is bound to one data source + schema and one total budget, stored at
  creation; opening it with different ones raises :class:`~dpgate.errors.LedgerError`.
  The binding is ``HMAC-SHA256(key, fingerprint)`` with a secret 32-byte key kept
  outside the ledger (``<path>.key``, mode 0o600, or the operator's ``key=``): a
  reader of the ledger file learns nothing about the data, and errors never print
  the fingerprint or the binding.
* Tamper evidence: every record carries a keyed MAC chained to the previous one
  and to the budget header, verified on open and on every read of new records;
  the chain head is copied after each commit to ``<path>.anchor`` next to the
  key.  An edited, deleted or inserted record, a changed header, a ledger behind
  its anchor (truncated, an older copy restored), a ledger file deleted or
  replaced under a running process, or a missing ledger whose anchor records
  releases is refused; a new ledger there needs ``new=True``.  A ledger *ahead*
  of its anchor (a crash between commit and anchor write) is accepted.  The key
  store is trusted: whoever can write both the ledger and the anchor can roll
  both back.
* Threads: each thread uses its own SQLite connection.  Writers first queue
  on a per-file lock (a thread lock, then ``flock`` on the sidecar file
  ``<path>-lock``) so waiting is prompt and one busy process cannot starve the
  others; ``BEGIN IMMEDIATE`` remains the guarantee.  After ``fork`` the child
  opens fresh connections and locks.

``path=None`` gives the same API backed by a private in-memory database
(not durable, not shared between processes).  A ``postgresql://`` URL gives the
same ledger stored in PostgreSQL, shared by gateways on several hosts
(:mod:`dpgate.ledger._postgres`): everything above holds with an advisory lock in
place of ``BEGIN IMMEDIATE``.  The ledger reaches its database only through its
store (:class:`~dpgate.ledger._store.LedgerStore`, :attr:`Ledger.store`), which also
keeps ``dpgate serve``'s per-analyst provenance next to the records.

Example:
    >>> with Ledger.open(None, fingerprint="demo", budget=1.0) as led:
    ...     with led.transaction() as tx:
    ...         spent = max((r.cost_after for r in tx.records()), default=0.0)
    ...         rec = tx.append(kind="query", table="t", query="{}", sql="SELECT 1",
    ...                         alpha=0.1, sensitivity=1.0, scale=10.0, lattice=0.0078125,
    ...                         noise="discrete_laplace", value=3.5,
    ...                         cost_after=spent + 0.1, secure=True)
    ...     [r.id for r in led.records()]
    [1]
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import numbers
import os
import pathlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from typing import Self

from dpgate._validate import positive_finite, real
from dpgate.errors import (
    DPGateInternalError,
    InvalidArgumentType,
    InvalidRequirement,
    LedgerError,
    map_exceptions,
)
from dpgate.ledger._key import Anchor, create_key_files, read_anchor, read_key, resolve_key, write_anchor
from dpgate.ledger._postgres import PostgresStore, is_ledger_url
from dpgate.ledger._records import (
    COLUMNS,
    FORMAT_VERSION,
    NEW_LEDGER_HINT,
    LedgerRecord,
    LedgerTransaction,
    check_header,
    conversion_header,
    extend_chain,
    new_header,
    record_from_row,
)
from dpgate.ledger._sqlite import SqliteStore
from dpgate.ledger._store import AppendHook, Connection, LedgerStore, provenance_key
from dpgate.plan.zcdp import check_privacy

__all__ = ["FORMAT_VERSION", "Ledger", "LedgerRecord", "LedgerTransaction"]

_DEFAULT_TIMEOUT = 60.0


class Ledger:
    """A durable, append-only, multi-process ledger of releases (see the module docstring).

    Use :meth:`Ledger.open`; do not call the constructor.

    Attributes:
        store: where the records are kept (a SQLite file or memory, or PostgreSQL).
        binding: the stored keyed MAC of the data source + schema fingerprint
            (reveals nothing about the data without the key).
        budget: the total privacy budget the ledger is bound to.
        session: a fresh random id for this ``Ledger`` object, stored in the
            records it appends.
    """

    def __init__(self, store: LedgerStore, budget: float, key: bytes | None, *, key_path: str | None,
                 anchor_path: str | None) -> None:
        self.store = store
        self.binding = ""
        self.budget = budget
        #: The accounting: ``"pure"`` (ε) or ``"zcdp"`` (ρ), the unit of ``budget`` and of ``cost_after``.
        self.privacy = "pure"
        self._convert = False  # Ledger.open(convert=True): a pure ledger opened for zCDP is converted
        self.session = uuid.uuid4().hex
        self._key = key  # None: opened for audit without the key (read-only, unverified)
        self._key_path = key_path  # where a missing key is created (None: in memory, or given as bytes)
        self._anchor_path = anchor_path  # None: no anchor (in memory, or a key given as bytes)
        self._local = threading.local()  # this thread's append hook
        self._head: Anchor = (0, "")  # the verified chain head (count, MAC); header MAC at 0
        self._head_guard = threading.Lock()
        # Records 1, 2, … as this process verified them, and their MACs (with the key only): a
        # record never changes once committed, so later reads fetch only the records after them.
        self._known: list[LedgerRecord] = []
        self._known_macs: list[str] = []

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        fingerprint: str,
        budget: float,
        timeout: float = _DEFAULT_TIMEOUT,
        key: bytes | str | os.PathLike[str] | None = None,
        new: bool = False,
        privacy: str = "pure",
        convert: bool = False,
    ) -> Ledger:
        """Open (creating if needed) the ledger at ``path``, bound to data and budget.

        Args:
            path: the SQLite file (created if missing; its directory must exist),
                ``None`` for a private in-memory ledger (with a fresh random key), or a
                ``postgresql://`` URL: the same ledger stored in PostgreSQL, shared by
                gateways on several hosts (``key`` is then required; see
                :mod:`dpgate.ledger._postgres`).
            fingerprint: digest of the data source + schema, computed by the
                gateway.  Secret: only ``HMAC(key, fingerprint)`` is stored, and a
                mismatch is reported without either value.
            budget: the total privacy budget, finite and > 0.  Stored on
                creation; must match on reopening.
            timeout: seconds to wait for the write lock before raising
                :class:`~dpgate.errors.LedgerError`.
            key: the secret key: bytes (≥ 16), or the path of a key file.  Default:
                ``<path>.key``, created with the ledger (mode 0o600).
            new: start a new ledger where a previous one was deleted: without it,
                a missing or empty ledger whose anchor (``<path>.anchor``) records
                committed releases is refused, since its budget would silently
                start again from zero.
            privacy: the accounting (``"pure"`` ε or ``"zcdp"`` ρ, the budget's unit).
                Stored on creation (a pure ledger stores none); must match on reopening.
            convert: with ``privacy="zcdp"``, convert a pure-ε ledger to zCDP with ρ budget
                ``budget``: its ε-DP releases are charged as ε²/2-zCDP from then on (recorded in
                its metadata, MAC'd; never undone).

        Returns:
            The open ledger.

        Raises:
            InvalidRequirement: if ``fingerprint``, ``budget`` or ``timeout`` is invalid.
            InvalidArgument: if ``key`` is malformed.
            LedgerError: if the file is not a dpgate ledger, has another format
                version, is bound to another data source or budget, fails its
                tamper checks, or its key file is missing or readable by others.
        """
        if not isinstance(fingerprint, str) or not fingerprint:
            raise InvalidRequirement("The ledger fingerprint must be a non-empty string.")
        budget = positive_finite(budget, "The budget", error=InvalidRequirement)
        privacy = check_privacy(privacy)
        if not isinstance(convert, bool):
            raise InvalidArgumentType(f"convert must be True or False, not {convert!r}.")
        # An infinite timeout (wait for ever) is allowed.
        if real(timeout, "The ledger timeout (seconds)", error=InvalidRequirement) <= 0:
            raise InvalidRequirement(f"The ledger timeout must be > 0 seconds, not {timeout!r}.")
        if isinstance(path, str) and is_ledger_url(path):  # a ledger shared by hosts
            if not isinstance(new, bool):
                raise InvalidArgumentType(f"new must be True or False, not {new!r}.")
            store = PostgresStore(path, float(timeout))
            secret, key_path = store.ledger_key(key)
            anchor = None if key_path is None else key_path + ".anchor"
            shared = cls(store, float(budget), secret, key_path=key_path, anchor_path=anchor)
            shared.privacy, shared._convert = privacy, convert is True
            return shared._initialised(fingerprint, new=new)
        resolved: str | None = None
        if path is not None:
            resolved = os.path.abspath(os.fspath(path))
            if not os.path.isdir(os.path.dirname(resolved)):
                raise LedgerError(
                    f"Cannot create the ledger {resolved!r}: its directory does not exist."
                )
        if not isinstance(new, bool):
            raise InvalidArgumentType(f"new must be True or False, not {new!r}.")
        secret = resolve_key(resolved, key)
        ledger = cls(SqliteStore(resolved, float(timeout)), float(budget), secret,
                     key_path=None if resolved is None else resolved + ".key",
                     anchor_path=None if resolved is None else resolved + ".anchor")
        ledger.privacy, ledger._convert = privacy, convert is True
        return ledger._initialised(fingerprint, new=new)

    @classmethod
    def open_existing(
        cls,
        path: str | os.PathLike[str],
        *,
        timeout: float = _DEFAULT_TIMEOUT,
        key: bytes | str | os.PathLike[str] | None = None,
    ) -> Ledger:
        """Open an existing ledger with the binding and budget it stores (for audit tools).

        A gateway must use :meth:`open` with its own fingerprint, so that a
        mismatch is detected; this is for reading a ledger without its data.
        With the key (``key``, or a readable ``<path>.key``) the chain and anchor
        are verified and the ledger can be written; without it the records are
        readable but unverified, and :meth:`transaction` is refused.

        Args:
            path: the SQLite file.
            timeout: seconds to wait for the write lock.
            key: as for :meth:`open`.

        Returns:
            The open ledger.

        Raises:
            LedgerError: if there is no ledger at ``path`` or it fails its checks.
        """
        where = os.path.abspath(os.fspath(path))
        if not os.path.isfile(where):
            raise LedgerError(f"There is no ledger at {where!r}.")
        with map_exceptions({sqlite3.DatabaseError: LedgerError}, f"{where!r} is not a dpgate ledger ({{exc}})."):
            con = sqlite3.connect(f"{pathlib.Path(where).as_uri()}?mode=ro", uri=True, timeout=timeout)
            try:
                meta = dict(con.execute("SELECT key, value FROM dpgate_meta"))
            finally:
                con.close()
        if "budget" not in meta:
            raise LedgerError(f"{where!r} is not a complete dpgate ledger (it has no budget).")
        try:
            budget = positive_finite(float(meta.get("converted_budget", meta["budget"])), "The stored budget",
                                     error=LedgerError)
        except ValueError:
            raise LedgerError(f"{where!r} stores an invalid budget {meta['budget']!r}.") from None
        secret: bytes | None
        try:
            secret = resolve_key(where, key)
        except LedgerError:
            if key is not None:
                raise
            secret = None  # audit without the key
        ledger = cls(SqliteStore(where, float(timeout)), budget, secret, key_path=where + ".key",
                     anchor_path=where + ".anchor")
        ledger.privacy = meta.get("privacy", "pure")
        return ledger._initialised(None, new=False)

    @property
    def meta(self) -> dict[str, str]:
        """The stored metadata: ``format_version``, ``binding``, ``budget``, ``created_at``, ``header_mac``."""
        return dict(self.store.read(lambda conn: conn.execute("SELECT key, value FROM dpgate_meta").fetchall()))

    @property
    def path(self) -> str | None:
        """The SQLite file (absolute), ``None`` in memory, or the PostgreSQL URL without its password."""
        return self.store.path

    def _initialised(self, fingerprint: str | None, *, new: bool) -> Self:
        """This ledger after :meth:`_initialise`; closed again if that fails."""
        try:
            self._initialise(fingerprint, new=new)
        except BaseException:
            self.close()
            raise
        return self

    def _initialise(self, fingerprint: str | None, *, new: bool) -> None:
        store = self.store
        conn = store.connection()
        where = self.path or "the in-memory ledger"
        with map_exceptions({sqlite3.DatabaseError: LedgerError}, f"Cannot open the ledger {where!r}: {{exc}}."):
            store.prepare(conn, where)
            # An existing ledger is checked without the write lock, so opening never
            # waits for another process's transaction; creating one takes the lock.
            meta = store.retry(lambda: store.read_meta(conn, where))
            if meta is None:
                if fingerprint is None:
                    raise LedgerError(f"{where!r} is not a complete dpgate ledger.")
                with store.write_locked(conn):
                    meta = store.read_meta(conn, where)
                    if meta is None:
                        self._create(conn, fingerprint, new=new)
                        return
            elif new:
                raise LedgerError(
                    f"new=True starts a ledger where none exists, but {where!r} is a ledger already. "
                    "Open it without new=True, or (to start over on a fresh budget) move it away first."
                )
            if self._key is None and fingerprint is not None and self._key_path is not None:
                # A process that created the ledger meanwhile made its key before the schema.
                self._key = read_key(self._key_path) if os.path.lexists(self._key_path) else None
            if self._key is None and fingerprint is not None:
                raise LedgerError(
                    f"The key file {self._key_path!r} of the ledger {where!r} is missing, so its binding "
                    "and integrity cannot be checked. Restore the key file (or pass the operator's key), "
                    "or move the ledger away and start a new one."
                )
            converting = self._check_meta(meta, where, fingerprint)
            with map_exceptions({sqlite3.OperationalError: LedgerError}, store.read_failed):
                store.retry(lambda: self._verified(conn, 0, check_anchor=True))
            if converting:
                self._converted(conn, where, fingerprint)

    def _converted(self, conn: Connection, where: str, fingerprint: str | None) -> None:
        """Under the write lock: append the zCDP conversion to a verified pure ledger's metadata
        (or check the one another process appended meanwhile)."""
        store = self.store
        if self._key is None:
            raise LedgerError(f"Converting the ledger {where!r} to zCDP needs its key.")
        with store.write_locked(conn):
            meta = store.read_meta(conn, where) or {}
            if "converted_budget" not in meta:
                count = len(self._verified(conn, 0))
                rows = conversion_header(self._key, meta, self.budget, count)
                conn.executemany("INSERT INTO dpgate_meta(key, value) VALUES (?, ?)", list(rows.items()))
                return
        self._check_meta(meta, where, fingerprint)

    def _create(self, conn: Connection, fingerprint: str, *, new: bool) -> None:
        """Under the write lock, in an empty database: write the schema and the budget header."""
        where = self.path or "the in-memory ledger"
        if self._key is None:
            if self._key_path is None or self._anchor_path is None:
                raise DPGateInternalError("an in-memory ledger always has a key")
            self._key = create_key_files(self._key_path, self._anchor_path)
        if self._anchor_path is not None:
            anchor = read_anchor(self._anchor_path)
            if anchor is not None and anchor[0] > 0 and not new:
                raise LedgerError(
                    f"The ledger {where!r} is missing or empty, but its anchor {self._anchor_path!r} says "
                    f"{anchor[0]} releases were committed to it: it was deleted, truncated or replaced, "
                    "and its spent budget would silently start again from zero. Restore the ledger file, "
                    "or start a new ledger explicitly with new=True (Gateway(..., new_ledger=True))."
                )
            if anchor is None or anchor[0] > 0:  # an operator's key has no anchor yet; new=True resets it
                write_anchor(self._anchor_path, (0, ""), durable=True)
            if self.provenance_anchor is not None and os.path.lexists(self.provenance_anchor):
                write_anchor(self.provenance_anchor, (0, ""), durable=True)  # a new ledger's provenance is empty
        for statement in self.store.schema:  # not executescript(): it would COMMIT first
            conn.execute(statement)
        meta = new_header(self._key, fingerprint, self.budget, self.privacy)
        conn.executemany("INSERT INTO dpgate_meta(key, value) VALUES (?, ?)", list(meta.items()))
        self.binding = meta["binding"]
        self._head = (0, meta["header_mac"])

    def _check_meta(self, meta: dict[str, str], where: str, fingerprint: str | None) -> bool:
        """Check the stored metadata; True when a pure ledger is to be converted to zCDP."""
        converting = check_header(meta, where, key=self._key, fingerprint=fingerprint, budget=self.budget,
                                  privacy=self.privacy, convert=self._convert)
        self.binding = meta.get("binding", "")
        if self._key is not None:
            with self._head_guard:
                if self._head[0] == 0:
                    self._head = (0, meta["header_mac"])
        return converting

    # -- tamper evidence ---------------------------------------------------------

    def _verified(self, conn: Connection, since: int, *, check_anchor: bool = False) -> tuple[LedgerRecord, ...]:
        """The records with ``id > since``, after checking the chain up to the last one.

        Records beyond the verified head are checked against their MACs; the head
        record must still be there unchanged (no truncation or rollback under a
        running process), and the file must be the one opened (not deleted or
        replaced).  With ``check_anchor``, the ledger must also reach the anchor.
        Records this process read before are returned as it verified them, not read again.
        """
        if isinstance(since, bool) or not isinstance(since, numbers.Integral):
            raise InvalidRequirement(f"since must be an int record id, not {since!r}.")
        where = self.path or "the in-memory ledger"
        if self.store.replaced():
            raise LedgerError(
                f"The ledger file {where!r} was deleted or replaced while this process was using it; "
                f"nothing more is answered from it. {NEW_LEDGER_HINT}"
            )
        if self._key is None:  # audit without the key: nothing to verify against
            rows = conn.execute(f"SELECT {COLUMNS} FROM dpgate_records WHERE id > ? ORDER BY id",
                                (int(since),)).fetchall()
            return tuple(record_from_row(r) for r in rows)
        with self._head_guard:
            (count, mac), known = self._head, len(self._known)
        rows = conn.execute(
            f"SELECT {COLUMNS}, mac FROM dpgate_records WHERE id > ? ORDER BY id", (min(int(since), known),)
        ).fetchall()
        head = conn.execute("SELECT mac FROM dpgate_records WHERE id = ?", (count,)).fetchone()
        if count > 0 and (head is None or head[0] != mac):
            raise LedgerError(
                f"The ledger {where!r} lost or changed records that this process had already "
                f"verified (it was truncated, rolled back or edited). {NEW_LEDGER_HINT}"
            )
        count, mac = extend_chain(self._key, (count, mac), rows, where)
        with self._head_guard:
            if count > self._head[0]:
                self._head = (count, mac)
            # Rows beyond the known ones (ids are consecutive): verified just now, or this process's
            # own commits up to the head (as before, only the head record is re-checked for those).
            fresh = [r for r in rows if r[0] > len(self._known)]
            self._known.extend(record_from_row(r[:-1]) for r in fresh)
            self._known_macs.extend(r[-1] for r in fresh)
            found = tuple(self._known[max(int(since), 0):count]) if since < count else ()
        if check_anchor:
            self._check_anchor(conn, where, count)
        return found

    def chain_mac(self, count: int) -> str | None:
        """The MAC of record ``count`` as this process verified it (it commits to records 1 … ``count``
        under the ledger's key), or ``None`` when this process has not read that far."""
        with self._head_guard:
            return self._known_macs[count - 1] if 0 < count <= len(self._known_macs) else None

    def _check_anchor(self, conn: Connection, where: str, count: int) -> None:
        if self._anchor_path is None:  # in memory: nothing outlives the process
            return
        anchor = read_anchor(self._anchor_path)
        if anchor is None:
            raise LedgerError(
                f"The anchor {self._anchor_path!r} of the ledger {where!r} is missing, so a rolled-back "
                "copy of the ledger could not be detected. Restore it from a backup, or move the ledger "
                "and its key away and start a new ledger."
            )
        n, mac = anchor
        if n == 0:
            return
        row = conn.execute("SELECT mac FROM dpgate_records WHERE id = ?", (n,)).fetchone()
        if n > count or row is None or row[0] != mac:
            raise LedgerError(
                f"The ledger {where!r} is behind its anchor: {n} releases were committed, but the ledger "
                f"holds {count} (or different ones). It was truncated or replaced by an older copy, which "
                f"would silently give back spent budget. {NEW_LEDGER_HINT}"
            )

    def _advance_anchor(self, head: Anchor) -> None:
        """After a commit, under the write lock: record the new head next to the key."""
        if self._anchor_path is None:
            return
        # Best effort: a commit whose anchor write fails leaves the ledger *ahead* of
        # its anchor, which is accepted; the release itself is already durable.
        with contextlib.suppress(OSError):
            write_anchor(self._anchor_path, head)

    # -- public API ------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[LedgerTransaction]:
        """Serialise a read-decide-append step against every other writer.

        Takes the write lock (``BEGIN IMMEDIATE``; waits up to the timeout),
        yields a :class:`LedgerTransaction` whose :meth:`~LedgerTransaction.records`
        sees every committed record of every process, commits (fsync) on normal
        exit and rolls back on an exception.  Nothing appended is visible to other
        connections before the commit.  Transactions do not nest.

        Yields:
            The transaction handle, valid only inside the ``with`` block and
            only in the calling thread.

        Raises:
            LedgerError: on timeout, a nested transaction, or a failed commit.
        """
        if self._key is None:
            raise LedgerError(
                f"The ledger {self.path!r} was opened for audit without its key; it cannot be written."
            )
        conn = self.store.connection()
        box: list[LedgerTransaction] = []

        def committed() -> None:
            with self._head_guard:
                if box[0].head[0] > self._head[0]:
                    self._head = box[0].head
            if box[0].head[0] > box[0].start:
                self._advance_anchor(box[0].head)
            charged = box[0]._provenance.last_charge if box[0]._provenance is not None else None
            if charged is not None and self.provenance_anchor is not None:
                with contextlib.suppress(OSError):  # best effort, as the records' anchor
                    write_anchor(self.provenance_anchor, charged)

        with self.store.write_locked(conn, committed):  # in memory, the lock also guards the one connection
            with map_exceptions({sqlite3.OperationalError: LedgerError}, self.store.read_failed):
                self._verified(conn, 2**62)
            tx = LedgerTransaction(conn, self._head, key=self._key, session=self.session, budget=self.budget,
                                   hooks=self._local)
            box.append(tx)
            try:
                yield tx
            finally:
                tx._open = False

    def records(self, since: int = 0) -> tuple[LedgerRecord, ...]:
        """The committed records with ``id > since``, in commit order (no write lock).

        A consistent snapshot; records committed later by other processes are
        not included.  For a spend decision use :meth:`LedgerTransaction.records`.

        Args:
            since: only records with a larger id (default: all).

        Returns:
            The records, ordered by id.
        """
        found: tuple[LedgerRecord, ...] = self.store.read(lambda conn: self._verified(conn, since))
        return found

    # -- the append hook (dpgate serve's provenance) ------------------------------------

    @contextlib.contextmanager
    def on_append(self, hook: AppendHook) -> Iterator[None]:
        """While the block runs, call ``hook(provenance, record, mac)`` in this thread after
        each record a transaction appends, inside the same transaction: rows the hook
        writes through ``provenance`` (:class:`~dpgate.ledger._store.ProvenanceWriter`) commit or
        roll back with the record, and an exception it raises rolls the whole transaction back
        (nothing is released)."""
        previous = getattr(self._local, "on_append", None)
        self._local.on_append = hook
        try:
            yield
        finally:
            self._local.on_append = previous

    @property
    def provenance_anchor(self) -> str | None:
        """Where the last charge of ``dpgate serve``'s provenance is anchored (``(row id, MAC)``, next
        to the records' anchor), so that charges deleted from the end are noticed after a restart."""
        return None if self._anchor_path is None else self._anchor_path + "-provenance"

    def provenance_key(self) -> bytes:
        """The key of ``dpgate serve``'s provenance MACs, derived from the ledger's key
        (:func:`~dpgate.ledger._store.provenance_key`)."""
        if self._key is None:
            raise LedgerError(f"The ledger {self.path!r} was opened without its key; its provenance cannot "
                              "be verified or written.")
        return provenance_key(self._key)

    def derived_key(self, purpose: bytes) -> bytes:
        """``HMAC-SHA256(key, purpose)``: a secret for another use (e.g. the order of a privacy
        unit's rows, :mod:`dpgate.release._bounding`), the same wherever this ledger's key is."""
        if self._key is None:
            raise LedgerError(f"The ledger {self.path!r} was opened without its key; it cannot serve a gateway.")
        return hmac.new(self._key, purpose, hashlib.sha256).digest()

    def close(self) -> None:
        """Close every connection this ledger opened in this process (idempotent)."""
        self.store.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.store.closed

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.path or "in memory"
        return f"<Ledger {where} budget={self.budget!r}>"
