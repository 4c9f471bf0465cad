"""Benchmark the model-based estimators (``Gateway.estimate``, dpgate.model) of
Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for Improving Data Utility under Differential Privacy" (EDBT 2016).

Accuracy — RMSE on *new* random range queries estimated from history alone:

* **PUMS**: history = ``m`` random 2-D range queries (age × educ) at noise scale
  b = 10 (α = 0.1 each), released through the gateway with seeded noise; 150 new
  queries from the same distribution.  The schema's public ``rows: 1000`` is the
  universal query.  Variant "+marginals": 1-D marginals of age and educ (GROUP BY,
  α = 0.1 per cell) are released first and become the prior (§3.4).
* **NETTRACE** (4096-cell histogram, 25 714 units): history = ``m`` random 1-D
  ranges at b = 50, with the row count declared public (the seed's assumption).
  Variant "(N not public)": the embedded schema as is, with ``COUNT(*)`` released
  first; the total is then the BLUE of it, and the fold that holds ``COUNT(*)`` out
  dominates the cross-validated RMSE (a large overestimate).

Rows: ``blue`` (the BLUE over history, on the share of new queries that history
determines — the rest are not estimable), ``uniform`` (the total spread uniformly
over the domain's cells), ``pca`` (cross-validated ``a``), ``pca a=inf``, ``maxent``
(cross-validated α).  For each, the cross-validated RMSE the method reports
(Theorem 4) is printed next to the true one.

Time — fit time (including k = 5-fold cross-validation) against the number of past
queries ``m`` on PUMS (Chen, Zhou & Bhowmick (2016), Fig. 5: PCA costs ``O(m² n_atoms + k m³)``).

Writes ``benchmarks/results/model.json`` and prints a table with the machine.
BLAS threads are pinned to 1 (the shared machine is loaded; CPU time is printed).

Usage::

    python benchmarks/bench_model.py [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

import dpgate  # noqa: E402
import dpgate.datasets  # noqa: E402
from dpgate.release.cube import Cube  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def machine() -> str:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} CPUs, load {load:.1f}, Python {platform.python_version()}, numpy {np.__version__}"


def _pums_ranges(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a1, a2 = sorted(int(v) for v in rng.integers(0, 101, 2))
        e1, e2 = sorted(int(v) for v in rng.integers(1, 17, 2))
        out.append(f"age BETWEEN {a1} AND {a2} AND educ BETWEEN {e1} AND {e2}")
    return out


def _net_ranges(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        lo, hi = sorted(int(v) for v in rng.integers(0, 4096, 2))
        out.append(f"value BETWEEN {lo} AND {hi}")
    return out


def _batch(table: str, preds: list[str]) -> str:
    return "SELECT " + ", ".join(f"COUNT(*) FILTER (WHERE {p}) AS q{i}" for i, p in enumerate(preds)) + f" FROM {table}"


def _truth(df: pd.DataFrame, schema: dpgate.Schema, table: str, preds: list[str]) -> np.ndarray:
    # Exact answers for scoring only (the benchmark owns the data), from a cube of its
    # own beside the gateway; never released.
    qs = dpgate.compile_sql(_batch(table, preds), schema)
    return np.array(Cube({table: df}, schema).true_numerators(list(qs)), dtype=float)


def _blue(gw: dpgate.Gateway, table: str, preds: list[str]) -> tuple[np.ndarray, np.ndarray]:
    qs = dpgate.compile_sql(_batch(table, preds), gw.schema)
    vals, ok = [], []
    with gw.locked_view(table, qs) as view:
        for q in qs:
            est = view.estimate(q)
            ok.append(est.estimable)
            vals.append(est.value if est.estimable else math.nan)
    return np.array(vals), np.array(ok)


def _n_atoms(gw: dpgate.Gateway, table: str) -> int:
    with gw.locked_view(table) as view:
        return view.atoms.n_atoms


def _rmse(est: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((est - truth) ** 2))) if est.size else math.nan


def accuracy(dataset: str, m: int, n_new: int, seed: int, marginals: bool = False,
             public_n: bool = True) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    if dataset == "pums":
        df, schema = dpgate.datasets.load_pums()
        table, scale, ranges = "pums", 10.0, _pums_ranges
    else:
        df, schema = dpgate.datasets.load_histogram("nettrace")
        table, scale, ranges = "nettrace", 50.0, _net_ranges
        if public_n:  # the seed's setting: N is public (the universal query)
            spec = schema.to_dict()
            spec["tables"]["nettrace"]["rows"] = len(df)
            schema = dpgate.Schema.from_dict(spec)
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=seed)
    if marginals:
        for c in ("age", "educ"):
            qs = dpgate.compile_sql(f"SELECT {c}, COUNT(*) FROM pums GROUP BY {c}", schema)
            gw.release_measurements(table, [(q, 0.1) for q in qs])
    past = ranges(rng, m)
    qs = [dpgate.compile_sql(f"SELECT COUNT(*) FROM {table} WHERE {p}", schema)[0] for p in past]
    if dataset == "nettrace" and not public_n:
        qs.insert(0, dpgate.compile_sql("SELECT COUNT(*) FROM nettrace", schema)[0])
    gw.release_measurements(table, [(q, q.sensitivity / scale) for q in qs])
    new = ranges(rng, n_new)
    truth = _truth(df, schema, table, new)
    sql = _batch(table, new)
    rows: dict[str, dict[str, float]] = {}
    blue, ok = _blue(gw, table, new)
    rows["blue (estimable only)"] = dict(rmse=_rmse(blue[ok], truth[ok]), share=float(ok.mean()))
    spent = gw.spent
    for name, method, opts in (
        ("uniform", "pca", dict(a=0.0, prior="uniform")),
        ("pca", "pca", {}),
        ("pca a=inf", "pca", dict(a=math.inf)),
        ("maxent", "maxent", {}),
    ):
        if name == "uniform" and gw.schema.table(table).rows is None:
            total = gw.estimate(f"SELECT COUNT(*) FROM {table}", a=math.inf).answer.value
            cells = gw.schema.table(table).n_cells
            qv = np.array([int(p.split()[4]) - int(p.split()[2]) + 1 for p in new], dtype=float)
            est, info = total * qv / cells, {"cv_rmse": math.nan, "fit_seconds": 0.0}
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            r = gw.estimate(sql, method=method, **opts)
            est, info = np.array([a.value for a in r.answers]), dict(r.model)
            info["wall"], info["cpu"] = time.perf_counter() - t0, time.process_time() - c0
        rows[name] = dict(rmse=_rmse(est, truth), cv_rmse=float(info.get("cv_rmse", math.nan)),
                          param=float(info.get("a", info.get("alpha", math.nan))),
                          fit_seconds=float(info.get("fit_seconds", 0.0)))
    assert gw.spent == spent, "model answers must not spend"
    label = dataset + (" +marginals" if marginals else "") + ("" if public_n else " (N not public)")
    return dict(dataset=label, m=m, new=n_new, seed=seed,
                scale=scale, atoms=_n_atoms(gw, table), rows=rows)


def timing(ms: list[int], maxent_max: int, seed: int = 0) -> list[dict[str, object]]:
    df, schema = dpgate.datasets.load_pums()
    rng = np.random.default_rng(seed)
    preds = _pums_ranges(rng, max(ms))
    qs = [dpgate.compile_sql(f"SELECT COUNT(*) FROM pums WHERE {p}", schema)[0] for p in preds]
    out = []
    for m in ms:
        gw = dpgate.Gateway(df, schema, budget=1e9, seed=seed)
        gw.release_measurements("pums", [(q, 0.1) for q in qs[:m]])
        row: dict[str, object] = dict(m=m, atoms=_n_atoms(gw, "pums"))
        for method in ("pca", "maxent"):
            if method == "maxent" and m > maxent_max:
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            r = gw.estimate("SELECT COUNT(*) FROM pums WHERE age < 40", method=method)
            row[method] = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0,
                               rank=r.model.get("rank"))
        out.append(row)
        print(f"  m={m:5d} atoms={row['atoms']:5d}  " + "  ".join(
            f"{k}: {v['cpu']:.2f}s cpu ({v['wall']:.2f}s wall)" for k, v in row.items() if isinstance(v, dict)),
            flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    quick = a.quick or os.environ.get("DPGATE_BENCH_QUICK") == "1"
    host = machine()
    print(f"machine: {host}")
    runs = []
    configs = [("pums", 200, False, True), ("pums", 200, True, True), ("nettrace", 200, False, True),
               ("nettrace", 200, False, False)]
    if not quick:
        configs += [("pums", 50, False, True), ("nettrace", 50, False, True)]
    for ds, m, marg, pub in configs:
        for seed in ((0,) if quick else (0, 1, 2)):
            runs.append(accuracy(ds, m, 150, seed, marg, pub))
    print("\nRMSE on 150 new range queries (true RMSE / cross-validated RMSE the method reports)")
    names = ["blue (estimable only)", "uniform", "pca", "pca a=inf", "maxent"]
    print(f"{'data set':30s} {'m':>4s} {'seed':>4s} " + " ".join(f"{n:>22s}" for n in names))
    for r in runs:
        cells = []
        for n in names:
            x = r["rows"][n]  # type: ignore[index]
            if n.startswith("blue"):
                cells.append(f"{x['rmse']:8.1f} on {100 * x['share']:3.0f}%")
            else:
                cells.append(f"{x['rmse']:8.1f} / {x['cv_rmse']:6.1f}")
        print(f"{r['dataset']:30s} {r['m']:4d} {r['seed']:4d} " + " ".join(f"{c:>22s}" for c in cells))
    print("\nfit time (5-fold CV included) vs number of past queries, PUMS 2-D ranges")
    ms = [50, 100, 200, 400] if quick else [50, 100, 200, 400, 800, 1600, 2400]
    times = timing(ms, maxent_max=200 if quick else 400)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "model.json", "w") as f:
        json.dump(dict(machine=host, quick=quick, accuracy=runs, timing=times), f, indent=1, default=float)
    print(f"\nwrote {RESULTS / 'model.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
