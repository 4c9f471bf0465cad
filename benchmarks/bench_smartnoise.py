"""dpgate beside SmartNoise SQL on the same PUMS analyst sessions (issue 28's targets).

Sessions, on the embedded PUMS sample (1 000 rows):

* ``analyst54`` — the 54 statements of ``bench_session.py`` (``SESSION``);
* ``pums200``  — a 200-statement session written here (``PUMS200``): counts with
  ranges / ``IN`` over 1–3 columns, 1- and 2-column ``GROUP BY``s (plain and
  filtered), ``SUM``/``AVG`` of age and income with and without ``WHERE`` /
  ``GROUP BY``, rephrasings, and 50 exact repeats (25 %) interleaved;
* ``pums50``   — the first 50 statements of ``pums200`` (issue 28's "50-statement
  PUMS session"; the issue's own script is not in the repository, so its numbers
  — ε 2.67 / SmartNoise 7.49 — are of a different statement list).

dpgate: one seeded ``Gateway`` per session (policy ``minimal``, budget 10⁴ so
nothing is refused for budget, confidence 0.95, the accuracy given with each
statement: ±8–30 rows on counts, proportionate on sums, "in rows" per component
for AVG as ``dpgate.answer.combine`` defines it).  Recorded per statement: the wall
time of ``gw.query``, ε spent, answers, answers from history (free), isolated
answers (``Answer.isolated``).  Total ε is ``gw.spent``.

SmartNoise SQL runs in its own virtualenv (``--smartnoise-python``, default
``/work/sn-venv/bin/python``; install with ``python3.11 -m venv /work/sn-venv &&
/work/sn-venv/bin/pip install smartnoise-sql pandas``) through
``_smartnoise_runner.py``: metadata in SmartNoise's published PUMS shape (table
``PUMS.PUMS``, ``row_privacy``, ``max_ids: 1``, age 0..100, income 0..500000, educ
1..16 and married boolean as dpgate declares them) with ``censor_dims: false``
(dpgate answers declared keys; so SmartNoise spends no δ either).  SmartNoise
answers each query at a fixed ε per mechanism and has no accuracy parameter, so
each statement's ε is chosen so that SmartNoise's 95 % half-width matches the
accuracy asked of dpgate: a count (sensitivity 1, geometric noise of scale 1/ε)
gets ε = ln(1/0.05)/accuracy; a ``SUM(x)`` (sensitivity max|x| = upper bound) gets
ε = ln(20)·upper/accuracy; an ``AVG`` (SmartNoise's noisy SUM and COUNT) gets the
count rule on each component, matching dpgate's per-component accuracy in rows.
SmartNoise's total cost is reported both as the basic composition (sum over every
mechanism of every statement) and as its own ``OdometerHeterogeneous`` (Kairouz et
al. heterogeneous composition; with δ = 0 it equals the basic sum).  Statements
SmartNoise refuses (syntax it does not parse, aggregates over expressions) are
recorded and skipped for both systems in the comparison columns; dpgate's totals
are reported both over all statements and over those SmartNoise accepts.

Reported per session: total ε of each, per-statement time medians, the maximum
over statements of dpgate time / SmartNoise time (the target is ≤ 0.1 at every
statement), isolated outputs, share of answers free.  Writes
``benchmarks/results/smartnoise.json`` and ``smartnoise.md``.

Usage::

    python benchmarks/bench_smartnoise.py [--quick] [--seed 1] [--smartnoise-python PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RUNNER = os.path.join(HERE, "_smartnoise_runner.py")
DEFAULT_SN_PYTHON = "/work/sn-venv/bin/python"
CONFIDENCE = 0.95
BUDGET = 1e4
#: Declared upper bounds (lower bounds are 0 or 1): SmartNoise's SUM sensitivity.
UPPER = {"age": 100, "income": 500_000, "educ": 16}

sys.path.insert(0, HERE)
from bench_session import SESSION as SESSION54  # noqa: E402


def _pums200() -> tuple[tuple[str, float, str], ...]:
    """150 first-time statements and rephrasings, then 50 exact repeats interleaved (every 4th)."""
    fresh: list[tuple[str, float, str]] = [
        ("SELECT COUNT(*) FROM pums", 10, "count"),
        ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15, "group by 1"),
        ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", 15, "count range"),
        ("SELECT AVG(age) FROM pums", 15, "avg"),
        ("SELECT race, COUNT(*) FROM pums GROUP BY race", 12, "group by 1"),
        ("SELECT COUNT(*) FROM pums WHERE race IN ('1', '2')", 20, "count IN"),
        ("SELECT SUM(income) FROM pums", 2_000_000, "sum"),
        ("SELECT sex, AVG(income) FROM pums GROUP BY sex", 20, "avg group by"),
        ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 12, "group by 1"),
        ("SELECT COUNT(*) FROM pums WHERE educ >= 13 AND sex = '1'", 15, "count 2 cols"),
        ("SELECT married, COUNT(*) FROM pums GROUP BY married", 15, "group by 1"),
        ("SELECT sex, married, COUNT(*) FROM pums GROUP BY sex, married", 12, "group by 2"),
        ("SELECT COUNT(*) FROM pums WHERE age >= 20 AND age < 30", 20, "rephrasing"),
        ("SELECT AVG(income) FROM pums", 20, "avg"),
        ("SELECT SUM(age) FROM pums WHERE sex = '0'", 1000, "sum where"),
        ("SELECT race, sex, COUNT(*) FROM pums GROUP BY race, sex", 12, "group by 2"),
        ("SELECT COUNT(*) FROM pums WHERE income > 50000", 15, "count range"),
        ("SELECT educ, AVG(income) FROM pums GROUP BY educ", 20, "avg group by"),
        ("SELECT COUNT(*) FROM pums WHERE race IN ('3', '4', '5', '6')", 20, "count IN"),
        ("SELECT married, AVG(age) FROM pums GROUP BY married", 15, "avg group by"),
    ]
    decades = [(0, 19), (20, 29), (30, 39), (40, 49), (50, 64), (65, 100)]
    for lo, hi in decades:
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {hi}", 15, "count range"))
    for lo, hi in decades[1:5]:
        fresh.append((f"SELECT sex, COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {hi} GROUP BY sex", 12,
                      "filtered group by"))
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {hi} AND married", 15, "count 2 cols"))
    for cut in (10000, 25000, 40000, 75000, 100000, 200000):
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE income < {cut}", 15, "count range"))
    for lo, hi in ((0, 9999), (10000, 29999), (30000, 59999), (60000, 99999)):
        fresh.append((f"SELECT SUM(income) FROM pums WHERE income BETWEEN {lo} AND {hi}", 1_000_000, "sum where"))
    for races in (("1",), ("2",), ("1", "3"), ("2", "3"), ("4", "5", "6")):
        inlist = ", ".join(f"'{r}'" for r in races)
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE race IN ({inlist}) AND educ >= 13", 15, "count 2 cols"))
        fresh.append((f"SELECT sex, COUNT(*) FROM pums WHERE race IN ({inlist}) GROUP BY sex", 15,
                      "filtered group by"))
    for col in ("sex", "race", "married"):
        fresh.append((f"SELECT {col}, SUM(age) FROM pums GROUP BY {col}", 1000, "sum group by"))
        fresh.append((f"SELECT {col}, SUM(income) FROM pums GROUP BY {col}", 2_000_000, "sum group by"))
        fresh.append((f"SELECT {col}, AVG(age) FROM pums WHERE educ >= 9 GROUP BY {col}", 20, "avg where group by"))
    for lo, hi in ((1, 8), (9, 12), (13, 16)):
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE educ BETWEEN {lo} AND {hi}", 15, "count range"))
        fresh.append((f"SELECT AVG(income) FROM pums WHERE educ BETWEEN {lo} AND {hi}", 20, "avg where"))
        fresh.append((f"SELECT race, COUNT(*) FROM pums WHERE educ BETWEEN {lo} AND {hi} GROUP BY race", 10,
                      "filtered group by"))
    for s in ("0", "1"):
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE sex = '{s}' AND age >= 40 AND married", 12, "count 3 cols"))
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE sex = '{s}' AND income > 40000 AND educ >= 13", 12,
                       "count 3 cols"))
        fresh.append((f"SELECT educ, COUNT(*) FROM pums WHERE sex = '{s}' GROUP BY educ", 12, "filtered group by"))
        fresh.append((f"SELECT AVG(income) FROM pums WHERE sex = '{s}' AND age >= 30", 20, "avg where"))
        fresh.append((f"SELECT married, SUM(income) FROM pums WHERE sex = '{s}' GROUP BY married", 2_000_000,
                      "sum where group by"))
    fresh += [
        ("SELECT COUNT(*) FROM pums WHERE NOT (sex = '1')", 25, "rephrasing"),
        ("SELECT COUNT(*) FROM PUMS.PUMS WHERE married = TRUE", 20, "rephrasing"),
        ("SELECT COUNT(*) FROM pums WHERE race = '2' OR race = '3'", 20, "rephrasing"),
        ("SELECT COUNT(*) FROM pums WHERE age >= 30 AND age <= 39", 20, "rephrasing"),
        ("SELECT COUNT(*) FROM pums WHERE married AND age < 30", 15, "rephrasing"),
        ("SELECT COUNT(*) FROM pums WHERE age < 40", 30, "count union"),
        ("SELECT COUNT(*) FROM pums WHERE age >= 65", 12, "count range"),
        ("SELECT COUNT(*) FROM pums WHERE income >= 100000", 10, "count range"),
        ("SELECT COUNT(*) FROM pums WHERE income BETWEEN 20000 AND 50000", 15, "count range"),
        ("SELECT COUNT(*) FROM pums WHERE educ < 9", 12, "count range"),
        ("SELECT COUNT(*) FROM pums WHERE educ > 12 AND NOT married", 15, "count 2 cols"),
        ("SELECT race, married, COUNT(*) FROM pums GROUP BY race, married", 12, "group by 2"),
        ("SELECT educ, sex, COUNT(*) FROM pums GROUP BY educ, sex", 10, "group by 2"),
        ("SELECT sex, married, COUNT(*) FROM pums WHERE age >= 30 GROUP BY sex, married", 12, "filtered group by 2"),
        ("SELECT race, sex, COUNT(*) FROM pums WHERE income > 30000 GROUP BY race, sex", 12, "filtered group by 2"),
        ("SELECT age, COUNT(*) FROM pums GROUP BY age", 8, "group by 1"),
        ("SELECT married, COUNT(*) FROM pums WHERE age < 30 GROUP BY married", 12, "filtered group by"),
        ("SELECT SUM(age) FROM pums", 1500, "sum"),
        ("SELECT SUM(age) FROM pums WHERE married", 900, "sum where"),
        ("SELECT SUM(income) FROM pums WHERE age >= 40", 1_500_000, "sum where"),
        ("SELECT SUM(income) FROM pums WHERE sex = '1' AND educ >= 13", 1_000_000, "sum where"),
        ("SELECT AVG(age) FROM pums WHERE income > 50000", 15, "avg where"),
        ("SELECT AVG(income) FROM pums WHERE married", 20, "avg where"),
        ("SELECT AVG(income) FROM pums WHERE age BETWEEN 30 AND 49", 20, "avg where"),
        ("SELECT sex, AVG(age) FROM pums GROUP BY sex", 15, "avg group by"),
        ("SELECT race, AVG(income) FROM pums GROUP BY race", 20, "avg group by"),
        ("SELECT sex, married, AVG(income) FROM pums GROUP BY sex, married", 20, "avg group by 2"),
        ("SELECT sex, married, SUM(income) FROM pums GROUP BY sex, married", 2_000_000, "sum group by 2"),
        ("SELECT educ, SUM(income) FROM pums GROUP BY educ", 2_000_000, "sum group by"),
        ("SELECT educ, AVG(age) FROM pums GROUP BY educ", 20, "avg group by"),
        ("SELECT race, AVG(income) FROM pums WHERE age >= 25 GROUP BY race", 20, "avg where group by"),
        ("SELECT sex, SUM(income) FROM pums WHERE educ >= 13 GROUP BY sex", 2_000_000, "sum where group by"),
        ("SELECT married, AVG(income) FROM pums WHERE age < 40 GROUP BY married", 20, "avg where group by"),
        ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 25 AND 34 AND sex = '0'", 12, "count 2 cols"),
        ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 35 AND 44 AND race IN ('1', '2')", 12, "count 2 cols"),
        ("SELECT COUNT(*) FROM pums WHERE educ BETWEEN 9 AND 12 AND income < 30000 AND married", 12, "count 3 cols"),
        ("SELECT COUNT(*) FROM pums WHERE race = '1' AND sex = '1' AND age < 30", 12, "count 3 cols"),
        ("SELECT COUNT(*) FROM pums WHERE income > 50000 AND age >= 50", 12, "count 2 cols"),
    ]
    for lo, hi in ((18, 24), (25, 29), (30, 34), (35, 39), (45, 54), (55, 64)):
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {hi}", 12, "count sub-range"))
    for r in ("1", "2", "3"):
        fresh.append((f"SELECT educ, COUNT(*) FROM pums WHERE race = '{r}' GROUP BY educ", 12, "filtered group by"))
        fresh.append((f"SELECT AVG(age) FROM pums WHERE race = '{r}'", 15, "avg where"))
        fresh.append((f"SELECT SUM(income) FROM pums WHERE race = '{r}'", 1_500_000, "sum where"))
    for m in ("TRUE", "FALSE"):
        fresh.append((f"SELECT race, COUNT(*) FROM pums WHERE married = {m} GROUP BY race", 12, "filtered group by"))
        fresh.append((f"SELECT sex, AVG(income) FROM pums WHERE married = {m} GROUP BY sex", 20,
                      "avg where group by"))
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE married = {m} AND income BETWEEN 10000 AND 60000", 15,
                      "count 2 cols"))
    for cut in (9, 12, 14):
        fresh.append((f"SELECT sex, COUNT(*) FROM pums WHERE educ > {cut} GROUP BY sex", 12, "filtered group by"))
        fresh.append((f"SELECT COUNT(*) FROM pums WHERE educ > {cut} AND age < 35", 12, "count 2 cols"))
    fresh += [
        ("SELECT race, COUNT(*) FROM pums WHERE race IN ('1', '2', '3') GROUP BY race", 12, "filtered group by"),
        ("SELECT sex, COUNT(*) FROM pums WHERE income >= 100000 GROUP BY sex", 10, "filtered group by"),
        ("SELECT COUNT(*) FROM pums WHERE sex = '1'", 20, "count"),
    ]
    fresh = fresh[:150]
    out: list[tuple[str, float, str]] = []
    k = 0
    for i, stmt in enumerate(fresh):
        out.append(stmt)
        if i % 3 == 2 and len(out) < 200:  # after every 3 fresh, repeat one seen earlier (deterministic walk)
            k = (k * 7 + 5) % len(out)
            sql, acc, _ = out[k]
            out.append((sql, acc, "repeat"))
    return tuple(out[:200])


PUMS200 = _pums200()


def _sessions(quick: bool) -> dict[str, tuple[tuple[str, float, str], ...]]:
    if quick:
        return {"analyst54": SESSION54[:20], "pums50": PUMS200[:50]}
    return {"analyst54": SESSION54, "pums50": PUMS200[:50], "pums200": PUMS200}


# -- SmartNoise: ε per statement, SQL rewrite, the subprocess ---------------------------------
def smartnoise_epsilon(sql: str, accuracy: float) -> float:
    """SmartNoise's per-mechanism ε whose 95 % half-width matches ``accuracy`` (see module docstring)."""
    m = re.search(r"\bSUM\(\s*(age|income|educ)\s*\)", sql, re.IGNORECASE)
    scale = UPPER[m.group(1).lower()] if m else 1
    return math.log(1 / (1 - CONFIDENCE)) * scale / accuracy


