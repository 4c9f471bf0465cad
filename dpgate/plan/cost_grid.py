"""The per-cell accounting's atoms: a main grid, and side grids for what it cannot hold.

The main grid (a :class:`~dpgate.plan.atoms.BoxGrid`) is the product grid of every
release's breakpoints, up to :data:`COST_MAX_BOXES` boxes; it refines the inference atoms,
so a restriction made from them is charged on it exactly.  A release that would push it
over that limit (a GROUP BY over a pair of columns after many one-column ones: the
product of all their cuts) is charged on a *side grid* instead: one over the columns of
releases like it, as small as they need.  Each grid is a block of
:class:`~dpgate.plan.accounting.CellCosts`, which charges ``k · Σ_b max B_b``: exact
while the blocks' columns are disjoint, and an upper bound (``max (B_1 + B_2) ≤ max B_1
+ max B_2``) when they share one — never an under-count, and never a dense vector over a
grid no release fits in.  A side grid with no columns (one box) charges what cannot be
located at all (a restriction of the atoms when the main grid does not refine them).

Blocks are numbered main first (0), then sides in the order they were made; a block's
atoms follow the previous block's in the flat numbering charges use.  Sides are only ever
appended, and only the statement being planned refines grids before its charges are
located, so numbers handed out stay valid for that statement (a later one re-locates:
:meth:`CostGrid.version` changes with any grid).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Literal

import numpy as np

from dpgate.compile.query import MAX_GRID_BOXES, LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.plan.atoms import BoxGrid, GridVersion
from dpgate.schema.domains import Table

__all__ = ["COST_MAX_BOXES", "CostGrid"]

#: Limit on the main grid and on each side grid (boxes; 32 MiB of int64 costs): per-cell
#: accounting is cheap per box, but a planning copy, the map onto the inference atoms and
#: the charges of a statement each take a few arrays of this size.
COST_MAX_BOXES = 2**22

#: What to do to a :class:`~dpgate.plan.accounting.CellCosts` when the grid changed:
#: ``(expand, starts)`` as :meth:`~dpgate.plan.accounting.CellCosts.regrid` takes them.
Regrid = tuple[Callable[[np.ndarray], np.ndarray], tuple[int, ...]]


class CostGrid:
    """The cost atoms of one table: block 0 is the main grid, blocks 1… its side grids.

    Args:
        table: the declared table.
        max_boxes: the limit of the main grid and of each side grid (default :data:`COST_MAX_BOXES`).
    """

    def __init__(self, table: Table, max_boxes: int | None = None) -> None:
        self.table = table
        self.max_boxes = int(COST_MAX_BOXES if max_boxes is None else max_boxes)
        self.main = BoxGrid(table, max_grid=self.max_boxes)
        self.sides: tuple[BoxGrid, ...] = ()
        self.uniform: int | None = None  # the block of the side grid without columns, once made

    def __copy__(self) -> CostGrid:
        """A copy whose grids may be refined without touching this one's (they replace their
        arrays, never write them)."""
        out = object.__new__(CostGrid)
        out.__dict__.update(self.__dict__)
        out.main, out.sides = copy.copy(self.main), tuple(copy.copy(s) for s in self.sides)
        return out

    # -- reading ---------------------------------------------------------------------
    @property
    def columns(self) -> tuple[str, ...]:
        """The main grid's columns."""
        return self.main.columns

    @property
    def breakpoints(self) -> tuple[tuple[int, ...], ...]:
        """The main grid's breakpoints."""
        return self.main.breakpoints

    @property
    def n_atoms(self) -> int:
        """All blocks' boxes."""
        return self.main.n_atoms + sum(s.n_atoms for s in self.sides)

    @property
    def starts(self) -> tuple[int, ...]:
        """Where each block's atoms start in the flat numbering (the main grid's at 0)."""
        out, at = [0], self.main.n_atoms
        for s in self.sides:
            out.append(at)
            at += s.n_atoms
        return tuple(out)

    @property
    def version(self) -> tuple[GridVersion, ...]:
        """Equal for equal grids, block by block (what a located charge depends on)."""
        return (self.main.version, *(s.version for s in self.sides))

    def block(self, b: int) -> BoxGrid:
        """Block ``b``'s grid."""
        return self.main if b == 0 else self.sides[b - 1]

    # -- refining --------------------------------------------------------------------
    def refine_main(self, query: LinearQuery) -> Regrid | None | Literal[False]:
        """Add ``query``'s breakpoints to the main grid: the costs' regrid (None when the grid
        did not change), or False when it would exceed :attr:`max_boxes` (then unchanged)."""
        starts = self.starts
        try:
            expand = self.main.regrid(query)
        except UnsupportedQuery:
            return False
        if expand is None:
            return None
        grown = self.starts
        end = starts[1] if len(starts) > 1 else None

        def regrid(units: np.ndarray) -> np.ndarray:
            head = expand(units[:end])
            return head if end is None else np.concatenate([head, units[end:]])

        return regrid, grown

    def refine_side(self, query: LinearQuery) -> tuple[int, Regrid | None]:
        """Charge ``query`` on a side grid: the first side sharing a column with it that stays
        within :attr:`max_boxes` with its breakpoints, else a new side on its own grid.
        Returns the block and the costs' regrid (None when no grid changed)."""
        names = {c.lower() for c in query.columns}
        starts = self.starts
        for i, side in enumerate(self.sides):
            if not names & {c.lower() for c in side.columns}:
                continue
            try:
                expand = side.regrid(query)
            except UnsupportedQuery:
                continue
            if expand is None:
                return i + 1, None
            lo, hi = starts[i + 1], (starts[i + 2] if i + 2 < len(starts) else None)

            def regrid(units: np.ndarray, lo: int = lo, hi: int | None = hi,
                       expand: Callable[[np.ndarray], np.ndarray] = expand) -> np.ndarray:
                parts = [units[:lo], expand(units[lo:hi])]
                return np.concatenate(parts if hi is None else [*parts, units[hi:]])

            return i + 1, (regrid, self.starts)
        side = BoxGrid(self.table, max_grid=max(self.max_boxes, MAX_GRID_BOXES))
        side.regrid(query)  # the query's own grid: within MAX_GRID_BOXES by construction
        return self._append(side)

    def add_uniform(self) -> tuple[int, Regrid | None]:
        """The block of the one-box side grid (made when missing): where a charge that cannot
        be located is put, at its largest per-cell weight."""
        if self.uniform is not None:
            return self.uniform, None
        block, regrid = self._append(BoxGrid(self.table, max_grid=1))
        self.uniform = block
        return block, regrid

    def _append(self, side: BoxGrid) -> tuple[int, Regrid]:
        size = side.n_atoms
        self.sides = (*self.sides, side)

        def regrid(units: np.ndarray) -> np.ndarray:
            return np.concatenate([units, np.zeros(size, dtype=units.dtype)])

        return len(self.sides), (regrid, self.starts)

    def located(self) -> dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]]:
        """The charges located on these grids as they are now, by query (a planning copy's
        charges hold for the live state once it is refined alike; ``dpgate.plan.state``)."""
        with _LOCATED_LOCK:
            found = _LOCATED.get(self.version)
            if found is None:
                while len(_LOCATED) >= _LOCATED_MAX:
                    del _LOCATED[next(iter(_LOCATED))]
                found = _LOCATED[self.version] = {}
            return found

    def __repr__(self) -> str:
        return f"<CostGrid {self.table.name} main={self.main!r} sides={len(self.sides)}>"


#: :meth:`CostGrid.located` of the most recent grids.
_LOCATED: dict[tuple[GridVersion, ...], dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]]] = {}
_LOCATED_MAX = 4
_LOCATED_LOCK = threading.Lock()
