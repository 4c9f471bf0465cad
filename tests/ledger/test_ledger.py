"""Tests of dpgate.ledger.core: durability, binding, rollback, and locking across threads and processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dpgate.errors import DPGateInternalError, InvalidRequirement, LedgerError
from dpgate.ledger import core as ledger_module
from dpgate.ledger.core import FORMAT_VERSION, Ledger, LedgerRecord

REPO = Path(__file__).resolve().parents[2]
FP = "sha256:data+schema"


def fields(**over):
    base = dict(
        kind="query", table="pums", query='{"w":[1,0]}', sql="SELECT COUNT(*) FROM pums",
        alpha=0.125, sensitivity=1.0, scale=8.0, lattice=2.0**-7, noise="discrete_laplace",
        value=41.5, cost_after=0.125, secure=True,
    )  # fmt: skip
    base.update(over)
    return base


@pytest.fixture(params=["memory", "file"])
def led(request, tmp_path):
    path = None if request.param == "memory" else tmp_path / "ledger.sqlite"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        yield led


# ----------------------------------------------------------------------------- basics


def test_append_and_read_back(led):
    assert led.records() == ()
    assert led.budget == 1.0 and FP not in repr(led) and len(led.binding) == 64
    with led.transaction() as tx:
        assert tx.records() == ()
        a = tx.append(**fields())
        b = tx.append(**fields(kind="warm_start", value=-3.0, cost_after=0.25, secure=False, session="s2"))
        assert tx.records() == (a, b)  # own appends are visible inside
    assert (a.id, b.id) == (1, 2)
    assert led.records() == (a, b)
    assert led.records(since=1) == (b,)
    assert isinstance(a, LedgerRecord) and a.session == led.session and b.session == "s2"
    assert a.created_at.endswith("+00:00")
    with pytest.raises(AttributeError):
        a.value = 0.0  # type: ignore[misc]


def test_append_many_is_append_in_order(tmp_path):
    rows = [fields(value=float(i), cost_after=0.01 * i, created_at=f"2026-01-01T00:00:0{i}+00:00") for i in range(5)]
    stored = []
    for name, batched in (("one.db", False), ("many.db", True)):
        with Ledger.open(tmp_path / name, fingerprint=FP, budget=1.0) as led:
            with led.transaction() as tx:
                tx.append(**fields(created_at="2026-01-01T00:00:00+00:00"))
                got = tx.append_many(rows) if batched else [tx.append(**r) for r in rows]
                assert tx.records(since=1) == tuple(got)
            with pytest.raises(InvalidRequirement), led.transaction() as tx:
                tx.append_many([fields(), fields(value=float("nan"))])  # nothing written
        with Ledger.open(tmp_path / name, fingerprint=FP, budget=1.0) as again:  # chain verified
            stored.append([(r.id, r.value, r.cost_after, r.created_at) for r in again.records()])
    assert stored[0] == stored[1] and len(stored[0]) == 6


def test_transaction_records_see_other_writers_and_own_appends(tmp_path):
    """``tx.records(since=…)`` at or past the transaction's head reads nothing, yet includes every
    record another writer committed before the lock was taken, and this transaction's appends."""
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as a, Ledger.open(path, fingerprint=FP, budget=1.0) as b:
        with b.transaction() as tx:
            assert tx.records() == () and tx.records(since=5) == ()
        with a.transaction() as tx:
            first = tx.append(**fields())
        with b.transaction() as tx:
            assert tx.records(since=0) == (first,) and tx.records(since=1) == ()
            own = tx.append(**fields(cost_after=0.25))
            assert tx.records(since=1) == (own,) and tx.records(since=2) == ()
        assert a.records() == (first, own)


def test_reopen_restores_records_exactly(tmp_path):
    path = tmp_path / "l.db"
    awkward = [0.1 + 0.2, 5e-324, 1e308, -0.0, 2.0**-60, 123456789.123456789]
    with Ledger.open(path, fingerprint=FP, budget=0.75) as led:
        for i, v in enumerate(awkward):
            with led.transaction() as tx:
                tx.append(**fields(value=v, alpha=v if v > 0 else 1e-9, sql=f"SELECT 'é✓' -- {i}",
                                   cost_after=min(0.75, 0.01 * i), secure=bool(i % 2)))  # fmt: skip
        before = led.records()
    with Ledger.open(str(path), fingerprint=FP, budget=0.75) as again:
        after = again.records()
        assert after == before
        assert [r.value for r in after] == awkward  # bit-exact floats
        assert again.budget == 0.75 and again.binding == led.binding


