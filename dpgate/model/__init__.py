"""Model-based answers beyond the row space of history: free, biased, labelled.

When the budget is spent, or history does not determine a query, the BLUE of
:mod:`dpgate.inference` has nothing to say.  Chen, Zhou & Bhowmick, "Integrating
Historical Noisy Answers for Improving Data Utility under Differential Privacy"
(EDBT 2016) give two post-processing estimators of *any* linear query from the released
answers alone:

* ``method="pca"`` — :mod:`dpgate.model.pca`: eigen-queries of the prior-weighted
  kernel of past queries, shrunk by ``y_i = a²/(a² + 1/λ_i²)``, with ``a`` chosen
  by k-fold cross-validation (Theorem 4);
* ``method="maxent"`` — :mod:`dpgate.model.maxent`: the maximum-entropy (Gibbs)
  distribution that fits the released answers with soft, box-constrained
  constraints (Theorem 6) — exactly over atoms when they are few, else
  approximately by the stochastic-gradient / Gibbs-sampling scheme of §4.2
  (``solver=``); also draws synthetic rows (:func:`synthesize`).

Privacy: both read only released answers, their noise scales, public query
structure and the public schema (including its optional public row count), through
a gateway's frozen view (:class:`~dpgate.plan.seam.GatewaySeam`), so
they are post-processing: **ε spent = 0**, the ledger is untouched.

Honesty: these answers are *biased* by design and carry **no guaranteed
interval**.  Each :class:`~dpgate.answer.result.Answer` has ``source="model"``,
``epsilon_spent=0``, ``meets_requirement=False``, ``posterior=None``, and
``low/high = value ∓ z·RMSE_cv`` where ``RMSE_cv`` is the cross-validated RMSE of
the method on held-out *past* queries (Theorem 4) and ``z`` the normal quantile of
``confidence``.  That band describes the average error over queries like the
past ones; it is **not** a confidence interval for this query and may miss it
more often than ``confidence`` suggests (e.g. for queries unlike the history).
A stochastic maxent fit answers by Monte Carlo over its Gibbs chains: its
standard error (``model["mc_stderr"]``, per answer) is added in quadrature to the
band.

Example:
    >>> import dpgate, dpgate.datasets
    >>> df, schema = dpgate.datasets.load_pums()
    >>> gw = dpgate.Gateway(df, schema, budget=10.0, seed=0)
    >>> for lo in range(20, 80, 10):
    ...     _ = gw.query(f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {lo + 14}", accuracy=40)
    >>> r = gw.estimate("SELECT COUNT(*) FROM pums WHERE age BETWEEN 33 AND 51")
    >>> r.answer.source, r.answer.epsilon_spent, r.answer.meets_requirement
    ('model', 0.0, False)
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgate._validate import probability
from dpgate.answer.result import Answer, Result
from dpgate.errors import InvalidRequirement, NotEstimable
from dpgate.model import maxent as _maxent
from dpgate.model import pca as _pca
from dpgate.model._released import History, atom_mass, check_marginals, fit_marginals, history_of
from dpgate.model.gibbs import GibbsFit

if TYPE_CHECKING:
    import pandas as pd

    from dpgate.compile.query import LinearQuery
    from dpgate.plan.seam import GatewaySeam

__all__ = ["ModelResult", "estimate", "synthesize", "METHODS"]

#: Estimators accepted by :func:`estimate`.
METHODS = ("pca", "maxent")

# Fitted models per gateway object, keyed by (table, method, options); refitted when history grew.
_CACHE: weakref.WeakKeyDictionary[GatewaySeam, dict[Any, _Fitted]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ModelResult(Result):
    """A :class:`~dpgate.answer.result.Result` of model-based answers, with the fit's diagnostics.

    Attributes:
        model: ``method``, ``m`` (answers used), ``rank``/``atoms``, ``a`` or ``alpha``,
            ``cv_rmse`` (Theorem 4, on held-out past queries), ``folds``, ``prior``
            (``"uniform"``, ``"marginals:<cols>"`` or ``"given"``), ``total`` and where
            it came from, ``fit_seconds``; maxent also ``solver`` (``"exact"`` or
            ``"sgd"``) and, for ``"sgd"``, ``mc_stderr`` (Monte Carlo standard error of
            each answer), ``chains``, ``mc_samples``, ``iterations``, ``converged``.
    """

    model: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Fitted:
    method: str
    m: int
    marginals: dict[str, np.ndarray]
    info: dict[str, Any]
    core: Any  # PCA: (PCAFit, a); maxent: MaxEntFit or GibbsFit


def _options_key(options: Mapping[str, Any]) -> Any:
    out = []
    for k in sorted(options):
        v = options[k]
        if isinstance(v, Mapping):
            v = tuple(sorted((str(c), np.asarray(p, float).tobytes()) for c, p in v.items()))
        out.append((k, v))
    return tuple(out)


def _prior(hist: History, prior: Any) -> tuple[Any, str]:
    """(marginals or a function of training rows, label)."""
    if isinstance(prior, Mapping):
        return check_marginals(hist.table, prior), "given"
    if prior == "uniform":
        return {}, "uniform"
    if prior == "auto":
        marg = fit_marginals(hist)
        return marg, ("marginals:" + ",".join(sorted(marg))) if marg else "uniform"
    raise InvalidRequirement(f"prior must be 'auto', 'uniform' or {{column: cell probabilities}}, got {prior!r}.")


def _fit(hist: History, method: str, options: dict[str, Any]) -> _Fitted:
    t0 = time.perf_counter()
    opts = dict(options)
    prior = opts.pop("prior", "auto")
    folds = int(opts.pop("folds", 5))
    cv_seed = int(opts.pop("cv_seed", 0))
    marginals, prior_label = _prior(hist, prior)
    if method == "pca":
        a_opt = opts.pop("a", "cv")
        if opts:
            raise InvalidRequirement(f"unknown options for method='pca': {sorted(opts)}.")
        mass = atom_mass(hist.table, hist.atoms, marginals)
        if prior == "auto" and marginals:
            def mass_for(rows: np.ndarray) -> np.ndarray:
                return atom_mass(hist.table, hist.atoms, fit_marginals(hist, rows))
        else:
            mass_for = mass  # type: ignore[assignment]
        cv = _pca.cross_validate(hist.H, hist.values, hist.variances, hist.total, mass_for, folds=folds, seed=cv_seed)
        if a_opt == "cv":
            a = cv.a if cv is not None else math.inf
        else:
            a = float(a_opt)
            if not a >= 0:
                raise InvalidRequirement(f"a must be 'cv' or a number ≥ 0 (inf allowed), got {a_opt!r}.")
        f = _pca.fit(_pca.kernel(hist.H, mass), hist.H @ mass, hist.values, hist.variances, hist.total)
        mse = None if cv is None else (cv.mse if a_opt == "cv" else _pca_cv_at(cv, a))
        info = dict(method="pca", a=a, rank=f.rank, folds=None if cv is None else cv.folds,
                    cv_rmse=math.nan if mse is None else math.sqrt(max(mse, 0.0)),
                    cv_curve=None if cv is None else cv.grid)
        core: Any = (f, a)
    else:
        mf = _maxent.fit_with_cv(hist, marginals, folds=folds, seed=cv_seed,
                                 auto_prior=prior == "auto" and bool(marginals), **opts)
        info = dict(method="maxent", **mf.info)
        core = mf
    info.update(m=hist.m, atoms=hist.atoms.n_atoms, prior=prior_label, fit_seconds=time.perf_counter() - t0)
    if "total" not in info:
        info.update(total=hist.total, total_source="public" if hist.total is not None else None)
    return _Fitted(method, hist.m, marginals, info, core)


def _pca_cv_at(cv: _pca.CVResult, a: float) -> float:
    return cv.mse_at(a)


def _model(gw: GatewaySeam, hist: History, method: str, options: dict[str, Any]) -> _Fitted:
    cache = _CACHE.setdefault(gw, {})
    options = {"prior": "auto", "folds": 5, "cv_seed": 0, **options}
    options.setdefault("a" if method == "pca" else "alpha", "cv")
    key = (hist.table.name.lower(), method, _options_key(options))
    got = cache.get(key)
    if got is None or got.m != hist.m:
        got = cache[key] = _fit(hist, method, options)
    return got


def _predict(
    fitted: _Fitted, hist: History, queries: tuple[LinearQuery, ...]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Model answers to ``queries`` and, for a stochastic fit, their Monte Carlo standard errors."""
    if isinstance(fitted.core, GibbsFit):
        return fitted.core.expect(queries)  # rows of cells: no atom vectors, no prior mass over atoms
    Q = np.array([hist.atoms.vector(q) for q in queries])
    mass = atom_mass(hist.table, hist.atoms, fitted.marginals)
    H = hist.H[: fitted.m]
    if fitted.method == "pca":
        f, a = fitted.core
        base, cz = f.terms(_pca.kernel(Q, mass, H), Q @ mass)
        return base + cz @ _pca.shrinkage(a, f.mu), None
    return fitted.core.predict(H, mass, Q), None


