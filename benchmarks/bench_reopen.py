"""Re-opening a durable ledger: replaying its records vs loading the verified checkpoint.

Builds a file ledger of ``--releases`` random-range counts over the whole
4 096-cell NETTRACE domain (released in batches through
``Gateway.release_measurements``, seeded noise), closes the gateway (which
checkpoints its inference state to ``<ledger>.state``), then times, in this one
run: opening a gateway on the ledger with the checkpoint (verified against the
ledger's records, see ``dpgate._checkpoint``), and with the checkpoint removed
(every record replayed).  Also reports the build time per release and the
p50 latency of ``--probe`` from-history decisions on random ranges after it.  Target
(issue 14): re-opening a ledger of 10 000 releases ≤ 1 s.

Writes ``benchmarks/results/reopen.json``.

Usage::

    python benchmarks/bench_reopen.py [--releases 2000] [--batch 250]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings

import numpy as np

import dpgate
from dpgate.datasets import load_histogram
from dpgate.query import LinearQuery

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _open(df, schema, path):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path)
    dt = time.perf_counter() - t0
    spent = gw.spent
    gw.ledger.close()  # no checkpoint write: the next open sees the same files
    return dt, spent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=int, default=2000)
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--probe", type=int, default=30, help="from-history decisions timed after the build")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", dpgate.Warning)
    df, schema = load_histogram("nettrace")
    table = schema.tables[0]
    col = table.columns[0]
    n = col.n_cells
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.db")
        gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path, seed=args.seed)
        t0 = time.perf_counter()
        done = 0
        while done < args.releases:
            k = min(args.batch, args.releases - done)
            qs = []
            for _ in range(k):
                lo, hi = sorted(int(v) for v in rng.integers(0, n, 2))
                bps = sorted({0, lo, hi + 1} - {n})
                weights = np.array([1.0 if lo <= b <= hi else 0.0 for b in bps])
                qs.append((LinearQuery.from_grid(table, [col.name], [bps], weights), 0.01))
            gw.release_measurements(table.name, qs, kind="query", label="random range")
            done += k
        build = time.perf_counter() - t0
        decide = []  # from-history decisions on random ranges over the whole domain
        for _ in range(args.probe):
            lo, hi = sorted(int(v) for v in rng.integers(0, n, 2))
            t0 = time.perf_counter()
            a = gw.query(f"SELECT COUNT(*) FROM {table.name} WHERE {col.name} BETWEEN {lo} AND {hi}",
                         accuracy=1e7, confidence=0.95).answer
            decide.append((time.perf_counter() - t0, a.source))
        t0 = time.perf_counter()
        gw.close()  # checkpoints
        close_s = time.perf_counter() - t0
        size = os.path.getsize(path + ".state")
        warm, spent_warm = _open(df, schema, path)
        os.rename(path + ".state", path + ".state.bak")
        cold, spent_cold = _open(df, schema, path)
        assert spent_warm == spent_cold
    out = {
        "releases": args.releases,
        "build_s": build,
        "build_ms_per_release": 1e3 * build / args.releases,
        "decision_p50_ms": 1e3 * float(np.median([t for t, _ in decide])) if decide else None,
        "decision_history_share": sum(s == "history" for _, s in decide) / max(1, len(decide)),
        "close_with_checkpoint_s": close_s,
        "checkpoint_mb": size / 2**20,
        "reopen_checkpoint_s": warm,
        "reopen_replay_s": cold,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}",
    }
    for k, v in out.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "reopen.json"), "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
