"""Where the budget went: the per-cell spent budget ``B_j`` of a table, from the ledger's records.

The accounting (:mod:`dpgate.plan.accounting`, Xiao & Xiong (2012), Theorem 5.5) charges a
row in cell ``j`` ``B_j = Σ_i (α_i/S_i)|q_ij|`` over the releases ``i`` of its table, each
release's per-box cost rounded up to units of ``2^-50`` exactly as
:func:`~dpgate.plan.accounting.release_units` does, and the table ``k · max_j B_j``.  Here
``B`` is computed on the coarsest grid refining every release's grid (the boxes of the
union of their breakpoints, on which ``B`` is constant), then shown over one or two
columns as the most any row with those values was charged (the maximum over the other
columns), or as the boxes charged most.  Only the records are read: queries, α and S.  A zCDP
ledger's (``zcdp=True``) are ρ: ``R_j = Σ_i (α_i|q_ij|/S_i)²/2`` and the table ``k² · max_j R_j``.
Shared by the console's ``/cells`` page and ``Gateway.plot_cells`` (both show these numbers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpgate.compile.query import LinearQuery, union_grid
from dpgate.errors import InvalidArgument
from dpgate.ledger._records import LedgerRecord
from dpgate.plan.accounting import UNITS_PER_EPSILON, release_units
from dpgate.plan.cost_grid import COST_MAX_BOXES
from dpgate.schema.domains import Column, Table

__all__ = ["CellSpend", "MAX_BOXES", "cell_spend", "cell_label"]

#: The most boxes of a table's union grid priced here (an int64 each): the accounting's own
#: limit on its main cost grid, within which that grid is this one (so the numbers are the
#: accounting's); beyond, the accounting adds side grids (an upper bound) and the console or plot says
#: the grid is too fine to show.
MAX_BOXES = COST_MAX_BOXES


@dataclass(frozen=True)
class CellSpend:
    """The spent budget of one table over its grid.

    Attributes:
        table: the declared table.
        columns: the columns some release restricts, in declaration order.
        breakpoints: per column, the first cell of each slab of the grid.
        units: ``B`` per box of the grid, in units of ``2^-50`` (shape: slabs per column).
        releases: how many records of the table were priced.
    """

    table: Table
    columns: tuple[str, ...]
    breakpoints: tuple[tuple[int, ...], ...]
    units: np.ndarray
    releases: int
    zcdp: bool = False
    _labels: dict[int, list[str | None]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def charge(self) -> float:
        """The table's cost ``k · max_j B_j`` (ε), as the accounting computes it on one grid."""
        top = int(self.units.max()) if self.units.size else 0
        k = self.table.max_rows_per_individual
        return (k**2 if self.zcdp else k) * top / UNITS_PER_EPSILON

    def count(self, columns: Sequence[str]) -> int:
        """How many rows :meth:`over` gives for ``columns``: the product of their slab counts."""
        return math.prod(len(self.breakpoints[a]) if (a := self._axis(self.table.column(c))) is not None else 1
                         for c in columns)

    def over(self, columns: Sequence[str]) -> list[dict[str, object]]:
        """``B`` over ``columns`` (one or two): per combination of their slabs, the most a row
        with those values was charged (ε), with each slab's label (a value, or a range of cells).
        Only declared cells count (a NULL or ``other`` cell the schema does not declare holds no row)."""
        cols = [self.table.column(c) for c in columns]
        axes = [self._axis(c) for c in cols]
        keep = [a for a in axes if a is not None]
        units = self._declared_only()
        other = tuple(a for a in range(units.ndim) if a not in keep)
        top = units.max(axis=other) if other and units.size else units
        if len(keep) == 2 and keep[0] > keep[1]:
            top = top.T
        slabs = [self._slabs(c, a) for c, a in zip(cols, axes, strict=True)]
        rows: list[dict[str, object]] = []
        for index in np.ndindex(*(len(s) for s in slabs)):
            labels = [slabs[k][i] for k, i in enumerate(index)]
            if any(label is None for label in labels):
                continue  # a slab of undeclared cells only
            at = tuple(i for i, a in zip(index, axes, strict=True) if a is not None)
            value = int(top[at]) if at else (int(top.max()) if top.size else 0)
            row: dict[str, object] = {c.name: label for c, label in zip(cols, labels, strict=True)}
            row["order"] = int(index[0])
            row["epsilon"] = value / UNITS_PER_EPSILON
            rows.append(row)
        return rows

    def top(self, n: int) -> list[dict[str, object]]:
        """The ``n`` boxes of declared cells charged most, each with its slab label per column and ``B`` (ε)."""
        flat = self._declared_only().ravel()
        if not flat.size:
            return []
        n = min(n, flat.size)
        best = np.argpartition(-flat.astype(float), n - 1)[:n]
        best = best[np.argsort(-flat[best].astype(float), kind="stable")]
        out = []
        for box in best.tolist():
            where = np.unravel_index(box, self.units.shape)
            row: dict[str, object] = {}
            for c, k in zip(self.columns, where, strict=True):
                col = self.table.column(c)
                row[col.name] = self._slabs(col, self.columns.index(c))[k]
            if any(v is None for v in row.values()):
                continue
            row["epsilon"] = int(flat[box]) / UNITS_PER_EPSILON
            out.append(row)
        return out

    def _declared_only(self) -> np.ndarray:
        """``units`` with 0 on the boxes that hold no declared cell."""
        units = self.units
        for axis, c in enumerate(self.columns):
            declared = self.table.column(c).declared_cells()
            held = np.add.reduceat(declared.astype(np.int64), np.asarray(self.breakpoints[axis], dtype=np.intp)) > 0
            if not held.all():
                shape = [1] * units.ndim
                shape[axis] = held.size
                units = units * held.reshape(shape)
        return units

    def _axis(self, col: Column) -> int | None:
        return self.columns.index(col.name) if col.name in self.columns else None

    def _slabs(self, col: Column, axis: int | None) -> list[str | None]:
        """Each slab's label (``None``: no declared cell in it)."""
        if axis is None:
            return [f"any {col.name}"]
        found = self._labels.get(axis)
        if found is None:
            bps = self.breakpoints[axis]
            ends = [*bps[1:], col.n_cells]
            declared = col.declared_cells()
            found = self._labels[axis] = [
                _range_label(col, np.flatnonzero(declared[a:b]) + a) if declared[a:b].any() else None
                for a, b in zip(bps, ends, strict=True)]
        return found


