"""The incremental BLUE's coefficient rows C and the square root S of ``M = (CᵀC)⁻¹``,
stored so that copies share them and nothing shared is ever written.

A planning copy of the gateway's state appends a row or two and is thrown away;
copying C (m × r) and S (r × r) on its first write made every decision O(m r).
Here both are append-only:

* :class:`Rows` keeps C as frozen row blocks (each as wide as r was when it was
  frozen; columns beyond are zero) and an own tail; a copy freezes the tail's filled
  rows, which neither side writes again.
* :class:`Root` keeps ``S = diag(S₀, I)(I + X Zᵀ)``: S₀ frozen, X and Z (r × p)
  replaced (never written) on every update.  Potter's rank-one update
  ``S ← S(I + a bᵀ)`` and the bordering ``S ← [[S, 0], [qᵀ, s]]`` of a new direction
  are both ``W ← W(I + low rank)`` for ``W = I + XZᵀ``, since
  ``(I + XZᵀ)(I + abᵀ) = I + [X, a + X(Zᵀa)][Z, b]ᵀ``; past :data:`MAX_RANK` columns
  they are folded into a new S₀ (one matrix product, O(r² p)).  S₀ may be kept as its
  diagonal (a vector): a GROUP BY released on its own has ``S = diag(1/‖g_i‖)``, and its
  thousands of groups would otherwise make an r × r array of zeros.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from dpgate._blas import threads_for
from dpgate.inference._blocks import times_and_back
from dpgate.inference._sparse import matmul

__all__ = ["MAX_RANK", "Root", "Rows"]

#: Columns of X and Z before they are folded into S₀ (fewer for a small S: r/8).
MAX_RANK = 32
#: Rows per panel of :meth:`Root.append_rows`' delayed updates.
_PANEL = 32


#: A frozen block of C: dense, or sparse (a GROUP BY's ``[0, diag(‖g_i‖)]``, :meth:`Rows.add_frozen`).
_Block: TypeAlias = NDArray[np.float64] | sp.csr_matrix


class Rows:
    """C (m × r) as frozen row blocks and an own tail buffer (see the module doc)."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._tail = np.zeros((16, 8))
        self._t = 0  # filled rows of the tail
        self._w = 0  # the widest row in the tail

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the tail's spare capacity (a checkpoint stores what is filled)."""
        return {**self.__dict__, "_tail": self._tail[: self._t, : self._w].copy()}

    def copy(self) -> Rows:
        self._blocks = _compacted(self._blocks)
        new = object.__new__(Rows)
        new._blocks = [*self._blocks, self._tail[: self._t]] if self._t else list(self._blocks)
        new._tail, new._t, new._w = np.zeros((16, 8)), 0, 0
        return new

    def add(self, rows: NDArray[np.float64]) -> None:
        """Append rows (k × w); w may exceed earlier rows' widths (they are zero-padded)."""
        k, w = rows.shape
        cap_r, cap_c = self._tail.shape
        if self._t + k > cap_r or w > cap_c:
            new = np.zeros((max(self._t + k, 2 * cap_r), max(w, 2 * cap_c if w > cap_c else cap_c)))
            new[: self._t, :cap_c] = self._tail[: self._t]
            self._tail = new
        # Rows past the filled ones were never written (zeros from the allocation): writing
        # their columns past w again would only make the spare capacity resident.
        self._tail[self._t: self._t + k, :w] = rows
        self._t += k
        self._w = max(self._w, w)

    def add_frozen(self, rows: sp.csr_matrix) -> None:
        """Append sparse rows (k × w) as a frozen block of their own, not copied into the tail
        (a GROUP BY's thousands of groups: ``[0, diag(‖g_i‖)]``); never written again."""
        self._blocks = [*self._parts(), sp.csr_matrix(rows)]
        self._tail, self._t, self._w = np.zeros((16, 8)), 0, 0

    def _parts(self) -> list[_Block]:
        return [*self._blocks, self._tail[: self._t]] if self._t else self._blocks

    def times(self, z: NDArray[np.float64]) -> NDArray[np.float64]:
        """``C z`` (z has r entries)."""
        parts = [np.asarray(B @ z[: B.shape[1]] if B.shape[1] <= z.size else B[:, : z.size] @ z)
                 for B in self._parts()]
        return np.concatenate(parts) if parts else np.zeros(0)

    def times_and_gram(self, z: NDArray[np.float64], r: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(C z, Cᵀ C z)`` (z: r entries, or r × k) in one pass over C (:func:`times_and_back`):
        C (10 000 × 4 000 after a long history) is read from memory once, not twice."""
        parts, out = [], np.zeros((r, *z.shape[1:]))
        blocks = self._parts()
        with threads_for(sum(_nbytes(B) for B in blocks)):
            for B in blocks:
                w = min(B.shape[1], r)
                if isinstance(B, np.ndarray):
                    y, back = times_and_back(B[:, :w], z[:w])
                else:
                    Bw = B[:, :w] if w < B.shape[1] else B
                    y = np.asarray(Bw @ z[:w])
                    back = np.asarray(Bw.T @ y)
                out[:w] += back
                parts.append(y)
        return (np.concatenate(parts) if parts else np.zeros((0, *z.shape[1:]))), out

    def row(self, i: int, r: int) -> NDArray[np.float64]:
        """Row i of C, r entries (a new array)."""
        for B in self._parts():
            if i < B.shape[0]:
                out = np.zeros(r)
                w = min(B.shape[1], r)
                out[:w] = B[i, :w] if isinstance(B, np.ndarray) else B[[i]].toarray()[0, :w]
                return out
            i -= B.shape[0]
        raise IndexError("row index out of range")

    def dense(self, r: int) -> NDArray[np.float64]:
        """C as one m × r array (a new array)."""
        parts = self._parts()
        out = np.zeros((sum(B.shape[0] for B in parts), r))
        top = 0
        for B in parts:
            w = min(B.shape[1], r)
            out[top: top + B.shape[0], :w] = B[:, :w] if isinstance(B, np.ndarray) else B[:, :w].toarray()
            top += B.shape[0]
        return out


#: :func:`_compacted` joins frozen blocks of C up to this size: past it, a block's per-product
#: overhead is small beside reading it, and zero-padding bigger blocks would cost reads.
_JOINED_BYTES = 1 << 22


def _nbytes(B: _Block) -> int:
    return int(B.nbytes) if isinstance(B, np.ndarray) else int(B.data.nbytes + B.indices.nbytes)


def _compacted(blocks: list[_Block]) -> list[_Block]:
    """``blocks`` with the last two joined (zero-padded to the wider) while the earlier one
    has no more rows than the later and the joined block stays under :data:`_JOINED_BYTES`.

    Every statement freezes its few rows into a block of their own; joining like a binary
    counter keeps O(log m) small blocks (each row copied O(log m) times), not one per
    statement — each product with C pays a fixed cost per block.  A new list: the arrays
    are shared, never written."""
    out = list(blocks)
    while len(out) > 1:
        a, b = out[-2], out[-1]
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):  # a sparse block stays as it is
            break
        w = max(a.shape[1], b.shape[1])
        if a.shape[0] > b.shape[0] or 8 * w * (a.shape[0] + b.shape[0]) > _JOINED_BYTES:
            break
        joined = np.zeros((a.shape[0] + b.shape[0], w))
        joined[: a.shape[0], : a.shape[1]] = a
        joined[a.shape[0]:, : b.shape[1]] = b
        out[-2:] = [joined]
    return out


def _s0_times(S0: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    """``S₀ v`` (or ``S₀ᵀ v`` for ``S₀ᵀ``) for a dense S₀ or a diagonal one (a vector)."""
    if S0.ndim == 1:
        return S0 * v if v.ndim == 1 else S0[:, None] * v
    return matmul(S0, v)


class Root:
    """``S = diag(S₀, I)(I + X Zᵀ)`` (see the module doc); arrays are replaced, never written."""

    def __init__(self, S0: NDArray[np.float64] | None = None) -> None:
        self._S0 = np.zeros((0, 0)) if S0 is None else S0
        r = self._S0.shape[0]
        self._X = np.zeros((r, 0))
        self._Z = np.zeros((r, 0))

    @property
    def size(self) -> int:
        return int(self._X.shape[0])

    def copy(self) -> Root:
        new = object.__new__(Root)
        new.__dict__.update(self.__dict__)
        return new

    def times(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``S v`` (v: r entries, or r × k)."""
        w = v + self._X @ (self._Z.T @ v) if self._X.shape[1] else v.copy()
        r0 = self._S0.shape[0]
        with threads_for(self._S0.nbytes):  # S₀ is r × r: 128 MB at rank 4 000
            w[:r0] = _s0_times(self._S0, w[:r0])
        return w

    def t_times(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Sᵀ v`` (v: r entries, or r × k)."""
        r0 = self._S0.shape[0]
        w = v.copy()
        with threads_for(self._S0.nbytes):
            w[:r0] = _s0_times(self._S0.T, v[:r0])
        if self._X.shape[1]:
            w += self._Z @ (self._X.T @ w)
        return w

    def gram_times(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``S Sᵀ v`` (= M v; v: r entries, or r × k)."""
        return self.times(self.t_times(v))

    def update(self, a: NDArray[np.float64], b: NDArray[np.float64]) -> None:
        """``S ← S (I + a bᵀ)``; a and b are r × k (or r-vectors)."""
        a2, b2 = a.reshape(self.size, -1), b.reshape(self.size, -1)
        if self._X.shape[1]:
            a2 = a2 + self._X @ (self._Z.T @ a2)
        self._X = np.concatenate([self._X, a2], axis=1)
        self._Z = np.concatenate([self._Z, b2], axis=1)
        if self._X.shape[1] > min(MAX_RANK, self.size // 8):  # a small S is cheaper folded
            self.fold()

    def border(self, q: NDArray[np.float64], s: NDArray[np.float64]) -> None:
        """``S ← [[S, 0], [q, s]]`` for k new directions: q is k × r, s (k × k) lower triangular,
        or a vector: the diagonal of a diagonal s."""
        k, r = s.shape[0], self.size
        if r == 0:  # S is s itself (a first block): nothing to fold
            self._S0, self._X, self._Z = np.asarray(s, dtype=np.float64), np.zeros((k, 0)), np.zeros((k, 0))
            return
        if self._X.shape[1] + k > min(MAX_RANK, (r + k) // 8) and not q.any():
            # New directions orthogonal to the old ones (q = 0) that would be folded anyway:
            # S becomes diag(S, s), written once instead of an (r + k)² (p + k) product.
            self.fold()
            if self._S0.ndim == 1 and s.ndim == 1:
                S = np.concatenate([self._S0, s])
            else:
                S = np.zeros((r + k, r + k))
                S[:r, :r] = _dense(self._S0)
                S[r:, r:] = _dense(s)
            self._S0, self._X, self._Z = S, np.zeros((r + k, 0)), np.zeros((r + k, 0))
            return
        s = _dense(s)
        pad = np.zeros((k, self._X.shape[1]))
        self._X = np.concatenate([np.concatenate([self._X, pad]), np.concatenate([np.zeros((r, k)), np.eye(k)])],
                                 axis=1)
        self._Z = np.concatenate([np.concatenate([self._Z, pad]), np.concatenate([q.T, (s - np.eye(k)).T])],
                                 axis=1)
        if self._X.shape[1] > min(MAX_RANK, self.size // 8):  # a small S is cheaper folded
            self.fold()

    def append_rows(self, P: NDArray[np.float64], L: NDArray[np.float64], adds: NDArray[np.bool_]) -> None:
        """S after appending a block's k rows one by one, as ``IncrementalBLUE.append`` does:
        row i has coefficients ``P[:, i]`` on the r directions before the block and ``L[i]`` on
        the directions rows before it added; it adds one itself when ``adds[i]`` (its
        coefficient on it is the first of ``L[i]`` not yet used).  Potter's update
        ``S ← S(I − φφᵀ/(β + √β))`` with ``φ = Sᵀc``, ``β = 1 + φᵀφ``, or the bordering
        ``S ← [[S, 0], [−φᵀ/ρ, 1/ρ]]`` — the same sequence of updates, so the same numerics
        (a square root shrunk by orders of magnitude stays accurate: one factorisation of the
        whole block's update did not, when earlier releases were far noisier than the block).

        The updates are delayed in panels of :data:`_PANEL` rows, as blocked LU delays its
        trailing updates: at a panel's start the columns of X and Z so far ("old") are applied
        to its rows at once (matrix products), and inside it a row's φ and new column read
        only the panel's own columns — each new column of X is kept as ``Xl + X_old U`` and
        ``U`` (old × panel) multiplied out at the panel's end.  A row then costs O(r · panel),
        not O(r · p) matrix-vector reads of every column of the block; the algebra is
        unchanged.  S₀ᵀP is one product for the block, and the block is folded once at the end.
        """
        r, k = P.shape
        size, r0, p0 = self.size, self._S0.shape[0], self._X.shape[1]
        total = size + int(np.count_nonzero(adds))
        X = np.zeros((total, p0 + k))
        Z = np.zeros((total, p0 + k))
        X[:size, :p0], Z[:size, :p0] = self._X, self._Z
        # w⁰ = diag(S₀, I)ᵀ c for every row: on the directions before the block, then on those
        # earlier rows of the block added (not the row's own), zero beyond.
        W = np.zeros((total, k))
        with threads_for(self._S0.nbytes):
            W[:r0] = _s0_times(self._S0.T, P[:r0])
        W[r0:size] = P[r0:]
        own = np.flatnonzero(adds)
        Lx = np.array(L, dtype=np.float64)
        Lx[own, np.arange(own.size)] = 0.0
        W[size:] = Lx.T
        cur, p, kn = size, p0, 0
        for start in range(0, k, _PANEL):
            b, q = min(_PANEL, k - start), p  # q: the old columns, final from here on
            W0 = W[:, start: start + b]
            H = X[:, :q].T @ W0  # X_oldᵀ w⁰
            Wt = W0 + Z[:, :q] @ H  # φ without the panel's own columns
            K = Z[:, :q].T @ Wt  # Z_oldᵀ of that
            U = np.zeros((q, b))  # the panel's columns of X are Xl + X_old U
            Zo = np.zeros((q, b))  # Z_oldᵀ Z_panel
            for j in range(b):
                i = start + j
                Xl, Zl = X[:cur, q:p], Z[:cur, q:p]
                v = Xl.T @ W0[:cur, j] + U[:, :j].T @ H[:, j]  # X_panelᵀ w⁰
                phi = Wt[:cur, j] + Zl @ v  # φ = Sᵀc
                zo_phi = K[:, j] + Zo[:, :j] @ v  # Z_oldᵀ φ
                if adds[i]:
                    rho = L[i, kn]
                    X[cur, p] = 1.0
                    Z[:cur, p] = -phi / rho
                    Z[cur, p] = 1.0 / rho - 1.0
                    Zo[:, j] = -zo_phi / rho  # Z_old is zero on the new direction
                    cur, kn = cur + 1, kn + 1
                else:
                    beta = 1.0 + float(phi @ phi)
                    c = -1.0 / (beta + math.sqrt(beta))  # a = c φ
                    zl_a = c * (Zl.T @ phi)
                    X[:cur, p] = c * phi + Xl @ zl_a
                    U[:, j] = c * zo_phi + U[:, :j] @ zl_a
                    Z[:cur, p] = phi
                    Zo[:, j] = zo_phi
                p += 1
            if q:
                X[:, q:p] += X[:, :q] @ U
        self._X, self._Z = X[:, :p], Z[:, :p]
        if p > min(MAX_RANK, self.size // 8):
            self.fold()

    def fold(self) -> None:
        """Multiply X Zᵀ into a new S₀."""
        r, r0 = self.size, self._S0.shape[0]
        if self._X.shape[1]:
            Y = self._X.copy()
            with threads_for(8 * r * r):  # two r × r × p products
                Y[:r0] = _s0_times(self._S0, Y[:r0])
                S = Y @ self._Z.T  # the new array, added to in place (no r × r identity or copy of S₀)
            if self._S0.ndim == 1:
                S[np.arange(r0), np.arange(r0)] += self._S0
            else:
                S[:r0, :r0] += self._S0
        elif self._S0.ndim == 1:  # diag(S₀, I) stays diagonal
            self._S0 = np.concatenate([self._S0, np.ones(r - r0)])
            return
        else:
            S = np.zeros((r, r))
            S[:r0, :r0] = self._S0
        S[np.arange(r0, r), np.arange(r0, r)] += 1.0
        self._S0, self._X, self._Z = S, np.zeros((r, 0)), np.zeros((r, 0))

    def dense(self) -> NDArray[np.float64]:
        """S as one array."""
        self.fold()
        return _dense(self._S0)


def _dense(S: NDArray[np.float64]) -> NDArray[np.float64]:
    """S as a square array (a vector is the diagonal of a diagonal S)."""
    if S.ndim == 2:
        return S
    out = np.zeros((S.size, S.size))
    out[np.arange(S.size), np.arange(S.size)] = S
    return out
