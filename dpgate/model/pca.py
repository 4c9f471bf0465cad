"""The kernel-PCA estimator with a cross-validated bias–variance trade-off.

From Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for Improving
Data Utility under Differential Privacy" (EDBT 2016), §3.

Post-processing of released answers only: no data is read, no budget is spent.
The estimates are **biased** on purpose (that is how they beat the unbiased BLUE
on queries history does not pin down); their accuracy is summarised by a
cross-validated RMSE, which is an *average over queries like the past ones*, not
a guarantee for any single query.

Method (notation of the paper, on atoms — see :mod:`dpgate.model._released`):

* kernel ``K_ij = ⟨q_i, q_j⟩ = Σ_atoms mass · q_i · q_j`` (Eq. 18), ``O(m² n_atoms)``;
* universal query (§3.1).  When the table declares a public row count ``N``, the
  query ``u = 1`` is known exactly (unit norm since the masses sum to 1).  Its
  limit of zero variance is taken exactly: answers become ``a − N⟨q, u⟩``, queries
  ``q − ⟨q, u⟩u`` and every estimate gets ``N⟨q, u⟩`` back, so ``a → 0`` answers
  as if the data followed the prior;
* eigen-queries (§3.2): ``Σ^{-½} K Σ^{-½} = U Λ² Uᵀ``, ``W = Λ⁺ Uᵀ Σ^{-½}``,
  ``z = W a`` with uncorrelated errors of variance ``1/λ_i²``;
* shrinkage (§3.3, Theorem 3): the estimate of ``q`` is ``Σ y_i c_i z_i`` with
  ``c_i = ⟨q, v_i⟩ = (W k_q)_i`` and ``y_i = a²/(a² + 1/λ_i²)``; ``a = ∞`` is the
  least-squares (BLUE) answer of the query's projection on the row space;
* choice of ``a`` (§3.5): ``k``-fold cross-validation; on each fold the unbiased
  MSE estimate of Theorem 4, ``mean((â − a_test)²) − mean(σ²_test)``, is exact in
  expectation because test noise is independent of the training fit.  The
  folds' estimates are averaged; ``a`` is found on a log grid refined by ternary
  (golden-section) search, and ``a = 0`` / ``a = ∞`` are candidates too.

Cost: ``O(m² n_atoms)`` for kernels plus ``O(k m³)`` for the fold eigendecompositions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PCAFit", "fit", "kernel", "cross_validate", "shrinkage"]

#: Relative eigenvalue cut-off: directions weaker than this are numerically absent.
EIG_RTOL = 1e-10


def kernel(A: np.ndarray, mass: np.ndarray, B: np.ndarray | None = None) -> np.ndarray:
    """``A diag(mass) Bᵀ`` (B defaults to A)."""
    Am = A * mass
    return Am @ (A if B is None else B).T


def shrinkage(a: float, mu: np.ndarray) -> np.ndarray:
    """Weights ``y_i = a²/(a² + 1/λ_i²)`` for eigenvalues ``μ = λ²`` (``a = inf`` gives 1)."""
    if a == math.inf:
        return np.ones_like(mu)
    if a <= 0:
        return np.zeros_like(mu)
    return a * a * mu / (a * a * mu + 1.0)


@dataclass(frozen=True)
class PCAFit:
    """Eigen-queries of one set of released answers.

    Attributes:
        W: ``r × m`` coefficients of the eigen-queries in the released queries.
        z: least-squares answers of the eigen-queries (``r``).
        mu: ``λ_i²`` (``r``, decreasing); ``var(z_i) = 1/μ_i``.
        ku: ``⟨q_j, u⟩`` of the released queries (used when ``total`` is known).
        total: the exact total ``N`` (universal query) or ``None``.
    """

    W: np.ndarray = field(repr=False)
    z: np.ndarray = field(repr=False)
    mu: np.ndarray = field(repr=False)
    ku: np.ndarray = field(repr=False)
    total: float | None

    @property
    def rank(self) -> int:
        """Number of eigen-queries r."""
        return int(self.mu.size)

    def terms(self, kq: np.ndarray, kqu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For queries with kernel rows ``kq`` (t × m) and ``⟨q, u⟩`` (t): ``(base, c·z)``.

        The estimate at trade-off ``a`` is ``base + (c·z) @ shrinkage(a, mu)``.
        """
        kq = np.atleast_2d(kq)
        if self.total is not None:
            kq = kq - np.outer(kqu, self.ku)
            base = self.total * np.asarray(kqu, dtype=float)
        else:
            base = np.zeros(kq.shape[0])
        c = kq @ self.W.T
        return base, c * self.z

    def variance(self, kq: np.ndarray, kqu: np.ndarray, a: float) -> np.ndarray:
        """The noise part of each estimate's error: ``Σ y_i² c_i²/λ_i²`` (bias not included)."""
        kq = np.atleast_2d(kq)
        if self.total is not None:
            kq = kq - np.outer(kqu, self.ku)
        c = kq @ self.W.T
        y = shrinkage(a, self.mu)
        return (c**2 * (y**2 / self.mu)).sum(axis=1)


