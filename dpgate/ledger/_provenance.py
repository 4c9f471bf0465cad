"""Per-analyst provenance and budget caps, kept in the ledger's own database (SQLite or PostgreSQL).

Table ``dpgate_provenance`` (append-only, like the records) holds two kinds of row:

* ``charge``: written by a hook *inside the release's own ledger transaction*
  (:meth:`dpgate.ledger.core.Ledger.on_append`): which analyst a fresh release
  (``record_id``) was made for, and the ε it cost them.  The hook first checks the
  analyst's cap (their charges, read under the ledger's write lock, so several server
  processes — on several hosts, with a PostgreSQL ledger — cannot overspend a cap together
  either); over the cap it raises :class:`~dpgate.errors.BudgetExhausted`, which rolls the
  whole transaction back: nothing is recorded and nothing is released.  This check is the
  authoritative one; the server also refuses *before* running a statement that needs a
  fresh release when nothing is left of the cap, so that such a refusal reads no data.
* ``delivery``: one per answered statement, committed before the answer is
  sent (not fsync'd: it survives a crash of the server, not a power loss; it
  spends nothing): which analyst received which statement's answers (a SHA-256
  of the statement, never its values), from where (``history``, ``fresh``,
  ``mixed``) and the ε charged to them for it.

What an analyst is charged: the per-cell accounting of the gateway (Xiao & Xiong (2012),
Theorem 5.5, :mod:`dpgate.plan.accounting`) over *the releases made for them*: per table,
``k · max_j B^a_j`` with ``B^a_j = Σ (α_i/S_i)|q_ij|`` summed over their releases only, on
the same cost atoms as the global accounting (:meth:`dpgate.plan.state.TableState.record_costs`),
priced from each release's ledger record (query, α, S).  So every fresh release costs the
analyst it was made for its own per-cell increase — a cap of 0 allows no fresh release at all
— whatever others released on the same cells; answers from history stay free for everyone
(post-processing).  ``B^a_j ≤ B_j``, so an analyst's charge never exceeds the global cost.
A charge row's ``epsilon`` is the increase of that analyst's charge it caused.  The analyst's
costs are kept per process and brought up to date incrementally from the rows not yet seen.

Tamper evidence: every row carries a MAC under a key derived from the ledger's
(:func:`~dpgate.ledger._store.provenance_key`), chained to the previous row, and a charge's MAC
also covers the MAC of the ledger record it charges.  The rows are verified whenever caps
are read (the cap check, ``SHOW dpgate.budget``, ``SHOW dpgate.history``); this process also
remembers the last row it verified, so rows deleted under a running server are noticed.  An
edited, deleted, inserted or reordered row is refused with :class:`~dpgate.errors.LedgerError`.
Rows written before provenance was chained (no MAC) are accepted only as a leading prefix.

The table and its statements belong to the ledger's store
(:class:`~dpgate.ledger._store.LedgerStore`, :attr:`dpgate.ledger.core.Ledger.store`); this
module holds the rules: what is charged, when a cap refuses, and the refusal's words.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.errors import Error, LedgerError
from dpgate.ledger._key import read_anchor
from dpgate.ledger._store import AppendedRecord, ProvenanceRow, ProvenanceWriter, provenance_mac
from dpgate.ledger.core import Ledger
from dpgate.plan.accounting import release_units, to_epsilon
from dpgate.plan.budget import exhausted, fits
from dpgate.plan.state import RecordedRelease, TableState
from dpgate.schema.domains import Schema

__all__ = ["ensure_table", "charging", "record_delivery", "analyst_spent", "analyst_quote", "analyst_history",
           "statement_hash"]

#: A release as an analyst is charged for it: its table, query (its ledger JSON, or the query itself
#: when it is only being quoted), α and S.
_Release = tuple[str, "str | LinearQuery", float, float]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def statement_hash(sql: str, params: Any = None) -> str:
    """A short SHA-256 of the statement text and its parameters (for logs and provenance)."""
    bound = tuple(params) if params else ()  # the same for both protocols: () when nothing is bound
    return hashlib.sha256(f"{sql}\x00{bound!r}".encode()).hexdigest()[:16]


def ensure_table(ledger: Ledger) -> None:
    """Create the provenance table in the ledger's database if it is not there yet."""
    ledger.store.ensure_provenance()


