"""``dpgate console`` on a ledger of 10 000 releases by 3 analysts: the time of every page.

The ledger is written directly (``Ledger.transaction().append_many``) with real PUMS queries
(``COUNT`` over an age range and a race) charged to three analysts through dpgate's provenance
(:func:`dpgate.ledger._provenance.charging`, as ``dpgate serve`` charges them), so no data are
read and the build takes seconds, not the hours of 10 000 statements.  Then the console serves
it (uvicorn in a thread; the ledger read and verified first, as ``dpgate console`` does) and each
page is fetched over HTTP: the first fetch (``/cells`` prices a table then) and the median of five more.  ``--quick``: 1 000 releases.

Usage::

    python benchmarks/bench_console.py [--quick] [--releases N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.console import LedgerReader, create_app
from dpgate.datasets import load_pums
from dpgate.ledger import Ledger, _provenance
from dpgate.plan.state import RecordedRelease, TableState

ANALYSTS = ("alice", "bob", "carol")
PAGES = ("/", "/cells?table=pums&columns=age", "/cells?table=pums&columns=age,race",
         "/cells?table=pums&columns=age,sex,race", "/releases", "/releases?q=race&size=200&page=3",
         "/releases?analyst=bob", "/analysts")


def build_ledger(path: str, releases: int, seed: int = 0) -> dict[str, float]:
    """A ledger of ``releases`` COUNTs over PUMS (age range × race), charged to :data:`ANALYSTS` in
    turn; returns each analyst's cap."""
    _, schema = load_pums()
    table = schema.table("pums")
    age, race = table.column("age"), table.column("race")
    rng = random.Random(seed)
    state = TableState.new(table, max_atoms=1)
    caps = {name: 10.0 for name in ANALYSTS}  # above what 10 000 such releases charge one analyst
    with Ledger.open(path, fingerprint="bench-console", budget=20.0, new=True) as ledger:
        _provenance.ensure_table(ledger)
        done = 0
        while done < releases:
            analyst = ANALYSTS[(done // 50) % len(ANALYSTS)]
            batch = []
            for _ in range(min(50, releases - done)):
                lo = rng.randrange(0, 100)
                hi = rng.randrange(lo + 1, 102)
                r = rng.randrange(0, 6)
                w = np.zeros((age.n_cells, race.n_cells))
                w[lo:hi, r] = 1
                q = LinearQuery.from_grid(table, ["age", "race"], [range(age.n_cells), range(race.n_cells)], w)
                batch.append((q, 0.01, f"SELECT COUNT(*) FROM pums WHERE age >= {lo} AND age < {hi} AND race = '{r + 1}'"))
            state.record_costs([RecordedRelease(0, q, 100.0, 0.0, 1.0, a, q.sensitivity) for q, a, _ in batch])
            cost = state.costs.charge
            with _provenance.charging(ledger, analyst, caps[analyst], "bench", schema), ledger.transaction() as tx:
                tx.append_many([{"kind": "query", "table": "pums", "query": q.to_json(),
                                 "sql": sql,
                                 "alpha": a, "sensitivity": q.sensitivity, "scale": q.sensitivity / a, "lattice": 1.0,
                                 "noise": "discrete_laplace", "value": float(rng.randrange(0, 300)),
                                 "cost_after": cost, "secure": True} for q, a, sql in batch])
            for _ in batch:
                _provenance.record_delivery(ledger, analyst, "bench", "fresh", 0.01)
            done += len(batch)
    return caps


@contextmanager
def serving(path: str, caps: dict[str, float]) -> Iterator[str]:
    """The console of ``path`` (uvicorn in a thread, loopback, no token); yields its base URL."""
    import uvicorn

    _, schema = load_pums()
    reader = LedgerReader(path, schema, caps)
    start = time.perf_counter()
    reader.analysts(reader.snapshot())  # as `dpgate console` does before serving
    print(f"read and verified the ledger (records, provenance, analysts' charges) in {time.perf_counter() - start:.2f} s")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(reader), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        reader.close()


def fetch(url: str) -> tuple[float, int]:
    """Seconds to fetch ``url`` whole, and its size in bytes."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - start, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--releases", type=int, default=None)
    args = parser.parse_args()
    n = args.releases or (1000 if args.quick or os.environ.get("DPGATE_BENCH_QUICK") else 10_000)
    pages: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.db")
        start = time.perf_counter()
        caps = build_ledger(path, n)
        print(f"built a ledger of {n} releases by {len(ANALYSTS)} analysts in {time.perf_counter() - start:.1f} s")
        with serving(path, caps) as base:
            print(f"{'page':45s} {'first (s)':>10s} {'median (s)':>11s} {'size (kB)':>10s}")
            for page in PAGES:
                first, size = fetch(base + page)
                again = statistics.median(fetch(base + page)[0] for _ in range(5))
                print(f"{page:45s} {first:10.3f} {again:11.3f} {size / 1000:10.0f}")
                pages[page] = {"first_s": first, "median_s": again, "kb": size / 1000}
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "console.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"releases": n, "analysts": len(ANALYSTS), "pages": pages,
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"},
                  fh, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