def fit(K: np.ndarray, ku: np.ndarray, values: np.ndarray, variances: np.ndarray, total: float | None) -> PCAFit:
    """Eigen-queries from the kernel ``K`` (m × m) of released queries (Chen, Zhou & Bhowmick (2016), §3.1–3.2)."""
    a = np.asarray(values, dtype=float)
    if total is not None:
        K = K - np.outer(ku, ku)
        a = a - total * ku
    s = 1.0 / np.sqrt(variances)
    Kw = s[:, None] * K * s[None, :]
    Kw = (Kw + Kw.T) / 2
    if Kw.size == 0:
        return PCAFit(np.zeros((0, 0)), np.zeros(0), np.zeros(0), ku, total)
    mu, U = np.linalg.eigh(Kw)
    order = np.argsort(mu)[::-1]
    mu, U = mu[order], U[:, order]
    keep = mu > EIG_RTOL * max(float(mu[0]), 0.0) if mu.size else np.zeros(0, bool)
    keep &= mu > 0
    mu, U = mu[keep], U[:, keep]
    W = (U / np.sqrt(mu)).T * s[None, :]
    return PCAFit(W, W @ a, mu, ku, total)


@dataclass(frozen=True)
class CVResult:
    """Cross-validated choice of the trade-off ``a``.

    Attributes:
        a: chosen trade-off (``inf`` = unbiased least squares, ``0`` = prior only).
        mse: Theorem 4 estimate of the mean squared error of new answers at ``a``
            (may be slightly negative by chance; ``rmse`` clips at 0).
        grid: the ``(a, mse)`` pairs evaluated, ``a`` increasing (0 and inf included).
        folds: number of folds.
    """

    a: float
    mse: float
    grid: tuple[tuple[float, float], ...]
    folds: int

    @property
    def rmse(self) -> float:
        """``√max(mse, 0)``."""
        return math.sqrt(max(self.mse, 0.0))

    def mse_at(self, a: float) -> float:
        """The evaluated MSE nearest to ``a`` on the grid (log scale)."""
        pts = [(abs(_log(x) - _log(a)), m) for x, m in self.grid]
        return min(pts)[1]


def _log(a: float) -> float:
    return -1e9 if a <= 0 else (1e9 if a == math.inf else math.log(a))


class _Folds:
    """Per-fold ``(base, c·z, μ, answers, variances)`` so any ``a`` costs ``O(m r)``."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]):
        self.parts = parts

    def mse(self, a: float) -> float:
        out = []
        for base, cz, mu, at, vt in self.parts:
            est = base + cz @ shrinkage(a, mu)
            out.append(float(np.mean((est - at) ** 2) - np.mean(vt)))
        return float(np.mean(out))

    def scale_range(self) -> tuple[float, float]:
        sd = np.concatenate([1.0 / np.sqrt(p[2]) for p in self.parts if p[2].size] or [np.ones(1)])
        return float(sd.min()), float(sd.max())


def cross_validate(
    H: np.ndarray,
    values: np.ndarray,
    variances: np.ndarray,
    total: float | None,
    mass_for: Any,
    *,
    folds: int = 5,
    seed: int = 0,
    grid_points: int = 33,
) -> CVResult | None:
    """k-fold cross-validation of the trade-off ``a`` (Chen, Zhou & Bhowmick (2016), §3.5, Theorem 4).

    Args:
        H: ``m × n`` released queries over atoms; values, variances: their answers and noise.
        total: the exact public total or ``None``.
        mass_for: ``mass_for(train_rows) -> atom masses`` (the prior fitted on the
            training rows only, so test answers stay independent of the fit), or an
            array used for every fold.
        folds: k (capped at m); seed: of the random split.

    Returns:
        ``None`` when fewer than 4 answers are released (nothing to validate on).
    """
    m = int(values.size)
    if m < 4:
        return None
    k = max(2, min(int(folds), m // 2))
    perm = np.random.default_rng(seed).permutation(m)
    groups = np.array_split(perm, k)
    shared = None if callable(mass_for) else np.asarray(mass_for)
    full = (kernel(H, shared), H @ shared) if shared is not None else None
    parts = []
    for test in groups:
        train = np.setdiff1d(perm, test)
        if full is not None:
            Kfull, kufull = full
            K, ku, Kt, kut = Kfull[np.ix_(train, train)], kufull[train], Kfull[np.ix_(test, train)], kufull[test]
        else:
            mass = np.asarray(mass_for(train))
            Htr = H[train]
            K, ku = kernel(Htr, mass), Htr @ mass
            Kt, kut = kernel(H[test], mass, Htr), H[test] @ mass
        f = fit(K, ku, values[train], variances[train], total)
        base, cz = f.terms(Kt, kut)
        parts.append((base, cz, f.mu, values[test], variances[test]))
    cv = _Folds(parts)
    lo, hi = cv.scale_range()
    logs = np.linspace(math.log(lo) - 4.0, math.log(hi) + 4.0, grid_points)
    evals: dict[float, float] = {0.0: cv.mse(0.0), math.inf: cv.mse(math.inf)}
    vals = [cv.mse(math.exp(x)) for x in logs]
    for x, v in zip(logs, vals, strict=True):
        evals[math.exp(x)] = v
    # Ternary (golden-section) search between the grid neighbours of the best grid point.
    i = int(np.argmin(vals))
    left, right = logs[max(i - 1, 0)], logs[min(i + 1, len(logs) - 1)]
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = right - g * (right - left), left + g * (right - left)
    f1, f2 = cv.mse(math.exp(x1)), cv.mse(math.exp(x2))
    for _ in range(40):
        if f1 <= f2:
            right, x2, f2 = x2, x1, f1
            x1 = right - g * (right - left)
            f1 = cv.mse(math.exp(x1))
        else:
            left, x1, f1 = x1, x2, f2
            x2 = left + g * (right - left)
            f2 = cv.mse(math.exp(x2))
        if right - left < 1e-4:
            break
    evals[math.exp(x1)], evals[math.exp(x2)] = f1, f2
    best_a = min(evals, key=lambda a: (evals[a], -_log(a)))
    grid = tuple(sorted(evals.items(), key=lambda kv: _log(kv[0])))
    return CVResult(best_a, evals[best_a], grid, k)
