"""A table's released history: the gateway's live state and its frozen snapshot.

:class:`TableState` is what the gateway updates as ledger records arrive (atoms,
the incremental BLUE, per-cell costs, the released queries); only the gateway
holds one.  :class:`TableView` is its frozen snapshot, the seam through which
extensions (``dpgate.model``, ``dpgate.warmstart``) read history:
``Gateway.locked_view`` hands one out under the gateway's lock.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpgate.accounting import CellCosts
from dpgate.atoms import AtomPartition
from dpgate.inference import Estimate, IncrementalBLUE
from dpgate.query import LinearQuery
from dpgate.schema import Table

__all__ = ["TableState", "TableView"]


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

    @classmethod
    def new(cls, table: Table) -> TableState:
        """Empty history on the one-atom partition."""
        atoms = AtomPartition(table)
        return cls(
            table, atoms, IncrementalBLUE(atoms.cell_sizes), CellCosts(atoms.n_atoms, table.max_rows_per_individual)
        )

    def refine(self, query: LinearQuery) -> None:
        """Split atoms so that ``query`` is constant on each (public structure only)."""
        parent = self.atoms.refine(query)
        if parent is not None:
            self.blue.split(parent, self.atoms.cell_sizes)
            self.costs.split(parent)

    def record(
        self, record_id: int, query: LinearQuery, scale: float, value: float, lattice: float, alpha: float,
        sensitivity: float,
    ) -> None:
        """Add one released answer of ``query`` (ledger record ``record_id``) to the inference state and the costs."""
        self.refine(query)
        h = self.atoms.vector(query)
        self.blue.append(h, scale, value, lattice=lattice)
        self.costs.add(h, alpha, sensitivity)
        self.queries.append(query)
        self.record_ids.append(record_id)
        self.alphas.append(alpha)
        self.sensitivities.append(sensitivity)

    def view(self) -> TableView:
        """A frozen snapshot of this history (copies: later releases and refinements do not show)."""
        # refine() replaces the partition's arrays and never writes into them, so a shallow
        # copy is a snapshot; the BLUE is copied deeply (append/split write in place).
        return TableView(
            self.table,
            copy.copy(self.atoms),
            _frozen(self.blue.rows),
            _frozen(self.blue.values),
            _frozen(self.blue.scales),
            _frozen(self.blue.lattice),
            _frozen(self.alphas),
            _frozen(self.sensitivities),
            tuple(self.queries),
            tuple(self.record_ids),
            self.blue.copy(),
        )

    def atom_query(self, query: LinearQuery, keep: np.ndarray) -> LinearQuery:
        """``query`` with its weight zeroed outside the atoms ``keep`` (a boolean mask)."""
        grid = query.expand(self.table, self.atoms.columns, self.atoms.breakpoints) / query.denominator
        weights = np.where(keep[self.atoms.labels], grid, 0.0)
        return LinearQuery.from_grid(self.table, self.atoms.columns, self.atoms.breakpoints, weights)


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
