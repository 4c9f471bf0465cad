"""A table's released history: the gateway's live state and its frozen snapshot.

:class:`TableState` is what the gateway updates as ledger records arrive (atoms,
the incremental BLUE, per-cell costs, the released queries); only the gateway
holds one.  :class:`TableView` is its frozen snapshot, the seam through which
extensions (``dpgate.model``, ``dpgate.warmstart.design``) read history:
``Gateway.locked_view`` hands one out under the gateway's lock.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
import weakref
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dpgate.compile.query import LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.inference import ErrorLaw, Estimate, IncrementalBLUE, Posterior
from dpgate.plan.accounting import CellCosts
from dpgate.plan.atoms import AtomPartition, BoxGrid, GridVersion, joint_split
from dpgate.schema.domains import Table

__all__ = ["COST_MAX_BOXES", "DEFAULT_MAX_ATOMS", "Repeats", "TableState", "TableView", "isolation_key"]

_ONE = np.ones(1)
#: What a release is charged as: the cost atoms it touches and its weight on each.
Charge = tuple[np.ndarray, np.ndarray]
_NO_CHARGE: Charge = (np.zeros(0, dtype=np.int64), np.zeros(0))

#: Default working limit on a table's inference atoms (``Gateway(max_atoms=...)``): the
#: inference costs O(rank × atoms) per query, so this bounds every decision's latency.  A
#: statement that would split the atoms further is estimated from its exact repeats only
#: (see :meth:`TableState.hold`).
DEFAULT_MAX_ATOMS = 20_000
#: Limit on a table's cost atoms, the boxes of the grid of every release's breakpoints
#: (per-cell accounting is cheap per box: int64 sums and a max; 128 MiB of costs at most).
COST_MAX_BOXES = 2**24
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
    """What decides whether ``query`` is constant on a partition: :attr:`LinearQuery.pattern`."""
    return query.pattern


def _charge_key(query: LinearQuery) -> tuple[object, ...]:
    """What a query's charge depends on: its weight pattern *and* its denominator (the pattern
    alone is shared by ``COUNT(*)`` and ``COUNT(*) / 4``, whose weights differ)."""
    return (query.pattern, query.denominator)


def isolation_key(query: LinearQuery) -> tuple[str, float]:
    """``(key, factor)``: ``query`` is ``factor`` times the query the key names.

    Queries kept outside the atoms (see :meth:`TableState.refined`) are reused only
    across exact repeats and rescalings: two queries share a key iff they have the same
    grid and proportional weights (numerators divided by their gcd, first non-zero
    positive).  Zero queries are never measured and have no key.

    Memoised by the query's weights (a GROUP BY's isolated groups are keyed when planned
    and again when recorded).
    """
    memo = (query.table.lower(), query.pattern, query.denominator)
    found = _ISOLATION_KEYS.get(memo)
    if found is None:
        if len(_ISOLATION_KEYS) >= _ISOLATION_KEYS_MAX:
            _ISOLATION_KEYS.clear()
        found = _ISOLATION_KEYS[memo] = _isolation_key(query)
    return found


_ISOLATION_KEYS: dict[tuple[object, ...], tuple[str, float]] = {}
_ISOLATION_KEYS_MAX = 1 << 16


def _isolation_key(query: LinearQuery) -> tuple[str, float]:
    nums = np.asarray(query.numerators, dtype=np.int64).ravel()
    nonzero = np.flatnonzero(nums)
    g = int(np.gcd.reduce(np.abs(nums))) * (1 if nums[nonzero[0]] > 0 else -1)
    digest = hashlib.sha256(
        repr((query.table.lower(), query.columns, query.breakpoints, query.numerators.shape)).encode()
        + (nums // g).tobytes()
    ).hexdigest()
    return digest, g / query.denominator


@dataclass(frozen=True)
class Repeats:
    """The releases of one query kept outside the atoms, and of its rescalings (one
    :func:`isolation_key`): per release ``(factor, scale, value, lattice)``.  Its one-atom
    BLUE is built when first read — most such queries (a GROUP BY's isolated groups) are
    never asked again.  Immutable: :meth:`plus` returns a new one."""

    rows: tuple[tuple[float, float, float, float], ...] = ()
    _blue: list[IncrementalBLUE] = field(default_factory=list, repr=False, compare=False)

    def blue(self) -> IncrementalBLUE:
        """The BLUE over these releases (one atom: the key's query); copy it before appending."""
        if not self._blue:
            blue = IncrementalBLUE(_ONE)
            for factor, scale, value, lattice in self.rows:
                blue.append([factor], scale, value, lattice=lattice)
            self._blue.append(blue)
        return self._blue[0]

    def estimate(self, factor: float) -> Estimate:
        """The BLUE of ``factor`` times the key's query from these releases, in closed form
        (what :meth:`blue`'s ``estimate([factor])`` gives: one unknown, so each release
        ``(f, b)`` is weighted by ``f/b²``), without building the BLUE."""
        f, b, y, g = (np.array(col, dtype=float) for col in zip(*self.rows, strict=True))
        A = factor * (f / b**2) / float(np.dot(f, f / b**2))
        value = float(A @ y)
        law = ErrorLaw(A, b, g)
        return Estimate(value, _frozen(A), law.variance, True, Posterior(value, law), _frozen(b), _frozen(g))

    def plus(self, factor: float, scale: float, value: float, lattice: float) -> Repeats:
        """These releases and one more."""
        out = Repeats((*self.rows, (factor, scale, value, lattice)))
        if self._blue:  # already built: extend a copy rather than rebuild
            blue = self._blue[0].copy()
            blue.append([factor], scale, value, lattice=lattice)
            out._blue.append(blue)
        return out


_NO_REPEATS = Repeats()


@dataclass
class TableState:
    """Everything known about one table's releases.

    Two partitions of the domain serve two purposes:

    * ``atoms`` (at most ``max_atoms``, a working limit) carry the inference: the BLUE
      over the released queries they hold.  A query they cannot hold within the limit
      stays outside them and is estimated from its exact repeats only (``isolated``);
      a GROUP BY is held whole or not at all.  Estimating from a subset of history is
      still an unbiased estimator with an exact error law: only reuse is lost.
    * ``cost_atoms`` — the boxes of the grid of every release's breakpoints (a
      :class:`~dpgate.plan.atoms.BoxGrid`, up to :data:`COST_MAX_BOXES`; costs are cheap per
      box) — carry the per-cell accounting: every release refines them, so its cost
      ``(α/S)|q_j|`` is charged on exactly the cells it touches, whether or not the
      inference atoms hold it — except
      a query with more than :data:`MAX_ATOM_WEIGHTS` distinct weights (``SUM(income)``),
      charged ``α`` on its support (``|q_j|/S ≤ 1``: an upper bound; pricing 500 001
      weights exactly takes seconds).  They refine ``atoms`` (every query held by the
      atoms refines them too), so a query constant on the atoms is constant on them.

    ``queries``, ``record_ids``, ``alphas`` and ``sensitivities`` list the releases
    the atoms hold, in order (row ``i`` of ``blue`` is record ``record_ids[i]``).
    """

    table: Table
    atoms: AtomPartition
    blue: IncrementalBLUE
    costs: CellCosts
    cost_atoms: BoxGrid
    queries: list[LinearQuery] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)
    alphas: list[float] = field(default_factory=list)
    sensitivities: list[float] = field(default_factory=list)
    #: Releases of queries the atoms do not hold, by :func:`isolation_key`: per key, the
    #: released factors and the one-atom BLUE over them (:class:`Repeats`).
    isolated: dict[str, Repeats] = field(default_factory=dict)
    #: In a planning copy (:meth:`refined`), the positions of the statement's queries
    #: that stay outside the atoms.
    outside: frozenset[int] = frozenset()
    #: By :func:`_held_key`, each recorded query: True when the atoms hold it, False when it
    #: stays outside them.  The atoms only get finer, so a held query stays constant on them,
    #: and one left outside stays outside: a repeat needs no refinement.
    _known: dict[tuple[object, ...], bool] | None = field(default=None, repr=False)
    #: By :func:`_held_key`, how the cost atoms hold each query refined into them:
    #: ``"exact"`` (constant on them), ``"support"`` (only its support is) or ``"all"``
    #: (neither fits the limits: charged ``S`` on every cost atom).
    _cost_kind: dict[tuple[object, ...], str] = field(default_factory=dict, repr=False)
    #: Whether the cost atoms refine the inference atoms (true unless a query the atoms
    #: hold did not fit the cost atoms' limits).
    _costs_refine: bool = field(default=True, repr=False)
    #: Cached :meth:`_atom_members`, with the label arrays of the partitions it was made for.
    _members: tuple[object, object, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = field(default=None, repr=False)
    #: Inside :meth:`_deferred_splits`: the composed split not yet applied to the BLUE.
    _pending: np.ndarray | None = field(default=None, repr=False)
    #: :meth:`remember_recorded_charges`: the costs it started from, the parts, the charges after each and the costs.
    _recorded: tuple[CellCosts, list[tuple[Charge, float, float]], list[int], CellCosts] | None = field(
        default=None, repr=False)
    #: In a planning copy made with isolation, the :func:`_held_key` of the queries it was refined for.
    _planned: tuple[tuple[object, ...], ...] | None = field(default=None, repr=False)
    _deferring: bool = field(default=False, repr=False)
    #: By :func:`_charge_key` (equal keys, equal vectors), the row of ``blue`` a query the
    #: atoms hold was last released as: a repeat's coordinates are that row's.
    _row_of: dict[tuple[object, ...], int] = field(default_factory=dict, repr=False)

    @classmethod
    def new(cls, table: Table, max_atoms: int = DEFAULT_MAX_ATOMS) -> TableState:
        """Empty history on the one-atom partitions (at most ``max_atoms`` inference atoms)."""
        atoms = AtomPartition(table, max_atoms=max_atoms)
        cost_atoms = BoxGrid(table, max_grid=COST_MAX_BOXES)
        return cls(
            table, atoms, IncrementalBLUE(atoms.cell_sizes, keep_rows=False),
            CellCosts(1, table.max_rows_per_individual), cost_atoms,
        )

    # -- the cost atoms -------------------------------------------------------------
    def _charge_refine(self, queries: Sequence[LinearQuery]) -> None:
        """Refine the cost atoms so that each of ``queries`` is charged exactly (as far as
        their limits allow): disjoint queries (a GROUP BY's groups) in one split."""
        live = [q for q in queries if not q.is_zero and _held_key(q) not in self._cost_kind]
        narrow = [q for q in live if _held(q)]
        if len(narrow) > 1:
            split, run = joint_split(self.table, narrow)  # run: its leading disjoint queries
            if split is not None and self._cost_split(split):
                self._cost_kind.update((_held_key(q), "exact") for q in (*narrow[:run], split))
        for q in live:
            key = _held_key(q)
            if key in self._cost_kind:
                continue
            if _held(q) and self._cost_split(q):
                self._cost_kind[key] = "exact"
            elif self._cost_split(_support(self.table, q)):  # a wide query: priced per weight, too slow
                self._cost_kind[key] = "support"
            else:
                self._cost_kind[key] = "all"

    def _cost_split(self, query: LinearQuery) -> bool:
        """Refine the cost atoms (and split the costs with them) by ``query``; False when over their limits."""
        try:
            expand = self.cost_atoms.regrid(query)
        except UnsupportedQuery:
            return False
        if expand is not None:
            self.costs.regrid(expand)
        return True

    def charges(self, queries: Sequence[LinearQuery]) -> list[Charge]:
        """What a release of each of ``queries`` is charged as, over the cost atoms: the cost
        atoms it touches and its weight on each — its weights when the cost atoms hold it;
        else ``S`` on those its support meets (``|q_j|/S ≤ 1`` bounds the true per-cell
        cost), or on every one.  The queries must have been refined into the cost atoms
        (:meth:`_charge_refine`); disjoint ones are located by one pass over the cost atoms.
        """
        memo = _charge_memo(self.cost_atoms)
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
        codes, boxes = self.cost_atoms.boxes_by_cell(split)  # codes on the split's own columns: small
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
        exactly (:meth:`~dpgate.plan.atoms.BoxGrid.nonzero_weights`), else as a dense vector."""
        kind = self._cost_kind[_held_key(query)]
        if kind == "exact":
            found = self.cost_atoms.nonzero_weights(query)
            if found is not None:
                return found
            v = self.cost_atoms.vector(query)
        elif kind == "support":
            v = self.cost_atoms.vector(_support(self.table, query)) * query.sensitivity
        else:
            v = np.full(self.cost_atoms.n_atoms, query.sensitivity)
        on = np.flatnonzero(v)
        return on, v[on]

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
        ``S`` on every cost atom when they do not."""
        members = self._atom_members()
        if members is None:
            return np.arange(self.cost_atoms.n_atoms), np.full(self.cost_atoms.n_atoms, sensitivity)
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
        keys = (self.cost_atoms.version, self.atoms.labels.base)
        found = self._members
        if found is None or found[0] != keys[0] or found[1] is not keys[1]:
            of = self.cost_atoms.atom_of(self.atoms)
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
            if self._cost_kind[_held_key(query)] != "exact":
                self._costs_refine = False
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
            trial._planned = tuple(_held_key(q) for q in queries)
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
            if seen is False or (seen is None and not _held(q)):
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

    def record_many(self, items: Sequence[tuple[int, LinearQuery, float, float, float, float, float]]) -> None:
        """Add one statement's released answers ``(record_id, query, scale, value, lattice,
        α, sensitivity)``, in order: their costs, and each to the BLUE (as one block) or to
        its exact repeats' history when the atoms do not hold it (:meth:`hold`).

        The same state as recording them one by one: the costs are exact per cell whatever
        the order, and the BLUE's rows are taken on the atoms after the last refinement,
        which is exact (a split divides atoms, and the BLUE splits with them).
        """
        if not items:
            return
        queries = [it[1] for it in items]
        self._charge_refine(queries)
        outside = self.hold(queries)
        self._add_costs(items)
        self._append(items, outside)

    def _append(self, items: Sequence[tuple[int, LinearQuery, float, float, float, float, float]],
                outside: Set[int], vectors: Sequence[np.ndarray] | None = None) -> None:
        """Add released answers (their queries refined) to the BLUE, or — the positions in
        ``outside`` — to their exact repeats' history.  ``vectors``: each query's vector over
        the atoms when the caller has them (the planner's, on these very atoms)."""
        queries = [it[1] for it in items]
        held = [it for i, it in enumerate(items) if i not in outside]
        for i in sorted(outside):
            _, query, scale, value, lattice, _, _ = items[i]
            key, factor = isolation_key(query)
            self.isolated[key] = self.isolated.get(key, _NO_REPEATS).plus(factor, scale, value, lattice)
        if held:
            rows = _stacked([self.atoms.vector(it[1]) for it in held] if vectors is None else
                            [v for i, v in enumerate(vectors) if i not in outside])
            for rid, query, _, _, _, alpha, sensitivity in held:
                self._row_of[_charge_key(query)] = len(self.queries)
                self.queries.append(query)
                self.record_ids.append(rid)
                self.alphas.append(alpha)
                self.sensitivities.append(sensitivity)
            self.blue.extend(rows, [it[2] for it in held], [it[3] for it in held], [it[4] for it in held])
        self._remember([q for i, q in enumerate(queries) if i not in outside], True)
        self._remember([queries[i] for i in outside], False)

    def _add_costs(self, items: Sequence[tuple[int, LinearQuery, float, float, float, float, float]]) -> None:
        """Charge each release ``(α/S)|q_j|`` on the cost atoms; the disjoint releases of one
        (α, S) — a GROUP BY's groups — as one sum (each cost atom then gets one weight, so the
        rounding is the one of adding them one by one)."""
        by_budget: dict[tuple[float, float], list[Charge]] = {}
        for (_, _, _, _, _, alpha, sensitivity), charge in zip(items, self.charges([it[1] for it in items]), strict=True):
            by_budget.setdefault((alpha, sensitivity), []).append(charge)
        for (alpha, sensitivity), found in by_budget.items():
            atoms = np.concatenate([a for a, _ in found])
            touched = np.zeros(self.cost_atoms.n_atoms, dtype=bool)
            touched[atoms] = True
            if np.count_nonzero(touched) == atoms.size:
                self.costs.add_sparse(atoms, np.concatenate([w for _, w in found]), alpha, sensitivity)
            else:
                for a, w in found:
                    self.costs.add_sparse(a, w, alpha, sensitivity)

    def _remember(self, queries: Sequence[LinearQuery], held: bool) -> None:
        """Note whether the atoms hold ``queries`` (just recorded on them, or outside them)."""
        if self._known is None:
            self._known = {}
        self._known.update((_held_key(q), held) for q in queries)

    def recorded_charges(self, parts: Sequence[tuple[Charge, float, float]]) -> tuple[int, list[int], CellCosts]:
        """The table's exact charge, in units, before and after each of ``parts``
        ``(charge, α, S)`` (a statement's releases, in order, charged by :meth:`charges`
        on this refined copy — exactly what recording them adds), and the costs after all
        of them (what :meth:`record_planned` installs)."""
        found = self._recorded
        if found is not None and found[0] is self.costs and _same_charges(found[1], parts):
            return self.costs.charge_units, found[2], found[3]  # priced so by the planner
        costs, after = self.costs.copy(), []
        for (atoms, weights), alpha, sensitivity in parts:
            costs.add_sparse(atoms, weights, alpha, sensitivity, in_place=True)
            after.append(costs.charge_units)
        return self.costs.charge_units, after, costs

    def remember_recorded_charges(self, parts: Sequence[tuple[Charge, float, float]], after: list[int],
                                  costs: CellCosts) -> None:
        """Note what the planner found :meth:`recorded_charges` of ``parts`` to be (``after``:
        the charge after each; ``costs``: its own copy of the costs after all of them), so
        that recording them in that order does not price them again."""
        self._recorded = (self.costs, list(parts), list(after), costs)

    def planned_for(self, queries: Sequence[LinearQuery]) -> bool:
        """Whether this planning copy was refined (:meth:`refined`, with isolation) for exactly
        ``queries`` — then recording them needs no refinement: :meth:`record_planned`."""
        return self._planned == tuple(_held_key(q) for q in queries)

    def record_planned(
        self, items: Sequence[tuple[int, LinearQuery, float, float, float, float, float]], costs: CellCosts,
        vectors: Sequence[np.ndarray],
    ) -> None:
        """:meth:`record_many` on the planning copy of exactly these queries (:meth:`planned_for`),
        with the costs :meth:`recorded_charges` computed and the planner's vector of each query
        (its ``Measurement.h``): the same state, without refining the partitions, pricing the
        releases or locating them on the atoms a second time.  The lists and maps this copy
        shares with the state it was made from are copied first, so that state stays intact
        whatever happens here."""
        self.queries, self.record_ids, self._row_of = list(self.queries), list(self.record_ids), dict(self._row_of)
        self.alphas, self.sensitivities = list(self.alphas), list(self.sensitivities)
        self.isolated, self._known = dict(self.isolated), dict(self._known or {})
        self.costs = costs
        self._append(items, self.outside, vectors)
        self.outside, self._planned, self._recorded = frozenset(), None, None

    def __getstate__(self) -> dict[str, object]:
        """Pickled (checkpointed) without the map of cost atoms onto atoms and the planner's
        priced charges: derived, and as large as the cost grid."""
        return {**self.__dict__, "_members": None, "_recorded": None}

    def __copy__(self) -> TableState:
        """A shallow copy that keeps the derived caches (:meth:`__getstate__` drops them for
        a checkpoint; a planning copy reuses them: they are replaced, never written)."""
        new = object.__new__(TableState)
        new.__dict__.update(self.__dict__)
        return new

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        if "_row_of" not in state:  # a checkpoint written before the map existed
            self._row_of = {_charge_key(q): i for i, q in enumerate(self.queries)}

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


@dataclass(frozen=True, eq=False)
class TableView:
    """A frozen snapshot of one table's released history, taken by ``Gateway.locked_view``.

    This is the seam between the gateway and its extensions (``dpgate.model``,
    ``dpgate.warmstart.design``): they read history here, never the gateway's state.
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


def _same_charges(a: Sequence[tuple[Charge, float, float]], b: Sequence[tuple[Charge, float, float]]) -> bool:
    """Whether two sequences of ``(charge, α, S)`` are the same releases in the same order
    (charges compared as the memoised objects they are, so equal objects mean equal charges)."""
    return len(a) == len(b) and all(
        x[0] is y[0] and x[1] == y[1] and x[2] == y[2] for x, y in zip(a, b, strict=True))


def _frozen(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.array(values, dtype=float)
    arr.setflags(write=False)
    return arr


#: :meth:`TableState.charges` by :func:`_held_key`, per recent cost grid (a planning copy's
#: charges hold for the live state once it is refined alike).
_CHARGES: dict[GridVersion, dict[tuple[object, ...], Charge]] = {}
_CHARGES_MAX = 4


_CHARGES_LOCK = threading.Lock()


def _charge_memo(grid: BoxGrid) -> dict[tuple[object, ...], Charge]:
    with _CHARGES_LOCK:
        found = _CHARGES.get(grid.version)
        if found is None:
            while len(_CHARGES) >= _CHARGES_MAX:
                del _CHARGES[next(iter(_CHARGES))]
            found = _CHARGES[grid.version] = {}
        return found


#: Released rows are handed to the BLUE as a sparse matrix above this many dense entries
#: (32 MB): a tree's 8 191 nodes over 4 096 atoms have 13 non-zeros per atom, not 4 096.
_SPARSE_ROWS = 1 << 22


def _stacked(vectors: Sequence[np.ndarray]) -> np.ndarray | sp.csr_matrix:
    """The vectors as the rows of one matrix: sparse when the dense one would be large."""
    if len(vectors) * vectors[0].size <= _SPARSE_ROWS:
        return np.array(vectors)
    nonzero = [np.flatnonzero(v) for v in vectors]
    indptr = np.zeros(len(vectors) + 1, dtype=np.int64)
    np.cumsum([i.size for i in nonzero], out=indptr[1:])
    data = np.concatenate([v[i] for v, i in zip(vectors, nonzero, strict=True)])
    return sp.csr_matrix((data, np.concatenate(nonzero), indptr), shape=(len(vectors), vectors[0].size))
