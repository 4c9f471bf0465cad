"""Date and timestamp columns in the schema and the compiler: cells, literals, functions, refusals.

Exact semantics are checked without a database: a query's dense weights over the cells, dotted
with the rows' cells (truncated to the granule, clamped into the range), against pandas.
"""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile import compile_sql, compile_statement
from dpgate.schema._temporal import MAX_LITERAL_CHARS

YAML = """
tables:
  ev:
    columns:
      d:  {type: date, min: 2024-01-01, max: 2024-12-31}
      ts: {type: timestamp, min: '2024-03-01 00:00', max: '2024-03-14 23:00', granularity: hour}
      m:  {type: date, min: 2023-01-01, max: 2024-12-01, granularity: month}
"""
SCHEMA = dpgate.Schema.from_dict(yaml.safe_load(YAML))
T = SCHEMA.table("ev")


def frame(n: int = 500, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    d = pd.Series(pd.Timestamp("2023-12-25") + pd.to_timedelta(rng.integers(0, 380, n), unit="D"))
    d[rng.random(n) < 0.05] = pd.NaT
    ts = pd.Series(pd.Timestamp("2024-02-29 20:00") + pd.to_timedelta(rng.integers(0, 60 * 24 * 16, n), unit="m"))
    m = pd.Series(pd.Timestamp("2022-12-01") + pd.to_timedelta(rng.integers(0, 800, n), unit="D"))
    return pd.DataFrame({"d": d, "ts": ts, "m": m})


def cells(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each row's cell per column, as the generated SQL maps it."""
    out = {}
    d = (df.d.dt.floor("D") - pd.Timestamp("2024-01-01")).dt.days.clip(0, 365)
    out["d"] = np.where(d.isna(), T.column("d").null_cell, d.fillna(0)).astype(int)
    out["ts"] = ((df.ts - pd.Timestamp("2024-03-01")) // pd.Timedelta(hours=1)).clip(0, 14 * 24 - 1).to_numpy()
    out["m"] = ((df.m.dt.year - 2023) * 12 + df.m.dt.month - 1).clip(0, 23).to_numpy()
    return out


def value(sql: str, df: pd.DataFrame) -> list[float]:
    c = cells(df)
    idx = tuple(c[col.name] for col in T.columns)
    return [float(q.dense(T)[idx].sum() + float(q.offset)) for q in compile_sql(sql, SCHEMA)]


def truncated(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "d": df.d.dt.floor("D").clip(pd.Timestamp("2024-01-01"), pd.Timestamp("2024-12-31")),
        "ts": df.ts.dt.floor("h").clip(pd.Timestamp("2024-03-01"), pd.Timestamp("2024-03-14 23:00")),
        "m": df.m.dt.to_period("M").dt.start_time.clip(pd.Timestamp("2023-01-01"), pd.Timestamp("2024-12-01")),
    })


# -- schema -----------------------------------------------------------------------------------
def test_declarations_from_yaml_dates_and_iso_text_round_trip() -> None:
    d, ts, m = T.columns
    assert (d.kind, d.granularity, d.n_cells) == ("date", "day", 367)  # 2024 is a leap year, then NULL
    assert (ts.kind, ts.granularity, ts.n_cells) == ("timestamp", "hour", 14 * 24 + 1)
    assert m.n_cells == 25 and m.labels()[0] == dt.date(2023, 1, 1) and m.labels()[-2] == dt.date(2024, 12, 1)
    assert ts.labels()[1] == dt.datetime(2024, 3, 1, 1)
    assert dpgate.Schema.from_dict(SCHEMA.to_dict()) == SCHEMA
    iso = dpgate.Schema.from_dict({"tables": {"ev": {"columns": {
        "d": {"type": "date", "min": "2024-01-01", "max": "2024-12-31"}}}}})
    assert iso.table("ev").column("d") == d


@pytest.mark.parametrize("decl, words", [
    ({"type": "date", "min": "2024-01-01"}, "'max' as a date"),
    ({"type": "date", "min": "2024-13-01", "max": "2024-12-31"}, "'min' as a date"),
    ({"type": "date", "min": "2024-02-01", "max": "2024-01-01"}, "before min"),
    ({"type": "date", "min": "2024-01-01", "max": "2024-01-02", "granularity": "hour"}, "not one of"),
    ({"type": "timestamp", "min": "1900-01-01", "max": "2024-01-01", "granularity": "minute"}, "coarser granularity"),
    ({"type": "integer", "min": 0, "max": 3, "granularity": "day"}, "date and timestamp columns only"),
    ({"type": "date", "min": "x" * 10_000, "max": "2024-01-01"}, "'min' as a date"),
])
def test_bad_declarations_are_schema_errors(decl: dict, words: str) -> None:
    with pytest.raises(dpgate.SchemaError, match=words):
        dpgate.Schema.from_dict({"tables": {"t": {"columns": {"c": decl}}}})


# -- exact semantics ----------------------------------------------------------------------------
QUERIES = [
    ("SELECT COUNT(*) FROM ev WHERE d >= DATE '2024-03-01' AND d < '2024-04-01'",
     lambda f: ((f.d >= "2024-03-01") & (f.d < "2024-04-01")).sum()),
    ("SELECT COUNT(*) FROM ev WHERE d IS NULL", lambda f: f.d.isna().sum()),
    ("SELECT COUNT(*) FROM ev WHERE d IN ('2024-01-01', '2024-12-31')",
     lambda f: f.d.isin(pd.to_datetime(["2024-01-01", "2024-12-31"])).sum()),
    ("SELECT COUNT(*) FROM ev WHERE EXTRACT(doy FROM d) <= 31", lambda f: (f.d.dt.day_of_year <= 31).sum()),
    ("SELECT COUNT(*) FROM ev WHERE ts BETWEEN TIMESTAMP '2024-03-02 06:00' AND '2024-03-02 18:00'",
     lambda f: f.ts.between("2024-03-02 06:00", "2024-03-02 18:00").sum()),
    ("SELECT COUNT(*) FROM ev WHERE date_trunc('day', ts) = DATE '2024-03-05'",
     lambda f: (f.ts.dt.floor("D") == "2024-03-05").sum()),
    ("SELECT COUNT(*) FROM ev WHERE m < '2024-01-01' AND EXTRACT(quarter FROM m) = 4",
     lambda f: ((f.m < "2024-01-01") & (f.m.dt.quarter == 4)).sum()),
    ("SELECT COUNT(*) FROM ev WHERE date_trunc('year', m) = '2024-01-01'", lambda f: (f.m.dt.year == 2024).sum()),
]


@pytest.mark.parametrize("sql, truth", QUERIES)
def test_exact_counts_match_pandas(sql: str, truth) -> None:
    df = frame()
    assert value(sql, df) == [float(truth(truncated(df)))]


def test_group_by_date_trunc_has_declared_keys_and_sums_its_granules() -> None:
    df = frame()
    f = truncated(df)
    stmt = compile_statement("SELECT date_trunc('month', d) AS month, COUNT(*) FROM ev GROUP BY month", SCHEMA)
    assert [k for (k,) in stmt.group_keys] == [dt.date(2024, i, 1) for i in range(1, 13)]
    assert value("SELECT date_trunc('month', d) AS month, COUNT(*) FROM ev GROUP BY month", df) == [
        float((f.d.dt.month == i).sum()) for i in range(1, 13)]
    # the WHERE clause drops groups it reaches on no cell, never groups empty in the data
    stmt = compile_statement("SELECT COUNT(*) FROM ev WHERE d < '2024-03-01' GROUP BY date_trunc('month', d)",
                             SCHEMA)
    assert [k for (k,) in stmt.group_keys] == [dt.date(2024, 1, 1), dt.date(2024, 2, 1)]
    # a month's query is the sum of its days' queries: the cells, hence history, are shared
    (march,) = compile_sql("SELECT COUNT(*) FROM ev WHERE d >= '2024-03-01' AND d < '2024-04-01'", SCHEMA)
    by_month = compile_sql("SELECT COUNT(*) FROM ev GROUP BY date_trunc('month', d)", SCHEMA)
    assert np.array_equal(by_month[2].dense(T), march.dense(T))


def test_quarter_is_the_sum_of_its_months() -> None:
    months = [compile_sql(f"SELECT COUNT(*) FROM ev WHERE date_trunc('month', d) = '2024-0{i}-01'", SCHEMA)[0]
              for i in (1, 2, 3)]
    (q1,) = compile_sql("SELECT COUNT(*) FROM ev WHERE d BETWEEN '2024-01-01' AND '2024-03-31'", SCHEMA)
    assert np.array_equal(sum(m.dense(T) for m in months), q1.dense(T))


_DAY = st.integers(0, 366).map(lambda k: dt.date(2024, 1, 1) + dt.timedelta(days=k))
_OPS = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__", "=": "__eq__", "<>": "__ne__"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=_DAY, b=_DAY, op1=st.sampled_from(sorted(_OPS)), op2=st.sampled_from(sorted(_OPS)),
       glue=st.sampled_from(["AND", "OR"]), between=st.booleans(), seed=st.integers(0, 3))
def test_range_predicates_match_pandas(a: dt.date, b: dt.date, op1: str, op2: str, glue: str, between: bool,
                                       seed: int) -> None:
    df = frame(200, seed)
    f = truncated(df)
    lo, hi = sorted((a, b))
    if between:
        sql = f"SELECT COUNT(*) FROM ev WHERE d BETWEEN DATE '{lo}' AND '{hi}'"
        want = ((f.d >= pd.Timestamp(lo)) & (f.d <= pd.Timestamp(hi))).sum()
    else:
        sql = f"SELECT COUNT(*) FROM ev WHERE d {op1} '{a}' {glue} '{b}' {op2} d"
        x = getattr(f.d, _OPS[op1])(pd.Timestamp(a)).fillna(False)
        y = getattr(pd.Series(pd.Timestamp(b), index=f.index), _OPS[op2])(f.d).fillna(False) & f.d.notna()
        x = x & f.d.notna()
        want = (x & y).sum() if glue == "AND" else (x | y).sum()
    assert value(sql, df) == [float(want)]


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where, err, words", [
    ("d >= '2024-03-01 10:30'", dpgate.UnsupportedQuery, "not on a day boundary.*'2024-03-01'"),
    ("ts < TIMESTAMP '2024-03-01 10:30'", dpgate.UnsupportedQuery, "not on a hour boundary"),
    ("m = '2024-03-15'", dpgate.UnsupportedQuery, "month boundary"),
    ("d >= '2023-06-01'", dpgate.UnsupportedQuery, "outside the declared range"),
    ("d < '2025-01-02'", dpgate.UnsupportedQuery, "outside the declared range"),
    ("date_trunc('hour', d) = '2024-03-01'", dpgate.UnsupportedQuery, "granularity day.*use one of day"),
    ("EXTRACT(day FROM m) = 1", dpgate.UnsupportedQuery, "granularity month"),
    ("date_trunc('month', d) = '2024-03-04'", dpgate.UnsupportedQuery, "month boundary"),
    ("EXTRACT(fortnight FROM d) = 1", dpgate.UnsupportedQuery, "use one of year"),
    ("date_trunc('decade', d) = '2024-01-01'", dpgate.UnsupportedQuery, "use one of minute"),
    ("d = '2024-02-30'", dpgate.QuerySyntaxError, "not a date"),
    ("d = DATE 'yesterday'", dpgate.QuerySyntaxError, "YYYY-MM-DD"),
    ("d = '" + "9" * 5000 + "'", dpgate.QuerySyntaxError, "not a date"),
    ("d > 3", dpgate.UnsupportedQuery, "compare it with a date"),
    ("d + 1 > 3", dpgate.UnsupportedQuery, "not a number"),
    ("EXTRACT(year FROM 3) = 1", dpgate.UnsupportedQuery, "needs a date"),
])
def test_bad_date_input_is_refused_naming_what_to_write(where: str, err: type, words: str) -> None:
    with pytest.raises(err, match=words):
        compile_sql(f"SELECT COUNT(*) FROM ev WHERE {where}", SCHEMA)


