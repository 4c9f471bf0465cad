"""Benchmark the noise sources and the ledger.

Prints a summary and writes ``benchmarks/results/noise.json``:

* samples/s of :class:`~dpgate.release.noise.SecureNoise` and
  :class:`~dpgate.release.noise.SeededNoise` (one draw per call, and batched), and the
  latency of one :func:`~dpgate.release.noise.release`;
* the cost of the first OpenDP import (fresh interpreter);
* ledger ``transaction() + append + commit`` latency, p50/p95, file-backed
  (WAL, ``synchronous=FULL``: one fsync per commit) versus in-memory, and the
  time to read 1 000 / 10 000 records.

Usage::

    python benchmarks/bench_noise.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpgate.ledger.core import Ledger
from dpgate.release.noise import SecureNoise, SeededNoise, release

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "noise.json"


def rate(fn, n: int) -> float:
    """Calls of ``fn`` per second over ``n`` calls (after one warm-up call)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def quantiles_ms(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3  # noqa: E731
    return {"p50_ms": pick(0.50), "p95_ms": pick(0.95), "max_ms": xs[-1] * 1e3, "n": len(xs)}


def bench_noise(n: int) -> dict:
    out: dict = {}
    for name, src in (("secure", SecureNoise()), ("seeded", SeededNoise(0))):
        per_t = {}
        for t in (2.0, 1024.0, 1e12):
            single = rate(lambda src=src, t=t: src.discrete_laplace(t), n)
            batch = rate(lambda src=src, t=t: src.discrete_laplace_many(t, 10_000), max(3, n // 2000)) * 10_000
            per_t[f"t={t:g}"] = {"single_per_s": single, "batch_per_s": batch}
        huge = rate(lambda src=src: src.discrete_laplace(2.0**60), max(50, n // 20))
        rel = rate(lambda src=src: release(123_456, 7, 1.0, 0.1, src), n)
        out[name] = {"samples": per_t, "single_t=2^60_per_s": huge, "release_per_s": rel,
                     "release_latency_us": 1e6 / rel}  # fmt: skip
    return out


def bench_import() -> dict:
    code = (
        "import time; t=time.perf_counter(); import dpgate.release.noise as n; t1=time.perf_counter();"
        "n.SecureNoise().discrete_laplace(3.0); t2=time.perf_counter();"
        "print(t1-t, t2-t1)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    a, b = map(float, res.stdout.split())
    return {"import_dpgate_noise_s": a, "first_secure_draw_incl_opendp_import_s": b}


def bench_ledger(n: int) -> dict:
    out: dict = {}
    fields = dict(kind="query", table="pums", query='{"w":[1,0,1]}', sql="SELECT COUNT(*) FROM pums WHERE age < 30",
                  alpha=1e-4, sensitivity=1.0, scale=1e4, lattice=1 / 1024, noise="discrete_laplace",
                  value=41.5, cost_after=0.5, secure=True)  # fmt: skip
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        for name, path in (("file", os.path.join(tmp, "bench.sqlite")), ("memory", None)):
            with Ledger.open(path, fingerprint="bench", budget=1.0) as led:
                lat = []
                last = 0
                for _ in range(n):
                    t0 = time.perf_counter()
                    with led.transaction() as tx:
                        tx.records(since=last)
                        last = tx.append(**fields).id
                    lat.append(time.perf_counter() - t0)
                out[f"append_commit_{name}"] = quantiles_ms(lat)
                with led.transaction() as tx:
                    for _ in range(10_000 - n):
                        tx.append(**fields)
                reads = {}
                for k in (1_000, 10_000):
                    since = 10_000 - k
                    ts = []
                    for _ in range(5):
                        t0 = time.perf_counter()
                        recs = led.records(since=since)
                        ts.append(time.perf_counter() - t0)
                    assert len(recs) == k
                    reads[f"read_{k}_records_ms"] = statistics.median(ts) * 1e3
                out[f"reads_{name}"] = reads
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    n = 500 if args.quick else 3_000
    results = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpus": os.cpu_count()},  # fmt: skip
        "import": bench_import(),
        "noise": bench_noise(n),
        "ledger": bench_ledger(min(n, 2_000)),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    imp = results["import"]
    print(f"import dpgate.release.noise {imp['import_dpgate_noise_s'] * 1e3:.0f} ms; "
          f"first secure draw (imports OpenDP) {imp['first_secure_draw_incl_opendp_import_s'] * 1e3:.0f} ms")  # fmt: skip
    for name, r in results["noise"].items():
        for t, s in r["samples"].items():
            print(f"{name:7s} {t:9s} single {s['single_per_s']:>12,.0f}/s   batch {s['batch_per_s']:>12,.0f}/s")
        print(f"{name:7s} t=2^60    single {r['single_t=2^60_per_s']:>12,.0f}/s   "
              f"release() {r['release_latency_us']:.1f} µs")  # fmt: skip
    for name in ("file", "memory"):
        q = results["ledger"][f"append_commit_{name}"]
        rd = results["ledger"][f"reads_{name}"]
        print(f"ledger {name:6s} append+commit p50 {q['p50_ms']:.3f} ms p95 {q['p95_ms']:.3f} ms; "
              f"read 1k {rd['read_1000_records_ms']:.1f} ms, 10k {rd['read_10000_records_ms']:.1f} ms")  # fmt: skip
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
