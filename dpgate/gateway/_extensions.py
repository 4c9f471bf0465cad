"""A gateway's warm starts, model-based estimates and synthetic data (mixed into :class:`~dpgate.Gateway`).

Thin: each method checks its arguments, delegates to :mod:`dpgate.warmstart` or
:mod:`dpgate.model` — which see the gateway only as a
:class:`~dpgate.plan.seam.GatewaySeam` — and flags its answers' security from the
table's history.  Model-based answers follow Chen, Zhou & Bhowmick, "Integrating
Historical Noisy Answers for Improving Data Utility under Differential Privacy"
(EDBT 2016); the ISPE warm start and its MMSE estimator follow Xiao, Xiong & Yuan,
"ISPE: Adaptive Differentially Private Data Release and Query Estimation" (Emory
TR-2011-005, 2011).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from dpgate import _progress, model
from dpgate._blas import single_threaded
from dpgate.answer.result import Result
from dpgate.compile import MODEL_METHODS, CompiledStatement
from dpgate.compile.derived import refuse_derived
from dpgate.errors import InvalidRequirement
from dpgate.gateway._plots import Plots
from dpgate.ledger._history import LedgerHistory
from dpgate.plan.seam import GatewaySeam
from dpgate.warmstart import design as warmstart

if TYPE_CHECKING:
    import pandas as pd

# Plots: Gateway's other mixin, imported with this one (gateway.py is at its size limit).
__all__ = ["Extensions", "Plots"]

_R = TypeVar("_R", bound=Result)


class Extensions:
    """The model-based and warm-start methods of :class:`~dpgate.Gateway` (a mixin: it holds no state
    of its own and reads only the gateway attributes declared here)."""

    _history: LedgerHistory
    _lock: threading.RLock
    _ispe_releases: list[warmstart.WarmStart]

    if TYPE_CHECKING:
        def compile(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> CompiledStatement:
            ...

    def _seam(self) -> GatewaySeam:
        """This gateway as the extensions see it (every ``Gateway`` is a ``GatewaySeam``)."""
        return cast(GatewaySeam, self)

    def warm_start(
        self, strategy: str, epsilon: float, columns: str | Sequence[str], *, table: str | None = None, **options: Any
    ) -> warmstart.WarmStart:
        """**Spends budget**: ``epsilon`` up front on a designed release that later queries reuse for free.

        ``strategy`` is ``"identity"``, ``"hierarchical"`` or ``"ispe"``; the strategies, their
        options, the privacy proof and what intervals mean afterwards are documented on
        :func:`dpgate.warmstart.warm_start`.  Returns a :class:`dpgate.warmstart.WarmStart`.

        Raises:
            InvalidRequirement: bad strategy, ε, columns or option (nothing read, nothing spent).
            InvalidArgument: a malformed ISPE smoothing or connectivity option (nothing read, nothing spent).
            BudgetExhausted: ``k·ε`` exceeds what remains (nothing read, nothing spent).
        """
        with _progress.working(f"{strategy} warm start"):
            release = warmstart.warm_start(self._seam(), strategy, epsilon, columns, table=table, **options)
        if release.strategy == "ispe":
            with self._lock:
                self._ispe_releases.append(release)
        return release

    # -- model-based answers (Chen, Zhou & Bhowmick (2016); dpgate.model) -------------
    @single_threaded
    def estimate(self, sql: str, method: str = "pca", *, confidence: float = 0.95, params: Any = None,
                 **options: Any) -> model.ModelResult | Result:
        """Biased model-based answers from history alone (Chen, Zhou & Bhowmick (2016)): free, never charged.

        For queries history does not pin down (or when the budget is spent).  Reads only
        released answers, their scales, public query structure and the public schema, so
        it is post-processing: nothing is spent and the ledger is unchanged.

        Args:
            sql: one SELECT of linear aggregates, as for :meth:`query`.
            method: ``"pca"`` (kernel-PCA with cross-validated shrinkage ``a``),
                ``"maxent"`` (maximum-entropy Gibbs model) or ``"mmse"`` (the MMSE with
                neighbourhood reference of Xiao, Xiong & Yuan (2011), §4, over an ISPE warm start; see
                ``dpgate.warmstart.design.mmse_estimate``).  SQL clients choose it with the
                hint ``/*+ dpgate method=mmse */`` or ``SET dpgate.method = mmse``.
            confidence: sets the width of the *heuristic* band below.
            **options: ``prior`` (``"auto"``: 1-D marginals fitted to released 1-D queries,
                ``"uniform"``, or ``{column: cell probabilities}``), ``folds``, ``cv_seed``;
                pca: ``a`` (``"cv"`` or a number, ``inf`` = unbiased projection);
                maxent: ``alpha`` (number or ``"cv"``), ``solver`` (``"auto"``: exact over
                atoms up to ``max_atoms``, default 100 000, else the approximate
                stochastic-gradient / Gibbs-sampling fit of Chen, Zhou & Bhowmick (2016), §4.2;
                ``"exact"``; ``"sgd"``), ``max_atoms``;
                mmse: ``release`` (a ``WarmStart``; default the latest ISPE warm start
                this gateway object made whose grid holds the query's columns),
                ``neighbours`` (default True).

        Returns:
            A ``dpgate.model.ModelResult`` (a ``Result`` with ``.model`` diagnostics) whose
            answers have ``source="model"``, ``epsilon_spent=0``, ``meets_requirement=False``,
            ``posterior=None`` and ``low/high = value ∓ z·RMSE_cv``: the cross-validated RMSE
            on held-out past queries (Chen, Zhou & Bhowmick (2016), Theorem 4); for a stochastic
            maxent fit, ``z·√(RMSE_cv² + mc_stderr²)`` with the Monte Carlo error per answer in
            ``.model``.  **Not a guaranteed interval**: it is an average error scale, and
            can be far too narrow for unusual queries.
        """
        if method not in MODEL_METHODS:
            raise InvalidRequirement(f"method must be one of {', '.join(map(repr, MODEL_METHODS))}, got {method!r}.")
        refuse_derived(self.compile(sql, params), "model-based estimates")
        if method == "mmse":
            release = options.pop("release", None) or self._ispe_release_for(sql, params)
            return self._flag_security(
                warmstart.mmse_estimate(self._seam(), sql, release, confidence=confidence, params=params, **options)
            )
        with _progress.working(f"fitting the {method} model"):
            return self._flag_security(model.estimate(self._seam(), sql, method, confidence=confidence, params=params, **options))

    def _flag_security(self, result: _R) -> _R:
        """``result`` with ``Answer.secure`` set from its table's history (model answers are
        post-processing of every release of the table)."""
        secure = self._history.secure(result.statement.table)
        return replace(result, answers=tuple(replace(a, secure=secure) for a in result.answers))

    def _ispe_release_for(self, sql: str, params: Any) -> warmstart.WarmStart:
        """The latest ISPE warm start of this object whose grid holds every column ``sql`` uses."""
        stmt = self.compile(sql, params)
        used = {c.lower() for q in stmt.queries for c in q.columns}
        with self._lock:
            for ispe in reversed(self._ispe_releases):
                if ispe.table.lower() == stmt.table.lower() and used <= {c.lower() for c in ispe.columns}:
                    return ispe
        raise InvalidRequirement(
            f"method 'mmse' needs an ISPE warm start over the columns {sorted(used)} of table {stmt.table!r} made "
            "by this gateway object: call gw.warm_start('ispe', epsilon, columns) first (a warm start recorded "
            "by another process cannot be reused: its partition is not in the ledger)."
        )

    @single_threaded
    def synthesize(self, table: str | None = None, rows: int | None = None, seed: int | None = None,
                   **options: Any) -> pd.DataFrame:
        """A synthetic pandas DataFrame from the maximum-entropy model (Chen, Zhou & Bhowmick (2016), §4).

        Post-processing of released answers: nothing is spent, the ledger is unchanged.
        Columns follow the schema exactly (``dpgate.model._synth`` lists the value emitted
        per cell kind; the categorical ``other`` cell gives the literal ``"<other>"``).

        Args:
            table: the table (optional when the schema has one).
            rows: rows to draw; default the public ``Table.rows``, else the model's estimated
                total (``df.attrs["dpgate"]["rows_source"]`` says which).
            seed: of the sampler (sampling needs no secure randomness).
            **options: as for :meth:`estimate` with ``method="maxent"``.
        """
        with _progress.working("synthesizing"):
            return model.synthesize(self._seam(), table, rows, seed, **options)
