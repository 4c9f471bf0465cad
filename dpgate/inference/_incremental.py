"""Incremental BLUE over atoms (the search for the smallest budget is in ``_scale``).

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
Solves with M are polished by iterative refinement against C (see ``_solve``).

A query Q (over atoms) is estimable iff ``‖Q − c_Q V‖_D ≤ 1e-9 ‖Q‖_D`` with
``c_Q = ⟨Q, V⟩_D``; then ``u = C M c_Qᵀ`` is the minimum-norm solution of
``Gᵀu = Qᵀ``, ``A_k = u_k/b_k`` and ``Var = 2‖u‖² = 2 c_Q M c_Qᵀ``.

Storage.  Nothing a copy may share is ever written: V is kept as row blocks that are
never written after they are filled (``_blocks``), C as frozen row blocks and S as
``diag(S₀, I)(I + XZᵀ)`` (``_factors``), so :meth:`IncrementalBLUE.copy` costs O(r p),
not O(m r + r² + r n); y, b, γ are copied on the first write after a copy.  A block of
releases enters at once (``_blocks``: disjoint groups, new directions, or any mix).
The history rows H are kept only when asked for (``keep_rows``): the gateway rebuilds
them from its queries when a view needs them.  Recent projections, solves and
estimates are remembered until the state changes.

Once an empty history receives rows spanning every atom (the hierarchical tree), the
state is kept in information form instead (``_information``: sparse rows, a dense
inverse of the information matrix, Woodbury terms): a solve is then O(n² + nnz),
not O(m r).

Splitting atoms (new atom i is a piece of old atom ``parent[i]``): ``V ← V[:, parent]``
(recorded, not copied: ``_blocks.Block``) and ``d ← new sizes``.  V stays orthonormal because the sizes of the pieces of
an atom add up to the atom's size:
``Σ_i d'_i V_{a,p(i)} V_{b,p(i)} = Σ_j (Σ_{i∈p⁻¹(j)} d'_i) V_{aj} V_{bj} = Σ_j d_j V_{aj} V_{bj}``.
``G ← G[:, parent] = C V[:, parent]``, so C and M do not change.  (The split is
refused if the sizes do not add up.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from scipy.linalg import solve_triangular

from dpgate._validate import finite, finite_array, nonnegative_finite, positive_finite, readonly
from dpgate.errors import InvalidArgument
from dpgate.inference._blocks import (
    EXTEND_RTOL,
    Block,
    combined_classes,
    covers_every_atom,
    disjoint,
    disjoint_block,
    general_block,
    merged,
    mixed_block,
    project_blocks,
    second_pass,
    sparse_coefficients,
    sparse_rows,
    threads_for_blocks,
)
from dpgate.inference._blue import ESTIMABLE_RTOL, Estimate
from dpgate.inference._factors import Root, Rows
from dpgate.inference._information import Information
from dpgate.inference._law import ErrorLaw, Method
from dpgate.inference._posterior import Posterior
from dpgate.inference._pricer import Pricer

__all__ = ["EXTEND_RTOL", "IncrementalBLUE"]

#: Remembered projections, solves and estimates per state: at least this many, and as many
#: as fit in :data:`_MEMO_FLOATS` numbers of their size (a repeated GROUP BY asks one
#: estimate per group: a small history remembers them all).
_MEMO = 16
_MEMO_FLOATS = 1 << 21
#: A solve is refined until its normal-equations residual (the estimator's bias coefficient)
#: is at most this fraction of the right-hand side's largest entry: far below any interval
#: width, and usually met without a refinement step (each costs two products with C, O(m r)).
_SOLVE_RTOL = 1e-12
#: :meth:`IncrementalBLUE.restrictions_possible` rules a set out only by this margin (× ‖Q‖²).
_MARGIN = 1e-4
#: :meth:`IncrementalBLUE.extend` adds larger blocks in chunks of this many rows.
_CHUNK = 256



_T = TypeVar("_T")


def _frozen_pair(pair: tuple[NDArray[np.float64], NDArray[np.float64]]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    return readonly(pair[0]), readonly(pair[1])


def _grow(buf: NDArray[np.float64], rows: int, cols: int) -> NDArray[np.float64]:
    """Return ``buf`` or a copy with at least (rows, cols) capacity (doubling)."""
    r0, c0 = buf.shape
    if rows <= r0 and cols <= c0:
        return buf
    new = np.zeros((max(rows, 2 * r0 if rows > r0 else r0), max(cols, 2 * c0 if cols > c0 else c0)))
    new[:r0, :c0] = buf
    return new


#: From this many rows on, :meth:`IncrementalBLUE.estimate_many` finds the rows history cannot
#: estimate together (below, one projection each is as fast).
_BATCH_ROWS = 16


#: Largest basis (rows × columns, summed over blocks) :meth:`IncrementalBLUE.twin_classes` compares.
TWIN_CELLS = 1 << 21


class IncrementalBLUE:
    """Incrementally updated BLUE over a partition of the domain into atoms.

    Args:
        cell_sizes: Number of domain cells in each atom (positive).
        keep_rows: Keep the history rows H (:attr:`rows`); without them, appends and
            splits do not pay O(m n) for them.

    Raises:
        InvalidArgument: If a size is not positive and finite.

    Example:
        >>> st = IncrementalBLUE(np.array([1.0, 1.0]))
        >>> st.append(np.array([1.0, 1.0]), scale=1.0, value=30.0)
        >>> st.append(np.array([1.0, 0.0]), scale=1.0, value=10.0)
        >>> round(st.estimate(np.array([0.0, 1.0])).value, 9)
        20.0
    """

    def __init__(self, cell_sizes: ArrayLike, *, keep_rows: bool = True) -> None:
        d = finite_array(cell_sizes, "cell_sizes", ndim=1)
        if d.size == 0 or (d <= 0).any():
            raise InvalidArgument("cell_sizes must be a non-empty 1-D array of positive sizes.")
        n = d.size
        self._d = d.copy()
        self._m = 0
        self._r = 0
        # V = the rows of the frozen blocks, then the first _rv rows of _V (the own buffer).
        self._blocks: list[Block] = []
        self._V = np.zeros((8, n))
        self._rv = 0
        self._C = Rows()
        self._S = Root()  # M = S Sᵀ
        self._fresh = False  # S was just rebuilt from C
        self._H: NDArray[np.float64] | None = np.zeros((16, n)) if keep_rows else None
        self._y = np.zeros(16)
        self._b = np.zeros(16)
        self._g = np.zeros(16)
        self._owned = True  # H, y, b, γ are not shared with a copy
        # Once the history spans every atom (``_span``): the information form replaces V, C, S.
        self._info: Information | None = None
        # Recent projections, solves and estimates on this exact state (a decision asks for
        # the same ones several times); replaced, never cleared, on every change, so a copy may
        # share it until either side changes.
        self._memo: dict[tuple[object, ...], Any] = {}

    # ------------------------------------------------------------------ properties
    @property
    def n_atoms(self) -> int:
        """Number of atoms n."""
        return int(self._d.size)

    @property
    def n_rows(self) -> int:
        """Number of history rows m."""
        return self._m

    @property
    def rank(self) -> int:
        """Dimension r of the row space of the history."""
        return self._r

    @property
    def cell_sizes(self) -> NDArray[np.float64]:
        """Cells per atom (read-only copy)."""
        return readonly(self._d)

    @property
    def rows(self) -> NDArray[np.float64]:
        """The history H over the current atoms, m × n (read-only copy).

        Raises:
            InvalidArgument: the rows were not kept (``keep_rows=False``).
        """
        if self._H is None:
            raise InvalidArgument("this BLUE was built with keep_rows=False: it does not keep its rows.")
        return readonly(self._H[: self._m])

    def twin_classes(self) -> NDArray[np.intp] | None:
        """For each atom, a class id: atoms of one class ("twins") have equal columns in the
        basis, so every vector of the history's row space — every estimable query — takes
        one value on them.  ``None`` in the information form, or when the basis holds more
        than :data:`TWIN_CELLS` numbers (comparing its columns would cost more than it saves).
        Each frozen block's classes are found once (blocks are never written)."""
        if self._info is not None:
            return None
        blocks = self._vblocks()
        if sum(B.rows.size for B in blocks) > TWIN_CELLS:
            return None
        if not blocks:
            return np.zeros(self.n_atoms, dtype=np.intp)
        return combined_classes([B.classes() for B in blocks])

    def basis(self) -> NDArray[np.float64]:
        """The D-orthonormal basis V of the row space, r × n (a new array)."""
        if self._info is not None:  # from the rows: an orthonormal basis of the rows of G √D, over √D
            sq = np.sqrt(self._d)
            _, s, vt = np.linalg.svd(self._info.rows().toarray() * sq, full_matrices=False)
            return np.asarray(vt[: self._r] / sq)
        return np.concatenate([B.dense() for B in self._vblocks()]) if self._r else np.zeros((0, self.n_atoms))

    @property
    def values(self) -> NDArray[np.float64]:
        """Released answers y (read-only copy)."""
        return readonly(self._y[: self._m])

    @property
    def scales(self) -> NDArray[np.float64]:
        """Laplace scales b (read-only copy)."""
        return readonly(self._b[: self._m])

    @property
    def lattice(self) -> NDArray[np.float64]:
        """Lattice steps γ (read-only copy; 0 = continuous)."""
        return readonly(self._g[: self._m])

    def copy(self) -> IncrementalBLUE:
        """An independent copy (appends and splits of either never show in the other).

        The basis V is shared, not copied: its filled rows are never written again
        (appends write rows beyond them, splits build new arrays), so they become a
        frozen block of the copy.  The small arrays are shared until either side writes.
        Like appends, it rearranges this state (its blocks), so copies of one state are taken
        under its owner's lock (the gateway's).
        """
        # Both sides keep the merged frozen blocks: merging (O(r n) when it concatenates) is
        # paid once, not on every copy of a state that is copied per decision.
        blocks = merged(self._vblocks())
        if self._info is None:
            self._blocks, self._V, self._rv = blocks, np.zeros((8, self.n_atoms)), 0
        new = object.__new__(IncrementalBLUE)
        new.__dict__.update(self.__dict__)
        new._blocks = list(blocks)
        new._V = np.zeros((8, self.n_atoms))
        new._rv = 0
        new._C, new._S = self._C.copy(), self._S.copy()
        if self._info is not None:
            new._info = self._info.copy()
        self._owned = new._owned = False
        return new

    def __getstate__(self) -> dict[str, object]:
        """Pickled without spare capacity, remembered results or shared-buffer flags."""
        state = dict(self.__dict__)
        m = self._m
        state.update(_V=self._V[: self._rv].copy(), _y=self._y[:m].copy(), _b=self._b[:m].copy(),
                     _g=self._g[:m].copy(), _memo={}, _owned=True)
        if self._H is not None:
            state["_H"] = self._H[:m].copy()
        return state

    def __copy__(self) -> IncrementalBLUE:
        """``copy.copy`` gives :meth:`copy` (a shallow copy would share C, S and the
        information form, which later changes update in place)."""
        return self.copy()

    def _own(self) -> None:
        """Copy the small arrays this state shares with a copy before writing to them."""
        if not self._owned:
            for name in ("_y", "_b", "_g", "_H"):
                v = getattr(self, name)
                if v is not None:
                    setattr(self, name, v.copy())
            self._owned = True

    def _vblocks(self) -> list[Block]:
        return [*self._blocks, Block(self._V[: self._rv])] if self._rv else list(self._blocks)

    # ------------------------------------------------------------------ helpers
    def _atom_vector(self, v: ArrayLike, name: str) -> NDArray[np.float64]:
        return finite_array(v, name, ndim=1, size=self.n_atoms)

    def _remembered(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, remembered by ``key`` until this state changes (oldest forgotten first)."""
        found = self._memo.get(key)
        if found is None:
            found = self._remember(key, compute())
        return cast(_T, found)

    def _remember(self, key: tuple[object, ...], value: _T) -> _T:
        """Remember ``value`` by ``key`` until this state changes (oldest forgotten first)."""
        if len(self._memo) >= max(_MEMO, _MEMO_FLOATS // (self._m + self.n_atoms + 1)):
            del self._memo[next(iter(self._memo))]
        self._memo[key] = value
        return value

    def _project(self, v: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """:meth:`_project_now`, remembered (read-only results)."""
        return self._remembered(("project", v.tobytes()), lambda: _frozen_pair(self._project_now(v)))

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
                return np.concatenate([B.rows @ B.gather(dv) for B in blocks]), np.zeros(v.shape)
        if len(blocks) == 1 and blocks[0].cols is None:
            V = blocks[0].rows
            c = V @ (d * v)
            res = v - c @ V
        else:
            c, res = project_blocks(blocks, d, v)
        rn, vn = self._dnorm(res), self._dnorm(v)
        if EXTEND_RTOL * vn < rn < vn / math.sqrt(2.0):
            c2, res = project_blocks(blocks, d, res)
            c = c + c2
        return c, res

    def _dnorm(self, v: NDArray[np.float64]) -> float:
        return math.sqrt(float(np.dot(self._d * v, v)))

    def _solve(self, rhs: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(CᵀC)⁻¹ rhs`` (:meth:`_solve_now`, remembered; a read-only result)."""
        return self._solve_pair(rhs)[0]

    def _weights(self, rhs: NDArray[np.float64]) -> NDArray[np.float64]:
        """``C (CᵀC)⁻¹ rhs``: the refinement's last product with C, not a new one."""
        return self._solve_pair(rhs)[1]

    def _solve_pair(self, rhs: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self._remembered(("solve", rhs.tobytes()), lambda: _frozen_pair(self._solve_now(rhs)))

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
    def append(self, h: ArrayLike, scale: float, value: float, lattice: float = 0.0) -> None:
        """Add one released answer ``value = h·x + N`` with Laplace scale ``scale``.

        Args:
            h: Query vector over the current atoms.
            scale: Laplace scale ``b = S/α > 0`` of its noise.
            value: The released noisy answer.
            lattice: Lattice step γ of discrete noise (0 = continuous).

        Raises:
            InvalidArgument: On a wrong shape or non-finite / non-positive numbers.
        """
        hv = self._atom_vector(h, "h")
        scale = positive_finite(scale, "scale")
        value = finite(value, "value")
        lattice = nonnegative_finite(lattice, "lattice")
        m, r = self._m, self._r
        self._own()
        self._memo = {}
        if self._H is not None:
            self._H = _grow(self._H, m + 1, self.n_atoms)
            self._H[m] = hv
        if m + 1 > self._y.size:
            for name in ("_y", "_b", "_g"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate((old, np.zeros(max(old.size, 16)))))
        self._y[m], self._b[m], self._g[m] = value, scale, lattice
        self._m = m + 1
        g = hv / scale
        if self._info is not None:
            self._r += self._info.append(g)
            return
        gn = self._dnorm(g)
        if gn == 0.0:  # a zero row carries no information
            self._C.add(np.zeros((1, r)))
            return
        c, rho = self._project_now(g)
        rn = self._dnorm(rho)
        S = self._S
        cS = S.t_times(c)  # φ = Sᵀcᵀ
        self._fresh = False
        if rn > EXTEND_RTOL * gn:
            self._V = _grow(self._V, self._rv + 1, self.n_atoms)
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
        self._memo = {("project", hv.tobytes()): (readonly(scale * c), readonly(scale * rho))}

    def extend(self, rows: ArrayLike | sp.csr_matrix, scales: ArrayLike, values: ArrayLike,
               lattice: ArrayLike | None = None) -> None:
        """Append many released answers at once: the same state as :meth:`append` row by row.

        ``rows`` may be a scipy sparse matrix (a tree's thousands of nodes over thousands
        of atoms, few non-zeros each): it stays sparse into the information form.

        When every row adds a direction (a fresh GROUP BY's groups), the block is added
        with matrix products (block Gram–Schmidt, twice, then an LQ factorisation of the
        residuals): with ``P`` the rows' coefficients on V and ``L`` (lower triangular)
        on the new directions, C gains the rows ``[Pᵀ, L]`` and the square root of M
        becomes ``[[S, 0], [−L⁻¹PᵀS, L⁻¹]]`` (the one-row formula of :meth:`append`
        with ρ → L).  Otherwise — or when a row is zero or adds a direction only barely
        — the rows are appended one by one.

        Raises:
            InvalidArgument: On a wrong shape or non-finite / non-positive numbers.
        """
        H: NDArray[np.float64] | sp.csr_matrix
        if sp.issparse(rows):
            H = sp.csr_matrix(rows, dtype=np.float64)
            finite_array(H.data, "rows")
        else:
            H = finite_array(rows, "rows", ndim=2)
        k = H.shape[0]
        b = finite_array(scales, "scales", ndim=1, size=k)
        y = finite_array(values, "values", ndim=1, size=k)
        g = np.zeros(k) if lattice is None else finite_array(lattice, "lattice", ndim=1, size=k)
        if H.shape[1] != self.n_atoms:
            raise InvalidArgument(f"rows must have {self.n_atoms} columns (one per atom), got {H.shape[1]}.")
        if (b <= 0).any() or (g < 0).any():
            raise InvalidArgument("scales must be positive and lattice steps non-negative.")
        if k > _CHUNK:
            if self._r == 0 and self._span(H, b, y, g):
                return
            # In chunks: Gram–Schmidt inside a block is O(k² n); against the basis it is one
            # matrix product per chunk.
            for i in range(0, k, _CHUNK):
                self.extend(H[i: i + _CHUNK], b[i: i + _CHUNK], y[i: i + _CHUNK], g[i: i + _CHUNK])
            return
        if not isinstance(H, np.ndarray):
            H = H.toarray()
        if k < 2 or not self._extend_block(H, b, y, g):
            for i in range(k):
                self.append(H[i], float(b[i]), float(y[i]), lattice=float(g[i]))

    def _extend_block(self, H: NDArray[np.float64], b: NDArray[np.float64], y: NDArray[np.float64],
                      g: NDArray[np.float64]) -> bool:
        """The block path of :meth:`extend`; False (nothing changed) when it does not apply."""
        self._memo = {}
        if self._r == 0 and self._span(H, b, y, g):
            return True
        G = H / b[:, None]
        if self._info is not None:
            self._store(H, b, y, g)
            self._r += self._info.extend(G)
            return True
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
        self._store(H, b, y, g)
        self._C.add(np.concatenate([P.T, L], axis=1))
        self._V = _grow(self._V, self._rv + k, self.n_atoms)
        self._V[self._rv: self._rv + k] = Vnew
        self._rv += k
        S = self._S
        PS = S.t_times(P).T  # Pᵀ S
        S.border(-Linv @ PS, Linv)
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
        self._store(H, b, y, g)
        self._S.append_rows(P, L, adds)
        kn = L.shape[1]
        self._C.add(np.concatenate([P.T, L], axis=1))
        self._V = _grow(self._V, self._rv + kn, self.n_atoms)
        self._V[self._rv: self._rv + kn] = Vnew
        self._rv += kn
        self._r = r + kn
        self._fresh = False
        return True

    def _store(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64], y: NDArray[np.float64],
               g: NDArray[np.float64]) -> None:
        """Keep a block's rows (when asked), values, scales and lattice steps; m grows by its size."""
        m, k = self._m, H.shape[0]
        self._own()
        if self._H is not None:
            self._H = _grow(self._H, m + k, self.n_atoms)
            self._H[m: m + k] = H if isinstance(H, np.ndarray) else H.toarray()
        while m + k > self._y.size:
            for name in ("_y", "_b", "_g"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate((old, np.zeros(max(old.size, 16)))))
        self._y[m: m + k], self._b[m: m + k], self._g[m: m + k] = y, b, g
        self._m = m + k

    def _span(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64], y: NDArray[np.float64],
              g: NDArray[np.float64]) -> bool:
        """An empty history receives non-zero rows that span every atom (e.g. a hierarchical
        tree with its leaves): the information form (``_information``) from the sparse rows
        and the inverse of ``GᵀG`` (bottom-up for a hierarchy, else by Cholesky) — instead
        of k rank-one updates.  If that
        fails (rounding): the basis is the atoms themselves, ``V = diag(1/√d)``, so
        ``C = G √D`` and ``M = (CᵀC)⁻¹ = S Sᵀ`` with ``S = L⁻ᵀ``, ``CᵀC = L Lᵀ``.  False
        (nothing changed) when the rows do not span every atom that way.
        """
        if H.shape[0] < self.n_atoms:  # every atom needs a row of its own
            return False
        Gs = (sp.diags(1.0 / b) @ sp.csr_matrix(H)).tocsr()
        per_row = np.diff(Gs.indptr)
        if not (per_row > 0).all() or not covers_every_atom(Gs):
            return False
        n, k = self.n_atoms, H.shape[0]
        self._memo = {}
        info = Information.build(Gs, self._d)
        if info is not None:
            self._store(H, b, y, g)
            self._info, self._r = info, n
            self._blocks, self._V, self._rv = [], np.zeros((0, n)), 0
            self._C, self._S = Rows(), Root()
            return True
        sq = np.sqrt(self._d)
        C = (Gs @ sp.diags(sq)).tocsr()
        L = np.linalg.cholesky((C.T @ C).toarray())
        self._own()
        self._blocks, self._V, self._rv = [], np.diag(1.0 / sq), n
        self._C, self._S = Rows(), Root(solve_triangular(L, np.eye(n), lower=True).T)
        self._C.add(C.toarray())
        self._y, self._b, self._g = y.astype(float).copy(), b.astype(float).copy(), g.astype(float).copy()
        if self._H is not None:
            self._H = np.array(H, dtype=float) if isinstance(H, np.ndarray) else H.toarray()
        self._m, self._r, self._fresh = k, n, True
        return True

    def split(self, parent: ArrayLike, cell_sizes: ArrayLike) -> None:
        """Refine the partition: new atom i is a piece of old atom ``parent[i]``.

        Args:
            parent: Index of the old atom of every new atom (length = new n).
            cell_sizes: Cells in every new atom; the pieces of each old atom
                must add up to its size.

        Raises:
            InvalidArgument: If parent is out of range, leaves an old atom without a
                piece, or the sizes do not add up.
        """
        p = np.asarray(parent)
        d = np.asarray(cell_sizes, dtype=np.float64)
        if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer) or d.shape != p.shape:
            raise InvalidArgument("parent must be a 1-D integer array, cell_sizes of the same length.")
        if p.size and (p.min() < 0 or p.max() >= self.n_atoms):
            raise InvalidArgument(f"parent entries must lie in [0, {self.n_atoms}).")
        if not np.isfinite(d).all() or (d <= 0).any():
            raise InvalidArgument("New cell sizes must be positive and finite.")
        total = np.bincount(p, weights=d, minlength=self.n_atoms)
        if not np.allclose(total, self._d, rtol=1e-12, atol=0.0):
            raise InvalidArgument("The pieces of every old atom must add up to its size (and cover it).")
        self._memo = {}
        if self._info is not None:
            self._info.split(p.astype(np.intp), d)
            self._split_rows(p, d)
            return
        self._blocks = merged([B.split(p) for B in self._vblocks()])
        self._V, self._rv = np.zeros((8, p.size)), 0
        self._split_rows(p, d)

    def _split_rows(self, p: NDArray[np.integer[Any]], d: NDArray[np.float64]) -> None:
        if self._H is not None:
            self._own()
            self._H = np.ascontiguousarray(self._H[:, p])
        self._d = d.copy()

    # ------------------------------------------------------------------ queries
    def _coordinates(self, Q: NDArray[np.float64]) -> tuple[NDArray[np.float64], bool]:
        """``(c_Q, estimable)``; in the information form ``c_Q`` is ``w = (F + ÑÑᵀ)⁻¹ Q``."""
        if self._info is not None:
            w = self._info_solve(Q)
            return w, self._dnorm(self._info.outside(w)) <= ESTIMABLE_RTOL * self._dnorm(Q)
        cQ, res = self._project(Q)
        return cQ, self._dnorm(res) <= ESTIMABLE_RTOL * self._dnorm(Q)

    def _info_solve(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Information.solve``, remembered (a read-only result)."""
        info = self._info
        assert info is not None
        return self._remembered(("info", v.tobytes()), lambda: readonly(info.solve(v)))

    def estimate(self, Q: ArrayLike, method: Method = "exact", **law_options: Any) -> Estimate:
        """BLUE of ``Q·x`` from the stored history (same result as :func:`estimate`).

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        Qv = self._atom_vector(Q, "Q")
        key = ("estimate", Qv.tobytes(), method, repr(sorted(law_options.items())))
        return self._remembered(key, lambda: self._estimate_now(Qv, method, law_options))

    def _estimate_now(self, Qv: NDArray[np.float64], method: Method, law_options: dict[str, Any]) -> Estimate:
        m = self._m
        b, g = readonly(self._b[:m]), readonly(self._g[:m])
        cQ, ok = self._coordinates(Qv)
        if not ok:
            return Estimate(math.nan, readonly(np.full(m, np.nan)), math.nan, False, None, b, g)
        u = self._info.weights(cQ) if self._info is not None else self._weights(cQ)
        A = u / self._b[:m]
        value = float(A @ self._y[:m])
        law = ErrorLaw(A, b, g, method, **law_options)
        return Estimate(value, readonly(A), law.variance, True, Posterior(value, law), b, g)

    def estimate_many(self, Qs: ArrayLike, rows: Sequence[int | None] | None = None) -> list[Estimate]:
        """:meth:`estimate` (exact law) of each row of ``Qs`` (k × atoms): a GROUP BY's groups.

        ``rows[k]``, when given and not None, is a stored row equal to ``Qs[k]`` (a repeat of
        a release): its coordinates on the basis are that row's own (``b_i C_i``, residual
        zero), so it takes no projection — the basis is the largest array a decision reads.

        The rows' coefficients on the basis are found together, as sparse rows (groups
        touch few atoms), one product per basis block; V being D-orthonormal, a row's
        squared residual is ``‖q‖² − ‖c‖²``.  A row whose residual is over ``‖q‖/√2`` (with
        a margin far above rounding) takes no second Gram–Schmidt pass in :meth:`estimate`
        and is far above its estimability threshold: it is not estimable by
        :meth:`estimate`'s own test and gets that answer without a projection of its own.
        Every other row (all of them, when there are fewer than :data:`_BATCH_ROWS`) is :meth:`estimate` itself.

        Raises:
            InvalidArgument: On a wrong shape or non-finite rows.
        """
        Qm = finite_array(Qs, "Qs", ndim=2)
        if Qm.shape[1] != self.n_atoms:
            raise InvalidArgument(f"Qs must be k × {self.n_atoms}; got {Qm.shape}.")
        if rows is not None and self._info is None:
            for Q, i in zip(Qm, rows, strict=True):
                if i is None:
                    continue
                if not 0 <= i < self._m:
                    raise InvalidArgument(f"row {i} is not one of the {self._m} stored rows.")
                key = ("project", Q.tobytes())
                if key not in self._memo:  # what _project finds, without reading the basis
                    self._remember(key, (readonly(float(self._b[i]) * self._C.row(i, self._r)),
                                         readonly(np.zeros(Q.size))))
        sure = np.zeros(Qm.shape[0], dtype=bool)
        if self._info is None and self._r < self.n_atoms and Qm.shape[0] >= _BATCH_ROWS:
            X, i, j, v = sparse_rows(Qm, self._d)  # the rows of Q D
            vn2 = np.bincount(i, weights=v * v * self._d[j], minlength=Qm.shape[0])  # ‖q‖²_D
            cn2 = np.square(sparse_coefficients(self._vblocks(), X, self._r)).sum(axis=0)
            sure = vn2 - cn2 > 0.5 * vn2 * (1 + 1e-6)
        m = self._m
        nan = readonly(np.full(m, np.nan))
        none = Estimate(math.nan, nan, math.nan, False, None, readonly(self._b[:m]), readonly(self._g[:m]))
        keys = [("estimate", Q.tobytes(), "exact", "[]") for Q in Qm]
        todo = [k for k, (key, no) in enumerate(zip(keys, sure.tolist(), strict=True))
                if not no and key not in self._memo]
        if self._info is None and 0 < self._r and len(todo) >= _BATCH_ROWS:
            for k, est in zip(todo, self._estimates_together(Qm[todo]), strict=True):
                if est is not None:
                    self._remember(keys[k], est)
        return [self._remembered(key, lambda: none) if no else self.estimate(Q)
                for Q, key, no in zip(Qm, keys, sure.tolist(), strict=True)]

    def _estimates_together(self, Qm: NDArray[np.float64]) -> list[Estimate | None]:
        """:meth:`estimate` (exact law) of the rows of Qm with their projections and solves as
        matrix products — each basis block and C read once for all rows, not once per row
        (and the basis not at all for rows whose coordinates are remembered or known):
        the same numbers up to rounding.  A row whose projection would take a second
        Gram–Schmidt pass or whose solve would need refinement gets None (left to
        :meth:`estimate`), so every row given here passed :meth:`_project_now` and
        :meth:`_solve_now` after their first pass; a row that is not estimable gets None too."""
        d, m, r = self._d, self._m, self._r
        # Coordinates already found (or known: a repeat's own row) are reused; the rest projected.
        known = [self._memo.get(("project", Q.tobytes())) for Q in Qm]
        new = [k for k, found in enumerate(known) if found is None]
        cQ, rn = np.zeros((Qm.shape[0], r)), np.zeros(Qm.shape[0])
        if new:
            cQ[new], res = project_blocks(self._vblocks(), d, Qm[new])  # k × r, k × n
            if r < d.size:
                rn[new] = self._dnorms(res)
        for k, found in enumerate(known):
            if found is not None:
                cQ[k], rn[k] = found[0], self._dnorm(found[1])
        qn = self._dnorms(Qm)
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
        b, g, y = readonly(self._b[:m]), readonly(self._g[:m]), self._y[:m]
        for col in np.flatnonzero(solved).tolist():
            A = Cz[:, col] / self._b[:m]
            value = float(A @ y)
            law = ErrorLaw(A, b, g, "exact")
            out[int(rows[col])] = Estimate(value, readonly(A), law.variance, True, Posterior(value, law), b, g)
        return out

    def _residuals(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The rows of X minus their D-orthogonal projections on the basis (one Gram–Schmidt pass)."""
        res = X.copy()
        d = self._d
        for B in self._vblocks():
            res -= B.spread((B.gather(X * d) @ B.rows.T) @ B.rows)
        return res

    def _dnorms(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The D-norm of each row of X."""
        return np.sqrt(np.einsum("ij,ij->i", X * self._d, X))

    def estimable(self, Q: ArrayLike) -> bool:
        """Whether Q is estimable from the history: :attr:`Estimate.estimable` of
        :meth:`estimate`, by the same test, without the weights (one projection).

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        return self._coordinates(self._atom_vector(Q, "Q"))[1]

    def restrictions_possible(self, Q: ArrayLike, left_out: list[NDArray[np.intp]]) -> list[bool]:
        """For each set of atoms, False when Q is certainly not estimable after appending Q
        with those atoms zeroed (``h_keep``), at any scale; True when it may be (then ask
        :meth:`estimable_with`).  A filter for the planner's restriction candidates: O(r t)
        per set of t atoms once Q's residual is known, instead of a projection of each
        ``h_keep`` (O(r n)).

        With ``h_out = Q − h_keep`` and ``res(·)`` the D-orthogonal residual on the row
        space: ``‖res(h_out)‖² = ‖h_out‖² − ‖c_out‖²`` (t columns of V),
        ``⟨res(Q), res(h_out)⟩ = ⟨res(Q), h_out⟩`` and ``res(h_keep) = res(Q) − res(h_out)``;
        after appending h_keep, Q's residual is ``res(Q)`` minus its component along
        ``res(h_keep)``.  Only a residual above 1e-4 ‖Q‖² (and ``h_keep`` adding a direction
        by the same margin) answers False: rounding in these sums is ~1e-8 of that, and
        the exact test's threshold is 1e-18 ‖Q‖², so the filter never drops a candidate
        :meth:`estimable_with` would keep.

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        Qv = self._atom_vector(Q, "Q")
        if self._info is not None or self._r == 0:
            return [True] * len(left_out)
        _, res = self._project(Qv)
        d = self._d
        H = float(np.dot(d * Qv, Qv))
        R = float(np.dot(d * res, res))
        blocks = self._vblocks()
        out = []
        for idx in left_out:
            dv = d[idx] * Qv[idx]
            c = np.concatenate([B.rows[:, idx if B.cols is None else B.cols[idx]] @ dv for B in blocks])
            a = float(dv @ Qv[idx]) - float(c @ c)  # ‖res(h_out)‖²
            p = float(dv @ res[idx])  # ⟨res(Q), h_out⟩
            K = R - 2.0 * p + a  # ‖res(h_keep)‖²
            out.append(not (K > _MARGIN * H and R - (R - p) ** 2 / K > _MARGIN * H))
        return out

    def estimable_with(self, Q: ArrayLike, h_new: ArrayLike) -> bool:
        """Whether Q would be estimable if ``h_new`` were appended (at any scale): the last
        item of :meth:`estimate_with`, by the same computation, without the weights."""
        return Pricer(self, self._atom_vector(Q, "Q"), self._atom_vector(h_new, "h_new"), weights=False).estimable

    def estimable_with_many(self, Q: ArrayLike, h_new: ArrayLike) -> list[bool]:
        """:meth:`estimable_with` for each row pair of ``Q`` and ``h_new`` (k × atoms each).

        The projections of all rows at once (one matrix product per basis block); a row
        whose Gram–Schmidt would take a second pass, or whose residual lies within a factor
        100 of a threshold, is decided by :meth:`estimable_with` itself — so the answers are
        the row-by-row ones.
        """
        Qm = finite_array(Q, "Q", ndim=2)
        Hm = finite_array(h_new, "h_new", ndim=2)
        if Qm.shape != Hm.shape or Qm.shape[1] != self.n_atoms:
            raise InvalidArgument(f"Q and h_new must both be k × {self.n_atoms}; got {Qm.shape} and {Hm.shape}.")
        if self._info is not None:
            return [self.estimable_with(q, h) for q, h in zip(Qm, Hm, strict=True)]
        d = self._d
        dnorms = self._dnorms
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
        out = (rn <= ESTIMABLE_RTOL * qn).tolist()
        for k in np.flatnonzero(unsure).tolist():
            out[k] = self.estimable_with(Qm[k], Hm[k])
        return out

    def estimate_with(
        self, Q: ArrayLike, h_new: ArrayLike, scale_new: float, lattice_new: float = 0.0
    ) -> tuple[NDArray[np.float64], float, float, bool]:
        """BLUE weights of Q if ``h_new`` with scale ``scale_new`` were appended (no mutation).

        Returns:
            ``(weights_history, weight_new, variance, estimable)``; weights and
            variance are ``nan`` if Q is not estimable even with ``h_new``.
            ``lattice_new`` does not change the weights (the BLUE uses the
            continuous variances); it is accepted for symmetry with :meth:`append`.

        Raises:
            InvalidArgument: On wrong shapes or a non-positive scale.
        """
        scale = positive_finite(scale_new, "scale_new")
        nonnegative_finite(lattice_new, "lattice_new")
        pr = Pricer(self, self._atom_vector(Q, "Q"), self._atom_vector(h_new, "h_new"))
        if not pr.estimable:
            return np.full(self._m, np.nan), math.nan, math.nan, False
        u_hist, u_new = pr.at(scale)
        var = 2.0 * (float(u_hist @ u_hist) + u_new * u_new)
        return u_hist / self._b[: self._m], u_new / scale, var, True
