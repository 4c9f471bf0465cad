"""The ledger's records: their format, and appending them to the keyed chain (internal).

The guarantees are stated in :mod:`dpgate.ledger.core`; here are the
on-disk schema of a SQLite ledger, :class:`LedgerRecord`, and
:class:`LedgerTransaction`, which checks each appended record's fields and chains its
MAC (:func:`dpgate.ledger._key.chain_macs`) to the previous one;
:func:`extend_chain` verifies the same chain when records are read.  Both classes
are public as ``dpgate.ledger.LedgerRecord`` and ``dpgate.ledger.LedgerTransaction``.
A transaction is handed the ledger's key, session, budget and append hook, never the ledger.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from dpgate._validate import finite, nonnegative_finite
from dpgate.errors import DPGateInternalError, InvalidRequirement, LedgerError
from dpgate.ledger._key import Anchor, binding_mac, chain_macs, conversion_mac, header_mac
from dpgate.ledger._store import Connection, ProvenanceWriter, provenance_key

if TYPE_CHECKING:
    import threading

__all__ = ["COLUMNS", "FORMAT_VERSION", "NEW_LEDGER_HINT", "SCHEMA", "LedgerRecord", "LedgerTransaction",
           "check_header", "extend_chain", "new_header", "now", "record_from_row"]

FORMAT_VERSION = "2"
"""Version of the on-disk schema, stored in the ``format_version`` meta key.

Version 2 stores a keyed binding and a keyed hash chain; version 1 ledgers
stored an unkeyed digest of the data and are refused."""

BUDGET_TOLERANCE = 1e-9  # the ledger refuses cost_after > budget·(1 + tol) + tol

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS dpgate_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT
    """,
    """
CREATE TABLE IF NOT EXISTS dpgate_records (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT    NOT NULL,
    table_name  TEXT    NOT NULL,
    query       TEXT    NOT NULL,
    sql         TEXT    NOT NULL,
    alpha       REAL    NOT NULL,
    sensitivity REAL    NOT NULL,
    scale       REAL    NOT NULL,
    lattice     REAL    NOT NULL,
    noise       TEXT    NOT NULL,
    value       REAL    NOT NULL,
    cost_after  REAL    NOT NULL,
    secure      INTEGER NOT NULL CHECK (secure IN (0, 1)),
    created_at  TEXT    NOT NULL,
    session     TEXT    NOT NULL,
    mac         TEXT    NOT NULL
) STRICT
    """,
    """
CREATE TRIGGER IF NOT EXISTS dpgate_records_no_update BEFORE UPDATE ON dpgate_records
BEGIN SELECT RAISE(ABORT, 'dpgate ledger records are append-only'); END
    """,
    """
CREATE TRIGGER IF NOT EXISTS dpgate_records_no_delete BEFORE DELETE ON dpgate_records
BEGIN SELECT RAISE(ABORT, 'dpgate ledger records are append-only'); END
    """,
    """
CREATE TRIGGER IF NOT EXISTS dpgate_meta_no_update BEFORE UPDATE ON dpgate_meta
BEGIN SELECT RAISE(ABORT, 'dpgate ledger metadata is immutable'); END
    """,
    """
CREATE TRIGGER IF NOT EXISTS dpgate_meta_no_delete BEFORE DELETE ON dpgate_meta
BEGIN SELECT RAISE(ABORT, 'dpgate ledger metadata is immutable'); END
    """,
)

COLUMNS = (
    "id, kind, table_name, query, sql, alpha, sensitivity, scale, lattice, noise, "
    "value, cost_after, secure, created_at, session"
)