def estimate(
    gw: GatewaySeam,
    sql: str,
    method: str = "pca",
    *,
    confidence: float = 0.95,
    accuracy: float | None = None,
    params: Any = None,
    **options: Any,
) -> ModelResult:
    """Model-based answers for every output of ``sql``; see :meth:`dpgate.Gateway.estimate`."""
    if method not in METHODS:
        raise InvalidRequirement(f"method must be one of {list(METHODS)}, got {method!r}.")
    confidence = probability(confidence, "confidence", error=InvalidRequirement)
    stmt = gw.compile(sql, params)
    # Under the gateway lock: fits of one gateway run one at a time against its cache.
    with gw.locked_view(stmt.table, stmt.queries) as view:
        hist = history_of(view)
        if hist.m == 0 and hist.total is None:
            raise NotEstimable(
                f"nothing has been released about table {stmt.table!r} yet and it declares no public row "
                "count, so a model has nothing to learn from; ask gw.query(...) first."
            )
        fitted = _model(gw, hist, method, options)
        values, mc_se = _predict(fitted, hist, stmt.queries)
    rmse = float(fitted.info.get("cv_rmse", math.nan))
    # Theorem 4's unbiased MSE estimate can come out ≤ 0 (clipped to 0); a zero-width
    # band would claim certainty, so an unusable estimate gives an unbounded band.
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    rmse = rmse if math.isfinite(rmse) and rmse > 0 else math.inf
    halves = z * (rmse if mc_se is None else np.hypot(rmse, mc_se)) * np.ones(len(stmt.queries))
    acc = math.nan if accuracy is None else float(accuracy)
    answers = []
    for q, v, half in zip(stmt.queries, values, halves.tolist(), strict=True):
        off = float(q.offset)
        if q.is_zero:
            answers.append(Answer(off, off, off, confidence, acc, "exact", 0.0, label=q.label, group=q.group, query=q))
            continue
        val = float(v) + off
        answers.append(Answer(val, val - half, val + half, confidence, acc, "model", 0.0, posterior=None,
                              meets_requirement=False, label=q.label, group=q.group, query=q))
    info = dict(fitted.info)
    if mc_se is not None:
        info["mc_stderr"] = tuple(float(s) for s in mc_se)
    return ModelResult(tuple(answers), stmt, 0.0, model=info)


