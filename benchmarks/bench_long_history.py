"""Long histories (issue 28): a fresh answer, the checkpoint and re-opening after many releases.

Builds a file ledger (in a temporary directory) of ``--releases`` random-range counts over
the 4 096-cell NETTRACE column (``COUNT(*) WHERE value BETWEEN lo AND hi``, released in
batches of ``--batch`` through ``Gateway.release_measurements``, seeded noise), its rows
tiled ``--scale`` times (the same distribution, ``--scale`` × 25 714 rows) so that the raw
query takes a measurable time.  Then it reports:

* **fresh vs raw**: the p50 of ``gw.query`` over ``--probe`` fresh random ranges (accuracy
  ±5 at 95 %: history never meets it, so each is measured afresh at the minimal budget given
  history), beside the p50 of the same ``COUNT(*)`` run by hand in DuckDB on the same data
  (best of three per query);
* **fresh vs a new gateway**: the same probes' ``gw.query`` p50 on a new gateway (a file
  ledger of its own, no history) — what history adds to a fresh answer; both split into the
  planning (``Gateway._plan``: the decision on history) and the rest;
* **checkpoint vs ledger**: after ``gw.close()`` (which checkpoints the inference state to
  ``<ledger>.state``), the two files' sizes and the time ``close`` took;
* **re-open**: ``Gateway(...)`` on the ledger from its checkpoint, and after a crash (the
  checkpoint covers none of the records: removed, so every record is replayed).

Targets (issue 28): fresh ≤ 2× raw; checkpoint ≤ 20× the ledger; re-opening ≤ 1 s; a
fresh COUNT after a long history ≤ 1.5× the same on a new gateway.

Writes ``benchmarks/results/long_history.json``.

Usage::

    python benchmarks/bench_long_history.py [--releases 5000] [--scale 400] [--probe 30] [--quick]
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

import duckdb
import numpy as np
import pandas as pd

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.datasets import load_histogram

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _ranges(rng: np.random.Generator, n: int, k: int) -> list[tuple[int, int]]:
    return [tuple(sorted(int(v) for v in rng.integers(0, n, 2))) for _ in range(k)]  # type: ignore[misc]


def _build(gw: dpgate.Gateway, releases: int, batch: int, rng: np.random.Generator) -> float:
    """Release ``releases`` random-range counts in batches; seconds taken."""
    table = gw.schema.tables[0]
    col = table.columns[0]
    n = col.n_cells
    done, t0 = 0, time.perf_counter()
    while done < releases:
        qs = []
        for lo, hi in _ranges(rng, n, min(batch, releases - done)):
            bps = sorted({0, lo, hi + 1} - {n})
            weights = np.array([1.0 if lo <= b <= hi else 0.0 for b in bps])
            qs.append((LinearQuery.from_grid(table, [col.name], [bps], weights), 0.01))
        gw.release_measurements(table.name, qs, kind="query", label="random range")
        done += len(qs)
    return time.perf_counter() - t0


def _fresh(gw: dpgate.Gateway, sqls: list[str]) -> tuple[list[float], list[float]]:
    """Seconds per ``gw.query`` of each SQL (each must be answered fresh), and of its planning
    (``Gateway._plan``: the decision on history; the rest is compiling, the scan, noise, the
    ledger's commit and the answer)."""
    out, plans, inside = [], [], [0.0]
    inner = gw._plan

    def timed(*a, **k):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            inside[0] += time.perf_counter() - t0

    gw._plan = timed  # type: ignore[method-assign]
    try:
        for sql in sqls:
            inside[0], t0 = 0.0, time.perf_counter()
            answer = gw.query(sql, accuracy=5.0, confidence=0.95).answer
            out.append(time.perf_counter() - t0)
            plans.append(inside[0])
            if answer.source != "fresh":
                raise RuntimeError(f"{sql} was answered from {answer.source}, not fresh")
    finally:
        del gw._plan
    return out, plans


def _raw(df: pd.DataFrame, name: str, sqls: list[str]) -> list[float]:
    """Seconds per query run by hand in DuckDB on the same data (best of three)."""
    con = duckdb.connect()
    con.register(name, df)
    out = []
    for sql in sqls:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            con.execute(sql).fetchall()
            best = min(best, time.perf_counter() - t0)
        out.append(best)
    con.close()
    return out


def _reopen(df: pd.DataFrame, schema: dpgate.Schema, path: str) -> float:
    t0 = time.perf_counter()
    gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path)
    dt = time.perf_counter() - t0
    gw.ledger.close()  # no checkpoint written: the next open sees the same files
    return dt


