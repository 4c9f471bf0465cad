"""A large GROUP BY released, then repeated: the repeat (free, from history) against the release.

Issue 27, part F: a review measured a free repeat of a released 2 048-group GROUP BY holding
the gateway's lock for 79 s (512 groups: 0.2 s, 1 024: 8 s) — the repeat's estimates were
found together, then evicted from a memo smaller than the GROUP BY and found again one by one,
through dense products cubic in the groups — and a 38 784-group statement costing 11–22 s
before ``max_outputs`` refused it.

Data: a DuckDB table ``t(k, v)`` of 20 000 rows, ``k`` = row number mod K declared 0..K−1
(K groups), ``v`` in 0..99.  For each K: a new gateway (seeded noise, budget 1e6; a warm-up
statement on another gateway first), ``SELECT k, COUNT(*) FROM t GROUP BY k`` at ±20 (fresh:
every group released) and the same statement again (answered from history, nothing spent).
Reported: both times (``Gateway.query``: the repeat's time is spent under the gateway's lock),
their ratio, and the repeat's answers' sources.  The case ``2048 after COUNT(*)`` releases the
table's total first: the GROUP BY's coefficients are then a dense triangular factor (each
group's residual against the total), so its products are dense — reported, without a target.
Last, on PUMS, the time to refuse ``GROUP BY age, educ, race, sex, married`` (38 784 outputs
> ``max_outputs`` = 4 096).

Targets: the 2 048-group repeat within 2× the release's time and under 2 s; the refusal
under 0.5 s.

Prints a table and writes ``benchmarks/results/groupby_repeat.json``.

Usage::

    python benchmarks/bench_groupby_repeat.py [--groups 512,1024,2048] [--reps 3] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ROWS = 20_000
SQL = "SELECT k, COUNT(*) FROM t GROUP BY k"
WIDE_SQL = "SELECT age, educ, race, sex, married, COUNT(*) FROM pums GROUP BY age, educ, race, sex, married"


def _database(path: str, groups: int) -> dict[str, Any]:
    """Write ``t`` to a DuckDB file at ``path``; return its schema."""
    import duckdb

    con = duckdb.connect(path)
    con.execute(f"CREATE TABLE t AS SELECT (i % {groups})::INTEGER AS k, ((i * 7919) % 100)::INTEGER AS v "
                f"FROM range({ROWS}) r(i)")
    con.close()
    return {"tables": {"t": {"columns": {"k": {"type": "integer", "min": 0, "max": groups - 1},
                                         "v": {"type": "integer", "min": 0, "max": 99}}}}}


def one_run(groups: int, directory: str, seed: int, after_total: bool = False) -> dict[str, Any]:
    """Release and repeat the K-group GROUP BY on a new gateway (``after_total``: after a released
    ``COUNT(*)`` on the same gateway)."""
    import dpgate

    path = os.path.join(directory, f"t{groups}_{seed}_{after_total}.duckdb")
    schema = _database(path, groups)
    with dpgate.Gateway(path, schema, budget=1e6, seed=seed) as warm:  # first-call costs out of the timing
        warm.query("SELECT COUNT(*) FROM t WHERE v < 50", accuracy=20)
    with dpgate.Gateway(path, schema, budget=1e6, seed=seed) as gw:
        if after_total:
            gw.query("SELECT COUNT(*) FROM t", accuracy=20)
        t0 = time.perf_counter()
        first = gw.query(SQL, accuracy=20)
        t1 = time.perf_counter()
        spent = gw.spent
        repeat = gw.query(SQL, accuracy=20)
        t2 = time.perf_counter()
        same = all(a.value == b.value for a, b in zip(first.answers, repeat.answers, strict=True))
        return {"first_s": t1 - t0, "repeat_s": t2 - t1, "first_sources": sorted({a.source for a in first.answers}),
                "repeat_sources": sorted({a.source for a in repeat.answers}), "repeat_spent": gw.spent - spent,
                "repeat_values_equal_release": same}


def refusal_time() -> dict[str, Any]:
    """Time ``Gateway.query`` to refuse the 38 784-output statement on PUMS."""
    import dpgate
    from dpgate.datasets import load_pums

    df, schema = load_pums()
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=0)
    t0 = time.perf_counter()
    try:
        gw.query(WIDE_SQL, accuracy=10)
        outcome, message = "answered", ""
    except dpgate.Error as e:
        outcome, message = type(e).__name__, str(e)
    return {"seconds": time.perf_counter() - t0, "outcome": outcome, "message": message[:160], "spent": gw.spent}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default="512,1024,2048", help="comma-separated K (512,1024,2048)")
    ap.add_argument("--reps", type=int, default=3, help="new gateways per K; medians reported (3)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "groupby_repeat.json"))
    ap.add_argument("--quick", action="store_true", help="1 rep (smoke run)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # seeded noise warns; expected here
    reps = 1 if args.quick else args.reps
    import dpgate

    cases: dict[str, Any] = {}
    rows = ["| groups | release (fresh) | repeat (history) | repeat / release | repeat sources |",
            "|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory() as directory:
        plan = [(int(g), False) for g in args.groups.split(",") if g] + [(2048, True)]
        for groups, after_total in plan:
            runs = [one_run(groups, directory, seed, after_total) for seed in range(reps)]
            label = f"{groups} after COUNT(*)" if after_total else str(groups)
            first = statistics.median(r["first_s"] for r in runs)
            repeat = statistics.median(r["repeat_s"] for r in runs)
            ratio = statistics.median(r["repeat_s"] / r["first_s"] for r in runs)
            cases[label] = {"first_s": first, "repeat_s": repeat, "ratio": ratio, "runs": runs}
            rows.append(f"| {label} | {first:.3f} s | {repeat:.3f} s | {ratio:.2f}× | "
                        f"{'+'.join(runs[0]['repeat_sources'])} |")
            print(rows[-1], flush=True)
    refused = refusal_time()
    table = "\n".join(rows)
    print()
    print(table)
    print(f"\n38 784-output statement: {refused['outcome']} in {refused['seconds']:.3f} s "
          f"(spent {refused['spent']:g}): {refused['message']}")
    big = cases.get("2048")
    verdicts = {}
    if big is not None:
        verdicts["repeat_2048_within_2x"] = big["ratio"] <= 2.0
        verdicts["repeat_2048_under_2s"] = big["repeat_s"] < 2.0
    verdicts["refusal_under_0.5s"] = refused["outcome"] == "QueryTooComplex" and refused["seconds"] < 0.5
    print("verdicts:", ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in verdicts.items()))
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg(), "reps": reps, "dpgate": dpgate.__file__}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "rows": ROWS, "cases": cases, "refusal": refused, "verdicts": verdicts},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