def synthesize(gw: GatewaySeam, table: str | None = None, rows: int | None = None, seed: int | None = None,
               **options: Any) -> pd.DataFrame:
    """A synthetic table drawn from the maximum-entropy model; see :meth:`dpgate.Gateway.synthesize`."""
    from dpgate.model._synth import sample_frame, sample_frame_gibbs

    if table is None:
        if len(gw.schema.tables) != 1:
            raise InvalidRequirement(
                f"the schema declares {len(gw.schema.tables)} tables; pass table= (one of "
                f"{[t.name for t in gw.schema.tables]})."
            )
        table = gw.schema.tables[0].name
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0):
        raise InvalidRequirement(f"rows must be a non-negative integer, got {rows!r}.")
    declared = gw.schema.table(table)
    if declared.privacy_unit is not None and declared.max_rows_per_unit != 1:
        raise NotEstimable(
            f"table {declared.name!r} has up to {declared.max_rows_per_unit} rows per {declared.privacy_unit}: "
            f"synthetic rows are drawn one by one, with no {declared.privacy_unit} tying them together, so they "
            f"would not be a table of {declared.privacy_unit}s; synthesize refuses it. Ask the counts you need with "
            "query() (or estimate(), free from history), or synthesize a table with one row per unit."
        )
    with gw.locked_view(table) as view:
        hist = history_of(view)
        if hist.m == 0 and hist.total is None and rows is None:
            raise NotEstimable(
                f"nothing has been released about table {table!r} and it declares no public row count; "
                "pass rows= or release some answers first."
            )
        fitted = _model(gw, hist, "maxent", options)
        if isinstance(fitted.core, GibbsFit):  # rows straight from its chains: no atoms
            return sample_frame_gibbs(hist, fitted.core, rows, seed, dict(fitted.info))
        mass = atom_mass(hist.table, hist.atoms, fitted.marginals)
        p = fitted.core.probabilities(hist.H[: fitted.m], mass)
        return sample_frame(hist, p, mass, fitted.marginals, fitted.core, rows, seed, dict(fitted.info))
