"""What the two forms of the incremental BLUE share, and the interface the rest of the library uses.

:class:`~dpgate.inference.IncrementalBLUE` keeps its history in one of two forms:

* the basis form (``_basis_form``): a D-orthonormal basis V of the row space, the
  coefficients C with ``G = C V`` and a square root of ``(CᵀC)⁻¹``;
* the information form (``_information_form``), for a history that spans every atom
  from its first block (a hierarchical tree): sparse rows and a dense inverse of the
  information matrix (``_information``).

Both keep the released answers here (:class:`Form`): the rows H (when asked), values y,
scales b and lattice steps γ (and which rows are Gaussian: their b is ``σ/√2``, the Laplace
scale of the same variance, so the BLUE's weights need nothing else; only the law reads the
family), shared with a copy until either side writes them, and the
recent projections, solves and estimates of this exact state.  A form says how a query's
coordinates are found (:meth:`Form.coordinates`), how they become weights on the history
(:meth:`Form.weights`), how rows enter and atoms split; the estimate itself is built
here, the same way for both.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar, cast

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from dpgate._validate import readonly
from dpgate.errors import InvalidArgument
from dpgate.inference._blue import Estimate
from dpgate.inference._law import ErrorLaw, Method
from dpgate.inference._posterior import Posterior

__all__ = ["Form", "Known"]

#: Remembered projections, solves and estimates per state: at least this many, and as many
#: as fit in :data:`_MEMO_FLOATS` numbers of their size (a repeated GROUP BY asks one
#: estimate per group: a small history remembers them all).
_MEMO = 16
_MEMO_FLOATS = 1 << 21

_T = TypeVar("_T")
#: Projections ``(coefficients, residual)`` of some rows of a matrix, by row index.
Known = dict[int, tuple[NDArray[np.float64], NDArray[np.float64]]]


def frozen_pair(
    pair: tuple[NDArray[np.float64], NDArray[np.float64]],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Both arrays of a pair, read-only (remembered results are shared)."""
    return readonly(pair[0]), readonly(pair[1])


