"""Per-session budget order of the three policies over random sessions (issue 29, item 5).

Each session is a random sequence of statements on one table — the embedded PUMS
data (1 000 rows) or a synthetic table (3 000 rows: ``v`` in 0..4095, ``g`` in 5
categories, ``x`` in 0..100) — of these kinds: range COUNTs, GROUP BY counts,
filtered GROUP BYs, SUM / AVG over a range, exact repeats and near-repeats (an
earlier statement at another accuracy, or a range with one end moved), with random
accuracies and confidences in 0.8–0.99.  It runs on three fresh gateways (policies
``minimal``, ``paper``, ``no_reuse``; same frame, same seed, a budget nothing
reaches) and ``gw.spent`` is compared per session.  Decisions never depend on data
or noise, so the spends are a function of the statements alone.

An *exception* is a session where ``minimal > paper·1.005`` or ``paper >
no_reuse·1.005``; ``minimal > no_reuse`` is counted separately (dpgate proves it
never happens, :mod:`dpgate.plan._guard`, unless ``--relaxed``).  For each exception the statements
where the cumulative spends cross are printed (``--explain``).

Writes ``benchmarks/results/policy_order.json`` (per-session spends, exceptions,
mean ratios) and ``policy_order.csv``.  ``DPGATE_BENCH_QUICK=1`` (``run_all.py --quick``) runs
20 sessions.

Usage::

    python benchmarks/bench_policy_order.py [--sessions 200] [--statements 25] [--seed 0] [--explain] [--relaxed]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import sys
import time
import warnings
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
POLICIES = ("minimal", "paper", "no_reuse")
BUDGET = 1e6
TOLERANCE = 1.005


def synthetic_table(rows: int = 3000, seed: int = 12345) -> tuple[Any, Any]:
    """A synthetic table ``syn`` (``v`` skewed in 0..4095, ``g`` in 5 categories, ``x`` in 0..100)."""
    import pandas as pd

    from dpgate.schema import Schema

    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "v": np.minimum(4095, rng.gamma(2.0, 400.0, rows).astype(int)),
        "g": rng.choice(["a", "b", "c", "d", "e"], rows, p=[0.4, 0.25, 0.15, 0.12, 0.08]),
        "x": rng.integers(0, 101, rows),
    })
    schema = Schema.from_dict({"tables": {"syn": {"columns": {
        "v": {"type": "integer", "min": 0, "max": 4095},
        "g": {"type": "categorical", "values": ["a", "b", "c", "d", "e"]},
        "x": {"type": "integer", "min": 0, "max": 100},
    }}}})
    return df, schema


#: Per table: (name, range column, its breakpoints, group columns, a summed column, its max).
_TABLES: dict[str, tuple[str, list[int], list[str], str, int]] = {
    "pums": ("age", list(range(0, 101, 5)), ["sex", "married", "race", "educ"], "income", 500000),
    "syn": ("v", list(range(0, 4096, 256)) + [4095], ["g"], "x", 100),
}


def _range(rng: random.Random, points: list[int]) -> tuple[int, int]:
    a, b = sorted(rng.sample(points, 2))
    return a, b


def session_statements(seed: int, n: int) -> tuple[str, list[tuple[str, float, float]]]:
    """A random session: its table and ``n`` statements ``(sql, accuracy, confidence)``."""
    rng = random.Random(seed)
    table = "pums" if seed % 2 == 0 else "syn"
    col, points, groups, summed, top = _TABLES[table]
    rows = 1000 if table == "pums" else 3000
    out: list[tuple[str, float, float]] = []
    ranges: list[tuple[int, int]] = []
    while len(out) < n:
        conf = round(rng.uniform(0.8, 0.99), 3)
        kind = rng.random()
        if out and kind < 0.15:  # exact repeat at another accuracy (often tighter)
            sql, acc, _ = rng.choice(out)
            out.append((sql, round(acc * rng.uniform(0.6, 1.3), 3), conf))
            continue
        if ranges and kind < 0.3:  # near-repeat: an earlier range with one end moved
            a, b = rng.choice(ranges)
            step = points[1] - points[0]
            if rng.random() < 0.5:
                a = max(points[0], a + rng.choice([-step, step]))
            else:
                b = min(points[-1], b + rng.choice([-step, step]))
            a, b = min(a, b), max(a, b)
        else:
            a, b = _range(rng, points)
        ranges.append((a, b))
        where = f"{col} BETWEEN {a} AND {b}"
        r = rng.random()
        count_acc = round(rng.uniform(0.01, 0.06) * rows, 1)
        if r < 0.4:
            out.append((f"SELECT COUNT(*) FROM {table} WHERE {where}", count_acc, conf))
        elif r < 0.55:
            g = rng.choice(groups)
            out.append((f"SELECT {g}, COUNT(*) FROM {table} GROUP BY {g}", count_acc, conf))
        elif r < 0.75:
            g = rng.choice(groups)
            out.append((f"SELECT {g}, COUNT(*) FROM {table} WHERE {where} GROUP BY {g}", count_acc, conf))
        elif r < 0.9:
            out.append((f"SELECT SUM({summed}) FROM {table} WHERE {where}",
                        round(rng.uniform(0.02, 0.1) * top * rows / 10, 1), conf))
        else:
            out.append((f"SELECT AVG({summed}) FROM {table} WHERE {where}",
                        round(rng.uniform(0.02, 0.1) * top, 2), conf))
    return table, out


def run_session(seed: int, n: int) -> dict[str, Any]:
    """Run one session through the three policies; the cumulative spend after every statement."""
    import dpgate
    from dpgate.datasets import load_pums

    warnings.simplefilter("ignore")
    table, stmts = session_statements(seed, n)
    df, schema = load_pums() if table == "pums" else synthetic_table()
    out: dict[str, Any] = {"seed": seed, "table": table, "statements": stmts, "spent": {}, "curve": {}}
    for policy in POLICIES:
        gw = dpgate.Gateway(df, schema, budget=BUDGET, policy=policy, seed=seed)
        curve = []
        for sql, acc, conf in stmts:
            try:
                gw.query(sql, accuracy=acc, confidence=conf)
            except dpgate.Error as e:  # none expected; recorded
                curve.append(None)
                print(f"session {seed} {policy}: refused {sql!r}: {e}", file=sys.stderr)
                continue
            curve.append(gw.spent)
        out["spent"][policy] = gw.spent
        out["curve"][policy] = curve
        gw.close()
    return out


def _explain(run: dict[str, Any], hi: str, lo: str) -> list[str]:
    """The statements at which ``hi``'s cumulative spend goes above ``lo``'s (with both increases)."""
    lines = []
    ch, cl = run["curve"][hi], run["curve"][lo]
    prev_h = prev_l = 0.0
    above = False
    for i, (st, h, lv) in enumerate(zip(run["statements"], ch, cl, strict=True)):
        if h is None or lv is None:
            continue
        if (h > lv * 1.0000001) != above or h - prev_h > lv - prev_l + 1e-9:
            lines.append(f"    #{i + 1:2d} {st[0]}  ±{st[1]} @{st[2]}: {hi} +{h - prev_h:.4f} (={h:.4f}), "
                         f"{lo} +{lv - prev_l:.4f} (={lv:.4f})")
        above = h > lv * 1.0000001
        prev_h, prev_l = h, lv
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=20 if os.environ.get("DPGATE_BENCH_QUICK") else 200)
    p.add_argument("--statements", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="first session seed")
    p.add_argument("--explain", action="store_true", help="print where the spends cross in each exception")
    p.add_argument("--out", default="policy_order")
    p.add_argument("--relaxed", action="store_true", help="dpgate.plan._guard.RELAXED on (see there)")
    args = p.parse_args()
    if args.relaxed:
        from dpgate.plan import _guard

        _guard.RELAXED = True
    t0 = time.perf_counter()
    runs = []
    for s in range(args.seed, args.seed + args.sessions):
        runs.append(run_session(s, args.statements))
        if (s - args.seed + 1) % 20 == 0:
            print(f"  {s - args.seed + 1} sessions, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    exceptions = []
    for r in runs:
        m, pa, nr = (r["spent"][k] for k in POLICIES)
        for hi, lo, a, b in (("minimal", "paper", m, pa), ("paper", "no_reuse", pa, nr), ("minimal", "no_reuse", m, nr)):
            if a > b * (1 + 1e-9):
                exceptions.append({"seed": r["seed"], "table": r["table"], "order": f"{hi} > {lo}",
                                   "excess": a / b - 1, "beyond_tolerance": a > b * TOLERANCE,
                                   "crossings": _explain(r, hi, lo)})
    ratio = {name: float(np.mean([r["spent"][a] / r["spent"][b] for r in runs]))
             for name, a, b in (("minimal/paper", "minimal", "paper"), ("paper/no_reuse", "paper", "no_reuse"),
                                ("minimal/no_reuse", "minimal", "no_reuse"))}
    beyond = [e for e in exceptions if e["beyond_tolerance"]]
    summary = {
        "sessions": len(runs), "statements": args.statements, "first_seed": args.seed, "relaxed": args.relaxed,
        "seconds": time.perf_counter() - t0, "machine": f"{platform.machine()} {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "exceptions_any": len(exceptions), "exceptions_beyond_0.5%": len(beyond),
        "minimal>no_reuse": sum(e["order"] == "minimal > no_reuse" for e in exceptions),
        "mean_ratios": ratio,
        "worst": {o: max((e["excess"] for e in exceptions if e["order"] == o), default=0.0)
                  for o in ("minimal > paper", "paper > no_reuse", "minimal > no_reuse")},
    }
    print(json.dumps(summary, indent=1))
    for e in exceptions:
        print(f"session {e['seed']} ({e['table']}): {e['order']} by {100 * e['excess']:.3f} %"
              f"{' (beyond 0.5 %)' if e['beyond_tolerance'] else ''}")
        if args.explain:
            print("\n".join(e["crossings"]))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.out}.json"), "w", encoding="utf-8") as f:
        json.dump({"summary": summary, "exceptions": exceptions,
                   "sessions": [{"seed": r["seed"], "table": r["table"], "spent": r["spent"]} for r in runs]}, f, indent=1)
    with open(os.path.join(RESULTS, f"{args.out}.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["seed", "table", *POLICIES])
        for r in runs:
            w.writerow([r["seed"], r["table"], *(f"{r['spent'][k]:.6f}" for k in POLICIES)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
