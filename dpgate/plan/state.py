"""A table's released history: the gateway's live state and its frozen snapshot.

Why one module of about 650 lines: a :class:`TableState`'s four parts — inference atoms,
cost grid, incremental BLUE and the queries the atoms do not hold — are refined and
recorded together under one invariant (every record reaches every part, in ledger order);
split apart they would read each other's internals.  Its frozen snapshot is in
:mod:`dpgate.plan._view`, repeats of isolated queries in :mod:`dpgate.plan._repeats`.

:class:`TableState` is what the gateway updates as ledger records arrive (atoms,
the incremental BLUE, per-cell costs, the released queries); only the gateway
holds one.  :class:`TableView` is its frozen snapshot, the seam through which
extensions (``dpgate.model``, ``dpgate.warmstart.design``) read history:
``Gateway.locked_view`` hands one out under the gateway's lock."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dpgate.compile.bounds import reserve_memory
from dpgate.compile.query import LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.inference import IncrementalBLUE
from dpgate.inference._sparse import stacked_rows
from dpgate.plan._moments import Moments, record_moments
from dpgate.plan._repeats import _NO_REPEATS, Repeats, isolation_key
from dpgate.plan._view import TableView, _frozen
from dpgate.plan.accounting import CellCosts
from dpgate.plan.atoms import AtomPartition, joint_split
from dpgate.plan.cost_grid import COST_MAX_BOXES, CostGrid
from dpgate.schema.domains import Table

__all__ = [
    "COST_MAX_BOXES", "DEFAULT_MAX_ATOMS", "RecordedCharges", "RecordedRelease", "Repeats", "TableState", "TableView",
    "held_keys", "isolation_key",
]

#: What a release is charged as: the cost atoms it touches and its weight on each.
Charge = tuple[np.ndarray, np.ndarray]
_NO_CHARGE: Charge = (np.zeros(0, dtype=np.int64), np.zeros(0))

#: Default working limit on a table's inference atoms (``Gateway(max_atoms=...)``): the
#: inference costs O(rank × atoms) per query, so this bounds every decision's latency.  A
#: statement that would split the atoms further is estimated from its exact repeats only
#: (see :meth:`TableState.hold`).
DEFAULT_MAX_ATOMS = 20_000
#: A query with more distinct weights than this (e.g. ``SUM(age)`` over 101 ages) is kept outside
#: the table's atoms (a local history over its columns may hold it: ``hold_wide``): splitting every
#: atom by each of its weights would multiply the atoms of every later GROUP BY by that many.
MAX_ATOM_WEIGHTS = 32


def _support(table: Table, query: LinearQuery) -> LinearQuery:
    """The 0/1 query of ``query``'s support, on its coarsest grid (built once per query object,
    kept on it: a lookup by equality would compare a wide query's 500 002 weights)."""
    found = query.__dict__.get("_support_query")
    if found is None:
        found = query.__dict__["_support_query"] = LinearQuery.from_grid(
            table, query.columns, query.breakpoints, (np.asarray(query.numerators) != 0).astype(float)
        )
    return cast(LinearQuery, found)


def _held(query: LinearQuery) -> bool:
    """Whether the atoms hold ``query`` when their limit allows (it is neither zero nor wide)."""
    return not query.is_zero and not _wide(query)


def _wide(query: LinearQuery) -> bool:
    """Whether ``query`` has more distinct weights than :data:`MAX_ATOM_WEIGHTS` (memoised on the
    query and on its :attr:`~LinearQuery.linear_part`: a wide query is sorted once)."""
    if np.asarray(query.numerators).size <= MAX_ATOM_WEIGHTS + 1:  # + the zero weight
        return False
    return query.has_more_weights_than(MAX_ATOM_WEIGHTS + 1)


def _held_key(query: LinearQuery) -> tuple[object, ...]:
    """What decides whether ``query`` is constant on a partition: :attr:`LinearQuery.pattern`."""
    return query.pattern


def held_keys(queries: Sequence[LinearQuery]) -> tuple[tuple[object, ...], ...]:
    """What the refinement of a state for ``queries``, in order, depends on (one key each)."""
    return tuple(_held_key(q) for q in queries)