def test_sum_of_a_date_is_refused_and_long_literals_parse_in_linear_time() -> None:
    with pytest.raises(dpgate.UnsupportedQuery, match="EXTRACT"):
        compile_sql("SELECT SUM(d) FROM ev", SCHEMA)
    with pytest.raises(dpgate.UnsupportedQuery, match="GROUP BY groups column"):
        compile_sql("SELECT COUNT(*) FROM ev GROUP BY date_trunc('month', d), EXTRACT(dow FROM d)", SCHEMA)
    text = "2024-01-01" + " " * 90_000 + "x"
    start = time.perf_counter()
    with pytest.raises(dpgate.QuerySyntaxError):
        compile_sql(f"SELECT COUNT(*) FROM ev WHERE d = '{text}'", SCHEMA)
    assert time.perf_counter() - start < 5
    assert MAX_LITERAL_CHARS <= 40


def test_from_dataframe_declares_dates_only_from_bounds_or_the_unsafe_flag() -> None:
    df = pd.DataFrame({"d": pd.to_datetime(["2024-01-05", "2024-03-01", None]), "x": [1, 2, 3]})
    with pytest.raises(dpgate.SchemaError, match="bounds=.*'2024-01-01'"):
        dpgate.Schema.from_dataframe(df, bounds={"x": (0, 5)})
    s = dpgate.Schema.from_dataframe(df, bounds={"x": (0, 5), "d": ("2024-01-01", dt.date(2024, 12, 31))})
    assert s.table("df").column("d").to_dict() == {"type": "date", "granularity": "day", "min": "2024-01-01",
                                                   "max": "2024-12-31"}
    s = dpgate.Schema.from_dataframe(df, bounds={"x": (0, 5), "d": ("2024-01-01", "2024-01-31 23:00", "hour")})
    assert s.table("df").column("d").kind == "timestamp"
    with pytest.warns(UserWarning, match="unsafe"):
        s = dpgate.Schema.from_dataframe(df, unsafe_infer_from_data=True)
    assert s.table("df").column("d").labels()[0] == dt.date(2024, 1, 5)


