"""The maximum-entropy model of the table, fitted to released answers.

From Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for Improving
Data Utility under Differential Privacy" (EDBT 2016), §4.

Post-processing only (no data read, ε spent = 0).  The model is a distribution
``p`` over the table's cells that maximises entropy relative to a prior ``p₀``
(uniform, or the product of fitted 1-D marginals, §4.3) while paying
``β_i |π_i − p[f_i]|`` for disagreeing with each released answer (Eq. 26/41), with

* ``f_i = q_i / S_i`` (features scaled by the sensitivity, so all lie in [−1, 1]),
  ``π_i = a_i / (N S_i)``, ``N`` the row count;
* ``β_i = α N S_i / b_i = α N ε_i`` — the Laplace log-likelihood of the answer
  (Eq. 29–30) weighted by the trade-off ``α`` (``α = 1``: the MAP of Theorem 5).

By Theorem 6 the optimum is the Gibbs distribution ``p_w ∝ p₀ exp(Σ w_i f_i)`` with
``w`` solving the box-constrained dual ``max_{|w_i| ≤ β_i} Σ w_i π_i − ln Z_w``.
Two solvers (``solver=``; ``"auto"``, the default, picks by the atom count):

* ``"exact"`` (:func:`fit`) — every ``f_i`` is constant on each atom, so ``p_w`` is
  uniform (relative to ``p₀``) inside an atom and the dual is exact on atoms:
  ``Z_w = Σ_atoms mass · exp(Fᵀw)``, solved by L-BFGS-B (``O(m · atoms)`` per
  iteration).  Used up to ``max_atoms`` atoms (default :data:`MAX_ATOMS` = 100 000).
* ``"sgd"`` (:func:`dpgate.model.gibbs.fit_sgd`) — the paper's stochastic-gradient / Gibbs-sampling scheme
  (§4.2), used beyond ``max_atoms``: batches of Metropolis-within-Gibbs chains over
  rows of cells (never a vector over the domain or the atoms) estimate ``p_w[f_i]``,
  and ``w_i ← clip(w_i + γ_i (π_i − f̄_i), ±β_i)``.  It is **approximate**: answers
  are Monte Carlo averages over the chains (their standard error is reported) and
  the optimisation stops at a stochastic convergence test or an iteration cap
  (``info["converged"]`` says which).  Exact linear dependencies among queries on
  the same columns (a GROUP BY's groups sum to one row) are followed in closed form;
  other nearly flat directions of the dual converge at stochastic-gradient pace.  On
  small domains its answers agree with the exact fit's to within a few Monte Carlo
  standard errors plus half an answer's noise scale (``tests/model/test_model_maxent.py``).
  Cost per iteration ``O(chains · m)``, independent of the domain and the atoms.
  Synthetic rows come from the same chains.

``N``: the public row count when declared, else the BLUE of ``COUNT(*)`` from
history when it is estimable; otherwise the model refuses.

The cross-validated RMSE (Theorem 4, k folds) summarises accuracy on held-out past
queries, as for the PCA estimator; ``alpha="cv"`` (the default) also chooses
``α`` by it among :data:`ALPHA_GRID` (each fold's fits warm-start from the previous
``α``).  With fewer than 4 released answers there is nothing to validate on: the
default falls back to ``α = 1`` (the MAP of Theorem 5) and ``cv_rmse`` is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpgate._validate import real
from dpgate.errors import InvalidRequirement, NotEstimable
from dpgate.model._released import History, atom_mass, fit_marginals
from dpgate.model.gibbs import MC_DRAWS, SGD_MAX_ITER, GibbsFit, fit_sgd, kkt_violation

__all__ = ["MaxEntFit", "GibbsFit", "fit", "fit_sgd", "fit_with_cv", "ALPHA_GRID", "MAX_ATOMS", "SOLVERS"]

#: ``solver=`` values of :func:`fit_with_cv`.
SOLVERS = ("auto", "exact", "sgd")
#: Default bound on the atom count of an exact fit (``solver="auto"`` goes stochastic beyond it).
MAX_ATOMS = 100_000
#: Largest KKT violation accepted (in units of π = answer / (N·S); noise is ~1e-2 there).
KKT_TOL = 1e-7
#: Trade-offs tried by ``alpha="cv"``.
ALPHA_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def _lse(t: np.ndarray) -> tuple[float, np.ndarray]:
    mx = float(t.max())
    e = np.exp(t - mx)
    s = float(e.sum())
    return mx + math.log(s), e / s


@dataclass(frozen=True)
class MaxEntFit:
    """A fitted Gibbs distribution ``p_w ∝ mass · exp(Σ w_i q_i/S_i)`` over atoms.

    Attributes:
        w: dual weights (one per released answer used).
        sensitivities: ``S_i`` of those answers.
        total: ``N``.
        info: diagnostics (``alpha``, ``total_source``, ``iterations``, ``converged``,
            ``at_bound`` (answers whose constraint is soft-active), ``cv_rmse``, …).
    """

    w: np.ndarray = field(repr=False)
    sensitivities: np.ndarray = field(repr=False)
    total: float
    info: dict[str, Any] = field(default_factory=dict)

    def probabilities(self, H: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``p_w`` over the atoms on which ``H`` (the same released queries) is given."""
        F = H / self.sensitivities[:, None]
        _, p = _lse(F.T @ self.w + np.log(mass))
        return p

    def predict(self, H: np.ndarray, mass: np.ndarray, Q: np.ndarray) -> np.ndarray:
        """``N · Σ_atoms p_w q`` for each row of ``Q`` (over the same atoms)."""
        return self.total * (np.atleast_2d(Q) @ self.probabilities(H, mass))


