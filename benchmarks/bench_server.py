"""``dpgate serve``: what the wire protocol costs, and throughput with 16 clients.

1. **Round trip of a from-history answer.**  The same counting query, already
   released, asked again (free): in process with ``gw.query`` vs over psycopg 3
   to a ``dpgate serve`` subprocess on 127.0.0.1 (extended protocol, one
   connection).  The overhead (p50 difference) includes the protocol, the
   DB-API layer, and the durable (fsync'd) provenance row each answered
   statement writes before its answer is sent.
2. **Throughput.**  16 psycopg clients (threads), ``--queries`` statements each,
   over a mix of repeats (free) and new ranges (fresh releases, each one an
   fsync'd ledger transaction); 3 analysts; statements per second and the
   share answered free.  Afterwards the ledger is checked: the global cost never
   exceeds the budget and every analyst's charges stay within their cap.

Writes ``benchmarks/results/server.json`` and ``server.md``.

Usage::

    python benchmarks/bench_server.py [--quick] [--repeats 500] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

import dpgate
from dpgate.datasets import load_pums
from dpgate.server import add_user

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DATA = Path(dpgate.__file__).resolve().parent / "data"
SQL = "SELECT COUNT(*) FROM pums WHERE age < 30"
BUDGET, CAP = 3.0, 1.5


def _p(xs: list[float], q: float) -> float:
    return float(statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]) if len(xs) > 1 else xs[0]


def in_process(repeats: int, tmp: Path) -> list[float]:
    df, schema = load_pums()
    with dpgate.Gateway(df, schema, budget=BUDGET, ledger=str(tmp / "inproc.db")) as gw:
        gw.query(SQL, 25)
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            gw.query(SQL, 25)
            out.append(time.perf_counter() - t)
    return out


def start_server(tmp: Path) -> tuple[subprocess.Popen[str], int]:
    for name in ("alice", "bob", "carol"):
        add_user(tmp / "users.yaml", name, name + "-pw", CAP)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--data", str(DATA / "PUMS.csv"), "--schema",
         str(DATA / "pums.yaml"), "--ledger", str(tmp / "served.db"), "--budget", str(BUDGET), "--users",
         str(tmp / "users.yaml"), "--port", "0", "--accuracy", "25"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on [\d.]+:(\d+)", line)
        if m:
            # Drain the per-statement log lines so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError("the server did not start")


def dsn(port: int, who: str) -> str:
    return f"host=127.0.0.1 port={port} user={who} password={who}-pw dbname=pums"


def over_wire(port: int, repeats: int) -> list[float]:
    with psycopg.connect(dsn(port, "alice"), autocommit=True) as con:
        con.execute(SQL).fetchone()
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            con.execute(SQL).fetchone()
            out.append(time.perf_counter() - t)
    return out


def throughput(port: int, clients: int, queries: int) -> dict[str, float]:
    counts = {"ok": 0, "refused": 0}
    lock = threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        with psycopg.connect(dsn(port, ("alice", "bob", "carol")[i % 3]), autocommit=True) as con:
            for _ in range(queries):
                lo = rng.randrange(0, 100, 5)
                sql = f"SELECT COUNT(*) FROM pums WHERE age >= {lo} AND age < {lo + rng.choice((5, 10, 20))}"
                try:
                    con.execute(sql).fetchone()
                    key = "ok"
                except psycopg.errors.ConfigurationLimitExceeded:
                    key = "refused"
                with lock:
                    counts[key] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    return {"clients": clients, "statements": clients * queries, "seconds": elapsed,
            "statements_per_second": clients * queries / elapsed, **counts}


def check_ledger(path: Path) -> dict[str, float]:
    con = sqlite3.connect(path)
    try:
        top = con.execute("SELECT COALESCE(MAX(cost_after), 0) FROM dpgate_records").fetchone()[0]
        n = con.execute("SELECT COUNT(*) FROM dpgate_records").fetchone()[0]
        caps = dict(con.execute("SELECT analyst, SUM(epsilon) FROM dpgate_provenance WHERE kind = 'charge' "
                                "GROUP BY analyst").fetchall())
    finally:
        con.close()
    assert top <= BUDGET + 1e-9 and all(v <= CAP + 1e-9 for v in caps.values()), (top, caps)
    return {"global_spent": top, "fresh_releases": n, **{f"charged_{k}": v for k, v in caps.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run (smoke test)")
    ap.add_argument("--repeats", type=int, default=500)
    ap.add_argument("--queries", type=int, default=100, help="statements per client in the throughput run")
    args = ap.parse_args()
    repeats, queries = (100, 20) if args.quick else (args.repeats, args.queries)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        local = in_process(repeats, tmp)
        proc, port = start_server(tmp)
        try:
            wire = over_wire(port, repeats)
            tput = throughput(port, 16, queries)
        finally:
            proc.terminate()
            proc.wait(30)
        ledger = check_ledger(tmp / "served.db")
    ms = {name: {"p50": 1e3 * _p(xs, 50), "p95": 1e3 * _p(xs, 95)} for name, xs in
          (("in_process", local), ("psycopg", wire))}
    overhead = ms["psycopg"]["p50"] - ms["in_process"]["p50"]
    results = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "cores": os.cpu_count()},
               "repeats": repeats, "latency_ms": ms, "overhead_p50_ms": overhead, "throughput": tput,
               "ledger": ledger}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "server.json").write_text(json.dumps(results, indent=2) + "\n")
    md = [
        "| round trip of a from-history answer | p50 ms | p95 ms |", "|---|---|---|",
        *(f"| {k} | {v['p50']:.3f} | {v['p95']:.3f} |" for k, v in ms.items()),
        f"\nOverhead of the wire (p50): **{overhead:.3f} ms** (target ≤ 2 ms).",
        f"\n16 clients × {queries} statements: {tput['statements_per_second']:.0f} statements/s "
        f"({tput['seconds']:.2f} s; {tput['refused']} refused for budget); ledger: {ledger['fresh_releases']} "
        f"fresh releases, global ε {ledger['global_spent']:.4f} ≤ {BUDGET}, analysts within their caps.",
    ]
    (RESULTS / "server.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