def test_coarse_and_merged_group_paths_agree_and_avg_works_by_month() -> None:
    """``GROUP BY date_trunc('month', ts)`` alone is compiled on month cells mapped back onto the
    declared hours; with ``ts`` also in WHERE the hours' groups are merged: the same queries."""
    for col, unit, n in (("ts", "day", 14), ("ts", "week", 3), ("d", "week", 53), ("d", "quarter", 4),
                         ("m", "quarter", 8), ("m", "year", 2), ("ts", "month", 1)):
        fast = compile_sql(f"SELECT COUNT(*) FROM ev GROUP BY date_trunc('{unit}', {col})", SCHEMA)
        slow = compile_sql(f"SELECT COUNT(*) FROM ev WHERE {col} IS NULL OR {col} IS NOT NULL "
                           f"GROUP BY date_trunc('{unit}', {col})", SCHEMA)
        assert len(fast) == len(slow) == n, (col, unit)
        assert all(np.array_equal(a.dense(T), b.dense(T)) and a.group == b.group
                   for a, b in zip(fast, slow, strict=True)), (col, unit)
    stmt = compile_statement("SELECT date_trunc('month', d) AS mon, AVG(EXTRACT(hour FROM ts)) FROM ev GROUP BY mon",
                             SCHEMA)
    assert stmt.derived and [k for (k,) in stmt.group_keys][:2] == [dt.date(2024, 1, 1), dt.date(2024, 2, 1)]
    df = frame()
    f = truncated(df)
    got = value("SELECT date_trunc('year', m) AS y, COUNT(*) FROM ev GROUP BY y", df)
    assert got == [float((f.m.dt.year == y).sum()) for y in (2023, 2024)]


