"""The experiment of Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012),
§6.4, reproduced: the online workload through three systems, side by side.

Both data sets (NETTRACE, SEARCHLOGS), both settings (bounded: budget 1,
2ε ~ U[1, 1000]; unbounded: hierarchical tree at ε = 0.3 first, 2ε ~ U[50, 1000]),
δ = 0.2, ``--queries`` queries (1 000), ``--seeds`` seeds (5).  Systems: the
no-reuse baseline (fresh at Theorem 5.3's α every time), policy "paper" and
policy "minimal" (dpgate's default), each on a fresh gateway with seeded noise.

Reports mean and spread (sd, min–max over seeds) of Ra, ᾱ, Ri, E, and checks
coverage per system and configuration: the pooled Ri must be
≥ 1 − δ − 3 SE.  SE is the larger of the binomial SE at the nominal 0.8 and
the between-seed SE (answers of one session share history noise, so they are
correlated and the binomial SE alone understates the spread).  A violation is
printed loudly and makes the script exit with status 1 after writing results.

Writes ``benchmarks/results/workload.json``, ``workload.md`` (tables for
RESULTS.md) and one PNG per (data set, setting).

Usage::

    python benchmarks/bench_workload.py [--queries 1000] [--seeds 5] [--jobs 2]
        [--datasets nettrace,searchlogs] [--settings bounded,unbounded]

``DPGATE_BENCH_QUICK=1`` shrinks it to 200 queries × 2 seeds (smoke runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from dpgate import _demo as W

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

CONFIDENCE = 1 - W.DELTA
METRICS = (("Ra", "Ra", 3), ("ᾱ", "alpha_bar", 3), ("Ri", "Ri", 3), ("E", "E", 4), ("answered free", "free", 3),
           ("released (any interval)", "released", 3))


def _job(args: tuple[str, str, int, int]) -> dict[str, Any]:
    dataset, setting, seed, queries = args
    t0 = time.perf_counter()
    run = W.run_systems(dataset, setting, queries, seed)  # type: ignore[arg-type]
    out: dict[str, Any] = {"dataset": dataset, "setting": setting, "seed": seed, "seconds": time.perf_counter() - t0,
                           "systems": {}}
    for label, sysrun in run["systems"].items():
        recs = [W.QueryRecord(**r) for r in sysrun["records"]]
        answered = [r for r in recs if r.answered]
        released = [r for r in recs if r.source in ("history", "fresh", "exact") and math.isfinite(r.value)]
        out["systems"][label] = {
            "summary": sysrun["summary"],
            "answered": len(answered),
            "covered": int(round(W.coverage(recs) * len(answered))) if answered else 0,
            "released": len(released),
            "released_covered": int(round(W.coverage(recs, released=True) * len(released))) if released else 0,
            "spent_curve": [round(r.spent, 6) for r in recs],
            "answered_curve": np.cumsum([r.answered for r in recs]).tolist(),
            "seconds_by_source": {
                src: [round(r.seconds, 6) for r in recs if r.source == src] for src in ("history", "fresh", "refused")
            },
        }
    return out


def _stats(values: list[float]) -> dict[str, float]:
    a = np.array([v for v in values if not math.isnan(v)], dtype=float)
    if not len(a):
        return {"mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def _coverage_check(ns: list[int], covered: list[int]) -> dict[str, Any]:
    """Pooled coverage vs 1 − δ − 3 SE, SE = max(binomial at 1 − δ, between-seed)."""
    n = sum(ns)
    cov = sum(covered) / n if n else math.nan
    se_binom = math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / n) if n else math.nan
    per_seed = [c / k for c, k in zip(covered, ns, strict=True) if k]
    se_seed = float(np.std(per_seed, ddof=1) / math.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
    threshold = CONFIDENCE - 3 * max(se_binom, se_seed)
    return {"pooled_Ri": cov, "answered": n, "se_binomial": se_binom, "se_between_seeds": se_seed,
            "threshold": threshold, "ok": bool(n == 0 or cov >= threshold)}


def aggregate(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (dataset, setting, system): metric stats over seeds and the coverage check."""
    configs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in jobs:
        configs.setdefault((j["dataset"], j["setting"]), []).append(j)
    out: dict[str, Any] = {}
    for (dataset, setting), runs in sorted(configs.items()):
        runs.sort(key=lambda j: j["seed"])
        key = f"{dataset}/{setting}"
        out[key] = {"seeds": [j["seed"] for j in runs], "seconds": sum(j["seconds"] for j in runs), "systems": {}}
        for label in runs[0]["systems"]:
            per = [j["systems"][label] for j in runs]
            stats = {name: _stats([p["summary"][k] for p in per]) for name, k, _ in METRICS}
            stats["median_ms"] = _stats([1000 * p["summary"]["median_seconds"] for p in per])
            for tag, nk, ck in (("coverage_check", "answered", "covered"),
                                ("coverage_check_released", "released", "released_covered")):
                stats[tag] = _coverage_check([p[nk] for p in per], [p[ck] for p in per])
            out[key]["systems"][label] = stats
    return out


