"""Block operations on the incremental BLUE's basis (see ``_basis_form``).

The basis V is kept as row blocks that are never written once filled (copies
share them), and a block of releases can be added at once: disjoint rows (a
GROUP BY's groups) through the Cholesky factor of their small Gram matrix, other
rows by block Gram–Schmidt and an LQ factorisation.

A block's rows are dense, or sparse for a GROUP BY recorded on atoms no earlier release
touched (:func:`orthogonal_rows`: each basis row is a scaled group, k rows with as many
non-zeros as atoms in all, not k × n numbers).

A block keeps the atoms it was filled on: splitting atoms only records which old
atom each new one is a piece of (``cols``), since a basis row is constant on the
pieces (``V ← V[:, parent]``).  Products with it aggregate a vector over the pieces
first (``V[:, cols] (d v) = V (Σ_pieces d v)``), so a split costs O(n), not O(r n).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from dpgate._blas import threads_for
from dpgate.inference._sparse import matmul, sparse_worth

__all__ = ["EXTEND_RTOL", "MAX_BLOCKS", "Block", "combined_classes", "covers_every_atom", "disjoint",
           "disjoint_block", "equal_columns", "general_block", "merged", "mixed_block", "orthogonal_rows", "project_blocks",
           "second_pass", "sparse_coefficients", "sparse_rows", "threads_for_blocks", "times_and_back"]

EXTEND_RTOL = 1e-9
"""A row whose distance to the current row space is at most this fraction of its norm adds no direction."""

#: The basis keeps at most this many blocks (see :func:`merged`).
MAX_BLOCKS = 4


@dataclass(frozen=True, eq=False)
class Block:
    """Basis rows over the atoms they were filled on (dense, or sparse: :func:`orthogonal_rows`);
    ``cols[j]`` is the column of current atom j (``None``: the current atoms themselves)."""

    rows: NDArray[np.float64] | sp.csr_matrix
    cols: NDArray[np.intp] | None = None

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes a product reads."""
        R = self.rows
        return int(R.nbytes) if isinstance(R, np.ndarray) else int(R.data.nbytes + R.indices.nbytes)

    def times(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``rows @ x`` (x over the block's columns: a vector, or one column per vector)."""
        return np.asarray(self.rows @ x)

    def left(self, w: NDArray[np.float64]) -> NDArray[np.float64]:
        """``w @ rows`` (w: coefficients on the block's rows, a vector or one row per vector)."""
        R = self.rows
        return np.asarray(w @ R) if isinstance(R, np.ndarray) else np.asarray(R.T @ w.T).T

    @cached_property
    def _pieces(self) -> sp.csr_matrix:
        assert self.cols is not None
        n = self.cols.size
        return sp.csr_matrix((np.ones(n), (np.arange(n), self.cols)), shape=(n, self.rows.shape[1]))

    def gather(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """x (a vector or rows over the current atoms) summed onto the block's columns."""
        if self.cols is None:
            return x
        if x.ndim == 1:
            return np.bincount(self.cols, weights=x, minlength=self.rows.shape[1]).astype(np.float64)
        return np.asarray(x @ self._pieces)

    def gather_sparse(self, X: sp.csr_matrix) -> sp.csr_matrix:
        """:meth:`gather` of sparse rows, kept sparse."""
        return X if self.cols is None else X @ self._pieces

    def spread(self, y: NDArray[np.float64]) -> NDArray[np.float64]:
        """y (over the block's columns) on the current atoms."""
        return y if self.cols is None else y[..., self.cols]

    def dense(self) -> NDArray[np.float64]:
        """The rows over the current atoms (dense)."""
        R = self.rows
        return self.spread(R if isinstance(R, np.ndarray) else R.toarray())

    @cached_property
    def column_classes(self) -> NDArray[np.intp]:
        """For each of the block's own columns, a class id: equal ids, equal columns."""
        R = self.rows
        return equal_columns(R) if isinstance(R, np.ndarray) else _sparse_equal_columns(R)

    def classes(self) -> NDArray[np.intp]:
        """:attr:`column_classes` of the current atoms."""
        return self.column_classes if self.cols is None else self.column_classes[self.cols]

    def split(self, parent: NDArray[np.intp]) -> Block:
        """The block after new atom i became a piece of atom ``parent[i]``."""
        out = Block(self.rows, parent if self.cols is None else self.cols[parent])
        if "column_classes" in self.__dict__:  # the same rows: their classes carry over
            out.__dict__["column_classes"] = self.__dict__["column_classes"]
        return out


def equal_columns(A: NDArray[np.float64]) -> NDArray[np.intp]:
    """For each column of A, a class id (0, 1, …): columns of one class are equal.

    Columns are first grouped by a weighted sum down each column — the same operations,
    in the same order, for every column, so equal columns get bitwise equal sums — then
    each is checked against its group's first; one that differs (a collision) gets a
    class of its own.  Equal columns may so end in different classes, never unequal
    ones in one."""
    if A.shape[0] == 0:
        return np.zeros(A.shape[1], dtype=np.intp)
    weights = np.random.default_rng(0x5EED).random(size=(A.shape[0], 1)) + 0.5  # fixed: reproducible classes
    sums = (A * weights).sum(axis=0)
    found = np.unique(sums, return_index=True, return_inverse=True)
    first, cls = np.asarray(found[1], dtype=np.intp), np.asarray(found[2], dtype=np.intp).reshape(-1)
    apart = ~(A == A[:, first[cls]]).all(axis=0)
    cls[apart] = first.size + np.arange(int(apart.sum()))
    return cls


def _sparse_equal_columns(A: sp.csr_matrix) -> NDArray[np.intp]:
    """:func:`equal_columns` of sparse rows with at most one non-zero per column (disjoint
    groups, :func:`orthogonal_rows`): equal columns are those with the same row and value, or none."""
    C = sp.csc_matrix(A)
    C.eliminate_zeros()
    count = np.diff(C.indptr)
    if count.max(initial=0) > 1:
        return equal_columns(C.toarray())
    row = np.full(C.shape[1], -1.0)
    value = np.zeros(C.shape[1])
    has = count == 1
    row[has] = C.indices
    value[has] = C.data
    return np.unique(np.stack([row, value], axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.intp)


def combined_classes(ids: list[NDArray[np.intp]]) -> NDArray[np.intp]:
    """Class ids of the tuples ``(ids[0][j], ids[1][j], …)``: equal tuples, equal ids."""
    out = ids[0]
    for more in ids[1:]:
        out = np.unique(out.astype(np.int64) * (int(more.max(initial=0)) + 1) + more, return_inverse=True)[1]
    return out.reshape(-1).astype(np.intp)


def merged(blocks: list[Block]) -> list[Block]:
    """At most :data:`MAX_BLOCKS` blocks: the later ones are merged on the current atoms,
    the first (usually the largest) too only when they outgrow it."""
    if len(blocks) <= MAX_BLOCKS:
        return blocks
    rest = sum(B.size for B in blocks[1:])
    if rest <= blocks[0].size:
        return [blocks[0], _joined(blocks[1:])]
    return [_joined(blocks)]


def _joined(blocks: list[Block]) -> Block:
    """One block of the rows of ``blocks`` on the current atoms: sparse if they all are."""
    if all(not isinstance(B.rows, np.ndarray) for B in blocks):
        return Block(sp.vstack([B.rows if B.cols is None else B.rows[:, B.cols] for B in blocks], format="csr"))
    return Block(np.concatenate([B.dense() for B in blocks]))


#: Rows of a matrix read together by :func:`times_and_back` (about this many bytes: cache-sized),
#: for matrices over :data:`WHOLE_BYTES` (smaller ones stay in cache between the two products).
CHUNK_BYTES = 1 << 22
WHOLE_BYTES = 1 << 24


def times_and_back(A: NDArray[np.float64], x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(A x, Aᵀ (A x))`` for a vector or a matrix x, in one pass over A: each cache-sized
    chunk of rows is read for both products, so a large A (a long history's basis or
    coefficients) is read from memory once, not twice — what bounds these products' time.
    Many columns with a mostly-zero A or x go through a sparse copy instead (``_sparse``)."""
    if sparse_worth(A, x):
        y = matmul(A, x)
        return y, matmul(A.T, y)
    if A.nbytes <= WHOLE_BYTES:  # small enough to be read twice from cache
        y = A @ x
        return y, (y.T @ A).T
    step = max(1, CHUNK_BYTES // (8 * max(1, A.shape[1])))
    y, back = np.empty((A.shape[0], *x.shape[1:])), np.zeros((A.shape[1], *x.shape[1:]))
    for top in range(0, A.shape[0], step):
        chunk = A[top: top + step]
        y[top: top + step] = chunk @ x
        back += (y[top: top + step].T @ chunk).T
    return y, back


def second_pass(r: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Rows left with residual norms ``r`` by a first Gram–Schmidt pass (of norms ``v``) that
    take a second: the pass cancelled ("twice is enough"; Parlett's criterion: less than
    1/√2 left) and left more than :data:`EXTEND_RTOL` (a row with at most that adds nothing)."""
    return (EXTEND_RTOL * v < r) & (r < v / math.sqrt(2.0))


def threads_for_blocks(blocks: list[Block]) -> contextlib.AbstractContextManager[None]:
    """:func:`~dpgate._blas.threads_for` the products that read every block's rows."""
    return threads_for(sum(B.nbytes for B in blocks))


def project_blocks(
    blocks: list[Block], d: NDArray[np.float64], v: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Coefficients of ``v`` on the rows of ``blocks`` (D-orthonormal) and the residual; for
    k rows ``v`` (k × n), the coefficients are k × r."""
    dv = d * v
    cs, res = [], v.copy()
    with threads_for_blocks(blocks):
        for B in blocks:
            if isinstance(B.rows, np.ndarray):
                c, back = times_and_back(B.rows, B.gather(dv).T)
            else:
                c = B.times(B.gather(dv).T)
                back = np.asarray(B.rows.T @ c)
            res -= B.spread(back.T)
            cs.append(c)
    return (np.concatenate(cs).T if cs else np.zeros((*v.shape[:-1], 0))), res


def covers_every_atom(G: sp.csr_matrix) -> bool:
    """Whether, for every atom, some row of G (sparse, without stored zeros) is non-zero on
    that atom alone (so the rows span all atoms)."""
    single = np.diff(G.indptr) == 1
    covered = np.zeros(G.shape[1], dtype=bool)
    covered[G.indices[G.indptr[:-1][single]]] = True
    return bool(covered.all())


def disjoint(G: NDArray[np.float64]) -> bool:
    """Whether the rows of G have pairwise disjoint supports (a GROUP BY's groups)."""
    return bool(((G != 0).sum(axis=0) <= 1).all())


def sparse_rows(G: NDArray[np.float64], weights: NDArray[np.float64]) -> tuple[sp.csr_matrix, ...]:
    """``(X, i, j, v)``: the rows of ``G · diag(weights)`` as a sparse matrix (a GROUP BY's
    groups touch few atoms), and G's non-zeros ``G[i, j] = v``, row by row."""
    i, j = np.nonzero(G)
    v = G[i, j]
    return sp.csr_matrix((v * weights[j], j, np.searchsorted(i, np.arange(G.shape[0] + 1))), shape=G.shape), i, j, v


def sparse_coefficients(blocks: list[Block], X: sp.csr_matrix, r: int) -> NDArray[np.float64]:
    """``V Xᵀ`` (r × k) for sparse rows X (``G D`` gives the coefficients ``V D Gᵀ``)."""
    P = np.zeros((r, X.shape[0]))
    top = 0
    for B in blocks:
        prod = B.gather_sparse(X) @ B.rows.T
        P[top: top + B.size] = (prod.toarray() if sp.issparse(prod) else np.asarray(prod)).T
        top += B.size
    return P


def _coefficients(blocks: list[Block], d: NDArray[np.float64], G: NDArray[np.float64],
                  r: int) -> NDArray[np.float64]:
    """``P = V D Gᵀ`` (r × k), the rows' coefficients on the basis."""
    P = np.zeros((r, G.shape[0]))
    top = 0
    with threads_for_blocks(blocks):
        for B in blocks:
            P[top: top + B.size] = B.times(B.gather(G * d).T)
            top += B.size
    return P


def _combine(blocks: list[Block], W: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """``W V`` (k × n) for coefficients W (k × r) on the basis rows."""
    out = np.zeros((W.shape[0], n))
    top = 0
    with threads_for_blocks(blocks):
        for B in blocks:
            out += B.spread(B.left(W[:, top: top + B.size]))
            top += B.size
    return out


def disjoint_block(blocks: list[Block], d: NDArray[np.float64], G: NDArray[np.float64],
                    norms: NDArray[np.float64], r: int) -> tuple[NDArray[np.float64], ...] | None:
    """``(P, L, L⁻¹, new basis rows)`` for rows with disjoint supports, without an O(k² n) factorisation.

    The residuals ``R = G − PᵀV`` have the Gram matrix ``R D Rᵀ = diag(‖g_i‖²) − PᵀP``
    (disjoint rows are D-orthogonal); its Cholesky factor is L and the new rows are
    ``L⁻¹R``.  The Gram matrix loses the digits a residual cancels, so every row must keep
    at least a thousandth of its norm outside the basis (else None: the general path).
    """
    X, i, j, v = sparse_rows(G, d)
    P = sparse_coefficients(blocks, X, r)
    if not P.any():  # rows D-orthogonal to the basis too (e.g. a first GROUP BY): L is diagonal
        L, Linv = np.diag(norms), np.diag(1.0 / norms)
    else:
        try:
            L = np.asarray(np.linalg.cholesky(np.diag(norms * norms) - P.T @ P), dtype=np.float64)
        except np.linalg.LinAlgError:
            return None
        if not (np.diag(L) > 1e-3 * norms).all():
            return None
        Linv = solve_triangular(L, np.eye(L.shape[0]), lower=True)
    rows = np.zeros((Linv.shape[0], G.shape[1]))
    rows[:, j] = Linv[:, i] * v  # L⁻¹G: an atom is in one group at most
    if r and P.any():  # P = 0: the residuals are the rows themselves (no O(k r n) product of zeros)
        rows -= _combine(blocks, Linv @ P.T, G.shape[1])
    return P, np.asarray(L, dtype=np.float64), Linv, rows


def orthogonal_rows(blocks: list[Block], d: NDArray[np.float64], G: sp.csr_matrix,
                    r: int) -> tuple[NDArray[np.float64], sp.csr_matrix] | None:
    """``(norms, new basis rows)`` (sparse) for non-zero rows G (sparse, scaled) with pairwise disjoint
    supports, each D-orthogonal to the basis (``V D Gᵀ = 0``: a first GROUP BY, or one over
    atoms no release touched); None otherwise.

    Appending such rows one by one, each row's coefficients on the basis (and on the rows
    before it) are zero, so its residual is the row itself: the basis gains ``g_i/‖g_i‖_D``
    and no Gram–Schmidt or factorisation is needed, whatever the number of rows — O(nnz r)
    for the coefficients, and the new rows kept sparse.
    """
    G = sp.csr_matrix(G, copy=True)
    G.sum_duplicates()
    G.eliminate_zeros()
    k, n = G.shape
    per_row = np.diff(G.indptr)
    if r + k > n or not (per_row > 0).all() or np.bincount(G.indices, minlength=n).max(initial=0) > 1:
        return None
    X = sp.csr_matrix((G.data * d[G.indices], G.indices, G.indptr), shape=G.shape)  # the rows of G D
    if r and sparse_coefficients(blocks, X, r).any():
        return None
    owner = np.repeat(np.arange(k), per_row)
    norms = np.sqrt(np.bincount(owner, weights=G.data * X.data, minlength=k))
    return norms, sp.csr_matrix((G.data / norms[owner], G.indices, G.indptr), shape=(k, n))


def general_block(blocks: list[Block], d: NDArray[np.float64], G: NDArray[np.float64],
                   norms: NDArray[np.float64], r: int) -> tuple[NDArray[np.float64], ...] | None:
    """``(P, L, L⁻¹, new basis rows)`` by classical Gram–Schmidt against V (twice: "twice is
    enough") and an LQ factorisation of the residuals; None unless every row adds a clear direction."""
    P = np.zeros((r, G.shape[0]))
    R = G.copy()
    for _ in range(2):
        c = _coefficients(blocks, d, R, r)
        if r:
            R -= _combine(blocks, c.T, G.shape[1])
        P += c
    sq = np.sqrt(d)
    Qt, Rt = np.linalg.qr((R * sq).T)  # (R √D)ᵀ = Q̃ R̃, so R √D = L Q̃ᵀ with L = R̃ᵀ
    L = Rt.T
    if not (np.abs(np.diag(L)) > 1e3 * EXTEND_RTOL * norms).all():
        return None
    return P, L, solve_triangular(L, np.eye(L.shape[0]), lower=True), np.asarray(Qt.T / sq)


def mixed_block(blocks: list[Block], d: NDArray[np.float64], G: NDArray[np.float64], norms: NDArray[np.float64],
                r: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """``(P, L, new basis rows, which rows add one)`` for any rows, in order, as appending them one by one decides:
    P (r × k) their coefficients on the basis (classical Gram–Schmidt, twice), then modified
    Gram–Schmidt of the residuals against the directions earlier rows of the block added
    (twice when a pass cancels); a row adds a direction when what is left of it exceeds
    ``EXTEND_RTOL`` of its norm.  L (k × k') holds the rows' coefficients on the k' new rows.
    """
    n, k = G.shape[1], G.shape[0]
    if r == n:  # the basis spans every atom: no residual, no new direction (one product, not four)
        return _coefficients(blocks, d, G, r), np.zeros((k, 0)), np.zeros((0, n)), np.zeros(k, dtype=bool)
    P = _coefficients(blocks, d, G, r)
    R = G - _combine(blocks, P.T, n) if r else G.copy()
    # The second pass only where it can matter (second_pass).  Elsewhere it changes P and R
    # by rounding only: a row with most of itself left is orthogonal to the basis to working
    # precision, and one with at most EXTEND_RTOL left adds nothing (a projection only shrinks
    # it).  Near full rank, that is almost every row: half the work of a long history.
    again = np.flatnonzero(second_pass(np.sqrt(np.einsum("ij,ij,j->i", R, R, d)), norms))
    if r and again.size:
        c = _coefficients(blocks, d, R[again], r)
        R[again] -= _combine(blocks, c.T, n)
        P[:, again] += c
    E = np.zeros((k, n))
    L = np.zeros((k, k))
    adds = np.zeros(k, dtype=bool)
    kn = 0
    for i in range(k):
        v = R[i]
        for _ in range(2):  # "twice is enough"
            before = math.sqrt(float(np.dot(d * v, v)))
            if kn:
                co = E[:kn] @ (d * v)
                v = v - co @ E[:kn]
                L[i, :kn] += co
            after = math.sqrt(float(np.dot(d * v, v)))
            if not kn or after >= before / math.sqrt(2.0):
                break
        if after > EXTEND_RTOL * norms[i]:
            E[kn] = v / after
            L[i, kn] = after
            adds[i] = True
            kn += 1
    return P, L[:, :kn], E[:kn], adds
