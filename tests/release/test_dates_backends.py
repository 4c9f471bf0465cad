"""Date and timestamp columns on DuckDB, PostgreSQL and Spark: exact cells against pandas.

A generated table with a DATE column (day granularity), a TIMESTAMP column (hour), the same
dates as ISO text (month granularity, with unparseable text), NULLs and values outside the
declared ranges.  Every backend's full-resolution histogram, and the exact count of compiled
queries (ranges, BETWEEN, IN, EXTRACT, date_trunc, GROUP BY), match a pandas evaluation of the
declared semantics: truncate to the granule, clamp into the range, NULL (and bad text) apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pytest

import dpgate
from dpgate.compile import compile_sql
from dpgate.release.cube import Cube

DB = "dpgate_dates"
SPEC = {"tables": {"ev": {"columns": {
    "d": {"type": "date", "min": "2024-01-01", "max": "2024-12-31", "nullable": True},
    "ts": {"type": "timestamp", "min": "2024-01-01 00:00", "max": "2024-02-29 23:00", "granularity": "hour"},
    "dtext": {"type": "date", "min": "2024-01-01", "max": "2024-12-01", "granularity": "month"},
    "x": {"type": "integer", "min": 0, "max": 9},
}}}}
SCHEMA = dpgate.Schema.from_dict(SPEC)
T = SCHEMA.table("ev")

# (SQL WHERE clause, pandas predicate on the truncated, clamped frame ``f``)
CASES: list[tuple[str, Any]] = [
    ("d >= DATE '2024-03-01' AND d < '2024-04-01'", lambda f: (f.d >= "2024-03-01") & (f.d < "2024-04-01")),
    ("d BETWEEN '2024-01-01' AND '2024-03-31'", lambda f: (f.d >= "2024-01-01") & (f.d <= "2024-03-31")),
    ("d IN ('2024-01-01', '2024-12-31', DATE '2024-06-15')",
     lambda f: f.d.isin(pd.to_datetime(["2024-01-01", "2024-12-31", "2024-06-15"]))),
    ("d IS NULL", lambda f: f.d.isna()),
    ("d > '2024-12-30'", lambda f: f.d > "2024-12-30"),
    ("EXTRACT(dow FROM d) IN (0, 6)", lambda f: f.d.dt.day_of_week.isin([5, 6])),
    ("EXTRACT(month FROM d) = 2 AND EXTRACT(day FROM d) >= 15", lambda f: (f.d.dt.month == 2) & (f.d.dt.day >= 15)),
    ("date_trunc('week', d) = '2024-03-04'", lambda f: f.d.dt.to_period("W-SUN").dt.start_time == "2024-03-04"),
    ("date_trunc('quarter', d) = '2024-04-01'", lambda f: f.d.dt.quarter == 2),
    ("ts >= TIMESTAMP '2024-01-15 08:00' AND ts < '2024-02-01'",
     lambda f: (f.ts >= "2024-01-15 08:00") & (f.ts < "2024-02-01")),
    ("EXTRACT(hour FROM ts) BETWEEN 9 AND 17 AND EXTRACT(isodow FROM ts) <= 5",
     lambda f: f.ts.dt.hour.between(9, 17) & (f.ts.dt.day_of_week <= 4)),
    ("date_trunc('day', ts) = '2024-02-29'", lambda f: f.ts.dt.floor("D") == "2024-02-29"),
    ("CAST(ts AS DATE) = DATE '2024-01-31'", lambda f: f.ts.dt.floor("D") == "2024-01-31"),
    ("dtext >= '2024-06-01' OR dtext IS NULL", lambda f: (f.dtext >= "2024-06-01") | f.dtext.isna()),
    ("EXTRACT(year FROM dtext) = 2024 AND EXTRACT(quarter FROM dtext) = 3", lambda f: f.dtext.dt.quarter == 3),
]


def make_frame(n: int = 3000, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    d = pd.Series(np.datetime64("2023-12-20") + rng.integers(0, 390, n).astype("timedelta64[D]"))
    ts = pd.Series(np.datetime64("2023-12-31T20:00") + rng.integers(0, 60 * 24 * 62, n).astype("timedelta64[m]"))
    df = pd.DataFrame({"d": d.astype("datetime64[s]"), "ts": ts.astype("datetime64[s]"), "x": rng.integers(0, 10, n)})
    df.loc[::37, "d"] = pd.NaT
    text = (pd.Series(np.datetime64("2023-11-01") + rng.integers(0, 430, n).astype("timedelta64[D]"))
            .dt.strftime("%Y-%m-%d").astype(object))
    text[::41] = "not a date"
    text[::43] = None
    text[5::47] = "2024-07-04 10:30:00"
    df["dtext"] = text
    return df


def reference(df: pd.DataFrame) -> pd.DataFrame:
    """The declared semantics in pandas: truncate to the granule, clamp into the range."""
    f = pd.DataFrame({"x": df.x})
    f["d"] = df.d.dt.floor("D").clip(pd.Timestamp("2024-01-01"), pd.Timestamp("2024-12-31"))
    f["ts"] = df.ts.dt.floor("h").clip(pd.Timestamp("2024-01-01"), pd.Timestamp("2024-02-29 23:00"))
    parsed = pd.to_datetime(df.dtext, format="ISO8601", errors="coerce")
    f["dtext"] = parsed.dt.to_period("M").dt.start_time.clip(pd.Timestamp("2024-01-01"), pd.Timestamp("2024-12-01"))
    return f


def exact(cube: Cube, sql: str) -> list[float]:
    """The exact value of every compiled query of ``sql`` on the cube's full-resolution histogram."""
    out = []
    for q in compile_sql(sql, SCHEMA):
        full = [list(range(T.column(c).n_cells)) for c in q.columns]
        w = q.expand(T, q.columns, full) / q.denominator
        out.append(float((w * cube.histogram("ev", list(q.columns))).sum() + float(q.offset)))
    return out


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_frame()