@dataclass(frozen=True)
class LedgerRecord:
    """One committed release.

    Attributes:
        id: position in commit order (1, 2, …; increasing with commit time).
        kind: ``"query"`` for a noisy measurement, or another gateway-defined
            kind such as ``"warm_start"``.
        table: the queried table.
        query: canonical JSON of the measured linear query (opaque here).
        sql: the user's SQL text, for audit.
        alpha: the privacy parameter ``α`` of the release.
        sensitivity: the L1 sensitivity ``S`` of the measured query.
        scale: the Laplace scale ``b = S / α``.
        lattice: the lattice step ``γ`` of the discrete noise.
        noise: the noise law, e.g. ``"discrete_laplace"``.
        value: the released noisy value.
        cost_after: the system cost after this release (computed by the gateway).
        secure: whether the noise came from a secure source (``False`` for ``seed=``).
        created_at: UTC timestamp, ISO 8601.
        session: identifier of the :class:`Ledger` object (process session)
            that appended the record.
    """

    id: int
    kind: str
    table: str
    query: str
    sql: str
    alpha: float
    sensitivity: float
    scale: float
    lattice: float
    noise: str
    value: float
    cost_after: float
    secure: bool
    created_at: str
    session: str


def record_from_row(row: tuple[Any, ...]) -> LedgerRecord:
    """Build a record from a row in ``COLUMNS`` order (the field order of LedgerRecord).

    STRICT columns guarantee the types, so the frozen instance's ``__dict__`` is
    filled directly: 3x faster than ``__init__`` when reading 10 000 records.
    """
    rec = object.__new__(LedgerRecord)
    values = rec.__dict__
    values.update(zip(FIELDS, row, strict=True))
    values["secure"] = bool(values["secure"])
    return rec


FIELDS = tuple(f.name for f in dataclasses.fields(LedgerRecord))
assert ", ".join(FIELDS).replace("table", "table_name", 1) == COLUMNS


