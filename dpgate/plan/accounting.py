"""Per-cell privacy accounting: Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012), Theorem 5.5.

Neighbouring relation: add/remove one row (unbounded DP).  A release
``y = q·x + N`` with ``N`` Laplace of scale ``b = S/α`` (``S = max|q|``) changes
by at most ``|q_j|`` when one row in cell ``j`` is added or removed, so it costs
that row ``(α/S)|q_j|``.  Summing over releases, the loss of a row in cell ``j``
is ``B_j = Σ_i (α_i/S_i)|q_ij|`` and the system is ``max_j B_j``-DP.  When one
individual may own up to ``k`` rows of a table (``max_rows_per_unit``, enforced by
:mod:`dpgate.release._bounding` when the table declares a ``privacy_unit``), the
rows may sit in ``k`` different cells, so the table costs ``k · max_j B_j``.
Tables are charged independently and summed, since one person may appear in
every table.

The costs live on *atoms* (blocks of cells on which every query is constant),
which is exact because ``B`` is constant on each atom.  The atoms may come in several
*blocks*, each a partition of the domain by some of its columns (the cost grid's main
grid and its side grids, :mod:`dpgate.plan.cost_grid`); every release is charged in one
block, so ``B = Σ_b B_b`` and the table costs ``k · Σ_b max B_b`` — exact when the
blocks' columns are disjoint, an upper bound (never an under-count) otherwise, since
``max (B_1 + B_2) ≤ max B_1 + max B_2``.

Exact arithmetic.  Costs are integers in units of ``2^-50`` (:data:`UNITS_PER_EPSILON`),
each release's per-atom cost rounded *up* (by less than ``2^-50 ≈ 8.9e-16``), so a
sum never absorbs a small release (a float sum of ~86 does not change when 3e-16 is
added) and never under-counts.  int64 holds costs up to ε = 4096 per cell; beyond,
Python integers do, exactly but slowly.  ``α`` and ``S`` are floats and ``|h_j|/S`` is a ratio of two
rounded floats, so the ratio is first enlarged by ``2^-50`` (more than its
rounding error) and capped at 1 (``|h_j| ≤ S`` holds exactly).  Floats are for
display only (:attr:`CellCosts.charge`); :attr:`CellCosts.charge_units` is exact.

zCDP (``CellCosts(..., zcdp=True)``, a gateway opened with ``privacy="zcdp"``): the same
integers count ρ instead of ε.  A release of budget ``α`` (noise scale ``S/α``, Laplace or
Gaussian) costs a row in cell ``j`` ``(α|h_j|/S)²/2`` — for Laplace noise the ρ of its ε-DP
(ε²/2), for Gaussian noise of deviation ``σ = S/α`` exactly ``h_j²/(2σ²)`` — rounded up from
the same enlarged ratio; a cell's ρ is the sum, and a table of ``k`` rows per unit costs
``k² · Σ_b max R_b`` (Cauchy–Schwarz; the proof is in :mod:`dpgate.plan.zcdp`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

__all__ = ["UNITS_PER_EPSILON", "CellCosts", "to_epsilon", "summed_units"]

UNITS_PER_EPSILON = 2**50
"""Costs are integers: one unit is ``2^-50`` of privacy budget ε."""

_FAST = 2**62  # below this, int64 arrays hold the units (costs up to ε = 4096 per cell): 100x faster
_RATIO_SLACK = 1 + Fraction(1, 2**50)  # > the relative error of |h_j|/S computed from two rounded floats


def to_epsilon(units: int) -> float:
    """An exact cost in units as the nearest float ε (for display and float comparisons)."""
    return units / UNITS_PER_EPSILON  # int / int: correctly rounded


def release_units(h: np.ndarray, alpha: float, sensitivity: float, *, zcdp: bool = False) -> np.ndarray:
    """Per-atom cost ``(α/S)|h_j|`` of one release, in units, rounded up (an object array of ints);
    with ``zcdp``, its ρ ``(α|h_j|/S)²/2``."""
    price = _rho_units if zcdp else _units
    mags = np.abs(np.asarray(h, dtype=float)).ravel()
    on = np.flatnonzero(mags)  # a query usually touches few atoms: only those are priced
    live = mags[on]
    alpha, sensitivity = float(alpha), float(sensitivity)
    if live.size and live.min() == live.max():  # one weight (a count, a group): no sort
        out = [price(float(live[0]), alpha, sensitivity)]
        inverse = np.zeros(live.size, dtype=np.intp)
    else:
        values, inverse = np.unique(live, return_inverse=True)
        out = [price(v, alpha, sensitivity) for v in values.tolist()]
    fast = max(out, default=0) < _FAST
    result = np.zeros(mags.size, dtype=np.int64 if fast else object)
    result[on] = np.array(out, dtype=np.int64 if fast else object)[inverse]
    return result.reshape(np.shape(h))


def _nonzero_units(weights: np.ndarray, alpha: float, sensitivity: float, zcdp: bool = False) -> np.ndarray:
    """:func:`release_units` of weights that are all non-zero (a sparse charge): one weight
    (a count, a group) is priced once and broadcast."""
    mags = np.abs(weights)
    if mags.size and mags.min() == mags.max():
        u = (_rho_units if zcdp else _units)(float(mags[0]), alpha, sensitivity)
        return np.full(mags.size, u, dtype=np.int64 if u < _FAST else object)
    return release_units(weights, alpha, sensitivity, zcdp=zcdp)


@functools.lru_cache(maxsize=4096)
def _units(v: float, alpha: float, sensitivity: float) -> int:
    """``(α/S)·v`` in units, rounded up (memoised: a GROUP BY prices the same weight per group)."""
    ratio = Fraction(v) / Fraction(sensitivity)
    ratio = Fraction(1) if ratio >= 1 else min(Fraction(1), ratio * _RATIO_SLACK)
    units = Fraction(alpha) * ratio * UNITS_PER_EPSILON
    return -(-units.numerator // units.denominator)  # ceil


@functools.lru_cache(maxsize=4096)
def _rho_units(v: float, alpha: float, sensitivity: float) -> int:
    """``(α·v/S)²/2`` in units, rounded up, from the ratio enlarged as in :func:`_units` (memoised)."""
    ratio = Fraction(v) / Fraction(sensitivity)
    ratio = Fraction(1) if ratio >= 1 else min(Fraction(1), ratio * _RATIO_SLACK)
    units = (Fraction(alpha) * ratio) ** 2 / 2 * UNITS_PER_EPSILON
    return -(-units.numerator // units.denominator)  # ceil


def summed_units(releases: Sequence[tuple[np.ndarray, np.ndarray, float, float]], *,
                 zcdp: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The cells ``releases`` — ``(atoms, weights, α, S)``, as :meth:`CellCosts.add_sparse` takes
    them — touch (sorted) and what they add to each, in units, exactly as recording them does."""
    live = [(a, w, al, s) for a, w, al, s in releases if a.size]
    if not live:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    incs = [_nonzero_units(w, float(al), float(s), zcdp) for _, w, al, s in live]
    if len(live) == 1:  # one release: its atoms are distinct
        order = np.argsort(live[0][0], kind="stable")
        return live[0][0][order], incs[0][order]
    cells, where = np.unique(np.concatenate([a for a, _, _, _ in live]), return_inverse=True)
    small = all(i.dtype == np.int64 for i in incs) and sum(int(i.max()) for i in incs) < _FAST
    added = np.zeros(cells.size, dtype=np.int64 if small else object)
    np.add.at(added, where, np.concatenate(incs if small else [i.astype(object) for i in incs]))
    return cells, added


