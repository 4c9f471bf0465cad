"""A table's released history: the gateway's live state and its frozen snapshot.

:class:`TableState` is what the gateway updates as ledger records arrive (atoms,
the incremental BLUE, per-cell costs, the released queries); only the gateway
holds one.  :class:`TableView` is its frozen snapshot, the seam through which
extensions (``dpgate.model``, ``dpgate.warmstart``) read history:
``Gateway.locked_view`` hands one out under the gateway's lock.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dpgate.accounting import CellCosts
from dpgate.atoms import AtomPartition
from dpgate.errors import UnsupportedQuery
from dpgate.inference import Estimate, IncrementalBLUE
from dpgate.query import LinearQuery
from dpgate.schema import Table

__all__ = ["DEFAULT_MAX_ATOMS", "TableState", "TableView", "isolation_key"]

_ONE = np.ones(1)

#: Default limit on a table's atoms (``Gateway(max_atoms=...)``); a query that would split
#: the domain into more is measured on its own (see :meth:`TableState.refined`).
DEFAULT_MAX_ATOMS = 200_000
#: A query with more distinct weights than this (e.g. ``SUM(age)`` over 101 ages) is kept
#: outside the atoms: splitting every atom by each of its weights would multiply the atoms
#: of every later GROUP BY by that many.  Its support still refines the atoms.
MAX_ATOM_WEIGHTS = 32


_support_cache: weakref.WeakKeyDictionary[LinearQuery, LinearQuery] = weakref.WeakKeyDictionary()


def _support(table: Table, query: LinearQuery) -> LinearQuery:
    """The 0/1 query of ``query``'s support, on its coarsest grid (built once per query object)."""
    found = _support_cache.get(query)
    if found is None:
        found = _support_cache[query] = LinearQuery.from_grid(
            table, query.columns, query.breakpoints, (np.asarray(query.numerators) != 0).astype(float)
        )
    return found


_wide_cache: weakref.WeakKeyDictionary[LinearQuery, bool] = weakref.WeakKeyDictionary()


def _held(query: LinearQuery) -> bool:
    """Whether the atoms hold ``query`` when their limit allows (it is neither zero nor wide)."""
    return not query.is_zero and not _wide(query)


def _wide(query: LinearQuery) -> bool:
    """Whether ``query`` has more distinct weights than :data:`MAX_ATOM_WEIGHTS`."""
    nums = np.asarray(query.numerators)
    if nums.size <= MAX_ATOM_WEIGHTS + 1:  # + the zero weight
        return False
    found = _wide_cache.get(query)
    if found is None:  # a wide query is sorted once per object (500 001 incomes: 0.1 s)
        found = _wide_cache[query] = bool(np.unique(nums).size > MAX_ATOM_WEIGHTS + 1)
    return found


def _held_key(query: LinearQuery) -> tuple[object, ...]:
    """What decides whether ``query`` is constant on a partition: its grid and weight pattern
    (the weights by digest: a wide query's are megabytes)."""
    digest = hashlib.sha256(np.ascontiguousarray(query.numerators, dtype=np.int64).tobytes()).digest()
    return (tuple(c.lower() for c in query.columns), query.breakpoints, digest)


