"""Hostile stored values: no answer or refusal depends on a row, no error quotes one.

A value the generated SQL cannot convert (``'1e400'``, ``'NaN'``, ``'12abc'``, a 100 000-character
string, an embedded NUL) must count as its declared cell rule says — exactly as the row with that
value replaced by the cell's canonical value — on every engine: DuckDB, a real PostgreSQL 15
server (``tests/_pgserver.py``) and Spark in ``local[2]`` mode (``conftest.py``).  An engine
error would be worse than a wrong count: PostgreSQL's cast failed only when the row met the
query's other conditions, so refusals told those conditions' truth for that row.  Engine errors
that do happen (a CSV changed under ``serve --data``) reach the analyst as a fixed dpgate
message that quotes nothing.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pytest
from sqlglot import exp, parse_one

import dpgate
from dpgate.backends import PostgresBackend, SparkBackend, open_data_file
from dpgate.release.cube import Cube

SCHEMA = dpgate.Schema.from_dict({"tables": {"t": {"columns": {
    "k": {"type": "integer", "min": 0, "max": 3},
    "n": {"type": "integer", "min": 0, "max": 20, "nullable": True},
    "x": {"type": "numeric", "bins": [0, 10, 100, 1000], "nullable": True},
    "b": {"type": "boolean", "nullable": True},
    "c": {"type": "categorical", "values": ["a", "b"], "other": True, "nullable": True},
}}}})
COLUMNS = ["k", "n", "x", "b", "c"]
HUGE = 100_000

# (stored text, its cell's canonical value) per column; "max"/"min"/"zero" name the cell of a
# number beyond a double's range, below it, or that rounds to zero.
NUMBERS: list[tuple[str, str | None]] = [
    ("1e400", "max"), ("-1e400", "min"), ("1" + "0" * 400, "max"), ("9" * HUGE, "max"), ("inf", "max"),
    ("-Infinity", "min"), ("1.7976931348623159e308", "max"), ("1e99999999999999999999", "max"),
    ("-1e+0400", "min"), ("1e-400", "zero"), ("-1e-400", "zero"), ("0." + "0" * 5000 + "1", "zero"),
    ("1e-99999999999999999999", "zero"), ("2e-324", "zero"), ("NaN", None), ("12abc", None), ("1e", None),
    ("--1", None), ("0x1A", None), ("", None), ("   ", None), ("2024-02-30", None), ("x" * HUGE, None),
    ("\u0663", None), ("1e1e1", None), ("1.5.2", None), ("1e400x", None),
]
CANON = {"n": {"max": "20", "min": "0", "zero": "0"}, "x": {"max": "500", "min": "-5", "zero": "0"}}
BOOLEANS: list[tuple[str, str | None]] = [
    ("1e400", "true"), ("-1e400", "true"), ("9" * HUGE, "true"), ("inf", "true"), ("NaN", "true"),
    ("1e-400", "false"), ("0." + "0" * 5000 + "1", "false"), ("1e-99999999999999999999", "false"),
    ("abc", "false"), ("", "false"), ("x" * HUGE, "false"), ("2024-02-30", "false"), ("12abc", "false"),
]
TEXTS: list[tuple[str, str | None]] = [
    ("A", "zzz"), (" a", "zzz"), ("a ", "zzz"), ("x" * HUGE, "zzz"), ("1e400", "zzz"), ("NaN", "zzz"), ("", "zzz"),
]
NUL_TEXTS: list[tuple[str, str | None]] = [("a\x00", "zzz"), ("\x00", "zzz"), ("b\x00b", "zzz")]  # not in PostgreSQL

QUERIES = [
    "SELECT COUNT(*) FROM t WHERE k = 1 AND n >= 10",
    "SELECT COUNT(*) FROM t WHERE k = 2 AND n IS NULL",
    "SELECT COUNT(*) FROM t WHERE k < 2 AND n < 5",
    "SELECT COUNT(*) FROM t WHERE n BETWEEN 3 AND 17 AND b",
    "SELECT COUNT(*) FROM t WHERE x >= 100 AND k = 3",
    "SELECT COUNT(*) FROM t WHERE x < 10 AND k >= 1",
    "SELECT COUNT(*) FROM t WHERE b AND k = 0",
    "SELECT COUNT(*) FROM t WHERE NOT b AND k = 1",
    "SELECT COUNT(*) FROM t WHERE c = 'a' AND k = 2",
    "SELECT COUNT(*) FROM t WHERE c <> 'a' AND k = 2",
    "SELECT SUM(n) FROM t WHERE k = 3",
    "SELECT n, COUNT(*) FROM t GROUP BY n",
    "SELECT x, COUNT(*) FROM t GROUP BY x",
    "SELECT b, c, COUNT(*) FROM t WHERE k >= 1 GROUP BY b, c",
]


def tables(engine: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The same table twice: with the hostile values planted, and with each replaced by its
    cell's canonical value.  Ordinary rows surround them; every hostile row has a key ``k``."""
    rng = random.Random(7)
    ordinary = [(rng.randrange(4), str(rng.randrange(-3, 25)), str(rng.choice([1, 5, 20, 70, 300, 2000])),
                 rng.choice(["t", "f", "yes", "0", None]), rng.choice(["a", "b", "other", None])) for _ in range(150)]
    hostile, canon = list(ordinary), list(ordinary)
    plants: list[tuple[int, str, str | None]] = []
    for col in ("n", "x"):
        plants += [(COLUMNS.index(col), v, CANON[col].get(c, c) if c else None) for v, c in NUMBERS]
    plants += [(3, v, c) for v, c in BOOLEANS]
    plants += [(4, v, c) for v, c in TEXTS + (NUL_TEXTS if engine != "postgres" else [])]
    for i, (col, value, canonical) in enumerate(plants):
        row = [i % 4, "7", "50", "t", "b"]
        row[col] = value
        hostile.append(tuple(row))
        row[col] = canonical
        canon.append(tuple(row))
    return hostile, canon