class _AnalystCosts:
    """The per-cell costs of the releases made for one analyst (see the module docstring).

    Releases are kept ``pending`` until a schema prices them (:meth:`units`): per table, on
    the cost atoms of a :class:`TableState` that records only costs; a release whose table or
    query the schema does not know (a ledger written by hand) is charged ``k·α`` (its ``α``
    bounds its per-cell cost; ``k``, :func:`_rows_per_person`, the rows of a person it may see).
    ``zcdp``: the ledger counts ρ (``(kα)²/2`` for an unpriced release, per-cell ρ otherwise).
    """

    def __init__(self, zcdp: bool = False) -> None:
        self.zcdp = zcdp
        self.tables: dict[str, TableState] = {}
        self.pending: list[_Release] = []
        self.unpriced = 0  # units charged α each (releases outside the schema)

    def copy(self) -> _AnalystCosts:
        out = _AnalystCosts(self.zcdp)
        out.tables = {name: state.refined([], isolate=True) for name, state in self.tables.items()}
        out.pending, out.unpriced = list(self.pending), self.unpriced
        return out

    def units(self, schema: Schema | None) -> int:
        """The analyst's charge, in units of ``2^-50``: Σ over tables of ``k · max_j B^a_j``."""
        runs: dict[str, list[RecordedRelease]] = {}
        for table, text, alpha, sensitivity in self.pending:
            try:
                state = None if schema is None else self._state(schema, table)
                query = text if isinstance(text, LinearQuery) else LinearQuery.from_json(text)
            except (Error, ValueError, KeyError, TypeError):
                state = None
            if state is None:  # a release outside the schema (or with none given): k·α on every cell
                k = _rows_per_person(schema, table)
                self.unpriced += (k**2 if self.zcdp else k) * int(release_units(np.ones(1), alpha, 1.0, zcdp=self.zcdp)[0])
                continue
            runs.setdefault(state.table.name.lower(), []).append(RecordedRelease(0, query, 0.0, 0.0, 0.0, alpha,
                                                                                  sensitivity))
        for name, items in runs.items():
            self.tables[name].record_costs(items)
        self.pending = []
        return self.unpriced + sum(s.costs.charge_units for s in self.tables.values())

    def _state(self, schema: Schema, table: str) -> TableState:
        t = schema.table(table)
        found = self.tables.get(t.name.lower())
        if found is None:
            found = self.tables[t.name.lower()] = TableState.new(t, max_atoms=1, zcdp=self.zcdp)
        return found


def _rows_per_person(schema: Schema | None, table: str) -> int:
    """The factor of an unpriced release's charge: ``table``'s declared rows per person, or the
    largest any table declares when it is unknown (never an under-count); 1 without a schema."""
    if schema is None:
        return 1
    bounds = {t.name.lower(): t.max_rows_per_unit or 1 for t in schema.tables}
    return bounds.get(str(table).lower(), max(bounds.values(), default=1))


