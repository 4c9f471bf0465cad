"""Long random-range histories: building them, deciding after them, re-opening their ledger.

Builds a file ledger of random-range counts over the whole 4 096-cell NETTRACE domain
(released in batches through ``Gateway.release_measurements``, seeded noise).  At each
of ``--releases`` (e.g. ``1000,10000``) it times ``--probe`` queries
``COUNT(*) … BETWEEN lo AND hi`` on fresh random ranges (``--accuracy``, default ±1 000 at
95 %: history's own half-widths are 200–350 at 10 000 releases, so whatever history determines
is answered from it, and a fresh probe is released at a scale near the history's), reporting
per count:

* the **decision**: the gateway's planning of the query (``Gateway._plan``: the planning
  copy of the table's state and ``decide.plan`` with its verification) — the part that
  depends on history; p50 over all probes, over those answered from history, and over
  the fresh ones;
* the whole ``gw.query`` (also SQL compile, cube scan, ledger write, answer) p50;
* the share answered from history.

Then ``--repeat`` queries re-ask ranges released before (uniformly among them): at
1 000 random ranges history determines almost no *new* random range (the ranges' endpoint
graph is far from connected), so these are the from-history decisions there.  Probes that
are answered fresh add their release to the history (a few dozen on top of the count).  Build time per release is reported over the whole build and over the last
batch before each count.  Then the gateway is closed (which checkpoints its inference
state to ``<ledger>.state``) and re-opened twice in this one run: from the checkpoint
(verified against the ledger's records, see ``dpgate.ledger._checkpoint``) and with the
checkpoint removed (every record replayed).  Targets (issue 14): decision from history p50
≤ 5 ms at 1 000 releases and ≤ 50 ms at 10 000; ≤ 5 ms per release at 10 000; re-opening
a ledger of 10 000 releases ≤ 1 s.

Writes ``benchmarks/results/reopen.json``.

Usage::

    python benchmarks/bench_reopen.py [--releases 1000,10000] [--batch 250] [--probe 60]
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
from dpgate.compile.query import LinearQuery
from dpgate.datasets import load_histogram

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _open(df, schema, path):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path)
    dt = time.perf_counter() - t0
    spent = gw.spent
    gw.ledger.close()  # no checkpoint write: the next open sees the same files
    return dt, spent


def _p50(xs: list[float]) -> float | None:
    return 1e3 * float(np.median(xs)) if xs else None


def _probe(gw, table, ranges, accuracy: float) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Time a query per ``(lo, hi)`` in ``ranges``: the decision (``gw._plan``) and the whole query."""
    col = table.columns[0]
    plans: list[float] = []
    inner = gw._plan

    def timed(*a, **k):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            plans.append(time.perf_counter() - t0)

    gw._plan = timed
    rows = []
    try:
        for lo, hi in ranges:
            del plans[:]
            t0 = time.perf_counter()
            a = gw.query(f"SELECT COUNT(*) FROM {table.name} WHERE {col.name} BETWEEN {lo} AND {hi}",
                         accuracy=accuracy, confidence=0.95).answer
            rows.append((sum(plans), time.perf_counter() - t0, a.source))
    finally:
        del gw._plan
    hist = [d for d, _, s in rows if s == "history"]
    fresh = [d for d, _, s in rows if s != "history"]
    return {
        "decision_p50_ms": _p50([d for d, _, _ in rows]),
        "decision_history_p50_ms": _p50(hist),
        "decision_fresh_p50_ms": _p50(fresh),
        "query_p50_ms": _p50([q for _, q, _ in rows]),
        "query_history_p50_ms": _p50([q for _, q, s in rows if s == "history"]),
        "history_share": len(hist) / max(1, len(rows)),
        "probes": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", default="1000,10000", help="counts (comma-separated) to probe at")
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--probe", type=int, default=60, help="random-range queries timed at each count")
    p.add_argument("--repeat", type=int, default=30, help="already released ranges asked again at each count")
    p.add_argument("--accuracy", type=float, default=1000.0, help="the probes' accuracy (95 %% half-width)")
    args = p.parse_args(argv)
    counts = sorted({int(c) for c in str(args.releases).split(",")})
    warnings.simplefilter("ignore", dpgate.Warning)
    df, schema = load_histogram("nettrace")
    table = schema.tables[0]
    col = table.columns[0]
    n = col.n_cells
    rng = np.random.default_rng(args.seed)
    probe_rng = np.random.default_rng(args.seed + 1)
    at: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.db")
        gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path, seed=args.seed)
        build = 0.0
        done = 0
        released: list[tuple[int, int]] = []
        for target in counts:
            last = 0.0
            while done < target:
                k = min(args.batch, target - done)
                qs = []
                for _ in range(k):
                    lo, hi = sorted(int(v) for v in rng.integers(0, n, 2))
                    released.append((lo, hi))
                    bps = sorted({0, lo, hi + 1} - {n})
                    weights = np.array([1.0 if lo <= b <= hi else 0.0 for b in bps])
                    qs.append((LinearQuery.from_grid(table, [col.name], [bps], weights), 0.01))
                t0 = time.perf_counter()
                gw.release_measurements(table.name, qs, kind="query", label="random range")
                last = time.perf_counter() - t0
                build += last
                done += k
            fresh = [tuple(sorted(int(v) for v in probe_rng.integers(0, n, 2))) for _ in range(args.probe)]
            repeats = [released[int(i)] for i in probe_rng.integers(0, len(released), args.repeat)]
            at[str(target)] = {"build_ms_per_release": 1e3 * build / done,
                               "last_batch_ms_per_release": 1e3 * last / k,
                               "random": _probe(gw, table, fresh, args.accuracy),
                               "repeat": _probe(gw, table, repeats, args.accuracy)}
            print(target, json.dumps(at[str(target)], default=lambda v: round(v, 3)), flush=True)
        t0 = time.perf_counter()
        gw.close()  # checkpoints
        close_s = time.perf_counter() - t0
        size = os.path.getsize(path + ".state")
        warm, spent_warm = _open(df, schema, path)
        os.rename(path + ".state", path + ".state.bak")
        cold, spent_cold = _open(df, schema, path)
        assert spent_warm == spent_cold
    out = {
        "releases": counts,
        "probe_accuracy": args.accuracy,
        "at": at,
        "close_with_checkpoint_s": close_s,
        "checkpoint_mb": size / 2**20,
        "reopen_checkpoint_s": warm,
        "reopen_replay_s": cold,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}",
    }
    for k, v in out.items():
        if k != "at":
            print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "reopen.json"), "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