def _plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ``a + b``: int64 while the sum cannot overflow, Python ints beyond."""
    if a.dtype == np.int64 and b.dtype == np.int64 and int(a.max(initial=0)) + int(b.max(initial=0)) < 2**63:
        return a + b
    return a.astype(object) + b.astype(object)


#: Above this many atoms, :meth:`CellCosts.add_disjoint` leaves its charges to be added one
#: by one: its one pass builds temporaries of their total size (fresh pages, 3× slower than
#: the in-place loop for a GROUP BY over 10⁶ cost atoms), while its gain is per charge.
_DISJOINT_ATOMS = 1 << 17


class CellCosts:
    """The running per-atom cost ``B`` of one table and its charge ``k · max B``, exactly.

    Args:
        n_atoms: current number of atoms.
        rows_per_individual: ``k``, the declared ``max_rows_per_individual``.
        zcdp: count ρ (ρ-zCDP per cell, a table charged ``k² · max R``) instead of ε.
    """

    def __init__(self, n_atoms: int, rows_per_individual: int = 1, *, zcdp: bool = False) -> None:
        self.units = np.zeros(n_atoms, dtype=np.int64)
        self.zcdp = bool(zcdp)
        self.rows = int(rows_per_individual)
        #: The multiplier of the largest cell cost: ``k`` for ε, ``k²`` for ρ (Cauchy–Schwarz).
        self.k = self.rows**2 if self.zcdp else self.rows
        #: Where each block of atoms starts (the first at 0; see the module docstring).
        self.starts: tuple[int, ...] = (0,)

    def __setstate__(self, state: dict[str, object]) -> None:
        """Unpickle (a checkpoint): one written before zCDP counted ε with multiplier ``k``."""
        self.__dict__.update(state)
        self.__dict__.setdefault("zcdp", False)
        self.__dict__.setdefault("rows", self.k)

    @property
    def units(self) -> np.ndarray:
        """``B_j`` per atom in units of ``2^-50``, exact: int64, or Python ints once that could overflow."""
        return self._units

    @units.setter
    def units(self, value: np.ndarray) -> None:
        self._units = value
        self._borrowed = False  # set by copy(): the array is another object's until first written
        self._floats: np.ndarray | None = None  # per_atom is derived lazily: planners read it often
        self._max: int | None = None  # so is Σ_b max B_b (a max over Python ints is slow)
        self._tops: list[int] | None = None  # and each block's max (several blocks only)

    @property
    def per_atom(self) -> np.ndarray:
        """``B_j`` per atom as floats (display and ordering; :attr:`units` is exact)."""
        if self._floats is None:
            # int → float rounds to nearest (Python ints too); / 2^50 is exact: the same as to_epsilon
            self._floats = self._units.astype(float) / UNITS_PER_EPSILON
        return self._floats

    @property
    def charge_units(self) -> int:
        """``k · Σ_b max_j B_bj`` in units of ``2^-50``, exact (``k · max_j B_j`` for one block)."""
        if self._max is None:
            self._max = sum(self._block_tops())
        return self.k * self._max

    def _block_tops(self) -> list[int]:
        """Each block's largest cost, in units (computed once per array: costs only grow)."""
        if len(self.starts) == 1:
            if self._max is None:
                self._max = int(self._units.max(initial=0))
            return [self._max]
        if self._tops is None:
            self._tops = _tops(self._units, self.starts)
        return self._tops

    def _blocks_of(self, atoms: np.ndarray) -> np.ndarray:
        """The block of each of ``atoms``."""
        return np.searchsorted(np.asarray(self.starts), atoms, side="right") - 1

    def _raised(self, atoms: np.ndarray, values: np.ndarray) -> list[int]:
        """The blocks' maxima if ``atoms`` took ``values`` (costs only grow)."""
        tops = list(self._block_tops())
        blocks = self._blocks_of(atoms)
        for b in np.unique(blocks).tolist():
            tops[b] = max(tops[b], int(values[blocks == b].max()))
        return tops

    @property
    def charge(self) -> float:
        """``k · max_j B_j``: what this table adds to the system cost (nearest float)."""
        return to_epsilon(self.charge_units)

    def split(self, parent: np.ndarray) -> None:
        """Atoms were refined: atom ``i`` came from old atom ``parent[i]``."""
        self.regrid(lambda units: units[parent])

    def regrid(self, expand: Callable[[np.ndarray], np.ndarray], starts: tuple[int, ...] | None = None) -> None:
        """Atoms were refined: the new per-atom costs are ``expand(units)`` (each new atom
        takes the cost of the old one it is part of; a new block's atoms cost 0), and the
        blocks start at ``starts`` (unchanged when None)."""
        top, old, borrowed = self._max, self._units, self._borrowed
        self.units = expand(old)
        self._borrowed = borrowed and np.may_share_memory(self._units, old)  # still another's array
        if starts is not None:
            self.starts = tuple(starts)
        self._max = top  # every old atom has a piece, and a new block adds 0

    def increase_units(self, h: np.ndarray, alpha: float, sensitivity: float) -> int:
        """Exact charge increase, in units, if ``h`` were released at budget ``alpha``."""
        new = _plus(self.units, release_units(h, alpha, sensitivity, zcdp=self.zcdp))
        return self.k * sum(_tops(new, self.starts)) - self.charge_units

    def increase(self, h: np.ndarray, alpha: float, sensitivity: float) -> float:
        """Charge increase if ``h`` (weights over atoms) were released at budget ``alpha`` (nearest float)."""
        return to_epsilon(self.increase_units(h, alpha, sensitivity))

    def add(self, h: np.ndarray, alpha: float, sensitivity: float) -> None:
        """Record a release of ``h`` at budget ``alpha``."""
        self.units = _plus(self.units, release_units(h, alpha, sensitivity, zcdp=self.zcdp))

    def add_sparse(self, atoms: np.ndarray, weights: np.ndarray, alpha: float, sensitivity: float,
                   *, in_place: bool = False) -> None:
        """:meth:`add` of a vector that is ``weights`` on ``atoms`` (distinct indices) and 0
        elsewhere, priced in O(its support).  Without ``in_place`` the costs' array is
        replaced, not written (shallow copies of these costs share it)."""
        if not atoms.size:
            return
        new = _plus(self.units[atoms], _nonzero_units(weights, float(alpha), float(sensitivity), self.zcdp))
        if new.dtype != self.units.dtype:
            units = self.units.astype(new.dtype)
        else:
            units = self.units if in_place and not self._borrowed else self.units.copy()
        top, tops = self._max, (self._raised(atoms, new) if len(self.starts) > 1 else None)
        units[atoms] = new
        self.units = units
        if tops is not None:
            self._tops, self._max = tops, sum(tops)
        elif top is not None:  # costs only grow: the new max is the old one or one just written
            self._max = max(top, int(new.max()))

    def add_disjoint(self, charges: Sequence[tuple[np.ndarray, np.ndarray]], alpha: float,
                     sensitivity: float) -> list[int] | None:
        """:meth:`add_sparse` (in place) of several charges at one ``(α, S)`` — a GROUP BY's
        groups — whose atoms are pairwise disjoint, in one pass; returns :attr:`charge_units`
        after each, in order: exactly what adding them one by one gives.  ``None`` (and
        nothing added) when their atoms meet, the costs left int64, or they touch more than
        :data:`_DISJOINT_ATOMS` atoms: add them one by one."""
        if not charges:
            return []
        sizes = np.array([a.size for a, _ in charges], dtype=np.intp)
        if self.units.dtype != np.int64 or int(sizes.sum()) > _DISJOINT_ATOMS:
            return None
        atoms = np.concatenate([a for a, _ in charges])
        marked = np.zeros(self.units.size, dtype=bool)  # O(cells + support): no sort
        marked[atoms] = True
        if np.count_nonzero(marked) != atoms.size:
            return None
        blocks = self._blocks_of(atoms[[0, -1]]) if atoms.size else np.zeros(2, dtype=np.intp)
        if len(self.starts) > 1 and (blocks[0] != blocks[1] or np.unique(self._blocks_of(atoms)).size > 1):
            return None
        new = _plus(self.units[atoms], _nonzero_units(np.concatenate([w for _, w in charges]),
                                                      float(alpha), float(sensitivity), self.zcdp))
        if new.dtype != np.int64:
            return None
        # The block they all fall in; the others' maxima stay as they are.
        tops = list(self._block_tops())
        rest = self.charge_units // self.k - tops[int(blocks[0])]
        top = tops[int(blocks[0])]
        if self._borrowed:
            self._units, self._borrowed = self._units.copy(), False
        self.units[atoms] = new
        live = sizes > 0
        block_tops = np.full(sizes.size, top, dtype=np.int64)
        if live.any():
            block_tops[live] = np.maximum.reduceat(new, (np.cumsum(sizes) - sizes)[live])
        running = np.maximum.accumulate(np.maximum(block_tops, top))
        self.units = self.units  # the setter forgets the derived floats and maxima
        tops[int(blocks[0])] = int(running[-1]) if running.size else top
        self._tops, self._max = (tops if len(tops) > 1 else None), rest + tops[int(blocks[0])]
        return [self.k * (rest + int(t)) for t in running]

    def charge_with(self, releases: Sequence[tuple[np.ndarray, np.ndarray, float, float]]) -> float:
        """:attr:`charge` if ``releases`` — ``(atoms, weights, α, S)``, each as :meth:`add_sparse`
        takes it — were added, in O(their support): costs only grow, so the new maximum is
        the old one or on a cell they touch.  The costs are unchanged."""
        atoms = [a for a, _, _, _ in releases if a.size]
        if not atoms:
            return self.charge
        incs = [_nonzero_units(w, float(al), float(s), self.zcdp) for a, w, al, s in releases if a.size]
        if len(atoms) == 1:  # one release: its atoms are distinct
            cells, added = atoms[0], incs[0]
        else:  # several may meet: each cell gets the sum of theirs
            cells, where = np.unique(np.concatenate(atoms), return_inverse=True)
            small = all(i.dtype == np.int64 for i in incs) and sum(int(i.max()) for i in incs) < _FAST
            added = np.zeros(cells.size, dtype=np.int64 if small else object)
            np.add.at(added, where, np.concatenate(incs if small else [i.astype(object) for i in incs]))
        raised = _plus(self.units[cells], added)
        if len(self.starts) > 1:
            return to_epsilon(self.k * sum(self._raised(cells, raised)))
        top = max(self.charge_units // self.k, int(raised.max()))
        return to_epsilon(self.k * top)

    def copy(self) -> CellCosts:
        """An independent copy (for planning a statement before committing it).  It shares this
        one's array until its first in-place write (copy on write: a statement answered from
        history copies nothing; the array can hold a cell per box of a 10⁶-box grid)."""
        out = CellCosts(0, self.rows, zcdp=self.zcdp)
        out._units, out._floats, out._max, out.starts = self._units, self._floats, self._max, self.starts
        out._tops = None if self._tops is None else list(self._tops)
        out._borrowed = True  # Python ints are immutable: a shallow copy of the array is independent too
        return out


def _tops(units: np.ndarray, starts: tuple[int, ...]) -> list[int]:
    """Each block's largest value (0 for an empty one)."""
    ends = (*starts[1:], units.size)
    return [int(units[s:e].max(initial=0)) for s, e in zip(starts, ends, strict=True)]