@pytest.fixture(scope="module")
def pg_url(pg_server: Any, frame: pd.DataFrame) -> str:
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {DB}")
        con.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(pg_server.url(DB)) as con:
        con.execute("CREATE TABLE ev (d date, ts timestamp, x integer, dtext text)")
        with con.cursor().copy("COPY ev FROM STDIN") as copy:
            for r in frame.itertuples(index=False):
                copy.write_row([None if pd.isna(r.d) else r.d.date(), r.ts.to_pydatetime(), int(r.x), r.dtext])
    return str(pg_server.url(DB))


@pytest.fixture(scope="module")
def spark_ev(spark: Any, frame: pd.DataFrame) -> Any:
    rows = [(None if pd.isna(r.d) else r.d.date(), r.ts.to_pydatetime(), int(r.x), r.dtext)
            for r in frame.itertuples(index=False)]
    spark.createDataFrame(rows, "d date, ts timestamp, x int, dtext string").createOrReplaceTempView("ev_spark")
    return (spark, "ev_spark")


def _sources(frame: pd.DataFrame, pg_url: str, spark_ev: Any) -> dict[str, Any]:
    return {"duckdb": frame, "postgres": pg_url, "spark": spark_ev}


def test_histograms_and_exact_counts_match_pandas_on_every_backend(frame: pd.DataFrame, pg_url: str,
                                                                   spark_ev: Any) -> None:
    f = reference(frame)
    want_where = [float(pred(f).fillna(False).sum()) for _, pred in CASES]
    months = f.dtext.dt.month
    for name, data in _sources(frame, pg_url, spark_ev).items():
        with Cube(data, SCHEMA) as cube:
            for col in ("d", "ts", "dtext"):
                h = cube.histogram("ev", [col])
                c = T.column(col)
                lo = c.labels()[0]
                if col == "dtext":
                    idx = months - 1
                elif col == "d":
                    idx = (f.d - pd.Timestamp(lo)).dt.days
                else:
                    idx = (f.ts - pd.Timestamp(lo)) // pd.Timedelta(hours=1)
                ref = np.bincount(idx.dropna().astype(int), minlength=c.n_cells - 1).tolist() + [int(idx.isna().sum())]
                assert h.tolist() == ref, (name, col)
            got = [exact(cube, f"SELECT COUNT(*) FROM ev WHERE {w}")[0] for w, _ in CASES]
            assert got == want_where, name
            # SUM over another column, filtered by dates; GROUP BY a date column and date_trunc
            s = exact(cube, "SELECT SUM(x) FROM ev WHERE d BETWEEN '2024-02-01' AND '2024-02-29'")[0]
            assert s == float(f.x[(f.d >= "2024-02-01") & (f.d <= "2024-02-29")].sum()), name
            by_month = exact(cube, "SELECT dtext, COUNT(*) FROM ev GROUP BY dtext")
            assert by_month == [float((months == m).sum()) for m in range(1, 13)], name
            trunc = exact(cube, "SELECT date_trunc('month', d) AS m, COUNT(*) FROM ev WHERE d >= '2024-03-10' GROUP BY m")
            kept = f.d[f.d >= "2024-03-10"]
            assert trunc == [float((kept.dt.month == m).sum()) for m in range(3, 13)], name
            weeks = exact(cube, "SELECT SUM(x) FROM ev GROUP BY date_trunc('week', ts)")
            starts = f.ts.dt.to_period("W-SUN").dt.start_time
            assert weeks == [float(f.x[starts == w].sum()) for w in sorted(starts.unique())], name
            days = exact(cube, "SELECT date_trunc('day', ts) AS day, COUNT(*) FROM ev GROUP BY day")  # coarse path
            assert days == [float((f.ts.dt.floor("D") == k).sum()) for k in sorted(f.ts.dt.floor("D").unique())], name
            dows = exact(cube, "SELECT EXTRACT(dow FROM ts) AS w, COUNT(*) FROM ev GROUP BY 1")
            assert dows == [float(((f.ts.dt.day_of_week + 1) % 7 == k).sum()) for k in range(7)], name


