"""Data backends: the same answers on DuckDB, PostgreSQL and Spark; only generated, read-only SQL.

Real engines only: a PostgreSQL 15 server started by the session (``tests/_pgserver.py``)
and Spark in ``local[2]`` mode (``conftest.py``).  A missing engine fails these tests.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pytest
from sqlglot import exp, parse_one

import dpgate
from dpgate.backends import PostgresBackend, SparkBackend, open_backend
from dpgate.datasets import load_pums
from dpgate.errors import DPGateInternalError, OperationalError
from dpgate.release.cube import Cube

DB = "dpgate_test"
SPARK_TYPES = "age int, sex string, educ smallint, race int, income int, married boolean, pid int"
PG_TYPES = "age integer, sex text, educ smallint, race integer, income integer, married boolean, pid integer"

# Range, IN, 2-D, negation, FILTER and GROUP BY queries; the repeat at the end is answered from history.
CORPUS = [
    "SELECT COUNT(*) FROM pums WHERE age < 30",
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 49 AND income >= 50000",
    "SELECT COUNT(*) FROM pums WHERE race IN ('1', '3')",
    "SELECT COUNT(*) FROM pums WHERE NOT (sex = '1') AND income < 10000",
    "SELECT COUNT(*) FROM pums WHERE age < 40 AND educ > 12",
    "SELECT COUNT(*) FILTER (WHERE married), COUNT(*) FROM pums WHERE age >= 65",
    "SELECT SUM(CASE WHEN educ >= 13 THEN 2 ELSE 1 END) FROM pums WHERE income IS NULL OR income < 25000",
    "SELECT sex, COUNT(*) FROM pums GROUP BY sex",
    "SELECT race, married, COUNT(*) FROM pums WHERE age >= 18 GROUP BY race, married",
    "SELECT educ, COUNT(*) FROM pums GROUP BY educ",
    "SELECT educ, married, COUNT(*) FROM pums WHERE sex = '0' AND age BETWEEN 20 AND 29 GROUP BY educ, married",
    "SELECT COUNT(*) FROM pums WHERE age < 30",
]


def typed_pums() -> tuple[pd.DataFrame, dpgate.Schema]:
    """PUMS with missing values, typed as in the engines: text ``sex``, boolean ``married``."""
    df, schema = load_pums(null=True)
    df["sex"] = df["sex"].astype("string").astype(object).where(df["sex"].notna(), None)
    df["married"] = df["married"].astype("boolean")
    return df, schema


@pytest.fixture(scope="module")
def pums_typed() -> tuple[pd.DataFrame, dpgate.Schema]:
    return typed_pums()


@pytest.fixture(scope="module")
def pg_url(pg_server: Any, pums_typed: Any) -> str:
    """The typed PUMS loaded with COPY into database ``dpgate_test`` (table ``pums``)."""
    df, _ = pums_typed
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {DB}")
        con.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(pg_server.url(DB)) as con:
        con.execute(f"CREATE TABLE pums ({PG_TYPES})")
        con.execute("CREATE SEQUENCE s")  # a SELECT that would write: nextval('s')
        with con.cursor().copy("COPY pums FROM STDIN") as copy:
            for row in df.astype(object).where(df.notna(), None).itertuples(index=False):
                copy.write_row(row)
    return str(pg_server.url(DB))


@pytest.fixture(scope="module")
def spark_pums(spark: Any, pums_typed: Any) -> Any:
    df, _ = pums_typed
    rows = [tuple(None if pd.isna(v) else v for v in r) for r in df.astype(object).itertuples(index=False)]
    sdf = spark.createDataFrame(rows, SPARK_TYPES)
    sdf.createOrReplaceTempView("pums_spark")
    return sdf


def _sources(name: str, pums_typed: Any, pg_url: str, spark: Any) -> Any:
    df, _ = pums_typed
    return {"duckdb": lambda: df, "postgres": lambda: pg_url, "spark": lambda: (spark, "pums_spark")}[name]()


def _run_corpus(data: Any, schema: dpgate.Schema) -> list[Any]:
    out = []
    with dpgate.Gateway(data, schema, budget=40.0, seed=11) as gw:
        for sql in CORPUS:
            res = gw.query(sql, accuracy=30, confidence=0.9)
            out.append([(a.value, a.low, a.high, a.epsilon_spent, a.source) for a in res.answers])
        out.append(gw.spent)
    return out


def test_same_answers_intervals_and_charges_on_every_backend(pums_typed: Any, pg_url: str, spark_pums: Any,
                                                               spark: Any) -> None:
    df, schema = pums_typed
    results = {name: _run_corpus(_sources(name, pums_typed, pg_url, spark), schema)
               for name in ("duckdb", "postgres", "spark")}
    assert results["postgres"] == results["duckdb"]
    assert results["spark"] == results["duckdb"]
    assert results["duckdb"][-2][0][-1] == "history"  # the repeat was free
    assert results["duckdb"][-1] > 0


def test_exact_counts_agree_with_pandas(pums_typed: Any, pg_url: str, spark_pums: Any, spark: Any) -> None:
    """Full-resolution histograms of every column (NULL, clamping, text and boolean cells) agree."""
    df, schema = pums_typed
    with Cube(df, schema) as ref:
        want = {c.name: ref.histogram("pums", [c.name]) for c in schema.tables[0].columns}
        fp = ref.fingerprint()
    assert want["sex"].tolist()[:2] == [int((df["sex"] == "0").sum()), int((df["sex"] == "1").sum())]
    for data in (pg_url, (spark, "pums_spark"), spark_pums):
        with Cube(data, schema) as cube:
            for name, h in want.items():
                assert np.array_equal(cube.histogram("pums", [name]), h), (data, name)
            assert np.array_equal(cube.histogram("pums", ["age", "race"], [[0, 18, 65], [0, 2, 4]]),
                                  ref_hist(df, schema))
            assert cube.fingerprint() != fp and len(cube.fingerprint()) == 64


def ref_hist(df: pd.DataFrame, schema: dpgate.Schema) -> np.ndarray:
    with Cube(df, schema) as ref:
        return ref.histogram("pums", ["age", "race"], [[0, 18, 65], [0, 2, 4]])


def test_fingerprint_binds_content(pg_server: Any, pg_url: str, pums_typed: Any) -> None:
    """The PostgreSQL fingerprint changes with one changed value and is stable otherwise."""
    _, schema = pums_typed
    with Cube(pg_url, schema) as cube:
        before = cube.fingerprint()
    with Cube(pg_url, schema) as cube:
        assert cube.fingerprint() == before
    with psycopg.connect(pg_url) as con:
        con.execute("CREATE TABLE pums_copy AS SELECT * FROM pums")
        con.execute("UPDATE pums_copy SET income = income + 1 WHERE pid = 7")
    copy_schema = dpgate.Schema.from_dict({"tables": {"pums_copy": schema.to_dict()["tables"]["pums"]}})
    with Cube(pg_url, copy_schema) as cube:
        changed = cube.fingerprint()
    assert changed != before


# -- privacy: only generated SQL, read-only -------------------------------------------------------
MARKER = "dpgate_spy_7f3a"


def test_user_sql_never_reaches_postgres(pg_server: Any, pg_url: str, pums_typed: Any) -> None:
    _, schema = pums_typed
    sql = f"SELECT COUNT(*) /* {MARKER} */ FROM pums WHERE age < 30 AND sex = '1'"
    start = len(pg_server.log_text())
    with dpgate.Gateway(pg_url, schema, budget=5.0, seed=1) as gw:
        gw.query(sql, accuracy=20)
        gw.query("SELECT race, COUNT(*) FROM pums GROUP BY race", accuracy=40)
        with pytest.raises(dpgate.UnsupportedQuery):
            gw.query("DELETE FROM pums", accuracy=10)
    log = pg_server.log_text()[start:]
    statements = re.findall(r"LOG:  statement: (.*)", log)
    assert statements, "log_statement=all recorded nothing"
    assert MARKER not in log and "DELETE" not in log and "FROM pums " not in log
    # Besides SQLAlchemy's connection probes (version, settings), only transaction control
    # and generated SELECTs; every statement on the table reads declared columns only.
    writes = re.compile(r"(?i)^\s*(insert|update|delete|create|drop|alter|truncate|copy|grant|call|do)\b")
    assert not [s for s in statements if writes.match(s)], statements
    assert "SET TRANSACTION READ ONLY" in statements
    data = [s for s in statements if "pums" in s and "information_schema" not in s]
    assert data and all(s.startswith("SELECT ") and '"pums"' in s and '"pid"' not in s for s in data), data


def test_user_sql_never_reaches_spark(spark: Any, spark_pums: Any, pums_typed: Any) -> None:
    _, schema = pums_typed
    seen: list[str] = []

    class Spy:
        def __init__(self, real: Any) -> None:
            self.real = real

        def sql(self, text: str, *args: Any, **kw: Any) -> Any:
            seen.append(text)
            return self.real.sql(text, *args, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    with dpgate.Gateway(SparkBackend(Spy(spark), "pums_spark", ["pums"]), schema, budget=5.0, seed=1) as gw:
        gw.query(f"SELECT COUNT(*) /* {MARKER} */ FROM pums WHERE age < 30 AND sex = '1'", accuracy=20)
        with pytest.raises(dpgate.UnsupportedQuery):
            gw.query("INSERT INTO pums SELECT * FROM pums", accuracy=10)
    assert seen and all(s.startswith("SELECT ") and MARKER not in s and "`pid`" not in s for s in seen)
    assert all(isinstance(parse_one(s, read="spark"), exp.Select) for s in seen)


def test_generated_sql_path_cannot_write(pg_url: str, spark: Any, spark_pums: Any) -> None:
    writes = [
        parse_one("INSERT INTO pums (age) VALUES (1)", read="postgres"),
        parse_one("CREATE TABLE leak AS SELECT * FROM pums", read="postgres"),
        parse_one("DELETE FROM pums", read="postgres"),
        parse_one("SELECT * INTO leak FROM pums", read="postgres"),
        parse_one("SELECT age FROM pums FOR UPDATE", read="postgres"),
    ]
    pg = PostgresBackend(pg_url)
    sp = SparkBackend(spark, "pums_spark", ["pums"])
    try:
        for backend in (pg, sp):
            for stmt in writes:
                with pytest.raises(DPGateInternalError):
                    backend.run(stmt)  # type: ignore[arg-type]
        # Below the guard, the server itself refuses writes: every statement runs READ ONLY.
        for text in ("INSERT INTO pums (age) VALUES (1)", "CREATE TABLE leak (a int)", "SELECT nextval('s')"):
            with pytest.raises(OperationalError, match="read-only transaction"):
                pg._fetch(text)
        count = parse_one("SELECT COUNT(*) FROM pums", read="postgres")
        assert pg.run(count) == [(1948,)]  # type: ignore[arg-type]
    finally:
        pg.close()
        sp.close()


def test_postgres_statement_timeout_and_sources(pg_server: Any, pg_url: str, pums_typed: Any) -> None:
    _, schema = pums_typed
    slow = PostgresBackend(pg_url, statement_timeout=0.05)
    try:
        with pytest.raises(OperationalError, match="statement timeout"):
            slow.run(exp.select(exp.func("pg_sleep", exp.Literal.number(2))))
    finally:
        slow.close()
    import sqlalchemy

    engine = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    dbapi_con = psycopg.connect(pg_url)
    auto_con = psycopg.connect(pg_url, autocommit=True)
    try:
        for source in (engine, dbapi_con, auto_con):
            assert type(open_backend(source, ["pums"])) is PostgresBackend
            with Cube(source, schema) as cube:
                assert int(cube.histogram("pums", ["sex"]).sum()) == 1948
        assert not dbapi_con.closed and not auto_con.closed  # caller-owned connections stay open
        assert auto_con.execute("SELECT 1").fetchone() == (1,)  # and no transaction was left open
    finally:
        engine.dispose()
        dbapi_con.close()
        auto_con.close()
    with pytest.raises(OperationalError):
        Cube(f"postgresql://dpgate@127.0.0.1:{pg_server.port}/no_such_db", schema)
    with pytest.raises(dpgate.SchemaError, match="lacks declared tables"):
        Cube(pg_url, dpgate.Schema.from_dict({"tables": {"nope": {"columns": {"a": {"type": "boolean"}}}}}))


def test_connect_and_bad_sources(pg_url: str, pums_typed: Any) -> None:
    """PEP 249 over PostgreSQL; sources dpgate cannot serve are refused with what to change."""
    _, schema = pums_typed
    with dpgate.connect(pg_url, schema=schema, budget=2.0, seed=3, accuracy=40) as con:
        cur = con.cursor()
        cur.execute("SELECT married, COUNT(*) FROM pums GROUP BY married")
        assert [r[0] for r in cur.fetchall()][:2] == [False, True]
        assert 0 < con.spent <= 2.0
    import sqlalchemy

    with pytest.raises(dpgate.errors.InvalidArgument, match="'sqlite'"):
        dpgate.Gateway(sqlalchemy.create_engine("sqlite://"), schema)
    with pytest.raises(dpgate.errors.InvalidArgument, match="statement_timeout"):
        PostgresBackend(pg_url, statement_timeout=0)
    with pytest.raises(dpgate.errors.InvalidArgumentType, match="PostgreSQL URL"):
        dpgate.Gateway(("not a session", "pums"), schema)


def test_spark_sources_and_misuse(spark: Any, spark_pums: Any, pums_typed: Any) -> None:
    _, schema = pums_typed
    with pytest.raises(dpgate.errors.InvalidArgumentType, match=r"\(spark, 'db.table'\)"):
        Cube(spark, schema)  # a session without a table
    with pytest.raises(dpgate.SchemaError, match="lacks declared tables"):
        Cube((spark, "no_such_table"), schema)
    with Cube({"pums": spark_pums}, schema) as cube:
        views = [t.name for t in spark.catalog.listTables() if t.name.startswith("dpgate_")]
        assert len(views) == 1 and int(cube.histogram("pums", ["race"]).sum()) == 1948
    assert not [t.name for t in spark.catalog.listTables() if t.name.startswith("dpgate_")]  # dropped at close
    with pytest.raises(dpgate.InterfaceError):
        dpgate.connect(object(), schema=schema)


def test_numbers_and_booleans_stored_as_text_map_alike(pg_server: Any) -> None:
    """PostgreSQL has no TRY_CAST: text is cast only where it spells a number (or a boolean);
    common spellings land in the same cells as on DuckDB, unparseable text is NULL / false."""
    vals = ["12", " 7 ", "abc", None, "1e1", "-3", "2.5", "+4", ".5", "nan", "inf", "-Infinity", "t", "yes",
            "0", "false", "", "99"]
    schema = dpgate.Schema.from_dict({"tables": {"texts": {"columns": {
        "n": {"type": "integer", "min": 0, "max": 20, "nullable": True}, "b": {"type": "boolean"}}}}})
    url = pg_server.url()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("DROP TABLE IF EXISTS texts")
        con.execute("CREATE TABLE texts (n text, b text)")
        with con.cursor().copy("COPY texts FROM STDIN") as copy:
            for v in vals:
                copy.write_row((v, v))
    with Cube(pd.DataFrame({"n": vals, "b": vals}), schema) as duck, Cube(url, schema) as pg:
        for col in ("n", "b"):
            assert pg.histogram("texts", [col]).tolist() == duck.histogram("texts", [col]).tolist(), col
