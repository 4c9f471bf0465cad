"""GROUP BY and wide-query latency on PUMS against the targets of issue 14.

Every case runs in its own interpreter with a time limit, so the script always
finishes: a case that overruns is reported "did not finish" (with whatever it
measured before), never waited for.  Ratios are measured within one case, one
process, one run.

Cases (embedded PUMS, 1 000 rows; seeded noise, budget large enough that
nothing is refused for budget):

* ``ratios`` — single fresh ``COUNT(*)`` (median over ``--reps`` new gateways,
  each after one unrelated warm-up count) vs ``SELECT age, COUNT(*) … GROUP BY
  age`` (101 groups) fresh on a new gateway, fresh right after one ``GROUP BY
  sex``, and its exact repeat (answered from history).  Targets: fresh ≤ 5×,
  from history ≤ 2× the single count.
* ``history`` — the same after 50 mixed statements (GROUP BYs over
  educ/race/sex/married, age and income ranges, sums); also reports the
  history build time per statement and a fresh count at the end.  Targets: the
  same ratios, against the fresh count of the ``ratios`` case.
* ``age_race`` — ``GROUP BY age, race`` (606 groups) fresh: ≤ 1 s.
* ``age_educ_race`` — ``GROUP BY age, educ, race`` (9 696 groups): ≤ 10 s, or
  refused with a message naming a limit and nothing spent.
* ``atoms`` — ``SUM(age)``, ``GROUP BY`` educ, race, sex, married, then
  ``COUNT(*) WHERE income > 50000``: every statement answered.
* ``sum_income`` — ``SUM(income)`` on the shipped schema (500 001 income
  cells): answered.
* ``poisoning`` — on a table ``t(x2, y2)`` (integers 0..999, a seeded frame):
  ``SELECT SUM(x2 + 150*y2) AS a, SUM(x2 + 1000*y2) AS b FROM t`` then
  ``SELECT COUNT(*) FROM t WHERE x2 < 500``: the second is answered, charged no
  more than on a fresh gateway.

The single-shot latencies of ``ratios`` and ``history`` (a statement's first run in
its process, as an analyst meets it) are noisy on a shared machine, so those two
cases run in ``--processes`` separate interpreters (5) and report the median, with
every process's figure beside it.

Prints a PASS/FAIL table, writes ``benchmarks/results/groupby.json`` and
``groupby.md``.

Usage::

    python benchmarks/bench_groupby.py [--reps 3] [--timeout 60] [--quick] [--only ratios,atoms]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

COUNT_SQL = "SELECT COUNT(*) FROM pums WHERE age < 30"
WARMUP_SQL = "SELECT COUNT(*) FROM pums WHERE educ > 12"
AGE_SQL = "SELECT age, COUNT(*) FROM pums GROUP BY age"
ACCURACY = 10.0

#: 50 statements an analyst might have sent before: GROUP BYs over educ/race/sex/married
#: (one and two columns), age and income ranges, sums.  Accuracies tight enough that most
#: are fresh.
HISTORY: tuple[tuple[str, float], ...] = (
    ("SELECT COUNT(*) FROM pums", 10),
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15),
    ("SELECT married, COUNT(*) FROM pums GROUP BY married", 15),
    ("SELECT race, COUNT(*) FROM pums GROUP BY race", 12),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 12),
    ("SELECT SUM(age) FROM pums", 1500),
    ("SELECT sex, SUM(age) FROM pums GROUP BY sex", 1200),
    ("SELECT sex, married, COUNT(*) FROM pums GROUP BY sex, married", 12),
    ("SELECT race, sex, COUNT(*) FROM pums GROUP BY race, sex", 12),
    ("SELECT COUNT(*) FROM pums WHERE income > 50000", 12),
    ("SELECT COUNT(*) FROM pums WHERE income BETWEEN 20000 AND 40000", 12),
    ("SELECT SUM(educ) FROM pums", 300),
    ("SELECT married, SUM(educ) FROM pums GROUP BY married", 300),
    ("SELECT educ, married, COUNT(*) FROM pums WHERE sex = '1' GROUP BY educ, married", 12),
) + tuple(
    (f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {lo} AND {lo + w}", acc)
    for lo, w, acc in (
        (18, 7, 9), (26, 9, 9), (36, 9, 9), (46, 9, 9), (56, 9, 9), (66, 14, 9), (81, 19, 9),
        (20, 24, 11), (45, 19, 11), (30, 34, 13), (22, 5, 8), (33, 3, 8), (50, 12, 10),
        (60, 40, 12), (25, 50, 14),
    )
) + (
    ("SELECT COUNT(*) FROM pums WHERE age < 40 AND married", 11),
    ("SELECT COUNT(*) FROM pums WHERE age >= 40 AND NOT married", 11),
    ("SELECT COUNT(*) FROM pums WHERE educ >= 13 AND sex = '0'", 11),
    ("SELECT COUNT(*) FROM pums WHERE race IN ('2', '4') AND age < 50", 11),
    ("SELECT SUM(income > 100000) FROM pums WHERE sex = '1'", 10),
    ("SELECT SUM(age) FROM pums WHERE married", 900),
    ("SELECT SUM(age * married) FROM pums WHERE race = '1'", 900),
    ("SELECT sex, COUNT(*) AS n, SUM(income > 50000) AS rich FROM pums GROUP BY sex", 14),
    ("SELECT married, COUNT(*) FROM pums WHERE age < 30 GROUP BY married", 10),
    ("SELECT race, COUNT(*) FROM pums WHERE educ >= 13 GROUP BY race", 10),
    ("SELECT educ, COUNT(*) FROM pums WHERE married GROUP BY educ", 10),
    ("SELECT sex, COUNT(*) FROM pums WHERE income < 10000 GROUP BY sex", 10),
    ("SELECT COUNT(*) FROM pums WHERE income >= 100000", 9),
    ("SELECT COUNT(*) FROM pums WHERE educ BETWEEN 9 AND 12", 9),
    ("SELECT COUNT(*) FROM pums WHERE race = '3' AND sex = '1'", 9),
    ("SELECT SUM(educ) FROM pums WHERE age >= 65", 200),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", 8),
    ("SELECT married, sex, COUNT(*) FROM pums WHERE age >= 30 GROUP BY married, sex", 10),
    ("SELECT COUNT(*) FROM pums WHERE income BETWEEN 1 AND 9999", 10),
    ("SELECT COUNT(*) FROM pums WHERE educ < 9", 9),
    ("SELECT COUNT(*) FROM pums WHERE race = '1' AND married AND age >= 40", 9),
)
assert len(HISTORY) == 50, len(HISTORY)

ATOMS_SEQUENCE: tuple[tuple[str, float], ...] = (
    ("SELECT SUM(age) FROM pums", 1500),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 15),
    ("SELECT race, COUNT(*) FROM pums GROUP BY race", 15),
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15),
    ("SELECT married, COUNT(*) FROM pums GROUP BY married", 15),
    ("SELECT COUNT(*) FROM pums WHERE income > 50000", 15),
)

POISON_SCHEMA = {"tables": {"t": {"columns": {"x2": {"type": "integer", "min": 0, "max": 999},
                                              "y2": {"type": "integer", "min": 0, "max": 999}}}}}
POISON_SUMS = "SELECT SUM(x2 + 150*y2) AS a, SUM(x2 + 1000*y2) AS b FROM t"
POISON_COUNT = "SELECT COUNT(*) FROM t WHERE x2 < 500"


# -- the worker side: one case per interpreter, results as JSON lines on stdout --------------
def _emit(key: str, value: Any) -> None:
    print(json.dumps({key: value}), flush=True)


def _pums_gateway(seed: int) -> Any:
    import dpgate
    from dpgate.datasets import load_pums

    df, schema = load_pums()
    return dpgate.Gateway(df, schema, budget=1e6, seed=seed)


def _timed(gw: Any, sql: str, accuracy: float) -> tuple[float, Any]:
    t0 = time.perf_counter()
    res = gw.query(sql, accuracy=accuracy, confidence=0.95)
    return time.perf_counter() - t0, res


def _sources(res: Any) -> str:
    return "+".join(sorted({a.source for a in res.answers}))


def _fresh_count(seed: int) -> float:
    gw = _pums_gateway(seed)
    gw.query(WARMUP_SQL, accuracy=ACCURACY)  # first-call costs (DuckDB, imports) out of the timing
    dt, res = _timed(gw, COUNT_SQL, ACCURACY)
    assert res.answer.source == "fresh"
    return dt


def case_ratios(reps: int) -> None:
    counts = [_fresh_count(100 + r) for r in range(reps)]
    _emit("count_fresh_s", statistics.median(counts))
    _emit("count_fresh_all_s", counts)
    gw = _pums_gateway(1)
    gw.query(WARMUP_SQL, accuracy=ACCURACY)
    dt, res = _timed(gw, AGE_SQL, ACCURACY)
    _emit("age_fresh_new_gateway_s", dt)
    _emit("age_fresh_new_gateway_sources", _sources(res))
    gw = _pums_gateway(2)
    gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=15)
    dt, res = _timed(gw, AGE_SQL, ACCURACY)
    _emit("age_fresh_after_sex_s", dt)
    _emit("age_fresh_after_sex_sources", _sources(res))
    dt, res = _timed(gw, AGE_SQL, ACCURACY)
    _emit("age_repeat_s", dt)
    _emit("age_repeat_sources", _sources(res))


def _attempt(gw: Any, sql: str, accuracy: float) -> dict[str, Any]:
    """Time one statement; a refusal is a result (with its message), not a crash."""
    import dpgate

    t0 = time.perf_counter()
    try:
        res = gw.query(sql, accuracy=accuracy, confidence=0.95)
    except dpgate.Error as e:
        return {"seconds": time.perf_counter() - t0, "outcome": "refused", "message": f"{type(e).__name__}: {e}"}
    return {"seconds": time.perf_counter() - t0, "outcome": "answered", "sources": _sources(res)}


def case_history(reps: int) -> None:
    gw = _pums_gateway(3)
    build = []
    for sql, acc in HISTORY:
        build.append(_attempt(gw, sql, acc) | {"sql": sql})
        _emit("build", build)
    _emit("releases", len(gw.history))
    counts = [  # fresh counts on ranges history has not seen
        _attempt(gw, f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {31 + r} AND {39 + 2 * r}", 6) for r in range(reps)
    ]
    _emit("count_after_history", counts)
    _emit("age_fresh_after_history", _attempt(gw, AGE_SQL, ACCURACY))
    _emit("age_repeat_after_history", _attempt(gw, AGE_SQL, ACCURACY))


def _one_statement(sql: str, accuracy: float) -> None:
    gw = _pums_gateway(4)
    gw.query(WARMUP_SQL, accuracy=ACCURACY)
    spent = gw.spent
    out = _attempt(gw, sql, accuracy)
    out["spent_by_refusal"] = gw.spent - spent if out["outcome"] == "refused" else 0.0
    for k, v in out.items():
        _emit(k, v)


def case_age_race(reps: int) -> None:
    _one_statement("SELECT age, race, COUNT(*) FROM pums GROUP BY age, race", 10)


def case_age_educ_race(reps: int) -> None:
    _one_statement("SELECT age, educ, race, COUNT(*) FROM pums GROUP BY age, educ, race", 10)


def case_sum_income(reps: int) -> None:
    _one_statement("SELECT SUM(income) FROM pums", 1_000_000)


def case_atoms(reps: int) -> None:
    gw = _pums_gateway(5)
    steps = []
    for sql, acc in ATOMS_SEQUENCE:
        steps.append(_attempt(gw, sql, acc) | {"sql": sql})
        _emit("steps", steps)


def case_poisoning(reps: int) -> None:
    import numpy as np
    import pandas as pd

    import dpgate

    rng = np.random.default_rng(14)
    df = pd.DataFrame({"x2": rng.integers(0, 1000, 300), "y2": rng.integers(0, 1000, 300)})
    gw = dpgate.Gateway(df, POISON_SCHEMA, budget=1e6, seed=3)
    t0 = time.perf_counter()
    try:
        gw.query(POISON_SUMS, accuracy=1e5, confidence=0.95)
        _emit("sums_outcome", "answered")
    except dpgate.Error as e:
        _emit("sums_outcome", "refused")
        _emit("sums_message", str(e))
    _emit("sums_s", time.perf_counter() - t0)
    spent = gw.spent
    t0 = time.perf_counter()
    try:
        got = gw.query(POISON_COUNT, accuracy=10, confidence=0.95).answer
        _emit("count_outcome", "answered")
        _emit("count_epsilon", got.epsilon_spent)
    except dpgate.Error as e:
        _emit("count_outcome", "refused")
        _emit("count_message", str(e))
    _emit("count_s", time.perf_counter() - t0)
    _emit("spent_before_count", spent)
    fresh = dpgate.Gateway(df, POISON_SCHEMA, budget=1e6, seed=3)
    _emit("count_epsilon_on_fresh_gateway", fresh.query(POISON_COUNT, accuracy=10, confidence=0.95).answer.epsilon_spent)


CASES: dict[str, tuple[Callable[[int], None], float]] = {  # name: (function, time limit in s)
    "ratios": (case_ratios, 240.0),
    "history": (case_history, 420.0),
    "age_race": (case_age_race, 60.0),
    "age_educ_race": (case_age_educ_race, 60.0),
    "atoms": (case_atoms, 180.0),
    "sum_income": (case_sum_income, 60.0),
    "poisoning": (case_poisoning, 60.0),
}


# -- the parent side -------------------------------------------------------------------------
#: Cases whose figures are single-shot latencies: run in several processes, medians reported.
REPEATED = ("ratios", "history")


def _run_repeated(name: str, reps: int, limit: float, processes: int) -> dict[str, Any]:
    """:func:`_run_case` in ``processes`` interpreters, one after another: each latency is the
    median over them (every one kept under ``<key>_runs``); other figures are the first's."""
    runs = [_run_case(name, reps, limit) for _ in range(processes)]
    out = dict(runs[0])
    out["finished"] = all(r["finished"] for r in runs)
    out["wall_s"] = sum(r["wall_s"] for r in runs)
    out["processes"] = processes
    for r in runs:
        if "error" in r:
            out.setdefault("error", r["error"])
    for key, first in runs[0].items():
        if key.endswith("_s") and key not in ("wall_s", "limit_s") and isinstance(first, float):
            xs = [r[key] for r in runs if isinstance(r.get(key), float)]
            out[key], out[key + "_runs"] = statistics.median(xs), xs
        elif isinstance(first, dict) and "seconds" in first:  # one statement: {seconds, outcome, ...}
            done = [r[key] for r in runs if isinstance(r.get(key), dict)]
            refused = [d for d in done if d["outcome"] != "answered"]
            out[key] = refused[0] if refused else {
                **first, "seconds": statistics.median(d["seconds"] for d in done),
                "seconds_runs": [d["seconds"] for d in done],
                "sources": "+".join(sorted({s for d in done for s in d["sources"].split("+")})),
            }
    return out


