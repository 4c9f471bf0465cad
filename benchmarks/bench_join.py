"""Benchmark a fresh count over a declared join (issue 30 item 4) against the same join by hand.

A DuckDB file (built once, cached in ``$TMPDIR/dpgate-bench-cache``, never committed) holds
``customers`` (``--units``, default 2 M: one row per person, ``age`` 0..99) and ``orders``
(``--rows``, default 20 M: ``customer_id`` uniform over the customers — about 10 orders each,
Poisson — ``amount`` 0..999 and ``placed``, a day of 2024), all drawn by DuckDB's ``hash``.
The schema declares ``orders`` with ``privacy_unit: customer_id``, ``max_rows_per_unit: 20``
(above the 99.8th percentile of orders per customer, as the README advises) and
``references: {customer_id: customers.id}``.

Two statements (a fresh COUNT over the join with a filter on each table; a GROUP BY month of
the join), timed interleaved, medians over ``--repeat`` repetitions:

* **plain**: the join written by hand, *without* bounding (another table: every order counts);
* **bounded**: the same join written by hand *with* the bound — what an analyst would write to
  get the table dpgate answers about (``QUALIFY ROW_NUMBER() OVER (PARTITION BY customer_id
  ORDER BY <a hash>) <= 20`` on orders, one row per customer), the same answer;
* **cube**: :meth:`dpgate.release.cube.Cube.true_numerators` on the compiled statement (SQL
  generation, bounding of both tables, the join): the data access dpgate adds;
* **gateway**: end-to-end ``Gateway.query`` on a new gateway per call (budget 1e9, so the
  answer is fresh; construction not timed).

Writes ``benchmarks/results/join.json`` (``--quick``: 2 M orders, 200 000 customers, 3
repetitions, ``join_quick.json``).

Usage::

    python benchmarks/bench_join.py [--quick] [--rows N] [--units N] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

import dpgate
from dpgate.compile import compile_statement
from dpgate.release.cube import Cube

REPO = Path(__file__).resolve().parents[1]
K = 20
SCHEMA: dict[str, Any] = {"tables": {
    "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {
        "id": {"type": "key"}, "age": {"type": "integer", "min": 0, "max": 99}}},
    "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": K, "references": {"customer_id": "customers.id"},
               "columns": {"customer_id": {"type": "key"}, "amount": {"type": "integer", "min": 0, "max": 999},
                           "placed": {"type": "date", "min": "2024-01-01", "max": "2024-12-31"}}},
}}
BOUNDED = (f"(SELECT * FROM orders WHERE customer_id IS NOT NULL QUALIFY ROW_NUMBER() OVER (PARTITION BY customer_id "
           f"ORDER BY md5(amount::VARCHAR || ',' || placed::VARCHAR)) <= {K})")
ONE = "(SELECT * FROM customers WHERE id IS NOT NULL QUALIFY ROW_NUMBER() OVER (PARTITION BY id ORDER BY md5(age::VARCHAR)) = 1)"
# (name, dpgate SQL, hand-written plain join, hand-written bounded join)
QUERIES = [
    ("count", "SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id WHERE c.age >= 30 AND o.amount < 500",
     "SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id WHERE c.age >= 30 AND o.amount < 500",
     f"SELECT COUNT(*) FROM {BOUNDED} o JOIN {ONE} c ON o.customer_id = c.id WHERE c.age >= 30 AND o.amount < 500"),
    ("group by month", "SELECT date_trunc('month', o.placed) AS m, COUNT(*) FROM orders o JOIN customers c "
     "ON o.customer_id = c.id GROUP BY 1",
     "SELECT date_trunc('month', o.placed) AS m, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id "
     "GROUP BY 1",
     f"SELECT date_trunc('month', o.placed) AS m, COUNT(*) FROM {BOUNDED} o JOIN {ONE} c ON o.customer_id = c.id "
     "GROUP BY 1"),
]


def build(path: Path, rows: int, units: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    con.execute(f"CREATE TABLE customers AS SELECT i AS id, CAST(hash(i, 7) % 100 AS INTEGER) AS age "
                f"FROM range({units}) t(i)")
    con.execute(f"CREATE TABLE orders AS SELECT CAST(hash(i, 1) % {units} AS BIGINT) AS customer_id, "
                "CAST(hash(i, 2) % 1000 AS INTEGER) AS amount, "
                "CAST(DATE '2024-01-01' + CAST(hash(i, 3) % 366 AS INTEGER) AS DATE) AS placed "
                f"FROM range({rows}) t(i)")
    con.close()
    tmp.rename(path)


def median_ms(xs: list[float]) -> float:
    return round(1000 * statistics.median(xs), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 M orders, 200 000 customers, 3 repetitions")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--units", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--no-gateway", action="store_true")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpgate-bench-cache")
    args = ap.parse_args()
    rows = args.rows or (2_000_000 if args.quick else 20_000_000)
    units = args.units or rows // 10
    repeat = args.repeat or (3 if args.quick else 5)
    args.cache.mkdir(parents=True, exist_ok=True)
    path = args.cache / f"join_{rows}_{units}.duckdb"
    if not path.exists():
        t0 = time.perf_counter()
        build(path, rows, units)
        print(f"built {path} in {time.perf_counter() - t0:.1f} s")
    con = duckdb.connect(str(path), read_only=True)
    per_unit = con.execute("SELECT quantile_cont(n, 0.998), max(n) FROM (SELECT COUNT(*) n FROM orders "
                           "GROUP BY customer_id)").fetchone()
    cube = Cube(con, SCHEMA)
    results: list[dict[str, Any]] = []
    for name, sql, plain, bounded in QUERIES:
        st = compile_statement(sql, cube.schema)
        hand_plain = con.execute(plain).fetchall()
        hand_bounded = con.execute(bounded).fetchall()
        timers: dict[str, Callable[[], Any]] = {
            "plain": lambda plain=plain: con.execute(plain).fetchall(),
            "bounded": lambda bounded=bounded: con.execute(bounded).fetchall(),
            "cube": lambda st=st: cube.true_numerators(st.queries),
        }
        if not args.no_gateway:
            def gateway(sql: str = sql) -> Any:
                with warnings.catch_warnings(), dpgate.Gateway(con, SCHEMA, budget=1e9, seed=0) as gw:
                    warnings.simplefilter("ignore")  # seeded noise: a benchmark
                    t0 = time.perf_counter()
                    gw.query(sql, accuracy=1e6)
                    return time.perf_counter() - t0
            timers["gateway"] = gateway
        times: dict[str, list[float]] = {k: [] for k in timers}
        for _ in range(repeat):
            for key, fn in timers.items():
                t0 = time.perf_counter()
                out = fn()
                times[key].append(out if key == "gateway" else time.perf_counter() - t0)
        got = cube.true_numerators(st.queries)
        row = {"query": name, "sql": sql, **{f"{k}_ms": median_ms(v) for k, v in times.items()},
               "outputs": len(st.queries),
               # The hand-written bound keeps as many rows of each customer, by another order (its own hash):
               # equal totals without a filter on orders, close ones with.
               "plain_total": sum(int(r[-1]) for r in hand_plain), "hand_bounded_total": sum(int(r[-1]) for r in hand_bounded),
               "cube_total": int(sum(got))}
        row["cube/bounded"] = round(row["cube_ms"] / row["bounded_ms"], 2)
        row["cube/plain"] = round(row["cube_ms"] / row["plain_ms"], 2)
        if "gateway_ms" in row:
            row["gateway/bounded"] = round(row["gateway_ms"] / row["bounded_ms"], 2)
            row["gateway/plain"] = round(row["gateway_ms"] / row["plain_ms"], 2)
        results.append(row)
        print(json.dumps(row))
    cube.close()
    con.close()
    out = {"rows": rows, "units": units, "k": K, "repeat": repeat,
           "orders_per_customer_p99.8_and_max": [float(per_unit[0]), int(per_unit[1])] if per_unit else None,
           "machine": {"python": platform.python_version(), "duckdb": duckdb.__version__, "cpus": os.cpu_count(),
                       "load_average": os.getloadavg()},
           "results": results}
    target = REPO / "benchmarks" / "results" / ("join_quick.json" if args.quick else "join.json")
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
