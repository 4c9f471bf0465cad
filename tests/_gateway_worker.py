"""Helpers for the gateway tests, and a worker process for the crash/concurrency tests.

As a module: :func:`independent_spent` recomputes the per-cell system cost of Xiao & Xiong,
"Bayesian Inference under Differential Privacy" (2012),
from a gateway's released history alone (not from the gateway's bookkeeping), and
:func:`nettrace_binned` gives NETTRACE with a small declared domain.

As a script (``python tests/_gateway_worker.py``): a *zygote*.  It imports dpgate
and loads the data once, prints ``ready``, then reads one JSON command per line
on stdin and forks a child per command, printing the child's pid.  The parent
test kills children with SIGKILL at random moments; forking from a warm process
keeps each trial short (importing dpgate takes seconds).  A child opens a
``Gateway`` on the given ledger and answers random queries, writing one JSON line
per event to its own output file (``write`` + flush, so a line written before a
SIGKILL is never lost).  Events:

* ``{"event": "open", "spent": s}`` once the gateway is open;
* ``{"event": "answer", "spent": s, "eps": e, "sources": [...], "values": [...],
  "records": [[id, value, alpha], ...]}`` after ``query()`` returned — ``records``
  are the ledger records this child appended for that answer;
* ``{"event": "refused", "needed": n, "remaining": r}`` on ``BudgetExhausted``;
* ``{"event": "done"}`` at the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np

NET_EDGES = list(range(0, 129, 16)) + [4096]  # 8 bins of 16 non-zero cells, then the tail


def nettrace_binned():
    """NETTRACE (one row per unit) with ``value`` declared in bins of 16 over 0..127."""
    import dpgate
    from dpgate.datasets import load_histogram

    df, _ = load_histogram("nettrace")
    schema = dpgate.Schema.from_dict(
        {"tables": {"nettrace": {"columns": {"value": {"type": "integer", "min": 0, "max": 4095, "bins": NET_EDGES}}}}}
    )
    return df, schema


# --------------------------------------------------------------------------- independent accounting


def history_matrix(history, table):
    """Rows of ``history`` for ``table`` as dense vectors over a common refinement.

    Large product domains (PUMS has ~2.5e10 cells) are handled by building the
    vectors on the product grid of the columns the history uses, with every
    breakpoint any released query uses: each box of that grid is a non-empty
    union of domain cells on which every released query is constant, so the
    maximum over boxes of the per-cell cost equals the maximum over cells.
    """
    from dpgate.compile.query import LinearQuery

    rows = history[history["table"].str.lower() == table.name.lower()]
    queries = [LinearQuery.from_json(s) for s in rows["query"]]
    used = {c.lower() for q in queries for c in q.columns}
    cols = [c.name for c in table.columns if c.name.lower() in used]
    bps = []
    for c in cols:
        pts = {0}
        for q in queries:
            lower = [x.lower() for x in q.columns]
            if c.lower() in lower:
                pts |= set(q.breakpoints[lower.index(c.lower())])
        bps.append(sorted(pts))
    H = np.stack([np.asarray(q.expand(table, cols, bps), dtype=float).ravel() / q.denominator for q in queries])
    return H, rows["alpha"].to_numpy(float), rows["sensitivity"].to_numpy(float)


def independent_spent(history, schema) -> float:
    """``Σ_tables k · max_j Σ_i (α_i/S_i)|H_ij|`` (Xiao & Xiong (2012), Theorem 5.5) from the history alone.

    Also checks that the recorded sensitivity is ``max|q|`` of the recorded query and
    that ``dpgate.inference.system_cost`` agrees with the formula written out here.
    """
    from dpgate.inference import system_cost

    total = 0.0
    if len(history) == 0:
        return total
    for name in sorted(set(history["table"])):
        table = schema.table(name)
        H, alpha, sens = history_matrix(history, table)
        if not np.allclose(sens, np.abs(H).max(axis=1), rtol=0, atol=1e-12):
            raise AssertionError("a recorded sensitivity is not max|q| of the recorded query")
        B = (alpha / sens) @ np.abs(H)
        mine = table.max_rows_per_individual * float(B.max())
        theirs = table.max_rows_per_individual * system_cost(H, alpha, sens).max
        if not np.isclose(mine, theirs, rtol=1e-12, atol=1e-15):
            raise AssertionError(f"system_cost disagrees with the formula: {theirs!r} != {mine!r}")
        total += mine
    return total


# --------------------------------------------------------------------------- worker


HAMMER_SQL = (  # one count, four spellings: every process charges the same cells
    "SELECT COUNT(*) FROM nettrace WHERE value < 16",
    "SELECT COUNT(*) FROM nettrace WHERE value BETWEEN 0 AND 15",
    "SELECT COUNT(*) FILTER (WHERE value < 16) FROM nettrace",
    "SELECT SUM(CASE WHEN value < 16 THEN 1 ELSE 0 END) FROM nettrace",
)


def _query(rng: random.Random, mode: str, i: int):
    """A random count over declared bins ("crash"), or one count at ever tighter
    accuracies ("hammer": all processes charge the same cells, so the budget binds)."""
    if mode == "hammer":
        return rng.choice(HAMMER_SQL), 20.0 * 0.93**i * rng.uniform(0.7, 1.0)
    n_bins = len(NET_EDGES) - 2  # bins inside 0..127
    lo = rng.randint(0, n_bins - 1)
    hi = rng.randint(lo + 1, n_bins)
    sql = f"SELECT COUNT(*) FROM nettrace WHERE value >= {NET_EDGES[lo]} AND value < {NET_EDGES[hi]}"
    return sql, rng.uniform(3.0, 30.0)


def run(cmd: dict, df, schema) -> None:
    import dpgate

    out = open(cmd["out"], "a", buffering=1, encoding="utf-8")

    def emit(**event):
        event["t"] = time.time()
        out.write(json.dumps(event) + "\n")
        out.flush()

    rng = random.Random(cmd["seed"])
    emit(event="start")
    gw = dpgate.Gateway(df, schema, budget=cmd["budget"], ledger=cmd["ledger"], seed=cmd["seed"],
                        policy=cmd.get("policy", "minimal"), ledger_key=cmd.get("ledger_key"))
    session = gw.ledger.session
    last = max((r.id for r in gw.ledger.records()), default=0)
    emit(event="open", spent=gw.spent)
    if "start_at" in cmd:  # line up with the other processes
        time.sleep(max(0.0, cmd["start_at"] - time.time()))
    if "ready_dir" in cmd:  # ... and, on a loaded machine, wait for every party to be open (at most 120 s)
        ready = Path(cmd["ready_dir"])
        (ready / f"{os.getpid()}-{cmd['seed']}").touch()
        deadline = time.time() + 120.0
        while len(list(ready.iterdir())) < cmd["parties"] and time.time() < deadline:
            time.sleep(0.01)
    refusals = 0
    for i in range(cmd["n"]):
        sql, acc = _query(rng, cmd["mode"], i)
        conf = rng.choice([0.8, 0.9, 0.95])
        partial = cmd["mode"] == "hammer" and rng.random() < 0.3
        try:
            res = gw.query(sql, accuracy=acc, confidence=conf, allow_partial=partial)
        except dpgate.BudgetExhausted as exc:
            emit(event="refused", needed=exc.needed, remaining=exc.remaining)
            refusals += 1
            if refusals >= cmd.get("max_refusals", 10**9):
                break
            continue
        spent = gw.spent
        new = gw.ledger.records(since=last)
        last = max([last] + [r.id for r in new])
        mine = [[r.id, r.value, r.alpha] for r in new if r.session == session]
        emit(event="answer", sql=sql, spent=spent, eps=res.epsilon_spent,
             sources=[a.source for a in res.answers],
             values=[None if a.value != a.value else a.value for a in res.answers], records=mine)
    emit(event="done", spent=gw.spent)
    gw.close()


def serve() -> None:
    import dpgate  # noqa: F401  (warm the imports before forking)

    df, schema = nettrace_binned()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                run(cmd, df, schema)
            except BaseException as exc:  # noqa: BLE001 - report, then exit
                with open(cmd["out"], "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"event": "error", "error": repr(exc)}) + "\n")
                code = 1
            finally:
                os._exit(code)
        print(pid, flush=True)


if __name__ == "__main__":
    serve()
