"""Benchmark of the inference stage (issue 3).  A script, not a test.

    python benchmarks/bench_inference.py [--quick]

Measures, in one run:

1. interval (half-width) computation time vs the number of error terms m for
   the exact Gil-Pelaez law, the discrete convolution (PC, γ = 0.01, the paper's
   unit grid) of Xiao & Xiong, "Bayesian Inference under Differential Privacy"
   (2012), §4, and Monte Carlo (10⁶ samples), with the accuracy each achieved
   against the exact law;
2. PC vs exact as PC's cost β = (Σ|A_k| b_k)² grows (Theorem 4.18);
3. IncrementalBLUE append time per row at n = 100, 1000, 4096 atoms;
4. estimate() latency (batch and incremental) and minimal_scale latency.

Writes ``benchmarks/results/inference.json``.  BLAS is pinned to one thread
(set before numpy loads): on a shared machine a multi-threaded matrix–vector
product was measured 100× slower than a single-threaded one.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from dpgate.inference import ErrorLaw, IncrementalBLUE, estimate, minimal_scale  # noqa: E402

CONF = 0.95


def timed(fn: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    """Median wall time of ``fn`` over ``repeat`` runs, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def problem(m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BLUE-like weights and count-query scales (S ≤ 5, α ∈ [0.05, 1] as in Xiao & Xiong (2012), §6)."""
    c = rng.normal(size=m) * np.exp(rng.uniform(-1.5, 0.5, m)) / math.sqrt(m) * 3
    b = rng.integers(1, 6, m) / rng.uniform(0.05, 1.0, m)
    return c, b


def cdf_error(law: ErrorLaw, ref: ErrorLaw) -> float:
    q = np.linspace(0.05, 4.0, 40) * ref.std
    return float(np.abs(law._abs_cdf(q) - ref._abs_cdf(q)).max())


def bench_intervals(quick: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2024)
    rows = []
    for m in (10, 100, 1000, 10_000):
        c, b = problem(m, rng)
        t_ex, q_ex = timed(lambda c=c, b=b: ErrorLaw(c, b).halfwidth(CONF), repeat=7)
        ref = ErrorLaw(c, b)
        beta = float((np.abs(c) * b).sum() ** 2)
        row: dict[str, Any] = {"m": m, "beta": beta, "std": ref.std,
                               "exact": {"seconds": t_ex, "halfwidth": q_ex,
                                         "cdf_error_bound": ref.error_bound}}
        t_pc, pc = timed(lambda c=c, b=b: ErrorLaw(c, b, method="convolution", gamma=0.01, step=1.0), 1)
        q_pc = pc.halfwidth(CONF)
        row["convolution"] = {
            "seconds": t_pc, "gamma": 0.01, "step": 1.0, "halfwidth": q_pc,
            "halfwidth_rel_excess": q_pc / q_ex - 1, "central_cdf_error": cdf_error(pc, ref),
            "rounding_width": pc._conv.rounding_width if pc._conv else 0.0,
        }
        samples = 10**6
        if m >= 10_000 or (quick and m >= 1000):
            samples = 10**5  # timed at 10⁵ and extrapolated linearly (Theorem 4.11: O(m·m_s))
        t_mc, mc = timed(lambda c=c, b=b, samples=samples: (lambda L: (L, L.halfwidth(CONF)))(
            ErrorLaw(c, b, method="montecarlo", samples=samples, rng=1)), 1)
        law_mc, q_mc = mc
        row["montecarlo"] = {
            "samples_timed": samples, "seconds": t_mc * 10**6 / samples,
            "extrapolated": samples != 10**6, "halfwidth": q_mc,
            "halfwidth_rel_error": q_mc / q_ex - 1, "cdf_error": cdf_error(law_mc, ref),
        }
        row["speedup_vs_convolution"] = t_pc / t_ex
        row["speedup_vs_montecarlo"] = row["montecarlo"]["seconds"] / t_ex
        rows.append(row)
        print(f"m={m:>6}  exact {t_ex * 1e3:8.3f} ms  q={q_ex:10.4f} | PC {t_pc * 1e3:9.1f} ms "
              f"q={q_pc:10.4f} ({q_pc / q_ex - 1:+.2%}), cdf err {row['convolution']['central_cdf_error']:.1e} | "
              f"MC {row['montecarlo']['seconds']:8.2f} s{'*' if samples != 10**6 else ' '} "
              f"q={q_mc:10.4f} ({q_mc / q_ex - 1:+.2%}), cdf err {row['montecarlo']['cdf_error']:.1e}",
              flush=True)
    print("  (* Monte Carlo timed with 10⁵ samples and scaled to 10⁶)")
    return rows


def bench_beta() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    c, b = problem(100, rng)
    rows = []
    for k in (1, 4, 16, 64):
        cc = c * k
        t_ex, _ = timed(lambda cc=cc: ErrorLaw(cc, b).halfwidth(CONF), repeat=7)
        t_pc, _ = timed(lambda cc=cc: ErrorLaw(cc, b, method="convolution", gamma=0.01, step=1.0)
                        .halfwidth(CONF), repeat=1)
        beta = float((np.abs(cc) * b).sum() ** 2)
        rows.append({"m": 100, "beta": beta, "exact_seconds": t_ex, "convolution_seconds": t_pc,
                     "speedup": t_pc / t_ex})
        print(f"beta={beta:12.4g}  exact {t_ex * 1e3:7.3f} ms  PC {t_pc * 1e3:9.1f} ms  "
              f"speed-up {t_pc / t_ex:8.0f}x", flush=True)
    return rows


def range_row(n: int, rng: np.random.Generator) -> np.ndarray:
    lo, hi = sorted(rng.integers(0, n + 1, 2))
    h = np.zeros(n)
    h[lo : max(hi, lo + 1)] = 1.0
    return h


def bench_append(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for n in (100, 1000, 4096):
        rng = np.random.default_rng(n)
        state = IncrementalBLUE(np.ones(n))
        target = min(n // 2, 1000) if not quick else min(n // 2, 400)
        t0 = time.perf_counter()
        while state.rank < target:
            state.append(range_row(n, rng), float(rng.uniform(1, 20)), 0.0)
        build = time.perf_counter() - t0
        per_row = []
        for _ in range(50):
            h = range_row(n, rng)
            t0 = time.perf_counter()
            state.append(h, float(rng.uniform(1, 20)), 0.0)
            per_row.append(time.perf_counter() - t0)
        Q = range_row(n, rng)
        t_est, _ = timed(lambda state=state, Q=Q: state.estimate(Q).halfwidth(CONF), repeat=5)
        t_with, _ = timed(lambda state=state, Q=Q: state.estimate_with(Q, Q, 3.0), repeat=5)
        t_min, b = timed(lambda state=state, Q=Q: minimal_scale(state, Q, Q, 1.0, CONF), repeat=3)
        rows.append({"n_atoms": n, "rank": state.rank, "rows": state.n_rows,
                     "append_ms_median": 1e3 * statistics.median(per_row),
                     "append_ms_mean": 1e3 * statistics.fmean(per_row),
                     "build_seconds": build, "estimate_ms": 1e3 * t_est,
                     "estimate_with_ms": 1e3 * t_with, "minimal_scale_ms": 1e3 * t_min})
        print(f"n={n:>5} rank={state.rank:>5} rows={state.n_rows:>5}: append "
              f"{1e3 * statistics.median(per_row):6.2f} ms/row | estimate+interval {1e3 * t_est:7.2f} ms"
              f" | estimate_with {1e3 * t_with:6.2f} ms | minimal_scale {1e3 * t_min:7.1f} ms", flush=True)
    return rows


def bench_batch() -> list[dict[str, Any]]:
    rows = []
    for m, n in ((50, 20), (400, 100), (2000, 500)):
        rng = np.random.default_rng(m)
        H = np.array([range_row(n, rng) for _ in range(m)])
        alpha = rng.uniform(0.05, 1.0, m)
        y = rng.normal(size=m)
        Q = H[:5].sum(axis=0)
        t, est = timed(lambda H=H, y=y, alpha=alpha, Q=Q: estimate(H, y, alpha, Q), repeat=3)
        t_int, _ = timed(lambda H=H, y=y, alpha=alpha, Q=Q: estimate(H, y, alpha, Q).posterior.interval(CONF), repeat=3)
        rows.append({"m": m, "n": n, "estimate_ms": 1e3 * t, "estimate_and_interval_ms": 1e3 * t_int})
        print(f"batch estimate m={m:>5} n={n:>4}: {1e3 * t:8.2f} ms (with interval {1e3 * t_int:8.2f} ms)",
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs for a smoke test")
    args = ap.parse_args()
    info = machine()
    print("machine:", json.dumps(info))
    out = {"machine": info, "confidence": CONF,
           "intervals": bench_intervals(args.quick), "beta_sweep": bench_beta(),
           "incremental": bench_append(args.quick), "batch": bench_batch()}
    path = Path(__file__).resolve().parent / "results" / "inference.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