def isolation_key(query: LinearQuery) -> tuple[str, float]:
    """``(key, factor)``: ``query`` is ``factor`` times the query the key names.

    Queries kept outside the atoms (see :meth:`TableState.refined`) are reused only
    across exact repeats and rescalings: two queries share a key iff they have the same
    grid and proportional weights (numerators divided by their gcd, first non-zero
    positive).  Zero queries are never measured and have no key.
    """
    nums = np.asarray(query.numerators, dtype=np.int64).ravel()
    nonzero = np.flatnonzero(nums)
    g = int(np.gcd.reduce(np.abs(nums))) * (1 if nums[nonzero[0]] > 0 else -1)
    digest = hashlib.sha256(
        repr((query.table.lower(), query.columns, query.breakpoints, query.numerators.shape)).encode()
        + (nums // g).tobytes()
    ).hexdigest()
    return digest, g / query.denominator


@dataclass
class TableState:
    """Everything known about one table's releases, on the current atoms.

    ``queries``, ``record_ids``, ``alphas`` and ``sensitivities`` list the applied
    ledger records in order (row ``i`` of ``blue`` is record ``record_ids[i]``).
    """

    table: Table
    atoms: AtomPartition
    blue: IncrementalBLUE
    costs: CellCosts
    queries: list[LinearQuery] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)
    alphas: list[float] = field(default_factory=list)
    sensitivities: list[float] = field(default_factory=list)
    #: Releases of queries the atoms could not hold, by :func:`isolation_key`: a one-atom
    #: BLUE per key whose rows are the released factors.
    isolated: dict[str, IncrementalBLUE] = field(default_factory=dict)
    #: In a planning copy (:meth:`refined`), the positions of the statement's queries
    #: that stay outside the atoms.
    outside: frozenset[int] = frozenset()
    #: In a planning copy, the live atoms it was refined from: a query outside the atoms is
    #: charged on the live atoms it meets (see :meth:`isolated_weights`).
    charge_base: AtomPartition | None = None
    #: In a planning copy, the live costs it was refined from (on ``charge_base``).
    base_costs: CellCosts | None = None
    #: By :func:`_held_key`, each recorded query: True when the atoms hold it, False when it
    #: stays outside them.  The atoms only get finer, so a held query stays constant on them
    #: (its grid inside theirs), and refining by one outside them (or by its support) changes
    #: nothing again: a repeat needs no refinement.  A class-level default, so states pickled
    #: without it (checkpoints) read as empty.
    _known: dict[tuple[object, ...], bool] | None = field(default=None, repr=False)
    #: In a planning copy, the last :meth:`recorded_charges` (the plan's, reused when recording).
    _charges: tuple[tuple[object, ...], tuple[int, list[int]]] | None = field(default=None, repr=False)
    #: Inside :meth:`_deferred_splits`: the composed split not yet applied to the BLUE and costs.
    _pending: np.ndarray | None = field(default=None, repr=False)
    _deferring: bool = field(default=False, repr=False)

    @classmethod
    def new(cls, table: Table, max_atoms: int = DEFAULT_MAX_ATOMS) -> TableState:
        """Empty history on the one-atom partition (at most ``max_atoms`` atoms)."""
        atoms = AtomPartition(table, max_atoms=max_atoms)
        return cls(
            table, atoms, IncrementalBLUE(atoms.cell_sizes, keep_rows=False), CellCosts(atoms.n_atoms, table.max_rows_per_individual)
        )

    def refine(self, query: LinearQuery) -> None:
        """Split atoms so that ``query`` is constant on each (public structure only)."""
        parent = self.atoms.refine(query)
        if parent is None:
            return
        if self._deferring:  # one split of the BLUE and the costs for many refinements
            self._pending = parent if self._pending is None else self._pending[parent]
            return
        self.blue.split(parent, self.atoms.cell_sizes)
        self.costs.split(parent)

    @contextmanager
    def _deferred_splits(self) -> Iterator[None]:
        """Refinements inside the block split the atoms at once and the BLUE and the costs
        once (the composed split) — at the latest when it ends, earlier by :meth:`_split_now`."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            self._split_now()

    def _split_now(self) -> None:
        """Bring the BLUE and the costs onto the current atoms (after deferred refinements)."""
        if self._pending is not None:
            parent, self._pending = self._pending, None
            self.blue.split(parent, self.atoms.cell_sizes)
            self.costs.split(parent)

    def refined(self, queries: Sequence[LinearQuery], *, isolate: bool = False) -> TableState:
        """A copy of this state with its atoms refined for ``queries``; this state is unchanged.

        How a statement is planned: its refinements stay on the copy, so a statement that
        is refused (or answered from history) leaves no trace in the live state; a fresh
        release reaches the live state only as a ledger record (:meth:`record`).
        The copy shares arrays with this state until it replaces them: refining replaces
        the partition's, the BLUE's and the costs' arrays and never writes into them, and
        the planner copies the BLUE before appending to it.

        Args:
            queries: the statement's queries.
            isolate: apply the rule releases are recorded by (:meth:`record`): a query
                with more than :data:`MAX_ATOM_WEIGHTS` distinct weights, or one the
                atoms cannot hold within their limit, stays outside them (its position
                goes to ``outside``; its support refines them) instead of refining them
                or being refused.

        Raises:
            UnsupportedQuery: a query exceeds the atom limits and ``isolate`` is False.
        """
        trial = copy.copy(self)
        trial.atoms, trial.blue, trial.costs = copy.copy(self.atoms), copy.copy(self.blue), copy.copy(self.costs)
        trial.charge_base = copy.copy(self.atoms)  # refine() replaces arrays: a shallow copy is a snapshot
        trial.base_costs = copy.copy(self.costs)  # so do add() and split()
        trial._charges = None
        if self._known:
            # Every query already recorded (held, or outside when that is allowed): nothing to refine.
            seen = [True if q.is_zero else self._known.get(_held_key(q)) for q in queries]
            if all(k is True or (isolate and k is False) for k in seen):
                trial.outside = frozenset(i for i, k in enumerate(seen) if k is False)
                return trial
        outside = set()
        with trial._deferred_splits():
            prepared = isolate and trial.prepare(queries)
            for i, q in enumerate(queries):
                if not isolate:
                    trial.refine(q)
                elif not trial._hold(q, prepared=prepared):
                    outside.add(i)
        trial.outside = frozenset(outside)
        return trial

    def prepare(self, queries: Sequence[LinearQuery]) -> bool:
        """Refine the atoms for many disjoint queries (a GROUP BY's groups) in one split.

        Best effort, for speed only: the atoms become exactly what refining by each of
        the (non-wide) queries in turn would give — the coarsest partition on which each
        is constant — or stay as they are if the queries overlap or the split would
        exceed the atom limit (then :meth:`_hold` refines and isolates query by query).
        Returns whether every query it would hold (zero and wide ones aside) is now
        constant on the atoms.
        """
        held = [q for q in queries if _held(q)]
        if len(held) < 2:
            return False
        split, run = _joint_split(self.table, held)
        if run < len(held):
            # Overlapping supports: no single split describes them.  Split by their leading run of
            # disjoint queries (a hierarchical tree's leaves, released first), which refining
            # query by query does first anyway; the others are refined one by one.
            if split is not None:
                with contextlib.suppress(UnsupportedQuery):
                    self.refine(split)
            return False
        assert split is not None
        try:
            self.refine(split)
        except UnsupportedQuery:
            return False  # left as it was
        return True

    def _hold(self, query: LinearQuery, *, prepared: bool = False) -> bool:
        """Refine the atoms for ``query``; False when it stays outside them (its support,
        when the atoms can hold that, refines them instead)."""
        if _held(query):
            if prepared:  # :meth:`prepare` made it constant on the atoms
                return True
            try:
                self.refine(query)
                return True
            except UnsupportedQuery:
                pass  # the atoms are left as they were
        try:
            self.refine(_support(self.table, query))
        except UnsupportedQuery:
            pass  # charged on every cell instead (isolated_weights)
        return False

    def record(
        self, record_id: int, query: LinearQuery, scale: float, value: float, lattice: float, alpha: float,
        sensitivity: float, *, prepared: bool = False,
    ) -> None:
        """Add one released answer of ``query`` (ledger record ``record_id``) to the inference state and the costs.

        A query the atoms do not hold (see :meth:`refined`) joins its
        :func:`isolation_key`'s releases and is charged by :meth:`isolated_weights`.
        ``prepared``: :meth:`prepare` returned True for a batch holding ``query``.
        """
        if not self._hold(query, prepared=prepared):
            self._record_isolated(query, scale, value, lattice, alpha, sensitivity)
            return
        h = self.atoms.vector(query)
        self.blue.append(h, scale, value, lattice=lattice)
        self.costs.add(h, alpha, sensitivity)
        self._remember([query], True)
        self.queries.append(query)
        self.record_ids.append(record_id)
        self.alphas.append(alpha)
        self.sensitivities.append(sensitivity)

    def _record_isolated(
        self, query: LinearQuery, scale: float, value: float, lattice: float, alpha: float, sensitivity: float
    ) -> None:
        key, factor = isolation_key(query)
        self.isolated.setdefault(key, IncrementalBLUE(_ONE)).append([factor], scale, value, lattice=lattice)
        self.costs.add(self.isolated_weights(query), alpha, sensitivity)
        self._remember([query], False)

    def record_many(
        self, items: Sequence[tuple[int, LinearQuery, float, float, float, float, float]], *, prepared: bool = False
    ) -> None:
        """:meth:`record` for each ``(record_id, query, scale, value, lattice, alpha, sensitivity)``
        in turn, with each run of queries the atoms hold added to the BLUE as one block.

        The same state as recording them one by one: a run's refinements are the ones
        :meth:`record` would make, in the same order; its rows, charges and vectors are
        taken on the atoms after the last of them, which is exact (a split divides atoms,
        and the BLUE and the costs split with them).
        """
        run: list[tuple[int, LinearQuery, float, float, float, float, float]] = []

        def flush() -> None:
            self._split_now()
            if not run:
                return
            rows = np.array([self.atoms.vector(it[1]) for it in run])
            self.costs.add_many(rows, [it[5] for it in run], [it[6] for it in run])
            for rid, query, _, _, _, alpha, sensitivity in run:
                self.queries.append(query)
                self.record_ids.append(rid)
                self.alphas.append(alpha)
                self.sensitivities.append(sensitivity)
            self.blue.extend(rows, [it[2] for it in run], [it[3] for it in run], [it[4] for it in run])
            self._remember([it[1] for it in run], True)
            run.clear()

        with self._deferred_splits():
            for item in items:
                if self._hold(item[1], prepared=prepared):
                    run.append(item)
                    continue
                flush()  # outside the atoms: recorded after everything before it
                self._record_isolated(*item[1:])
            flush()

    def _remember(self, queries: Sequence[LinearQuery], held: bool) -> None:
        """Note whether the atoms hold ``queries`` (just recorded on them, or outside them)."""
        if self._known is None:
            self._known = {}
        self._known.update((_held_key(q), held) for q in queries)

    def recorded_charges(self, parts: Sequence[tuple[LinearQuery, float, float]]) -> tuple[int, list[int]]:
        """The table's exact charge, in units, before and after each of ``parts``
        ``(query, α, S)`` once they are recorded as one statement's releases, in order.

        Simulated the way the gateway applies a statement's ledger records (:meth:`prepare`
        on all of them, then :meth:`record_many`), on the live state a planning copy was
        refined from (``charge_base``, ``base_costs``), the BLUE left out.  A query outside
        the atoms is charged on the atoms it meets when it is recorded (:meth:`isolated_weights`),
        which the statement's refined copy cannot see — its groups' supports split the
        atoms one after the other — so this, not a sum over the plan, is the charge to
        check against the budget and to quote.
        """
        key = tuple(parts)  # holds the queries (an id could be reused once they are freed); equal queries charge alike
        if self._charges is not None and self._charges[0] == key:
            return self._charges[1]
        base_atoms = self.charge_base if self.charge_base is not None else self.atoms
        base_costs = self.base_costs if self.base_costs is not None else self.costs
        sim = TableState(self.table, copy.copy(base_atoms), cast(IncrementalBLUE, _NoBLUE()), copy.copy(base_costs))
        prepared = sim.prepare([q for q, _, _ in parts])
        start, after = sim.costs.charge_units, []
        for q, alpha, sensitivity in parts:
            sim.record_many([(0, q, 1.0, 0.0, 0.0, alpha, sensitivity)], prepared=prepared)
            after.append(sim.costs.charge_units)
        self._charges = key, (start, after)
        return start, after

    def isolated_weights(self, query: LinearQuery) -> np.ndarray:
        """The atom vector a release of ``query`` outside the atoms is charged as.

        ``S`` on every atom that meets its support (cost α each: ``|q_j|/S ≤ 1`` bounds
        the true per-cell cost).  "Meets" is judged on the live atoms (``charge_base``
        in a planning copy): the live atoms only get finer until the release is recorded,
        and finer atoms meet fewer cells, so a release is never recorded at a higher
        charge than it was planned at (the charge checked and quoted is the recorded one
        exactly: :meth:`recorded_charges`).  When the atoms hold the support
        (usually: :meth:`_hold` refines them by it) this is exactly its support.  If even
        the grid that would show which atoms meet it is over the limit: every atom.
        """
        s = query.sensitivity
        base = self.charge_base if self.charge_base is not None else self.atoms
        support = _support(self.table, query)
        names = {c.lower() for c in (*base.columns, *support.columns)}
        cols = tuple(c.name for c in self.table.columns if c.name.lower() in names)
        mine = {c.lower(): b for c, b in zip(base.columns, base.breakpoints, strict=True)}
        theirs = {c.lower(): b for c, b in zip(support.columns, support.breakpoints, strict=True)}
        grid = tuple(tuple(sorted({*mine.get(c.lower(), ()), *theirs.get(c.lower(), ())})) for c in cols)
        if math.prod(len(b) for b in grid) > base.max_grid:
            return np.full(self.atoms.n_atoms, s)
        labels = base.labels
        for ax, (c, bp) in enumerate(zip(cols, grid, strict=True)):
            if c.lower() in mine:  # the atoms' slab of each finer slab
                idx = np.searchsorted(np.asarray(mine[c.lower()]), np.asarray(bp), side="right") - 1
                labels = np.take(labels, idx, axis=ax)
            else:
                labels = np.expand_dims(labels, ax)
        labels = np.broadcast_to(labels, tuple(len(b) for b in grid))
        met = np.zeros(base.n_atoms, dtype=bool)
        met[np.unique(labels[support.expand(self.table, cols, grid) != 0])] = True
        # The met live atoms as a region of the domain, then on this state's (finer) atoms.
        region = LinearQuery.from_grid(self.table, base.columns, base.breakpoints, met[base.labels].astype(float))
        return self.atoms.vector(region) * s

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


class _NoBLUE:
    """Stands in for the BLUE where only the costs are simulated (:meth:`TableState.recorded_charges`)."""

    def split(self, parent: np.ndarray, sizes: np.ndarray) -> None:
        pass

    def extend(self, *args: object, **kwargs: object) -> None:
        pass


@dataclass(frozen=True, eq=False)
class TableView:
    """A frozen snapshot of one table's released history, taken by ``Gateway.locked_view``.

    This is the seam between the gateway and its extensions (``dpgate.model``,
    ``dpgate.warmstart``): they read history here, never the gateway's state.
    Everything in it is public structure (query vectors, the schema) or already
    released (noisy answers, their scales and budgets), so reading it is
    post-processing and spends nothing.  It holds copies: later releases or
    refinements do not change it, and it may be read after the lock is released.

    Attributes:
        table: the declared table.
        atoms: the atom partition at snapshot time (a private copy; every released
            query, and every query the view was asked to refine, is constant on its atoms).
        rows: ``m × n_atoms`` weights of the released queries over atoms, release order (read-only).
        values: the ``m`` released noisy answers (read-only).
        scales: their Laplace scales ``b_i = S_i/α_i`` (read-only).
        lattice: their lattice steps ``γ_i`` (0 = continuous; read-only).
        alphas: the budget ``α_i`` of each release (read-only).
        sensitivities: ``S_i = max|q_i|`` of each release (read-only).
        queries: the released linear queries (offset 0), release order.
        record_ids: the ledger record id of each release.
    """

    table: Table
    atoms: AtomPartition
    rows: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    scales: np.ndarray = field(repr=False)
    lattice: np.ndarray = field(repr=False)
    alphas: np.ndarray = field(repr=False)
    sensitivities: np.ndarray = field(repr=False)
    queries: tuple[LinearQuery, ...] = field(repr=False)
    record_ids: tuple[int, ...] = field(repr=False)
    _blue: IncrementalBLUE = field(repr=False)

    @property
    def m(self) -> int:
        """Number of released answers."""
        return len(self.record_ids)

    def vector(self, query: LinearQuery) -> np.ndarray:
        """``query``'s weight on each atom (it must be constant on them: pass it to ``locked_view``)."""
        return self.atoms.vector(query)

    def estimate(self, query: LinearQuery | np.ndarray) -> Estimate:
        """The BLUE of ``query`` (or of an atom vector) from this history (Xiao & Xiong (2012), Theorem 3.1)."""
        h = self.vector(query) if isinstance(query, LinearQuery) else query
        return self._blue.estimate(h)  # estimate() only reads the BLUE's state


