"""Benchmark of the error-law quantiles (issue 14).  A script, not a test.

    python benchmarks/bench_law.py [--base DIR] [--rounds N]

Times, in one run and alternating between this tree and ``--base`` (another
checkout of dpgate, e.g. the commit before the change, exported with
``git archive``), each workload in a fresh child process:

1. ``lattice_for`` per call;
2. a cold Gil-Pelaez half-width (two discrete terms, a new law each time);
3. 100 laws equal up to rounding (a GROUP BY priced at one scale), each with
   1e-17 history weights;
4. ``minimal_scale`` for a fresh group after history (history gets no weight)
   and for a query the history already covers;
5. PUMS ``GROUP BY age`` right after ``GROUP BY sex``, and a single fresh count.

Writes ``benchmarks/results/law.json``.  BLAS is pinned to one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

WORKLOAD = r'''
import json, math, time, warnings
import numpy as np
warnings.simplefilter("ignore")
from dpgate.release.noise import lattice_for
from dpgate.inference import ErrorLaw, IncrementalBLUE, minimal_scale
import dpgate.inference as inf
out = {}
rng = np.random.default_rng(0)
scales = np.exp(rng.uniform(-10, 10, 10000))
t = time.perf_counter()
for s in scales:
    lattice_for(float(s), 3)
out["lattice_for_us"] = (time.perf_counter() - t) / scales.size * 1e6

bs = np.exp(rng.uniform(0, 3, 40))
t = time.perf_counter()
for b in bs:
    g = lattice_for(float(b), 1)[0]
    ErrorLaw([1.0, 1.0], [b, b], [g, g]).halfwidth(0.95)
out["cold_two_term_ms"] = (time.perf_counter() - t) / bs.size * 1e3

t = time.perf_counter()
for b in bs[:10]:
    g = lattice_for(float(b), 1)[0]
    laws = []
    for _ in range(100):
        c = np.r_[1e-17 * rng.standard_normal(6), 1 + 1e-15 * rng.standard_normal(2)]
        laws.append(ErrorLaw(c, np.r_[np.full(6, 3.0), b, b], np.r_[np.full(6, 3.0 / 1024), g, g]))
    if hasattr(inf, "halfwidths"):
        inf.halfwidths(laws, 0.95)
    else:
        [law.halfwidth(0.95) for law in laws]
out["group_of_100_ms"] = (time.perf_counter() - t) / 10 * 1e3

st = IncrementalBLUE(np.ones(64))
for i in range(16):
    h = np.zeros(64); h[4 * i:4 * i + 8] = 1.0
    st.append(h, 2.0 + i % 3, 0.0, lattice=lattice_for(2.0 + i % 3, 1)[0])
lat = lambda b: lattice_for(b, 1)[0]
t = time.perf_counter()
for j in range(20):
    h = np.zeros(64); h[j] = 1.0; h[63 - j] = 1.0; h[30] = 1.0
    minimal_scale(st, h, h, 5.0, 0.95, lattice=lat)
out["minimal_scale_fresh_ms"] = (time.perf_counter() - t) / 20 * 1e3
t = time.perf_counter()
for j in range(10):
    h = np.zeros(64); h[4 * j:4 * j + 8] = 1.0; h[4 * j + 8:4 * j + 16] += 1.0
    minimal_scale(st, h, h, 3.0 + 0.1 * j, 0.95, lattice=lat)
out["minimal_scale_history_ms"] = (time.perf_counter() - t) / 10 * 1e3

import dpgate, dpgate.datasets
df, schema = dpgate.datasets.load_pums()
gw = dpgate.Gateway(df, schema, budget=1000.0, seed=0)
t = time.perf_counter(); gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
out["pums_first_count_s"] = time.perf_counter() - t
gw.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=25)
gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=25)
t = time.perf_counter(); r = gw.query("SELECT age, COUNT(*) FROM pums GROUP BY age", accuracy=25)
out["pums_group_by_age_s"] = time.perf_counter() - t
out["pums_group_by_age_epsilon"] = r.epsilon_spent
print(json.dumps(out))
'''


def run(tree: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True, text=True,
                         check=True, cwd=str(tree))
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", type=Path, default=None, help="another dpgate checkout to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():  # alternate, so load drifts hit both alike
            runs[name].append(run(tree))
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for key in medians["this"]:
        line = f"{key:28s} this {medians['this'][key]:12.4g}"
        if "base" in medians:
            b = medians["base"][key]
            line += f"   base {b:12.4g}   base/this {b / medians['this'][key]:8.2f}"
        print(line)
    result: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "load_average": os.getloadavg()},
        "rounds": args.rounds, "medians": medians, "runs": runs,
    }
    out = HERE / "results" / "law.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