def markdown(agg: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"{meta['queries']} queries × {len(meta['seeds'])} seeds ({', '.join(map(str, meta['seeds']))}) per "
        f"configuration, δ = 0.2; mean ± sd over seeds [min–max].  Wall time {meta['seconds'] / 60:.1f} min "
        f"with {meta['jobs']} worker processes.",
        "",
    ]
    for key, cfg in agg.items():
        dataset, setting = key.split("/")
        lines += [f"#### {dataset.upper()}, {setting} setting", ""]
        systems = list(cfg["systems"])
        lines.append("| metric | " + " | ".join(systems) + " |")
        lines.append("|---|" + "---|" * len(systems))
        for name, _, digits in (*METRICS, ("median decision ms", "median_ms", 2)):
            cells = []
            for s in systems:
                st = cfg["systems"][s][name if name != "median decision ms" else "median_ms"]
                cells.append(f"{st['mean']:.{digits}f} ± {st['sd']:.{digits}f} [{st['min']:.{digits}f}–{st['max']:.{digits}f}]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        cells = []
        for s in systems:
            c = cfg["systems"][s]["coverage_check"]
            mark = "ok" if c["ok"] else "**VIOLATED**"
            cells.append(f"{c['pooled_Ri']:.3f} ≥ {c['threshold']:.3f}: {mark} (n = {c['answered']})")
        lines.append("| pooled Ri ≥ 0.8 − 3 SE | " + " | ".join(cells) + " |")
        cells = []
        for s in systems:
            c = cfg["systems"][s]["coverage_check_released"]
            mark = "ok" if c["ok"] else "**VIOLATED**"
            cells.append(f"{c['pooled_Ri']:.3f} ≥ {c['threshold']:.3f}: {mark} (n = {c['answered']})")
        lines.append("| same, every released interval | " + " | ".join(cells) + " |")
        lines += ["", f"![{key}](results/workload_{dataset}_{setting}.png)", ""]
    return "\n".join(lines)


def plots(jobs: list[dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    configs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in jobs:
        configs.setdefault((j["dataset"], j["setting"]), []).append(j)
    for (dataset, setting), runs in sorted(configs.items()):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
        for label in runs[0]["systems"]:
            for ax, key in ((ax1, "spent_curve"), (ax2, "answered_curve")):
                y = np.array([j["systems"][label][key] for j in runs], dtype=float)
                x = np.arange(1, y.shape[1] + 1)
                (line,) = ax.plot(x, y.mean(axis=0), label=label)
                ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=line.get_color(), alpha=0.2)
        ax1.set(xlabel="query index", ylabel="system cost ᾱ", title="privacy cost (mean, min–max over seeds)")
        ax2.set(xlabel="query index", ylabel="queries answered", title="answered within requirement")
        ax1.legend()
        fig.suptitle(f"{dataset.upper()}, {setting} setting")
        path = os.path.join(RESULTS, f"workload_{dataset}_{setting}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    quick = os.environ.get("DPGATE_BENCH_QUICK") == "1"
    p.add_argument("--queries", type=int, default=200 if quick else 1000)
    p.add_argument("--seeds", type=int, default=2 if quick else 5)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--datasets", default="nettrace,searchlogs")
    p.add_argument("--settings", default="bounded,unbounded")
    a = p.parse_args(argv)
    os.makedirs(RESULTS, exist_ok=True)
    tasks = [(d, s, seed, a.queries) for d in a.datasets.split(",") for s in a.settings.split(",")
             for seed in range(a.seeds)]
    # Longest first (unbounded releases an 8191-node tree per system) for better packing.
    tasks.sort(key=lambda t: t[1] != "unbounded")
    t0 = time.perf_counter()
    jobs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        for j in ex.map(_job, tasks):
            jobs.append(j)
            line = "  ".join(
                f"{lbl}: Ra={v['summary']['Ra']:.3f} ᾱ={v['summary']['alpha_bar']:.3f} Ri={v['summary']['Ri']:.3f}"
                for lbl, v in j["systems"].items())
            print(f"[{time.perf_counter() - t0:7.0f}s] {j['dataset']}/{j['setting']} seed {j['seed']} "
                  f"({j['seconds']:.0f}s): {line}", flush=True)
    seconds = time.perf_counter() - t0
    agg = aggregate(jobs)
    meta = {"queries": a.queries, "seeds": list(range(a.seeds)), "jobs": a.jobs, "seconds": seconds}
    with open(os.path.join(RESULTS, "workload.json"), "w") as f:
        json.dump({"meta": meta, "aggregate": agg, "runs": jobs}, f, default=float)
    plots(jobs)
    md = markdown(agg, meta)
    with open(os.path.join(RESULTS, "workload.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    bad = [(k, f"{s} ({tag})", c["systems"][s][tag]) for k, c in agg.items() for s in c["systems"]
           for tag in ("coverage_check", "coverage_check_released") if not c["systems"][s][tag]["ok"]]
    for key, system, c in bad:
        print(f"\n!!! COVERAGE VIOLATION — this is a bug: {key} / {system}: pooled Ri = {c['pooled_Ri']:.4f} "
              f"< 0.8 − 3 SE = {c['threshold']:.4f} over {c['answered']} answers !!!", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
