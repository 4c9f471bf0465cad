"""An analyst's session on PUMS, as written by a person, through three policies.

54 statements on the embedded PUMS data (1 000 rows): first-time counts,
exact repeats, rephrasings (``age >= 20 AND age < 30`` for ``BETWEEN 20 AND
29``, ``NOT (sex = '1')``, ``SUM(income > 50000)`` for a ``COUNT`` with a
``WHERE``, ``FILTER``, a ``CASE`` sum, a scaled count), unions of earlier
ranges and groups, sub-ranges, 1- and 2-column ``GROUP BY``s (sex, married,
educ, race, age; sex × married, race × sex), ``SUM``s (age, educ, income) and a
statement with two outputs per group.  Confidence 0.95 throughout; accuracies
as an analyst would pick them (±10–30 on counts).

Each session runs the same statements on three fresh gateways —
``no_reuse``, ``paper`` (Xiao & Xiong, "Bayesian Inference under Differential
Privacy" (2012), §5) and ``minimal`` (dpgate's default) — with seeded noise
(seed = session number) and a budget large enough that nothing is refused for
budget.  Sessions differ only in their noise, so total ε and sources are the
same in every session (decisions never depend on data or noise), while
coverage is judged over independent sessions.

Reported per policy: total ε (``gw.spent``), share of answers (and of
statements) answered free from history, refusals, coverage — the share of
answers whose ``[low, high]`` holds the true answer, computed exactly by DuckDB
running the analyst's SQL on the raw frame (a brute force independent of
dpgate; empty groups are 0) — with its standard error (the larger of the
binomial SE at the nominal confidence and the between-session SE, since answers
of one session share history noise), and p50/p95 latency of ``gw.query`` by
statement index (plotted).  A coverage below ``confidence − 3 SE`` is flagged.

Writes ``benchmarks/results/session.json``, ``session.md`` and
``session_latency.png`` (matplotlib, from the ``demo`` extra).

Usage::

    python benchmarks/bench_session.py [--sessions 100] [--jobs 1] [--quick] [--statements 54] [--progress]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any, Literal

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
CONFIDENCE = 0.95
POLICIES: tuple[Literal["no_reuse", "paper", "minimal"], ...] = ("no_reuse", "paper", "minimal")
#: Large enough that no statement of the session is refused for budget under any policy.
BUDGET = 1e4

#: (SQL, accuracy, what it is).  Group columns come first in every SELECT list (the truth
#: is matched on them).
SESSION: tuple[tuple[str, float, str], ...] = (
    ("SELECT COUNT(*) FROM pums", 10, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age >= 20 AND age < 30", 20, "rephrasing"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 39", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 39", 25, "union"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 40 AND 49", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 50 AND 64", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age >= 65", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE age < 40", 30, "union"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 25 AND 29", 12, "sub-range"),
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE sex = '1'", 20, "repeat (group)"),
    ("SELECT COUNT(*) FROM pums WHERE NOT (sex = '1')", 25, "rephrasing"),
    ("SELECT married, COUNT(*) FROM pums GROUP BY married", 15, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE married = TRUE", 20, "repeat (group)"),
    ("SELECT sex, married, COUNT(*) FROM pums GROUP BY sex, married", 12, "group by 2"),
    ("SELECT COUNT(*) FROM pums WHERE sex = '0' AND married", 20, "repeat (group)"),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 12, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE educ >= 13", 25, "union"),
    ("SELECT COUNT(*) FROM pums WHERE educ BETWEEN 13 AND 14", 18, "union"),
    ("SELECT race, COUNT(*) FROM pums GROUP BY race", 12, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE race IN ('2', '3')", 20, "union"),
    ("SELECT race, sex, COUNT(*) FROM pums GROUP BY race, sex", 12, "group by 2"),
    ("SELECT SUM(age) FROM pums", 1500, "sum"),
    ("SELECT SUM(age) FROM pums WHERE sex = '0'", 1000, "sum"),
    ("SELECT sex, SUM(age) FROM pums GROUP BY sex", 1000, "group by 1 (sum)"),
    ("SELECT SUM(age) FROM pums", 2000, "repeat"),
    ("SELECT SUM(educ) FROM pums", 300, "sum"),
    ("SELECT married, SUM(educ) FROM pums GROUP BY married", 250, "group by 1 (sum)"),
    ("SELECT COUNT(*) FROM pums WHERE income > 50000", 15, "first"),
    ("SELECT SUM(income > 50000) FROM pums", 20, "rephrasing"),
    ("SELECT sex, COUNT(*) AS n, SUM(income > 50000) AS rich FROM pums GROUP BY sex", 20, "group by 1 (2 outputs)"),
    ("SELECT COUNT(*) FROM pums WHERE income BETWEEN 20000 AND 50000", 15, "first"),
    ("SELECT COUNT(*) FROM pums WHERE income <= 50000", 25, "union"),
    ("SELECT COUNT(*) FROM pums WHERE income >= 100000", 10, "sub-range"),
    ("SELECT married, COUNT(*) FROM pums WHERE age < 30 GROUP BY married", 12, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE age < 30 AND married", 15, "repeat (group)"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", 15, "repeat"),
    ("SELECT educ, COUNT(*) FROM pums WHERE sex = '1' GROUP BY educ", 12, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE sex = '1' AND educ >= 13", 20, "union"),
    ("SELECT age, COUNT(*) FROM pums GROUP BY age", 8, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 34", 12, "union"),
    ("SELECT race, COUNT(*) FROM pums WHERE educ >= 13 GROUP BY race", 10, "group by 1"),
    ("SELECT COUNT(*) FROM pums WHERE race = '1' AND educ >= 13", 15, "repeat (group)"),
    ("SELECT SUM(age) FROM pums WHERE married", 900, "sum"),
    ("SELECT SUM(CASE WHEN married THEN age ELSE 0 END) FROM pums", 1000, "rephrasing"),
    ("SELECT COUNT(*) FILTER (WHERE sex = '0') FROM pums", 20, "rephrasing"),
    ("SELECT 2*COUNT(*) - 10 FROM pums WHERE age >= 65", 40, "rephrasing"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 18 AND 24", 12, "union"),
    ("SELECT COUNT(*) FROM pums WHERE educ < 9", 12, "union"),
    ("SELECT sex, married, COUNT(*) FROM pums WHERE age >= 30 GROUP BY sex, married", 12, "group by 2"),
    ("SELECT COUNT(*) FROM pums WHERE income < 10000", 12, "first"),
    ("SELECT SUM(income) FROM pums", 2_000_000, "sum"),
    ("SELECT COUNT(*) FROM pums", 10, "repeat"),
)


# -- truth: the analyst's SQL run by DuckDB on the raw frame (benchmark only) ----------------
def _truth_connection() -> Any:
    """DuckDB over PUMS typed as declared (sex/race text, married boolean)."""
    import duckdb
    import pandas as pd

    from dpgate.datasets import load_pums

    df, _ = load_pums()
    typed = pd.DataFrame({
        "age": df["age"].astype("int64"), "sex": df["sex"].astype(str), "educ": df["educ"].astype("int64"),
        "race": df["race"].astype(str), "income": df["income"].astype("int64"), "married": df["married"].astype(bool),
    })
    con = duckdb.connect()
    con.register("pums", typed)
    return con


def _truths(con: Any, sql: str, answers: Sequence[Any]) -> list[float]:
    """The true value of each answer: its group's row, its output's column; empty groups are 0."""
    n_group_cols = len(answers[0].group)
    rows = {tuple(r[:n_group_cols]): r[n_group_cols:] for r in con.execute(sql).fetchall()}
    seen: dict[tuple[Any, ...], int] = {}
    out = []
    for a in answers:
        key = tuple(v for _, v in a.group)
        j = seen.get(key, 0)
        seen[key] = j + 1
        row = rows.get(key)
        v = None if row is None else row[j]
        out.append(0.0 if v is None else float(v))
    return out


# -- one session: the statements through each policy ------------------------------------------
def run_session(seed: int, n_statements: int = len(SESSION), progress: bool = False) -> dict[str, Any]:
    import dpgate
    from dpgate.datasets import load_pums

    warnings.simplefilter("ignore")  # seeded noise warns; expected in a benchmark
    df, schema = load_pums()
    con = _truth_connection()
    truth_cache: dict[int, list[float]] = {}
    out: dict[str, Any] = {"seed": seed, "policies": {}}
    for policy in POLICIES:
        gw = dpgate.Gateway(df, schema, budget=BUDGET, policy=policy, seed=seed)
        stmts = []
        for i, (sql, acc, _) in enumerate(SESSION[:n_statements]):
            t0 = time.perf_counter()
            try:
                res = gw.query(sql, accuracy=acc, confidence=CONFIDENCE)
            except dpgate.Error as e:
                stmts.append({"seconds": time.perf_counter() - t0, "refused": f"{type(e).__name__}: {e}"})
                if progress:
                    print(f"  session {seed} {policy} #{i + 1}: refused: {e}", file=sys.stderr, flush=True)
                continue
            dt = time.perf_counter() - t0
            if progress:
                print(f"  session {seed} {policy} #{i + 1}: {dt:.2f} s {sorted({a.source for a in res.answers})}",
                      file=sys.stderr, flush=True)
            if i not in truth_cache:  # the answers' groups are the declared keys: the same every time
                truth_cache[i] = _truths(con, sql, res.answers)
            truth = truth_cache[i]
            stmts.append({
                "seconds": dt,
                "answers": len(res.answers),
                "free": sum(a.source == "history" for a in res.answers),
                "covered": sum(a.low <= t <= a.high for a, t in zip(res.answers, truth, strict=True)),
                "sources": sorted({a.source for a in res.answers}),
                "epsilon": res.epsilon_spent,
                "max_halfwidth": max(a.halfwidth for a in res.answers),
            })
        out["policies"][policy] = {"statements": stmts, "spent": gw.spent}
        gw.close()
    return out


# -- aggregation and reporting -----------------------------------------------------------------
def _summary(runs: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    per = [r["policies"][policy] for r in runs]
    answered = [s for p in per for s in p["statements"] if "refused" not in s]
    n_ans = sum(s["answers"] for s in answered)
    covered = sum(s["covered"] for s in answered)
    cov = covered / n_ans if n_ans else math.nan
    sess_cov = [sum(s["covered"] for s in p["statements"] if "refused" not in s)
                / max(1, sum(s["answers"] for s in p["statements"] if "refused" not in s)) for p in per]
    se_binom = math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / n_ans) if n_ans else math.nan
    se_between = float(np.std(sess_cov, ddof=1) / math.sqrt(len(sess_cov))) if len(sess_cov) > 1 else math.nan
    se = max(se_binom, se_between) if not math.isnan(se_between) else se_binom
    times = np.array([[s["seconds"] for s in p["statements"]] for p in per])
    refusals = sorted({(i, s["refused"]) for p in per for i, s in enumerate(p["statements"]) if "refused" in s})
    spent = [p["spent"] for p in per]
    n = len(per[0]["statements"])
    n_stmt = len(per) * n
    return {
        "total_epsilon_mean": float(np.mean(spent)), "total_epsilon_min": min(spent), "total_epsilon_max": max(spent),
        "answers": n_ans, "covered": covered, "coverage": cov, "coverage_se": se,
        "coverage_se_binomial": se_binom, "coverage_se_between_sessions": se_between,
        "coverage_ok": bool(n_ans == 0 or cov >= CONFIDENCE - 3 * se),
        "free_share_answers": sum(s["free"] for s in answered) / n_ans if n_ans else math.nan,
        "free_share_statements": sum(s["free"] == s["answers"] for s in answered) / n_stmt,
        "refused_statements": len([1 for p in per for s in p["statements"] if "refused" in s]),
        "refusals": [{"index": i, "sql": SESSION[i][0], "error": m[:300]} for i, m in refusals],
        "session_seconds_mean": float(times.sum(axis=1).mean()),
        "latency_p50_by_index": np.percentile(times, 50, axis=0).tolist(),
        "latency_p95_by_index": np.percentile(times, 95, axis=0).tolist(),
        "latency_p50_all": float(np.percentile(times, 50)), "latency_p95_all": float(np.percentile(times, 95)),
        "sources_by_index": [sorted({src for p in per for src in p["statements"][i].get("sources", ["refused"])})
                             for i in range(n)],
        "epsilon_by_index": [per[0]["statements"][i].get("epsilon", 0.0) for i in range(n)],
    }


def _plot(summaries: Mapping[str, dict[str, Any]], sessions: int, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (install the demo extra): no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(11, 4.5))
    n = len(summaries[POLICIES[0]]["latency_p50_by_index"])
    x = np.arange(1, n + 1)
    for policy, color in zip(POLICIES, ("tab:gray", "tab:blue", "tab:red"), strict=True):
        s = summaries[policy]
        ax.plot(x, s["latency_p50_by_index"], "-o", ms=3, color=color, label=f"{policy} p50")
        ax.plot(x, s["latency_p95_by_index"], ":", color=color, label=f"{policy} p95")
    for i, (_, _, kind) in enumerate(SESSION[:n]):
        if kind.startswith("group by"):
            ax.axvline(i + 1, color="0.9", lw=3, zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("statement index in the session (shaded: GROUP BY)")
    ax.set_ylabel("gw.query latency [s]")
    ax.set_title(f"PUMS analyst session, {n} statements, {sessions} sessions")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _table(summaries: Mapping[str, dict[str, Any]]) -> str:
    lines = ["| policy | total ε | free (answers / statements) | refused statements | coverage ± SE "
             f"(nominal {CONFIDENCE}) | latency p50 / p95 | mean session |",
             "|---|---|---|---|---|---|---|"]
    for policy in POLICIES:
        s = summaries[policy]
        flag = "" if s["coverage_ok"] else " **BELOW 1−δ − 3 SE**"
        lines.append(
            f"| {policy} | {s['total_epsilon_mean']:.3f} | {s['free_share_answers']:.3f} / "
            f"{s['free_share_statements']:.3f} | {s['refused_statements']} | {s['coverage']:.4f} ± "
            f"{s['coverage_se']:.4f} ({s['answers']} answers){flag} | {s['latency_p50_all'] * 1e3:.1f} / "
            f"{s['latency_p95_all'] * 1e3:.0f} ms | {s['session_seconds_mean']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=100, help="independent sessions (100)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (1; the machine is shared)")
    ap.add_argument("--quick", action="store_true", help="3 sessions (smoke run; coverage not meaningful)")
    ap.add_argument("--progress", action="store_true", help="print each statement's latency to stderr")
    ap.add_argument("--statements", type=int, default=len(SESSION),
                    help=f"run only the first N statements ({len(SESSION)}: all); for cores too slow for the "
                    "whole session — the report then covers that prefix only")
    args = ap.parse_args(argv)
    sessions = 3 if args.quick else args.sessions
    n = args.statements
    if sessions < 1 or args.jobs < 1 or not 1 <= n <= len(SESSION):
        ap.error(f"--sessions and --jobs must be ≥ 1 and --statements in 1..{len(SESSION)}")
    import dpgate
    from dpgate.datasets import load_pums

    _, schema = load_pums()
    for sql, _, _ in SESSION:  # every statement is valid SQL for dpgate's compiler
        dpgate.compile_sql(sql, schema)
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    seeds = list(range(1, sessions + 1))
    if args.jobs == 1:
        for s in seeds:
            runs.append(run_session(s, n, args.progress))
            print(f"session {s}/{sessions} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    else:
        with ProcessPoolExecutor(args.jobs) as ex:
            for run in ex.map(partial(run_session, n_statements=n), seeds):
                runs.append(run)
                print(f"session {run['seed']}/{sessions} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    wall = time.perf_counter() - t0
    summaries: dict[str, dict[str, Any]] = {p: _summary(runs, p) for p in POLICIES}
    table = _table(summaries)
    print()
    print(table)
    for policy in POLICIES:
        for r in summaries[policy]["refusals"]:
            print(f"refused under {policy}: #{r['index'] + 1} {r['sql']}: {r['error'][:160]}")
    os.makedirs(RESULTS, exist_ok=True)
    png = os.path.join(RESULTS, "session_latency.png")
    plotted = _plot(summaries, sessions, png)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg(), "jobs": args.jobs, "wall_seconds": wall}
    with open(os.path.join(RESULTS, "session.json"), "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "sessions": sessions, "statements_run": n, "confidence": CONFIDENCE, "budget": BUDGET,
                   "statements": [{"sql": q, "accuracy": a, "kind": k} for q, a, k in SESSION[:n]],
                   "summaries": summaries}, f, indent=1)
    with open(os.path.join(RESULTS, "session.md"), "w", encoding="utf-8") as f:
        f.write(f"PUMS analyst session: {n} statements × {sessions} independent sessions × 3 policies "
                f"({wall:.0f} s wall, {args.jobs} job(s), load average at the end "
                f"{machine['loadavg_at_end'][0]:.2f}).\n\n{table}\n")
        if plotted:
            f.write("\n![latency by statement index](session_latency.png)\n")
    return 0 if all(s["coverage_ok"] for s in summaries.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
