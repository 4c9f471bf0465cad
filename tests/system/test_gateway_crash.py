"""Crash safety and multi-process budget safety of the gateway's durable ledger.

* SIGKILL at random moments (≥ 20 trials, one shared ledger file): after each,
  a gateway reopened on the ledger has spent at least what the killed process
  last reported, and every release the process reported is in the ledger.
* ≥ 4 processes hammer one ledger with a small budget: together they never
  overspend, and everything any of them reported is in the ledger.

The processes are forked from a warm helper (``tests/_gateway_worker.py``) so each
trial costs a fraction of a second instead of an interpreter start-up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _gateway_worker import independent_spent

import dpgate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")

WORKER = Path(__file__).resolve().parents[1] / "_gateway_worker.py"


class Zygote:
    """The warm helper process: ``fork(**cmd)`` starts a worker child, returns its pid."""

    def __init__(self) -> None:
        env = dict(os.environ)
        root = str(Path(dpgate.__file__).resolve().parent.parent)  # the same dpgate as this test
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def fork(self, **cmd) -> int:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            for p in pids:
                if alive(p):
                    os.kill(p, signal.SIGKILL)
            raise AssertionError(f"worker processes {pids} did not finish within {timeout} s")
        time.sleep(0.01)


def read_events(path: Path) -> list[dict]:
    events = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line a SIGKILL cut short (only ever the last one)
    return events


def check_ledger(gw: dpgate.Gateway, schema) -> tuple[float, dict[int, float]]:
    """The reopened ledger is consistent: spent is the per-cell formula over its records."""
    hist = gw.history
    spent = gw.spent
    assert spent == pytest.approx(independent_spent(hist, schema), rel=1e-9, abs=1e-12)
    if len(hist):
        assert list(hist["id"]) == sorted(hist["id"]) and hist["id"].is_unique
        assert (np.diff(hist["cost_after"].to_numpy()) >= -1e-12).all()
        assert hist["cost_after"].iloc[-1] == pytest.approx(spent, rel=1e-9, abs=1e-12)
    return spent, dict(zip(hist["id"].tolist(), hist["value"].tolist(), strict=True))


# --------------------------------------------------------------------------- SIGKILL

CRASH_BUDGET = 1000.0


def test_sigkill_at_random_moments_never_undercounts(zygote, net, tmp_path):
    df, schema = net
    ledger = tmp_path / "crash.db"
    rnd = random.Random(20240)
    trials, killed_mid_session, answers_seen = 20, 0, 0
    for trial in range(trials):
        out = tmp_path / f"crash{trial}.jsonl"
        pid = zygote.fork(mode="crash", ledger=str(ledger), out=str(out), seed=trial, budget=CRASH_BUDGET,
                          n=1200, policy=rnd.choice(["minimal", "paper", "paper"]))
        if trial % 4 == 0:
            # Any moment from the fork on: loading, opening the ledger, replaying it, answering.
            time.sleep(rnd.uniform(0.0, 1.2))
        else:
            # While it answers: wait until it has shown a random number of answers, then a short random
            # delay (counting answers, not seconds, keeps the kills mid-session on a loaded machine).
            shown, deadline = rnd.randint(1, 40), time.monotonic() + 60
            while time.monotonic() < deadline:
                kinds = [e["event"] for e in read_events(out)]
                if kinds.count("answer") >= shown or "done" in kinds or "error" in kinds:
                    break
                time.sleep(0.005)
            time.sleep(rnd.uniform(0.0, 0.05))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_gone([pid], timeout=60)
        events = read_events(out)
        assert not [e for e in events if e["event"] == "error"], events[-1]
        answers = [e for e in events if e["event"] == "answer"]
        if answers and not any(e["event"] == "done" for e in events):
            killed_mid_session += 1
        answers_seen += len(answers)
        # Reopen: no corruption, no stale lock, and nothing the child showed is lost.
        with dpgate.Gateway(df, schema, budget=CRASH_BUDGET, ledger=ledger) as gw:
            spent, values = check_ledger(gw, schema)
        if answers:
            assert spent >= answers[-1]["spent"] - 1e-12, (trial, spent, answers[-1])
        for e in answers:
            assert e["spent"] <= spent + 1e-12
            if "fresh" in e["sources"]:
                assert e["records"], e  # a fresh answer was recorded before it was shown
            for rid, value, _alpha in e["records"]:
                assert rid in values, f"trial {trial}: released record {rid} missing from the ledger"
                assert values[rid] == value
    assert killed_mid_session >= 12, "most kills should land while the child is answering"
    assert answers_seen >= 100


# --------------------------------------------------------------------------- concurrency


def check_shared_ledger(per_worker: list[list[dict]], net, ledger: Path, budget: float) -> None:
    """What several workers sharing one ledger reported, against the reopened ledger."""
    df, schema = net
    for events in per_worker:
        assert not [e for e in events if e["event"] == "error"], events[-1]
        assert events and events[-1]["event"] == "done"
    with dpgate.Gateway(df, schema, budget=budget, ledger=ledger) as gw:
        spent, values = check_ledger(gw, schema)
    # Together they never overspent ...
    assert spent <= budget * (1 + 1e-9)
    answers = [e for events in per_worker for e in events if e["event"] == "answer"]
    refusals = [e for events in per_worker for e in events if e["event"] == "refused"]
    for e in answers:
        assert e["spent"] <= budget * (1 + 1e-9)
    # ... the budget really was contended and used up ...
    assert refusals, "the budget should run out"
    # (which worker releases first is a race: one may spend it all in a few releases, so each worker is
    # only required to have queried the shared ledger)
    assert all(any(e["event"] in ("answer", "refused") for e in events) for events in per_worker)
    assert spent > 0.5 * budget
    # ... every answer any worker printed is in the ledger (same id, same value) ...
    seen = set()
    for e in answers:
        if "fresh" in e["sources"]:
            assert e["records"], e
        for rid, value, _alpha in e["records"]:
            assert values.get(rid) == value
            assert rid not in seen
            seen.add(rid)
    assert seen == set(values), "every ledger record was reported by the worker that made it"
    # ... and the increases the workers reported add up to the system cost:
    # each was computed under the ledger lock on the synchronised history.
    assert sum(e["eps"] for e in answers) == pytest.approx(spent, rel=1e-9, abs=1e-9)
    # Refusals said how much remained, never more than what was actually left.
    for e in refusals:
        assert e["needed"] > e["remaining"] - 1e-12


@pytest.mark.parametrize("n_procs", [5])
def test_processes_sharing_a_ledger_never_overspend(zygote, net, tmp_path, n_procs):
    budget = 1.5
    ledger = tmp_path / "shared.db"
    start = time.time() + 1.5
    outs = [tmp_path / f"hammer{i}.jsonl" for i in range(n_procs)]
    ready = tmp_path / "ready"  # the workers also wait for each other to be open (a loaded machine)
    ready.mkdir()
    pids = [
        zygote.fork(mode="hammer", ledger=str(ledger), out=str(outs[i]), seed=100 + i, budget=budget, n=80,
                    max_refusals=10, start_at=start, ready_dir=str(ready), parties=n_procs,
                    policy=("minimal", "paper", "paper")[i % 3])
        for i in range(n_procs)
    ]
    wait_gone(pids, timeout=240)
    check_shared_ledger([read_events(o) for o in outs], net, ledger, budget)


def test_threads_sharing_a_ledger_never_overspend(net, tmp_path):
    """The same with threads of one process, each with its own Gateway on the file."""
    from _gateway_worker import run

    df, schema = net
    budget = 1.0
    ledger = tmp_path / "threads.db"
    # Every thread opens its gateway before start; on a loaded 2-core machine four opens
    # under one GIL can take seconds, and a thread that starts alone spends the whole budget.
    start = time.time() + 4.0
    outs = [tmp_path / f"thread{i}.jsonl" for i in range(4)]
    ready = tmp_path / "ready"  # ... and wait there for each other, however long the opens take
    ready.mkdir()
    cmds = [dict(mode="hammer", ledger=str(ledger), out=str(outs[i]), seed=200 + i, budget=budget, n=60,
                 max_refusals=8, start_at=start, ready_dir=str(ready), parties=4, policy=("minimal", "paper")[i % 2])
            for i in range(4)]
    errors = []

    def work(cmd):
        try:
            run(cmd, df, schema)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in cmds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    check_shared_ledger([read_events(o) for o in outs], net, ledger, budget)
