"""Honest re-asking (issue 29, item 4): ``Gateway(reasks="simultaneous")`` against ``"independent"``.

Three measures, each with the switch on (``"simultaneous"``, the default: the k-th distinct
interval of a query at ``1 − δ_k``, ``dpgate.plan.asks``) and off (``"independent"``):

* **The stop-when-excluded analyst**: on a fresh gateway per run (``seed`` = run number), ask
  ``SELECT COUNT(*) FROM t WHERE v < 40`` (600 rows) at ±100 and 95 %, re-ask at 0.7× the
  accuracy while the interval contains the truth, at most 6 asks, stop as soon as it excludes
  it.  Reported: the coverage of the interval stopped on (nominal 0.95, SE at 0.95) and the
  mean ε spent per run.
* **The PUMS analyst session** of ``bench_session.py`` (54 statements, 95 %, policy
  ``minimal``): total ε, answers free from history, coverage (one seeded session per mode:
  decisions and ε do not depend on the noise).
* **The paper's workload** of ``bench_workload.py`` (Xiao & Xiong 2012, §6.4; NETTRACE,
  confidence 0.8, policy ``minimal``): Ra in the bounded setting, ᾱ in the unbounded one, and
  the share of answers whose interval holds the truth (Ri).

With ``--shares``, also the choice of the schedule: for several first shares
(``dpgate.plan.asks.FIRST_ASK_SHARE``; the rest of δ spread as ``1/(k−1)²``), the ε of the PUMS
session, ᾱ of the unbounded paper workload (one seed) and the mean ε and coverage of the
stop-when-excluded analyst (``--runs // 4`` runs).

Writes ``benchmarks/results/reask.json`` and ``reask.md``.

Usage::

    python benchmarks/bench_reask.py [--runs 1000] [--queries 1000] [--seeds 2] [--shares] [--quick]
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
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
MODES = ("simultaneous", "independent")


def stop_when_excluded(runs: int, reasks: str) -> dict[str, float]:
    import pandas as pd

    import dpgate

    schema = {"tables": {"t": {"columns": {"v": {"type": "integer", "min": 0, "max": 99}}}}}
    frame = pd.DataFrame({"v": np.random.default_rng(29).integers(0, 100, 600)})
    sql, truth = "SELECT COUNT(*) FROM t WHERE v < 40", int((frame["v"] < 40).sum())
    covered, spent, asks = 0, 0.0, 0
    for seed in range(runs):
        gw = dpgate.Gateway(frame, schema, budget=1e6, seed=seed, reasks=reasks)
        accuracy, ok = 100.0, True
        for _ in range(6):
            a = gw.query(sql, accuracy=accuracy, confidence=0.95).answer
            asks += 1
            if not a.low <= truth <= a.high:
                ok = False
                break
            accuracy *= 0.7
        covered += ok
        spent += gw.spent
        gw.close()
    cov = covered / runs
    return {"runs": runs, "coverage": cov, "se": math.sqrt(0.95 * 0.05 / runs), "mean_epsilon": spent / runs,
            "mean_asks": asks / runs}


def pums_session(reasks: str, seed: int = 1) -> dict[str, float]:
    import bench_session  # the session's statements and its truth oracle (same directory)

    import dpgate
    from dpgate.datasets import load_pums

    df, schema = load_pums()
    con = bench_session._truth_connection()
    gw = dpgate.Gateway(df, schema, budget=bench_session.BUDGET, seed=seed, reasks=reasks)
    answers = free = covered = 0
    for sql, acc, _ in bench_session.SESSION:
        res = gw.query(sql, accuracy=acc, confidence=bench_session.CONFIDENCE)
        truth = bench_session._truths(con, sql, res.answers)
        answers += len(res.answers)
        free += sum(a.source == "history" for a in res.answers)
        covered += sum(a.low <= t <= a.high for a, t in zip(res.answers, truth, strict=True))
    out = {"epsilon": gw.spent, "answers": answers, "free": free / answers, "coverage": covered / answers}
    gw.close()
    return out


def paper_workload(setting: str, queries: int, seeds: int, reasks: str) -> dict[str, float]:
    import dpgate
    from dpgate import _demo as W
    from dpgate._demo.runner import load_histogram, noise_seed, release_tree, run

    df, schema, hist, table = load_histogram("nettrace")
    rows = []
    for seed in range(seeds):
        wl = W.generate(n=len(hist), queries=queries, setting=setting, seed=seed)  # type: ignore[arg-type]
        k = [label for label, _ in W.SYSTEMS].index("minimal")  # the same noise seed as bench_workload's
        gw = dpgate.Gateway(df, schema, budget=wl.gateway_budget, policy="minimal", seed=noise_seed(seed, k),
                            reasks=reasks)
        release_tree(gw, wl, table)
        recs = run(gw, wl.queries, hist, table)
        gw.close()
        rows.append(W.summarize(recs))
    return {key: float(np.mean([r[key] for r in rows])) for key in ("Ra", "alpha_bar", "Ri", "free")}


def shares(values: tuple[float, ...], runs: int, queries: int) -> dict[str, dict[str, float]]:
    from dpgate.plan import asks

    out = {}
    try:
        for share in values:
            asks.FIRST_ASK_SHARE = share
            sw = stop_when_excluded(runs, "simultaneous")
            out[f"{share:g}"] = {"pums_epsilon": pums_session("simultaneous")["epsilon"],
                                 "paper_unbounded_alpha_bar": paper_workload("unbounded", queries, 1, "simultaneous")[
                                     "alpha_bar"],
                                 "reask_mean_epsilon": sw["mean_epsilon"], "reask_coverage": sw["coverage"]}
            print(share, json.dumps(out[f"{share:g}"]), flush=True)
    finally:
        asks.FIRST_ASK_SHARE = 0.9
    return out


def markdown(res: dict[str, Any]) -> str:
    sw = res["stop_when_excluded"]
    lines = [
        f"Stop-when-excluded analyst ({sw['simultaneous']['runs']} gateways, nominal 0.95, "
        f"SE {sw['simultaneous']['se']:.3f}, pass ≥ {0.95 - 3 * sw['simultaneous']['se']:.3f}):",
        "",
        "| reasks | coverage | mean ε per run | mean asks |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m} | {sw[m]['coverage']:.3f} | {sw[m]['mean_epsilon']:.4f} | {sw[m]['mean_asks']:.2f} |"
              for m in MODES]
    ps = res["pums_session"]
    on, off = ps["simultaneous"], ps["independent"]
    lines += ["", "PUMS analyst session (54 statements, 95 %, minimal):", "",
              "| reasks | ε | answered free | coverage |", "|---|---|---|---|"]
    lines += [f"| {m} | {ps[m]['epsilon']:.4f} | {ps[m]['free']:.3f} | {ps[m]['coverage']:.3f} |" for m in MODES]
    lines += ["", f"ε on / off: {on['epsilon'] / off['epsilon']:.4f}"]
    pw = res["paper_workload"]
    lines += ["", f"Paper workload (NETTRACE, {res['queries']} queries × {res['seeds']} seeds, confidence 0.8, minimal):",
              "", "| setting | reasks | Ra | ᾱ | Ri | free |", "|---|---|---|---|---|---|"]
    for setting in ("bounded", "unbounded"):
        lines += [f"| {setting} | {m} | {pw[setting][m]['Ra']:.3f} | {pw[setting][m]['alpha_bar']:.4f} | "
                  f"{pw[setting][m]['Ri']:.3f} | {pw[setting][m]['free']:.3f} |" for m in MODES]
    if "shares" in res:
        lines += ["", f"The first share (rest as 1/(k−1)²; stop-when-excluded over {res['share_runs']} runs, paper "
                  f"workload unbounded, {res['queries']} queries × 1 seed):", "",
                  "| δ_1/δ | PUMS ε | paper ᾱ | stop-when-excluded ε | its coverage |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['pums_epsilon']:.4f} | {v['paper_unbounded_alpha_bar']:.4f} | "
                  f"{v['reask_mean_epsilon']:.4f} | {v['reask_coverage']:.3f} |" for k, v in res["shares"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000, help="stop-when-excluded analysts per mode (1000)")
    ap.add_argument("--queries", type=int, default=1000, help="paper workload queries (1000)")
    ap.add_argument("--seeds", type=int, default=2, help="paper workload seeds (2)")
    ap.add_argument("--shares", action="store_true", help="also sweep the first ask's share of δ")
    ap.add_argument("--quick", action="store_true", help="100 runs, 200 queries × 1 seed (smoke run)")
    args = ap.parse_args(argv)
    runs, queries, seeds = (100, 200, 1) if args.quick else (args.runs, args.queries, args.seeds)
    warnings.simplefilter("ignore")  # seeded noise warns; expected in a benchmark
    t0 = time.perf_counter()
    res: dict[str, Any] = {"queries": queries, "seeds": seeds}
    res["stop_when_excluded"] = {m: stop_when_excluded(runs, m) for m in MODES}
    print(json.dumps(res["stop_when_excluded"]), flush=True)
    res["pums_session"] = {m: pums_session(m) for m in MODES}
    print(json.dumps(res["pums_session"]), flush=True)
    res["paper_workload"] = {s: {m: paper_workload(s, queries, seeds, m) for m in MODES} for s in ("bounded", "unbounded")}
    print(json.dumps(res["paper_workload"]), flush=True)
    if args.shares:
        res["share_runs"] = max(1, runs // 4)
        res["shares"] = shares((0.5, 0.75, 0.9, 0.95, 0.99), res["share_runs"], queries)
    res["machine"] = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                      "loadavg_at_end": os.getloadavg(), "wall_seconds": time.perf_counter() - t0}
    md = markdown(res)
    print(md)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "reask.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(RESULTS, "reask.md"), "w", encoding="utf-8") as f:
        f.write(md)
    sw = res["stop_when_excluded"]["simultaneous"]
    return 0 if sw["coverage"] >= 0.95 - 3 * sw["se"] else 1


if __name__ == "__main__":
    sys.exit(main())