def _charge_key(query: LinearQuery) -> tuple[object, ...]:
    """What a query's charge depends on: its weight pattern *and* its denominator (the pattern
    alone is shared by ``COUNT(*)`` and ``COUNT(*) / 4``, whose weights differ)."""
    return (query.pattern, query.denominator)


@dataclass(frozen=True, slots=True)
class RecordedRelease:
    """One release as a ledger record holds it, for :meth:`TableState.record_many`: the record's
    id, the measured query (offset 0), its noise scale, released value and lattice step, the budget
    ``α`` and sensitivity ``S`` it was charged at, and whether its noise was Gaussian (deviation ``scale``)."""

    record_id: int
    query: LinearQuery
    scale: float
    value: float
    lattice: float
    alpha: float
    sensitivity: float
    gaussian: bool = False


@dataclass(frozen=True)
class RecordedCharges:
    """What recording a statement's releases, in order, charges its table
    (:meth:`TableState.recorded_charges`): the exact charge in units before them and after
    each, and the per-cell costs after all of them (a copy, installed by
    :meth:`TableState.record_as_planned`)."""

    before: int
    after: tuple[int, ...]
    costs: CellCosts = field(repr=False)


#: Attributes of checkpoints written before plans were values (:meth:`TableState.__setstate__`).
_FORMER_CACHES = frozenset({"_recorded", "_planned"})


