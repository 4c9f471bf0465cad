"""Memory along the 1 000-statement PUMS session (issue 28): RSS and time every 50 statements.

One seeded gateway (pure ε, budget 10⁴; then zCDP, ρ budget 10⁶) answers the statements of
``bench_composition.pums1000()`` (``PUMS200`` extended to 1 000 statements: counts with ranges
and ``IN`` lists, 1–2 column ``GROUP BY``s, ``SUM``/``AVG`` of age and of income — 500 001
weights each — and exact repeats), in a fresh process whose address space is capped at
``--max-gb`` (``RLIMIT_AS``).  Every ``--every`` statements it records the resident set size
(``/proc/self/statm``), the peak (``VmHWM``) and the elapsed time; a ``MemoryError`` stops the
run, reported.  The growth per statement after statement 200 is the slope of the resident set
between the checkpoints at 200 and at the last one.

``--answers PATH`` also writes, per statement, ``gw.spent`` and every answer's value and
interval (``repr`` of the floats): two runs are compared bit for bit with ``--compare A B``.
``--trace A,B`` takes ``tracemalloc`` snapshots after statements A and B and prints the 25
tracebacks (10 frames) that grew most between them (slow: for finding what grows).

Writes ``benchmarks/results/long_pums.json`` (``--out``) and prints a table.

Usage::

    python benchmarks/bench_long_pums.py [--modes pure,zcdp] [-n 1000] [--max-gb 6] [--every 50]
        [--seed 1] [--answers PATH] [--trace 150,250] [--compare A B]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
from bench_composition import PURE_BUDGET, ZCDP_BUDGET, _cap_memory, pums1000  # noqa: E402
from bench_smartnoise import CONFIDENCE  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """The resident set size now (``/proc/self/statm``'s second field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_rss_bytes() -> int:
    """The peak resident set size (``VmHWM`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _top_growth(before: Any, after: Any, k: int = 25) -> list[str]:
    stats = after.compare_to(before, "traceback")
    out = []
    for s in stats[:k]:
        out.append(f"{s.size_diff / 1e6:+9.1f} MB ({s.size / 1e6:8.1f} MB, {s.count_diff:+d} blocks)")
        out.extend("      " + line for line in s.traceback.format()[-20:])
    return out


def run(mode: str, n: int, seed: int, every: int, answers: str | None, trace: tuple[int, ...]) -> dict[str, Any]:
    """One seeded gateway in ``mode`` through the first ``n`` statements of ``pums1000``."""
    import dpgate
    from dpgate.datasets import load_pums

    warnings.simplefilter("ignore")  # seeded noise warns; expected in a benchmark
    if trace:
        import tracemalloc

        tracemalloc.start(10)
    df, schema = load_pums()
    opts: dict[str, Any] = {"budget": PURE_BUDGET} if mode == "pure" else {"budget": ZCDP_BUDGET, "privacy": "zcdp"}
    gw = dpgate.Gateway(df, schema, seed=seed, **opts)
    points: list[dict[str, Any]] = [{"statement": 0, "rss_mb": rss_bytes() / 1e6, "seconds": 0.0}]
    log: list[dict[str, Any]] = []
    snaps: dict[int, Any] = {}
    stopped = None
    t_start = time.perf_counter()
    for i, (sql, acc, _) in enumerate(pums1000(n)):
        try:
            res = gw.query(sql, accuracy=acc, confidence=CONFIDENCE)
        except MemoryError:
            stopped = {"statement": i + 1, "sql": sql, "error": "MemoryError"}
            break
        except dpgate.Error as e:
            log.append({"spent": repr(float(gw.spent)), "refused": f"{type(e).__name__}: {e}"[:200]})
        else:
            log.append({"spent": repr(float(gw.spent)),
                        "answers": [[repr(a.value), repr(a.low), repr(a.high), a.source] for a in res.answers]})
        if (i + 1) % every == 0 or i + 1 == n:
            points.append({"statement": i + 1, "rss_mb": rss_bytes() / 1e6, "peak_mb": peak_rss_bytes() / 1e6,
                           "seconds": time.perf_counter() - t_start})
            print(f"  {mode} #{i + 1}: RSS {points[-1]['rss_mb']:.0f} MB, peak {points[-1]['peak_mb']:.0f} MB, "
                  f"{points[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        if i + 1 in trace:
            import gc
            import tracemalloc

            gc.collect()
            snaps[i + 1] = tracemalloc.take_snapshot()
            if len(snaps) == 2:
                a, b = sorted(snaps)
                print(f"--- tracemalloc: growth from statement {a} to {b}", file=sys.stderr)
                print("\n".join(_top_growth(snaps[a], snaps[b])), file=sys.stderr, flush=True)
    total = time.perf_counter() - t_start
    spent = float(gw.spent)
    gw.close()
    if answers:
        with open(answers, "w") as f:
            json.dump(log, f)
    return {"mode": mode, "statements": len(log), "seconds": total, "spent": spent, "points": points,
            "stopped": stopped, "peak_mb": peak_rss_bytes() / 1e6}


def run_apart(*args: Any, max_bytes: int) -> dict[str, Any]:
    """:func:`run` in a fresh process capped at ``max_bytes`` of address space."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_cap_memory, initargs=(max_bytes,)) as ex:
        return ex.submit(run, *args).result()


def growth_after(points: list[dict[str, Any]], start: int = 200) -> float | None:
    """MB per statement of the resident set between statement ``start`` and the last checkpoint."""
    base = [p for p in points if p["statement"] == start]
    last = points[-1]
    if not base or last["statement"] <= start:
        return None
    return (last["rss_mb"] - base[0]["rss_mb"]) / (last["statement"] - start)


def compare(a: str, b: str) -> int:
    """Compare two ``--answers`` files statement by statement; prints the first difference."""
    with open(a) as f:
        left = json.load(f)
    with open(b) as f:
        right = json.load(f)
    n = min(len(left), len(right))
    for i in range(n):
        if left[i] != right[i]:
            print(f"statement {i + 1} differs:\n  {left[i]}\n  {right[i]}")
            return 1
    print(f"identical on {n} statements (spent, every answer's value, interval and source)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="pure,zcdp")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--max-gb", type=float, default=6.0)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--answers", default=None, help="write per-statement answers to PATH (mode appended)")
    ap.add_argument("--trace", default="", help="statements A,B: tracemalloc growth between them")
    ap.add_argument("--out", default=os.path.join(RESULTS, "long_pums.json"))
    ap.add_argument("--compare", nargs=2, default=None)
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    trace = tuple(int(x) for x in args.trace.split(",") if x)
    results = {"machine": {"platform": platform.platform(), "cores": os.cpu_count()}, "max_gb": args.max_gb,
               "runs": {}}
    for mode in args.modes.split(","):
        answers = f"{args.answers}.{mode}.json" if args.answers else None
        r = run_apart(mode, args.n, args.seed, args.every, answers, trace, max_bytes=int(args.max_gb * 2**30))
        r["growth_after_200_mb"] = growth_after(r["points"])
        results["runs"][mode] = r
    print(f"{'mode':6} {'stmts':>6} {'time s':>8} {'peak MB':>8} {'MB/stmt >200':>13}  stopped")
    for mode, r in results["runs"].items():
        g = r["growth_after_200_mb"]
        print(f"{mode:6} {r['statements']:6d} {r['seconds']:8.1f} {r['peak_mb']:8.0f} "
              f"{'-' if g is None else f'{g:.2f}':>13}  {r['stopped'] or ''}")
        print("        RSS MB: " + ", ".join(f"{p['statement']}: {p['rss_mb']:.0f}" for p in r["points"]))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
