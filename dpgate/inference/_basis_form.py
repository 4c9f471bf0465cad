"""The basis form of the incremental BLUE: a basis of the row space and the coefficients on it.

State (``G`` = history rows scaled by ``1/b``, over ``n`` atoms of sizes ``d``):

* ``V`` (r × n): a basis of the row space of G, orthonormal for
  ``⟨u, v⟩_D = Σ_j d_j u_j v_j`` — the ordinary inner product of the expanded
  cell vectors, so atoms behave exactly like the cells they stand for;
* ``C`` (m × r) with ``G = C V``; ``M = (CᵀC)⁻¹`` (r × r), kept as a square root
  ``M = S Sᵀ`` (Potter's square-root form of the Sherman–Morrison update: it
  keeps M positive definite and its rounding errors at the level of ``cond(C)``
  rather than ``cond(C)²``).

Appending ``h`` with scale b: ``c = ⟨h/b, V⟩_D``, ``ρ = h/b − cV`` (Gram–Schmidt,
re-orthogonalised once when the first pass cancelled: "twice is enough").  If
``‖ρ‖_D > 1e-9 ‖h/b‖_D`` the basis grows by ``ρ/‖ρ‖_D`` and M by the block formula
``[[M, −Mcᵀ/ρ], [−cM/ρ, (1 + cMcᵀ)/ρ²]]``, i.e. ``S ← [[S, 0], [−cS/ρ, 1/ρ]]``;
otherwise Sherman–Morrison ``M ← M − Mcᵀ cM / (1 + cMcᵀ)``, i.e. with
``φ = Sᵀcᵀ``, ``β = 1 + φᵀφ``: ``S ← S − (Sφ) φᵀ / (β + √β)``.  O(rn + r²) per row.
Solves with M are polished by iterative refinement against C (see :meth:`BasisForm._solve_now`).

A query Q (over atoms) is estimable iff ``‖Q − c_Q V‖_D ≤ 1e-9 ‖Q‖_D`` with
``c_Q = ⟨Q, V⟩_D``; then ``u = C M c_Qᵀ`` is the minimum-norm solution of
``Gᵀu = Qᵀ``, ``A_k = u_k/b_k`` and ``Var = 2‖u‖² = 2 c_Q M c_Qᵀ``.

Storage.  Nothing a copy may share is ever written: V is kept as row blocks that are
never written after they are filled (``_blocks``), C as frozen row blocks and S as
``diag(S₀, I)(I + XZᵀ)`` (``_factors``), so :meth:`BasisForm.copy` costs O(r p),
not O(m r + r² + r n); y, b, γ are copied on the first write after a copy (``_form``).
A block of releases enters at once (``_blocks``: disjoint groups, new directions, or any mix);
a GROUP BY on atoms no release touched, as sparse basis rows, sparse C rows and a diagonal S
(:meth:`BasisForm.extend_orthogonal`).

Splitting atoms (new atom i is a piece of old atom ``parent[i]``): ``V ← V[:, parent]``
(recorded, not copied: ``_blocks.Block``) and ``d ← new sizes``.  V stays orthonormal because the sizes of the pieces of
an atom add up to the atom's size:
``Σ_i d'_i V_{a,p(i)} V_{b,p(i)} = Σ_j (Σ_{i∈p⁻¹(j)} d'_i) V_{aj} V_{bj} = Σ_j d_j V_{aj} V_{bj}``.
``G ← G[:, parent] = C V[:, parent]``, so C and M do not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from dpgate._validate import readonly
from dpgate.errors import InvalidArgument
from dpgate.inference._blocks import (
    EXTEND_RTOL,
    Block,
    combined_classes,
    disjoint,
    disjoint_block,
    general_block,
    merged,
    mixed_block,
    orthogonal_rows,
    project_blocks,
    second_pass,
    sparse_coefficients,
    sparse_rows,
    threads_for_blocks,
)
from dpgate.inference._blue import ESTIMABLE_RTOL, Estimate
from dpgate.inference._factors import Root, Rows
from dpgate.inference._form import Form, Known, frozen_pair, grow
from dpgate.inference._law import ErrorLaw
from dpgate.inference._posterior import Posterior

__all__ = ["TWIN_CELLS", "BasisForm"]

#: A solve is refined until its normal-equations residual (the estimator's bias coefficient)
#: is at most this fraction of the right-hand side's largest entry: far below any interval
#: width, and usually met without a refinement step (each costs two products with C, O(m r)).
_SOLVE_RTOL = 1e-12
#: :meth:`BasisForm.restrictions_possible` rules a set out only by this margin (× ‖Q‖²).
_MARGIN = 1e-4
#: From this many rows on, :meth:`BasisForm.estimate_many` finds the rows history cannot
#: estimate together (below, one projection each is as fast).
_BATCH_ROWS = 16
#: Largest basis (rows × columns, summed over blocks) :meth:`BasisForm.twin_classes` compares.
TWIN_CELLS = 1 << 21


class BasisForm(Form):
    """The history as a D-orthonormal basis V, coefficients C and ``S`` with ``(CᵀC)⁻¹ = S Sᵀ``
    (see the module doc)."""

    def __init__(self, d: NDArray[np.float64], keep_rows: bool) -> None:
        super().__init__(d, keep_rows)
        # V = the rows of the frozen blocks, then the first _rv rows of _V (the own buffer).
        self._blocks: list[Block] = []
        self._V = np.zeros((8, d.size))
        self._rv = 0
        self._C = Rows()
        self._S = Root()  # M = S Sᵀ
        self._fresh = False  # S was just rebuilt from C

    def twin_classes(self) -> NDArray[np.intp] | None:
        """For each atom, a class id: atoms of one class have equal columns in the basis;
        ``None`` when the basis holds more than :data:`TWIN_CELLS` numbers.  Each frozen
        block's classes are found once (blocks are never written)."""
        blocks = self._vblocks()
        if sum(B.rows.size for B in blocks) > TWIN_CELLS:
            return None
        if not blocks:
            return np.zeros(self.n_atoms, dtype=np.intp)
        return combined_classes([B.classes() for B in blocks])

    def basis(self) -> NDArray[np.float64]:
        """The D-orthonormal basis V of the row space, r × n (a new array)."""
        return np.concatenate([B.dense() for B in self._vblocks()]) if self._r else np.zeros((0, self.n_atoms))

    def copy(self) -> BasisForm:
        """An independent copy: V is shared, not copied (its filled rows are never written
        again, so they become a frozen block of both sides), C and S share their frozen parts."""
        # Both sides keep the merged frozen blocks: merging (O(r n) when it concatenates) is
        # paid once, not on every copy of a state that is copied per decision.
        blocks = merged(self._vblocks())
        self._blocks, self._V, self._rv = blocks, np.zeros((8, self.n_atoms)), 0
        new = self._copied()
        new._blocks = list(blocks)
        new._V = np.zeros((8, self.n_atoms))
        new._rv = 0
        new._C, new._S = self._C.copy(), self._S.copy()
        return new

    def __getstate__(self) -> dict[str, object]:
        """Pickled without spare capacity, remembered results or shared-buffer flags."""
        return {**super().__getstate__(), "_V": self._V[: self._rv].copy()}

    def _vblocks(self) -> list[Block]:
        return [*self._blocks, Block(self._V[: self._rv])] if self._rv else list(self._blocks)

    # ------------------------------------------------------------------ projections and solves
    def project(self, v: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Coefficients ``c`` of v on V and the residual ``v − cV`` (:meth:`_project_now`,
        remembered; read-only results)."""
        return self._remembered(("project", v.tobytes()), lambda: frozen_pair(self._project_now(v)))

    def _project_now(self, v: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Coefficients ``c`` of v on V and the residual ``v − cV``.

        Classical Gram–Schmidt, repeated once only when the first pass cancelled
        (Kahan–Parlett "twice is enough": ``‖res‖ < ‖v‖/√2``) and the residual is
        not negligible anyway — V is memory-bound, so each pass counts.
        """
        blocks = self._vblocks()
        d = self._d
        if self._r == d.size:  # V spans every atom: the residual is zero (half the work skipped)
            dv = d * v
            with threads_for_blocks(blocks):
                return np.concatenate([B.times(B.gather(dv)) for B in blocks]), np.zeros(v.shape)
        if len(blocks) == 1 and blocks[0].cols is None and isinstance(blocks[0].rows, np.ndarray):
            V = blocks[0].rows
            c = V @ (d * v)
            res = v - c @ V
        else:
            c, res = project_blocks(blocks, d, v)
        rn, vn = self.dnorm(res), self.dnorm(v)
        if EXTEND_RTOL * vn < rn < vn / math.sqrt(2.0):
            c2, res = project_blocks(blocks, d, res)
            c = c + c2
        return c, res

    def coordinates(self, Q: NDArray[np.float64]) -> tuple[NDArray[np.float64], bool]:
        """``(c_Q, estimable)``: Q's coefficients on the basis and whether its residual vanishes."""
        cQ, res = self.project(Q)
        return cQ, self.dnorm(res) <= ESTIMABLE_RTOL * self.dnorm(Q)

    def solve(self, rhs: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(CᵀC)⁻¹ rhs`` (:meth:`_solve_now`, remembered; a read-only result)."""
        return self._solve_pair(rhs)[0]

    def weights(self, c: NDArray[np.float64]) -> NDArray[np.float64]:
        """``C (CᵀC)⁻¹ c``: the refinement's last product with C, not a new one."""
        return self._solve_pair(c)[1]

    def _solve_pair(self, rhs: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self._remembered(("solve", rhs.tobytes()), lambda: frozen_pair(self._solve_now(rhs)))

    def _solve_now(self, rhs: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``z = (CᵀC)⁻¹ rhs`` from ``M = S Sᵀ``, with iterative refinement against C, and ``C z``.

        M is kept by rank-one updates and accumulates rounding errors; each
        refinement step (O(mr)) multiplies the error by ``‖I − M CᵀC‖``.  The residual
        ``rhs − CᵀC z`` is the estimator's bias coefficient (``Cᵀu`` should equal ``c_Q``),
        so refinement stops once it is within :data:`_SOLVE_RTOL` of the largest entry of
        ``rhs`` — or at the rounding floor (of the residual, or of z: a correction below
        2·10⁻¹⁵ of it).  If M has drifted so far (first residual
        above 1e-3 relative) that refinement would crawl, S is rebuilt from a
        QR factorisation of C (O(mr²), rare).
        """
        r = self._r
        if r == 0:
            return np.zeros(0), np.zeros(self._m)
        C, S = self._C, self._S
        scale = float(np.abs(rhs).max(initial=0.0))
        z = S.gram_times(rhs)
        Cz, gram = C.times_and_gram(z, r)
        resid = rhs - gram
        size = first = float(np.abs(resid).max(initial=0.0))
        for _ in range(6):
            if size <= _SOLVE_RTOL * scale:
                break
            dz = S.gram_times(resid)
            if np.abs(dz).max(initial=0.0) <= 2e-15 * np.abs(z).max(initial=0.0):
                z = z + dz  # the correction is below rounding: z is as good as it gets
                Cz = C.times(z)
                break
            z_new = z + dz
            Cz_new, gram = C.times_and_gram(z_new, r)
            r_new = rhs - gram
            s_new = float(np.abs(r_new).max(initial=0.0))
            if s_new >= size:  # the rounding floor: stop
                break
            z, Cz, resid, size = z_new, Cz_new, r_new, s_new
        if first > 1e-3 * scale and not self._fresh:
            # M has drifted far enough to slow refinement down: rebuild it from C.
            self._refresh()
            return self._solve_now(rhs)
        return z, Cz

    def _refresh(self) -> None:
        """Recompute the square root S = R⁻¹ of M = (CᵀC)⁻¹ from the QR factorisation C = QR."""
        R = np.linalg.qr(self._C.dense(self._r), mode="r")
        self._S = Root(solve_triangular(R, np.eye(self._r)))
        self._fresh = True

    # ------------------------------------------------------------------ updates
    def _add(self, h: NDArray[np.float64], g: NDArray[np.float64], scale: float) -> None:
        r = self._r
        gn = self.dnorm(g)
        if gn == 0.0:  # a zero row carries no information
            self._C.add(np.zeros((1, r)))
            return
        c, rho = self._project_now(g)
        rn = self.dnorm(rho)
        S = self._S
        cS = S.t_times(c)  # φ = Sᵀcᵀ
        self._fresh = False
        if rn > EXTEND_RTOL * gn:
            self._V = grow(self._V, self._rv + 1, self.n_atoms)
            self._V[self._rv] = rho / rn
            self._rv += 1
            self._C.add(np.append(c, rn)[None, :])
            S.border(-cS[None, :] / rn, np.array([[1.0 / rn]]))
            self._r = r + 1
            c, rho = np.append(c, rn), np.zeros_like(rho)
        else:
            self._C.add(c[None, :])
            beta = 1.0 + float(cS @ cS)
            S.update(-cS / (beta + math.sqrt(beta)), cS)  # S ← S − (Sφ)φᵀ/(β + √β)
        # The projection of h itself on the new basis is known: an estimate of h (the usual
        # next question) skips its Gram–Schmidt.
        self._memo = {("project", h.tobytes()): (readonly(scale * c), readonly(scale * rho))}

    def extend_block(self, H: NDArray[np.float64], b: NDArray[np.float64], y: NDArray[np.float64],
                     g: NDArray[np.float64]) -> bool:
        """The block path of :meth:`IncrementalBLUE.extend`: with ``P`` the rows' coefficients
        on V and ``L`` (lower triangular) on the new directions, C gains the rows ``[Pᵀ, L]``
        and the square root of M becomes ``[[S, 0], [−L⁻¹PᵀS, L⁻¹]]`` (the one-row formula
        of :meth:`append` with ρ → L); False (nothing changed) when a row is zero."""
        self._memo = {}
        G = H / b[:, None]
        d = self._d
        norms = np.sqrt((G * G) @ d)
        r, k = self._r, G.shape[0]
        if not (norms > 0).all():
            return False
        blocks = self._vblocks()
        found = None
        if r + k <= self.n_atoms:
            found = disjoint_block(blocks, d, G, norms, r) if disjoint(G) else general_block(blocks, d, G, norms, r)
        if found is None:
            return self._extend_mixed(H, G, b, y, g, norms)
        P, L, Linv, Vnew = found
        self.store(H, b, y, g)
        self._C.add(np.concatenate([P.T, L], axis=1))
        self._V = grow(self._V, self._rv + k, self.n_atoms)
        self._V[self._rv: self._rv + k] = Vnew
        self._rv += k
        S = self._S
        PS = S.t_times(P).T  # Pᵀ S
        S.border(-Linv @ PS, Linv)
        self._r = r + k
        self._fresh = False
        return True

    def extend_orthogonal(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64],
                          y: NDArray[np.float64], g: NDArray[np.float64]) -> bool:
        """Non-zero rows with pairwise disjoint supports, each D-orthogonal to the basis (a first
        GROUP BY: ``_blocks.orthogonal_rows``), as one block whatever their number — the
        one-row formulas of :meth:`append` with ``c = 0``: V gains ``g_i/‖g_i‖_D`` (a frozen
        block of its own), C the rows ``[0, diag(‖g_i‖_D)]`` (kept sparse) and S the diagonal
        block ``diag(1/‖g_i‖_D)`` (kept as a vector when S is diagonal).  False (nothing changed) when the rows are not such."""
        Gs = (sp.diags(1.0 / b) @ sp.csr_matrix(H)).tocsr()
        found = orthogonal_rows(self._vblocks(), self._d, Gs, self._r)
        if found is None:
            return False
        norms, Vnew = found
        self._memo = {}
        r, k = self._r, norms.size
        self.store(H, b, y, g)
        self._C.add_frozen(sp.csr_matrix((norms, r + np.arange(k), np.arange(k + 1)), shape=(k, r + k)))
        self._blocks, self._V, self._rv = [*self._vblocks(), Block(Vnew)], np.zeros((8, self.n_atoms)), 0
        self._S.border(np.zeros((k, r)), 1.0 / norms)  # a diagonal block
        self._r = r + k
        self._fresh = False
        return True

    def _extend_mixed(self, H: NDArray[np.float64], G: NDArray[np.float64], b: NDArray[np.float64],
                      y: NDArray[np.float64], g: NDArray[np.float64], norms: NDArray[np.float64]) -> bool:
        """Any block of non-zero rows: which add directions is decided in order, as
        :meth:`append` does (``mixed_block``); C gains the rows ``[Pᵀ, L]`` and S the same
        sequence of updates as appending the rows one by one (``Root.append_rows``)."""
        r = self._r
        P, L, Vnew, adds = mixed_block(self._vblocks(), self._d, G, norms, r)
        self.store(H, b, y, g)
        self._S.append_rows(P, L, adds)
        kn = L.shape[1]
        self._C.add(np.concatenate([P.T, L], axis=1))
        self._V = grow(self._V, self._rv + kn, self.n_atoms)
        self._V[self._rv: self._rv + kn] = Vnew
        self._rv += kn
        self._r = r + kn
        self._fresh = False
        return True

    def start_on_atoms(self, Gs: sp.csr_matrix, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64],
                       y: NDArray[np.float64], g: NDArray[np.float64]) -> None:
        """The history becomes the rows ``H`` (scaled: ``Gs``), which span every atom and
        whose information form could not be built (rounding): the basis is the atoms
        themselves, ``V = diag(1/√d)``, so ``C = G √D`` and ``M = (CᵀC)⁻¹ = S Sᵀ`` with
        ``S = L⁻ᵀ``, ``CᵀC = L Lᵀ``."""
        self._memo = {}
        n, k = self.n_atoms, H.shape[0]
        sq = np.sqrt(self._d)
        C = (Gs @ sp.diags(sq)).tocsr()
        L = np.linalg.cholesky((C.T @ C).toarray())
        self._own()
        self._blocks, self._V, self._rv = [], np.diag(1.0 / sq), n
        self._C, self._S = Rows(), Root(solve_triangular(L, np.eye(n), lower=True).T)
        self._C.add(C.toarray())
        self._y, self._b, self._g = y.astype(float).copy(), b.astype(float).copy(), g.astype(float).copy()
        self._n = np.zeros(k)
        if self._H is not None:
            self._H = np.array(H, dtype=float) if isinstance(H, np.ndarray) else H.toarray()
        self._m, self._r, self._fresh = k, n, True

    def _split_atoms(self, p: NDArray[np.intp], d: NDArray[np.float64]) -> None:
        self._blocks = merged([B.split(p) for B in self._vblocks()])
        self._V, self._rv = np.zeros((8, p.size)), 0

    # ------------------------------------------------------------------ many queries at once
    def _screen(self, Qm: NDArray[np.float64], rows: Sequence[int | None] | None) -> tuple[NDArray[np.bool_], Known]:
        """Remember the coordinates of repeated rows (a stored row's own: ``b_i C_i``, residual
        zero) and find, among many rows, those certainly not estimable: V being
        D-orthonormal, a row's squared residual is ``‖q‖² − ‖c‖²``, and one over ``‖q‖/√2``
        (with a margin far above rounding) takes no second Gram–Schmidt pass in
        :meth:`estimate` and is far above its estimability threshold.  The repeated rows'
        coordinates are also returned (a GROUP BY of more groups than the memo holds evicts them)."""
        known: Known = {}
        if rows is not None:
            for k, (Q, i) in enumerate(zip(Qm, rows, strict=True)):
                if i is None:
                    continue
                if not 0 <= i < self._m:
                    raise InvalidArgument(f"row {i} is not one of the {self._m} stored rows.")
                key = ("project", Q.tobytes())
                found = self._memo.get(key)
                if found is None:  # what project finds, without reading the basis
                    found = self._remember(key, (readonly(float(self._b[i]) * self._C.row(i, self._r)),
                                                 readonly(np.zeros(Q.size))))
                known[k] = found
        sure = np.zeros(Qm.shape[0], dtype=bool)
        rest = [k for k in range(Qm.shape[0]) if k not in known]  # a known row's residual is zero
        if self._r < self.n_atoms and len(rest) >= _BATCH_ROWS:
            Qr = Qm[rest]
            X, i, j, v = sparse_rows(Qr, self._d)  # the rows of Q D
            vn2 = np.bincount(i, weights=v * v * self._d[j], minlength=Qr.shape[0])  # ‖q‖²_D
            cn2 = np.square(sparse_coefficients(self._vblocks(), X, self._r)).sum(axis=0)
            sure[rest] = vn2 - cn2 > 0.5 * vn2 * (1 + 1e-6)
        return sure, known

    def _together(self, Qm: NDArray[np.float64], todo: list[int], keys: list[tuple[object, ...]],
                  known: Known) -> dict[int, Estimate]:
        found: dict[int, Estimate] = {}
        if 0 < self._r and len(todo) >= _BATCH_ROWS:
            for k, est in zip(todo, self._estimates_together(Qm[todo], [known.get(k) for k in todo]), strict=True):
                if est is not None:
                    found[k] = self._remember(keys[k], est)
        return found

    def _estimates_together(
        self, Qm: NDArray[np.float64], given: list[tuple[NDArray[np.float64], NDArray[np.float64]] | None],
    ) -> list[Estimate | None]:
        """:meth:`estimate` (exact law) of the rows of Qm with their projections and solves as
        matrix products — each basis block and C read once for all rows, not once per row
        (and the basis not at all for rows whose coordinates are remembered or known):
        the same numbers up to rounding.  A row whose projection would take a second
        Gram–Schmidt pass or whose solve would need refinement gets None (left to
        :meth:`estimate`), so every row given here passed :meth:`_project_now` and
        :meth:`_solve_now` after their first pass; a row that is not estimable gets None too."""
        d, m, r = self._d, self._m, self._r
        # Coordinates already found (or known: a repeat's own row) are reused; the rest projected.
        known = [self._memo.get(("project", Q.tobytes())) if found is None else found
                 for Q, found in zip(Qm, given, strict=True)]
        new = [k for k, found in enumerate(known) if found is None]
        cQ, rn = np.zeros((Qm.shape[0], r)), np.zeros(Qm.shape[0])
        if new:
            cQ[new], res = project_blocks(self._vblocks(), d, Qm[new])  # k × r, k × n
            if r < d.size:
                rn[new] = self.dnorms(res)
        for k, found in enumerate(known):
            if found is not None:
                cQ[k], rn[k] = found[0], self.dnorm(found[1])
        qn = self.dnorms(Qm)
        ok = ~second_pass(rn, qn) & (rn <= ESTIMABLE_RTOL * qn) & (qn > 0)
        out: list[Estimate | None] = [None] * Qm.shape[0]
        rows = np.flatnonzero(ok)
        if not rows.size:
            return out
        rhs = cQ[rows].T  # r × k'
        S = self._S
        z = S.gram_times(rhs)
        Cz, gram = self._C.times_and_gram(z, r)
        scale = np.abs(rhs).max(axis=0)
        solved = np.abs(rhs - gram).max(axis=0) <= _SOLVE_RTOL * scale
        g, y = readonly(self._g[:m]), self._y[:m]
        b, n = self.law_scales(m)
        for col in np.flatnonzero(solved).tolist():
            A = Cz[:, col] / self._b[:m]
            value = float(A @ y)
            law = ErrorLaw(A, b, g, "exact", gaussian=n)
            out[int(rows[col])] = Estimate(value, readonly(A), law.variance, True, Posterior(value, law), b, g, n)
        return out

    def _residuals(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The rows of X minus their D-orthogonal projections on the basis (one Gram–Schmidt pass)."""
        res = X.copy()
        d = self._d
        for B in self._vblocks():
            res -= B.spread(B.left(B.times(B.gather(X * d).T).T))
        return res

    def restrictions_possible(self, Q: NDArray[np.float64], left_out: list[NDArray[np.intp]]) -> list[bool]:
        """See :meth:`IncrementalBLUE.restrictions_possible` (the derivation is there)."""
        if self._r == 0:
            return [True] * len(left_out)
        _, res = self.project(Q)
        d = self._d
        H = float(np.dot(d * Q, Q))
        R = float(np.dot(d * res, res))
        blocks = self._vblocks()
        out = []
        for idx in left_out:
            dv = d[idx] * Q[idx]
            c = np.concatenate([np.asarray(B.rows[:, idx if B.cols is None else B.cols[idx]] @ dv).ravel()
                                for B in blocks])
            a = float(dv @ Q[idx]) - float(c @ c)  # ‖res(h_out)‖²
            p = float(dv @ res[idx])  # ⟨res(Q), h_out⟩
            K = R - 2.0 * p + a  # ‖res(h_keep)‖²
            out.append(not (K > _MARGIN * H and R - (R - p) ** 2 / K > _MARGIN * H))
        return out

    def screen_estimable_with(self, Qm: NDArray[np.float64], Hm: NDArray[np.float64]) -> tuple[list[bool], list[int]]:
        """The projections of all rows at once (one matrix product per basis block); a row
        whose Gram–Schmidt would take a second pass, or whose residual lies within a factor
        100 of a threshold, is left to be decided one by one."""
        d = self._d
        dnorms = self.dnorms
        RQ, RH = self._residuals(Qm), self._residuals(Hm)
        qn, hn, rq, rh = dnorms(Qm), dnorms(Hm), dnorms(RQ), dnorms(RH)
        extends = (hn > 0) & (rh > EXTEND_RTOL * hn)
        E = RH / np.where(extends, rh, 1.0)[:, None]
        ce = np.where(extends, np.einsum("ij,ij->i", Qm * d, E), 0.0)
        rn = dnorms(RQ - ce[:, None] * E)

        def near(x: NDArray[np.float64], limit: NDArray[np.float64]) -> NDArray[np.bool_]:
            return (x >= limit / 100) & (x <= limit * 100)

        unsure = (second_pass(rq, qn) | second_pass(rh, hn) | near(rn, ESTIMABLE_RTOL * qn)
                  | near(rh, EXTEND_RTOL * hn))  # fmt: skip
        return (rn <= ESTIMABLE_RTOL * qn).tolist(), np.flatnonzero(unsure).tolist()
