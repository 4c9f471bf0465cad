"""Benchmark the compiler: latency of SQL → LinearQuery.

For a 5-predicate ``COUNT(*)`` on the embedded PUMS schema (and a few other
shapes) measures, over many repetitions:

* **compile** — :func:`dpgate.compile.compile_tree` on an already parsed sqlglot
  tree (everything dpgate does after sqlglot's parse: checks, cell evaluation,
  canonicalisation); target p50 < 1 ms for the 5-predicate query;
* **parse** — sqlglot's tokenize + parse alone;
* **total** — :func:`dpgate.compile.compile_statement` on the text (tokenize,
  hints, statement checks, parse, bind, compile).

Prints a table and writes ``benchmarks/results/compile.json`` (and ``compile.md``)
with the machine description.

Usage::

    python benchmarks/bench_compile.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from sqlglot.dialects.dialect import Dialect  # noqa: E402

from dpgate.compile import compile_statement, compile_tree  # noqa: E402
from dpgate.datasets import schema_of  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SCHEMA = schema_of("pums")

QUERIES = {
    "count_5_predicates": (
        "SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 49 AND sex = 1 AND educ >= 12 "
        "AND race IN (1, 2) AND income < 50000"
    ),
    "count_1_predicate": "SELECT COUNT(*) FROM pums WHERE age < 30",
    "negated_or_5": (
        "SELECT COUNT(*) FROM pums WHERE NOT (age BETWEEN 30 AND 49 AND sex = 1) OR educ >= 12 "
        "OR race IN (1, 2) OR income < 50000"
    ),
    "sum_case_filter": (
        "SELECT SUM(CASE WHEN educ >= 12 THEN 2 ELSE 1 END) FILTER (WHERE age > 20), "
        "2*COUNT(*) - 10 FROM pums WHERE married"
    ),
    "group_by_sex_race": "SELECT sex, race, COUNT(*) FROM pums WHERE age >= 18 GROUP BY sex, race",
}


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def measure(sql: str, repeat: int) -> dict[str, float]:
    dialect = Dialect.get_or_raise("duckdb")
    tree = dialect.parse(sql)[0]
    for _ in range(20):  # warm-up
        compile_tree(tree, SCHEMA)
        compile_statement(sql, SCHEMA)
    comp, cpu, parse, total = [], [], [], []
    for _ in range(repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        stmt = compile_tree(tree, SCHEMA)
        t1 = time.perf_counter()
        cpu.append((time.process_time() - c0) * 1e3)
        dialect.parse(sql)
        t2 = time.perf_counter()
        compile_statement(sql, SCHEMA)
        t3 = time.perf_counter()
        comp.append((t1 - t0) * 1e3)
        parse.append((t2 - t1) * 1e3)
        total.append((t3 - t2) * 1e3)
    return {
        "queries": len(stmt.queries),
        "compile_p50_ms": statistics.median(comp),
        "compile_p95_ms": _pct(comp, 0.95),
        "compile_cpu_mean_ms": statistics.fmean(cpu),
        "parse_p50_ms": statistics.median(parse),
        "total_p50_ms": statistics.median(total),
        "total_p95_ms": _pct(total, 0.95),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="few repetitions (smoke run)")
    args = ap.parse_args()
    repeat = 50 if args.quick or os.environ.get("DPGATE_BENCH_QUICK") else args.repeat
    results = {name: measure(sql, repeat) for name, sql in QUERIES.items()}
    import timeit

    calib = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    machine = {
        "calibration_sum_range_1000_us": round(calib, 2),  # ~8-10 µs on a current desktop CPU
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    head = (
        f"{'query':22s} {'LQs':>4s} {'compile p50':>12s} {'p95':>8s} {'cpu mean':>9s} {'parse p50':>10s} "
        f"{'total p50':>10s} {'p95':>8s}"
    )
    lines = [head]
    for name, r in results.items():
        lines.append(
            f"{name:22s} {r['queries']:4d} {r['compile_p50_ms']:10.3f}ms {r['compile_p95_ms']:6.3f}ms "
            f"{r['compile_cpu_mean_ms']:7.3f}ms "
            f"{r['parse_p50_ms']:8.3f}ms {r['total_p50_ms']:8.3f}ms {r['total_p95_ms']:6.3f}ms"
        )
    five = results["count_5_predicates"]
    verdict = "meets" if five["compile_p50_ms"] < 1.0 else "MISSES"
    lines.append(
        f"\n5-predicate query: compile p50 {five['compile_p50_ms']:.3f} ms excluding parse ({verdict} the < 1 ms "
        f"target; CPU {five['compile_cpu_mean_ms']:.3f} ms), {five['total_p50_ms']:.3f} ms including tokenize + "
        f"parse; {repeat} repetitions."
    )
    lines.append(f"Machine calibration: sum(range(1000)) = {calib:.1f} µs (≈ 8–10 µs on a current desktop CPU).")
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"machine": machine, "repeat": repeat, "queries": QUERIES, "results": results, "target_p50_ms": 1.0}
    (RESULTS / "compile.json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["Compile latency (ms), excluding sqlglot's parse (compile) and including it (total):", "", "```"]
    md += lines + [
        "```",
        "",
        f"Machine: {machine['platform']}, {machine['cpu_count']} CPUs, Python {machine['python']}; "
        f"calibration sum(range(1000)) = {calib:.1f} µs (≈ 8–10 µs on a current desktop CPU), "
        f"load average {machine['load_average']}.",
    ]
    (RESULTS / "compile.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
