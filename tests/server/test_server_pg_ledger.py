"""``dpgate serve`` on a PostgreSQL ledger: analyst caps, provenance rows, ``SHOW dpgate.budget`` and
``SHOW dpgate.history``, and two server processes sharing one ledger without overspending a cap.

Runs against the real PostgreSQL server the session starts (``conftest.pg_server``; a missing
server fails, never skips); each test uses its own database.
"""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _dpserve import dsn, history_is_shared_and_free, spawn_server, thread_server, users_file

from dpgate.ledger._provenance import statement_hash


def _fresh_db(server: Any, name: str) -> str:
    with psycopg.connect(server.url(), autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {name}")
        con.execute(f"CREATE DATABASE {name}")
    return str(server.url(name))


def _ledger(url: str) -> tuple[float, dict[str, float], list[tuple[int, float]], set[str]]:
    """(max cost_after, ε charged per analyst, [(record id, cost_after)], delivered statement hashes)."""
    with psycopg.connect(url) as con:
        records = [(int(i), float(c)) for i, c in con.execute(
            "SELECT id, cost_after FROM dpgate_records ORDER BY id").fetchall()]
        charged = dict(con.execute("SELECT analyst, SUM(epsilon) FROM dpgate_provenance WHERE kind = 'charge' "
                                   "GROUP BY analyst").fetchall())
        charged_ids = {r for (r,) in con.execute("SELECT record_id FROM dpgate_provenance WHERE kind = 'charge'")}
        delivered = {s for (s,) in con.execute("SELECT statement FROM dpgate_provenance WHERE kind = 'delivery'")}
    assert charged_ids == {r for r, _ in records}  # every release was made for someone, and charged to them
    return max((c for _, c in records), default=0.0), charged, records, delivered


def test_caps_provenance_and_show_on_a_postgres_ledger(pg_server: Any, tmp_path: Path) -> None:
    url = _fresh_db(pg_server, "serve_caps")
    sql = "SELECT COUNT(*) FROM pums WHERE age < 40"
    with thread_server(tmp_path, budget=0.6, caps={"alice": 0.25, "bob": 0.5, "carol": 0.0}, ledger=url,
                       ledger_key=str(tmp_path / "ledger.key")) as s:
        with psycopg.connect(dsn(s.port, "carol"), autocommit=True) as carol:
            with psycopg.connect(dsn(s.port, "alice"), autocommit=True) as alice:
                history_is_shared_and_free(carol, alice, sql)
                refused = None
                for k in range(60):  # disjoint ranges: each one costs fresh budget, until alice's cap binds
                    lo = (k * 7) % 100
                    try:
                        alice.execute(f"SELECT /*+ dpgate accuracy=15 */ COUNT(*) FROM pums WHERE age BETWEEN {lo} "
                                      f"AND {lo + 6} AND educ > {k // 15}")
                    except psycopg.Error as exc:
                        refused = exc
                        break
                assert refused is not None and refused.sqlstate == "53400" and "alice" in str(refused)
                top, charged, records, delivered = _ledger(url)
                assert top < 0.6 and charged["alice"] <= 0.25 + 1e-9 and set(charged) == {"alice"}
                mine = alice.execute("SHOW dpgate.budget").fetchone()
                assert mine is not None and mine[2] == pytest.approx(charged["alice"]) and mine[5] == pytest.approx(top)
                kinds = {(h[2], h[4]) for h in alice.execute("SHOW dpgate.history").fetchall()}
                assert kinds == {("charge", "fresh"), ("delivery", "fresh")}
    assert statement_hash(sql, []) in delivered and sum(charged.values()) == pytest.approx(top)
    with psycopg.connect(url, autocommit=True) as con:  # append-only, as the records are
        for change in ("UPDATE dpgate_provenance SET epsilon = 0", "DELETE FROM dpgate_provenance",
                       "TRUNCATE dpgate_provenance"):
            with pytest.raises(psycopg.Error, match="append-only"):
                con.execute(change)


def test_two_servers_on_one_postgres_ledger_never_overspend_a_cap(pg_server: Any, tmp_path: Path) -> None:
    """``dpgate serve --ledger postgresql://…`` twice (as on two hosts): one analyst's concurrent
    sessions on both servers are charged in the releases' own transactions, never above the cap."""
    url = _fresh_db(pg_server, "serve_shared")
    caps = {"alice": 0.15, "bob": 0.2}  # the caps bind before the budget
    users_file(tmp_path, caps)
    key = ("--ledger-key", str(tmp_path / "ledger.key"))
    first = spawn_server(tmp_path, budget=0.5, ledger=url, extra=key)
    second = spawn_server(tmp_path, budget=0.5, ledger=url, extra=key)
    served: list[str] = []
    refused: list[str] = []
    errors: list[BaseException] = []

    def client(i: int) -> None:
        port = (first, second)[i % 2][1]
        who = ("alice", "bob")[(i // 2) % 2]
        rng = random.Random(i)
        try:
            with psycopg.connect(dsn(port, who), autocommit=True) as con:
                for _ in range(20):
                    lo = rng.randrange(0, 90, 5)
                    sql = f"SELECT COUNT(*) FROM pums WHERE age >= {lo} AND age < {lo + rng.choice((5, 10, 20))}"
                    try:
                        con.execute(sql).fetchone()
                        served.append(statement_hash(sql, []))
                    except psycopg.errors.ConfigurationLimitExceeded:
                        refused.append(who)  # a cap: refused, nothing spent
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors
    finally:
        for proc, _ in (first, second):
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for proc, _ in (first, second)]
    assert codes == [0, 0]
    top, charged, records, delivered = _ledger(url)
    assert len(records) > 0 and len(served) > 40 and set(refused) == {"alice", "bob"}
    assert all(charged[a] <= caps[a] + 1e-9 for a in charged)
    # Each analyst pays the per-cell maximum over their own releases: each at most the global cost,
    # together at least it (before issue 27 they paid the global increases, which summed to it).
    assert all(c <= top + 1e-9 for c in charged.values()) and sum(charged.values()) >= top - 1e-9
    assert top <= sum(caps.values()) + 1e-9  # the global cost is at most the sum of the per-analyst maxima
    assert [c for _, c in records] == sorted(c for _, c in records)  # costs only grow, in commit order
    assert set(served) <= delivered  # every answer a client received was recorded before it was sent