def outcomes(data: Any) -> list[Any]:
    """Every query's answers (seeded noise: equal exact counts give equal answers) or its refusal,
    and the full-resolution histogram of the whole table."""
    out: list[Any] = []
    for budget in (1e6, 0.3):  # the second gateway refuses some queries (budget exhausted)
        with dpgate.Gateway(data, SCHEMA, budget=budget, seed=3) as gw:
            for sql in QUERIES:
                try:
                    res = gw.query(sql, accuracy=50, confidence=0.9)
                    out.append([(a.value, a.low, a.high, a.epsilon_spent) for a in res.answers])
                except dpgate.Error as exc:
                    out.append((type(exc).__name__, str(exc)))
    with Cube(data, SCHEMA) as cube:
        out.append(cube.histogram("t").tolist())
        out.append(cube.histogram("t", ["x", "b"], [[0, 1, 2], [0, 1]]).tolist())
    return out


def planted_texts(engine: str) -> list[str]:
    return [v for v, _ in NUMBERS + BOOLEANS + TEXTS + NUL_TEXTS if len(v.strip()) >= 3]


def check(hostile: Any, canonical: Any, engine: str) -> list[Any]:
    got, want = outcomes(hostile), outcomes(canonical)
    for sql, g, w in zip(QUERIES + QUERIES, got, want, strict=False):
        assert g == w, (engine, sql, g, w)
        if isinstance(g, tuple):  # a refusal: it names no stored value
            assert not [v for v in planted_texts(engine) if v in g[1]], (engine, sql, g)
    assert got[-2:] == want[-2:], engine
    assert not any(isinstance(g, tuple) for g in got[:len(QUERIES)]), got  # with budget, none is refused
    assert any(isinstance(g, tuple) for g in got[len(QUERIES):-2]), got  # without, some are
    return got


def frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["k"] = df["k"].astype("int64")
    return df


def test_duckdb_counts_hostile_values_by_their_cells() -> None:
    hostile, canon = tables("duckdb")
    got = check(frame(hostile), frame(canon), "duckdb")
    hist = np.asarray(got[-2])
    assert hist.sum() == len(hostile)


