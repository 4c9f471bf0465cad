"""Benchmark the output side of a statement: ledger records, noise, answers.

What a fresh statement costs after its SQL ran and its plan is made, stage by stage, for
one output (a count) and for a GROUP BY's many (50 and 1 000 groups):

* ``LedgerTransaction.append_many`` of 1 / 50 / 1 000 records (checks, keyed MAC chain,
  insert, the returned records), each the first statement of a new in-memory or file ledger (inside an open
  transaction: the commit's fsync is ``bench_noise.py``'s), and reading back and verifying
  the chain of 1 000 records;
* ``noise.release_many`` of 1 / 50 releases, seeded and secure (OpenDP) noise;
* ``derived.assemble`` + ``decide.answers`` + ``Result`` of a fresh count and of fresh
  GROUP BYs over 50 and 1 000 declared keys, re-run on the arguments the gateway passed.

Prints a table and writes ``benchmarks/results/output.json``.

Usage::

    python benchmarks/bench_output.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import dpgate
import dpgate.gateway._gateway as gateway_module
from dpgate.answer.result import Result
from dpgate.errors import Warning as DPGateWarning
from dpgate.ledger.core import Ledger
from dpgate.release.noise import SecureNoise, SeededNoise, release_many

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "output.json"


def best_ms(fn: Any, repeat: int) -> float:
    """Median over ``repeat`` timed calls of ``fn`` (after one warm-up), in ms."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def entries(n: int) -> list[dict[str, Any]]:
    """A GROUP BY's records: one query JSON per group, shared statement fields."""
    qs = [json.dumps({"table": "t", "columns": ["g"], "breakpoints": [list(range(51))],
                      "numerators": [int(j == i % 51) for j in range(51)], "denominator": 1, "offset": "0"},
                     separators=(",", ":")) for i in range(n)]  # fmt: skip
    return [{"kind": "query", "table": "t", "query": qs[i], "sql": "SELECT g, COUNT(*) FROM t GROUP BY g",
             "alpha": 0.0123, "sensitivity": 1.0, "scale": 81.30081300813008, "lattice": 0.0078125,
             "noise": "discrete_laplace", "value": 1000.0 + i * 0.37, "cost_after": 0.0123, "secure": True}
            for i in range(n)]  # fmt: skip


def bench_ledger(repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for where in ("memory", "file"):
            for n in (1, 50, 1000):
                es = entries(n)
                ts = []
                for i in range(repeat if n < 1000 else max(3, repeat // 10)):
                    path = None if where == "memory" else os.path.join(tmp, f"{where}{n}-{i}.sqlite")
                    with Ledger.open(path, fingerprint="bench", budget=1e9) as led:
                        with led.transaction() as tx:
                            t0 = time.perf_counter()
                            tx.append_many(es)
                            ts.append(time.perf_counter() - t0)
                ms = statistics.median(ts) * 1e3
                out[f"append_many_{where}_{n}"] = {"ms": ms, "us_per_record": ms * 1e3 / n}
        path = os.path.join(tmp, "read.sqlite")
        with Ledger.open(path, fingerprint="bench", budget=1e9) as led, led.transaction() as tx:
            tx.append_many(entries(1000))

        def reopen() -> None:
            with Ledger.open(path, fingerprint="bench", budget=1e9) as again:
                assert len(again.records()) == 1000

        out["reopen_verify_1000_ms"] = best_ms(reopen, max(3, repeat // 10))
    return out


def bench_noise(repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, src in (("seeded", SeededNoise(0)), ("secure", SecureNoise())):
        for n in (1, 50):
            items = [(1000 + i, 1, 1.0, 0.0123) for i in range(n)]
            out[f"release_many_{name}_{n}_ms"] = best_ms(lambda items=items, src=src: release_many(items, src), repeat)
    return out


def bench_answers(repeat: int) -> dict[str, Any]:
    keys = [f"k{i:04d}" for i in range(1000)]
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"g": rng.choice(keys, 20_000), "g50": rng.choice(keys[:50], 20_000),
                       "x": rng.integers(0, 100, 20_000)})  # fmt: skip
    schema = {"tables": {"t": {"columns": {"g": {"type": "categorical", "values": keys},
                                           "g50": {"type": "categorical", "values": keys[:50]},
                                           "x": {"type": "integer", "min": 0, "max": 99}}}}}  # fmt: skip
    captured: list[tuple[Any, ...]] = []
    assemble = gateway_module.assemble

    def capture(*args: Any) -> Any:
        captured.append(args)
        return assemble(*args)

    out: dict[str, Any] = {}
    gateway_module.assemble = capture  # type: ignore[assignment]
    try:
        for label, sql in (("count", "SELECT COUNT(*) FROM t WHERE x < 30"),
                           ("group_by_50", "SELECT g50, COUNT(*) FROM t GROUP BY g50"),
                           ("group_by_1000", "SELECT g, COUNT(*) FROM t GROUP BY g")):  # fmt: skip
            with warnings.catch_warnings(), dpgate.Gateway(df, schema, budget=1e9, seed=1) as gw:
                warnings.simplefilter("ignore", DPGateWarning)
                t0 = time.perf_counter()
                n = len(gw.query(sql, accuracy=1000).answers)
                total = (time.perf_counter() - t0) * 1e3
            stmt, answers_at, confidence = captured[-1]
            ms = best_ms(lambda s=stmt, f=answers_at, c=confidence: Result(assemble(s, f, c), s, 0.0), repeat)
            out[label] = {"answers": n, "ms": ms, "us_per_answer": ms * 1e3 / n, "whole_query_ms": total}
    finally:
        gateway_module.assemble = assemble
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    repeat = 20 if args.quick else 200
    results = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "ledger": bench_ledger(repeat),
        "noise": bench_noise(repeat),
        "answers": bench_answers(repeat),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    led = results["ledger"]
    for where in ("memory", "file"):
        print(f"append_many {where:6s}: " + "; ".join(
            f"{n} records {led[f'append_many_{where}_{n}']['ms']:.3f} ms "
            f"({led[f'append_many_{where}_{n}']['us_per_record']:.1f} µs each)" for n in (1, 50, 1000)))
    print(f"re-open and verify 1 000 records: {led['reopen_verify_1000_ms']:.1f} ms")
    noise = results["noise"]
    for name in ("seeded", "secure"):
        print(f"release_many {name}: 1 item {noise[f'release_many_{name}_1_ms'] * 1e3:.1f} µs, "
              f"50 items {noise[f'release_many_{name}_50_ms']:.3f} ms")
    for label, r in results["answers"].items():
        print(f"answers {label:14s}: {r['answers']:5d} answers {r['ms']:.3f} ms ({r['us_per_answer']:.2f} µs each); "
              f"whole fresh query {r['whole_query_ms']:.1f} ms")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
