"""One gateway process of the shared PostgreSQL ledger test: N threads, each with its own Gateway.

Usage: ``python tests/_pg_ledger_worker.py '<json>'`` with keys ``url``, ``key``, ``budget``,
``out`` (a file prefix), ``seed``, ``threads``, ``n``, ``start_at``, ``ready_dir``, ``parties``.  Each thread runs
``_gateway_worker.run`` in "hammer" mode (every worker charges the same cells), writing its
events to ``<out>-<i>.jsonl``.  Exits 1 if any thread raised.
"""

from __future__ import annotations

import json
import sys
import threading

from _gateway_worker import nettrace_binned, run


def main() -> int:
    cfg = json.loads(sys.argv[1])
    df, schema = nettrace_binned()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        cmd = dict(mode="hammer", ledger=cfg["url"], ledger_key=cfg["key"], out=f"{cfg['out']}-{i}.jsonl",
                   seed=cfg["seed"] + i, budget=cfg["budget"], n=cfg["n"], max_refusals=4,
                   start_at=cfg["start_at"], ready_dir=cfg["ready_dir"], parties=cfg["parties"],
                   policy=("minimal", "paper")[i % 2])
        try:
            run(cmd, df, schema)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit code
            errors.append(exc)
            print(repr(exc), file=sys.stderr, flush=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(cfg["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
