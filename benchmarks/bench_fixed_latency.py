"""Response times with and without ``Gateway(fixed_latency=S)``, on data where matching rows
change the engine's time.

Issue 27, part F: on 4 M rows a fresh answer took 463 ms when every row matched and 205 ms
when none did — a timing channel the noise does not cover (Haeberlen, Pierce & Narayan,
*Differential Privacy Under Fire*, USENIX Security 2011).  ``fixed_latency`` answers every
statement that reads data at ``start + S`` (``dpgate.gateway._latency``).

Data: a DuckDB table ``t(x, y)`` of ``--rows`` rows (4 M), ``x = 500`` on every row, ``y``
spread over 0..999; both declared 0..999.  Statements (``policy="no_reuse"``: every one is a
fresh release that reads the data): ``SELECT SUM(y) FROM t WHERE x = 500`` (every row matches)
and ``… WHERE x = 501`` (none does), alternated, ``--samples`` times each, after two warm-ups:
first without, then with ``fixed_latency = S`` (default: 1.5 × the slowest time seen without,
rounded up to 50 ms).  Reported per setting and statement: median, p10, p90, max of
``Gateway.query``'s wall time, and the gap between the two statements' medians — the
signal an analyst timing answers sees.

Prints a table and writes ``benchmarks/results/fixed_latency.json``.

Usage::

    python benchmarks/bench_fixed_latency.py [--rows 4000000] [--samples 15] [--latency S] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SCHEMA = {"tables": {"t": {"columns": {"x": {"type": "integer", "min": 0, "max": 999},
                                       "y": {"type": "integer", "min": 0, "max": 999}}}}}
ALL = "SELECT SUM(y) FROM t WHERE x = 500"
NONE = "SELECT SUM(y) FROM t WHERE x = 501"


def _database(path: str, rows: int) -> None:
    import duckdb

    con = duckdb.connect(path)
    con.execute(f"CREATE TABLE t AS SELECT 500::INTEGER AS x, ((i * 7919) % 1000)::INTEGER AS y FROM range({rows}) r(i)")
    con.close()


def _times(path: str, samples: int, latency: float | None) -> dict[str, list[float]]:
    import dpgate

    out: dict[str, list[float]] = {"all": [], "none": []}
    with dpgate.Gateway(path, SCHEMA, budget=1e9, seed=1, policy="no_reuse", fixed_latency=latency) as gw:
        for sql in (ALL, NONE):  # warm-ups: first-call costs out of the samples
            gw.query(sql, accuracy=1e6)
        for _ in range(samples):
            for name, sql in (("all", ALL), ("none", NONE)):
                t0 = time.perf_counter()
                res = gw.query(sql, accuracy=1e6)
                out[name].append(time.perf_counter() - t0)
                assert res.answer.source == "fresh"
    return out


def _summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return {"median": statistics.median(s), "p10": q[0], "p90": q[-1], "min": s[0], "max": s[-1],
            "mean": statistics.fmean(s), "sd": statistics.stdev(s) if len(s) > 1 else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--samples", type=int, default=15, help="timed statements per setting and statement (15)")
    ap.add_argument("--latency", type=float, default=None, help="S in seconds (default: from the times without)")
    ap.add_argument("--quick", action="store_true", help="400 000 rows, 5 samples (smoke run)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "fixed_latency.json"))
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # seeded noise warns; expected here
    rows, samples = (400_000, 5) if args.quick else (args.rows, args.samples)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "t.duckdb")
        _database(path, rows)
        without = _times(path, samples, None)
        slowest = max(max(v) for v in without.values())
        latency = args.latency if args.latency is not None else math.ceil(1.5 * slowest / 0.05) * 0.05
        with_fixed = _times(path, samples, latency)
    settings = {"without": without, f"fixed_latency={latency:g}": with_fixed}
    summary = {k: {name: _summary(xs) for name, xs in v.items()} for k, v in settings.items()}
    lines = ["| setting | statement | median | p10 | p90 | max | gap of medians (all − none) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for k, s in summary.items():
        gap = s["all"]["median"] - s["none"]["median"]
        for name in ("all", "none"):
            x = s[name]
            lines.append(f"| {k} | {name} rows match | {x['median'] * 1e3:.1f} ms | {x['p10'] * 1e3:.1f} ms | "
                         f"{x['p90'] * 1e3:.1f} ms | {x['max'] * 1e3:.1f} ms | "
                         + (f"{gap * 1e3:+.2f} ms |" if name == "all" else " |"))
    table = "\n".join(lines)
    print(f"{rows} rows, {samples} samples per statement and setting; S = {latency:g} s\n")
    print(table)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg()}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "rows": rows, "samples": samples, "latency_s": latency, "summary": summary,
                   "times": settings}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
