"""psql's describe family, ``SHOW ALL`` and syntax errors against ``dpgate serve``, with the real psql binary,
and the virtual ``pg_catalog`` under hostile statements (bounded in rows, time and notation)."""

from __future__ import annotations

import re
import time

import psycopg
import pytest
from _dpserve import dsn, ledger_records, psql, thread_server

import dpgate
from dpgate import errors
from dpgate.compile.bounds import deadline
from dpgate.server import _catalog, _pg_catalog

LIMIT_S = 5.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("describe")
    with thread_server(tmp) as s:
        yield s, tmp


def _ok(port: int, *commands: str) -> list[str]:
    out = psql(port, *commands)
    # psql 15 crashed (rc 139) on an answer with fewer columns than its \d+ query asked for
    assert out.returncode == 0 and "ERROR" not in out.stderr, (commands, out.returncode, out.stderr)
    return out.stdout.splitlines()


def test_psql_d_plus_answers_psqls_eleven_columns_with_the_declared_domains(served) -> None:
    server, _ = served
    lines = _ok(server.port, r"\d+ pums")
    assert "age|bigint||||plain|||dpgate domain: integer 0..100" in lines
    assert "sex|text||||extended|||dpgate domain: one of '0', '1'" in lines
    assert "married|boolean||||plain|||dpgate domain: true or false" in lines
    assert "age|bigint|||" in _ok(server.port, r"\d pums")  # the 7-column \d query keeps its shape


def test_psql_lists_answer_with_rows_or_empty_never_an_error(served) -> None:
    server, tmp = served
    tables = _ok(server.port, r"\dt+")
    assert len(tables) == 1 and tables[0].startswith("public|pums|table|dpgate|permanent|heap|")
    assert "privacy unit: one person, up to 1 row" in tables[0]
    assert tables[0].endswith("budget ε 0 of 1 spent; alice: 0 of their cap 0.5 (SHOW dpgate.budget)")
    assert _ok(server.port, r"\l") == ["pums|dpgate|UTF8|C|C||libc|"]
    assert _ok(server.port, r"\dn") == ["public|dpgate"]
    assert _ok(server.port, r"\du")[0].startswith("alice|")
    for empty in (r"\dv", r"\df", r"\di", r"\ds", r"\dm", r"\dT", r"\dD", r"\db", r"\dx", r"\dRs", r"\dconfig"):
        assert _ok(server.port, empty) == [], empty
    assert _ok(server.port, r"\dt pu*") == ["public|pums|table|dpgate"]
    out = psql(server.port, r"\d nope")
    assert out.returncode == 1 and 'Did not find any relation named "nope"' in out.stderr
    assert ledger_records(tmp) == 0  # describing reads nothing and releases nothing


def test_show_all_and_a_syntax_error(served) -> None:
    server, _ = served
    lines = _ok(server.port, "SET dpgate.accuracy = 30", "SHOW ALL")
    assert lines[0] == "SET"
    rows = dict(line.split("|")[:2] for line in lines[1:])
    assert rows["dpgate.accuracy"] == "30.0" and rows["dpgate.intervals"] == "off"
    assert rows["server_version"] == "15.0" and rows["transaction_isolation"] == "read committed"
    out = psql(server.port, "SELEC 1")
    assert out.returncode != 0 and "ERROR:  42601: syntax error at or near 'SELEC'" in out.stderr
    assert "did you mean SELECT?" in out.stderr
    out = psql(server.port, "SET dpgate.confidence = 0.3")  # refused at SET, not when a query runs
    assert "ERROR:  22023: SET dpgate.confidence must lie in [0.5, 1), got 0.3" in out.stderr
    out = psql(server.port, "INSERT INTO pums VALUES (1)")  # a statement, refused: still 0A000
    assert "ERROR:  0A000:" in out.stderr