def _run_case(name: str, reps: int, limit: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--case", name, "--reps", str(reps)]
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        stdout, finished, rc, stderr = proc.stdout, True, proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        raw = e.stdout or b""
        stdout = raw.decode() if isinstance(raw, bytes) else raw
        finished, rc, stderr = False, None, ""
    for line in stdout.splitlines():
        if line.startswith("{"):
            out.update(json.loads(line))
    out["finished"] = finished
    out["wall_s"] = time.perf_counter() - t0
    out["limit_s"] = limit
    if rc:
        out["error"] = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {rc}"
    return out


def _verdicts(res: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, PASS/FAIL/—) rows."""
    rows: list[tuple[str, str, str, str]] = []

    def dnf(case: str) -> str:
        c = res[case]
        return f"did not finish in {c['limit_s']:.0f} s" if not c["finished"] else c.get("error", "no result")

    def ratio_row(label: str, case: str, key: str, base: float | None, limit: float) -> None:
        c = res.get(case)
        if c is None:
            return
        if base is None or key not in c:
            rows.append((label, dnf(case), f"≤ {limit:g}×", "FAIL"))
            return
        r = c[key] / base
        spread = ""
        if key + "_runs" in c:  # each process's ratio to its own count, and their median
            each = sorted(x / b for x, b in zip(c[key + "_runs"], c["count_fresh_s_runs"], strict=True))
            r = statistics.median(each)
            spread = f"; per process {each[0]:.1f}–{each[-1]:.1f}×"
        rows.append((label, f"{c[key] * 1e3:.0f} ms = {r:.1f}× ({c.get(key[:-2] + '_sources', '')}{spread})",
                     f"≤ {limit:g}×", "PASS" if r <= limit else "FAIL"))

    base = res.get("ratios", {}).get("count_fresh_s")
    if "ratios" in res:
        rows.append(("single fresh COUNT(*) (median)", f"{base * 1e3:.1f} ms" if base else dnf("ratios"), "", "—"))
    ratio_row("GROUP BY age fresh, new gateway", "ratios", "age_fresh_new_gateway_s", base, 5)
    ratio_row("GROUP BY age fresh, after GROUP BY sex", "ratios", "age_fresh_after_sex_s", base, 5)
    ratio_row("GROUP BY age repeat (from history)", "ratios", "age_repeat_s", base, 2)
    if "history" in res:
        h = res["history"]
        build = h.get("build", [])
        refused = [b for b in build if b["outcome"] != "answered"]
        rows.append(("history: 50 statements", f"{len(build)} run in {sum(b['seconds'] for b in build):.1f} s, "
                     f"{len(refused)} refused, {h.get('releases', '?')} releases"
                     + (f"; first refusal: {refused[0]['sql']}: {refused[0]['message'][:90]}" if refused else ""),
                     "all answered", "PASS" if len(build) == 50 and not refused else "FAIL"))
        counts = [c["seconds"] for c in h.get("count_after_history", []) if c["outcome"] == "answered"]
        if counts and base:
            med = statistics.median(counts)
            rows.append(("fresh COUNT after history (median)", f"{med * 1e3:.0f} ms = {med / base:.1f}×", "", "—"))
    if "history" in res:
        h = res["history"]
        for key, label, limit in (("age_fresh_after_history", "GROUP BY age fresh after history", 5.0),
                                  ("age_repeat_after_history", "GROUP BY age repeat after history", 2.0)):
            c = h.get(key)
            if c is None:
                rows.append((label, dnf("history"), f"≤ {limit:g}×", "FAIL"))
            elif c["outcome"] != "answered":
                rows.append((label, f"refused in {c['seconds']:.2f} s: {c['message'][:100]}", f"≤ {limit:g}×",
                             "FAIL"))
            elif base:
                r = c["seconds"] / base
                each = sorted(c.get("seconds_runs", [c["seconds"]]))
                spread = f"; per process {each[0] * 1e3:.0f}–{each[-1] * 1e3:.0f} ms" if len(each) > 1 else ""
                rows.append((label, f"{c['seconds'] * 1e3:.0f} ms = {r:.1f}× ({c['sources']}{spread})",
                             f"≤ {limit:g}×", "PASS" if r <= limit else "FAIL"))
    for case, label, limit in (("age_race", "GROUP BY age, race (606 groups)", 1.0),
                               ("age_educ_race", "GROUP BY age, educ, race (9 696 groups)", 10.0)):
        if case not in res:
            continue
        c = res[case]
        if "outcome" not in c:
            rows.append((label, dnf(case), f"≤ {limit:g} s", "FAIL"))
        elif c["outcome"] == "answered":
            rows.append((label, f"answered in {c['seconds']:.2f} s", f"≤ {limit:g} s",
                         "PASS" if c["seconds"] <= limit else "FAIL"))
        else:
            ok = (case == "age_educ_race" and c["spent_by_refusal"] == 0 and "limit" in c["message"].lower()
                  and c["seconds"] <= limit)
            rows.append((label, f"refused in {c['seconds']:.2f} s: {c['message'][:90]}",
                         f"≤ {limit:g} s" + (" or refused naming a limit" if case == "age_educ_race" else ""),
                         "PASS" if ok else "FAIL"))
    if "atoms" in res:
        c = res["atoms"]
        steps = c.get("steps", [])
        ok = len(steps) == len(ATOMS_SEQUENCE) and all(s["outcome"] == "answered" for s in steps)
        desc = ", ".join(f"{s['outcome']} {s['seconds']:.2f} s" for s in steps)
        if len(steps) < len(ATOMS_SEQUENCE):
            desc += f"; {dnf('atoms')}"
        rows.append(("SUM(age); GROUP BY educ, race, sex, married; COUNT WHERE income > 50000", desc,
                     "all answered", "PASS" if ok else "FAIL"))
    if "sum_income" in res:
        c = res["sum_income"]
        desc = (f"{c['outcome']} in {c['seconds']:.2f} s" + (f": {c['message'][:90]}" if "message" in c else "")
                if "outcome" in c else dnf("sum_income"))
        rows.append(("SUM(income), shipped schema", desc, "answered", "PASS" if c.get("outcome") == "answered"
                     else "FAIL"))
    if "poisoning" in res:
        c = res["poisoning"]
        # Per-cell accounting: the COUNT's charge is max(B + c) − max B ≤ max c, its charge on a
        # fresh gateway, with equality when the SUMs' costs peak on its cells.
        fresh = c.get("count_epsilon_on_fresh_gateway")
        within = c.get("count_epsilon") is not None and fresh is not None and c["count_epsilon"] <= fresh + 1e-12
        desc = (f"two SUMs {c.get('sums_outcome', '?')}; then COUNT WHERE x2 < 500 {c.get('count_outcome', '?')}"
                + ("" if c.get("count_outcome") != "answered" else
                   f" (charge {c['count_epsilon']:.4g}, a fresh gateway's {fresh:.4g})"))
        ok = c.get("count_outcome") == "answered" and within and (c.get("sums_outcome") == "answered"
                                                                   or c.get("spent_before_count") == 0)
        rows.append(("poisoning sequence", desc, "COUNT answered, charged ≤ on a fresh gateway",
                     "PASS" if ok else "FAIL"))
    return rows


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| figure | measured | target | verdict |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # worker mode
    ap.add_argument("--reps", type=int, default=3, help="fresh counts timed for the median (3)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="time limit per case in s (default: per case, 60-420 s)")
    ap.add_argument("--only", default="", help="comma-separated cases: " + ",".join(CASES))
    ap.add_argument("--processes", type=int, default=5,
                    help="interpreters the single-shot latency cases run in, for their median (5)")
    ap.add_argument("--quick", action="store_true", help="1 rep, 1 process, 60 s per case (smoke run)")
    args = ap.parse_args(argv)
    if args.case:
        warnings.simplefilter("ignore")  # seeded noise warns; expected here
        CASES[args.case][0](args.reps)
        return 0
    reps = 1 if args.quick else args.reps
    names = [n for n in (args.only.split(",") if args.only else CASES) if n]
    unknown = set(names) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {list(CASES)}")
    res: dict[str, dict[str, Any]] = {}
    for name in names:
        limit = args.timeout if args.timeout is not None else (60.0 if args.quick else CASES[name][1])
        print(f"[{name}] running (limit {limit:.0f} s) …", flush=True)
        processes = 1 if args.quick else args.processes
        res[name] = _run_repeated(name, reps, limit, processes) if name in REPEATED else _run_case(name, reps, limit)
        print(f"[{name}] {'done' if res[name]['finished'] else 'DID NOT FINISH'} in {res[name]['wall_s']:.1f} s",
              flush=True)
    rows = _verdicts(res)
    table = _table(rows)
    print()
    print(table)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg(), "quick": args.quick, "reps": reps,
               "processes": 1 if args.quick else args.processes,
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "groupby.json"), "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "cases": res,
                   "verdicts": [dict(zip(("figure", "measured", "target", "verdict"), r, strict=True))
                                for r in rows]}, f, indent=1)
    with open(os.path.join(RESULTS, "groupby.md"), "w", encoding="utf-8") as f:
        f.write(f"PUMS GROUP BY latency vs issue 14's targets (reps {reps}; latencies: median over "
                f"{machine['processes']} processes; load average at the end "
                f"{machine['loadavg_at_end'][0]:.2f}).\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
