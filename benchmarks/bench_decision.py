"""Decision latency of ``Gateway.query`` on the NETTRACE online workload of
Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012), §6.4.

For each history size H (1 000 and 10 000 released answers):

1. a gateway (policy "minimal", in-memory ledger, seeded noise, budget 1e9)
   releases H workload queries with ``policy="no_reuse"`` (one fresh release
   each, the cheapest way to build a history of exactly H answers; these
   releases' latency is reported as "build");
2. ``--probe`` further workload queries (unbounded requirements,
   2ε ~ U[50, 1000]) are timed — with this much history nearly all come from
   history;
3. ``--probe-fresh`` queries with tight requirements (2ε ~ U[0.2, 2]) are timed —
   history cannot meet them, so they are measured afresh at the minimal budget.

Latency is the wall-clock time of one ``gw.query`` call (compile, atoms,
BLUE, exact error law, decision, and for fresh answers: budget check, exact
count in DuckDB, noise, ledger commit).  Reported p50/p95 by the answer's
actual source.  Targets (gateway issue): p50 ≤ 5 ms from history at H = 1 000,
≤ 50 ms at H = 10 000.  An extra row times fresh answers with a durable file
ledger (one fsync per commit) at H = 1 000.

Writes ``benchmarks/results/decision.json`` and ``decision.md``.

Usage::

    python benchmarks/bench_decision.py [--sizes 1000,10000] [--probe 300] [--probe-fresh 100] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

import numpy as np

from dpgate import _demo as W
from dpgate.gateway import Gateway

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

TARGETS_MS = {1000: 5.0, 10000: 50.0}


def _time(gw: Any, queries: list[W.WorkloadQuery], table: str, **kw: Any) -> list[tuple[str, float, float]]:
    """(source, wall seconds, CPU seconds of this process) per query."""
    out = []
    for q in queries:
        c0, t0 = time.process_time(), time.perf_counter()
        a = gw.query(q.sql(table), accuracy=q.accuracy, confidence=q.confidence, **kw).answer
        out.append((a.source, time.perf_counter() - t0, time.process_time() - c0))
    return out


def _pct(rows: list[tuple[str, float, float]]) -> dict[str, float]:
    if not rows:
        nan = float("nan")
        return {"n": 0, "p50_ms": nan, "p95_ms": nan, "mean_ms": nan, "cpu_p50_ms": nan, "cpu_p95_ms": nan}
    a = 1000 * np.array([r[1] for r in rows])
    c = 1000 * np.array([r[2] for r in rows])
    return {"n": len(rows), "p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "mean_ms": float(a.mean()), "cpu_p50_ms": float(np.percentile(c, 50)),
            "cpu_p95_ms": float(np.percentile(c, 95))}


def _tight(queries: tuple[W.WorkloadQuery, ...], seed: int) -> list[W.WorkloadQuery]:
    rng = np.random.default_rng(seed)
    return [replace(q, accuracy=float(rng.uniform(0.1, 1.0))) for q in queries]


def measure(size: int, probe: int, probe_fresh: int, loaded: Any, ledger: str | None = None) -> dict[str, Any]:
    df, schema, hist, table = loaded
    build = W.generate(n=len(hist), queries=size, setting="unbounded", seed=1000 + size)
    gw = Gateway(df, schema, budget=1e9, ledger=ledger, policy="minimal", seed=size)
    try:
        t0 = time.perf_counter()
        built = _time(gw, list(build.queries), table, policy="no_reuse")
        build_s = time.perf_counter() - t0
        n_hist = len(gw.history)
        probes = W.generate(n=len(hist), queries=probe + probe_fresh, setting="unbounded", seed=2000 + size).queries
        loose = _time(gw, list(probes[:probe]), table)
        tight = _time(gw, _tight(probes[probe:], 3000 + size), table)
    finally:
        gw.close()
    by: dict[str, list[tuple[str, float, float]]] = {}
    for row in loose + tight:
        by.setdefault(row[0], []).append(row)
    return {
        "history_size": n_hist,
        "ledger": "file (fsync)" if ledger else "memory",
        "build": {**_pct(built), "seconds": build_s},
        "by_source": {src: _pct(v) for src, v in sorted(by.items())},
        "loose_sources": {src: sum(1 for r in loose if r[0] == src) for src in {r[0] for r in loose}},
        "tight_sources": {src: sum(1 for r in tight if r[0] == src) for src in {r[0] for r in tight}},
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "Wall-clock time of one `gw.query` on the NETTRACE workload (policy \"minimal\", seeded noise), "
        "by where the answer came from.  Wall-clock p50/p95, and the same for the process's CPU time "
        "(robust to other load on a shared machine).",
        "",
        "| history | ledger | source | n | p50 ms | p95 ms | CPU p50 ms | CPU p95 ms | target p50 | |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        h = r["history_size"]
        for src, st in r["by_source"].items():
            target = TARGETS_MS.get(r["requested"]) if src == "history" and r["ledger"] == "memory" else None
            verdict = ""
            if target is not None:
                verdict = ("met" if st["p50_ms"] <= target else
                           "met on CPU time only" if st["cpu_p50_ms"] <= target else "**missed**")
            t = "" if target is None else f"≤ {target:g} ms"
            lines.append(f"| {h} | {r['ledger']} | {src} | {st['n']} | {st['p50_ms']:.2f} | {st['p95_ms']:.2f} | "
                         f"{st['cpu_p50_ms']:.2f} | {st['cpu_p95_ms']:.2f} | {t} | {verdict} |")
        b = r["build"]
        lines.append(f"| 0 → {h} | {r['ledger']} | build (no_reuse fresh) | {b['n']} | {b['p50_ms']:.2f} | "
                     f"{b['p95_ms']:.2f} | {b['cpu_p50_ms']:.2f} | {b['cpu_p95_ms']:.2f} | | {b['seconds']:.0f} s total |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--probe", type=int, default=300)
    p.add_argument("--probe-fresh", type=int, default=100)
    p.add_argument("--quick", action="store_true", default=os.environ.get("DPGATE_BENCH_QUICK") == "1")
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.quick:
        sizes, a.probe, a.probe_fresh = [min(s, 1000) for s in sizes][:1], 100, 30
    os.makedirs(RESULTS, exist_ok=True)
    loaded = W.load_histogram("nettrace")
    runs = []
    for size in sizes:
        r = measure(size, a.probe, a.probe_fresh, loaded)
        r["requested"] = size
        runs.append(r)
        print(json.dumps(r), flush=True)
    with tempfile.TemporaryDirectory() as d:
        r = measure(sizes[0], 0, a.probe_fresh, loaded, ledger=os.path.join(d, "bench.ledger"))
        r["requested"] = sizes[0]
        runs.append(r)
        print(json.dumps(r), flush=True)
    res = {"runs": runs, "targets_ms": TARGETS_MS}
    with open(os.path.join(RESULTS, "decision.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(RESULTS, "decision.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
