"""Running the online workload of Xiao & Xiong, "Bayesian Inference under
Differential Privacy" (2012), §6.4, through gateways: one query at a time
(:func:`run`), the unbounded setting's tree first (:func:`release_tree`), and one
workload through the three compared systems (:func:`run_systems`).

The gateways here use seeded noise (``seed=``): reproducible and **insecure**,
for demonstrations and benchmarks only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from dpgate import datasets
from dpgate._demo._optional import require
from dpgate._demo.metrics import QueryRecord, summarize
from dpgate._demo.workload import Setting, Workload, WorkloadQuery, generate
from dpgate.answer.result import Result
from dpgate.compile import compile_sql
from dpgate.errors import BudgetExhausted, DPGateInternalError
from dpgate.gateway import Gateway, Policy
from dpgate.schema.domains import Schema

__all__ = ["QueryGateway", "SYSTEMS", "release_tree", "run", "noise_seed", "load_histogram", "run_systems"]

#: The systems the demo and the benchmarks compare: (label, gateway policy).
SYSTEMS: tuple[tuple[str, Policy], ...] = (("no-reuse", "no_reuse"), ("paper", "paper"), ("minimal", "minimal"))


class QueryGateway(Protocol):
    """What :func:`run` needs of a gateway: :meth:`dpgate.Gateway.query` and ``spent``
    (a protocol, so the tests can drive :func:`run` with a stand-in)."""

    @property
    def spent(self) -> float: ...

    def query(self, sql: str, accuracy: float | None = None, confidence: float | None = None) -> Result: ...


def release_tree(gateway: Gateway, workload: Workload, table: str, column: str = "value") -> int:
    """Release the unbounded setting's tree through ``gateway``; returns the node count.

    Every node is compiled from its SQL and released in one batch at its budget
    ``α`` through :meth:`dpgate.Gateway.release_measurements` (the warm-start API):
    each node is a fresh release of a range count (sensitivity 1) with noise of
    scale ``1/α``, recorded in the ledger like any other, and the system cost
    rises by the tree's ε (0.3: every cell lies in one node per level).
    """
    if not workload.tree:
        return 0
    batch = []
    for node in workload.tree:
        (q,) = compile_sql(node.sql(table, column), gateway.schema)
        batch.append((q, node.alpha))
    gateway.release_measurements(table, batch, label="hierarchical tree")
    return len(batch)


def run(
    gateway: QueryGateway,
    queries: Iterable[WorkloadQuery],
    histogram: np.ndarray,
    table: str,
    column: str = "value",
    *,
    style: Literal["case", "filter"] = "case",
    on_record: Callable[[QueryRecord], None] | None = None,
) -> list[QueryRecord]:
    """Send every query through ``gateway.query`` and record what came back.

    ``BudgetExhausted`` is recorded as ``source="refused"`` (the bounded system's
    end of life); every other error propagates.  The truth is computed from
    ``histogram`` for the metrics only; it never reaches the gateway.
    """
    records: list[QueryRecord] = []
    for wq in queries:
        truth = wq.truth(histogram)
        sql = wq.sql(table, column, style)
        t0 = time.perf_counter()
        try:
            a = gateway.query(sql, accuracy=wq.accuracy, confidence=wq.confidence).answer
        except BudgetExhausted:
            dt = time.perf_counter() - t0
            rec = QueryRecord(wq.index, truth, wq.accuracy, wq.confidence, "refused", spent=gateway.spent, seconds=dt)
        else:
            dt = time.perf_counter() - t0
            rec = QueryRecord(
                wq.index, truth, wq.accuracy, wq.confidence, a.source, float(a.value), float(a.low), float(a.high),
                bool(a.meets_requirement), float(a.epsilon_spent), gateway.spent, dt,
            )
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    return records


def noise_seed(seed: int, system: int) -> int:
    """The gateway noise seed of system number ``system`` in run ``seed`` (reproducible, insecure)."""
    return int(np.random.SeedSequence([seed, system, 1]).generate_state(1)[0])


def load_histogram(dataset: str) -> tuple[Any, Schema, np.ndarray, str]:
    """``(frame, schema, histogram, table name)`` of an embedded 1-D data set
    (``dpgate.datasets.load_histogram``); the histogram is for computing truths only."""
    df, schema = datasets.load_histogram(dataset)
    table = schema.tables[0]
    col = table.column("value")
    if col.min is None or col.max is None:
        raise DPGateInternalError(f"The embedded data set {dataset!r} declares no range for its column 'value'")
    n = col.max - col.min + 1
    hist = np.bincount(np.asarray(df["value"], dtype=np.int64) - col.min, minlength=n)[:n]
    return df, schema, hist, table.name


def run_systems(
    dataset: str,
    setting: Setting,
    queries: int,
    seed: int,
    *,
    systems: Sequence[tuple[str, Policy]] = SYSTEMS,
    progress: bool = False,
    loaded: tuple[Any, Schema, np.ndarray, str] | None = None,
) -> dict[str, Any]:
    """Run one generated workload through every system, each on a fresh gateway.

    Same data and queries for every system; each has its own seeded (insecure)
    noise.  In the unbounded setting each gateway first releases the tree
    (:func:`release_tree`), so ᾱ includes its ε = 0.3 in every system.
    The progress bar needs ``tqdm`` (the ``demo`` extra).

    Returns:
        ``{"dataset", "setting", "queries", "seed", "systems": {label: {"summary", "records"}}}``
        with records as dicts (:meth:`QueryRecord.as_dict`).
    """
    tqdm = require("tqdm", "The demo's progress bar").tqdm
    df, schema, hist, table = loaded or load_histogram(dataset)
    wl = generate(n=len(hist), queries=queries, setting=setting, seed=seed)
    total = len(systems) * (len(wl.queries) + len(wl.tree))
    out: dict[str, Any] = {"dataset": dataset, "setting": setting, "queries": queries, "seed": seed, "systems": {}}
    with tqdm(total=total, disable=not progress, file=sys.stderr, unit="q", leave=False) as bar:
        for k, (label, policy) in enumerate(systems):
            bar.set_description(label)
            gw = Gateway(df, schema, budget=wl.gateway_budget, policy=policy, seed=noise_seed(seed, k))
            try:
                t0 = time.perf_counter()
                release_tree(gw, wl, table)
                bar.update(len(wl.tree))
                tree_seconds, tree_cost = time.perf_counter() - t0, gw.spent
                t0 = time.perf_counter()
                recs = run(gw, wl.queries, hist, table, on_record=lambda _r: bar.update(1))
                run_seconds = time.perf_counter() - t0
            finally:
                gw.close()
            summary: dict[str, Any] = dict(summarize(recs))
            summary.update(tree_cost=tree_cost, tree_seconds=tree_seconds, run_seconds=run_seconds, policy=policy)
            out["systems"][label] = {"summary": summary, "records": [r.as_dict() for r in recs]}
    return out
