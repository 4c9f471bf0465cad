"""``dpgate serve``: EXPLAIN over every client (free), and the analyst-cap check before any data is read."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg  # the test extra: a missing client fails, never skips
import pytest
from _dpserve import PASSWORDS, dsn, ledger_records, psql, thread_server

from dpgate import dbapi
from dpgate.plan.asks import ask_confidence
from dpgate.server import _session

SQL = "SELECT COUNT(*) FROM pums WHERE age < {}"
TYPES = [25, 25, 25, 701, 701, 701, 701, 25]  # output, group, source: text; epsilon … remaining: float8; note: text


class DataSpy:
    """Counts the statements that read the data (the cube's only data-touching method)."""

    def __init__(self, gw) -> None:
        self.calls, inner = 0, gw._cube._execute

        def spy(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        gw._cube._execute = spy



def _charges(tmp: Path, analyst: str) -> list[float]:
    con = sqlite3.connect(tmp / "ledger.db")
    try:
        return [e for (e,) in con.execute("SELECT epsilon FROM dpgate_provenance WHERE analyst = ? AND kind = "
                                          "'charge' ORDER BY id", (analyst,))]
    finally:
        con.close()


def test_explain_from_every_client_is_typed_and_free(tmp_path: Path) -> None:
    with thread_server(tmp_path) as s:
        spy = DataSpy(s.gateway)
        out = psql(s.port, "EXPLAIN " + SQL.format(30))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("COUNT(*)||fresh|") and out.stdout.count("\n") == 1
        with psycopg.connect(dsn(s.port), autocommit=True) as con:
            simple = psycopg.ClientCursor(con)  # the simple query protocol
            simple.execute("EXPLAIN " + SQL.format(30))
            extended = con.execute("EXPLAIN " + SQL.format("%s"), [30])  # Parse/Bind/Describe/Execute
            for cur in (simple, extended):
                assert [(d.name, d.type_code) for d in cur.description] == list(
                    zip(_session.COLUMNS, TYPES, strict=True))
            row = extended.fetchone()
            assert simple.fetchall() == [row]
            assert row[:3] == ("COUNT(*)", "", "fresh") and row[3] > 0 and row[4] == pytest.approx(25.0)
            # The confidence the half-width is stated at: a first ask's level (dpgate.plan.asks), ≥ the 0.95 asked;
            # what would be left of alice's cap.
            assert row[5] == pytest.approx(ask_confidence(0.95, 1)) and row[6] == pytest.approx(0.5 - row[3])
            # Hints and SET dpgate.* resolve as for the query itself.
            hinted = con.execute("EXPLAIN /*+ dpgate accuracy=50 */ " + SQL.format("%s"), [30]).fetchone()
            assert hinted[4] == pytest.approx(50.0) and hinted[3] == pytest.approx(row[3] / 2)
            con.execute("SET dpgate.confidence = 0.9")
            assert con.execute("EXPLAIN " + SQL.format(30)).fetchone()[5] == pytest.approx(ask_confidence(0.9, 1))
        import pg8000.native as pg8000
        c = pg8000.Connection("bob", password=PASSWORDS["bob"], host="127.0.0.1", port=s.port, database="pums")
        try:
            rows = c.run("EXPLAIN " + SQL.format(":lim"), lim=30)
            assert [col["type_oid"] for col in c.columns] == TYPES and rows[0][3] == pytest.approx(row[3])
        finally:
            c.close()
        import asyncpg

        async def run() -> None:
            a = await asyncpg.connect(user="alice", password=PASSWORDS["alice"], host="127.0.0.1", port=s.port,
                                      database="pums")
            try:
                stmt = await a.prepare("EXPLAIN " + SQL.format("$1"))  # Describe of the statement, not run
                assert [t.type.oid for t in stmt.get_attributes()] == TYPES
                got = await stmt.fetch(30)
                assert got[0]["source"] == "fresh" and got[0]["epsilon"] == pytest.approx(row[3])
                with pytest.raises(asyncpg.exceptions.FeatureNotSupportedError):
                    await a.prepare("EXPLAIN ANALYZE " + SQL.format(30))
            finally:
                await a.close()

        asyncio.run(run())
        with psycopg.connect(dsn(s.port), autocommit=True) as con:
            budget = con.execute("SHOW dpgate.budget").fetchone()
        assert budget[2] == 0.0 and budget[5] == 0.0 and s.gateway.spent == 0.0
        assert spy.calls == 0  # a quote reads no data
    assert ledger_records(tmp_path) == 0


def test_quote_is_the_charge_then_history_is_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quotes: list[str] = []
    inner = dbapi.Connection.quote

    def counted(self, statement):
        if not statement.explain:  # the cap pre-check's quotes (an EXPLAIN is a quote itself)
            quotes.append(statement.operation)
        return inner(self, statement)

    monkeypatch.setattr(dbapi.Connection, "quote", counted)
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 2.0}) as s, \
            psycopg.connect(dsn(s.port), autocommit=True) as con:
        quoted = con.execute("EXPLAIN " + SQL.format(40)).fetchone()
        con.execute(SQL.format(40)).fetchone()
        assert _charges(tmp_path, "alice") == [pytest.approx(quoted[3], rel=1e-12)]
        again = con.execute("EXPLAIN " + SQL.format(40)).fetchone()
        assert again[2] == "history" and again[3] == 0.0
        # Pre-check quotes: the fresh query, its first repeat (found free), then none for repeats.
        assert len(quotes) == 1
        for _ in range(3):
            con.execute(SQL.format(40)).fetchone()
        assert len(quotes) == 2
        con.execute("SET dpgate.confidence = 0.9")  # other settings: quoted again
        con.execute(SQL.format(40)).fetchone()
        assert len(quotes) == 3
        with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as bob:  # cap ≥ the global budget: no quote
            bob.execute(SQL.format(20)).fetchone()
        with psycopg.connect(dsn(s.port), autocommit=True) as other:  # found free by another session
            other.execute(SQL.format(40)).fetchone()
        assert len(quotes) == 3


