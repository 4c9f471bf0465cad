"""Benchmark of warm starts (issue 7).  A script, not a test.

    python benchmarks/bench_warmstart.py [--cells 256] [--epsilon 0.5] [--trials 3]
                                         [--ranges 200] [--workload 300] [--sessions 6] [--quick]

On NETTRACE (its first ``--cells`` cells, which hold all its units when
``--cells ≥ 139``) and SEARCHLOGS (summed into ``--cells`` cells) — releasing
through the gateway is super-linear in the domain size, see the report — and on PUMS (age × income, income declared with 10 bins in a
variant schema — the embedded schema serves income at unit resolution), for
each strategy at the same ε:

1. **RMSE of random range queries** answered from history alone (the BLUE the
   gateway would return, budget = ε so nothing fresh can be spent), with the
   share of them that history determines (``estimable``).  Baseline "none":
   the same queries measured directly, each at the α that makes the system cost
   exactly ε (α = ε / max cell coverage; per-cell accounting, Theorem 5.5).
2. **Share of the online workload of Xiao & Xiong, "Bayesian Inference under
   Differential Privacy" (2012), §6.4, answered for free** (``dpgate._demo.generate``,
   unbounded setting, its tree replaced by the warm start; the minimal policy pays
   for the rest), with ᾱ (system cost after the workload, warm start included) and
   coverage Ri — vs no warm start, averaged over ``--sessions`` independent
   sessions (Ri ± standard error).  Histograms only (the workload is 1-D).
3. **MMSE vs BLUE** on the same ISPE release: RMSE of cell queries and small
   ranges (width 2–8), MMSE with and without neighbourhood reference.

Prints a table with the machine and writes ``benchmarks/results/warmstart.json``.
BLAS is pinned to one thread (see bench_inference.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import dpgate  # noqa: E402
from dpgate import _demo, datasets  # noqa: E402
from dpgate.compile.query import LinearQuery  # noqa: E402
from dpgate.warmstart.design import mmse_values  # noqa: E402

INCOME_BINS = [0, 10000, 20000, 30000, 40000, 50000, 60000, 80000, 100000, 150000, 500001]
BIG = 1e12  # an accuracy history always meets: returns the BLUE with its true interval


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


# -- data ------------------------------------------------------------------------------------
def histogram_data(name: str, cells: int) -> dict[str, Any]:
    """NETTRACE: its first ``cells`` cells (all its units lie in cells 0..138, so
    ``cells ≥ 139`` is lossless); SEARCHLOGS (spread over 4096 cells): summed into
    ``cells`` cells of equal width."""
    df, _ = datasets.load_histogram(name)
    full = np.bincount(df["value"].to_numpy(), minlength=4096)
    h = full[:cells] if name == "nettrace" else full.reshape(cells, -1).sum(axis=1)
    frame = pd.DataFrame({"value": np.repeat(np.arange(cells), h)})
    schema = dpgate.Schema.from_dict(
        {"tables": {name: {"columns": {"value": {"type": "integer", "min": 0, "max": cells - 1}}}}}
    )
    return {"name": name, "df": frame, "schema": schema, "table": name, "hist": h, "dims": ("value",)}


def pums_data() -> dict[str, Any]:
    df, _ = datasets.load_pums()
    frame = df[["age", "income"]].copy()
    schema = dpgate.Schema.from_dict({"tables": {"pums": {"columns": {
        "age": {"type": "integer", "min": 0, "max": 100},
        "income": {"type": "numeric", "bins": INCOME_BINS},
    }}}})
    a = np.clip(frame["age"].to_numpy(dtype=float), 0, 100).astype(int)
    inc = np.clip(np.searchsorted(INCOME_BINS, frame["income"].to_numpy(dtype=float), side="right") - 1, 0, 9)
    hist = np.zeros((101, 10))
    np.add.at(hist, (a, inc), 1)
    return {"name": "pums", "df": frame, "schema": schema, "table": "pums", "hist": hist, "dims": ("age", "income")}


def random_ranges(data: dict[str, Any], k: int, rng: np.random.Generator) -> list[tuple[str, float, list]]:
    """``(sql, truth, box)`` of random range (1-D) / rectangle (2-D) counts."""
    hist = data["hist"]
    out = []
    for _ in range(k):
        box = [tuple(sorted(rng.integers(0, n, 2).tolist())) for n in hist.shape]
        truth = float(hist[tuple(slice(a, b + 1) for a, b in box)].sum())
        if data["name"] == "pums":
            (a0, a1), (i0, i1) = box
            sql = (f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {a0} AND {a1} "
                   f"AND income >= {INCOME_BINS[i0]} AND income < {INCOME_BINS[i1 + 1]}")
        else:
            sql = f"SELECT COUNT(*) FROM {data['table']} WHERE value BETWEEN {box[0][0]} AND {box[0][1]}"
        out.append((sql, truth, box))
    return out


# -- strategies ------------------------------------------------------------------------------
def strategies(data: dict[str, Any], eps: float) -> list[tuple[str, str, Any, dict[str, Any]]]:
    dims = data["dims"]
    hcol = dims[0]
    return [
        ("identity", "identity", list(dims), {}),
        ("hier-even", "hierarchical", hcol, {"split": "even"}),
        ("hier-geom", "hierarchical", hcol, {"split": "geometric"}),
        ("ispe", "ispe", list(dims), {}),
        ("ispe-xi10", "ispe", list(dims), {"xi": 10 * math.sqrt(2) / (eps / 2)}),  # 10 noise std at α₁ = ε/2
    ]


def rmse(err: list[float]) -> float:
    return float(math.sqrt(np.mean(np.square(err)))) if err else math.nan


def run_ranges(data: dict[str, Any], eps: float, trials: int, k: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    queries = random_ranges(data, k, np.random.default_rng(seed))
    for label, strat, cols, opts in strategies(data, eps):
        errs, estimable, secs = [], 0, []
        for tr in range(trials):
            gw = dpgate.Gateway(data["df"], data["schema"], budget=eps, seed=100 * seed + tr)
            t0 = time.perf_counter()
            gw.warm_start(strat, eps, cols, **opts)
            secs.append(time.perf_counter() - t0)
            for sql, truth, _ in queries:
                a = gw.query(sql, accuracy=BIG, allow_partial=True).answer
                if a.source == "history" and math.isfinite(a.value):
                    errs.append(a.value - truth)
                    estimable += 1
            gw.close()
        out[label] = {"rmse": rmse(errs), "estimable": estimable / (trials * k), "warm_start_seconds": float(np.median(secs))}
    # Baseline: no warm start, each query measured directly at α = ε / max coverage.
    errs = []
    for tr in range(trials):
        gw = dpgate.Gateway(data["df"], data["schema"], budget=eps, seed=100 * seed + 50 + tr)
        t = gw.schema.table(data["table"])
        qs = [dpgate.compile_sql(sql, data["schema"])[0] for sql, _, _ in queries]
        cover = sum(np.abs(q.dense(t)) for q in qs)
        alpha = eps / float(cover.max())
        vals = gw.release_measurements(t.name, [(q, alpha) for q in qs], kind="query", label="baseline")
        errs += [v - truth for v, (_, truth, _) in zip(vals, queries, strict=True)]
        assert abs(gw.spent - eps) < 1e-9
        gw.close()
    out["none"] = {"rmse": rmse(errs), "estimable": 1.0, "alpha_per_query": alpha}
    return out


def run_workload(data: dict[str, Any], eps: float, n_queries: int, seed: int, sessions: int) -> dict[str, Any]:
    """Xiao & Xiong (2012)'s workload after each warm start, over independent sessions.

    Answers within one session share the history's noise, so one session's Ri is
    strongly correlated (seen from 0.58 to 0.96 with δ = 0.2); coverage is judged
    by its mean over sessions, each with its own workload and noise, ± a standard error.
    """
    hist = data["hist"]
    systems = [("none", None, None, {})] + strategies(data, eps)
    out: dict[str, Any] = {}
    for k, (label, strat, cols, opts) in enumerate(systems):
        rows, t0 = [], time.perf_counter()
        for s in range(sessions):
            wl = _demo.generate(n=len(hist), queries=n_queries, setting="unbounded", seed=seed + s,
                                   tree_cells=None)  # fmt: skip
            gw = dpgate.Gateway(data["df"], data["schema"], budget=wl.gateway_budget,
                                seed=_demo.noise_seed(seed + s, k))  # fmt: skip
            if strat is not None:
                gw.warm_start(strat, eps, cols, **opts)
            rows.append(_demo.summarize(_demo.run(gw, wl.queries, hist, data["table"])))
            gw.close()
        ri = np.array([r["Ri"] for r in rows])
        out[label] = {
            **{key: float(np.mean([r[key] for r in rows])) for key in ("free", "Ra", "alpha_bar", "Ri")},
            "Ri_se": float(ri.std(ddof=1) / math.sqrt(sessions)) if sessions > 1 else float("nan"),
            "Ri_min": float(ri.min()),
            "sessions": sessions,
            "seconds": time.perf_counter() - t0,
        }
    return out


def run_mmse(data: dict[str, Any], eps: float, trials: int, seed: int) -> dict[str, Any]:
    hist = data["hist"]
    rng = np.random.default_rng(seed + 7)
    res: dict[str, list[float]] = {k: [] for k in ("cell_blue", "cell_mmse", "cell_mmse_nonb", "small_blue", "small_mmse")}
    t = data["schema"].tables[0]
    dims = data["dims"]
    for tr in range(trials):
        gw = dpgate.Gateway(data["df"], data["schema"], budget=eps, seed=900 + 10 * seed + tr)
        ws = gw.warm_start("ispe", eps, list(dims))
        cells = [tuple(int(rng.integers(0, n)) for n in hist.shape) for _ in range(60)]
        for c in cells:
            box = [(i, i) for i in c]
            _collect(gw, t, data, box, hist, ws, res, "cell")
        for _ in range(60):
            box = []
            for n in hist.shape:
                w = int(rng.integers(2, 9)) if len(hist.shape) == 1 else int(rng.integers(1, 4))
                lo = int(rng.integers(0, n - w + 1))
                box.append((lo, lo + w - 1))
            _collect(gw, t, data, box, hist, ws, res, "small")
        gw.close()
    return {k: rmse(v) for k, v in res.items()}


def _collect(gw, t, data, box, hist, ws, res, kind) -> None:  # type: ignore[no-untyped-def]
    truth = float(hist[tuple(slice(a, b + 1) for a, b in box)].sum())
    bps, w_idx = [], []
    for c, (a, b) in zip(data["dims"], box, strict=True):
        n = t.column(c).n_cells
        bp = sorted({0, a, b + 1} - {n})
        bps.append(bp)
        w_idx.append(bp.index(a))
    w = np.zeros([len(b) for b in bps])
    w[tuple(w_idx)] = 1.0
    q = LinearQuery.from_grid(t, data["dims"], bps, w)
    with gw.locked_view(t.name, [q]) as view:  # the BLUE a history answer would give
        blue = view.estimate(q).value
    res[f"{kind}_blue"].append(blue - truth)
    res[f"{kind}_mmse"].append(mmse_values(ws, q)[0] - truth)
    if kind == "cell":
        res["cell_mmse_nonb"].append(mmse_values(ws, q, neighbours=False)[0] - truth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=256)
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--ranges", type=int, default=200)
    ap.add_argument("--workload", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=6, help="independent workload sessions per system")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="cells 64, 1 trial, 50 ranges, 60 workload queries")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "warmstart.json"))
    args = ap.parse_args()
    if args.quick:
        args.cells, args.trials, args.ranges, args.workload, args.sessions = 64, 1, 50, 60, 2
    t_start = time.perf_counter()
    sets = [histogram_data("nettrace", args.cells), histogram_data("searchlogs", args.cells), pums_data()]
    results: dict[str, Any] = {}
    for data in sets:
        name = data["name"]
        print(f"[{name}] ranges ...", file=sys.stderr, flush=True)
        r: dict[str, Any] = {"ranges": run_ranges(data, args.epsilon, args.trials, args.ranges, args.seed)}
        if name != "pums":
            print(f"[{name}] workload ...", file=sys.stderr, flush=True)
            r["workload"] = run_workload(data, args.epsilon, args.workload, args.seed, args.sessions)
        print(f"[{name}] mmse ...", file=sys.stderr, flush=True)
        r["mmse"] = run_mmse(data, args.epsilon, args.trials, args.seed)
        results[name] = r
    out = {"machine": machine(), "args": vars(args), "seconds": time.perf_counter() - t_start, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=float))
    m = out["machine"]
    print(f"Machine: {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}, load {m['load_average']}")
    print(f"ε = {args.epsilon}; NETTRACE's first / SEARCHLOGS summed to {args.cells} cells; "
          f"{args.trials} trial(s), {args.ranges} ranges, {args.workload} workload queries × {args.sessions} "
          "sessions (free, Ra, ᾱ, Ri: means over sessions; Ri ± its standard error, target 1 − δ = 0.8)")
    print(f"\n{'data':<11}{'system':<11}{'range RMSE':>11}{'estimable':>10}{'ws s':>7}{'free':>7}{'Ra':>6}{'ᾱ':>8}{'Ri ± se':>12}")
    for name, r in results.items():
        for sys_name, v in r["ranges"].items():
            w = r.get("workload", {}).get(sys_name, {})
            print(
                f"{name:<11}{sys_name:<11}{v['rmse']:>11.1f}{v['estimable']:>10.2f}"
                f"{v.get('warm_start_seconds', 0.0):>7.1f}"
                + (f"{w['free']:>7.2f}{w['Ra']:>6.2f}{w['alpha_bar']:>8.3f}{w['Ri']:>7.2f} ± {w['Ri_se']:.2f}" if w else "")
            )
    print(f"\n{'data':<11}{'cell BLUE':>10}{'cell MMSE':>10}{'MMSE no-NR':>11}{'small BLUE':>11}{'small MMSE':>11}")
    for name, r in results.items():
        mm = r["mmse"]
        print(f"{name:<11}{mm['cell_blue']:>10.2f}{mm['cell_mmse']:>10.2f}{mm['cell_mmse_nonb']:>11.2f}"
              f"{mm['small_blue']:>11.2f}{mm['small_mmse']:>11.2f}")
    print(f"\n({out['seconds']:.0f} s; wrote {args.out})")


if __name__ == "__main__":
    main()