def test_fingerprint_and_budget_mismatch_raise(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, fingerprint=FP, budget=1.0).close()
    with pytest.raises(LedgerError) as err:
        Ledger.open(path, fingerprint="sha256:other", budget=1.0)
    # The fingerprint is a digest of the data: never echoed (issue 13, finding 1).
    assert FP not in str(err.value) and "sha256:other" not in str(err.value)
    assert "different data source" in str(err.value) and "new ledger path" in str(err.value)
    with pytest.raises(LedgerError) as err:
        Ledger.open(path, fingerprint=FP, budget=2.0)
    assert "1.0" in str(err.value) and "2.0" in str(err.value)
    Ledger.open(path, fingerprint=FP, budget=1).close()  # same value, int spelling


def test_refuses_files_that_are_not_ledgers(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(LedgerError):
        Ledger.open(junk, fingerprint=FP, budget=1.0)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE users(x)")
    with pytest.raises(LedgerError, match="not a dpgate ledger"):
        Ledger.open(other, fingerprint=FP, budget=1.0)
    with pytest.raises(LedgerError, match="directory does not exist"):
        Ledger.open(tmp_path / "missing" / "l.db", fingerprint=FP, budget=1.0)


def test_refuses_another_format_version(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, fingerprint=FP, budget=1.0).close()
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER dpgate_meta_no_update")
        c.execute("UPDATE dpgate_meta SET value='999' WHERE key='format_version'")
    with pytest.raises(LedgerError, match="format version '999'"):
        Ledger.open(path, fingerprint=FP, budget=1.0)
    assert FORMAT_VERSION == "2"


@pytest.mark.parametrize(
    "kwargs", [{"budget": 0.0}, {"budget": float("nan")}, {"budget": float("inf")}, {"budget": True},
               {"fingerprint": ""}, {"fingerprint": None}, {"timeout": 0}],
)  # fmt: skip
def test_open_validates_arguments(kwargs):
    args = {"fingerprint": FP, "budget": 1.0, **kwargs}
    with pytest.raises(InvalidRequirement):
        Ledger.open(None, **args)


def test_file_uses_wal_and_full_sync(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        conn = led.store.connection()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert led.path == str(path.resolve())


def test_open_existing_uses_the_stored_binding(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=0.5) as led:
        with led.transaction() as tx:
            rec = tx.append(**fields(cost_after=0.5))
    with Ledger.open_existing(path) as audit:
        assert (audit.binding, audit.budget, audit.records()) == (led.binding, 0.5, (rec,))
        led = audit
        assert led.meta["format_version"] == FORMAT_VERSION and led.meta["budget"] == "0.5"
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger.open_existing(tmp_path / "none.db")
    (tmp_path / "junk.db").write_bytes(b"x" * 4096)
    with pytest.raises(LedgerError, match="not a dpgate ledger"):
        Ledger.open_existing(tmp_path / "junk.db")


# ----------------------------------------------------------------------------- transactions


def test_exception_inside_transaction_rolls_back(led):
    with led.transaction() as tx:
        kept = tx.append(**fields())
    with pytest.raises(RuntimeError, match="boom"):
        with led.transaction() as tx:
            tx.append(**fields(cost_after=0.5))
            tx.append(**fields(cost_after=0.75))
            raise RuntimeError("boom")
    assert led.records() == (kept,)
    with led.transaction() as tx:  # still usable, lock released
        assert tx.records() == (kept,)
        assert tx.append(**fields(cost_after=0.25)).id > kept.id


def test_rollback_is_durable_across_reopen(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        with pytest.raises(KeyError):
            with led.transaction() as tx:
                tx.append(**fields())
                raise KeyError("x")
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        assert led.records() == ()


def test_uncommitted_appends_are_invisible_to_other_connections(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as writer, \
         Ledger.open(path, fingerprint=FP, budget=1.0) as reader:  # fmt: skip
        with writer.transaction() as tx:
            rec = tx.append(**fields())
            assert reader.records() == ()  # not blocked by the writer, sees nothing uncommitted
        assert reader.records() == (rec,)


def test_transactions_do_not_nest_and_handles_expire(led):
    with led.transaction() as tx:
        with pytest.raises(LedgerError, match="do not nest"):
            with led.transaction():
                pass
        tx.append(**fields())
    with pytest.raises(LedgerError, match="ended"):
        tx.append(**fields())
    with pytest.raises(LedgerError, match="ended"):
        tx.records()
    assert len(led.records()) == 1


def test_append_validates_fields_and_budget(led):
    bad = [{"alpha": float("nan")}, {"value": float("inf")}, {"alpha": -1.0}, {"kind": ""},
           {"table": 3}, {"secure": "yes"}, {"cost_after": -0.1}, {"value": "1"}]  # fmt: skip
    with led.transaction() as tx:
        for over in bad:
            with pytest.raises(InvalidRequirement):
                tx.append(**fields(**over))
        with pytest.raises(DPGateInternalError, match="above the ledger's budget"):
            tx.append(**fields(cost_after=1.01))
        tx.append(**fields(cost_after=1.0))  # exactly the budget is fine
    assert len(led.records()) == 1


def test_records_are_append_only_in_the_database(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        with led.transaction() as tx:
            tx.append(**fields())
    with sqlite3.connect(path) as c:
        for stmt in ("UPDATE dpgate_records SET value = 0", "DELETE FROM dpgate_records",
                     "UPDATE dpgate_meta SET value = '9' WHERE key = 'budget'", "DELETE FROM dpgate_meta"):  # fmt: skip
            with pytest.raises(sqlite3.DatabaseError, match="append-only|immutable"):
                c.execute(stmt)
    assert not hasattr(Ledger, "delete") and not hasattr(Ledger, "update")


def test_closed_ledger_refuses_use(led):
    led.close()
    led.close()  # idempotent
    assert led.closed
    with pytest.raises(LedgerError, match="closed"):
        led.records()
    with pytest.raises(LedgerError, match="closed"):
        with led.transaction():
            pass


# ----------------------------------------------------------------------------- concurrency

COST = 1 / 64  # exact in binary, so sums are exact
BUDGET = 1.0


def spend_until_exhausted(led: Ledger, pause: float = 0.0) -> list[int]:
    """Read-check-append under the lock until the budget is gone; returns appended ids."""
    mine = []
    while True:
        with led.transaction() as tx:
            spent = sum(r.alpha for r in tx.records())  # computed from what is read inside the lock
            if spent + COST > led.budget:
                return mine
            if pause:
                time.sleep(pause)  # widen the race window
            rec = tx.append(**fields(alpha=COST, cost_after=spent + COST))
        mine.append(rec.id)  # only after the commit
        if pause:
            time.sleep(pause)  # work outside the lock, as a gateway does


def check_no_overspend(records: tuple[LedgerRecord, ...], reported: list[int]) -> None:
    assert sum(r.alpha for r in records) <= BUDGET
    assert len(records) == int(BUDGET / COST)
    assert [r.cost_after for r in records] == [COST * (i + 1) for i in range(len(records))]
    assert sorted(reported) == [r.id for r in records]  # nothing lost, nothing doubled


@pytest.mark.parametrize("separate_objects", [False, True])
def test_threads_never_overspend(tmp_path, separate_objects):
    path = tmp_path / "l.db"
    shared = Ledger.open(path, fingerprint=FP, budget=BUDGET)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run():
        try:
            led = Ledger.open(path, fingerprint=FP, budget=BUDGET) if separate_objects else shared
            results.append(spend_until_exhausted(led, pause=0.0005))
            if separate_objects:
                led.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    check_no_overspend(shared.records(), [i for r in results for i in r])
    shared.close()


def test_concurrent_creation_of_a_new_ledger(tmp_path):
    path = tmp_path / "new.db"
    barrier = threading.Barrier(8)
    opened: list[Ledger] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait(10)
        try:
            opened.append(Ledger.open(path, fingerprint=FP, budget=BUDGET))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(opened) == 8
    metas = [led.meta for led in opened]
    assert all(m == metas[0] for m in metas)  # created exactly once
    for led in opened:
        led.close()


def test_threads_never_overspend_in_memory():
    led = Ledger.open(None, fingerprint=FP, budget=BUDGET)
    results: list[list[int]] = []
    threads = [threading.Thread(target=lambda: results.append(spend_until_exhausted(led, 0.0002))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check_no_overspend(led.records(), [i for r in results for i in r])


def _process_worker(path: str, queue, barrier) -> None:  # runs in a spawned process
    try:
        with Ledger.open(path, fingerprint=FP, budget=BUDGET) as led:
            barrier.wait(60)  # start together, so the processes really race
            queue.put(("ok", os.getpid(), spend_until_exhausted(led, pause=0.001)))
    except BaseException as exc:  # pragma: no cover - reported by the parent
        queue.put(("error", os.getpid(), repr(exc)))


def test_processes_never_overspend(tmp_path):
    path = str(tmp_path / "l.db")
    Ledger.open(path, fingerprint=FP, budget=BUDGET).close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    barrier = ctx.Barrier(5)
    procs = [ctx.Process(target=_process_worker, args=(path, queue, barrier)) for _ in range(5)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(kind == "ok" for kind, _, _ in results), results
    assert len({pid for _, pid, _ in results}) == len(procs)
    with Ledger.open(path, fingerprint=FP, budget=BUDGET) as led:
        records = led.records()
    check_no_overspend(records, [i for _, _, ids in results for i in ids])
    assert len({r.session for r in records}) > 1  # the work really was shared


HOLDER_CHILD = textwrap.dedent(
    """
    import sys, time
    from dpgate.ledger.core import Ledger
    led = Ledger.open(sys.argv[1], fingerprint=sys.argv[2], budget=1.0)
    with led.transaction():
        print("locked", flush=True)
        time.sleep(60)
    """
)


def test_lock_timeout_and_release_when_the_holder_dies(tmp_path):
    path = str(tmp_path / "l.db")
    Ledger.open(path, fingerprint=FP, budget=1.0).close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", HOLDER_CHILD, path, FP], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with Ledger.open(path, fingerprint=FP, budget=1.0, timeout=0.3) as led:
            t0 = time.monotonic()
            with pytest.raises(LedgerError, match="Timed out|Could not lock"):
                with led.transaction():
                    pass
            assert 0.25 < time.monotonic() - t0 < 5
            assert led.records() == ()  # readers are not blocked by the writer
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
            with led.transaction() as tx:  # the dead holder's locks are gone
                tx.append(**fields())
            assert len(led.records()) == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_threads_time_out_on_a_held_lock(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as holder, \
         Ledger.open(path, fingerprint=FP, budget=1.0, timeout=0.2) as waiter:  # fmt: skip
        with holder.transaction():
            errors: list[BaseException] = []

            def attempt() -> None:
                try:
                    with waiter.transaction():
                        pass
                except LedgerError as exc:
                    errors.append(exc)

            t = threading.Thread(target=attempt)
            t.start()
            t.join(10)
        assert len(errors) == 1 and "Timed out" in str(errors[0])


def _commit_forever(path: str, out_fd: int) -> None:
    """A forked child's life: commit records in a loop, printing each id once it is committed."""
    led = Ledger.open(path, fingerprint=FP, budget=1e9)
    os.write(out_fd, b"ready\n")
    while True:
        with led.transaction() as tx:
            rec = tx.append(kind="query", table="t", query="{}", sql="x" * 200, alpha=1.0,
                            sensitivity=1.0, scale=1.0, lattice=1 / 1024, noise="discrete_laplace",
                            value=0.0, cost_after=1.0, secure=True)  # fmt: skip
        os.write(out_fd, f"{rec.id}\n".encode())


def test_sigkill_never_loses_a_committed_record(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    path = str(tmp_path / "crash.db")
    Ledger.open(path, fingerprint=FP, budget=1e9).close()
    rng = random.Random(20240601)
    printed: set[int] = set()
    for trial in range(24):
        # A forked child (dpgate already imported) is killed as hard as a separate interpreter would be.
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                _commit_forever(path, write_fd)
            finally:
                os._exit(1)
        os.close(write_fd)
        with os.fdopen(read_fd) as out:
            assert out.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            ids = [int(line) for line in out.read().split() if line.strip()]
        printed.update(ids)
        with Ledger.open(path, fingerprint=FP, budget=1e9) as led:
            present = {r.id for r in led.records()}
            assert printed <= present, f"trial {trial}: lost {sorted(printed - present)}"
            with led.transaction() as tx:  # no stale lock is left behind
                tx.records(since=max(present, default=0))  # a child killed early may commit nothing
    assert len(printed) > 24  # the children did commit between kills
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_fork_child_opens_its_own_connection(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    path = tmp_path / "l.db"
    led = Ledger.open(path, fingerprint=FP, budget=BUDGET)
    with led.transaction() as tx:
        tx.append(**fields(alpha=COST, cost_after=COST))
    ctx = mp.get_context("fork")

    def child() -> None:
        spend_until_exhausted(led)
        os._exit(0)

    p = ctx.Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 0
    check_no_overspend(led.records(), [r.id for r in led.records()])
    led.close()


def test_module_doctests():
    import doctest

    assert doctest.testmod(ledger_module).failed == 0