def test_ledger_describes_date_cells_as_ranges_without_listing_a_wide_column() -> None:
    from dpgate.ledger._describe import describe

    (q,) = compile_sql("SELECT COUNT(*) FROM ev WHERE d BETWEEN '2024-03-01' AND '2024-03-31'", SCHEMA)
    assert describe(q, T) == "COUNT where d 2024-03-01–2024-03-31"
    (q,) = compile_sql("SELECT COUNT(*) FROM ev WHERE ts IN ('2024-03-02 10:00', '2024-03-05 00:00')", SCHEMA)
    assert describe(q, T) == "COUNT where ts ∈ {2024-03-02 10:00, 2024-03-05 00:00}"


def test_date_and_datetime_parameters_bind_as_date_literals() -> None:
    (want,) = compile_sql("SELECT COUNT(*) FROM ev WHERE d >= DATE '2024-03-01' AND ts < '2024-03-02 10:00'", SCHEMA)
    for params in ([dt.date(2024, 3, 1), dt.datetime(2024, 3, 2, 10)],
                   [dpgate.Date(2024, 3, 1), pd.Timestamp("2024-03-02 10:00")]):
        stmt = compile_statement("SELECT COUNT(*) FROM ev WHERE d >= ? AND ts < ?", SCHEMA, params=params)
        assert stmt.queries == (want,)
    with pytest.raises(dpgate.UnsupportedQuery, match="day boundary"):
        compile_statement("SELECT COUNT(*) FROM ev WHERE d >= ?", SCHEMA, params=[dt.datetime(2024, 3, 1, 10, 30)])
    with pytest.raises(dpgate.InvalidArgumentType, match="datetime.date"):
        compile_statement("SELECT COUNT(*) FROM ev WHERE d >= ?", SCHEMA, params=[object()])


