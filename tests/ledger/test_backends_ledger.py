"""The ledger in PostgreSQL: binding, tamper evidence, no overspending across processes, provenance.

Runs against the real PostgreSQL server the session starts (``conftest.pg_server``);
each test uses its own database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _gateway_worker import independent_spent

import dpgate
from dpgate.errors import LedgerError
from dpgate.ledger.core import Ledger

TESTS = Path(__file__).resolve().parents[1]  # tests/: the worker modules live there


def fresh_db(server: Any, name: str) -> str:
    with psycopg.connect(server.url(), autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {name}")
        con.execute(f"CREATE DATABASE {name}")
    return str(server.url(name))


def spend(led: Ledger, alpha: float) -> None:
    with led.transaction() as tx:
        spent = max((r.cost_after for r in tx.records()), default=0.0)
        tx.append(kind="query", table="t", query="{}", sql="SELECT 1", alpha=alpha, sensitivity=1.0,
                  scale=1 / alpha, lattice=0.0078125, noise="discrete_laplace", value=3.5,
                  cost_after=spent + alpha, secure=True)


def test_postgres_ledger_binding_and_reopen(pg_server: Any, tmp_path: Path) -> None:
    url = fresh_db(pg_server, "ledger_basic")
    key = tmp_path / "ledger.key"
    with pytest.raises(LedgerError, match="needs ledger_key"):
        Ledger.open(url, fingerprint="fp", budget=1.0)
    with Ledger.open(url, fingerprint="fp", budget=1.0, key=str(key)) as led:
        assert key.exists() and Path(str(key) + ".anchor").exists()
        assert oct(key.stat().st_mode & 0o777) == "0o600"
        spend(led, 0.25)
        spend(led, 0.25)
        assert "fp" not in repr(led.meta) and led.path == url
    # SQLAlchemy spelling of the same URL; records survive; mismatches are refused.
    with Ledger.open(url.replace("postgresql://", "postgresql+psycopg://"), fingerprint="fp", budget=1.0,
                     key=str(key)) as led:
        assert [r.cost_after for r in led.records()] == [0.25, 0.5]
    with pytest.raises(LedgerError, match="different data source"):
        Ledger.open(url, fingerprint="other", budget=1.0, key=str(key))
    with pytest.raises(LedgerError, match="created with budget"):
        Ledger.open(url, fingerprint="fp", budget=2.0, key=str(key))
    with pytest.raises(LedgerError, match="is missing"):
        Ledger.open(url, fingerprint="fp", budget=1.0, key=str(tmp_path / "other.key"))
    with pytest.raises(LedgerError, match="Cannot connect"):
        Ledger.open(f"postgresql://dpgate@127.0.0.1:{pg_server.port}/nope", fingerprint="fp", budget=1.0,
                    key=str(key))
    # The database refuses edits of the records (triggers), even to its superuser.
    with psycopg.connect(url, autocommit=True) as con:
        for sql in ("UPDATE dpgate_records SET value = 0", "DELETE FROM dpgate_records", "TRUNCATE dpgate_meta"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                con.execute(sql)


def test_postgres_ledger_tamper_evidence(pg_server: Any, tmp_path: Path) -> None:
    url = fresh_db(pg_server, "ledger_tamper")
    key = str(tmp_path / "ledger.key")
    with Ledger.open(url, fingerprint="fp", budget=1.0, key=key) as led:
        for _ in range(3):
            spend(led, 0.1)
    with psycopg.connect(url, autocommit=True) as con:  # an administrator bypasses the triggers
        con.execute("ALTER TABLE dpgate_records DISABLE TRIGGER USER")
        con.execute("UPDATE dpgate_records SET alpha = 0.01 WHERE id = 2")
    with pytest.raises(LedgerError, match="integrity check at record 2"):
        Ledger.open(url, fingerprint="fp", budget=1.0, key=key)
    with psycopg.connect(url, autocommit=True) as con:  # restore it, then roll the ledger back
        con.execute("UPDATE dpgate_records SET alpha = 0.1 WHERE id = 2")
        Ledger.open(url, fingerprint="fp", budget=1.0, key=key).close()
        con.execute("DELETE FROM dpgate_records WHERE id = 3")
    with pytest.raises(LedgerError, match="behind its anchor"):
        Ledger.open(url, fingerprint="fp", budget=1.0, key=key)
    with psycopg.connect(url, autocommit=True) as con:  # a whole ledger dropped: refused without new=True
        con.execute("DROP TABLE dpgate_records, dpgate_meta")
    with pytest.raises(LedgerError, match="missing or empty"):
        Ledger.open(url, fingerprint="fp", budget=1.0, key=key)
    Ledger.open(url, fingerprint="fp", budget=1.0, key=key, new=True).close()


def test_two_gateway_processes_with_8_workers_never_overspend(pg_server: Any, net: Any, tmp_path: Path) -> None:
    """Two processes × 8 threads, each thread its own Gateway, all on one PostgreSQL ledger."""
    df, schema = net
    url = fresh_db(pg_server, "ledger_shared")
    key = str(tmp_path / "shared.key")
    budget = 1.0
    dpgate.Gateway(df, schema, budget=budget, ledger=url, ledger_key=key).close()  # create it
    start = time.time() + 8.0  # every gateway is open before the first query
    ready = tmp_path / "ready"  # ... also on a loaded machine: they wait for each other there
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    procs = [
        subprocess.Popen([sys.executable, str(TESTS / "_pg_ledger_worker.py"), json.dumps(
            dict(url=url, key=key, budget=budget, out=str(tmp_path / f"p{p}"), seed=1000 * p, threads=8, n=25,
                 start_at=start, ready_dir=str(ready), parties=16))], env=env, stderr=subprocess.PIPE, text=True)
        for p in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    events = [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(tmp_path.glob("p*.jsonl"))]
    assert len(events) == 16 and all(e[-1]["event"] == "done" for e in events)
    with dpgate.Gateway(df, schema, budget=budget, ledger=url, ledger_key=key) as gw:
        hist = gw.history
        spent = gw.spent
        records = gw.ledger.records()
    # Checked from the ledger alone: the per-cell cost of every release never exceeds the budget ...
    assert independent_spent(hist, schema) == pytest.approx(spent, rel=1e-9)
    assert spent <= budget * (1 + 1e-9)
    assert all(r.cost_after <= budget * (1 + 1e-9) for r in records)
    assert [r.id for r in records] == list(range(1, len(records) + 1))
    # ... while the budget was contended (refusals) by workers of both processes. Which process releases
    # first is a race (one may spend it all in a few releases); each process's workers must have queried the
    # shared ledger, and no record may be claimed by both.
    answers = [e for ev in events for e in ev if e["event"] == "answer"]
    assert any(e["event"] == "refused" for ev in events for e in ev)
    assert spent > 0.5 * budget
    for p in range(2):
        assert any(e["event"] in ("answer", "refused") for ev in events[8 * p: 8 * p + 8] for e in ev)
    by_process = [{r for ev in events[8 * p: 8 * p + 8] for e in ev if e["event"] == "answer"
                   for r, _, _ in e["records"]} for p in range(2)]
    assert not by_process[0] & by_process[1]
    assert by_process[0] | by_process[1] == {r.id for r in records}
    assert sum(e["eps"] for e in answers) == pytest.approx(spent, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_provenance_charges_commit_or_roll_back_with_the_release(store: str, request: Any, tmp_path: Path) -> None:
    """The store interface behind dpgate serve's provenance, the same on both stores: a charge over
    the cap rolls its release back; charges, deliveries and an analyst's history read back."""
    from dpgate.errors import BudgetExhausted
    from dpgate.ledger import _provenance

    where = str(tmp_path / "l.db") if store == "sqlite" else fresh_db(request.getfixturevalue("pg_server"),
                                                                      "ledger_provenance")
    key = None if store == "sqlite" else str(tmp_path / "k")  # SQLite: <path>.key, made with the ledger
    with Ledger.open(where, fingerprint="fp", budget=1.0, key=key) as led:
        _provenance.ensure_table(led)
        _provenance.ensure_table(led)  # idempotent
        with _provenance.charging(led, "alice", 0.3, "s1"):
            spend(led, 0.25)
            with pytest.raises(BudgetExhausted, match="alice"):
                spend(led, 0.25)
        assert [r.cost_after for r in led.records()] == [0.25]
        assert _provenance.analyst_spent(led, "alice") == pytest.approx(0.25)
        assert _provenance.analyst_spent(led, "bob") == 0.0
        _provenance.record_delivery(led, "alice", "s1", "fresh", 0.25)
        assert [(h[2], h[3], h[4], h[6]) for h in _provenance.analyst_history(led, "alice")] == [
            ("charge", "s1", "fresh", 1), ("delivery", "s1", "fresh", None)]
        assert _provenance.analyst_history(led, "bob") == []