def _ms(xs: list[float]) -> float:
    return 1e3 * float(np.median(xs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=int, default=5000, help="random-range releases in the history")
    p.add_argument("--batch", type=int, default=250, help="releases per release_measurements call")
    p.add_argument("--scale", type=int, default=400, help="NETTRACE's rows tiled this many times")
    p.add_argument("--probe", type=int, default=30, help="fresh random-range counts timed")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--quick", action="store_true", help="1 000 releases, 10 probes (smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.releases, args.probe, args.scale = min(args.releases, 1000), min(args.probe, 10), min(args.scale, 40)
    warnings.simplefilter("ignore", dpgate.Warning)
    df, schema = load_histogram("nettrace")
    df = pd.DataFrame({"value": np.tile(df["value"].to_numpy(), args.scale)})
    table = schema.tables[0]
    n = table.columns[0].n_cells
    rng = np.random.default_rng(args.seed)
    sqls = [f"SELECT COUNT(*) FROM {table.name} WHERE value BETWEEN {lo} AND {hi}"
            for lo, hi in _ranges(np.random.default_rng(args.seed + 1), n, args.probe)]
    warm = [f"SELECT COUNT(*) FROM {table.name} WHERE value BETWEEN {lo} AND {hi}"
            for lo, hi in _ranges(np.random.default_rng(args.seed + 2), n, 2)]
    out: dict[str, object] = {"releases": args.releases, "rows": len(df), "probes": args.probe}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.db")
        gw = dpgate.Gateway(df, schema, budget=1e9, ledger=path, seed=args.seed)
        out["build_s"] = _build(gw, args.releases, args.batch, rng)
        print(f"built {args.releases} releases in {out['build_s']:.1f} s", flush=True)
        fresh, fresh_plan = _fresh(gw, sqls)
        t0 = time.perf_counter()
        gw.close()
        out["close_s"] = time.perf_counter() - t0
        ledger_mb, state_mb = os.path.getsize(path) / 2**20, os.path.getsize(path + ".state") / 2**20
        out["reopen_checkpoint_s"] = min(_reopen(df, schema, path) for _ in range(2))
        os.unlink(path + ".state")  # a crash before any checkpoint: every record replayed
        out["reopen_replay_s"] = _reopen(df, schema, path)
        new = dpgate.Gateway(df, schema, budget=1e9, ledger=os.path.join(tmp, "new.db"), seed=args.seed)
        _fresh(new, warm)  # warm up (first compile, first scan) on other ranges
        baseline, baseline_plan = _fresh(new, sqls)
        new.close()
    raw = _raw(df, table.name, sqls)
    out.update({
        "fresh_p50_ms": _ms(fresh), "raw_p50_ms": _ms(raw), "new_gateway_fresh_p50_ms": _ms(baseline),
        "fresh_plan_p50_ms": _ms(fresh_plan), "fresh_rest_p50_ms": _ms([a - b for a, b in zip(fresh, fresh_plan, strict=True)]),
        "new_gateway_plan_p50_ms": _ms(baseline_plan),
        "fresh_over_raw": _ms(fresh) / _ms(raw), "fresh_over_new_gateway": _ms(fresh) / _ms(baseline),
        "ledger_mb": ledger_mb, "checkpoint_mb": state_mb, "checkpoint_over_ledger": state_mb / ledger_mb,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}",
    })
    for k, v in out.items():
        print(f"{k:26s} {v:.4g}" if isinstance(v, float) else f"{k:26s} {v}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "long_history.json"), "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
