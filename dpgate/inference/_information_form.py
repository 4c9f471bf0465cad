"""The information form of the incremental BLUE, for a history that spans every atom.

Once an empty history receives rows spanning every atom (the hierarchical tree), the
state is kept as :class:`~dpgate.inference._information.Information` (sparse rows, a
dense inverse of the information matrix, Woodbury terms) instead of a basis: a solve is
then O(n² + nnz), not O(m r).  A query's coordinates are ``w = (F + ÑÑᵀ)⁻¹ Q``, its
weights ``u = G w``; Q is estimable iff its part outside the row space, ``ÑÑᵀw``, vanishes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from dpgate._validate import readonly
from dpgate.inference._blue import ESTIMABLE_RTOL
from dpgate.inference._form import Form
from dpgate.inference._information import Information

__all__ = ["InformationForm"]


class InformationForm(Form):
    """The history's released answers (taken over from the empty form it replaces) and
    its information form ``info`` (see the module doc)."""

    def __init__(self, empty: Form, info: Information) -> None:
        self._adopt(empty)
        self._info = info
        self._r = info.n

    def copy(self) -> InformationForm:
        """An independent copy (the information form's arrays are shared: never written)."""
        new = self._copied()
        new._info = self._info.copy()
        return new

    def twin_classes(self) -> None:
        """None: the information form keeps no basis whose columns could be compared."""
        return None

    def basis(self) -> NDArray[np.float64]:
        """From the rows: an orthonormal basis of the rows of G √D, over √D."""
        sq = np.sqrt(self._d)
        _, s, vt = np.linalg.svd(self._info.rows().toarray() * sq, full_matrices=False)
        return np.asarray(vt[: self._r] / sq)

    # ------------------------------------------------------------------ queries
    def solve(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``w = (F + ÑÑᵀ)⁻¹ v`` (``Information.solve``, remembered; a read-only result)."""
        info = self._info
        return self._remembered(("info", v.tobytes()), lambda: readonly(info.solve(v)))

    def outside(self, w: NDArray[np.float64]) -> NDArray[np.float64]:
        """``ÑÑᵀw``: for ``w = solve(v)``, the part of v outside the row space."""
        return self._info.outside(w)

    def coordinates(self, Q: NDArray[np.float64]) -> tuple[NDArray[np.float64], bool]:
        """``(w, estimable)`` with ``w = (F + ÑÑᵀ)⁻¹ Q``."""
        w = self.solve(Q)
        return w, self.dnorm(self._info.outside(w)) <= ESTIMABLE_RTOL * self.dnorm(Q)

    def weights(self, c: NDArray[np.float64]) -> NDArray[np.float64]:
        """``u = G w`` (one entry per row)."""
        return self._info.weights(c)

    # ------------------------------------------------------------------ updates
    def _add(self, h: NDArray[np.float64], g: NDArray[np.float64], scale: float) -> None:
        self._r += self._info.append(g)

    def extend_block(self, H: NDArray[np.float64], b: NDArray[np.float64], y: NDArray[np.float64],
                     g: NDArray[np.float64]) -> bool:
        """Every block enters at once (``Information.extend``)."""
        self._memo = {}
        G = H / b[:, None]
        self.store(H, b, y, g)
        self._r += self._info.extend(G)
        return True

    def _split_atoms(self, p: NDArray[np.intp], d: NDArray[np.float64]) -> None:
        self._info.split(p.astype(np.intp), d)
