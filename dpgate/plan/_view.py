"""The frozen snapshot of a table's released history (:class:`TableView`).

Re-exported by :mod:`dpgate.plan.state`, whose :meth:`~dpgate.plan.state.TableState.view` takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.inference import Estimate, IncrementalBLUE
from dpgate.plan.atoms import AtomPartition
from dpgate.schema.domains import Table

__all__ = ["TableView"]


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


def _frozen(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.array(values, dtype=float)
    arr.setflags(write=False)
    return arr