def _smartnoise_sql(sql: str) -> str:
    return re.sub(r"\bFROM\s+pums\b(?!\.)", "FROM PUMS.PUMS", sql, flags=re.IGNORECASE)


def run_runner(python: str, request: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The SmartNoise runner's answer to ``request(csv)`` (``csv``: PUMS written to a temporary file),
    run by the interpreter ``python`` of SmartNoise's own virtualenv."""
    from dpgate.datasets import load_pums

    df, _ = load_pums()
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "PUMS.csv")
        df.to_csv(csv, index=False)
        proc = subprocess.run([python, RUNNER], input=json.dumps(request(csv)), capture_output=True, text=True,
                              timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"SmartNoise runner failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def run_smartnoise(python: str, statements: tuple[tuple[str, float, str], ...]) -> dict[str, Any]:
    return run_runner(python, lambda csv: {"csv": csv, "delta": 0.0, "statements": [
        {"sql": _smartnoise_sql(q), "epsilon": smartnoise_epsilon(q, a)} for q, a, _ in statements]})


# -- dpgate -----------------------------------------------------------------------------------
def run_dpgate(statements: tuple[tuple[str, float, str], ...], seed: int) -> dict[str, Any]:
    import dpgate
    from dpgate.datasets import load_pums

    warnings.simplefilter("ignore")  # seeded noise warns; expected in a benchmark
    df, schema = load_pums()
    warm = dpgate.Gateway(df, schema, budget=BUDGET, seed=seed)  # warm-up on a throwaway gateway (imports, JIT)
    warm.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=10, confidence=CONFIDENCE)
    warm.close()
    gw = dpgate.Gateway(df, schema, budget=BUDGET, seed=seed)
    out = []
    for sql, acc, _ in statements:
        t0 = time.perf_counter()
        try:
            res = gw.query(sql, accuracy=acc, confidence=CONFIDENCE)
        except dpgate.Error as e:
            out.append({"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        dt = time.perf_counter() - t0
        out.append({"seconds": dt, "epsilon": res.epsilon_spent, "answers": len(res.answers),
                    "free": sum(a.source == "history" for a in res.answers),
                    "isolated": sum(bool(a.isolated) for a in res.answers)})
    spent = gw.spent
    gw.close()
    return {"statements": out, "spent": spent}


# -- comparison -------------------------------------------------------------------------------
def compare(statements: tuple[tuple[str, float, str], ...], sn: dict[str, Any], dp: dict[str, Any],
            dp_full: dict[str, Any]) -> dict[str, Any]:
    """``dp`` ran the statements SmartNoise accepted (in order), ``dp_full`` all of them."""
    accepted = [i for i, s in enumerate(sn["statements"]) if "error" not in s]
    rows = []
    for i, d in zip(accepted, dp["statements"], strict=True):
        sql, acc, kind = statements[i]
        rows.append({"index": i + 1, "sql": sql, "accuracy": acc, "kind": kind,
                     "sn_epsilon_per_mechanism": smartnoise_epsilon(sql, acc), "dpgate": d,
                     "smartnoise": sn["statements"][i]})
    both = [r for r in rows if "error" not in r["dpgate"]]
    ratios = [r["dpgate"]["seconds"] / r["smartnoise"]["seconds"] for r in both]
    order = sorted(range(len(both)), key=lambda i: -ratios[i])
    answered = [r["dpgate"] for r in both]
    answers = sum(d["answers"] for d in answered)
    full_answered = [d for d in dp_full["statements"] if "error" not in d]
    return {
        "statements": len(statements),
        "smartnoise_refused": [{"index": i + 1, "sql": statements[i][0], "error": s["error"]}
                               for i, s in enumerate(sn["statements"]) if "error" in s],
        "dpgate_refused": [{"index": r["index"], "sql": r["sql"], "error": r["dpgate"]["error"]}
                           for r in rows if "error" in r["dpgate"]],
        "compared": len(both),
        "dpgate_epsilon": dp["spent"],
        "dpgate_epsilon_full_session": dp_full["spent"],
        "dpgate_isolated_full_session": sum(d["isolated"] for d in full_answered),
        "smartnoise_epsilon_basic": sn["basic_epsilon"],
        "smartnoise_epsilon_odometer": sn["odometer_epsilon"],
        "dpgate_median_seconds": statistics.median(r["dpgate"]["seconds"] for r in both) if both else None,
        "smartnoise_median_seconds": statistics.median(r["smartnoise"]["seconds"] for r in both) if both else None,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "max_ratio": max(ratios) if ratios else None,
        "statements_over_0.1x": sum(r > 0.1 for r in ratios),
        "slowest_ratios": [{"sql": both[i]["sql"], "ratio": ratios[i], "dpgate_seconds": both[i]["dpgate"]["seconds"],
                            "smartnoise_seconds": both[i]["smartnoise"]["seconds"]} for i in order[:8]],
        "isolated_outputs": sum(d["isolated"] for d in answered),
        "answers": answers,
        "free_share": sum(d["free"] for d in answered) / answers if answers else None,
        "rows": rows,
    }


def _table(summary: dict[str, dict[str, Any]]) -> str:
    head = ("| session | statements (compared) | ε dpgate (full session) | ε SmartNoise basic / odometer | "
            "median s dpgate / SmartNoise | median ratio | max ratio | stmts > 0.1× | isolated (full) | free |")
    lines = [head, "|" + "---|" * 10]
    for name, c in summary.items():
        lines.append(
            f"| {name} | {c['statements']} ({c['compared']}) | {c['dpgate_epsilon']:.2f} "
            f"({c['dpgate_epsilon_full_session']:.2f}) | {c['smartnoise_epsilon_basic']:.2f} / "
            f"{c['smartnoise_epsilon_odometer']:.2f} | "
            f"{c['dpgate_median_seconds']:.4f} / {c['smartnoise_median_seconds']:.4f} | {c['median_ratio']:.2f} | "
            f"{c['max_ratio']:.1f} | {c['statements_over_0.1x']} | {c['isolated_outputs']} "
            f"({c['dpgate_isolated_full_session']}) | {c['free_share']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="first 20 statements of analyst54 and pums50 only")
    ap.add_argument("--seed", type=int, default=1, help="dpgate's noise seed (1)")
    ap.add_argument("--smartnoise-python", default=os.environ.get("SMARTNOISE_PYTHON", DEFAULT_SN_PYTHON),
                    help=f"interpreter of SmartNoise's virtualenv ({DEFAULT_SN_PYTHON})")
    args = ap.parse_args(argv)
    if not os.path.exists(args.smartnoise_python):
        print(f"SmartNoise's interpreter {args.smartnoise_python} is missing: create its virtualenv "
              "(see the module docstring) or pass --smartnoise-python; nothing run.")
        return 0
    t0 = time.perf_counter()
    summary: dict[str, dict[str, Any]] = {}
    sn_version = None
    for name, stmts in _sessions(args.quick).items():
        sn = run_smartnoise(args.smartnoise_python, stmts)
        sn_version = (sn.get("snsql_version"), sn.get("opendp_version"))
        accepted = tuple(st for st, r in zip(stmts, sn["statements"], strict=True) if "error" not in r)
        dp = run_dpgate(accepted, args.seed)
        dp_full = dp if len(accepted) == len(stmts) else run_dpgate(stmts, args.seed)
        summary[name] = compare(stmts, sn, dp, dp_full)
        c = summary[name]
        print(f"{name}: ε dpgate {c['dpgate_epsilon']:.3f} (full session {c['dpgate_epsilon_full_session']:.3f}), "
              f"SmartNoise {c['smartnoise_epsilon_basic']:.3f}; max time ratio {c['max_ratio']:.2f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    table = _table(summary)
    print()
    print(table)
    for name, c in summary.items():
        for r in c["smartnoise_refused"]:
            print(f"SmartNoise refused in {name}: #{r['index']} {r['sql']}: {r['error'][:120]}")
        for r in c["dpgate_refused"]:
            print(f"dpgate refused in {name}: #{r['index']} {r['sql']}: {r['error'][:120]}")
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg(), "wall_seconds": time.perf_counter() - t0,
               "smartnoise_python": args.smartnoise_python, "smartnoise_sql_and_opendp_versions": sn_version}
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(os.path.join(RESULTS, f"smartnoise{suffix}.json"), "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "quick": args.quick, "seed": args.seed, "confidence": CONFIDENCE,
                   "budget": BUDGET, "sessions": summary}, f, indent=1)
    with open(os.path.join(RESULTS, f"smartnoise{suffix}.md"), "w", encoding="utf-8") as f:
        f.write(f"dpgate vs SmartNoise SQL on PUMS sessions (seed {args.seed}, {machine['wall_seconds']:.0f} s wall, "
                f"load average at the end {machine['loadavg_at_end'][0]:.2f}).\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