class LedgerTransaction:
    """A handle on an open :meth:`Ledger.transaction`; use it only inside the block."""

    def __init__(self, conn: Connection, head: Anchor, *, key: bytes | None, session: str, budget: float,
                 hooks: threading.local) -> None:
        """``key``, ``session`` and ``budget``: the ledger's; ``hooks``: its thread's append hook
        (``on_append``, read at each append)."""
        self._key, self._session, self._budget, self._hooks = key, session, budget, hooks
        self._conn = conn
        self._provenance: ProvenanceWriter | None = None  # the append hook's view, made on first use
        self._open = True
        self.start = head[0]
        self.head = head  # the chain head including this transaction's appends

    def _check(self) -> None:
        if not self._open:
            raise LedgerError("This ledger transaction has ended; open a new one.")

    def records(self, since: int = 0) -> tuple[LedgerRecord, ...]:
        """Every record with ``id > since``, read under the write lock.

        Includes every other process's committed records and this transaction's
        own appends; no other writer can append until this transaction ends.

        Args:
            since: only records with a larger id (default: all).

        Returns:
            The records, ordered by id.
        """
        self._check()
        if isinstance(since, bool) or not isinstance(since, numbers.Integral):
            raise InvalidRequirement(f"since must be an int record id, not {since!r}.")
        if since >= self.head[0]:
            # The head is the ledger's last record: the transaction verified the chain up to the end
            # when it took the write lock, and since then only its own appends (in ``head``) were added.
            return ()
        # Verified up to the transaction's start; the rest are this transaction's own appends.
        rows = self._conn.execute(
            f"SELECT {COLUMNS} FROM dpgate_records WHERE id > ? ORDER BY id", (int(since),)
        ).fetchall()
        return tuple(record_from_row(r) for r in rows)

    def append(
        self,
        *,
        kind: str,
        table: str,
        query: str,
        sql: str,
        alpha: float,
        sensitivity: float,
        scale: float,
        lattice: float,
        noise: str,
        value: float,
        cost_after: float,
        secure: bool,
        session: str | None = None,
        created_at: str | None = None,
    ) -> LedgerRecord:
        """Append one release; it becomes durable when the transaction commits.

        Args:
            kind: ``"query"``, ``"warm_start"``, ….
            table: the queried table.
            query: canonical JSON of the measured query.
            sql: the user's SQL text.
            alpha: ``α`` ≥ 0.
            sensitivity: ``S`` ≥ 0.
            scale: Laplace scale ≥ 0.
            lattice: lattice step ≥ 0.
            noise: the noise law.
            value: the released value (finite).
            cost_after: the system cost after this release, ≥ 0 and at most
                the ledger's budget.
            secure: whether the noise source was secure.
            session: defaults to the ledger's :attr:`Ledger.session`.
            created_at: defaults to now (UTC ISO 8601).

        Returns:
            The record as stored, with its id.

        Raises:
            InvalidRequirement: if a field has the wrong type or is not finite.
            DPGateInternalError: if ``cost_after`` exceeds the ledger's budget
                (the gateway must refuse before it gets here).
        """
        return self.append_many([{
            "kind": kind, "table": table, "query": query, "sql": sql, "alpha": alpha, "sensitivity": sensitivity,
            "scale": scale, "lattice": lattice, "noise": noise, "value": value, "cost_after": cost_after,
            "secure": secure, "session": session, "created_at": created_at,
        }])[0]

    def append_many(self, entries: Sequence[Mapping[str, Any]]) -> list[LedgerRecord]:
        """Append several releases (a statement's), each a mapping of :meth:`append`'s arguments.

        The same records, MAC chain and checks as one :meth:`append` per entry, in order; every
        entry is checked before any is written, and the rows go in with one ``executemany``.
        They become durable together when the transaction commits.

        Args:
            entries: keyword arguments of :meth:`append`, one mapping per record.

        Returns:
            The records as stored, with their ids.

        Raises:
            InvalidRequirement, DPGateInternalError: as :meth:`append` (nothing is written).
        """
        self._check()
        if self._key is None:
            raise DPGateInternalError("a transaction was opened on a ledger without its key")
        defaults = {"session": self._session, "created_at": now()}  # one time for the records committed together
        rid, head = self.head
        rows = []
        for e in entries:
            rid += 1
            rows.append(self._row(rid, e, defaults))
        macs = chain_macs(self._key, head, rows)
        rows = [(*row, mac) for row, mac in zip(rows, macs, strict=True)]
        insert = f"INSERT INTO dpgate_records({COLUMNS}, mac) VALUES ({', '.join('?' * 16)})"
        hook = getattr(self._hooks, "on_append", None)
        if hook is None:
            self._conn.executemany(insert, rows)
        else:  # e.g. dpgate serve's per-analyst charge, in this same transaction, record by record
            if self._provenance is None:
                self._provenance = ProvenanceWriter(self._conn, provenance_key(self._key))
            for row in rows:
                self._conn.execute(insert, row)
                hook(self._provenance, record_from_row(row[:-1]), row[-1])
        if rows:
            self.head = (rid, macs[-1])
        return [record_from_row(r[:-1]) for r in rows]

    def _row(self, rid: int, entry: Mapping[str, Any], defaults: Mapping[str, str]) -> tuple[Any, ...]:
        """One checked record row in ``COLUMNS`` order, with id ``rid``, from :meth:`append`'s arguments
        (``defaults``: the session and time of those that give none)."""
        keys = entry.keys()
        if not _REQUIRED <= keys <= _ALLOWED:
            missing = [f for f in APPEND_FIELDS if f not in entry]
            unknown = sorted(set(entry) - _ALLOWED)
            raise InvalidRequirement(f"Ledger record fields: missing {missing}, unknown {unknown}.")
        kind, table, query, sql, alpha, sensitivity, scale, lattice, noise, value, cost_after, secure = _GET(entry)
        session, created_at = entry.get("session"), entry.get("created_at")
        session = defaults["session"] if session is None else session
        created_at = defaults["created_at"] if created_at is None else created_at
        texts = (kind, table, query, sql, noise, session, created_at)
        if tuple(map(type, texts)) != _TEXT_TYPES:  # else checked here field by field
            for name, v in zip(_TEXT_NAMES, texts, strict=True):
                if not isinstance(v, str):
                    raise InvalidRequirement(f"Ledger field {name!r} must be a str, not {type(v).__name__}.")
        if not kind:
            raise InvalidRequirement("Ledger field 'kind' must not be empty.")
        reals: tuple[Any, ...] = (alpha, sensitivity, scale, lattice, value, cost_after)
        # Finite floats (≥ 0 but the value) pass as they are (a finite sum has finite terms);
        # anything else is checked, and converted, field by field.
        if not (tuple(map(type, reals)) == _REAL_TYPES and -math.inf < sum(reals) < math.inf
                and min(alpha, sensitivity, scale, lattice, cost_after) >= 0.0):
            reals = tuple(check(x, name, error=InvalidRequirement)
                          for check, name, x in zip(_REAL_CHECKS, _REAL_NAMES, reals, strict=True))
        if not isinstance(secure, (bool, int)) or secure not in (0, 1):
            raise InvalidRequirement(f"Ledger field 'secure' must be a bool, not {secure!r}.")
        if reals[5] > self._budget * (1 + BUDGET_TOLERANCE) + BUDGET_TOLERANCE:
            raise DPGateInternalError(
                f"refusing to record a release with system cost {reals[5]!r} above the ledger's budget {self._budget!r}"
            )
        alpha, sensitivity, scale, lattice, value, cost_after = reals
        return (rid, kind, table, query, sql, alpha, sensitivity, scale, lattice, noise, value, cost_after,
                int(bool(secure)), created_at, session)  # fmt: skip


