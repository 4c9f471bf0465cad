"""Wide queries as functions on slabs: ``SUM(income)`` as (atom, moment) coordinates (issue 28).

A query with more weights than the inference atoms hold (``SUM(income)``: 500 001 weights) is,
on every box of the other columns × a *slab* of one integer column ``c``, linear in ``c``'s value:
``w(cell) = A(box) + B(box)·value(cell)``.  Over rows, such a query is
``Σ_box A(box)·count(box) + B(box)·moment(box)`` with ``moment(box) = Σ value`` over the box's
rows: a vector over a few (box, count or moment) coordinates rather than 500 001 weights.

:func:`lift` finds that form from the public weights alone (exact integer differences along
``c``) and writes it as a query on a *lifted* table — the table plus one virtual two-value column
(cell 0: the count, cell 1: the first moment of ``c``).  :class:`Moments` keeps the wide
releases of one table and one column on inference atoms of the lifted table (the same
:class:`~dpgate.plan.atoms.AtomPartition` and :class:`~dpgate.inference.IncrementalBLUE` as the
counts), so a wide query is estimated from every wide release over that column — its exact
repeats, but also the groups of a GROUP BY that add up to it, its complement, …

Why it is exact.  A lifted vector ``h`` denotes the functional ``Σ_a h_count[a]·x_a +
h_moment[a]·m_a``; when every atom holds cells of two values of ``c`` that map from coordinates
to functionals is injective, so a query is estimable from the lifted releases iff it is from
the same releases over cells, and the BLUE is the same.  An atom of one value (a slab of one
cell) has ``m_a = value·x_a``: the coordinates then treat ``m_a`` as free, which can only say
"not estimable" where cells would say "estimable" — never the reverse; an estimate it gives is
still unbiased with the exact error law of its weighted noises (reuse is lost, not coverage).
Counts never enter it (they stay on the table's own atoms), so nothing of theirs changes.
A zCDP gateway's (discrete Gaussian) releases enter with their deviation and family, as on the
atoms: the BLUE weighs each release by its variance, and the law of an estimate is the exact
normal one, or the mixed (Gil-Pelaez) one when the history also holds Laplace releases (a
converted pure ledger).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.inference import Estimate, IncrementalBLUE
from dpgate.plan.atoms import AtomPartition
from dpgate.schema.domains import Column, Table

__all__ = ["Lifted", "Moments", "lift", "moment_history", "record_moments"]

#: Most slabs of linearity a lifted query may keep along its column (beyond, it stays isolated:
#: weights that change slope at every cell are no cheaper lifted).
MAX_PIECES = 64
#: Largest partition a table's wide releases over one column are kept on.
MOMENT_MAX_ATOMS = 20_000


@dataclass(frozen=True)
class Lifted:
    """A wide query's lifted form: the integer column it is linear in, its query on the lifted
    table (numerators: the original's, so its weights are ``denominator`` times the query's)."""

    column: str
    query: LinearQuery
    denominator: int


@functools.lru_cache(maxsize=64)
def lifted_table(table: Table) -> Table:
    """``table`` plus the virtual two-value column (cell 0 count, cell 1 moment), by a name no
    declared column has (one object per declared table: lifted queries compare equal)."""
    name = "·moment"
    taken = {c.name.lower() for c in table.columns}
    while name.lower() in taken:
        name += "·"
    return Table(table.name, (*table.columns, Column(name, "integer", 0, 1)), table.rows,
                 table.max_rows_per_unit, table.schema, table.privacy_unit)


def lift(table: Table, query: LinearQuery) -> Lifted | None:
    """``query`` (its linear part) as a function on slabs linear in one integer column's value,
    or None when it is not (or needs more than :data:`MAX_PIECES` slabs).  Public weights only.

    The column is the query's integer column with the most slabs.  Along it, slabs of one cell
    form pieces while the weights' first differences stay equal for every box of the other
    columns; a wider slab (constant weight) or the NULL cell is a piece of its own, with slope 0.
    Memoised on the query's linear part (what a release records; a statement's query and its
    release share it)."""
    query = query.linear_part
    memo = query.__dict__.get("_lifted", False)
    if memo is not False:
        return memo
    found = _lift(table, query)
    query.__dict__["_lifted"] = found
    return found


def _lift(table: Table, query: LinearQuery) -> Lifted | None:
    candidates = [(len(bp), ax) for ax, (c, bp) in enumerate(zip(query.columns, query.breakpoints, strict=True))
                  if table.column(c).kind == "integer"]
    if not candidates or query.is_zero:
        return None
    _, ax = max(candidates)
    col = table.column(query.columns[ax])
    starts = np.asarray(query.breakpoints[ax], dtype=np.int64)
    n_slabs = starts.size
    null = col.n_cells - 1
    widths = np.diff(np.append(starts, col.n_cells))
    nums = np.moveaxis(np.asarray(query.numerators, dtype=np.int64), ax, -1).reshape(-1, n_slabs)
    unit = (widths == 1) & (starts != null)
    link = unit[:-1] & unit[1:]  # slabs s and s + 1 may share a piece
    d1 = np.diff(nums, axis=1)  # a unit step of the value between unit slabs
    same = np.ones(max(n_slabs - 1, 0), dtype=bool)  # same[s]: d1[:, s] == d1[:, s - 1]
    if n_slabs > 2:
        same[1:] = (d1[:, 1:] == d1[:, :-1]).all(axis=0)
    extend = link & same  # piece may run on from s to s + 1 (when s is not its first slab)
    stops = np.flatnonzero(~extend)
    pieces: list[tuple[int, int]] = []
    p = 0
    while p < n_slabs:
        if len(pieces) >= MAX_PIECES:
            return None
        if p == n_slabs - 1 or not link[p]:
            pieces.append((p, p + 1))
            p += 1
            continue
        k = int(np.searchsorted(stops, p + 1))  # first s ≥ p + 1 where the piece cannot run on
        end = int(stops[k]) if k < stops.size else n_slabs - 1
        pieces.append((p, end + 1))
        p = end + 1
    lo = col.int_range()[0]
    first = np.array([a for a, _ in pieces])
    slope = np.zeros((nums.shape[0], len(pieces)), dtype=np.int64)
    multi = np.array([b - a > 1 for a, b in pieces])
    slope[:, multi] = d1[:, first[multi]]
    base = nums[:, first] - slope * (lo + starts[first])  # A = w(first cell) − B·value(first cell)
    shape = [len(bp) for bp in query.breakpoints]
    shape[ax] = len(pieces)
    moved = [*shape[:ax], *shape[ax + 1:], len(pieces)]
    weights = np.stack([np.moveaxis(base.reshape(moved), -1, ax), np.moveaxis(slope.reshape(moved), -1, ax),
                        np.zeros(shape, dtype=np.int64)], axis=-1)
    lifted = lifted_table(table)
    bps = [*query.breakpoints[:ax], tuple(int(starts[a]) for a, _ in pieces), *query.breakpoints[ax + 1:], (0, 1, 2)]
    cols = [*query.columns, lifted.columns[-1].name]
    return Lifted(col.name, LinearQuery.from_grid(lifted, cols, bps, weights), query.denominator)


@dataclass(frozen=True)
class Moments:
    """The wide releases of one table over one column, on (atom, moment) coordinates.

    Immutable: :meth:`refined` and :meth:`plus` return new ones (the partition and the BLUE are
    copied, never written).  ``keys``: the :func:`~dpgate.plan.state.isolation_key` of every query
    released into it — a query is estimated from it only when every release of its key is here."""

    atoms: AtomPartition
    blue: IncrementalBLUE
    keys: frozenset[str] = frozenset()
    #: :meth:`vector` of the lifted queries asked so far (the atoms of one Moments never change).
    _vectors: dict[tuple[LinearQuery, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def new(cls, table: Table) -> Moments:
        atoms = AtomPartition(lifted_table(table), max_atoms=MOMENT_MAX_ATOMS)
        return cls(atoms, IncrementalBLUE(atoms.cell_sizes, keep_rows=False))

    def refined(self, lifted: Lifted) -> Moments | None:
        """These releases on atoms that hold ``lifted`` (self when they do), or None over the limits."""
        if self.atoms.n_atoms == self.atoms.labels.size and self.atoms.holds(lifted.query):
            return self  # every box an atom, and its breakpoints the grid's: constant on them (a repeat)
        atoms = copy.copy(self.atoms)
        try:
            parent = atoms.refine(lifted.query)
        except UnsupportedQuery:
            return None
        if parent is None:
            return self if atoms.n_atoms == self.atoms.n_atoms and atoms.breakpoints == self.atoms.breakpoints \
                else Moments(atoms, self.blue, self.keys)
        blue = self.blue.copy()
        blue.split(parent, atoms.cell_sizes)
        return Moments(atoms, blue, self.keys)

    def vector(self, lifted: Lifted) -> np.ndarray:
        """``lifted``'s query over these atoms (which must hold it), in the original query's weights."""
        key = (lifted.query, lifted.denominator)
        found = self._vectors.get(key)
        if found is None:
            found = self._vectors[key] = self.atoms.vector(lifted.query) / lifted.denominator
            found.setflags(write=False)
        return found

    def estimate(self, h: np.ndarray) -> Estimate:
        return self.blue.estimate(h)

    def plus(self, key: str, lifted: Lifted, scale: float, value: float, lattice: float,
             gaussian: bool = False) -> Moments | None:
        """These releases and one more of ``lifted`` (None when the atoms cannot hold it);
        ``gaussian``: its noise is (discrete) Gaussian of deviation ``scale``."""
        out = self.refined(lifted)
        if out is None:
            return None
        blue = out.blue.copy()
        blue.append(out.vector(lifted), scale, value, lattice=lattice, gaussian=gaussian)
        return Moments(out.atoms, blue, self.keys | {key})


def moment_history(table: Table, moments: dict[str, Moments], isolated: Mapping[str, object],
                   query: LinearQuery, key: str) -> tuple[Moments, np.ndarray] | None:
    """The moment history of a table (``moments``, by column; ``isolated``: the keys with exact
    repeats) that informs ``query`` (a wide query the atoms do not hold, of isolation key ``key``),
    refined to hold it, and its vector there; None when none does (it is not linear on slabs, an
    earlier release of it is not there, or it does not fit): then only its exact repeats do."""
    lifted = lift(table, query)
    if lifted is None:
        return None
    held = moments.get(lifted.column) or Moments.new(table)
    if key in isolated and key not in held.keys:
        return None
    found = held.refined(lifted)
    return None if found is None else (found, found.vector(lifted))


def record_moments(table: Table, moments: dict[str, Moments], isolated: Mapping[str, object], key: str,
                   query: LinearQuery, scale: float, value: float, lattice: float, gaussian: bool = False) -> None:
    """Add a release of a wide query the atoms do not hold to ``moments`` (in place), when it is
    linear on slabs of one column and every earlier release of its key (in ``isolated``, before
    this one is added there) is there too; else it and its repeats keep their exact repeats only."""
    lifted = lift(table, query)
    if lifted is None:
        return
    held = moments.get(lifted.column) or Moments.new(table)
    if key in isolated and key not in held.keys:
        return
    found = held.plus(key, lifted, scale, value, lattice, gaussian)
    if found is not None:
        moments[lifted.column] = found