def fit(
    H: np.ndarray,
    values: np.ndarray,
    scales: np.ndarray,
    sensitivities: np.ndarray,
    mass: np.ndarray,
    total: float,
    alpha: float = 1.0,
    *,
    maxiter: int = 20_000,
    w0: np.ndarray | None = None,
) -> MaxEntFit:
    """Solve the dual of Theorem 6 by L-BFGS-B (exact on atoms)."""
    from scipy.optimize import minimize

    S = np.asarray(sensitivities, dtype=float)
    F = H / S[:, None]
    pi = np.asarray(values, dtype=float) / (total * S)
    beta = alpha * total * S / np.asarray(scales, dtype=float)
    logm = np.log(mass)

    def f(w: np.ndarray) -> tuple[float, np.ndarray]:
        lz, p = _lse(F.T @ w + logm)
        return lz - float(w @ pi), F @ p - pi

    m = pi.size
    if m == 0:
        return MaxEntFit(np.zeros(0), S, float(total), dict(iterations=0, converged=True, at_bound=0))
    x = np.zeros(m) if w0 is None else np.clip(w0, -beta, beta)
    iterations, pg = 0, math.inf
    for _ in range(6):  # L-BFGS-B can stop early on a flat step: restart until the KKT check passes
        res = minimize(f, x, jac=True, method="L-BFGS-B", bounds=list(zip(-beta, beta, strict=True)),
                       options=dict(maxiter=maxiter, maxfun=2 * maxiter, ftol=1e-15, gtol=1e-9, maxcor=20))
        x, iterations = res.x, iterations + int(res.nit)
        pg = _projected_gradient(x, f(x)[1], beta)
        if pg <= KKT_TOL:
            break
    at_bound = int(np.sum(np.abs(x) >= beta * (1 - 1e-6)))
    return MaxEntFit(x, S, float(total),
                     dict(iterations=iterations, converged=bool(pg <= KKT_TOL), kkt_residual=pg, at_bound=at_bound))


def _projected_gradient(w: np.ndarray, g: np.ndarray, beta: np.ndarray) -> float:
    """Largest violation of the KKT conditions of the box-constrained dual (π units).

    ``g`` is the gradient of the minimised objective ``ln Z_w − w·π``, i.e. ``p_w[f] − π``.
    """
    return float(kkt_violation(w, -g, beta).max(initial=0.0))


def _total(hist: History) -> tuple[float, str]:
    if hist.total is not None:
        return hist.total, "public"
    if hist.blue_total is not None and hist.blue_total > 0:
        return hist.blue_total, "estimated (BLUE of COUNT(*) from history)"
    raise NotEstimable(
        f"the maximum-entropy model needs the row count of table {hist.table.name!r}: declare a public "
        "'rows' in the schema, or release COUNT(*) (or queries that determine it) first."
    )


#: ``fit_fold(train, test, prior, alpha, w0) → (w, estimates of the test answers, their Monte Carlo variance)``.
_FoldFit = Callable[[np.ndarray, np.ndarray, Any, float, "np.ndarray | None"],
                    "tuple[np.ndarray, np.ndarray, np.ndarray]"]