def test_dbapi_rows_carry_date_keys_and_types() -> None:
    df = frame(300)
    with dpgate.connect(df, schema={"tables": {"ev": SCHEMA.to_dict()["tables"]["ev"]}},
                        budget=10.0, accuracy=50) as con:
        cur = con.cursor()
        cur.execute("SELECT date_trunc('month', d) AS mon, COUNT(*) FROM ev WHERE d >= ? GROUP BY mon",
                    [dt.date(2024, 11, 1)])
        assert [r[0] for r in cur.fetchall()] == [dt.date(2024, 11, 1), dt.date(2024, 12, 1)]
        assert cur.description[0][1] == "DATE"
        cur.execute("SELECT EXTRACT(dow FROM d) AS w, COUNT(*) FROM ev WHERE d < '2024-03-01' GROUP BY w")
        assert [r[0] for r in cur.fetchall()] == list(range(7)) and cur.description[0][1] == "BIGINT"


def test_merged_groups_beyond_the_group_limit_are_refused_naming_the_fix() -> None:
    wide = dpgate.Schema.from_dict({"tables": {"ev": {"columns": {
        "ts": {"type": "timestamp", "min": "2024-01-01 00:00", "max": "2024-12-31 23:59", "granularity": "minute"}}}}})
    with pytest.raises(dpgate.UnsupportedQuery, match="one query per period"):
        compile_sql("SELECT COUNT(*) FROM ev WHERE ts <= '2024-03-01' GROUP BY date_trunc('day', ts)", wide)
    assert len(compile_sql("SELECT COUNT(*) FROM ev GROUP BY date_trunc('day', ts)", wide)) == 366
    start = time.perf_counter()  # a condition exact on days: compiled on the days, not per minute
    assert len(compile_sql("SELECT COUNT(*) FROM ev WHERE ts >= '2024-03-01' GROUP BY date_trunc('day', ts)",
                           wide)) == 306
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("col, unit, where", [
    ("ts", "day", "ts >= '2024-03-05' AND ts < '2024-03-10'"),
    ("ts", "day", "'2024-03-05' <= ts AND '2024-03-10' > ts AND EXTRACT(dow FROM ts) <> 0"),
    ("ts", "day", "ts <= '2024-03-05'"),  # not exact on days: merged per hour
    ("ts", "day", "ts > '2024-03-05'"),
    ("ts", "day", "ts = '2024-03-05 10:00' OR ts IS NULL"),
    ("ts", "week", "ts >= '2024-03-04' AND date_trunc('day', ts) <> '2024-03-06'"),
    ("ts", "day", "ts >= '2024-03-05 10:00'"),  # off the days' boundaries: merged per hour
    ("ts", "day", "EXTRACT(hour FROM ts) < 12"),  # finer than a day: merged per hour
    ("d", "month", "d >= '2024-03-01' AND d < '2024-07-01' AND EXTRACT(quarter FROM d) = 2"),
    ("d", "month", "d BETWEEN '2024-03-01' AND '2024-06-30'"),
])
def test_group_by_date_trunc_with_conditions_on_the_column_matches_the_merged_groups(col: str, unit: str,
                                                                                     where: str) -> None:
    sql = f"SELECT date_trunc('{unit}', {col}) AS k, COUNT(*), SUM(EXTRACT(day FROM d)) FROM ev WHERE {where} GROUP BY k"
    merged = sql.replace(f"WHERE {where}", f"WHERE ({where}) AND ({col} = {col} OR {col} IS NULL)")
    got, want = compile_statement(sql, SCHEMA), compile_statement(merged, SCHEMA)
    assert got.group_keys == want.group_keys and len(got.queries) == len(want.queries) > 0
    assert all(np.array_equal(a.dense(T), b.dense(T)) for a, b in zip(got.queries, want.queries, strict=True))
