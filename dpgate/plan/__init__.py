"""Stage "plan": answer from history, or choose the cheapest fresh measurement.

- :mod:`~dpgate.plan.requirement` — the analyst's ``±accuracy`` at ``confidence``, resolved once;
- :mod:`~dpgate.plan.asks` — the confidence a query's k-th interval is planned at (δ-spending);
- :mod:`~dpgate.plan.atoms` — partitions of a table's domain (inference atoms, box grids);
- :mod:`~dpgate.plan.cost_grid` — the cost atoms: a main grid and side grids beyond its limit;
- :mod:`~dpgate.plan.state` — a table's released history on atoms, live and frozen;
- :mod:`~dpgate.plan.seam` — what the extensions (model, warm starts) may use of a gateway;
- :mod:`~dpgate.plan.accounting` — per-cell system cost (Xiao & Xiong, Theorem 5.5), in ε or in ρ;
- :mod:`~dpgate.plan.zcdp` — ρ-zCDP: its per-cell proof, ρ ↔ (ε, δ) conversions, the budget argument;
- :mod:`~dpgate.plan.decide` — history or fresh, per output, and the ε each release charges;
- :mod:`~dpgate.plan.plan` — what a decision returns: the steps and what recording them charges;
- :mod:`~dpgate.plan.explain` — the same decision quoted without doing it.

Nothing here reads the data or writes the ledger.
"""