def test_gateway_answers_dates_on_every_backend_and_q1_after_its_months_is_free(
        frame: pd.DataFrame, pg_url: str, spark_ev: Any) -> None:
    f = reference(frame)
    for name, data in _sources(frame, pg_url, spark_ev).items():
        with dpgate.Gateway(data, SCHEMA, budget=1e6, seed=3) as gw:
            for m in ("01", "02", "03"):
                end = {"01": "2024-02-01", "02": "2024-03-01", "03": "2024-04-01"}[m]
                res = gw.query(f"SELECT COUNT(*) FROM ev WHERE d >= '2024-{m}-01' AND d < '{end}'", accuracy=0.05)
                truth = int(((f.d >= f"2024-{m}-01") & (f.d < end)).sum())
                assert abs(res.answers[0].value - truth) < 1, name
            spent = gw.spent
            q1 = gw.query("SELECT COUNT(*) FROM ev WHERE d BETWEEN DATE '2024-01-01' AND DATE '2024-03-31'",
                          accuracy=0.5)
            assert q1.answers[0].source == "history", name
            assert gw.spent == spent, name
            assert abs(q1.answers[0].value - int(((f.d >= "2024-01-01") & (f.d < "2024-04-01")).sum())) < 1


def test_bad_date_queries_read_nothing_and_spend_nothing(frame: pd.DataFrame) -> None:
    with dpgate.Gateway(frame, SCHEMA, budget=1.0, seed=1) as gw:
        for sql, err in [
            ("SELECT COUNT(*) FROM ev WHERE d >= '2024-03-01 10:30'", dpgate.UnsupportedQuery),
            ("SELECT COUNT(*) FROM ev WHERE d >= '2023-03-01'", dpgate.UnsupportedQuery),
            ("SELECT COUNT(*) FROM ev WHERE date_trunc('hour', d) = '2024-03-01'", dpgate.UnsupportedQuery),
            ("SELECT COUNT(*) FROM ev WHERE EXTRACT(fortnight FROM d) = 1", dpgate.UnsupportedQuery),
            ("SELECT COUNT(*) FROM ev WHERE d = '2024-02-30'", dpgate.QuerySyntaxError),
            ("SELECT SUM(d) FROM ev", dpgate.UnsupportedQuery),
        ]:
            with pytest.raises(err):
                gw.query(sql, accuracy=5)
        assert gw.spent == 0