def test_hostile_catalogue_statements_are_refused_quickly_and_spend_nothing(served) -> None:
    server, tmp = served
    hostile = {
        "SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relname ~ '^(" + "(p*)*" * 30 + "x)$'": "0A000",
        "SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relname ~ '(a|aa)+$'": "0A000",
        "SELECT 1 FROM " + ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(9)): "54000",
        "SELECT 1 FROM pg_catalog.pg_class WHERE " + " AND ".join(["relname <> 'x'"] * 400): "54000",
        "SELECT 1 FROM pg_catalog.pg_class WHERE relname IN " + "(" * 200 + "'a'" + ")" * 200: "54000",
    }
    with psycopg.connect(dsn(server.port), autocommit=True) as con:
        for sql, code in hostile.items():
            start = time.perf_counter()
            with pytest.raises(psycopg.Error) as err:
                con.execute(sql)
            assert err.value.sqlstate == code and time.perf_counter() - start < LIMIT_S, (sql[:60], str(err.value))
        like = con.execute("SELECT relname FROM pg_catalog.pg_class WHERE relname LIKE %s",
                           ["%a" * 5000 + "%b"]).fetchall()
        assert like == []
        assert con.execute("SELECT relname FROM pg_catalog.pg_class WHERE relname LIKE 'p%s'").fetchall() == [("pums",)]
    assert ledger_records(tmp) == 0


def test_a_join_of_virtual_relations_obeys_the_statement_deadline() -> None:
    _, schema = dpgate.datasets.load_pums()
    sql = "SELECT 1 FROM " + ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(6))  # 6**6 rows: in bounds
    start = time.perf_counter()
    with deadline(1e-6), pytest.raises(errors.QueryTooComplex, match="deadline"):
        _catalog.answer(sql, (), schema, user="u", database="d")
    assert time.perf_counter() - start < LIMIT_S
    assert _pg_catalog.MAX_ROWS < 6 ** 7
    listed = ("SELECT 1 FROM " + ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(5))
              + " WHERE a0.attname IN (" + ", ".join(f"'{i}'" for i in range(9000)) + ")")  # 7776 rows × 9000
    start = time.perf_counter()
    with deadline(0.5), pytest.raises(errors.QueryTooComplex, match="deadline"):
        _catalog.answer(listed, (), schema, user="u", database="d")
    assert time.perf_counter() - start < LIMIT_S


def _catalog_rows(schema: object, sql: str, *params: object) -> list[tuple[object, ...]]:
    """The virtual catalogue's rows for ``sql`` (which must be a catalogue statement)."""
    found = _catalog.answer(sql, params, schema, user="u", database="d")
    assert found is not None
    return list(found.rows)


def test_the_virtual_catalogue_evaluates_what_clients_send() -> None:
    _, schema = dpgate.datasets.load_pums()

    def ask(sql: str, *params: object) -> list[tuple[object, ...]]:
        return _catalog_rows(schema, sql, *params)

    base = ("SELECT pg_catalog.pg_class.relname FROM pg_catalog.pg_class JOIN pg_catalog.pg_namespace ON "
            "pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace WHERE pg_catalog.pg_class.relkind = ANY "
            "(ARRAY[$1::VARCHAR, $2::VARCHAR]) AND pg_catalog.pg_namespace.nspname = $3::VARCHAR")
    assert ask(base, "r", "p", "public") == [("pums",)]  # SQLAlchemy's get_table_names
    assert ask(base, "v", "m", "public") == []  # its get_view_names
    assert ask(base, "r", "p", "other") == []
    cols = ask("SELECT a.attname, a.attnum, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM "
               "pg_catalog.pg_attribute a WHERE a.attrelid = '16384' AND a.attnum > 0 ORDER BY a.attnum DESC LIMIT 2")
    assert cols == [("married", 6, "boolean"), ("income", 5, "bigint")]
    assert _pg_catalog.column_comment(schema.table("pums").column("race")).startswith("dpgate domain: one of '1'")
    assert ask("SELECT * FROM pg_catalog.pg_namespace") == [(2200, "public", 10, None)]


def test_serve_names_an_embedded_data_set(tmp_path) -> None:
    import os
    import re
    import subprocess
    import sys

    from _dpserve import ROOT, users_file

    users_file(tmp_path, {"alice": 0.5})
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--data", "pums", "--ledger", str(tmp_path / "ledger.db"),
         "--budget", "1", "--users", str(tmp_path / "users.yaml"), "--port", "0", "--accuracy", "25"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stderr is not None
        port = next(int(m.group(1)) for line in proc.stderr if (m := re.search(r"listening on [\d.]+:(\d+)", line)))
        lines = _ok(port, "SELECT COUNT(*) FROM pums WHERE age < 30", r"\d+ pums")
        assert 150 < float(lines[0]) < 300 and "age|bigint||||plain|||dpgate domain: integer 0..100" in lines
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def alice_fields(port: int) -> list[psycopg.Column]:
    with psycopg.connect(dsn(port), autocommit=True) as con:
        return list(con.execute("SHOW dpgate.history").description or [])


