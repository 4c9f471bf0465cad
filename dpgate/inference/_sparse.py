"""Matrix products with many right-hand sides that go through a sparse copy of a mostly-zero factor.

A GROUP BY's groups are disjoint: after one is released, its coefficients C, the square
root S of ``(CᵀC)⁻¹`` and a repeat's coordinates are mostly zeros (diagonal, for a GROUP BY
released on its own), yet stored dense.  Estimating its k groups together then costs dense
products of k columns with r × r and m × r matrices — O(k r m), cubic in the groups (a
2 048-group repeat took seconds).  Through a sparse copy each costs O(non-zeros × k).

Only products with at least :data:`MIN_COLUMNS` right-hand sides are considered (counting a
matrix's non-zeros reads it once: a matrix–vector product would pay that twice), and only a
factor with at most :data:`DENSITY` of its entries non-zero is made sparse.  A product
through the sparse copy sums the same non-zero terms (in another order: equal up to rounding;
exactly equal where each output has one non-zero term, as for a GROUP BY on its own).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

__all__ = ["DENSITY", "MIN_COLUMNS", "matmul", "sparse_worth", "stacked_rows"]

#: Right-hand sides from which a product looks for a sparse factor.
MIN_COLUMNS = 16
#: Largest share of non-zero entries of a factor multiplied through a sparse copy.
DENSITY = 0.05


def _sparse(A: NDArray[np.float64]) -> bool:
    return A.size > 0 and bool(np.count_nonzero(A) <= DENSITY * A.size)


def _many(A: NDArray[np.float64], B: NDArray[np.float64]) -> bool:
    return B.ndim == 2 and B.shape[1] >= MIN_COLUMNS and A.ndim == 2 and A.size > 0


def sparse_worth(A: NDArray[np.float64], B: NDArray[np.float64]) -> bool:
    """Whether :func:`matmul` would multiply ``A @ B`` through a sparse copy."""
    return _many(A, B) and (_sparse(A) or _sparse(B))


def matmul(A: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
    """``A @ B`` (a new dense array), through a sparse copy of A or B when B has at least
    :data:`MIN_COLUMNS` columns and that factor is mostly zeros."""
    if _many(A, B):
        if _sparse(A):
            return np.asarray(sp.csr_array(A) @ B)
        if _sparse(B):
            return np.asarray((sp.csr_array(B.T) @ A.T).T)
    return np.asarray(A @ B)


#: Released rows are handed to the BLUE as a sparse matrix above this many dense entries
#: (32 MB): a tree's 8 191 nodes over 4 096 atoms have 13 non-zeros per atom, not 4 096.
_SPARSE_ROWS = 1 << 22


def stacked_rows(vectors: Sequence[np.ndarray]) -> np.ndarray | sp.csr_matrix:
    """The vectors as the rows of one matrix: sparse when the dense one would be large."""
    if len(vectors) * vectors[0].size <= _SPARSE_ROWS:
        return np.array(vectors)
    nonzero = [np.flatnonzero(v) for v in vectors]
    indptr = np.zeros(len(vectors) + 1, dtype=np.int64)
    np.cumsum([i.size for i in nonzero], out=indptr[1:])
    data = np.concatenate([v[i] for v, i in zip(vectors, nonzero, strict=True)])
    return sp.csr_matrix((data, np.concatenate(nonzero), indptr), shape=(len(vectors), vectors[0].size))