def test_postgres_counts_hostile_values_by_their_cells(pg_server: Any) -> None:
    """The attack of issue 27: on PostgreSQL, '1e400' made the cast fail only when its row
    passed the other filters.  Now every statement succeeds and counts it as clamped."""
    hostile, canon = tables("postgres")
    url = pg_server.url()
    with psycopg.connect(url, autocommit=True) as con:
        for name in ("hostile", "canon"):
            con.execute(f"DROP DATABASE IF EXISTS {name}")
            con.execute(f"CREATE DATABASE {name}")
    for name, rows in (("hostile", hostile), ("canon", canon)):
        with psycopg.connect(pg_server.url(name)) as con:
            con.execute("CREATE TABLE t (k integer, n text, x text, b text, c text)")
            with con.cursor().copy("COPY t FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
    got = check(pg_server.url("hostile"), pg_server.url("canon"), "postgres")
    # The same cells as DuckDB (the canonical tables agree, and so do the hostile ones).
    duck_hostile, _ = tables("postgres")
    assert got[-2] == outcomes(frame(duck_hostile))[-2]


def test_spark_counts_hostile_values_by_their_cells(spark: Any) -> None:
    hostile, canon = tables("spark")
    types = "k int, n string, x string, b string, c string"
    check(spark.createDataFrame(hostile, types), spark.createDataFrame(canon, types), "spark")


# -- engine errors: a fixed message, never the engine's text ------------------------------------
SECRET = "42 yrs - J. Doe 1961-04-07 HIV+"


def assert_withheld(exc: BaseException, *planted: str) -> None:
    text = str(exc)
    assert isinstance(exc, dpgate.OperationalError), repr(exc)
    assert "data owner should check" in text and "withheld" in text, text
    assert not [p for p in planted if p in text], text
    assert exc.__cause__ is None and exc.__suppress_context__  # no traceback carries the engine's message


def test_changed_csv_behind_duckdb_is_a_fixed_error(tmp_path: Any) -> None:
    """``serve --data file.csv`` reads the file at each statement: a line that no longer parses
    is reported as a data problem without quoting it, through Gateway.query."""
    schema = dpgate.Schema.from_dict({"tables": {"p": {"columns": {
        "age": {"type": "integer", "min": 0, "max": 100}, "sex": {"type": "categorical", "values": ["0", "1"]}}}}})
    path = tmp_path / "p.csv"
    path.write_text("age,sex\n" + "".join(f"{20 + i % 50},{i % 2}\n" for i in range(100)))
    con = open_data_file(str(path), schema)
    try:
        with dpgate.Gateway(con, schema, budget=10.0, seed=1) as gw:
            assert gw.query("SELECT COUNT(*) FROM p WHERE age < 40", accuracy=30).answers
            lines = path.read_text().splitlines()
            lines[42] = f"{SECRET},1"
            path.write_text("\n".join(lines) + "\n")
            spent = gw.spent
            with pytest.raises(dpgate.Error) as info:
                gw.query("SELECT COUNT(*) FROM p WHERE age >= 40", accuracy=30)
            assert_withheld(info.value, SECRET, "J. Doe", "HIV", "Line")
            assert "could not be read" in str(info.value)
            assert gw.spent == spent  # refused before anything was released
    finally:
        con.close()


def test_postgres_and_spark_errors_are_fixed(pg_server: Any, spark: Any) -> None:
    """A statement the engine refuses because of a stored value: the message names the class of
    failure and what to check, never the value (PostgreSQL quotes it: '"…" is out of range')."""
    url = pg_server.url()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("DROP TABLE IF EXISTS leak")
        con.execute("CREATE TABLE leak (v text)")
        con.execute("INSERT INTO leak VALUES (%s), ('1e400')", (SECRET,))
    pg = PostgresBackend(url)
    try:
        for sql in ("SELECT CAST(v AS DOUBLE PRECISION) FROM leak WHERE v = '1e400'",
                    "SELECT CAST(v AS INTEGER) FROM leak"):
            with pytest.raises(dpgate.Error) as info:
                pg.run(parse_one(sql, read="postgres"))  # type: ignore[arg-type]
            assert_withheld(info.value, SECRET, "1e400", "J. Doe")
            assert "could not be read" in str(info.value)
        with pytest.raises(dpgate.Error) as info:
            pg.run(parse_one("SELECT no_such_column FROM leak", read="postgres"))  # type: ignore[arg-type]
        assert_withheld(info.value, "no_such_column")
        assert "declared tables and columns exist" in str(info.value)
    finally:
        pg.close()
    spark.createDataFrame([(SECRET,)], "v string").createOrReplaceTempView("leak_spark")
    sp = SparkBackend(spark, "leak_spark", ["leak"])
    try:
        with pytest.raises(dpgate.Error) as info:
            sp.run(parse_one("SELECT CAST(v AS INT) FROM leak_spark", read="spark"))  # type: ignore[arg-type]
        assert_withheld(info.value, SECRET, "J. Doe")
    finally:
        sp.close()


class LeakyBackend:
    """A custom backend whose engine raises its own exception, quoting a row."""

    dialect = "duckdb"

    def __init__(self) -> None:
        self.inner = dpgate.backends.DuckDBBackend(pd.DataFrame({"k": [0, 1, 2, 3]}), ["t"])
        self.fail = False

    def catalog(self, tables: Any) -> Any:
        return self.inner.catalog(tables)

    def run(self, select: exp.Select, *, numpy: bool = False) -> Any:
        if self.fail:
            raise ValueError(f"could not parse row: {SECRET}")
        return self.inner.run(select, numpy=numpy)

    def row_hash(self, columns: Any) -> Any:
        return self.inner.row_hash(columns)

    def close(self) -> None:
        self.inner.close()


def test_gateway_query_never_lets_an_engine_exception_through() -> None:
    schema = dpgate.Schema.from_dict({"tables": {"t": {"columns": {"k": {"type": "integer", "min": 0, "max": 3}}}}})
    backend = LeakyBackend()
    with dpgate.Gateway(backend, schema, budget=5.0, seed=1) as gw:
        backend.fail = True
        with pytest.raises(dpgate.Error) as info:
            gw.query("SELECT COUNT(*) FROM t WHERE k < 2", accuracy=30)
        assert_withheld(info.value, SECRET, "J. Doe")
        assert gw.spent == 0.0


def test_changed_csv_behind_a_live_server_is_a_fixed_error(tmp_path: Any) -> None:
    """The report of issue 27 on a real ``dpgate serve --data file.csv``: a line of the CSV
    changed after the server started reached the client verbatim (``XX000 … Original Line: …``)."""
    import shutil
    import subprocess
    import sys

    from _dpserve import PUMS_CSV, PUMS_YAML, ROOT, dsn, users_file

    data = tmp_path / "PUMS.csv"
    shutil.copy(PUMS_CSV, data)
    users_file(tmp_path, {"alice": 1.0})
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--data", str(data), "--schema", str(PUMS_YAML),
         "--ledger", str(tmp_path / "ledger.db"), "--budget", "1", "--users", str(tmp_path / "users.yaml"),
         "--port", "0", "--accuracy", "25"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**__import__("os").environ,
                                                                            "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            if "listening on" in line:
                port = int(line.rsplit(":", 1)[1].split()[0])
                break
        assert port is not None, "the server did not start"
        with psycopg.connect(dsn(port), autocommit=True, connect_timeout=10) as con:
            assert con.execute("SELECT COUNT(*) FROM pums WHERE age < 40").fetchone()
            lines = data.read_text().splitlines()
            lines[42] = f"{SECRET},1,9,1,0,1"
            data.write_text("\n".join(lines) + "\n")
            with pytest.raises(psycopg.Error) as info:
                con.execute("SELECT COUNT(*) FROM pums WHERE age >= 40").fetchone()
        text = str(info.value)
        assert info.value.sqlstate == "22000", info.value.sqlstate  # data_exception: its class, not XX000
        assert "could not be read" in text and "data owner should check" in text, text
        assert not [p for p in (SECRET, "J. Doe", "HIV", "Original Line") if p in text], text
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "J. Doe" not in err  # nor in the server's log


class _Engine(Exception):
    """An engine exception with a SQLSTATE (psycopg's ``sqlstate``) that quotes a row."""

    def __init__(self, code: str | None) -> None:
        super().__init__(f"invalid input: {SECRET}")
        self.sqlstate = code


@pytest.mark.parametrize(("code", "phrase", "sent"), [
    ("57014", "statement timeout", "57014"), ("25006", "read-only transaction", "25006"),
    ("22003", "could not be read", "22000"), ("22P02", "could not be read", "22000"),
    ("42P01", "declared tables and columns exist", "58000"), ("42501", "may read them", "58000"),
    ("08006", "unreachable", "08006"), ("53200", "ran out of resources", "53000"),
    ("XX000", "engine's own log", "58000"), (None, "engine's own log", "58000"),
])
def test_each_class_of_engine_failure_has_a_fixed_message(code: str | None, phrase: str, sent: str) -> None:
    from dpgate.backends import engine_failure
    from dpgate.server._session import sqlstate

    err = engine_failure("postgres", _Engine(code))
    assert phrase in str(err) and "PostgreSQL" in str(err) and SECRET not in str(err), str(err)
    assert sqlstate(err) == sent  # dpgate serve sends the class's code, never the engine's own


def test_duckdb_exceptions_are_classed_by_their_type() -> None:
    import duckdb

    from dpgate.backends import engine_failure

    for exc, phrase in ((duckdb.ConversionException(SECRET), "could not be read"),
                        (duckdb.CatalogException(SECRET), "declared tables"),
                        (duckdb.IOException(SECRET), "unreachable"), (duckdb.InterruptException(SECRET), "timeout")):
        err = engine_failure("duckdb", exc)
        assert phrase in str(err) and SECRET not in str(err), str(err)
