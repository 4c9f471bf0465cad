"""Best linear unbiased estimation from a noisy history, and per-cell cost.

From Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012): §3 (the estimator), §5.4 (the cost).

History: rows ``(h_i, α_i, S_i, y_i)`` with ``y_i = h_i·x + N_i`` and ``N_i``
Laplace of scale ``b_i = S_i/α_i``.  For a query Q the BLUE is ``θ̂ = A·y`` with
``A = Q (Hᵀ W H)⁺ Hᵀ W``, ``W = diag(1/b²)`` (Theorem 3.1), computed without
forming ``Hᵀ W H``:

1. the row space of H is found from the SVD of H with unit-norm rows (so a
   very noisy row still counts as a direction); rank tolerance
   :data:`RANK_RTOL` relative to the largest singular value;
2. Q is estimable iff ``‖Q − P Q‖ ≤`` :data:`ESTIMABLE_RTOL` ``· ‖Q‖`` with P the
   orthogonal projector on that row space (Xiao & Xiong (2012), footnote 7); otherwise
   the result says so (``estimable=False``, ``value = nan``);
3. in an orthonormal basis V of the row space, ``G = diag(1/b) H Vᵀ`` has full
   column rank; ``u`` is the minimum-norm solution of ``Gᵀ u = V Q`` through the
   QR factorisation of G, and ``A_i = u_i / b_i``.  ``Var(θ̂) = 2 Σ u_i²``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.linalg import solve_triangular

from dpgate._validate import finite_array, probability, readonly
from dpgate.errors import InvalidArgument
from dpgate.inference._law import ErrorLaw, Method
from dpgate.inference._posterior import Posterior

__all__ = ["RANK_RTOL", "ESTIMABLE_RTOL", "Estimate", "SystemCost", "estimate", "system_cost"]

RANK_RTOL = 1e-10
"""Singular values of the row-normalised history below this fraction of the largest are zero."""

ESTIMABLE_RTOL = 1e-9
"""Q is estimable iff its distance to the row space is at most this fraction of ‖Q‖."""


@dataclass(frozen=True, eq=False)
class Estimate:
    """What history says about one linear query.

    Attributes:
        value: θ̂ = A·y, or ``nan`` if Q is not estimable.
        weights: The vector A (read-only, one entry per history row; ``nan`` if
            not estimable).
        variance: ``2 Σ (A_k b_k)²`` (``nan`` if not estimable).
        estimable: Whether Q lies in the row space of the history.
        posterior: The posterior of θ, or ``None`` if not estimable.
        scales: The Laplace scales ``b_k`` of the history (read-only).
        lattice: The lattice steps ``γ_k`` of the history (read-only, 0 = continuous).
        gaussian: Which rows' noise is Gaussian (their ``scales`` entry is σ); ``None``: none.
    """

    value: float
    weights: NDArray[np.float64]
    variance: float
    estimable: bool
    posterior: Posterior | None
    scales: NDArray[np.float64]
    lattice: NDArray[np.float64]
    gaussian: NDArray[np.bool_] | None = None

    def _key(self) -> tuple[Any, ...]:
        # repr() makes nan equal to nan; the posterior is derived data.
        return (repr(self.value), self.weights.tobytes(), repr(self.variance), self.estimable,
                self.scales.tobytes(), self.lattice.tobytes(),
                None if self.gaussian is None else self.gaussian.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimate) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def halfwidth(self, confidence: float) -> float:
        """Certified half-width at ``confidence``; ``inf`` if Q is not estimable.

        Raises:
            InvalidArgument: If confidence is not in (0, 1).
        """
        if self.posterior is None:
            probability(confidence, "confidence")
            return math.inf
        return self.posterior.halfwidth(confidence)


@dataclass(frozen=True, eq=False)
class SystemCost:
    """Per-cell privacy cost of a history (Xiao & Xiong (2012), Theorem 5.5).

    Attributes:
        per_cell: ``B_j = Σ_i (α_i/S_i) |H_ij|`` for every cell or atom j (read-only).
        max: The system cost ``max_j B_j`` over non-empty cells.
    """

    per_cell: NDArray[np.float64]
    max: float

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SystemCost) and self.max == other.max
                and self.per_cell.tobytes() == other.per_cell.tobytes())

    def __hash__(self) -> int:
        return hash((self.max, self.per_cell.tobytes()))


def _vector(v: ArrayLike, name: str, size: int | None = None) -> NDArray[np.float64]:
    return finite_array(v, name, ndim=1, size=size)


def _history(
    H: ArrayLike, alpha: ArrayLike, sensitivity: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Validate (H, α, S); default S = max |H_i| per row (Xiao & Xiong (2012), Lemma 2.1)."""
    Hm = finite_array(H, "H (rows = released queries)", ndim=2)
    m = Hm.shape[0]
    a = _vector(alpha, "alpha", m)
    if (a <= 0).any():
        raise InvalidArgument("Every budget alpha_i must be positive.")
    if sensitivity is None:
        S = np.abs(Hm).max(axis=1) if Hm.shape[1] else np.zeros(m)
    else:
        S = _vector(sensitivity, "sensitivity", m)
        if (S < 0).any():
            raise InvalidArgument("Sensitivities must be non-negative.")
    zero_row = ~np.any(Hm != 0, axis=1)
    if (S[~zero_row] <= 0).any():
        raise InvalidArgument("A non-zero history row needs a positive sensitivity.")
    return Hm, a, S