def test_epoch_ordinals_equal_the_calendar_arithmetic(pg_url: str) -> None:
    """DuckDB's and PostgreSQL's short epoch expression and the portable calendar arithmetic (Spark's)
    give the same ordinal on dates and timestamps around leap days, year ends and before 1970."""
    import duckdb
    from sqlglot import exp

    from dpgate.release._dates import granule_ordinal

    stamps = ["1969-12-31 23:59:59", "1970-01-01 00:00:00", "1900-02-28 23:00:00", "1900-03-01 00:30:00",
              "2000-02-29 12:34:56", "2024-02-29 23:59:00", "2024-03-01 00:00:00", "2023-12-31 23:59:59.999",
              "0001-01-01 00:00:00", "9999-12-31 23:59:00", "2024-07-04 10:30:00"]
    col = exp.column("v", quoted=True)
    for gran in ("minute", "hour", "day", "month", "year"):
        for dialect, typ in (("duckdb", "TIMESTAMP"), ("duckdb", "DATE"), ("postgres", "TIMESTAMP"),
                             ("postgres", "DATE")):
            tclass = "date" if typ == "DATE" else "timestamp"
            fast = granule_ordinal(col, gran, tclass, dialect).sql(dialect)
            slow = granule_ordinal(col, gran, tclass, "").sql(dialect)
            values = ", ".join(f"(CAST('{s}' AS {typ}))" for s in stamps)
            sql = f'SELECT {fast}, {slow} FROM (VALUES {values}) AS t("v")'
            if dialect == "duckdb":
                rows = duckdb.sql(sql).fetchall()
            else:
                with psycopg.connect(pg_url) as con:
                    rows = con.execute(sql).fetchall()
            assert all(a == b for a, b in rows), (gran, dialect, typ, rows)


def test_infinite_dates_count_as_null_and_no_generated_sql_fails(pg_server: Any) -> None:
    """``'infinity'`` dates and timestamps (DuckDB, PostgreSQL) land in the NULL cell; the generated
    SQL fails on no stored value (an engine error would tell that such a row exists)."""
    import duckdb

    schema = dpgate.Schema.from_dict({"tables": {"inf": {"columns": {
        "d": {"type": "date", "min": "2024-01-01", "max": "2024-12-31"},
        "ts": {"type": "timestamp", "min": "2024-01-01 00:00", "max": "2024-01-31 23:00", "granularity": "hour"},
        "m": {"type": "timestamp", "min": "2024-01-01 00:00", "max": "2024-12-01 00:00", "granularity": "month"},
    }}}})
    rows = "('infinity', 'infinity', '-infinity'), ('-infinity', '-infinity', 'infinity'), " \
           "('2024-03-01', '2024-01-02 10:00', '2024-05-05 10:00')"
    ddl = "CREATE TABLE inf (d date, ts timestamp, m timestamptz)"
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute("DROP DATABASE IF EXISTS dpgate_inf")
        con.execute("CREATE DATABASE dpgate_inf")
    with psycopg.connect(pg_server.url("dpgate_inf"), autocommit=True) as con:
        con.execute(ddl)
        con.execute(f"INSERT INTO inf VALUES {rows}")
    duck = duckdb.connect()
    duck.execute(ddl)
    duck.execute(f"INSERT INTO inf VALUES {rows}")
    for data in (str(pg_server.url("dpgate_inf")), duck):
        with Cube(data, schema) as cube:
            for col in ("d", "ts", "m"):
                h = cube.histogram("inf", [col])
                assert h[-1] == 2 and h.sum() == 3, (data, col)