def cell_label(col: Column, cell: int) -> str:
    """The public label of cell ``cell`` of ``col`` (``NULL`` for the null cell); reads no list of a
    wide integer column's labels."""
    if col.kind == "integer":
        lo, _ = col.int_range()
        return "NULL" if cell >= col.null_cell else str(lo + cell)
    label = col.labels()[cell]
    return "NULL" if label is None else str(label)


def _range_label(col: Column, cells: np.ndarray) -> str:
    """The (declared) cells ``cells``, increasing, of ``col`` in words."""
    first, last, n = int(cells[0]), int(cells[-1]), int(cells.size)
    if n == 1:
        return cell_label(col, first)
    if col.kind == "integer" and last - first == n - 1 and last < col.null_cell:
        return f"{cell_label(col, first)}–{cell_label(col, last)}"
    if n <= 3:
        return ", ".join(cell_label(col, int(c)) for c in cells)
    return f"{cell_label(col, first)} … {cell_label(col, last)} ({n} values)"


def cell_spend(records: Sequence[LedgerRecord], table: Table, *, max_boxes: int | None = None,
               zcdp: bool = False) -> CellSpend:
    """``B`` of ``table`` from the ledger ``records`` (those of other tables are ignored); ``zcdp``:
    the ledger counts ρ.

    Raises:
        InvalidArgument: when the union grid of the table's releases has more than ``max_boxes``
            (default :data:`MAX_BOXES`) boxes.
    """
    max_boxes = MAX_BOXES if max_boxes is None else max_boxes
    mine = [r for r in records if r.table.lower() == table.name.lower()]
    queries = [LinearQuery.from_json(r.query) for r in mine]
    columns, bps = union_grid(table, queries) if queries else ([], [])
    boxes = math.prod(len(b) for b in bps)
    if boxes > max_boxes:
        raise InvalidArgument(f"the releases of {table.name} split its domain into {boxes} boxes, more than the "
                              f"{max_boxes} that can be shown")
    units = np.zeros(tuple(len(b) for b in bps), dtype=np.int64)
    for record, query in zip(mine, queries, strict=True):
        if query.columns:
            h = np.asarray(query.expand(table, columns, bps), dtype=float) / query.denominator
        else:  # a count of every row: one weight on every box
            h = np.full(units.shape, float(query.numerators.item()) / query.denominator)
        cost = release_units(h, record.alpha, record.sensitivity, zcdp=zcdp)
        units = units + cost
    return CellSpend(table, tuple(columns), tuple(tuple(b) for b in bps), units, len(mine), zcdp)
