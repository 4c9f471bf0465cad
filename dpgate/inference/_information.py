"""The information form of the incremental BLUE, for a history that spans every atom.

When the released rows span every atom (a hierarchical tree with its leaves), the
basis form (``_basis_form``: V r × n, C m × r, S r × r, all dense) costs O(m r)
per solve.  Here the state is instead:

* the rows ``G = H/b`` as a sparse matrix (a tree node or a range over cells has few
  atoms), so ``u = G w`` and the information ``F = GᵀG`` applied to a vector cost
  O(nnz);
* a dense ``M₀ = (F₀ + R₀)⁻¹`` for the rows and atoms at the last fold, reached from
  the current atoms by a lifting (below), and a few pending low-rank terms
  ``± u uᵀ`` folded in by Woodbury's identity, so a solve costs O(n²).  The first
  M₀ is built bottom-up when the rows are a hierarchy with its leaves (O(n²),
  :func:`_hierarchy_inverse`), else by Cholesky (O(n³));
* a regulariser ``Ñ`` (n × f, sparse) whose range complements the range of F
  (``f = n − rank``): ``(F + ÑÑᵀ)⁻¹`` is then a generalised inverse of F (if
  ``F y + ÑÑᵀy = F a`` then ``ÑÑᵀy = 0`` by the direct sum, so ``F y = F a``), and for
  an estimable Q, ``u = G (F + ÑÑᵀ)⁻¹ Q`` is the BLUE's (``G F⁻ Gᵀ`` is the projector
  on the column space of G for every generalised inverse).  ``Q = F w + Ñ(Ñᵀw)`` with
  ``w = (F + ÑÑᵀ)⁻¹ Q``, so ``Ñ Ñᵀ w`` is the part of Q outside the row space: Q is
  estimable iff it vanishes (``‖·‖_D`` at most ``ESTIMABLE_RTOL ‖Q‖_D``).

Appending ``g``: with ``c = Ñᵀ(F + ÑÑᵀ)⁻¹ g``, g adds a direction iff ``Ñc ≠ 0``; then
the column p of Ñ with the largest ``|c_p|`` is dropped (c does not lie in the span of
the other coordinates, so the rest still complements the grown range) — the pending
terms get ``+ggᵀ`` and ``−Ñ_pÑ_pᵀ``.

Splitting atom a into pieces (first piece ``a₀``): in the basis ``T = [R, K]`` of the
new atoms (R puts each old atom on its first piece, K holds the contrasts
``e_{a_j} − e_{a₀}``), the new information is ``T⁻ᵀ diag(F, 0) T⁻¹`` (a row is equal on
the pieces), so with the new regulariser ``[L Ñ, σ e_{a_j}]`` (L repeats each old atom
on its pieces) the new inverse is ``T diag(M, σ⁻² I) Tᵀ = R M Rᵀ + K Kᵀ/σ²``: nothing
dense is rewritten — M₀ stays, the lifting gains sparse columns, pending rows are
repeated (L) and their images under the inverse embedded (R).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.linalg import blas, lapack, lu_factor, lu_solve

from dpgate._blas import every_blas_thread, threads_for
from dpgate.inference._blocks import EXTEND_RTOL

__all__ = ["Information"]

#: Pending low-rank terms before they are folded into the dense inverse (O(n² k)).
MAX_PENDING = 48

#: :meth:`Information.solve` stops refining at this residual, relative to the largest entry
#: of the right-hand side (the basis form's criterion: the residual is the estimator's bias
#: coefficient, so 1e-12 of a count's weights is far below any noise).
_SOLVE_RTOL = 1e-12


def _inverse_pd(F: NDArray[np.float64]) -> NDArray[np.float64] | None:
    """The inverse of a symmetric positive definite F (Cholesky, LAPACK potrf/potri), or None.
    Large enough to use every BLAS thread (``n³``, not the gateway's microsecond kernels)."""
    with every_blas_thread():
        c, info = lapack.dpotrf(F, lower=True, clean=True, overwrite_a=False)
        if info != 0:
            return None
        inv, info = lapack.dpotri(c, lower=True, overwrite_c=True)
    if info != 0:
        return None
    # potri writes the lower triangle; the upper one is still zero (clean=True above).
    diag = np.diag(inv).copy()
    inv += inv.T
    np.fill_diagonal(inv, diag)
    return np.asarray(inv, dtype=np.float64)


def _hierarchy_inverse(G: sp.csr_matrix) -> NDArray[np.float64] | None:
    """``(GᵀG)⁻¹`` in O(n² + nnz) when G is a hierarchy with its leaves, else None.

    That is: every row is a multiple of the indicator of an atom set, the sets are
    laminar (two are nested or disjoint), and every set of several atoms is partitioned
    by its largest proper subsets (so every atom has a singleton set).  Bottom-up, a
    set's inverse is its children's block-diagonal inverse B, corrected for the set's
    own rows ``w 1 1ᵀ`` by Sherman–Morrison, ``B − (w/(1 + w 1ᵀB1)) B1 (B1)ᵀ``: each
    correction is a rank-one update of the set's block, in an atom order (depth first)
    that makes every set contiguous.  A tree over 4 096 cells costs 2n² updates here
    against the n³ of a Cholesky inverse.
    """
    m, n = G.shape
    G = sp.csr_matrix(G, copy=True)
    G.sum_duplicates()
    G.eliminate_zeros()
    sizes = np.diff(G.indptr)
    if m == 0 or (sizes == 0).any():
        return None
    lead = G.data[G.indptr[:-1]]  # each row's first value: all of its values, for a set
    if not np.array_equal(G.data, np.repeat(lead, sizes)):
        return None
    # One set per distinct support (repeats add their weights), largest first.
    supports: dict[bytes, int] = {}
    members: list[NDArray[np.int32]] = []
    weight: list[float] = []
    for r in np.argsort(-sizes, kind="stable"):
        idx = G.indices[G.indptr[r]: G.indptr[r + 1]]  # sorted: sum_duplicates canonicalised G
        s = supports.setdefault(idx.tobytes(), len(members))
        if s == len(members):
            members.append(idx)
            weight.append(0.0)
        weight[s] += float(lead[r]) ** 2
    # Laminar: a set's atoms all lie in the same smallest earlier set (its parent, or none).
    label = np.full(n, -1)
    parent = np.empty(len(members), dtype=np.int64)
    for s, idx in enumerate(members):
        below = label[idx]
        if (below != below[0]).any():
            return None
        parent[s] = below[0]
        label[idx] = s
    size = np.array([idx.size for idx in members])
    covered = np.bincount(parent + 1, weights=size, minlength=len(members) + 1)
    if covered[0] != n or not np.array_equal(covered[1:][size > 1], size[size > 1]):
        return None  # an atom outside every set, or a set its children do not partition
    # Depth-first positions: a parent comes before its children (larger), which take
    # consecutive slices of its own.
    start = np.empty(len(members), dtype=np.int64)
    free = np.zeros(len(members) + 1, dtype=np.int64)  # next free position in each set (0: the roots)
    for s in range(len(members)):
        p = parent[s] + 1
        start[s] = free[p]
        free[p] += size[s]
        free[s + 1] = start[s]
    pos = np.empty(n, dtype=np.int64)
    singles = np.flatnonzero(size == 1)
    pos[np.concatenate([members[s] for s in singles])] = start[singles]
    M = np.zeros((n, n))
    rowsum = np.zeros(n)  # M·1 on each finished set
    M[start[singles], start[singles]] = rowsum[start[singles]] = 1.0 / np.asarray(weight)[singles]
    for s in range(len(members) - 1, -1, -1):  # smallest first: children before parents
        if size[s] == 1:
            continue
        lo, hi = start[s], start[s] + size[s]
        x = rowsum[lo:hi]
        total = float(x.sum())
        c = weight[s] / (1.0 + weight[s] * total)
        y = math.sqrt(c) * x  # y yᵀ is exactly symmetric
        M[lo:hi, lo:hi] -= np.multiply.outer(y, y)
        rowsum[lo:hi] = x * (1.0 - c * total)
    if not np.array_equal(pos, np.arange(n)):
        M = M[np.ix_(pos, pos)]
    return M


#: Up to this many right-hand sides, :func:`_symmetric_times` reads one triangle per column.
_SYMV_COLUMNS = 4


def _symmetric_times(M: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``M @ x`` for an exactly symmetric M (both triangles equal, as every M₀ here is),
    reading one triangle (BLAS ``symv``): at n = 4 096 the product is bound by memory
    traffic, which this halves.  Many right-hand sides go to the matrix product."""
    Mf = M if M.flags.f_contiguous else M.T  # symv takes a column-major triangle without a copy
    if not Mf.flags.f_contiguous or (x.ndim == 2 and x.shape[1] > _SYMV_COLUMNS):
        return np.asarray(M @ x)
    with threads_for(M.nbytes):
        if x.ndim == 1:
            return np.asarray(blas.dsymv(1.0, Mf, x, lower=1))
        out = np.empty(x.shape)
        for j in range(x.shape[1]):
            out[:, j] = blas.dsymv(1.0, Mf, x[:, j], lower=1)
        return out


class Information:
    """The matrices of the information form (``_information_form``) of
    :class:`~dpgate.inference.IncrementalBLUE` (see the module doc).

    Built from rows G (m × n, scaled by 1/b) that have full column rank; returns None
    from :meth:`build` otherwise.
    """

    def __init__(self, M0: NDArray[np.float64], G: sp.csr_matrix, d: NDArray[np.float64], sigma: float) -> None:
        n = d.size
        M0.setflags(write=False)
        self._M0 = M0
        self._pos = np.arange(n)  # base atom → current atom (its first piece)
        self._cs = sp.csr_matrix((n, 0))  # lifting contrasts: the inverse is R M₀ Rᵀ + cs csᵀ − pending
        self._G = G
        self._new: list[sp.csr_matrix] = []  # rows appended since G was last stacked
        self._reg = sp.csc_matrix((n, 0))  # Ñ
        self._sigma = sigma
        self._U: list[NDArray[np.float64]] = []
        self._Z: list[NDArray[np.float64]] = []  # lifted inverse × U
        self._sgn: list[float] = []
        self._lu: tuple[NDArray[np.float64], tuple[NDArray[np.float64], NDArray[np.int32]]] | None = None
        self._fresh = True  # the inverse was just computed from the rows
        self._d = d

    @classmethod
    def build(cls, G: sp.csr_matrix, d: NDArray[np.float64]) -> Information | None:
        """The state of rows G (full column rank), or None if ``GᵀG`` is not positive definite."""
        M0 = _hierarchy_inverse(G)
        if M0 is None:
            M0 = _inverse_pd((G.T @ G).toarray())
            if M0 is None:
                return None
        sigma = math.sqrt(float(np.mean(np.asarray(G.multiply(G).sum(axis=0)))))  # of diag(GᵀG)
        return cls(M0, G.tocsr(), d.copy(), sigma)

    # ------------------------------------------------------------------ plumbing
    def copy(self) -> Information:
        """An independent copy (dense and sparse arrays are shared: they are never written)."""
        new = object.__new__(Information)
        new.__dict__.update(self.__dict__)
        new._new, new._U, new._Z, new._sgn = list(self._new), list(self._U), list(self._Z), list(self._sgn)
        return new

    @property
    def nullity(self) -> int:
        """``n − rank``."""
        return int(self._reg.shape[1])

    @property
    def n(self) -> int:
        """Number of atoms."""
        return int(self._d.size)

    def rows(self) -> sp.csr_matrix:
        """All rows G (m × n, sparse)."""
        if self._new:
            self._G = sp.vstack([self._G, *self._new], format="csr")
            self._new = []
        return self._G

    def _dnorm(self, v: NDArray[np.float64]) -> float:
        return math.sqrt(float(np.dot(self._d * v, v)))

    def _lifted(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(R M₀ Rᵀ + cs csᵀ) q`` for a vector or an n × k matrix."""
        z = np.zeros(q.shape)
        z[self._pos] = _symmetric_times(self._M0, q[self._pos])
        if self._cs.shape[1]:
            z += self._cs @ (self._cs.T @ q)
        return z

    def _factor(self) -> tuple[NDArray[np.float64], tuple[NDArray[np.float64], NDArray[np.int32]]]:
        """Z (n × k) and the LU factors of ``K = diag(±1) + UᵀZ``: by Woodbury's identity the
        inverse is the lifted one minus ``Z K⁻¹ Zᵀ``."""
        if self._lu is None:
            Z = np.column_stack(self._Z)
            K = np.diag(self._sgn) + np.column_stack(self._U).T @ Z
            self._lu = (Z, lu_factor(K))
        return self._lu

    def apply(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(F + ÑÑᵀ)⁻¹ q`` from the stored factors (no refinement)."""
        z = self._lifted(q)
        if self._U:
            Z, lu = self._factor()
            z -= Z @ lu_solve(lu, Z.T @ q)
        return z

    def operator(self, z: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(F + ÑÑᵀ) z`` from the sparse rows and regulariser (exact up to rounding)."""
        G = self.rows()
        out = np.asarray(G.T @ (G @ z))
        if self._reg.shape[1]:
            out = out + self._reg @ (self._reg.T @ z)
        return out

    def solve(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(F + ÑÑᵀ)⁻¹ q``, polished by iterative refinement against :meth:`operator`.

        The dense inverse collects rounding from its folds; refinement stops within
        :data:`_SOLVE_RTOL` or at the rounding floor.  If the first residual is large
        (1e-6 relative) the inverse is rebuilt from the rows (O(n³), rare).
        """
        scale = float(np.abs(q).max(initial=0.0))
        if scale == 0.0:
            return np.zeros(q.shape)
        z = self.apply(q)
        resid = q - self.operator(z)
        size = first = float(np.abs(resid).max(initial=0.0))
        for _ in range(4):
            if size <= _SOLVE_RTOL * scale:
                break
            z_new = z + self.apply(resid)
            r_new = q - self.operator(z_new)
            s_new = float(np.abs(r_new).max(initial=0.0))
            if s_new >= size:
                break
            z, resid, size = z_new, r_new, s_new
        if first > 1e-6 * scale and not self._fresh and self._rebuild():
            return self.solve(q)
        return z

    def _rebuild(self) -> bool:
        """Recompute the dense inverse from the rows and the regulariser; False if that fails."""
        G = self.rows()
        A = (G.T @ G).toarray()
        if self._reg.shape[1]:
            A += (self._reg @ self._reg.T).toarray()
        M0 = _inverse_pd(A)
        if M0 is None:
            return False
        self._reset(M0)
        self._fresh = True
        return True

    def _reset(self, M0: NDArray[np.float64]) -> None:
        M0.setflags(write=False)
        self._M0, self._pos, self._cs = M0, np.arange(self.n), sp.csr_matrix((self.n, 0))
        self._U, self._Z, self._sgn, self._lu = [], [], [], None

    def _fold(self) -> None:
        """Fold the pending terms and the lifting into a new dense inverse (O(n² k))."""
        full = np.zeros((self.n, self.n))
        full[np.ix_(self._pos, self._pos)] = self._M0
        if self._cs.shape[1]:
            full += (self._cs @ self._cs.T).toarray()
        if self._U:
            Z, lu = self._factor()
            full -= Z @ lu_solve(lu, Z.T)
        self._reset((full + full.T) / 2)

    def _pend(self, u: NDArray[np.float64], sign: float, z: NDArray[np.float64] | None = None) -> None:
        self._U.append(u)
        self._Z.append(self._lifted(u) if z is None else z)
        self._sgn.append(sign)
        self._lu = None
        self._fresh = False

    # ------------------------------------------------------------------ queries
    def outside(self, w: NDArray[np.float64]) -> NDArray[np.float64]:
        """``ÑÑᵀw``: for ``w = solve(q)``, the part of q outside the row space."""
        if not self._reg.shape[1]:
            return np.zeros(self.n)
        return np.asarray(self._reg @ (self._reg.T @ w))

    def weights(self, w: NDArray[np.float64]) -> NDArray[np.float64]:
        """``u = G w`` (one entry per row)."""
        return np.asarray(self.rows() @ w)

    # ------------------------------------------------------------------ updates
    def append(self, g: NDArray[np.float64]) -> bool:
        """Add the row g (= h/b); True when it adds a direction (the rank grows)."""
        grows = False
        if self.nullity:
            c = np.asarray(self._reg.T @ self.solve(g))  # Ñᵀ(F + ÑÑᵀ)⁻¹g
            if self._dnorm(np.asarray(self._reg @ c)) > EXTEND_RTOL * self._dnorm(g):
                p = int(np.argmax(np.abs(c)))
                col = self._reg[:, p].toarray().ravel()
                keep = np.delete(np.arange(self.nullity), p)
                self._reg = self._reg[:, keep]
                self._pend(col, -1.0)
                grows = True
        self._new.append(sp.csr_matrix(g[None, :]))
        self._pend(g, 1.0)
        if len(self._U) > MAX_PENDING:
            self._fold()
        return grows

    def extend(self, G: NDArray[np.float64]) -> int:
        """Add the rows of G (k × n, scaled); returns how many directions they add."""
        if self.nullity:
            return sum(self.append(g) for g in G)
        # Full rank: no row adds a direction; the block's images come from one matrix product.
        self._new.append(sp.csr_matrix(G))
        Z = self._lifted(np.ascontiguousarray(G.T))
        for i, g in enumerate(G):
            self._pend(g, 1.0, Z[:, i])
        if len(self._U) > MAX_PENDING:
            self._fold()
        return 0

    def split(self, parent: NDArray[np.intp], d: NDArray[np.float64]) -> None:
        """New atom i is a piece of old atom ``parent[i]`` (see the module doc)."""
        n_new, n_old = parent.size, self.n
        order = np.argsort(parent, kind="stable")
        first_of = np.empty(n_old, dtype=np.int64)
        starts = np.searchsorted(parent[order], np.arange(n_old))
        first_of[:] = order[starts]
        others = np.setdiff1d(np.arange(n_new), first_of, assume_unique=False)
        embed = sp.csr_matrix((np.ones(n_old), (first_of, np.arange(n_old))), shape=(n_new, n_old))
        k = others.size
        contrasts = sp.csr_matrix(
            (np.concatenate([np.ones(k), -np.ones(k)]) / self._sigma,
             (np.concatenate([others, first_of[parent[others]]]), np.tile(np.arange(k), 2))),
            shape=(n_new, k))
        self._cs = sp.hstack([embed @ self._cs, contrasts], format="csr")
        units = sp.csc_matrix((np.full(k, self._sigma), (others, np.arange(k))), shape=(n_new, k))
        self._reg = sp.hstack([self._reg.tocsr()[parent], units], format="csc")
        self._pos = first_of[self._pos]
        self._G = self.rows()[:, parent].tocsr()
        self._U = [u[parent] for u in self._U]
        self._Z = [embed @ z for z in self._Z]
        self._lu = None
        self._fresh = False
        self._d = d.copy()
