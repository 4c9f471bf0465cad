"""A gateway's released history, kept in step with its ledger.

The ledger is the truth: every release is a record there before its value leaves.
:class:`LedgerHistory` holds one :class:`~dpgate.plan.state.TableState` per table and
brings it up to date with records it has not applied (other processes' releases,
or a re-opened ledger), from the ledger's verified checkpoint when there is one
(``dpgate.ledger._checkpoint``).  A statement this gateway recorded itself is applied from
its :class:`~dpgate.plan.plan.Plan` (:meth:`LedgerHistory.applied`): by installing the plan's
planning copy, which holds exactly what applying its records would give.

Local histories.  A table's inference atoms are the product of every cut its held queries
make, so a session of GROUP BYs over different columns reaches their limit (``max_atoms``)
early; a statement beyond it would be answered from its exact repeats only.  Such a
statement is planned instead on a *local history* (:meth:`LedgerHistory.planning_state`):
the releases of the statements whose columns all lie among its own, replayed for inference
only, with the table's per-cell costs (every release, exactly).  Estimating from part of the
history is unbiased with an exact error law; which releases take part depends only on the
statements' columns, never on data.  A local plan is never installed as the table's state:
its records are applied like any other (:meth:`LedgerHistory.sync`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dpgate._version import __version__
from dpgate.compile.query import LinearQuery
from dpgate.ledger import _checkpoint
from dpgate.ledger._runs import KeptRelease, kept, released
from dpgate.plan.state import RecordedCharges, RecordedRelease, TableState
from dpgate.release._gaussian import GAUSSIAN_NOISE
from dpgate.schema.domains import Schema

if TYPE_CHECKING:
    from dpgate.ledger.core import Ledger, LedgerRecord
    from dpgate.plan.plan import Plan

__all__ = ["LedgerHistory", "collector_paused"]

#: A gateway that replays at least this many ledger records on opening checkpoints its state
#: (``dpgate.ledger._checkpoint``); closing it checkpoints whatever it added.
CHECKPOINT_AFTER = 64
#: Layout of the checkpointed inference state (a checkpoint of another layout is replayed).
STATE_LAYOUT = 8  # 8: wide releases of the runs kept by their JSON (ledger._runs); 7: Gaussian releases (zCDP) marked in the inference state; 6: statement runs kept for local histories; 5: cost atoms in blocks (plan.cost_grid)
#: Local histories kept, the most recently used ones (:meth:`LedgerHistory.planning_state`).
_LOCAL_KEPT = 4


class LedgerHistory:
    """The per-table states of one gateway and the last ledger record they include.

    Not thread-safe: the gateway calls it under its lock.

    Args:
        schema: the declared tables.
        ledger: the ledger the states follow.
        max_atoms: each table's limit on inference atoms (``Gateway(max_atoms=...)``).
        zcdp: the costs count ρ (a gateway opened with ``privacy="zcdp"``), not ε.
    """

    def __init__(self, schema: Schema, ledger: Ledger, max_atoms: int, *, zcdp: bool = False) -> None:
        self.schema, self.ledger, self.max_atoms, self.zcdp = schema, ledger, max_atoms, zcdp
        self.tables: dict[str, TableState] = {}
        #: Per table, each recorded statement's columns (lower-cased) and releases, in ledger order
        #: (wide ones by their ledger JSON: :mod:`dpgate.ledger._runs`).
        self.runs: dict[str, list[tuple[frozenset[str], tuple[RecordedRelease | KeptRelease, ...]]]] = {}
        #: Per table, the columns of each recorded statement some of whose releases the table's
        #: atoms left outside (only a local history combines those with others).
        self.outside: dict[str, list[frozenset[str]]] = {}
        #: Local histories by (table, columns): the state and how many of the table's runs it has seen.
        self._local: dict[tuple[str, frozenset[str]], tuple[TableState, int]] = {}
        #: Tables (lower-cased) with at least one release from seeded noise (replaced on change).
        self.insecure: frozenset[str] = frozenset()
        #: The id of the last record the states include.
        self.last_id = 0
        #: Records covered by the ledger's checkpoint file.
        self.checkpointed = 0

    def state(self, table: str) -> TableState:
        """``table``'s state (an empty history the first time)."""
        t = self.schema.table(table)
        key = t.name.lower()
        if key not in self.tables:
            self.tables[key] = TableState.new(t, self.max_atoms, zcdp=self.zcdp)
        return self.tables[key]

    def planning_state(self, table: str, queries: Sequence[LinearQuery]) -> TableState:
        """A copy of ``table``'s state refined for a statement's ``queries``
        (:meth:`TableState.refined`), or that of a local history (module docstring) when some
        of them stay outside the table's atoms, or some release over their columns did, and
        the local history holds at least as many of them.  A local copy is never installed
        (``refined_for`` None: its records are applied as records)."""
        columns = frozenset(c.lower() for q in queries for c in q.columns)
        left = self.outside.get(self.schema.table(table).name.lower(), ())
        trial = None
        if any(cols <= columns for cols in left):  # the table's atoms lack releases over these columns
            trial = self._local_state(table, columns).refined(queries, isolate=True)
        if trial is None or trial.outside:
            state = self.state(table).refined(queries, isolate=True)
            if trial is None:
                if not state.outside:
                    return state
                trial = self._local_state(table, columns).refined(queries, isolate=True)
            if len(trial.outside) > len(state.outside):
                return state
        trial.refined_for = None
        return trial

    def _local_state(self, table: str, columns: frozenset[str]) -> TableState:
        """The releases of ``table``'s statements over ``columns`` only, for inference, with
        the table's costs.  Kept for the last few column sets and brought up to date with
        the statements recorded since (refining never writes what a planning copy shares)."""
        t = self.schema.table(table)
        key = (t.name.lower(), columns)
        runs = self.runs.get(key[0], [])
        found = self._local.pop(key, None)
        if found is None:  # its atoms are its columns' only: wide queries whose weights fit are held too
            found = (replace(TableState.new(t, self.max_atoms, zcdp=self.zcdp), hold_wide=self.max_atoms), 0)
        state, seen = found
        for cols, items in runs[seen:]:
            if cols <= columns:
                state.record_inference(released(items))
        state.adopt_costs(self.state(table))
        while len(self._local) >= _LOCAL_KEPT:
            del self._local[next(iter(self._local))]
        self._local[key] = (state, len(runs))
        return state

    def _ran(self, table: str, items: Sequence[RecordedRelease]) -> None:
        """Note a recorded statement's releases (for local histories)."""
        cols = frozenset(c.lower() for it in items for c in it.query.columns)
        key = self.schema.table(table).name.lower()
        self.runs.setdefault(key, []).append((cols, tuple(kept(it) for it in items)))
        if any(self.tables[key].left_outside(it.query) for it in items):
            self.outside.setdefault(key, []).append(cols)

    def spent(self) -> float:
        """The system cost of the states: Σ over tables of ``k · max_j B_j``."""
        return float(sum(s.costs.charge for s in self.tables.values()))

    def secure(self, table: str) -> bool:
        """Whether every release of ``table`` so far used secure noise (``Answer.secure``)."""
        return self.schema.table(table).name.lower() not in self.insecure

    def sync(self, records: Sequence[LedgerRecord] | None = None, known: Mapping[str, LinearQuery] | None = None) -> None:
        """Apply ledger records not applied yet (default: read them from the ledger).
        ``known``: queries by their ledger JSON (this gateway's own releases: no re-parsing)."""
        if records is None:
            records = self.ledger.records(since=self.last_id)
        records = [r for r in records if r.id > self.last_id]
        known = known or {}
        queries = [q if (q := known.get(r.query)) is not None else LinearQuery.from_json(r.query) for r in records]
        for run in _statements(records, queries):
            self._apply([rec for rec, _ in run], [q for _, q in run])

    def open(self) -> None:
        """Apply the ledger's records, starting from its verified checkpoint when there is one."""
        if _checkpoint.path_for(self.ledger) is None:
            self.sync()
            return
        records = self.ledger.records()  # chain-verified by the ledger
        found = _checkpoint.load(self.ledger, self._header(), records)
        if found is not None:
            count, (tables, insecure, self.runs, self.outside) = found
            self.tables, self.insecure, self.last_id = tables, insecure, records[count - 1].id
            self.checkpointed = count
        self.sync(records)
        if len(records) - self.checkpointed >= CHECKPOINT_AFTER:
            self.save_checkpoint(records)

    def save_checkpoint(self, records: Sequence[LedgerRecord]) -> None:
        """Checkpoint the states after ``records`` (all the ledger's records, all applied)."""
        if records and records[-1].id == self.last_id and len(records) > self.checkpointed:
            _checkpoint.save(self.ledger, self._header(), records, (self.tables, self.insecure, self.runs, self.outside))
            self.checkpointed = len(records)

    def _header(self) -> dict[str, Any]:
        """What a checkpoint must match besides the records (the replay depends on these)."""
        header = {"version": __version__, "schema": self.schema.fingerprint(), "max_atoms": self.max_atoms,
                  "state": STATE_LAYOUT}
        return {**header, "privacy": "zcdp"} if self.zcdp else header

    def _apply(self, recs: Sequence[LedgerRecord], queries: Sequence[LinearQuery]) -> None:
        """Apply one statement's records (:meth:`TableState.record_many`: one batched update)."""
        self._note_security(recs)
        items = [RecordedRelease(r.id, q, r.scale, r.value, r.lattice, r.alpha, r.sensitivity, r.noise == GAUSSIAN_NOISE)
                 for r, q in zip(recs, queries, strict=True)]
        self.state(recs[0].table).record_many(items)
        self._ran(recs[0].table, items)
        self.last_id = recs[-1].id

    def applied(self, plan: Plan, records: Sequence[LedgerRecord], charges: RecordedCharges) -> None:
        """After the ``records`` of ``plan``'s measurements committed (``charges``: what they
        charged, :meth:`Plan.recorded_charges`): bring the states past them.  When the plan's
        planning copy was refined for exactly the released queries (``plan.installable``) and
        no other record came first, that copy *is* the table's state after them
        (:meth:`TableState.record_as_planned`: nothing refined or priced twice); otherwise they
        are applied like any other record."""
        parts = plan.measurements
        if records and records[0].id == self.last_id + 1 and plan.installable:
            self._note_security(records)
            state = plan.refined
            items = [RecordedRelease(r.id, m.query, r.scale, r.value, r.lattice, r.alpha, r.sensitivity,
                                     r.noise == GAUSSIAN_NOISE)
                     for r, m in zip(records, parts, strict=True)]
            state.record_as_planned(items, charges.costs, [m.h for m in parts])
            self.tables[state.table.name.lower()] = state
            self._ran(state.table.name, items)
            self.last_id = records[-1].id
            return  # others' later records are synced before the next use (no ledger read here)
        # The measured queries (offset 0, no label or group) are exactly what ``from_json`` gives back.
        self.sync(known={r.query: m.query for r, m in zip(records, parts, strict=True)})

    def _note_security(self, recs: Sequence[LedgerRecord]) -> None:
        if not all(r.secure for r in recs):
            self.insecure = self.insecure | {self.schema.table(recs[0].table).name.lower()}


def _statements(
    records: Sequence[LedgerRecord], queries: Sequence[LinearQuery]
) -> Iterator[list[tuple[LedgerRecord, LinearQuery]]]:
    """The records as the statements that appended them: runs of one table, session, kind
    and SQL text, cut where a query repeats (a statement measures each query once)."""
    run: list[tuple[LedgerRecord, LinearQuery]] = []
    seen: set[LinearQuery] = set()
    for rec, q in zip(records, queries, strict=True):
        if run and (q in seen or (rec.table, rec.session, rec.kind, rec.sql) != (
                run[-1][0].table, run[-1][0].session, run[-1][0].kind, run[-1][0].sql)):
            yield run
            run, seen = [], set()
        run.append((rec, q))
        seen.add(q)
    if run:
        yield run


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a ledger's history is loaded: tens of thousands
    of new objects (records, queries) would otherwise set off full collections that walk them
    all (benchmarks/README.md, "Timings behind the code").  Restored as it was, even on an exception."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
