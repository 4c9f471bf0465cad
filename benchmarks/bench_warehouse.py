"""Benchmark fresh answers on a 20.8 M-row DuckDB warehouse against hand-written DuckDB.

The table ``warehouse`` has one row per unit of the NETTRACE histogram (4 096 cells,
25 714 units) repeated ``scale`` times (``--rows`` / 25 714, default 809: 20 802 626
rows), as ``income`` (the cell, 0..4095), plus a 50-value categorical ``region``
(``'region_00'`` … ``'region_49'``) and an integer ``age`` (0..99), both drawn by
DuckDB's ``hash`` of (cell, unit, seed) with a seed from ``numpy.random.default_rng(14)``
(generated inside DuckDB; rows shuffled, so no zone map favours either side).  Two views
re-declare ``income`` in bins of 13 (``w317``: 316 bins + NULL = 317 keys) and of 4
(``w1025``: 1 025 keys).  The file is built once and cached in
``$TMPDIR/dpgate-bench-cache`` (never committed).

In one run, interleaved, medians over ``--repeat`` repetitions, per query:

* **raw**: the hand-written DuckDB statement;
* **cube**: :meth:`dpgate.release.cube.Cube.true_numerators` on the compiled statement's linear
  queries (SQL generation included) — what the gateway adds to the data access;
* **sql**: the statements the cube generates, run alone as text (``--baseline-sql FILE``
  also times the statements another dpgate version generated, recorded with
  ``--dump-sql FILE``: the before/after of the SQL);
* **gateway**: end-to-end ``Gateway.query`` on a new gateway per call (seed 0, budget
  1e9, so every answer is fresh; the gateway's construction is not timed).  This also
  includes the decision planning, which is not the cube's; statements with more than
  ``--gateway-max-outputs`` outputs (default 400) are skipped, and a call slower than
  5 s is timed once.

Queries: 20 range / IN / 2-D / 3-D counts, ``GROUP BY region``, ``GROUP BY age`` and
``GROUP BY`` over 317 / 1 025 / 4 097 keys of ``income``.  Prints a table of ratios to
raw and writes ``benchmarks/results/warehouse.json``.

Usage::

    python benchmarks/bench_warehouse.py [--rows N] [--repeat K] [--no-gateway]
    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_warehouse.py --dump-sql old.json
    python benchmarks/bench_warehouse.py --baseline-sql old.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
from sqlglot import exp

import dpgate
from dpgate.datasets import _file
from dpgate.release.cube import Cube

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "warehouse.json"
UNITS = 25714  # NETTRACE's total
REGIONS = [f"region_{i:02d}" for i in range(50)]
SCHEMA = {
    "tables": {
        "warehouse": {"columns": {
            "income": {"type": "integer", "min": 0, "max": 4095},
            "region": {"type": "categorical", "values": REGIONS},
            "age": {"type": "integer", "min": 0, "max": 99},
        }},
        "w317": {"columns": {"income": {"type": "integer", "min": 0, "max": 4095, "bins": list(range(0, 4096 + 13, 13))}}},
        "w1025": {"columns": {"income": {"type": "integer", "min": 0, "max": 4095, "bins": list(range(0, 4097, 4))}}},
    }
}
R3 = "('region_01', 'region_02', 'region_03')"
# (name, dpgate SQL, hand-written DuckDB SQL); None: the same text.
QUERIES: list[tuple[str, str, str | None]] = [
    ("income<100", "SELECT COUNT(*) FROM warehouse WHERE income < 100", None),
    ("income 100..999", "SELECT COUNT(*) FROM warehouse WHERE income BETWEEN 100 AND 999", None),
    ("income>=2048", "SELECT COUNT(*) FROM warehouse WHERE income >= 2048", None),
    ("income IN 8", "SELECT COUNT(*) FROM warehouse WHERE income IN (1, 2, 3, 5, 8, 13, 21, 34)", None),
    ("region=", "SELECT COUNT(*) FROM warehouse WHERE region = 'region_07'", None),
    ("region IN 3", f"SELECT COUNT(*) FROM warehouse WHERE region IN {R3}", None),
    ("region NOT IN 3", f"SELECT COUNT(*) FROM warehouse WHERE region NOT IN {R3}", None),
    ("age<30", "SELECT COUNT(*) FROM warehouse WHERE age < 30", None),
    ("age 30..49", "SELECT COUNT(*) FROM warehouse WHERE age BETWEEN 30 AND 49", None),
    ("age IN 4", "SELECT COUNT(*) FROM warehouse WHERE age IN (10, 20, 30, 40)", None),
    ("2D income×age", "SELECT COUNT(*) FROM warehouse WHERE income < 500 AND age >= 65", None),
    ("2D income×region", "SELECT COUNT(*) FROM warehouse WHERE income BETWEEN 10 AND 20 AND region = 'region_10'", None),
    ("2D age×region", f"SELECT COUNT(*) FROM warehouse WHERE age BETWEEN 18 AND 64 AND region IN {R3}", None),
    ("2D small box", "SELECT COUNT(*) FROM warehouse WHERE income < 64 AND age < 10", None),
    ("2D OR", "SELECT COUNT(*) FROM warehouse WHERE income < 50 OR age > 90", None),
    ("NOT range", "SELECT COUNT(*) FROM warehouse WHERE NOT (income BETWEEN 5 AND 4000)", None),
    ("3D", "SELECT COUNT(*) FROM warehouse WHERE income < 1000 AND age BETWEEN 20 AND 40 "
           "AND region IN ('region_00', 'region_49')", None),
    ("3D <>", "SELECT COUNT(*) FROM warehouse WHERE income >= 100 AND age < 50 AND region <> 'region_05'", None),
    ("3D OR", "SELECT COUNT(*) FROM warehouse WHERE (income < 200 AND region = 'region_02') OR age = 7", None),
    ("all rows", "SELECT COUNT(*) FROM warehouse", None),
    ("GROUP BY region", "SELECT region, COUNT(*) FROM warehouse GROUP BY region", None),
    ("GROUP BY age", "SELECT age, COUNT(*) FROM warehouse GROUP BY age", None),
    ("GROUP BY 317 keys", "SELECT income, COUNT(*) FROM w317 GROUP BY income",
     "SELECT income // 13, COUNT(*) FROM warehouse GROUP BY 1"),
    ("GROUP BY 1025 keys", "SELECT income, COUNT(*) FROM w1025 GROUP BY income",
     "SELECT income // 4, COUNT(*) FROM warehouse GROUP BY 1"),
    ("GROUP BY 4097 keys", "SELECT income, COUNT(*) FROM warehouse GROUP BY income", None),
]
GROUP_BY = {name for name, sql, _ in QUERIES if "GROUP BY" in sql}


def build(path: Path, scale: int, extra_columns: tuple[str, ...] = ()) -> None:
    """Write the table (and its views) to ``path``.  ``extra_columns``: more SELECT items over
    ``h.v`` (the cell) and ``r.i`` (the unit), ``{seed}`` standing for the seed (``bench_warehouse_session``)."""
    with _file("NETTRACE.n4096.npy").open("rb") as fh:
        counts = np.load(fh, allow_pickle=False).astype(np.int64) * scale
    seed = int(np.random.default_rng(14).integers(2**31))
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    extra = "".join(f",\n               {c.format(seed=seed)}" for c in extra_columns)
    con.register("h", pd.DataFrame({"v": np.arange(4096, dtype=np.int64), "c": counts}))
    con.execute(
        f"""CREATE TABLE warehouse AS
        SELECT h.v AS income,
               'region_' || lpad(CAST(hash(h.v, r.i, {seed}) % 50 AS VARCHAR), 2, '0') AS region,
               CAST(hash(h.v, r.i, {seed + 1}) % 100 AS BIGINT) AS age{extra}
        FROM h, range(h.c) AS r(i)
        ORDER BY hash(h.v, r.i, {seed + 2})"""
    )
    con.execute("CREATE VIEW w317 AS SELECT income FROM warehouse")
    con.execute("CREATE VIEW w1025 AS SELECT income FROM warehouse")
    con.close()
    tmp.rename(path)


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 2)


def generated_sql(cube: Cube, queries: list[Any]) -> list[str]:
    """The statements ``cube.true_numerators(queries)`` runs, as DuckDB text."""
    seen: list[str] = []
    real = cube._execute

    def spy(e: exp.Expression, **kw: Any) -> Any:
        seen.append(e.sql(dialect="duckdb"))
        return real(e, **kw)

    cube._execute = spy  # type: ignore[method-assign]
    try:
        cube.true_numerators(queries)
    finally:
        del cube._execute
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=809 * UNITS, help="about this many rows (a multiple of 25 714)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-gateway", action="store_true", help="skip the end-to-end Gateway.query timings")
    ap.add_argument("--gateway-max-outputs", type=int, default=400,
                    help="skip Gateway.query for statements with more outputs (planning-bound; not the cube's)")
    ap.add_argument("--dump-sql", type=Path, help="write the generated SQL per query to this JSON file and stop")
    ap.add_argument("--baseline-sql", type=Path, help="also time the SQL recorded in this file (--dump-sql)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpgate-bench-cache")
    args = ap.parse_args()
    scale = max(1, round(args.rows / UNITS))
    args.cache.mkdir(parents=True, exist_ok=True)
    path = args.cache / f"warehouse_x{scale}.duckdb"
    if not path.exists():
        t0 = time.perf_counter()
        build(path, scale)
        print(f"built {path} in {time.perf_counter() - t0:.1f} s")
    schema = dpgate.Schema.from_dict(SCHEMA)
    cube = Cube(str(path), schema)
    raw = duckdb.connect(str(path), read_only=True)
    rows = raw.execute("SELECT COUNT(*) FROM warehouse").fetchone()[0]
    probe = dpgate.Gateway(str(path), schema, budget=1e9, seed=0)
    stmts = {name: probe.compile(sql) for name, sql, _ in QUERIES}
    probe.close()
    sqls = {name: generated_sql(cube, list(stmts[name].queries)) for name, _, _ in QUERIES}
    if args.dump_sql:
        args.dump_sql.write_text(json.dumps({"dpgate": dpgate.__file__, "sql": sqls}, indent=1))
        print(f"wrote {args.dump_sql}")
        return
    baseline = json.loads(args.baseline_sql.read_text())["sql"] if args.baseline_sql else {}

    def run_text(texts: list[str]) -> Callable[[], None]:
        return lambda: [raw.execute(t).fetchall() for t in texts] and None

    results = []
    print(f"{rows} rows, {args.repeat} repeats, load {os.getloadavg()[0]:.2f}")
    head = f"{'query':20s} {'raw ms':>8s} {'cube/raw':>8s} {'sql/raw':>8s}"
    head += f" {'old/raw':>8s}" if baseline else ""
    head += "" if args.no_gateway else f" {'gw/raw':>8s} {'gw ms':>8s}"
    print(head)
    for name, sql, hand in QUERIES:
        queries = list(stmts[name].queries)
        fns: dict[str, Callable[[], Any]] = {
            "raw": run_text([hand or sql]),
            "cube": lambda q=queries: cube.true_numerators(q),
            "sql": run_text(sqls[name]),
        }
        if name in baseline:
            fns["old_sql"] = run_text(baseline[name])
        times: dict[str, list[float]] = {k: [] for k in fns}
        gw_times: list[float] = []
        reps = args.repeat
        for f in fns.values():  # warm-up
            f()
        for rep in range(reps):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
            gw_on = not args.no_gateway and len(queries) <= args.gateway_max_outputs
            if gw_on and (rep == 0 or gw_times[0] < 5.0):  # a slow plan: time it once
                with dpgate.Gateway(str(path), schema, budget=1e9, seed=0) as gw:
                    t0 = time.perf_counter()
                    gw.query(sql, accuracy=1000.0, confidence=0.95)
                    gw_times.append(time.perf_counter() - t0)
        r = {"query": name, "sql": sql, "hand": hand or sql, "outputs": len(queries), "statements": len(sqls[name])}
        for k, xs in times.items():
            r[f"{k}_ms"] = median_ms(xs)
        if gw_times:
            r["gateway_ms"] = median_ms(gw_times)
            r["gateway_repeats"] = len(gw_times)
        for k in ("cube", "sql", "old_sql", "gateway"):
            if f"{k}_ms" in r:
                r[f"{k}_ratio"] = round(r[f"{k}_ms"] / r["raw_ms"], 3)
        results.append(r)
        line = f"{name:20s} {r['raw_ms']:8.1f} {r['cube_ratio']:8.2f} {r['sql_ratio']:8.2f}"
        line += f" {r.get('old_sql_ratio', float('nan')):8.2f}" if baseline else ""
        line += "" if args.no_gateway else f" {r.get('gateway_ratio', float('nan')):8.2f} {r.get('gateway_ms', float('nan')):8.1f}"
        print(line, flush=True)

    def med(key: str, names: set[str] | None = None) -> float | None:
        xs = [r[key] for r in results if key in r and (names is None or r["query"] in names)]
        return round(statistics.median(xs), 3) if xs else None

    counts = {r["query"] for r in results} - GROUP_BY
    summary = {
        f"{k}_ratio_median_{part}": med(f"{k}_ratio", names)
        for k in ("cube", "sql", "old_sql", "gateway")
        for part, names in (("counts", counts), ("group_by", GROUP_BY))
    }
    print(json.dumps(summary, indent=1))
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "duckdb": duckdb.__version__, "load_avg_1m": os.getloadavg()[0]},
        "rows": rows, "scale": scale, "repeat": args.repeat,
        "baseline_sql": str(args.baseline_sql) if args.baseline_sql else None,
        "summary": summary, "queries": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS}")
    cube.close()
    raw.close()


if __name__ == "__main__":
    main()
