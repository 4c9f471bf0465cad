"""A JDBC client against ``dpgate serve``: Debian's PostgreSQL JDBC driver (``libpostgresql-jdbc-java``) and
Java 17 run ``tests/server/jdbc/DpgateClient.java`` — a plain COUNT, a GROUP BY, a PreparedStatement with a bound
int, ``DatabaseMetaData.getTables``/``getColumns``/keys/indexes and ``SHOW search_path`` (what DBeaver and
Metabase call on connect) and an EXPLAIN — and its answers are compared with the same statements over psycopg
and with the ledger.  A missing java or driver fails, never skips (``.ci/run`` installs both)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from _dpserve import PASSWORDS, dsn, ledger_records, thread_server

from dpgate.datasets import load_pums
from dpgate.server._pg_catalog import column_comment

JAR = Path("/usr/share/java/postgresql.jar")
CLIENT = Path(__file__).parent / "jdbc" / "DpgateClient.java"
JDBC_TYPES = {"integer": ("int8", -5), "categorical": ("text", 12), "binned": ("text", 12), "boolean": ("bool", -7)}


def _run_client(port: int) -> dict[str, list[list[str]]]:
    """The client's output lines, by kind (the first tab-separated field)."""
    java = shutil.which("java")
    assert java is not None, "java is missing: apt-get install openjdk-17-jdk-headless (.ci/run does)"
    assert JAR.is_file(), f"{JAR} is missing: apt-get install libpostgresql-jdbc-java (.ci/run does)"
    # a single-file source program: java compiles it in memory, no javac step or class files
    out = subprocess.run([java, "-cp", str(JAR), str(CLIENT), str(port), "alice", PASSWORDS["alice"]],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    lines: dict[str, list[list[str]]] = {}
    for line in out.stdout.splitlines():
        kind, *fields = line.split("\t")
        lines.setdefault(kind, []).append(fields)
    assert "ERROR" not in lines, lines["ERROR"]
    assert lines.get("DONE") == [[]], out.stdout
    return lines


def test_a_jdbc_client_queries_describes_and_explains_like_psycopg(tmp_path: Path) -> None:
    with thread_server(tmp_path, budget=5.0, caps={"alice": 2.0, "bob": 0.5}) as server:
        got = _run_client(server.port)
        assert got["CONNECTED"] == [["PostgreSQL"]]
        released = ledger_records(tmp_path)
        assert released == 4  # the COUNT, the GROUP BY's two groups, the prepared COUNT; EXPLAIN spends nothing
        with psycopg.connect(dsn(server.port), autocommit=True) as con:
            # The same statements over psycopg come from history: the very values JDBC was given, nothing spent.
            count = con.execute("SELECT COUNT(*) FROM pums").fetchall()
            assert [[float(v) for v in row] for row in got["COUNT"]] == [[count[0][0]]]
            groups = con.execute("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").fetchall()
            assert [(sex, float(n)) for sex, n in got["GROUP"]] == groups
            prepared = con.execute("SELECT COUNT(*) FROM pums WHERE age < %s", [30]).fetchone()
            assert prepared is not None and float(got["PREPARED"][0][0]) == pytest.approx(prepared[0])
            # pgjdbc's named server-side statement (from the 5th execution on) answers the same, from history
            assert got["PREPARED_AGAIN"] == got["PREPARED"] * 5
            assert 150 < prepared[0] < 300
            explain = con.execute("EXPLAIN SELECT COUNT(*) FROM pums WHERE married")
            names = [d.name for d in explain.description or []]
            expected = explain.fetchall()
        assert ledger_records(tmp_path) == released
    assert got["EXPLAIN_COLUMNS"] == [names]
    assert len(got["EXPLAIN"]) == len(expected) == 1
    jdbc, mine = got["EXPLAIN"][0], expected[0]
    assert jdbc[:3] == ["COUNT(*)", "", "fresh"] and mine[:3] == ("COUNT(*)", "", "fresh")
    for text, value in zip(jdbc[3:7], mine[3:7], strict=True):  # epsilon, halfwidth, confidence, remaining
        assert float(text) == pytest.approx(value)
    _, schema = load_pums()
    table = schema.tables[0]
    assert got["TABLE"] == [["public", table.name, "TABLE"]]
    # the declared domain is each column's REMARKS (the description BI tools show beside a column)
    assert got["COLUMN"] == [[c.name, JDBC_TYPES[c.kind][0], str(JDBC_TYPES[c.kind][1]), str(n), column_comment(c)]
                             for n, c in enumerate(table.columns, 1)]
    assert got["SCHEMA"] == [["public"]]
    assert got["KEYS"] == [["0"]]  # getPrimaryKeys, getImportedKeys, getExportedKeys, getIndexInfo: empty, no error
    assert got["SEARCH_PATH"] == [['"$user", public']]
    assert len(got["TYPEINFO"]) == 1  # getTypeInfo answers (its generate_series beside pg_type), without an error


def _catalog(sql: str) -> tuple[list[str], list[tuple[object, ...]]]:
    from dpgate.server import _pg_catalog

    _, schema = load_pums()
    found = _pg_catalog.answer(sql, [], schema, user="alice", database="pums")
    assert found is not None
    fields, rows = found
    return [f.name for f in fields], list(rows)


def test_the_virtual_catalog_evaluates_derived_tables_row_number_and_nullif() -> None:
    """What pgjdbc's getColumns needs: ``SELECT * FROM (… row_number() OVER …) c``, NULLIF, pg_type joined."""
    names, rows = _catalog(
        "SELECT * FROM (SELECT c.relname, a.attname, t.typname, nullif(a.attidentity, '') AS ident, "
        "row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum DESC) AS n "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
        "JOIN pg_catalog.pg_type t ON a.atttypid = t.oid WHERE a.attnum > 4) d WHERE d.n < 3 ORDER BY n")
    assert names == ["relname", "attname", "typname", "ident", "n"]
    assert rows == [("pums", "married", "bool", None, 1), ("pums", "income", "int8", None, 2)]
    # pg_type is empty to a statement that does not read pg_attribute: its filters are beyond the interpreter
    # (psycopg's lookup of hstore by to_regtype, psql's \dT), and unknown filters keep rows
    assert _catalog("SELECT oid FROM pg_catalog.pg_type t WHERE t.oid = to_regtype('hstore')")[1] == []
    # a function in FROM is empty only beside catalogue relations: alone, or beside a declared table, not catalogue
    from dpgate.server import _pg_catalog

    _, schema = load_pums()
    for sql in ("SELECT * FROM generate_series(1, 3)", "SELECT COUNT(*) FROM pums, generate_series(1, 3) s"):
        assert _pg_catalog.answer(sql, [], schema, user="alice", database="pums") is None


def test_hostile_derived_tables_are_bounded() -> None:
    import time

    from dpgate import errors

    seven = ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(7))  # 6**7 rows in a derived table
    started = time.monotonic()
    with pytest.raises(errors.QueryTooComplex):
        _catalog(f"SELECT 1 FROM (SELECT a0.attname FROM {seven}) x")
    deep = "SELECT * FROM pg_catalog.pg_class"
    for i in range(200):
        deep = f"SELECT * FROM ({deep}) d{i}"
    with pytest.raises(errors.QueryTooComplex):
        _catalog(deep)
    assert time.monotonic() - started < 5.0


def test_hostile_derived_tables_over_the_wire_are_refused_in_time(tmp_path: Path) -> None:
    import time

    seven = ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(7))
    with thread_server(tmp_path) as server, psycopg.connect(dsn(server.port), autocommit=True) as con:
        started = time.monotonic()
        for sql in (f"SELECT * FROM (SELECT a0.attname FROM {seven}) x",
                    f"SELECT n FROM (SELECT row_number() OVER (ORDER BY a0.attname) AS n FROM {seven}) x"):
            with pytest.raises(psycopg.Error) as err:
                con.execute(sql)
            assert err.value.sqlstate == "54000" and "joins more than" in str(err.value)
        assert time.monotonic() - started < 10.0
        assert con.execute("SELECT 1").fetchone() == (1,)  # the session goes on
        assert ledger_records(tmp_path) == 0