class _Verified:
    """One process's verified view of a ledger's provenance: the last row checked, and per
    analyst the releases charged to them (guarded by ``lock``)."""

    def __init__(self, zcdp: bool = False) -> None:
        self.zcdp = zcdp  # the ledger counts ρ
        self.lock = threading.Lock()
        self.head: tuple[int, str] = (0, "")  # (id, MAC) of the last verified row
        self.chained = False  # whether a MAC'd row was seen (unchained rows may only come before)
        self.analysts: dict[str, _AnalystCosts] = {}

    def absorb(self, where: str, key: bytes, head_mac: str | None, rows: Sequence[Any],
               anchor: tuple[int, str] | None = None) -> None:
        """Check the rows after the head (and that the head row is unchanged), then take them in;
        ``anchor``: the last charge committed (``(row id, MAC)``), which must be among them or before."""
        row_id, mac = self.head
        if anchor is not None and anchor[0] > row_id and (not rows or rows[-1][0] < anchor[0]):
            raise _tampered(where, f"the charges up to row {anchor[0]} (its anchor) are gone")
        if row_id > 0 and (head_mac is None or not hmac.compare_digest(head_mac, mac)):
            raise _tampered(where, f"row {row_id}, verified before, was deleted or changed")
        chained = self.chained
        taken: list[tuple[str, _Release]] = []
        for row in rows:
            (rid, analyst, kind, record_id, epsilon, statement, source, created_at, row_mac, record_mac, table,
             query, alpha, sensitivity) = row
            if row_mac is None:
                if chained:
                    raise _tampered(where, f"row {rid} has no MAC")
            else:
                values = (analyst, kind, record_id, float(epsilon), statement, source, created_at)
                expected = provenance_mac(key, mac, values, record_mac if kind == "charge" else None)
                if not hmac.compare_digest(str(row_mac), expected):
                    raise _tampered(where, f"row {rid} does not match its MAC (it, the row before it or the "
                                           "release it charges was edited, deleted or inserted)")
                mac, chained = str(row_mac), True
            if anchor is not None and rid == anchor[0] and not hmac.compare_digest(mac, anchor[1]):
                raise _tampered(where, f"row {rid} is not the charge its anchor records")
            if kind == "charge":
                if table is None:
                    raise _tampered(where, f"row {rid} charges the release {record_id}, which is not in the ledger")
                taken.append((analyst, (table, query, float(alpha), float(sensitivity))))
            row_id = rid
        for analyst, release in taken:
            self.analysts.setdefault(analyst, _AnalystCosts(self.zcdp)).pending.append(release)
        self.head, self.chained = (row_id, mac), chained

    def costs(self, analyst: str) -> _AnalystCosts:
        return self.analysts.setdefault(analyst, _AnalystCosts(self.zcdp))


def _tampered(where: str, what: str) -> LedgerError:
    return LedgerError(
        f"The provenance of the ledger {where!r} was tampered with: {what}. Analysts' caps cannot be trusted, "
        "so none is read; restore the ledger's database from a backup."
    )


_VERIFIED: weakref.WeakKeyDictionary[Ledger, _Verified] = weakref.WeakKeyDictionary()
_VERIFIED_GUARD = threading.Lock()


def _verified(ledger: Ledger) -> _Verified:
    with _VERIFIED_GUARD:
        found = _VERIFIED.get(ledger)
        if found is None:
            found = _VERIFIED[ledger] = _Verified(ledger.privacy == "zcdp")
        return found


def _anchor(ledger: Ledger) -> tuple[int, str] | None:
    path = ledger.provenance_anchor
    return None if path is None else read_anchor(path)


def _read(ledger: Ledger, view: _Verified) -> None:
    """Under ``view.lock``: take in the committed rows this process has not verified yet."""
    anchor = _anchor(ledger)  # read first: a charge committed after it is among the rows read next
    head_mac, rows = ledger.store.provenance_rows(view.head[0])
    view.absorb(ledger.path or "in memory", ledger.provenance_key(), head_mac, rows, anchor)


