"""Incremental BLUE over atoms (the search for the smallest budget is in ``_scale``).

:class:`IncrementalBLUE` validates its arguments and keeps the history in one of two
forms behind one interface (``_form.Form``):

* the basis form (``_basis_form``): a D-orthonormal basis V of the row space of the
  scaled rows ``G = H/b``, the coefficients C with ``G = C V`` and a square root of
  ``(CᵀC)⁻¹``, updated row by row or block by block in O(rn + r²) per row;
* the information form (``_information_form``): once an empty history receives rows
  spanning every atom (the hierarchical tree), sparse rows, a dense inverse of the
  information matrix and Woodbury terms: a solve is then O(n² + nnz), not O(m r).

A query's estimate, its estimability and the price of a fresh measurement
(``_pricer``) are read through the form.  The history rows H are kept only when asked
for (``keep_rows``): the gateway rebuilds them from its queries when a view needs them.
Recent projections, solves and estimates are remembered until the state changes.

Splitting atoms (new atom i is a piece of old atom ``parent[i]``) keeps every estimate:
the sizes of the pieces of an atom add up to the atom's size (the split is refused if
they do not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray

from dpgate._validate import finite, finite_array, nonnegative_finite, positive_finite
from dpgate.errors import InvalidArgument, InvalidArgumentType
from dpgate.inference._basis_form import BasisForm
from dpgate.inference._blocks import EXTEND_RTOL, covers_every_atom
from dpgate.inference._blue import Estimate
from dpgate.inference._information import Information
from dpgate.inference._information_form import InformationForm
from dpgate.inference._law import Method
from dpgate.inference._pricer import Pricer

__all__ = ["EXTEND_RTOL", "IncrementalBLUE"]

#: :meth:`IncrementalBLUE.extend` adds larger blocks in chunks of this many rows.
_CHUNK = 256
_SQRT2 = math.sqrt(2.0)


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
        self._form: BasisForm | InformationForm = BasisForm(d, keep_rows)

    # ------------------------------------------------------------------ properties
    @property
    def form(self) -> BasisForm | InformationForm:
        """The form the history is kept in (the basis form until a first block spans every atom)."""
        return self._form

    @property
    def n_atoms(self) -> int:
        """Number of atoms n."""
        return self._form.n_atoms

    @property
    def n_rows(self) -> int:
        """Number of history rows m."""
        return self._form.n_rows

    @property
    def rank(self) -> int:
        """Dimension r of the row space of the history."""
        return self._form.rank

    @property
    def cell_sizes(self) -> NDArray[np.float64]:
        """Cells per atom (read-only copy)."""
        return self._form.cell_sizes

    @property
    def rows(self) -> NDArray[np.float64]:
        """The history H over the current atoms, m × n (read-only copy).

        Raises:
            InvalidArgument: the rows were not kept (``keep_rows=False``).
        """
        return self._form.rows

    @property
    def values(self) -> NDArray[np.float64]:
        """Released answers y (read-only copy)."""
        return self._form.values

    @property
    def scales(self) -> NDArray[np.float64]:
        """Laplace scales b (read-only copy)."""
        return self._form.scales

    @property
    def lattice(self) -> NDArray[np.float64]:
        """Lattice steps γ (read-only copy; 0 = continuous)."""
        return self._form.lattice

    @property
    def gaussian(self) -> NDArray[np.bool_]:
        """Which rows' noise is Gaussian (read-only); their :attr:`scales` entry is ``σ/√2``,
        the Laplace scale of the same variance (the BLUE needs only variances)."""
        return self._form.gaussian

    def law_scales(self) -> tuple[NDArray[np.float64], NDArray[np.bool_] | None]:
        """The history's noise scales as :class:`ErrorLaw` takes them (σ for a Gaussian row)
        and its Gaussian mask (``None``: all Laplace)."""
        return self._form.law_scales(self.n_rows)

    def twin_classes(self) -> NDArray[np.intp] | None:
        """For each atom, a class id: atoms of one class ("twins") have equal columns in the
        basis, so every vector of the history's row space — every estimable query — takes
        one value on them.  ``None`` in the information form, or when the basis holds more
        than :data:`~dpgate.inference._basis_form.TWIN_CELLS` numbers (comparing its
        columns would cost more than it saves).  Each frozen block's classes are found once
        (blocks are never written)."""
        return self._form.twin_classes()

    def basis(self) -> NDArray[np.float64]:
        """The D-orthonormal basis V of the row space, r × n (a new array)."""
        return self._form.basis()

    def copy(self) -> IncrementalBLUE:
        """An independent copy (appends and splits of either never show in the other).

        The basis V is shared, not copied: its filled rows are never written again
        (appends write rows beyond them, splits build new arrays), so they become a
        frozen block of the copy.  The small arrays are shared until either side writes.
        Like appends, it rearranges this state (its blocks), so copies of one state are taken
        under its owner's lock (the gateway's).
        """
        new = object.__new__(IncrementalBLUE)
        new._form = self._form.copy()
        return new

    def __copy__(self) -> IncrementalBLUE:
        """``copy.copy`` gives :meth:`copy` (a shallow copy would share C, S and the
        information form, which later changes update in place)."""
        return self.copy()

    def __setstate__(self, state: dict[str, object]) -> None:
        """Refuse a state pickled before the two forms (no ``_form``): a checkpoint that
        fails to load is replayed from the ledger instead of failing at its first use."""
        if "_form" not in state:
            raise InvalidArgumentType("This IncrementalBLUE was pickled by an older dpgate build: replay its "
                                      "ledger instead of loading this state (the gateway does so itself).")
        self.__dict__.update(state)

    def _atom_vector(self, v: ArrayLike, name: str) -> NDArray[np.float64]:
        return finite_array(v, name, ndim=1, size=self.n_atoms)

    # ------------------------------------------------------------------ updates
    def append(self, h: ArrayLike, scale: float, value: float, lattice: float = 0.0, *,
               gaussian: bool = False) -> None:
        """Add one released answer ``value = h·x + N`` with Laplace scale ``scale``.

        Args:
            h: Query vector over the current atoms.
            scale: Laplace scale ``b = S/α > 0`` of its noise (its deviation σ if Gaussian).
            value: The released noisy answer.
            lattice: Lattice step γ of discrete noise (0 = continuous).
            gaussian: Its noise is (discrete) Gaussian of deviation ``scale``.

        Raises:
            InvalidArgument: On a wrong shape or non-finite / non-positive numbers.
        """
        hv = self._atom_vector(h, "h")
        scale = positive_finite(scale, "scale")
        value = finite(value, "value")
        lattice = nonnegative_finite(lattice, "lattice")
        if not gaussian:
            self._form.append(hv, scale, value, lattice)
            return
        m = self.n_rows
        self._form.append(hv, scale / _SQRT2, value, lattice)  # the Laplace scale of variance σ²
        self._form.mark_gaussian(m, np.ones(1, dtype=bool))

    def extend(self, rows: ArrayLike | sp.csr_matrix, scales: ArrayLike, values: ArrayLike,
               lattice: ArrayLike | None = None, gaussian: ArrayLike | None = None) -> None:
        """Append many released answers at once: the same state as :meth:`append` row by row.

        ``gaussian``: which rows' noise is Gaussian (their ``scales`` entry is σ).

        ``rows`` may be a scipy sparse matrix (a tree's thousands of nodes over thousands
        of atoms, few non-zeros each): it stays sparse into the information form.

        When every row adds a direction (a fresh GROUP BY's groups), the block is added
        with matrix products (block Gram–Schmidt, twice, then an LQ factorisation of the
        residuals): with ``P`` the rows' coefficients on V and ``L`` (lower triangular)
        on the new directions, C gains the rows ``[Pᵀ, L]`` and the square root of M
        becomes ``[[S, 0], [−L⁻¹PᵀS, L⁻¹]]`` (the one-row formula of :meth:`append`
        with ρ → L).  Otherwise — or when a row is zero or adds a direction only barely
        — the rows are appended one by one.  More than ``_CHUNK`` rows go in chunks of that
        many, unless they span every atom (:meth:`_span`) or are disjoint and touch no atom
        the history touches (a first GROUP BY: ``BasisForm.extend_orthogonal``, one sparse block).

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
        n = None if gaussian is None else np.asarray(gaussian, dtype=bool).ravel()
        if n is not None and n.size != k:
            raise InvalidArgument(f"gaussian must have one entry per row ({k}); got {n.size}.")
        if n is not None and n.any():
            m = self.n_rows
            self._extend(H, np.where(n, b / _SQRT2, b), y, g)
            self._form.mark_gaussian(m, n)
            return
        self._extend(H, b, y, g)

    def _extend(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64], y: NDArray[np.float64],
                g: NDArray[np.float64]) -> None:
        """:meth:`extend` of validated, Laplace-scaled rows."""
        k = H.shape[0]
        if k > _CHUNK:
            if self._span(H, b, y, g) or (isinstance(self._form, BasisForm)
                                          and self._form.extend_orthogonal(H, b, y, g)):
                return
            # In chunks: Gram–Schmidt inside a block is O(k² n); against the basis it is one
            # matrix product per chunk.
            for i in range(0, k, _CHUNK):
                self._extend(H[i: i + _CHUNK], b[i: i + _CHUNK], y[i: i + _CHUNK], g[i: i + _CHUNK])
            return
        if not isinstance(H, np.ndarray):
            H = H.toarray()
        if k < 2 or not self._extend_block(H, b, y, g):
            for i in range(k):
                self.append(H[i], float(b[i]), float(y[i]), lattice=float(g[i]))

    def _extend_block(self, H: NDArray[np.float64], b: NDArray[np.float64], y: NDArray[np.float64],
                      g: NDArray[np.float64]) -> bool:
        """The block path of :meth:`extend`; False (nothing changed) when it does not apply."""
        if self._span(H, b, y, g):
            return True
        return self._form.extend_block(H, b, y, g)

    def _span(self, H: NDArray[np.float64] | sp.csr_matrix, b: NDArray[np.float64], y: NDArray[np.float64],
              g: NDArray[np.float64]) -> bool:
        """An empty history receives non-zero rows that span every atom (e.g. a hierarchical
        tree with its leaves): the information form (``_information``) from the sparse rows
        and the inverse of ``GᵀG`` (bottom-up for a hierarchy, else by Cholesky) — instead
        of k rank-one updates.  If that fails (rounding): the basis form on the atoms
        themselves (``BasisForm.start_on_atoms``).  False (nothing changed) when the history
        is not empty or the rows do not span every atom that way.
        """
        form = self._form
        if not isinstance(form, BasisForm) or form.rank != 0:
            return False
        if H.shape[0] < self.n_atoms:  # every atom needs a row of its own
            return False
        Gs = (sp.diags(1.0 / b) @ sp.csr_matrix(H)).tocsr()
        per_row = np.diff(Gs.indptr)
        if not (per_row > 0).all() or not covers_every_atom(Gs):
            return False
        info = Information.build(Gs, form.cell_sizes)
        if info is None:
            form.start_on_atoms(Gs, H, b, y, g)
            return True
        self._form = InformationForm(form, info)
        self._form.store(H, b, y, g)
        return True

    def revalue(self, values: ArrayLike) -> None:
        """The released values of the last ``len(values)`` rows become ``values``: rows appended
        as placeholders while a statement was planned, before its values existed.  The design
        (rows, scales, lattice steps) is unchanged, so remembered projections and solves are
        kept and remembered estimates (which read the values) dropped: exactly the state that
        appending the rows with these values gives, without a second projection or solve.

        Raises:
            InvalidArgument: more values than rows, or a value that is not finite.
        """
        y = finite_array(values, "values", ndim=1)
        if y.size > self.n_rows:
            raise InvalidArgument(f"{y.size} values for the last rows of a history of {self.n_rows}.")
        self._form.revalue(y)

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
        if not np.allclose(total, self._form.cell_sizes, rtol=1e-12, atol=0.0):
            raise InvalidArgument("The pieces of every old atom must add up to its size (and cover it).")
        self._form.split(p, d)

    # ------------------------------------------------------------------ queries
    def estimate(self, Q: ArrayLike, method: Method = "exact", **law_options: Any) -> Estimate:
        """BLUE of ``Q·x`` from the stored history (same result as :func:`estimate`).

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        return self._form.estimate(self._atom_vector(Q, "Q"), method, law_options)

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
        Every other row (all of them, when there are fewer than 16) is :meth:`estimate` itself.

        Raises:
            InvalidArgument: On a wrong shape or non-finite rows.
        """
        Qm = finite_array(Qs, "Qs", ndim=2)
        if Qm.shape[1] != self.n_atoms:
            raise InvalidArgument(f"Qs must be k × {self.n_atoms}; got {Qm.shape}.")
        return self._form.estimate_many(Qm, rows)

    def estimable(self, Q: ArrayLike) -> bool:
        """Whether Q is estimable from the history: :attr:`Estimate.estimable` of
        :meth:`estimate`, by the same test, without the weights (one projection).

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        return self._form.estimable(self._atom_vector(Q, "Q"))

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
        :meth:`estimable_with` would keep.  In the information form every set may be.

        Raises:
            InvalidArgument: On a wrong shape or non-finite Q.
        """
        return self._form.restrictions_possible(self._atom_vector(Q, "Q"), left_out)

    def pricer(self, Q: ArrayLike, h_new: ArrayLike, *, weights: bool = True) -> Pricer:
        """Everything about Q's BLUE after appending ``h_new`` that does not depend on its
        scale (``_pricer``); ``weights=False``: only whether Q would be estimable.

        Raises:
            InvalidArgument: On wrong shapes or non-finite vectors.
        """
        return Pricer(self._form, self._atom_vector(Q, "Q"), self._atom_vector(h_new, "h_new"), weights=weights)

    def estimable_with(self, Q: ArrayLike, h_new: ArrayLike) -> bool:
        """Whether Q would be estimable if ``h_new`` were appended (at any scale): the last
        item of :meth:`estimate_with`, by the same computation, without the weights."""
        return self.pricer(Q, h_new, weights=False).estimable

    def estimable_with_many(self, Q: ArrayLike, h_new: ArrayLike) -> list[bool]:
        """:meth:`estimable_with` for each row pair of ``Q`` and ``h_new`` (k × atoms each).

        The projections of all rows at once (one matrix product per basis block); a row
        whose Gram–Schmidt would take a second pass, or whose residual lies within a factor
        100 of a threshold, is decided by :meth:`estimable_with` itself — so the answers are
        the row-by-row ones.  In the information form every row is.
        """
        Qm = finite_array(Q, "Q", ndim=2)
        Hm = finite_array(h_new, "h_new", ndim=2)
        if Qm.shape != Hm.shape or Qm.shape[1] != self.n_atoms:
            raise InvalidArgument(f"Q and h_new must both be k × {self.n_atoms}; got {Qm.shape} and {Hm.shape}.")
        out, unsure = self._form.screen_estimable_with(Qm, Hm)
        for k in unsure:
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
        pr = self.pricer(Q, h_new)
        if not pr.estimable:
            return np.full(self.n_rows, np.nan), math.nan, math.nan, False
        u_hist, u_new = pr.at(scale)
        var = 2.0 * (float(u_hist @ u_hist) + u_new * u_new)
        return u_hist / self._form.scales, u_new / scale, var, True