def test_psql_shows_what_each_counting_statement_charged(tmp_path) -> None:
    with thread_server(tmp_path) as server:
        sql = "SELECT COUNT(*) FROM pums WHERE age < 33"
        out = psql(server.port, sql, sql, r"\dt")
        assert out.returncode == 0, out.stderr
        notices = [line for line in out.stderr.splitlines() if line.startswith("NOTICE:")]
        assert len(notices) == 2, out.stderr  # the counting statements, not the catalogue
        fresh, again = notices
        m = re.search(r"dpgate: source fresh; ε charged to alice: ([0-9.]+); left: ([0-9.]+) of alice's cap 0\.5, "
                      r"([0-9.]+) of the global budget 1\.", fresh)
        assert m is not None, fresh
        charged, cap_left, left = map(float, m.groups())
        assert 0.1 < charged < 0.2 and cap_left == pytest.approx(0.5 - charged, abs=1e-4)
        assert left == pytest.approx(1 - charged, abs=1e-4)
        assert "source history; ε charged to alice: 0;" in again
        with psycopg.connect(dsn(server.port, "bob"), autocommit=True) as bob:
            got: list[str] = []
            bob.add_notice_handler(lambda d: got.append(d.message_primary or ""))
            bob.execute("SELECT COUNT(*) FROM pums WHERE age < %s", [33]).fetchone()  # the extended protocol
            history = bob.execute("SHOW dpgate.history").fetchall()  # bob's delivery: the text his session sent
        assert got and got[0].startswith("dpgate: source history; ε charged to bob: 0;")
        assert [(h[2], h[7]) for h in history] == [("delivery", "SELECT COUNT(*) FROM pums WHERE age < $1")]
        with psycopg.connect(dsn(server.port), autocommit=True) as alice:  # a new session: from the ledger
            history = alice.execute("SHOW dpgate.history").fetchall()
        assert [d.name for d in alice_fields(server.port)][-1] == "sql"
        assert {h[2] for h in history} == {"charge", "delivery"} and {h[7] for h in history} == {sql}


def test_a_prepared_catalogue_query_is_typed_alike_at_describe_and_run(served) -> None:
    import asyncio

    import asyncpg
    from _dpserve import PASSWORDS

    server, _ = served

    async def run() -> None:
        con = await asyncpg.connect(user="alice", password=PASSWORDS["alice"], host="127.0.0.1", port=server.port,
                                    database="pums")
        try:  # asyncpg describes the statement first, then reads the rows in binary by those types
            stmt = await con.prepare("SELECT c.oid, c.relname, c.relhasindex, c.relnatts FROM pg_catalog.pg_class c "
                                     "WHERE c.relname = $1")
            assert [a.type.name for a in stmt.get_attributes()] == ["oid", "text", "bool", "int8"]
            assert [tuple(r) for r in await stmt.fetch("pums")] == [(16384, "pums", False, 6)]
            assert await stmt.fetch("nope") == []
        finally:
            await con.close()

    asyncio.run(run())


def test_a_limit_zero_probe_answers_no_rows_and_the_declared_types_reading_nothing(served) -> None:
    server, tmp = served
    with psycopg.connect(dsn(server.port), autocommit=True) as con:
        for sql, names, oids in (
            ('SELECT TRUE AS "_" FROM "public"."pums" WHERE 1 <> 1 LIMIT 0', ["_"], [16]),  # Metabase
            ("SELECT * FROM pums LIMIT 0", ["age", "sex", "educ", "race", "income", "married"],
             [20, 25, 20, 25, 20, 16]),
            ("select age, 'x' as label, 2 from pums where income > 10 limit 0", ["age", "label", "?column?"],
             [20, 25, 23]),
        ):
            cur = con.execute(sql)
            assert cur.fetchall() == [] and [d.name for d in cur.description] == names, sql
            assert [d.type_code for d in cur.description] == oids, sql
        for refused in ("SELECT age FROM pums LIMIT 1", "SELECT nope FROM pums LIMIT 0",
                        "SELECT age FROM nope LIMIT 0", "SELECT age + 1 FROM pums LIMIT 0",
                        "SELECT age FROM pums a JOIN pums b ON a.age = b.age LIMIT 0",
                        "SELECT age FROM pums WHERE " + " AND ".join(["age > 1"] * 3000) + " LIMIT 0"):
            with pytest.raises(psycopg.Error):
                con.execute(refused)
    assert ledger_records(tmp) == 0