def blue_weights(
    Hs: NDArray[np.float64], b: NDArray[np.float64], Q: NDArray[np.float64]
) -> tuple[NDArray[np.float64], bool]:
    """Minimum-norm ``u`` with ``(diag(1/b) Hs)ᵀ u = Q``, and whether Q is estimable.

    Rows of ``Hs`` must be non-zero and ``b > 0``.  ``A = u / b``.
    """
    qn = float(np.linalg.norm(Q))
    if Hs.shape[0] == 0:
        return np.zeros(0), qn == 0.0
    Hn = Hs / np.linalg.norm(Hs, axis=1)[:, None]
    _, s, Vt = np.linalg.svd(Hn, full_matrices=False)
    r = int(np.count_nonzero(s > RANK_RTOL * s[0]))
    V = Vt[:r]
    cQ = V @ Q
    if float(np.linalg.norm(Q - V.T @ cQ)) > ESTIMABLE_RTOL * qn:
        return np.full(Hs.shape[0], np.nan), False
    G = (Hs / b[:, None]) @ V.T
    Qg, Rg = np.linalg.qr(G)
    z = solve_triangular(Rg, cQ, trans="T")
    return Qg @ z, True


def estimate(
    H: ArrayLike,
    y: ArrayLike,
    alpha: ArrayLike,
    Q: ArrayLike,
    sensitivity: ArrayLike | None = None,
    method: Method = "exact",
    lattice: ArrayLike | None = None,
    *,
    law_options: dict[str, Any] | None = None,
) -> Estimate:
    """BLUE of ``θ = Q·x`` from a history, with its posterior (Xiao & Xiong (2012), Theorem 3.1, §4).

    Args:
        H: History, m × n (rows: released query vectors over cells or atoms).
        y: Released noisy answers, length m.
        alpha: Budget spent on each row, length m, positive.
        Q: The query, length n.
        sensitivity: ``S_i`` per row; default ``max |H_i|`` (Lemma 2.1).
        method: How the error law is computed (see :class:`ErrorLaw`).
        lattice: Lattice step ``γ_i`` of each row's discrete noise (0 = continuous).
        law_options: Extra keyword arguments for :class:`ErrorLaw` (``rng``,
            ``samples``, ``gamma``, ``step``).

    Returns:
        An :class:`Estimate`; ``estimable=False`` and ``value = nan`` when Q is
        not in the row space of H (never a silently wrong number).

    Raises:
        InvalidArgument: On shapes that do not match, non-finite input or
            non-positive budgets.

    Example:
        >>> est = estimate([[1, 0], [1, 1]], [10.0, 30.0], [1.0, 1.0], [0, 1])
        >>> round(est.value, 9), est.estimable
        (20.0, True)
    """
    Hm, a, S = _history(H, alpha, sensitivity)
    m, n = Hm.shape
    yv = _vector(y, "y", m)
    Qv = _vector(Q, "Q", n)
    g = np.zeros(m) if lattice is None else _vector(lattice, "lattice", m)
    if (g < 0).any():
        raise InvalidArgument("Lattice steps must be non-negative.")
    b = np.where(S > 0, S / a, 0.0)
    live = np.any(Hm != 0, axis=1)
    u, ok = blue_weights(Hm[live], b[live], Qv)
    if not ok:
        nan = np.full(m, np.nan)
        return Estimate(math.nan, readonly(nan), math.nan, False, None, readonly(b), readonly(g))
    A = np.zeros(m)
    A[live] = u / b[live]
    value = float(A @ yv)
    law = ErrorLaw(A, b, g, method, **(law_options or {}))
    return Estimate(value, readonly(A), law.variance, True, Posterior(value, law), readonly(b),
                    readonly(g))


def system_cost(
    H: ArrayLike,
    alpha: ArrayLike,
    sensitivity: ArrayLike | None = None,
    cell_sizes: ArrayLike | None = None,
) -> SystemCost:
    """Per-cell budget ``B_j = Σ_i (α_i/S_i) |H_ij|`` and its maximum (Xiao & Xiong (2012), Theorem 5.5).

    Exact for add/remove-one-row DP when each individual contributes one row
    (one cell).  With atoms, every cell of atom j costs ``B_j``; atoms with
    ``cell_sizes[j] = 0`` hold no cell and are left out of the maximum.

    Args:
        H: History, m × n.
        alpha: Budgets, length m.
        sensitivity: ``S_i``; default ``max |H_i|``.
        cell_sizes: Cells per atom (optional, non-negative), length n.

    Raises:
        InvalidArgument: On invalid shapes or values.

    Example:
        >>> system_cost([[1, 1], [0, 2]], [0.5, 0.2]).per_cell.tolist()
        [0.5, 0.7]
    """
    Hm, a, S = _history(H, alpha, sensitivity)
    rate = np.where(S > 0, a / np.where(S > 0, S, 1.0), 0.0)
    B = rate @ np.abs(Hm) if Hm.shape[0] else np.zeros(Hm.shape[1])
    mask = np.ones(Hm.shape[1], dtype=bool)
    if cell_sizes is not None:
        d = _vector(cell_sizes, "cell_sizes", Hm.shape[1])
        if (d < 0).any():
            raise InvalidArgument("cell_sizes must be non-negative.")
        mask = d > 0
    top = float(B[mask].max()) if mask.any() else 0.0
    return SystemCost(readonly(B), top)
