"""Per-cell privacy accounting: Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012), Theorem 5.5.

Neighbouring relation: add/remove one row (unbounded DP).  A release
``y = q·x + N`` with ``N`` Laplace of scale ``b = S/α`` (``S = max|q|``) changes
by at most ``|q_j|`` when one row in cell ``j`` is added or removed, so it costs
that row ``(α/S)|q_j|``.  Summing over releases, the loss of a row in cell ``j``
is ``B_j = Σ_i (α_i/S_i)|q_ij|`` and the system is ``max_j B_j``-DP.  When one
individual may own up to ``k`` rows of a table (``max_rows_per_individual``), the
rows may sit in ``k`` different cells, so the table costs ``k · max_j B_j``.
Tables are charged independently and summed, since one person may appear in
every table.

The costs live on *atoms* (blocks of cells on which every query is constant),
which is exact because ``B`` is constant on each atom.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CellCosts"]


class CellCosts:
    """The running per-atom cost ``B`` of one table and its charge ``k · max B``.

    Args:
        n_atoms: current number of atoms.
        rows_per_individual: ``k``, the declared ``max_rows_per_individual``.
    """

    def __init__(self, n_atoms: int, rows_per_individual: int = 1) -> None:
        self.per_atom = np.zeros(n_atoms)
        self.k = int(rows_per_individual)

    @property
    def charge(self) -> float:
        """``k · max_j B_j``: what this table adds to the system cost."""
        return self.k * float(self.per_atom.max(initial=0.0))

    def split(self, parent: np.ndarray) -> None:
        """Atoms were refined: atom ``i`` came from old atom ``parent[i]``."""
        self.per_atom = self.per_atom[parent]

    def increase(self, h: np.ndarray, alpha: float, sensitivity: float) -> float:
        """Charge increase if ``h`` (weights over atoms) were released at budget ``alpha``."""
        new = self.per_atom + (alpha / sensitivity) * np.abs(h)
        return self.k * float(new.max(initial=0.0)) - self.charge

    def add(self, h: np.ndarray, alpha: float, sensitivity: float) -> None:
        """Record a release of ``h`` at budget ``alpha``."""
        self.per_atom = self.per_atom + (alpha / sensitivity) * np.abs(h)

    def copy(self) -> CellCosts:
        """An independent copy (for planning a statement before committing it)."""
        out = CellCosts(0, self.k)
        out.per_atom = self.per_atom.copy()
        return out