def test_declared_references_are_foreign_keys_in_the_virtual_catalogue() -> None:
    _, schema = dpgate.datasets.load_flights()
    oid = {t.name: _pg_catalog.FIRST_OID + i for i, t in enumerate(schema.tables)}

    def ask(sql: str, *params: object) -> list[tuple[object, ...]]:
        return _catalog_rows(schema, sql, *params)

    outgoing = ("SELECT true as sametable, conname, pg_catalog.pg_get_constraintdef(r.oid, true) as condef, "
                "conrelid::pg_catalog.regclass AS ontable FROM pg_catalog.pg_constraint r "
                f"WHERE r.conrelid = '{oid['flights']}' AND r.contype = 'f' AND conparentid = 0 ORDER BY conname")
    assert ask(outgoing)[-1] == (True, "flights_tailnum_fkey", "FOREIGN KEY (tailnum) REFERENCES planes(tailnum)",
                                 "flights")
    incoming = ("SELECT conname, conrelid::pg_catalog.regclass AS ontable, pg_catalog.pg_get_constraintdef(oid, true) "
                "AS condef FROM pg_catalog.pg_constraint c WHERE confrelid IN (SELECT "
                "pg_catalog.pg_partition_ancestors('{0}') UNION ALL VALUES ('{0}'::pg_catalog.regclass)) "
                "AND contype = 'f' AND conparentid = 0 ORDER BY conname;")  # psql 15's "Referenced by"
    assert ask(incoming.format(oid["planes"])) == [
        ("flights_tailnum_fkey", "flights", "FOREIGN KEY (tailnum) REFERENCES planes(tailnum)")]
    assert ask(incoming.format(oid["flights"])) == []
    chain = ("SELECT conname FROM pg_catalog.pg_constraint WHERE confrelid IN ("
             + " UNION ALL ".join([f"SELECT {oid['planes']}"] * 3000) + ")")  # as deep as long: no recursion
    start = time.perf_counter()
    assert ask(chain) == [("flights_tailnum_fkey",)] and time.perf_counter() - start < LIMIT_S
    assert ask("SELECT relname FROM pg_catalog.pg_class WHERE relhastriggers") == [  # psql reads keys of these
        ("flights",), ("planes",), ("airlines",), ("airports",)]
    # an aliased relation is known by its alias only: the second pg_class does not hide the first
    twice = ("SELECT pg_catalog.pg_class.relname, cls_ref.relname FROM pg_catalog.pg_class JOIN "
             "pg_catalog.pg_constraint ON pg_catalog.pg_class.oid = pg_catalog.pg_constraint.conrelid AND "
             "pg_catalog.pg_constraint.contype = 'f' JOIN pg_catalog.pg_class AS cls_ref ON "
             "cls_ref.oid = pg_catalog.pg_constraint.confrelid ORDER BY 2")
    assert ask(twice) == [("flights", "airlines"), ("flights", "airports"), ("flights", "planes")]
    _, pums = dpgate.datasets.load_pums()
    assert _catalog.answer("SELECT conname FROM pg_catalog.pg_constraint WHERE contype = 'f'", (), pums,
                           user="u", database="d").rows == ()


def test_a_long_union_chain_of_catalogue_selects_is_walked_not_recursed() -> None:
    _, schema = dpgate.datasets.load_pums()
    for op, rows in ((" UNION ALL ", 2000), (" UNION ", 1)):
        sql = op.join(["SELECT relname FROM pg_catalog.pg_class"] * 2000)  # 99 989 characters: within the limit
        start = time.perf_counter()
        found = _catalog.answer(sql, (), schema, user="u", database="d")
        assert found is not None and len(found.rows) == rows and time.perf_counter() - start < LIMIT_S