def _mask(n: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """A read-only boolean copy."""
    out = np.array(n, dtype=bool)
    out.setflags(write=False)
    return out


def grow(buf: NDArray[np.float64], rows: int, cols: int) -> NDArray[np.float64]:
    """Return ``buf`` or a copy with at least (rows, cols) capacity (doubling)."""
    r0, c0 = buf.shape
    if rows <= r0 and cols <= c0:
        return buf
    new = np.zeros((max(rows, 2 * r0 if rows > r0 else r0), max(cols, 2 * c0 if cols > c0 else c0)))
    new[:r0, :c0] = buf
    return new


class Form(ABC):
    """The released answers of a history over atoms of sizes ``d``, and one representation
    of what they determine (a subclass).  Arguments are validated by the façade
    (:class:`~dpgate.inference.IncrementalBLUE`): here vectors are float arrays over the atoms.
    """

    def __init__(self, d: NDArray[np.float64], keep_rows: bool) -> None:
        n = d.size
        self._d = d.copy()
        self._m = 0
        self._r = 0
        self._H: NDArray[np.float64] | None = np.zeros((16, n)) if keep_rows else None
        self._y = np.zeros(16)
        self._b = np.zeros(16)
        self._g = np.zeros(16)
        self._n = np.zeros(16)  # 1 where the row's noise is Gaussian (b = σ/√2)
        self._owned = True  # H, y, b, γ are not shared with a copy
        # Recent projections, solves and estimates on this exact state (a decision asks for
        # the same ones several times); replaced, never cleared, on every change, so a copy may
        # share it until either side changes.
        self._memo: dict[tuple[object, ...], Any] = {}

    def _adopt(self, other: Form) -> None:
        """Take over ``other``'s released answers (it is given up: a change of form)."""
        self._d, self._m, self._H = other._d, other._m, other._H
        self._y, self._b, self._g, self._owned = other._y, other._b, other._g, other._owned
        self._n = other.__dict__.get("_n", np.zeros(other._y.size))
        self._r = 0
        self._memo = {}

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

    @property
    def gaussian(self) -> NDArray[np.bool_]:
        """Which rows' noise is Gaussian (read-only)."""
        return _mask(self._gauss()[: self._m] > 0)

    def _gauss(self) -> NDArray[np.float64]:
        """The Gaussian marks (a state pickled before them has none: all Laplace)."""
        n = self.__dict__.get("_n")
        if n is None or n.size < self._y.size:
            n = np.zeros(self._y.size) if n is None else np.concatenate((n, np.zeros(self._y.size - n.size)))
            self._n = n
        return n

    def mark_gaussian(self, start: int, mask: NDArray[np.bool_]) -> None:
        """Rows ``start, start + 1, …`` (just appended, b = σ/√2) carry Gaussian noise where ``mask``."""
        self._own()
        self._gauss()[start: start + mask.size] = mask
        self._memo = {}

    def law_scales(self, m: int) -> tuple[NDArray[np.float64], NDArray[np.bool_] | None]:
        """The first m rows' noise scales for the error law (σ = √2 b for a Gaussian row) and
        Gaussian mask (``None``: all Laplace, the scales are b itself)."""
        n = self._gauss()[:m] > 0
        if not n.any():
            return readonly(self._b[:m]), None
        return readonly(np.where(n, self._b[:m] * math.sqrt(2.0), self._b[:m])), _mask(n)

    # ------------------------------------------------------------------ the representation
    @abstractmethod
    def copy(self) -> Self:
        """An independent copy (see :meth:`IncrementalBLUE.copy`)."""

    @abstractmethod
    def coordinates(self, Q: NDArray[np.float64]) -> tuple[NDArray[np.float64], bool]:
        """``(c_Q, estimable)``: Q's coordinates, from which :meth:`weights` gives its BLUE weights."""

    @abstractmethod
    def weights(self, c: NDArray[np.float64]) -> NDArray[np.float64]:
        """``u`` (one entry per row) of the coordinates ``c`` (of :meth:`coordinates`):
        the BLUE weights on the scaled rows, ``A = u / b``."""

    @abstractmethod
    def twin_classes(self) -> NDArray[np.intp] | None:
        """See :meth:`IncrementalBLUE.twin_classes`."""

    @abstractmethod
    def basis(self) -> NDArray[np.float64]:
        """The D-orthonormal basis V of the row space, r × n (a new array)."""

    @abstractmethod
    def _add(self, h: NDArray[np.float64], g: NDArray[np.float64], scale: float) -> None:
        """The representation's part of :meth:`append`: the row ``g = h/scale`` enters."""

    @abstractmethod
    def extend_block(self, H: NDArray[np.float64], b: NDArray[np.float64], y: NDArray[np.float64],
                     g: NDArray[np.float64]) -> bool:
        """A block of rows at once (see :meth:`IncrementalBLUE.extend`); False (nothing
        changed) when the block path does not apply."""

    @abstractmethod
    def _split_atoms(self, p: NDArray[np.intp], d: NDArray[np.float64]) -> None:
        """The representation's part of :meth:`split`."""

    def restrictions_possible(self, Q: NDArray[np.float64], left_out: list[NDArray[np.intp]]) -> list[bool]:
        """See :meth:`IncrementalBLUE.restrictions_possible`; here every set may be."""
        return [True] * len(left_out)

    def screen_estimable_with(self, Q: NDArray[np.float64], H: NDArray[np.float64]) -> tuple[list[bool], list[int]]:
        """:meth:`IncrementalBLUE.estimable_with_many` where it is sure, and the rows it is not
        sure of (to be decided one by one); here, none is sure."""
        return [False] * Q.shape[0], list(range(Q.shape[0]))

    def _screen(self, Q: NDArray[np.float64], rows: Sequence[int | None] | None) -> tuple[NDArray[np.bool_], Known]:
        """For :meth:`estimate_many`: the rows of Q certainly not estimable (here none), and the
        projections known without reading the basis, by row index (here none)."""
        return np.zeros(Q.shape[0], dtype=bool), {}

    def _together(self, Q: NDArray[np.float64], todo: list[int], keys: list[tuple[object, ...]],
                  known: Known) -> dict[int, Estimate]:
        """For :meth:`estimate_many`: the estimates of the rows ``todo`` of Q found together, where
        that is faster (here it is not), by row index (also remembered); ``known``: :meth:`_screen`'s."""
        return {}

    # ------------------------------------------------------------------ helpers
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

    def dnorm(self, v: NDArray[np.float64]) -> float:
        """``‖v‖_D``: the norm of the expanded cell vector."""
        return math.sqrt(float(np.dot(self._d * v, v)))

    def inner(self, u: NDArray[np.float64], v: NDArray[np.float64]) -> float:
        """``⟨u, v⟩_D = Σ_j d_j u_j v_j``."""
        return float(np.dot(self._d * u, v))

    def dnorms(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The D-norm of each row of X."""
        return np.sqrt(np.einsum("ij,ij->i", X * self._d, X))

    def _copied(self) -> Self:
        """A copy sharing every attribute; the small arrays become shared (copied on write)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        self._owned = new._owned = False
        return new

    def __getstate__(self) -> dict[str, object]:
        """Pickled without spare capacity, remembered results or shared-buffer flags."""
        state = dict(self.__dict__)
        m = self._m
        state.update(_y=self._y[:m].copy(), _b=self._b[:m].copy(), _g=self._g[:m].copy(), _memo={}, _owned=True,
                     _n=self._gauss()[:m].copy())
        if self._H is not None:
            state["_H"] = self._H[:m].copy()
        return state

    def _own(self) -> None:
        """Copy the small arrays this state shares with a copy before writing to them."""
        if not self._owned:
            for name in ("_y", "_b", "_g", "_n", "_H"):
                v = getattr(self, name, None)
                if v is not None:
                    setattr(self, name, v.copy())
            self._owned = True

    def store(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64], y: NDArray[np.float64],
              g: NDArray[np.float64]) -> None:
        """Keep a block's rows (when asked), values, scales and lattice steps; m grows by its size."""
        m, k = self._m, H.shape[0]
        self._own()
        if self._H is not None:
            self._H = grow(self._H, m + k, self.n_atoms)
            self._H[m: m + k] = H if isinstance(H, np.ndarray) else H.toarray()
        while m + k > self._y.size:
            self._gauss()
            for name in ("_y", "_b", "_g", "_n"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate((old, np.zeros(max(old.size, 16)))))
        self._y[m: m + k], self._b[m: m + k], self._g[m: m + k] = y, b, g
        self._m = m + k

    # ------------------------------------------------------------------ updates
    def append(self, h: NDArray[np.float64], scale: float, value: float, lattice: float) -> None:
        """Add one released answer (see :meth:`IncrementalBLUE.append`)."""
        m = self._m
        self._own()
        self._memo = {}
        if self._H is not None:
            self._H = grow(self._H, m + 1, self.n_atoms)
            self._H[m] = h
        if m + 1 > self._y.size:
            self._gauss()
            for name in ("_y", "_b", "_g", "_n"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate((old, np.zeros(max(old.size, 16)))))
        self._y[m], self._b[m], self._g[m] = value, scale, lattice
        self._m = m + 1
        self._add(h, h / scale, scale)

    def revalue(self, y: NDArray[np.float64]) -> None:
        """The last ``y.size`` rows' values become ``y`` (see :meth:`IncrementalBLUE.revalue`)."""
        m = self._m
        self._own()
        self._y[m - y.size: m] = y
        self._memo = {key: found for key, found in self._memo.items() if key[0] != "estimate"}

    def split(self, p: NDArray[np.intp], d: NDArray[np.float64]) -> None:
        """New atom i is a piece of old atom ``p[i]``, of size ``d[i]`` (checked by the façade)."""
        self._memo = {}
        self._split_atoms(p, d)
        if self._H is not None:
            self._own()
            self._H = np.ascontiguousarray(self._H[:, p])
        self._d = d.copy()

    # ------------------------------------------------------------------ queries
    def estimate(self, Q: NDArray[np.float64], method: Method = "exact",
                 law_options: dict[str, Any] | None = None) -> Estimate:
        """BLUE of ``Q·x`` from the stored history (remembered)."""
        options = {} if law_options is None else law_options
        key = ("estimate", Q.tobytes(), method, repr(sorted(options.items())))
        return self._remembered(key, lambda: self._estimate_now(Q, method, options))

    def _estimate_now(self, Qv: NDArray[np.float64], method: Method, law_options: dict[str, Any]) -> Estimate:
        m = self._m
        g = readonly(self._g[:m])
        b, n = self.law_scales(m)
        cQ, ok = self.coordinates(Qv)
        if not ok:
            return Estimate(math.nan, readonly(np.full(m, np.nan)), math.nan, False, None, b, g, n)
        u = self.weights(cQ)
        A = u / self._b[:m]
        value = float(A @ self._y[:m])
        law = ErrorLaw(A, b, g, method, gaussian=n, **law_options)
        return Estimate(value, readonly(A), law.variance, True, Posterior(value, law), b, g, n)

    def estimate_many(self, Qm: NDArray[np.float64], rows: Sequence[int | None] | None) -> list[Estimate]:
        """:meth:`estimate` (exact law) of each row of Qm (see :meth:`IncrementalBLUE.estimate_many`)."""
        sure, known = self._screen(Qm, rows)
        m = self._m
        nan = readonly(np.full(m, np.nan))
        none = Estimate(math.nan, nan, math.nan, False, None, *self._law_scales_and_lattice(m))
        keys: list[tuple[object, ...]] = [("estimate", Q.tobytes(), "exact", "[]") for Q in Qm]
        todo = [k for k, (key, no) in enumerate(zip(keys, sure.tolist(), strict=True))
                if not no and key not in self._memo]
        # Used as found, not read back from the memo: a GROUP BY of more groups than the memo
        # holds would otherwise evict them and estimate every group again, one by one.
        found = self._together(Qm, todo, keys, known)
        return [self._remembered(key, lambda: none) if no else found[k] if k in found else self.estimate(Q)
                for k, (Q, key, no) in enumerate(zip(Qm, keys, sure.tolist(), strict=True))]

    def _law_scales_and_lattice(
        self, m: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_] | None]:
        b, n = self.law_scales(m)
        return b, readonly(self._g[:m]), n

    def estimable(self, Q: NDArray[np.float64]) -> bool:
        """Whether Q is estimable from the history (one projection or solve)."""
        return self.coordinates(Q)[1]
