"""The hierarchical warm start over the whole 4 096-cell NETTRACE domain, and decisions after it.

Times ``Gateway.warm_start("hierarchical", ε, "value")`` (binary tree: 8 191 nodes
over 4 096 cells, released and absorbed into the inference state), then the
decision latency of ``--probe`` random-range counts over the whole domain with a
requirement the tree meets (answered from history), and of ``--probe-fresh``
with tight requirements (measured afresh).  Targets (issue 14): tree released and
absorbed ≤ 5 s, decision p50 ≤ 20 ms afterwards.  Writes ``benchmarks/results/tree.json``.

Usage::

    python benchmarks/bench_tree.py [--probe 100] [--probe-fresh 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np

import dpgate
from dpgate.datasets import load_histogram

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _latencies(gw: dpgate.Gateway, rng: np.random.Generator, n: int, accuracy: float) -> dict[str, float]:
    times, sources = [], []
    for _ in range(n):
        lo, hi = sorted(int(v) for v in rng.integers(0, 4096, 2))
        t0 = time.perf_counter()
        a = gw.query(f"SELECT COUNT(*) FROM nettrace WHERE value BETWEEN {lo} AND {hi}",
                     accuracy=accuracy, confidence=0.95).answer
        times.append(time.perf_counter() - t0)
        sources.append(a.source)
    return {"p50_ms": 1e3 * float(np.median(times)), "p95_ms": 1e3 * float(np.percentile(times, 95)),
            "history_share": sources.count("history") / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", type=int, default=100)
    p.add_argument("--probe-fresh", type=int, default=20)
    p.add_argument("--epsilon", type=float, default=0.5)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", dpgate.Warning)
    df, schema = load_histogram("nettrace")
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=1)
    gw.compile("SELECT COUNT(*) FROM nettrace")  # first-call costs (parser) out of the timing
    t0 = time.perf_counter()
    ws = gw.warm_start("hierarchical", args.epsilon, "value")
    tree_s = time.perf_counter() - t0
    rng = np.random.default_rng(14)
    out = {
        "tree_nodes": len(gw.history) - 1,
        "tree_seconds": tree_s,
        "from_history": _latencies(gw, rng, args.probe, 1e4),
        "fresh": _latencies(gw, rng, args.probe_fresh, 5.0),
        "warm_start": repr(ws)[:120],
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}",
    }
    print(json.dumps(out, indent=2))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "tree.json"), "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