def test_analyst_cap_refusal_reads_no_data(tmp_path: Path) -> None:
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 0.2, "carol": 0.0}) as s:
        spy = DataSpy(s.gateway)
        with psycopg.connect(dsn(s.port, "carol"), autocommit=True) as carol:
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as err:
                carol.execute(SQL.format("%s"), [30])
            msg = str(err.value)
            # Its own per-cell increase, planned at a first ask's 1 − 0.9·0.05 (dpgate.plan.asks; 0.1198 at 0.95).
            assert "This statement needs ε = 0.124 of their cap" in msg
            assert "'carol' has ε = 0 left of their cap 0" in msg
            assert "nothing was read" in msg and spy.calls == 0
        with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as bob:
            bob.execute(SQL.format(30)).fetchone()  # 0.12 of bob's 0.2
            reads = spy.calls
            assert reads > 0
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as err:
                bob.execute("SELECT /*+ dpgate accuracy=10 */ COUNT(*) FROM pums WHERE age < 50")  # > 0.08 left
            assert f"has ε = {0.2 - _charges(tmp_path, 'bob')[0]:.4g} left of their cap 0.2" in str(err.value)
            assert spy.calls == reads
        assert s.gateway.spent == pytest.approx(_charges(tmp_path, "bob")[0]) and ledger_records(tmp_path) == 1