#: :meth:`LedgerTransaction.append`'s required arguments, in ``COLUMNS`` order.
APPEND_FIELDS = ("kind", "table", "query", "sql", "alpha", "sensitivity", "scale", "lattice", "noise", "value",
                  "cost_after", "secure")  # fmt: skip
_REQUIRED = frozenset(APPEND_FIELDS)
_ALLOWED = _REQUIRED | {"session", "created_at"}
_GET = operator.itemgetter(*APPEND_FIELDS)
_TEXT_NAMES = ("kind", "table", "query", "sql", "noise", "session", "created_at")
_TEXT_TYPES = (str,) * len(_TEXT_NAMES)
_REAL_TYPES = (float,) * 6
#: The real fields in ``COLUMNS`` order, with their checks (only the value may be negative).
_REAL_NAMES = tuple(f"Ledger field {n!r}" for n in ("alpha", "sensitivity", "scale", "lattice", "value", "cost_after"))
_REAL_CHECKS = (nonnegative_finite,) * 4 + (finite, nonnegative_finite)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


NEW_LEDGER_HINT = (
    "Refusing to continue, since that could give back spent budget. Restore the ledger (and its "
    "anchor) from a backup, or move them away and start a new ledger explicitly with new=True "
    "(Gateway(..., new_ledger=True))."
)


def extend_chain(key: bytes, head: Anchor, rows: Sequence[tuple[Any, ...]], where: str) -> Anchor:
    """The chain head after ``rows`` (``COLUMNS`` then ``mac``, in id order) beyond ``head``:
    each must be the next id and carry the MAC chained to the one before.

    Raises:
        LedgerError: a record was deleted, inserted or modified.
    """
    count, mac = head
    rows = [row for row in rows if row[0] > count]
    for row, expected in zip(rows, chain_macs(key, mac, [row[:-1] for row in rows]), strict=True):
        # ``expected`` chains to the computed MAC before it, which equals the stored one up to here.
        if row[0] != count + 1 or not hmac.compare_digest(row[-1], expected):
            raise LedgerError(
                f"The ledger {where!r} fails its integrity check at record {count + 1}: a record "
                f"was deleted, inserted or modified. {NEW_LEDGER_HINT}"
            )
        count, mac = count + 1, row[-1]
    return count, mac