@dataclass
class TableState:
    """Everything known about one table's releases.

    Two partitions of the domain serve two purposes:

    * ``atoms`` (at most ``max_atoms``, a working limit) carry the inference: the BLUE
      over the released queries they hold.  A query they cannot hold within the limit
      stays outside them and is estimated from its exact repeats only (``isolated``) — or,
      wide and linear on slabs of one column, from every such release (``moments``);
      a GROUP BY is held whole or not at all.  Estimating from a subset of history is
      still an unbiased estimator with an exact error law: only reuse is lost.
    * ``cost_atoms`` — the boxes of the grid of every release's breakpoints (a
      :class:`~dpgate.plan.cost_grid.CostGrid`: a main grid up to :data:`COST_MAX_BOXES`,
      and side grids for releases beyond it) — carry the per-cell accounting: every release
      refines them, so its cost ``(α/S)|q_j|`` is charged on exactly the cells it touches,
      whether or not the inference atoms hold it — except a query with more than
      :data:`MAX_ATOM_WEIGHTS` distinct weights (``SUM(income)``), charged ``α`` on its
      support (``|q_j|/S ≤ 1``: an upper bound; pricing 500 001 weights exactly takes
      seconds).  The main grid refines ``atoms`` (every query held by the atoms refines it
      too), so a query constant on the atoms is constant on it.

    ``queries``, ``record_ids``, ``alphas`` and ``sensitivities`` list the releases
    the atoms hold, in order (row ``i`` of ``blue`` is record ``record_ids[i]``).
    """

    table: Table
    atoms: AtomPartition
    blue: IncrementalBLUE
    costs: CellCosts
    cost_atoms: CostGrid
    queries: list[LinearQuery] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)
    alphas: list[float] = field(default_factory=list)
    sensitivities: list[float] = field(default_factory=list)
    #: Releases of queries the atoms do not hold, by :func:`isolation_key`: per key, the
    #: released factors and the one-atom BLUE over them (:class:`Repeats`).
    isolated: dict[str, Repeats] = field(default_factory=dict)
    #: The same releases, those linear on slabs of one integer column (``SUM(income)``), by that
    #: column: on (atom, moment) coordinates, where they inform each other (:mod:`dpgate.plan._moments`).
    moments: dict[str, Moments] = field(default_factory=dict)
    #: In a planning copy (:meth:`refined`), the positions of the statement's queries
    #: that stay outside the atoms.
    outside: frozenset[int] = frozenset()
    #: By :func:`_held_key`, each recorded query: True when the atoms hold it, False when it
    #: stays outside them.  The atoms only get finer, so a held query stays constant on them,
    #: and one left outside stays outside: a repeat needs no refinement.
    _known: dict[tuple[object, ...], bool] | None = field(default=None, repr=False)
    #: By :func:`_held_key`, how the cost atoms hold each query refined into them:
    #: ``"exact"`` (constant on the main grid), ``"support"`` (only its support is), and the
    #: same on side grid ``b`` as ``"exact@b"`` / ``"support@b"`` (beyond the main grid's limit).
    _cost_kind: dict[tuple[object, ...], str] = field(default_factory=dict, repr=False)
    #: Whether the main cost grid refines the inference atoms (true unless a query the atoms
    #: hold did not fit its limit; then the one-box side grid exists, for what is charged
    #: from the atoms).
    _costs_refine: bool = field(default=True, repr=False)
    #: Cached :meth:`_atom_members`, with the label arrays of the partitions it was made for.
    _members: tuple[object, object, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = field(default=None, repr=False)
    #: Inside :meth:`_deferred_splits`: the composed split not yet applied to the BLUE.
    _pending: np.ndarray | None = field(default=None, repr=False)
    #: In a planning copy made with isolation (:meth:`refined`), the :func:`held_keys` of the
    #: queries it was refined for: recording releases of exactly those refines the state it was
    #: made from as the copy was refined, so the copy may become it (:meth:`record_as_planned`).
    refined_for: tuple[tuple[object, ...], ...] | None = field(default=None, repr=False)
    #: Wide queries of at most this many weights are held too (a local history's: its atoms are its columns').
    hold_wide: int = 0
    _deferring: bool = field(default=False, repr=False)
    #: By :func:`_charge_key` (equal keys, equal vectors), the row of ``blue`` a query the
    #: atoms hold was last released as: a repeat's coordinates are that row's.
    _row_of: dict[tuple[object, ...], int] = field(default_factory=dict, repr=False)

    @classmethod
    def new(cls, table: Table, max_atoms: int = DEFAULT_MAX_ATOMS, *, zcdp: bool = False) -> TableState:
        """Empty history on the one-atom partitions (≤ ``max_atoms`` inference atoms; ``zcdp``: costs in ρ)."""
        atoms = AtomPartition(table, max_atoms=max_atoms)
        cost_atoms = CostGrid(table)
        return cls(
            table, atoms, IncrementalBLUE(atoms.cell_sizes, keep_rows=False),
            CellCosts(1, table.max_rows_per_individual, zcdp=zcdp), cost_atoms,
        )

    # -- the cost atoms -------------------------------------------------------------
    def _charge_refine(self, queries: Sequence[LinearQuery]) -> None:
        """Refine the cost atoms so that each of ``queries`` is charged exactly (as far as
        their limits allow): disjoint queries (a GROUP BY's groups) in one split."""
        live = [q for q in queries if not q.is_zero and _held_key(q) not in self._cost_kind]
        narrow = [q for q in live if _held(q)]
        if len(narrow) > 1:
            split, run = joint_split(self.table, narrow)  # run: its leading disjoint queries
            if split is not None:  # together, on the main grid or else on one side grid
                kind = "exact" if self._cost_split(split) else f"exact@{self._side_split(split)}"
                self._cost_kind.update((_held_key(q), kind) for q in (*narrow[:run], split))
        for q in live:
            key = _held_key(q)
            if key in self._cost_kind:
                continue
            if _held(q) and self._cost_split(q):
                self._cost_kind[key] = "exact"
            elif self._cost_split(_support(self.table, q)):  # a wide query: priced per weight, too slow
                self._cost_kind[key] = "support"
            elif _held(q):
                self._cost_kind[key] = f"exact@{self._side_split(q)}"
            else:
                self._cost_kind[key] = f"support@{self._side_split(_support(self.table, q))}"

    def _cost_split(self, query: LinearQuery) -> bool:
        """Refine the main cost grid (and split the costs with it) by ``query``; False when over its limit."""
        regrid = self.cost_atoms.refine_main(query)
        if regrid is False:
            return False
        if regrid is not None:
            self.costs.regrid(*regrid)
        return True

    def _side_split(self, query: LinearQuery) -> int:
        """Refine a side cost grid (and the costs with it) by ``query``; returns its block."""
        block, regrid = self.cost_atoms.refine_side(query)
        if regrid is not None:
            self.costs.regrid(*regrid)
        return block

    def _uniform_block(self) -> None:
        """Make the one-box side grid (what is charged from the atoms once the main grid does
        not refine them), appended: the blocks located so far keep their numbers."""
        _, regrid = self.cost_atoms.add_uniform()
        if regrid is not None:
            self.costs.regrid(*regrid)

    def charges(self, queries: Sequence[LinearQuery]) -> list[Charge]:
        """What a release of each of ``queries`` is charged as, over the cost atoms: the cost
        atoms it touches and its weight on each — its weights when the cost atoms hold it;
        else ``S`` on those its support meets (``|q_j|/S ≤ 1`` bounds the true per-cell
        cost); on a side grid beyond the main one's limit.  The queries must have been refined into the cost atoms
        (:meth:`_charge_refine`); disjoint ones are located by one pass over the cost atoms.
        """
        memo = self.cost_atoms.located()
        todo = [q for q in queries if not q.is_zero and _charge_key(q) not in memo]
        exact = [q for q in todo if _held(q) and self._cost_kind.get(_held_key(q)) == "exact"]
        split, run = joint_split(self.table, exact) if len(exact) > 1 else (None, 0)
        if split is not None:  # each query constant on the cost atoms, so their joint split is too
            memo.update(zip([_charge_key(q) for q in exact[:run]], self._split_charges(split, exact[:run]), strict=True))
        for q in todo:
            key = _charge_key(q)
            if key not in memo:
                memo[key] = self._charge_one(q)
        return [_NO_CHARGE if q.is_zero else memo[_charge_key(q)] for q in queries]

    def _split_charges(self, split: LinearQuery, queries: Sequence[LinearQuery]) -> list[Charge]:
        """:meth:`charges` of disjoint ``queries`` from the codes of their joint split
        (code ``base + 1 + rank`` for each query's distinct non-zero weights, in order:
        :func:`~dpgate.plan.atoms.joint_split`)."""
        codes, boxes = self.cost_atoms.main.boxes_by_cell(split)  # codes on the split's own columns: small
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(int(codes.max(initial=0)) + 2))
        out, base = [], 0
        for q in queries:
            nums = np.asarray(q.numerators)
            values = np.unique(nums[nums != 0])
            segments = [boxes[order[bounds[base + 1 + r]: bounds[base + 2 + r]]].ravel() for r in range(values.size)]
            base += values.size
            atoms = np.concatenate(segments)
            out.append((atoms, np.repeat(values / q.denominator, [len(g) for g in segments])))
        return out

    def _charge_one(self, query: LinearQuery) -> Charge:
        """:meth:`charges` of one query: from its own few non-zero boxes when it is charged
        exactly (:meth:`~dpgate.plan.atoms.BoxGrid.nonzero_weights`), else as a dense vector over
        its block (numbered among all blocks: :class:`~dpgate.plan.cost_grid.CostGrid`)."""
        kind, _, where = self._cost_kind[_held_key(query)].partition("@")
        block = int(where or 0)
        grid, offset = self.cost_atoms.block(block), self.cost_atoms.starts[block]
        located, scale = (query, 1.0) if kind == "exact" else (_support(self.table, query), query.sensitivity)
        found = grid.nonzero_weights(located)
        if found is not None:
            return found[0] + offset, found[1] * scale
        reserve_memory(24 * grid.n_atoms, "a release's per-cell charge")
        v = grid.vector(located) * scale
        on = np.flatnonzero(v)
        return on + offset, v[on]

    def charge(self, query: LinearQuery, h: np.ndarray) -> Charge:
        """What a release of ``query`` (``h``: its inference vector) is charged as: by
        :meth:`charges` when it was refined into the cost atoms (a statement's query),
        else from its weights over the atoms (a query made from them, e.g. a restriction)."""
        return self.charge_many([query], [h])[0]

    def charge_many(self, queries: Sequence[LinearQuery], hs: Sequence[np.ndarray]) -> list[Charge]:
        """:meth:`charge` of each query (a statement's: one :meth:`charges` call for them)."""
        out, held = [], []
        for i, (q, h) in enumerate(zip(queries, hs, strict=True)):
            if q.is_zero or _held_key(q) in self._cost_kind:
                held.append(i)
                out.append(_NO_CHARGE)  # filled below
            else:
                out.append(self.charge_from_atoms(h, q.sensitivity))
        for i, c in zip(held, self.charges([queries[i] for i in held]), strict=True):
            out[i] = c
        return out

    def charge_from_atoms(self, h: np.ndarray, sensitivity: float) -> Charge:
        """What a query given by its weights ``h`` over the atoms (e.g. a restriction) is
        charged as: ``h`` on the cost atoms inside each atom (they refine the atoms), or
        ``S`` on the one-box side grid when they do not (an upper bound: ``|h_j| ≤ S``)."""
        members = self._atom_members()
        if members is None:  # on the one-box side grid, at its largest weight
            assert self.cost_atoms.uniform is not None  # made when the main grid stopped refining the atoms
            return np.array([self.cost_atoms.starts[self.cost_atoms.uniform]]), np.array([sensitivity])
        of, order, starts = members
        support = np.flatnonzero(h)
        lens = starts[support + 1] - starts[support]
        first = np.repeat(starts[support] - np.cumsum(lens) + lens, lens)
        atoms = order[first + np.arange(int(lens.sum()))]
        return atoms, h[of[atoms]]

    def atom_costs(self, costs: CellCosts) -> np.ndarray:
        """Per atom, the largest per-cell cost inside it (float; ``costs`` over the cost atoms).
        Used to rank atoms for restrictions, never to charge."""
        members = self._atom_members()
        if members is None:
            return np.full(self.atoms.n_atoms, float(costs.per_atom.max(initial=0.0)))
        _, order, starts = members
        return np.maximum.reduceat(costs.per_atom[order], starts[:-1])

    def _atom_members(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(of, order, starts)``: each cost atom's atom, and the cost atoms of atom ``a`` as
        ``order[starts[a]:starts[a + 1]]``; ``None`` when the cost atoms do not refine the atoms."""
        if not self._costs_refine:
            return None
        keys = (self.cost_atoms.main.version, self.atoms.labels.base)
        found = self._members
        if found is None or found[0] != keys[0] or found[1] is not keys[1]:
            of = self.cost_atoms.main.atom_of(self.atoms)
            # Atom ids are small: as 16-bit keys numpy's stable sort is a radix sort, O(cost atoms).
            order = np.argsort(of.astype(np.uint16) if self.atoms.n_atoms <= 2**16 else of, kind="stable")
            starts = np.searchsorted(of[order], np.arange(self.atoms.n_atoms + 1))
            found = self._members = (*keys, (of, order, starts))
        return found[2]

    # -- the inference atoms --------------------------------------------------------
    def refine(self, query: LinearQuery) -> None:
        """Split atoms so that ``query`` is constant on each (public structure only).

        Raises:
            UnsupportedQuery: over the atoms' limits (the atoms are then unchanged).
        """
        parent = self.atoms.refine(query)
        if not query.is_zero and self._cost_kind.get(_held_key(query)) != "exact":
            self._charge_refine([query])
            if self._cost_kind[_held_key(query)] != "exact" and self._costs_refine:
                self._costs_refine = False  # the main cost grid no longer refines the atoms
                self._uniform_block()
        if parent is None:
            return
        if self._deferring:  # one split of the BLUE for many refinements
            self._pending = parent if self._pending is None else self._pending[parent]
            return
        self.blue.split(parent, self.atoms.cell_sizes)

    @contextmanager
    def _deferred_splits(self) -> Iterator[None]:
        """Refinements inside the block split the atoms at once and the BLUE once (the
        composed split) — at the latest when it ends, earlier by :meth:`_split_now`."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            self._split_now()

    def _split_now(self) -> None:
        """Bring the BLUE onto the current atoms (after deferred refinements)."""
        if self._pending is not None:
            parent, self._pending = self._pending, None
            self.blue.split(parent, self.atoms.cell_sizes)

    def refined(self, queries: Sequence[LinearQuery], *, isolate: bool = True) -> TableState:
        """A copy of this state refined for ``queries``; this state is unchanged.

        How a statement is planned: its refinements stay on the copy, so a statement that
        is refused (or answered from history) leaves no trace in the live state; a fresh
        release reaches the live state only as a ledger record (:meth:`record_many`),
        which applies the same rule (:meth:`hold`), so the copy holds exactly the queries
        the live state will, and the cost atoms charge them exactly as they will be charged.
        The copy shares arrays with this state until it replaces them: refining replaces
        the partitions', the BLUE's and the costs' arrays and never writes into them, and
        the planner copies the BLUE before appending to it.

        ``isolate=False`` (an extension's view): every query must fit the atoms.

        Raises:
            UnsupportedQuery: ``isolate`` is False and a query exceeds the atoms' limits.
        """
        trial = copy.copy(self)
        trial.atoms, trial.blue, trial.costs = copy.copy(self.atoms), copy.copy(self.blue), copy.copy(self.costs)
        trial.cost_atoms, trial._cost_kind = copy.copy(self.cost_atoms), dict(self._cost_kind)
        trial._charge_refine(queries)
        trial.charges(queries)  # located together (one pass for a GROUP BY), kept for the plan
        if isolate:
            trial.outside = frozenset(trial.hold(queries))
            trial.refined_for = held_keys(queries)
        else:
            with trial._deferred_splits():
                for q in queries:
                    trial.refine(q)
        return trial

    def hold(self, queries: Sequence[LinearQuery]) -> set[int]:
        """Refine the atoms for a statement's ``queries``; returns the positions of those
        that stay outside them.

        The rule: a query recorded before stays where it was.  Disjoint new queries (a
        GROUP BY's groups) are held together by one split, or — when that split would
        exceed the atoms' limit — all stay outside (never some groups in, some out: that
        would make the atoms depend on the order of the groups and spend the limit on a
        part of one statement).  Other new queries are held one by one while they fit.
        A query with more than :data:`MAX_ATOM_WEIGHTS` distinct weights stays outside.
        """
        known = self._known or {}
        outside: set[int] = set()
        new: list[int] = []
        for i, q in enumerate(queries):
            if q.is_zero:
                continue
            seen = known.get(_held_key(q))
            if seen is False or (seen is None and _wide(q) and (not self.hold_wide or q.has_more_weights_than(self.hold_wide))):
                outside.add(i)
            elif seen is None:
                new.append(i)
        if not new:
            return outside
        with self._deferred_splits():
            if len(new) > 1:
                split, run = joint_split(self.table, [queries[i] for i in new])
                if run == len(new) and split is not None:
                    try:
                        self.refine(split)
                        return outside
                    except UnsupportedQuery:
                        return outside | set(new)
                if split is not None:
                    # Overlapping: their leading run of disjoint queries (a hierarchical tree's
                    # leaves, released first) in one split, the others one by one below.
                    with contextlib.suppress(UnsupportedQuery):
                        self.refine(split)
            for i in new:
                try:
                    self.refine(queries[i])
                except UnsupportedQuery:
                    outside.add(i)
        return outside

    def record_many(self, items: Sequence[RecordedRelease]) -> None:
        """Add one statement's released answers, in order: their costs, and each to the BLUE
        (as one block) or to its exact repeats' history when the atoms do not hold it (:meth:`hold`).

        The same state as recording them one by one: the costs are exact per cell whatever
        the order, and the BLUE's rows are taken on the atoms after the last refinement,
        which is exact (a split divides atoms, and the BLUE splits with them).
        """
        if not items:
            return
        self.record_inference(items)
        self._add_costs(items)  # on the cost atoms, which recording the inference refined alike

    def _append(self, items: Sequence[RecordedRelease], outside: Set[int],
                vectors: Sequence[np.ndarray] | None = None) -> None:
        """Add released answers (their queries refined) to the BLUE, or — the positions in
        ``outside`` — to their exact repeats' history.  ``vectors``: each query's vector over
        the atoms when the caller has them (the planner's, on these very atoms)."""
        queries = [it.query for it in items]
        held = [it for i, it in enumerate(items) if i not in outside]
        for i in sorted(outside):
            it = items[i]
            key, factor = isolation_key(it.query)
            if _wide(it.query) and not it.gaussian:  # linear on slabs of one column: (atom, moment) coordinates too
                record_moments(self.table, self.moments, self.isolated, key, it.query, it.scale, it.value, it.lattice)
            self.isolated[key] = self.isolated.get(key, _NO_REPEATS).plus(factor, it.scale, it.value, it.lattice, it.gaussian)
        if held:
            rows = stacked_rows([self.atoms.vector(it.query) for it in held] if vectors is None else
                                [v for i, v in enumerate(vectors) if i not in outside])
            for it in held:
                self._row_of[_charge_key(it.query)] = len(self.queries)
                self.queries.append(it.query)
                self.record_ids.append(it.record_id)
                self.alphas.append(it.alpha)
                self.sensitivities.append(it.sensitivity)
            gaussian = [it.gaussian for it in held] if any(it.gaussian for it in held) else None
            self.blue.extend(rows, [it.scale for it in held], [it.value for it in held], [it.lattice for it in held], gaussian)
        self._remember([q for i, q in enumerate(queries) if i not in outside], True)
        self._remember([queries[i] for i in outside], False)

    def _add_costs(self, items: Sequence[RecordedRelease]) -> None:
        """Charge each release ``(α/S)|q_j|`` on the cost atoms; the disjoint releases of one
        (α, S) — a GROUP BY's groups — as one sum (each cost atom then gets one weight, so the
        rounding is the one of adding them one by one)."""
        by_budget: dict[tuple[float, float], list[Charge]] = {}
        for it, charge in zip(items, self.charges([it.query for it in items]), strict=True):
            by_budget.setdefault((it.alpha, it.sensitivity), []).append(charge)
        for (alpha, sensitivity), found in by_budget.items():
            atoms = np.concatenate([a for a, _ in found])
            touched = np.zeros(self.cost_atoms.n_atoms, dtype=bool)
            touched[atoms] = True
            if np.count_nonzero(touched) == atoms.size:
                self.costs.add_sparse(atoms, np.concatenate([w for _, w in found]), alpha, sensitivity)
            else:
                for a, w in found:
                    self.costs.add_sparse(a, w, alpha, sensitivity)

    def record_costs(self, items: Sequence[RecordedRelease]) -> None:
        """Only the per-cell costs of :meth:`record_many` (one analyst's share of history)."""
        self._charge_refine([it.query for it in items])
        self._add_costs(items)

    def record_inference(self, items: Sequence[RecordedRelease]) -> None:
        """:meth:`record_many` without the costs: what a local history replays of the table's
        releases (for inference only: it charges as the table does, :meth:`adopt_costs`)."""
        queries = [it.query for it in items]
        self._charge_refine(queries)
        self._append(items, self.hold(queries))

    def adopt_costs(self, table_state: TableState) -> None:
        """Take (copies of) the per-cell costs of ``table_state``, which holds every release."""
        self.costs, self.cost_atoms = table_state.costs.copy(), copy.copy(table_state.cost_atoms)
        self._cost_kind, self._members = dict(table_state._cost_kind), None
        self._costs_refine = all(self.cost_atoms.main.holds(q) for q in self.queries)
        if not self._costs_refine:
            self._uniform_block()

    def _remember(self, queries: Sequence[LinearQuery], held: bool) -> None:
        """Note whether the atoms hold ``queries`` (just recorded on them, or outside them)."""
        if self._known is None:
            self._known = {}
        self._known.update((_held_key(q), held) for q in queries)

    def recorded_charges(self, parts: Sequence[tuple[Charge, float, float]]) -> RecordedCharges:
        """What recording ``parts`` ``(charge, α, S)`` in order charges the table (a statement's
        releases, charged by :meth:`charges` on this refined copy — exactly what recording them
        adds): the exact charge before them and after each, and the costs after all of them."""
        costs, after = self.costs.copy(), []
        for (atoms, weights), alpha, sensitivity in parts:
            costs.add_sparse(atoms, weights, alpha, sensitivity, in_place=True)
            after.append(costs.charge_units)
        return RecordedCharges(self.costs.charge_units, tuple(after), costs)

    def record_as_planned(self, items: Sequence[RecordedRelease], costs: CellCosts,
                          vectors: Sequence[np.ndarray]) -> None:
        """:meth:`record_many` on the planning copy refined for exactly these releases' queries
        (``refined_for`` is their :func:`held_keys`), with ``costs`` (the costs after them, as
        priced by the planner or :meth:`recorded_charges`) and the planner's vector of each query
        (its ``Measurement.h``): the same state, without refining the partitions, pricing the
        releases or locating them on the atoms a second time.  The copy becomes the table's
        state.  The lists and maps it shares with the state it was made from are copied first,
        so that state stays intact whatever happens here."""
        self.queries, self.record_ids, self._row_of = list(self.queries), list(self.record_ids), dict(self._row_of)
        self.alphas, self.sensitivities = list(self.alphas), list(self.sensitivities)
        self.isolated, self._known = dict(self.isolated), dict(self._known or {})
        self.moments = dict(self.moments)
        self.costs = costs
        self._append(items, self.outside, vectors)
        self.outside, self.refined_for = frozenset(), None

    def __getstate__(self) -> dict[str, object]:
        """Pickled (checkpointed) without the map of cost atoms onto atoms: derived, and as
        large as the cost grid."""
        return {**self.__dict__, "_members": None}

    def __copy__(self) -> TableState:
        """A shallow copy that keeps the derived caches (:meth:`__getstate__` drops them for
        a checkpoint; a planning copy reuses them: they are replaced, never written)."""
        new = object.__new__(TableState)
        new.__dict__.update(self.__dict__)
        return new

    def __setstate__(self, state: dict[str, object]) -> None:
        # A checkpoint written before plans were values holds the planner's caches (None): dropped.
        self.__dict__.update({k: v for k, v in state.items() if k not in _FORMER_CACHES})
        if "moments" not in state:  # a checkpoint written before moment histories: its wide
            self.moments = {}  # queries keep their exact repeats (their keys are not in one)
        if "_row_of" not in state:  # a checkpoint written before the map existed
            self._row_of = {_charge_key(q): i for i, q in enumerate(self.queries)}

    def left_outside(self, query: LinearQuery) -> bool:
        """Whether ``query`` was recorded outside the atoms (:meth:`hold`)."""
        return (self._known or {}).get(_held_key(query)) is False

    def released_row(self, query: LinearQuery) -> int | None:
        """The row of ``blue`` that is exactly ``query``'s vector (a repeat of a release the
        atoms hold), or None."""
        return self._row_of.get(_charge_key(query))

    def view(self) -> TableView:
        """A frozen snapshot of this history (copies: later releases and refinements do not show)."""
        # refine() replaces the partition's arrays and never writes into them, so a shallow
        # copy is a snapshot; the BLUE is copied deeply (append/split write in place).
        return TableView(
            self.table,
            copy.copy(self.atoms),
            _frozen(self.rows()),
            _frozen(self.blue.values),
            _frozen(self.blue.scales),
            _frozen(self.blue.lattice),
            _frozen(self.alphas),
            _frozen(self.sensitivities),
            tuple(self.queries),
            tuple(self.record_ids),
            self.blue.copy(),
        )

    def rows(self) -> np.ndarray:
        """The released queries held by the atoms, as rows over the atoms (m × n, release order)."""
        out = np.zeros((len(self.queries), self.atoms.n_atoms))
        for i, q in enumerate(self.queries):
            out[i] = self.atoms.vector(q)
        return out

    def atom_query(self, query: LinearQuery, keep: np.ndarray) -> LinearQuery:
        """``query`` with its weight zeroed outside the atoms ``keep`` (a boolean mask)."""
        grid = query.expand(self.table, self.atoms.columns, self.atoms.breakpoints) / query.denominator
        weights = np.where(keep[self.atoms.labels], grid, 0.0)
        return LinearQuery.from_grid(self.table, self.atoms.columns, self.atoms.breakpoints, weights)
