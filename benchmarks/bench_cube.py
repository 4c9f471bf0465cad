"""Benchmark the cube (true answers from generated SQL) and atom refinement.

Builds a 10-million-row PUMS-like table in a temporary DuckDB file, then in one run
measures, as medians over several interleaved repetitions:

* a 5-predicate ``COUNT(*)`` through :meth:`dpgate.release.cube.Cube.true_numerator` (SQL
  generation included) versus the equivalent hand-written ``SELECT COUNT(*) … WHERE …``
  run directly on the same DuckDB connection — the ratio (target ≤ 1.2×);
* the same for a negated conjunction, a weighted sum over income slabs, and a
  ``GROUP BY age`` batch (102 linear queries in one ``true_numerators`` call) versus a
  hand-written ``GROUP BY``;
* histograms (one column at full resolution, two columns, a coarse 3-column grid);
* compile latency when ``dpgate.compile_sql`` is available (the LinearQuery is then
  taken from the compiler and checked equal to the hand-built one);
* atom refinement: 1 000 random income × age range queries.

Prints a summary and writes ``benchmarks/results/cube.json`` with the machine.

Usage::

    python benchmarks/bench_cube.py [--rows N] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.datasets import schema_of
from dpgate.plan.atoms import AtomPartition
from dpgate.release.cube import Cube

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "cube.json"
SCHEMA = schema_of("pums")
T = SCHEMA.table("pums")

HAND_5 = (
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 49 AND sex = 1 AND educ >= 12 "
    "AND race IN (1, 2) AND income < 50000"
)
HAND_NOT = (
    "SELECT COUNT(*) FROM pums WHERE NOT (age BETWEEN 30 AND 49 AND sex = 1 AND educ >= 12 "
    "AND race IN (1, 2) AND income < 50000) OR age IS NULL OR sex IS NULL OR educ IS NULL "
    "OR race IS NULL OR income IS NULL"
)
HAND_WEIGHTED = (
    "SELECT SUM(CASE WHEN income < 10000 THEN 1 WHEN income < 50000 THEN 2 WHEN income < 100000 THEN 3 "
    "ELSE 5 END) FROM pums WHERE income IS NOT NULL AND married"
)
HAND_GROUP = "SELECT age, COUNT(*) FROM pums WHERE sex = 0 GROUP BY age"


def build(path: str, rows: int) -> None:
    con = duckdb.connect(path)
    con.execute("SELECT setseed(0.42)")
    con.execute(
        f"""CREATE TABLE pums AS SELECT
            CAST(floor(random() * 101) AS BIGINT) AS age,
            CAST(random() < 0.5 AS BIGINT) AS sex,
            CAST(1 + floor(random() * 16) AS BIGINT) AS educ,
            CAST(1 + floor(random() * 6) AS BIGINT) AS race,
            CAST(floor(random() * random() * 500001) AS BIGINT) AS income,
            CAST(random() < 0.45 AS BIGINT) AS married
        FROM range({rows})"""
    )
    con.close()


def q5() -> LinearQuery:
    # age 30..49, sex '1', educ >= 12 (cells 11..15; 16 is NULL), race in {'1','2'} (cells 0,1),
    # income < 50000 — NULL cells get weight 0, as SQL's WHERE gives them.
    w = np.zeros((3, 3, 3, 2, 2))
    w[1, 1, 1, 0, 0] = 1
    return LinearQuery.from_grid(
        T, ["age", "sex", "educ", "race", "income"],
        [[0, 30, 50], [0, 1, 2], [0, 11, 16], [0, 2], [0, 50000]], w,
    )


def q_not(q: LinearQuery) -> LinearQuery:
    full = q.expand(T, list(q.columns), list(q.breakpoints)).astype(float)
    return LinearQuery.from_grid(T, list(q.columns), list(q.breakpoints), 1 - full)


def q_weighted() -> LinearQuery:
    inc = T.column("income")
    w = np.array([[0, 1], [0, 2], [0, 3], [0, 5], [0, 0]], dtype=float)  # income slabs × married F/T(+NULL→0)
    w = np.concatenate([w, np.zeros((5, 1))], axis=1)
    return LinearQuery.from_grid(
        T, ["income", "married"], [[0, 10000, 50000, 100000, inc.n_cells - 1], [0, 1, 2]], w
    )


def q_group() -> list[LinearQuery]:
    age = T.column("age")
    out = []
    for a in range(age.n_cells):
        w = np.zeros((age.n_cells, 4))
        w[a, 0] = 1
        out.append(LinearQuery.from_grid(T, ["age", "sex"], [list(range(age.n_cells)), [0, 1, 2, 3]], w))
    return out


def median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e3


def paired(dp, hand, repeat: int) -> dict:
    """Interleaved medians of dpgate and hand-written runs, and their ratio."""
    dp(), hand()
    a, b = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        dp()
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hand()
        b.append(time.perf_counter() - t0)
    da, db = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    return {"dpgate_ms": round(da, 2), "duckdb_ms": round(db, 2), "ratio": round(da / db, 3), "repeat": repeat}


def bench_atoms(n: int) -> dict:
    rng = np.random.default_rng(0)
    p = AtomPartition(T)
    inc = T.column("income")
    times = []
    for _ in range(n):
        lo, hi = sorted(rng.choice(np.arange(1, inc.n_cells - 1), 2, replace=False).tolist())
        a = int(rng.integers(1, 100))
        q = LinearQuery.from_grid(T, ["income", "age"], [[0, lo, hi], [0, a]], np.array([[0, 0.0], [1, 0], [0, 0]]))
        t0 = time.perf_counter()
        p.refine(q)
        p.vector(q)
        times.append(time.perf_counter() - t0)
    xs = sorted(times)
    return {
        "queries": n, "atoms": p.n_atoms, "grid": [len(b) for b in p.breakpoints],
        "refine_plus_vector_p50_ms": round(xs[len(xs) // 2] * 1e3, 3),
        "refine_plus_vector_p95_ms": round(xs[int(0.95 * len(xs))] * 1e3, 3),
        "total_s": round(sum(xs), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--atoms", type=int, default=1000)
    args = ap.parse_args()

    out: dict = {
        "machine": {
            "platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "duckdb": duckdb.__version__,
        },
        "rows": args.rows,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.duckdb")
        t0 = time.perf_counter()
        build(path, args.rows)
        out["build_table_s"] = round(time.perf_counter() - t0, 2)
        con = duckdb.connect(path, read_only=True)
        t0 = time.perf_counter()
        cube = Cube(con, SCHEMA)
        out["cube_open_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        hand = lambda sql: (lambda: con.execute(sql).fetchall())  # noqa: E731

        q = q5()
        compiled = None
        try:
            try:
                from dpgate import compile_sql  # type: ignore[attr-defined]
            except ImportError:
                from dpgate.compile import compile_sql  # type: ignore[no-redef]

            compiled = compile_sql(HAND_5, SCHEMA)[0]
            out["compiled_equals_hand_built"] = compiled == q
            ts = []
            for _ in range(200):
                t0 = time.perf_counter()
                compile_sql(HAND_5, SCHEMA)
                ts.append(time.perf_counter() - t0)
            out["compile_p50_ms_incl_parse"] = round(statistics.median(ts) * 1e3, 3)
            out["true_answer_via"] = "compile_sql"
        except ImportError:
            out["compile_sql"] = "not available in this checkout; LinearQuery built with from_grid"
        query = compiled if compiled is not None and compiled == q else q

        want = con.execute(HAND_5).fetchone()[0]
        assert cube.true_numerator(query) == want, "dpgate and DuckDB disagree"
        out["count_5_predicates"] = paired(lambda: cube.true_numerator(query), hand(HAND_5), args.repeat)
        out["count_5_predicates"]["true_count"] = "checked equal"

        qn = q_not(q)
        assert cube.true_numerator(qn) == con.execute(HAND_NOT).fetchone()[0]
        out["count_negated"] = paired(lambda: cube.true_numerator(qn), hand(HAND_NOT), args.repeat)

        qw = q_weighted()
        assert cube.true_numerator(qw) == con.execute(HAND_WEIGHTED).fetchone()[0]
        out["weighted_sum"] = paired(lambda: cube.true_numerator(qw), hand(HAND_WEIGHTED), args.repeat)

        qg = q_group()
        got = cube.true_numerators(qg)
        ref = dict(con.execute(HAND_GROUP).fetchall())
        assert got[:-1] == [ref.get(a, 0) for a in range(101)] and got[-1] == ref.get(None, 0)
        out["group_by_age_102_queries"] = paired(lambda: cube.true_numerators(qg), hand(HAND_GROUP), args.repeat)

        out["histogram_ms"] = {
            "age_full_102_cells": round(median_ms(lambda: cube.histogram("pums", ["age"]), args.repeat), 2),
            "age_x_educ_full": round(median_ms(lambda: cube.histogram("pums", ["age", "educ"]), args.repeat), 2),
            "coarse_age3_sex_income4": round(median_ms(lambda: cube.histogram(
                "pums", ["age", "sex", "income"], [[0, 30, 65], [0, 1, 2, 3], [0, 10000, 50000, 100000]]), args.repeat), 2),
            "income_full_500002_cells": round(median_ms(lambda: cube.histogram("pums", ["income"]), max(3, args.repeat // 5)), 2),
        }
        out["fingerprint_ms"] = round(median_ms(cube.fingerprint, 3), 2)
        cube.close()
        con.close()
    out["atoms_income_x_age"] = bench_atoms(args.atoms)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    c = out["count_5_predicates"]
    print(
        f"\n5-predicate COUNT on {args.rows:,} rows: dpgate {c['dpgate_ms']} ms vs DuckDB {c['duckdb_ms']} ms "
        f"→ ratio {c['ratio']} (target ≤ 1.2)"
    )
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