def new_header(key: bytes, fingerprint: str, budget: float, privacy: str = "pure") -> dict[str, str]:
    """The metadata of a new ledger: format, keyed binding, budget, creation time, its accounting
    when it is zCDP (``privacy``, the budget then in ρ), and the header MAC that starts the chain."""
    meta = {"format_version": FORMAT_VERSION, "binding": binding_mac(key, fingerprint), "budget": repr(budget),
            "created_at": now(), **({"privacy": privacy} if privacy != "pure" else {})}
    meta["header_mac"] = header_mac(key, meta)
    return meta


def check_header(meta: dict[str, str], where: str, *, key: bytes | None, fingerprint: str | None,
                 budget: float, privacy: str = "pure", convert: bool = False) -> bool:
    """Refuse stored metadata of another format version, data source (with the key and a
    fingerprint), accounting (``privacy``: a ledger without one is pure ε), budget, or (with
    the key) a header whose MAC does not match.  ``convert``: a pure-ε ledger opened for zCDP is
    accepted, to be converted (returns True: the caller converts it, see :func:`conversion_header`).

    Raises:
        LedgerError: saying which, and what to do.
    """
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise LedgerError(
            f"The ledger {where!r} has format version {version!r}; this dpgate reads "
            f"version {FORMAT_VERSION!r}. Use a matching dpgate version or a new ledger path"
            + (" (version 1 ledgers stored an unkeyed digest of the data: archive and delete them)."
               if version == "1" else ".")
        )
    if key is not None and fingerprint is not None:
        if not hmac.compare_digest(meta.get("binding", ""), binding_mac(key, fingerprint)):
            raise LedgerError(
                f"The ledger {where!r} belongs to a different data source (or schema), or was "
                "created with another key. Its budget was spent on other data: open the gateway "
                "on the original data, schema and key, or use a new ledger path."
            )
    stored_privacy = meta.get("privacy", "pure")
    converting = convert and stored_privacy == "pure" and privacy == "zcdp"
    if stored_privacy != privacy and not converting:
        unit = {"pure": "ε", "zcdp": "ρ"}
        raise LedgerError(
            f"The ledger {where!r} keeps {stored_privacy!r} accounting (its budget {meta.get('budget')} is in "
            f"{unit.get(stored_privacy, '?')}), but privacy={privacy!r} was requested. A ledger's accounting "
            f"cannot change: open it with privacy={stored_privacy!r}, or use a new ledger path"
            + (", or convert it with convert_ledger=True (its ε-DP releases are then charged as ε²/2-zCDP, "
               f"and the ledger keeps ρ from then on, with budget={budget!r})."
               if stored_privacy == "pure" else ".")
        )
    try:
        stored_budget = float(meta.get("converted_budget", meta.get("budget", "nan")))
    except ValueError:
        stored_budget = math.nan
    if stored_budget != budget and not converting:
        raise LedgerError(
            f"The ledger {where!r} was created with budget {meta.get('budget')}, "
            f"but budget={budget!r} was requested. A ledger's budget cannot change: "
            f"pass budget={meta.get('budget')} or use a new ledger path."
        )
    if key is not None and not hmac.compare_digest(meta.get("header_mac", ""), header_mac(key, meta)):
        raise LedgerError(
            f"The header of the ledger {where!r} (its budget and binding) was modified, or the "
            f"ledger was created with another key. {NEW_LEDGER_HINT}"
        )
    if key is not None and "converted_budget" in meta and not hmac.compare_digest(
            meta.get("conversion_mac", ""), conversion_mac(key, meta)):
        raise LedgerError(f"The zCDP conversion of the ledger {where!r} (its ρ budget) was modified, or the "
                          f"ledger was created with another key. {NEW_LEDGER_HINT}")
    return converting


def conversion_header(key: bytes, meta: dict[str, str], budget: float, records: int) -> dict[str, str]:
    """The metadata rows that convert a pure-ε ledger to zCDP with ρ budget ``budget`` after its first
    ``records`` records (appended: the original header, and the chain that starts at it, stay as they are)."""
    rows = {"privacy": "zcdp", "converted_budget": repr(budget), "converted_at": str(records)}
    rows["conversion_mac"] = conversion_mac(key, {**meta, **rows})
    return rows
