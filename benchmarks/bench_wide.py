"""Wide SUM / AVG columns on PUMS (issue 28): ``income`` is declared 0..500 000 (500 002 cells).

Measured in one run, on the embedded PUMS data (1 000 rows):

* **fresh**: ``SELECT sex, AVG(income) FROM pums GROUP BY sex`` against ``SELECT sex, COUNT(*)
  FROM pums GROUP BY sex`` — median over ``--reps`` calls, each on a new seeded gateway (budget
  1e9, accuracy ±20 rows at 95 %); wall and CPU time of ``Gateway.query``.  The compiled
  statement is cached by the process after its first call (both statements alike), so the first
  call of each is reported apart (``first``).
* **history**: the same statements repeated on a gateway that released them (answered from
  history, nothing spent), median over ``--reps``.
* **history frame**: ``len(gw.history)`` and ``gw.history`` on a gateway with 14 released
  AVG(income) statements (56 releases), first read and again.
* **ledger text**: the length of a wide query's ledger JSON (``LinearQuery.to_json``) and of the
  plain-list form that ledgers held before.
* **statements a COUNT accepts**: SUM / AVG(income) with ``GROUP BY educ``, ``GROUP BY sex,
  married``, ``WHERE age > 30 GROUP BY race`` (refused before by the compiler's grid limit),
  ``WHERE age >= 30 GROUP BY sex, race`` (refused before by ``MAX_WIDE_BOXES``):
  each in a child process on a new gateway: time, answered or refused, ε, how many intervals hold
  the true value (pandas on the frame; groups without rows skipped), the repeat's time (from
  history) and the child's peak RSS.  AVG at ±20 rows, SUM at ±2 000 000.

Targets (issue 28): AVG fresh ≤ 2× the COUNT fresh, from history ≤ 2× a COUNT from history,
``len(gw.history)`` fast, the statements answered honestly.

Run it against another checkout (``PYTHONPATH=… python benchmarks/bench_wide.py --output …``)
for a before/after comparison: it uses only the public API.

Usage::

    python benchmarks/bench_wide.py [--reps 7] [--output benchmarks/results/wide.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
AVG = "SELECT sex, AVG(income) FROM pums GROUP BY sex"
COUNT = "SELECT sex, COUNT(*) FROM pums GROUP BY sex"
ACCURACY = 20.0  # rows (AVG's accuracy is in rows of its components)
SUM_ACCURACY = 2e6  # dollars of income (a group's SUM is 0.2–10 million)
WIDE = [
    ("SUM", ["educ"], None), ("AVG", ["educ"], None),
    ("SUM", ["sex", "married"], None), ("AVG", ["sex", "married"], None),
    ("SUM", ["race"], "age > 30"), ("AVG", ["race"], "age > 30"),
    ("SUM", ["sex", "race"], "age >= 30"), ("AVG", ["sex", "race"], "age >= 30"),  # refused before 2026-11-28
]


def _timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = call()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _median(rows: list[tuple[float, float]]) -> dict[str, float]:
    return {"wall_s": statistics.median(r[0] for r in rows), "cpu_s": statistics.median(r[1] for r in rows)}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fresh_and_history(dpgate: Any, df: Any, schema: Any, sql: str, reps: int) -> dict[str, Any]:
    first = _timed(lambda: dpgate.Gateway(df, schema, budget=1e9, seed=100).query(sql, accuracy=ACCURACY))
    fresh = []
    for i in range(reps):
        gw = dpgate.Gateway(df, schema, budget=1e9, seed=i)
        fresh.append(_timed(lambda gw=gw: gw.query(sql, accuracy=ACCURACY))[:2])
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    gw.query(sql, accuracy=ACCURACY)
    history = []
    for _ in range(reps):
        wall, cpu, result = _timed(lambda: gw.query(sql, accuracy=ACCURACY))
        history.append((wall, cpu))
    sources = sorted(set(result.to_pandas().filter(like="_source").stack().tolist()))
    return {"first": {"wall_s": first[0], "cpu_s": first[1]}, "fresh": _median(fresh), "history": _median(history),
            "history_sources": sources}


def _history_frame(dpgate: Any, df: Any, schema: Any) -> dict[str, Any]:
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    for i in range(14):  # each more accurate than the last: 14 fresh statements, 56 releases
        gw.query(AVG, accuracy=ACCURACY / (i + 1))
    n_first = _timed(lambda: len(gw.history))
    n_again = _timed(lambda: len(gw.history))
    frame = _timed(lambda: gw.history)
    return {"releases": n_first[2], "len_history_first": {"wall_s": n_first[0], "cpu_s": n_first[1]},
            "len_history_again": {"wall_s": n_again[0], "cpu_s": n_again[1]},
            "history_again": {"wall_s": frame[0], "cpu_s": frame[1]},
            "measured_example": str(frame[2]["measured"].iloc[1])}


def _ledger_text(dpgate: Any, df: Any, schema: Any) -> dict[str, Any]:
    stmt = dpgate.Gateway(df, schema, budget=1e9, seed=0).compile("SELECT sex, SUM(income) FROM pums GROUP BY sex")
    q = stmt.queries[0]
    plain = json.dumps({"table": q.table, "columns": list(q.columns), "breakpoints": [list(b) for b in q.breakpoints],
                        "numerators": q.numerators.tolist(), "denominator": q.denominator, "offset": str(q.offset)},
                       separators=(",", ":"))
    return {"query_json_chars": len(q.to_json()), "plain_list_json_chars": len(plain)}


def _truth(df: Any, agg: str, group: list[str], where: str | None) -> dict[tuple[int, ...], float]:
    frame = df.query(where) if where else df
    grouped = frame.groupby(group)["income"]
    values = grouped.sum() if agg == "SUM" else grouped.mean()
    return {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): float(v) for k, v in values.items()}


def _statement(dpgate: Any, df: Any, schema: Any, index: int) -> dict[str, Any]:
    """Statement ``index`` of :data:`WIDE` on a new gateway (run in a child process: its peak RSS is its own)."""
    agg, group, where = WIDE[index]
    cols = ", ".join(group)
    sql = f"SELECT {cols}, {agg}(income) AS v FROM pums" + (f" WHERE {where}" if where else "") + f" GROUP BY {cols}"
    accuracy = ACCURACY if agg == "AVG" else SUM_ACCURACY
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=10 + index)
    row: dict[str, Any] = {"sql": sql, "accuracy": accuracy}
    try:
        wall, cpu, result = _timed(lambda: gw.query(sql, accuracy=accuracy))
    except dpgate.Error as exc:
        row.update(answered=False, refusal=str(exc)[:200])
    else:
        frame = result.to_pandas()
        truth = _truth(df, agg, group, where)
        held = total = 0
        for _, r in frame.iterrows():
            expected = truth.get(tuple(int(r[c]) for c in group))
            if expected is not None:
                total += 1
                held += int(r["v_low"] - 1e-6 <= expected <= r["v_high"] + 1e-6)
        repeat = _timed(lambda: gw.query(sql, accuracy=accuracy))
        row.update(answered=True, wall_s=wall, cpu_s=cpu, epsilon=gw.spent, groups=len(frame),
                   intervals_holding_truth=f"{held}/{total}", repeat_wall_s=repeat[0],
                   repeat_sources=sorted(set(repeat[2].to_pandas()["v_source"])))
    row["peak_rss_mb"] = _rss_mb()
    return row


def _statements() -> list[dict[str, Any]]:
    out = []
    for index in range(len(WIDE)):
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--statement", str(index)],
                               capture_output=True, text=True, check=True, env=os.environ.copy())
        out.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--output", default=os.path.join(RESULTS, "wide.json"))
    parser.add_argument("--statement", type=int, default=None, help=argparse.SUPPRESS)  # one of WIDE, in a child
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import dpgate
    from dpgate.datasets import load_pums

    df, schema = load_pums()
    if args.statement is not None:
        print(json.dumps(_statement(dpgate, df, schema, args.statement), default=str))
        return 0
    dpgate.Gateway(df, schema, budget=1e9, seed=0).query("SELECT COUNT(*) FROM pums", accuracy=ACCURACY)  # warm-up
    count = _fresh_and_history(dpgate, df, schema, COUNT, args.reps)
    avg = _fresh_and_history(dpgate, df, schema, AVG, args.reps)
    ratios = {what: avg[what]["cpu_s"] / count[what]["cpu_s"] for what in ("first", "fresh", "history")}
    results = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "dpgate": dpgate.__file__, "reps": args.reps,
        "count_group_by_sex": count, "avg_income_group_by_sex": avg, "avg_over_count_cpu": ratios,
        "history_frame": _history_frame(dpgate, df, schema),
        "ledger_text": _ledger_text(dpgate, df, schema),
        "statements": _statements(),
    }
    print(f"dpgate: {dpgate.__file__}")
    for what in ("first", "fresh", "history"):
        print(f"{what:8s} COUNT {count[what]['cpu_s'] * 1e3:9.2f} ms cpu ({count[what]['wall_s'] * 1e3:9.2f} wall)   "
              f"AVG {avg[what]['cpu_s'] * 1e3:9.2f} ms cpu ({avg[what]['wall_s'] * 1e3:9.2f} wall)   "
              f"AVG/COUNT {ratios[what]:6.2f}×")
    h = results["history_frame"]
    print(f"len(gw.history) with {h['releases']} releases: {h['len_history_first']['wall_s'] * 1e3:.1f} ms first, "
          f"{h['len_history_again']['wall_s'] * 1e3:.1f} ms again; gw.history again {h['history_again']['wall_s'] * 1e3:.1f} ms")
    lt = results["ledger_text"]
    print(f"ledger JSON of SUM(income) for one sex: {lt['query_json_chars']} chars (plain lists: {lt['plain_list_json_chars']})")
    for row in results["statements"]:
        if row["answered"]:
            print(f"{row['sql']}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s cpu, ε {row['epsilon']:.4f}, "
                  f"{row['intervals_holding_truth']} intervals hold the truth, repeat {row['repeat_wall_s'] * 1e3:.1f} ms "
                  f"({'/'.join(row['repeat_sources'])}), peak RSS {row['peak_rss_mb']:.0f} MB")
        else:
            print(f"{row['sql']}: REFUSED ({row['refusal'][:90]}…)")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2, default=str)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