def _cv_mse(hist: History, fold_prior: Callable[[np.ndarray], Any], fit_fold: _FoldFit, alphas: tuple[float, ...],
            folds: int, seed: int) -> tuple[list[float], int] | None:
    """Theorem 4 MSE estimate for each α, ascending; each fold warm-starts from its previous α.

    A stochastic fold fit's Monte Carlo variance is subtracted like the release noise:
    the estimate is of the model's error, to which the final fit adds its own (smaller)
    Monte Carlo error per answer.

    Like the paper's ternary search this assumes the CV error is unimodal in α: the
    scan stops once it has risen twice in a row (larger α also fit slowest).
    """
    m = hist.m
    if m < 4:
        return None
    k = max(2, min(folds, m // 2))
    perm = np.random.default_rng(seed).permutation(m)
    splits = []
    for test in np.array_split(perm, k):
        train = np.setdiff1d(perm, test)
        splits.append((train, test, fold_prior(train)))
    warm: list[np.ndarray | None] = [None] * k
    scores: list[float] = []
    for alpha in alphas:
        per_fold = []
        for f_i, (train, test, prior) in enumerate(splits):
            warm[f_i], est, mc_var = fit_fold(train, test, prior, alpha, warm[f_i])
            per_fold.append(float(np.mean((est - hist.values[test]) ** 2) - np.mean(hist.variances[test])
                                  - np.mean(mc_var)))
        scores.append(float(np.mean(per_fold)))
        if len(scores) >= 3 and scores[-1] > scores[-2] > scores[-3]:
            break
    return scores, k


def fit_with_cv(
    hist: History,
    marginals: dict[str, np.ndarray],
    *,
    folds: int = 5,
    seed: int = 0,
    alpha: float | str = "cv",
    max_atoms: int = MAX_ATOMS,
    auto_prior: bool | None = None,
    solver: str = "auto",
) -> MaxEntFit | GibbsFit:
    """Fit on all answers; cross-validate (and, with ``alpha="cv"``, choose α on :data:`ALPHA_GRID`).

    ``solver``: ``"exact"`` (:func:`fit` on atoms, whatever their number), ``"sgd"``
    (:func:`fit_sgd`; every fold's fit and the final one seeded from ``seed``, the folds'
    with a quarter of the iterations and draws — their Monte Carlo variance is subtracted
    from the CV error) or ``"auto"``: exact up to ``max_atoms`` atoms, stochastic beyond.
    With ``alpha="cv"`` the stochastic path costs about ``folds × len(ALPHA_GRID)`` small
    fits (tens of seconds for the 64-answer PUMS workload of the tests, against under a
    second for the exact fit).
    """
    if solver not in SOLVERS:
        raise InvalidRequirement(f"solver must be one of {list(SOLVERS)}, got {solver!r}.")
    n = hist.atoms.n_atoms
    sgd = solver == "sgd" or (solver == "auto" and n > max_atoms)
    total, source = _total(hist)
    auto = bool(marginals) if auto_prior is None else auto_prior
    if sgd:
        queries = hist.queries

        def fold_prior(train: np.ndarray) -> Any:
            return fit_marginals(hist, train) if auto else marginals

        def fit_fold(train: np.ndarray, test: np.ndarray, prior: Any, a: float,
                     w0: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            fr = fit_sgd(hist.table, [queries[i] for i in train], hist.values[train], hist.scales[train],
                         hist.sensitivities[train], prior, total, a, seed=seed + 1 + int(test[0]), w0=w0,
                         max_iter=SGD_MAX_ITER // 4, draws=MC_DRAWS // 4)
            est, se = fr.expect([queries[i] for i in test])
            return fr.w, est, se**2
    else:
        mass = atom_mass(hist.table, hist.atoms, marginals)

        def fold_prior(train: np.ndarray) -> Any:
            return atom_mass(hist.table, hist.atoms, fit_marginals(hist, train)) if auto else mass

        def fit_fold(train: np.ndarray, test: np.ndarray, prior: Any, a: float,
                     w0: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            fr = fit(hist.H[train], hist.values[train], hist.scales[train], hist.sensitivities[train], prior,
                     total, a, w0=w0)
            return fr.w, fr.predict(hist.H[train], prior, hist.H[test]), np.zeros(len(test))

    if alpha == "cv":
        got = _cv_mse(hist, fold_prior, fit_fold, ALPHA_GRID, folds, seed)
        if got is None:
            chosen, cv, curve = 1.0, None, None
        else:
            i = int(np.argmin(got[0]))
            chosen, cv = ALPHA_GRID[i], (got[0][i], got[1])
            curve = tuple(zip(ALPHA_GRID, got[0], strict=False))  # stops where the scan stopped
    else:
        chosen = real(alpha, "alpha (a positive number or 'cv')", error=InvalidRequirement)
        if not chosen > 0:  # any positive value, inf included
            raise InvalidRequirement(f"alpha must be a positive number or 'cv', got {alpha!r}.")
        one = _cv_mse(hist, fold_prior, fit_fold, (chosen,), folds, seed)
        cv = None if one is None else (one[0][0], one[1])
        curve = None
    extra = dict(alpha=chosen, total=total, total_source=source,
                 cv_rmse=math.nan if cv is None else math.sqrt(max(cv[0], 0.0)),
                 folds=None if cv is None else cv[1], cv_curve=curve)
    if sgd:
        gf = fit_sgd(hist.table, hist.queries, hist.values, hist.scales, hist.sensitivities, marginals, total,
                     chosen, seed=seed)
        return replace(gf, info=dict(gf.info, **extra))
    fr = fit(hist.H, hist.values, hist.scales, hist.sensitivities, mass, total, chosen)
    return MaxEntFit(fr.w, fr.sensitivities, fr.total, dict(fr.info, solver="exact", **extra))