def _frozen(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.array(values, dtype=float)
    arr.setflags(write=False)
    return arr


#: Recent joint splits (:func:`_joint_split`): a statement's groups are split for planning
#: and again when its records reach the live state.
_JOINT_SPLITS: dict[tuple[object, ...], tuple[LinearQuery | None, int]] = {}
_JOINT_SPLITS_MAX = 32
_JOINT_SPLITS_LOCK = threading.Lock()


def _joint_split(table: Table, held: Sequence[LinearQuery]) -> tuple[LinearQuery | None, int]:
    """``(split, k)``: the first k queries of ``held`` have pairwise disjoint supports (k is
    ``len(held)`` when all have), and refining by ``split`` makes each of them constant
    (distinct weights of disjoint supports numbered apart; ``None`` when k < 2).
    A pure function of the queries (not of any atoms), memoised on their :func:`_held_key`."""
    key = (table, tuple(_held_key(q) for q in held))
    with _JOINT_SPLITS_LOCK:
        if key in _JOINT_SPLITS:
            return _JOINT_SPLITS[key]
    split = _compute_joint_split(table, held)
    with _JOINT_SPLITS_LOCK:
        while len(_JOINT_SPLITS) >= _JOINT_SPLITS_MAX:
            del _JOINT_SPLITS[next(iter(_JOINT_SPLITS))]
        _JOINT_SPLITS[key] = split
    return split


def _compute_joint_split(table: Table, held: Sequence[LinearQuery]) -> tuple[LinearQuery | None, int]:
    names = {c.lower() for q in held for c in q.columns}
    cols = tuple(c.name for c in table.columns if c.name.lower() in names)
    bps: dict[str, set[int]] = {c.lower(): set() for c in cols}
    for q in held:
        for c, b in zip(q.columns, q.breakpoints, strict=True):
            bps[c.lower()].update(b)
    grid = tuple(tuple(sorted(bps[c.lower()])) for c in cols)
    code = np.zeros(tuple(len(b) for b in grid), dtype=np.int64)
    base, run = 0, len(held)
    for k, q in enumerate(held):
        e = q.expand(table, cols, grid)
        on = e != 0
        if code[on].any():
            run = k
            break
        _, rank = np.unique(e[on], return_inverse=True)
        code[on] = base + 1 + rank
        base += int(rank.max(initial=0)) + 1
    return (LinearQuery.from_grid(table, cols, grid, code.astype(float)) if run >= 2 else None), run
