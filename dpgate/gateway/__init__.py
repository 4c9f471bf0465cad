"""The gateway: decide, for each compiled query, between history and a fresh measurement.

- :mod:`~dpgate.gateway._gateway` — :class:`Gateway`: queries, quotes, probabilities and the releases
  behind them, each in one ledger transaction;
- :mod:`~dpgate.gateway._extensions` — its warm starts, model-based estimates and synthetic data,
  delegated to :mod:`dpgate.warmstart` and :mod:`dpgate.model`;
- :mod:`~dpgate.gateway._plots` — ``plot_budget`` and ``plot_cells`` (matplotlib, imported on use);
- :mod:`~dpgate.gateway._privacy` — its accounting, pure ε (default) or ρ-zCDP (``privacy="zcdp"``):
  the budget's unit, ``spent_as(delta)``, charges stated as ρ and as ε at δ;
- :mod:`~dpgate.gateway._asks` — per query, which of its intervals an answer is: the level
  (``dpgate.plan.asks``) its intervals are planned at, so that all hold together.

Pipeline of one ``Gateway.query`` call::

    compile_statement ─▶ refine atoms ─▶ plan at the ask's level (history? else the smallest budget)
        ─▶ budget check ─▶ [ledger transaction: re-sync, re-plan, check, measure,
           record, commit] ─▶ BLUE over all history ─▶ Result

Privacy guarantee.  Neighbouring relation: add/remove one person (one row, or the
``max_rows_per_unit`` rows kept of a privacy unit, see ``dpgate.plan.accounting``).
Each fresh measurement of a linear query ``q`` (sensitivity ``S = max|q|``) adds
two-sided geometric noise on the lattice ``γ`` (``dpgate.release.noise``) of scale
``b = S/α``, which is ``α``-DP for ``q`` and costs cell ``j`` ``(α/S)|q_j|``
(Xiao & Xiong, "Bayesian Inference under Differential Privacy", 2012,
Theorem 5.5).  Everything else — answers from history, intervals,
probabilities — is post-processing of released values and costs nothing.  The
*design* (which queries are measured, at which scale) depends only on the
queries and requirements, never on the data, so the BLUE's error law given the
design is exact and the stated intervals cover at their nominal rate.

Extensions (``dpgate.model``, ``dpgate.warmstart.design``) read a table's history only
through :meth:`Gateway.locked_view`, a frozen :class:`~dpgate.plan.state.TableView`,
and release only through :meth:`Gateway.release_measurements`; they never touch
the gateway's private state.  They are typed against
:class:`~dpgate.plan.seam.GatewaySeam`, the part of a gateway they use, and never
import this module; this module imports them.  Model-based answers follow Chen, Zhou &
Bhowmick, "Integrating Historical Noisy Answers for Improving Data Utility
under Differential Privacy" (EDBT 2016); the ISPE warm start and its MMSE
estimator follow Xiao, Xiong & Yuan, "ISPE: Adaptive Differentially Private
Data Release and Query Estimation" (Emory TR-2011-005, 2011).
"""

from dpgate.gateway._gateway import DEFAULT_MAX_OUTPUTS, POLICIES, Gateway, Policy

__all__ = ["DEFAULT_MAX_OUTPUTS", "Gateway", "POLICIES", "Policy"]