@contextmanager
def charging(ledger: Ledger, analyst: str, cap: float, statement: str,
             schema: Schema | None = None) -> Iterator[list[float]]:
    """Within the block, every release this thread records is charged to ``analyst`` (its
    per-cell increase of their charge: see the module docstring; ``schema`` prices it) in the
    same ledger transaction, and refused (rolled back) if it would take the analyst's charge
    above ``cap`` — or if ``cap`` is 0.  Yields the list the charges are appended to."""
    charged: list[float] = []
    view = _verified(ledger)
    key = ledger.provenance_key()
    # The analyst's costs with this transaction's releases, carried from one record of a statement
    # to the next in the same transaction (a GROUP BY appends many); verified afresh otherwise.
    carried: dict[str, Any] = {"tx": None, "costs": None}

    def hook(provenance: ProvenanceWriter, record: AppendedRecord, mac: str) -> None:
        if carried["tx"] is provenance:
            costs = carried["costs"]
        else:
            with view.lock:
                if not provenance.wrote:  # else its reads would see its own uncommitted rows
                    head = view.head[0]
                    view.absorb(ledger.path or "in memory", key, provenance.mac_of(head) if head else "",
                                provenance.rows_after(head), _anchor(ledger))
                view.costs(analyst).units(schema)  # priced once here, not in every copy
                costs = view.costs(analyst).copy()
        before = costs.units(schema)
        costs.pending.append((record.table, record.query, float(record.alpha), float(record.sensitivity)))
        after = costs.units(schema)
        spent, delta = to_epsilon(before), to_epsilon(after) - to_epsilon(before)
        if cap <= 0.0 or not fits(spent, delta, cap):
            raise exhausted(delta, spent, cap, what="Answering this statement", purpose=" more for its next release",
                            analyst=analyst, hint=" Nothing was spent.", unit="ρ" if ledger.privacy == "zcdp" else "ε")
        provenance.add(ProvenanceRow(analyst, "charge", record.id, delta, statement, "fresh", _now()), mac)
        carried.update(tx=provenance, costs=costs)
        charged.append(delta)

    with ledger.on_append(hook):
        yield charged


def record_delivery(ledger: Ledger, analyst: str, statement: str, source: str, epsilon: float) -> None:
    """Record, before the answer is sent, that ``analyst`` received the answers of ``statement``.

    Committed without an fsync (it survives a crash of the server process, not a power loss):
    a delivery spends nothing — the ε of a fresh answer is in its charge rows, fsync'd with
    the release itself — and an fsync per free answer would cost more than answering it.
    """
    ledger.store.add_provenance(ProvenanceRow(analyst, "delivery", None, float(epsilon), statement, source, _now()),
                                fsync=False, key=ledger.provenance_key())


def analyst_spent(ledger: Ledger, analyst: str, schema: Schema | None = None) -> float:
    """ε charged to ``analyst`` so far (committed charges, verified; ``schema`` prices them)."""
    view = _verified(ledger)
    with view.lock:
        _read(ledger, view)
        return to_epsilon(view.costs(analyst).units(schema))


def analyst_quote(ledger: Ledger, analyst: str, schema: Schema, table: str,
                  releases: Sequence[tuple[LinearQuery, float]]) -> tuple[float, float]:
    """``(spent, needed)``: what ``analyst`` was charged so far, and what ``releases`` ``(query, α)``
    of ``table`` would add to it (their per-cell increase of the analyst's charge), priced on a
    copy of the analyst's costs: for refusing a statement before it reads data."""
    view = _verified(ledger)
    with view.lock:
        _read(ledger, view)
        mine = view.costs(analyst)
        before = mine.units(schema)
        trial = mine.copy()
    trial.pending.extend((table, q, float(alpha), float(q.sensitivity)) for q, alpha in releases)
    return to_epsilon(before), to_epsilon(trial.units(schema)) - to_epsilon(before)


def analyst_history(ledger: Ledger, analyst: str) -> list[tuple[Any, ...]]:
    """The analyst's provenance rows: ``(id, created_at, kind, statement, source, epsilon, record_id)``,
    after verifying the rows."""
    view = _verified(ledger)
    with view.lock:
        _read(ledger, view)
    return ledger.store.analyst_history(analyst)