def test_record_time_hook_stays_authoritative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale quote (another release in between) is caught when the release is recorded."""
    monkeypatch.setattr(_session.Session, "_check_cap", lambda self, sql, params, statement: None)
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 0.5, "carol": 0.0}) as s, \
            psycopg.connect(dsn(s.port, "carol"), autocommit=True) as carol:
        spy = DataSpy(s.gateway)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as err:
            carol.execute(SQL.format(30))
        assert "Answering this statement needs ε = " in (msg := str(err.value)) and "more for its next release" in msg
        assert spy.calls > 0  # without the pre-check the data was read, though nothing was released
    assert ledger_records(tmp_path) == 0


def test_information_schema_from_the_declared_schema(tmp_path: Path) -> None:
    with thread_server(tmp_path) as s, psycopg.connect(dsn(s.port), autocommit=True) as con:
        spy = DataSpy(s.gateway)
        declared = [(c.name, {"integer": "bigint", "boolean": "boolean"}.get(c.kind, "text"))
                    for c in s.gateway.schema.table("pums").columns]
        for cur in (con.cursor(), psycopg.ClientCursor(con)):  # extended and simple protocol
            cur.execute("SELECT table_schema, table_name, table_type FROM information_schema.tables "
                        "WHERE table_schema = 'public' ORDER BY table_name")
            assert cur.fetchall() == [("public", "pums", "BASE TABLE")]
            assert [d.type_code for d in cur.description] == [19, 19, 1043]
            cur.execute("SELECT c.column_name AS name, c.data_type, c.is_nullable, c.ordinal_position "
                        "FROM information_schema.columns c WHERE c.table_name = %s AND c.table_schema = 'public' "
                        "ORDER BY c.ordinal_position", ["pums"])
            rows = cur.fetchall()
            assert [r[:2] for r in rows] == declared and [r[3] for r in rows] == list(range(1, len(declared) + 1))
            assert [(d.name, d.type_code) for d in cur.description] == [("name", 19), ("data_type", 1043),
                                                                        ("is_nullable", 1043),
                                                                        ("ordinal_position", 23)]
        assert con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema NOT IN "
                           "('pg_catalog', 'information_schema') AND table_name LIKE 'pu%'").fetchall() == [("pums",)]
        assert con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'pums' "
                           "ORDER BY column_name DESC LIMIT 2").fetchall() == [(n,) for n in sorted(
                               (n for n, _ in declared), reverse=True)[:2]]
        cur = con.execute("SELECT * FROM information_schema.columns WHERE table_name = 'nope'")
        assert cur.fetchall() == [] and len(cur.description) == 18
        for refused in ("SELECT COUNT(*) FROM information_schema.columns",
                        "SELECT * FROM information_schema.views",
                        "SELECT t.table_name FROM information_schema.tables t JOIN information_schema.columns c "
                        "ON c.table_name = t.table_name",
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'a' OR true"):
            with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
                con.execute(refused)
            assert "dpgate answers information_schema.tables, .columns and .schemata" in str(err.value)
        assert spy.calls == 0


def test_explain_of_a_group_by_shows_each_groups_charge_the_total_and_the_cap(tmp_path: Path) -> None:
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 2.0}) as s:
        with psycopg.connect(dsn(s.port), autocommit=True) as con:
            rows = con.execute("EXPLAIN SELECT sex, COUNT(*) FROM pums GROUP BY sex").fetchall()
        assert [r[:3] for r in rows] == [("COUNT(*)", "sex=0", "fresh"), ("COUNT(*)", "sex=1", "fresh"),
                                         ("(statement)", "", "fresh")]
        total = rows[-1][3]
        assert rows[0][3] == pytest.approx(total) and rows[1][3] == pytest.approx(total)  # disjoint: one charge
        assert all(r[6] == pytest.approx(0.5 - total) for r in rows)  # alice's cap, not the global budget
        with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as bob:  # bob's cap exceeds the budget of 1
            assert bob.execute("EXPLAIN SELECT sex, COUNT(*) FROM pums GROUP BY sex").fetchall()[-1][6] == \
                pytest.approx(1.0 - total)
            over = bob.execute("EXPLAIN /*+ dpgate accuracy=0.01 */ SELECT COUNT(*) FROM pums").fetchone()
            assert over[6] == 0.0 and "over budget" in over[7]
    assert ledger_records(tmp_path) == 0
