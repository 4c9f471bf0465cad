"""The cube: exact counts from generated SQL, checked against a plain-Python row mapping."""

from __future__ import annotations

import bisect
import hashlib
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest
from sqlglot import exp

from dpgate.backends import _duckdb as _duckdb_backend
from dpgate.compile.query import LinearQuery
from dpgate.errors import OperationalError, SchemaError
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

SCHEMA = Schema.from_dict(
    {
        "tables": {
            "t": {
                "columns": {
                    "age": {"type": "integer", "min": 0, "max": 9},
                    "sex": {"type": "categorical", "values": ["0", "1", "2.5", "01", "a"]},
                    "city": {"type": "categorical", "values": ["x", "y z", "O'Hare"]},
                    "inc": {"type": "integer", "min": 0, "max": 1000, "bins": [0, 10, 100.5, 500, 1001]},
                    "flag": {"type": "boolean"},
                    "Weird Name": {"type": "integer", "min": -2, "max": 2},
                }
            },
            "u": {"columns": {"k": {"type": "categorical", "values": ["1", "2"]}}},
        }
    }
)
T = SCHEMA.table("t")


# -- an independent, row-by-row reference mapping (plain Python, no SQL) ----------
def _is_null(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _to_float(v: Any) -> float | None:
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        return None if math.isnan(f) else f
    return float(v)


def ref_cell(col: Any, v: Any) -> int:
    if _is_null(v):
        return col.null_cell
    if col.kind == "integer":
        f = _to_float(v)
        if f is None:
            return col.null_cell
        return int(min(max(f, col.min), col.max) // 1) - col.min
    if col.kind == "binned":
        f = _to_float(v)
        if f is None:
            return col.null_cell
        k = len(col.edges) - 1
        return min(max(bisect.bisect_right(col.edges, f) - 1, 0), k - 1)
    if col.kind == "categorical":
        if isinstance(v, (bool, np.bool_)):
            s = "true" if v else "false"
        elif isinstance(v, (int, np.integer)):
            s = str(int(v))
        elif isinstance(v, (float, np.floating)):
            s = str(int(v)) if float(v).is_integer() else repr(float(v))
        else:
            s = str(v)
        return col.values.index(s) if s in col.values else col.other_cell
    # boolean
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "t", "1"):
            return 1
        if low in ("false", "f", "0"):
            return 0
        f = _to_float(v)
        return int(f is not None and f != 0)
    return int(bool(v != 0))


def ref_cells(table: Any, df: pd.DataFrame) -> np.ndarray:
    return np.array(
        [[ref_cell(c, v) for c, v in zip(table.columns, row, strict=True)] for row in df[[c.name for c in table.columns]].itertuples(index=False)],
        dtype=np.int64,
    ).reshape(len(df), len(table.columns))


def ref_histogram(table: Any, df: pd.DataFrame) -> np.ndarray:
    out = np.zeros([c.n_cells for c in table.columns], dtype=np.int64)
    for cell, n in Counter(map(tuple, ref_cells(table, df))).items():
        out[cell] += n
    return out


def ref_numerator(q: LinearQuery, table: Any, df: pd.DataFrame) -> int:
    full = q.expand(table, [c.name for c in table.columns], [range(c.n_cells) for c in table.columns])
    return sum(int(full[tuple(c)]) for c in ref_cells(table, df))


# -- data -------------------------------------------------------------------------
def make_frame(seed: int, n: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(-3, 14, n).astype(float) + rng.choice([0, 0.5], n)
    age[rng.random(n) < 0.1] = np.nan
    age[rng.random(n) < 0.02] = np.inf
    sex = pd.array(rng.choice([0, 1, 2, 1], n), dtype="Int64")
    sex[rng.random(n) < 0.1] = pd.NA
    city = rng.choice(np.array(["x", "y z", "O'Hare", "X", "elsewhere"], dtype=object), n)
    city[rng.random(n) < 0.1] = None
    inc = rng.integers(-50, 1500, n).astype(float)
    inc[rng.random(n) < 0.1] = np.nan
    inc[:4] = [10, 100.5, 100.49, 1000.99]
    flag = rng.choice([0, 1, 2], n).astype(float)
    flag[rng.random(n) < 0.1] = np.nan
    weird = rng.integers(-4, 5, n)
    return pd.DataFrame(
        {"age": age, "sex": sex, "city": city, "inc": inc, "flag": flag, "Weird Name": weird,
         "pid": np.arange(n)}
    )


U = pd.DataFrame({"k": ["1", "2", "2", None, "3"]})


def random_queries(seed: int, k: int = 12) -> list[LinearQuery]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        ncol = int(rng.integers(0, 4))
        names = list(rng.choice([c.name for c in T.columns], ncol, replace=False))
        bps = []
        for nme in names:
            n = T.column(nme).n_cells
            inner = rng.choice(np.arange(1, n), int(rng.integers(0, min(4, n - 1) + 1)), replace=False)
            bps.append([0, *sorted(int(i) for i in inner)])
        shape = [len(b) for b in bps]
        w = rng.integers(-2, 3, shape) if rng.random() < 0.5 else (rng.random(shape) < 0.3).astype(int)
        out.append(LinearQuery.from_grid(T, names, bps, np.asarray(w, dtype=float) / rng.choice([1, 4])))
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_db(path: Path, frames: dict[str, pd.DataFrame]) -> None:
    con = duckdb.connect(str(path))
    for name, df in frames.items():
        con.register("src", df)
        con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM src')
        con.unregister("src")
    con.close()


def check_cube(cube: Cube, df: pd.DataFrame, seed: int) -> None:
    assert np.array_equal(cube.histogram("t", [c.name for c in T.columns]), ref_histogram(T, df))
    qs = random_queries(seed)
    want = [ref_numerator(q, T, df) for q in qs]
    assert [cube.true_numerator(q) for q in qs] == want
    assert cube.true_numerators(qs) == want
    # Coarse grids (CASE over ranges) agree with sums of the full histogram.
    full = ref_histogram(T, df)
    h = cube.histogram("t", ["inc", "age"], [[0, 2], [0, 3, 7, 10]])
    ref = np.add.reduceat(np.add.reduceat(full.sum(axis=(1, 2, 4, 5)).T, [0, 2], axis=0), [0, 3, 7, 10], axis=1)
    assert np.array_equal(h, ref)


# -- sources ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dataframe_source_matches_reference(seed: int) -> None:
    df = make_frame(seed)
    with Cube(df, Schema((T,))) as cube:
        check_cube(cube, df, seed)


def test_dict_source_and_second_table() -> None:
    df = make_frame(3)
    with Cube({"t": df, "u": U}, SCHEMA) as cube:
        check_cube(cube, df, 3)
        assert cube.histogram("u").tolist() == [1, 2, 1, 1]  # "1", "2", other ("3"), NULL
        q = LinearQuery.from_grid(SCHEMA.table("u"), ["k"], [[0, 1, 2]], np.array([1.0, 5.0, 0.0]))
        assert cube.true_numerators([q, random_queries(3)[0]])[0] == 1 + 5 * 2


def test_duckdb_file_read_only_and_unchanged(tmp_path: Path) -> None:
    df = make_frame(4)
    path = tmp_path / "d.duckdb"
    write_db(path, {"t": df, "u": U})
    before = sha(path)
    with Cube(path, SCHEMA) as cube:
        check_cube(cube, df, 4)
        cube.fingerprint()
    with Cube(str(path), SCHEMA) as cube:
        with pytest.raises(duckdb.Error):
            cube._backend.con.execute("CREATE TABLE x (a INT)")  # the connection is read-only
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.duckdb"]


def test_connection_source_is_left_open() -> None:
    df = make_frame(5)
    con = duckdb.connect()
    con.register("src", df)
    con.execute('CREATE TABLE "T" AS SELECT * FROM src')  # case-insensitive binding
    con.execute("CREATE TABLE u AS SELECT * FROM U")
    with Cube(con, SCHEMA) as cube:
        check_cube(cube, df, 5)
    assert con.execute("SELECT 1").fetchall() == [(1,)]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_parquet_and_csv_views_in_a_file(tmp_path: Path, fmt: str) -> None:
    df = make_frame(6)
    con = duckdb.connect(str(tmp_path / "v.duckdb"))
    con.register("src", df)
    con.execute("CREATE TABLE u AS SELECT * FROM U")
    data = tmp_path / f"t.{fmt}"
    if fmt == "parquet":
        con.execute(f"COPY src TO '{data}' (FORMAT parquet)")
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{data}')")
        back = df
    else:
        df.to_csv(data, index=False)
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_csv('{data}')")
        back = con.execute("SELECT * FROM t").df()  # as DuckDB typed the CSV
    con.close()
    with Cube(tmp_path / "v.duckdb", SCHEMA) as cube:
        check_cube(cube, back, 6)


def test_text_and_native_nan_columns() -> None:
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t AS SELECT * FROM (VALUES "
        "('3', 'NaN'::DOUBLE, 'true', 'x', 1::DOUBLE, '1'), ('abc', 2.5, 'no', 'y z', 0, NULL),"
        "('2.7', 1.0, '0', NULL, 'NaN'::DOUBLE, '-7'), (NULL, -1e300, 'f', 'x', 1e300, '2'),"
        "('-1e5', 'inf'::DOUBLE, '5', 'O''Hare', -0.0, '2.0')) "
        'AS v(age, sex, flag, city, inc, "Weird Name")'
    )
    df = con.execute("SELECT * FROM t").df()
    # DuckDB's NaN is not a NULL in the raw frame; the reference treats it as NULL like the cube.
    with Cube(con, Schema((T,))) as cube:
        got = cube.histogram("t", [c.name for c in T.columns])
    assert np.array_equal(got, ref_histogram(T, df))
    cells = ref_cells(T, df)
    assert cells[:, 0].tolist() == [3, 10, 2, 10, 0]  # '3', unparseable → NULL, 2.7 → 2, NULL, clamp
    assert cells[:, 1].tolist() == [6, 2, 1, 5, 5]  # NaN → NULL, 2.5 → "2.5", 1.0 → "1", other
    assert cells[:, 3].tolist() == [0, 0, 4, 3, 0]  # bins; NaN → NULL; 1e300 → last bin
    assert cells[:, 4].tolist() == [1, 0, 0, 0, 1]  # 'true', 'no', '0', 'f', '5'


# -- only generated SQL, and none at construction -----------------------------------------
def test_spy_only_generated_sql_and_no_data_query_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    executed: list[exp.Expression] = []
    described: list[exp.Expression] = []
    real_exec, real_catalog = Cube._execute, _duckdb_backend.information_schema_catalog

    def spy_exec(self: Cube, e: exp.Expression, **kw: Any) -> Any:
        assert isinstance(e, exp.Expression)
        executed.append(e)
        return real_exec(self, e, **kw)

    def spy_catalog(describe: Any, tables: Any) -> Any:
        def spy_desc(e: exp.Expression) -> Any:
            assert isinstance(e, exp.Expression)
            described.append(e)
            return describe(e)

        return real_catalog(spy_desc, tables)

    monkeypatch.setattr(Cube, "_execute", spy_exec)
    monkeypatch.setattr(_duckdb_backend, "information_schema_catalog", spy_catalog)
    df = make_frame(7)
    cube = Cube({"t": df, "u": U}, SCHEMA)
    assert executed == []
    for e in described:
        tables = {t.name.lower() for t in e.find_all(exp.Table)}
        assert tables <= {"columns"}, e.sql()
    qs = random_queries(7)
    cube.true_numerators(qs)
    cube.histogram("t")
    cube.fingerprint()
    assert executed
    declared = {c.name for c in T.columns} | {"k"}
    for e in executed:
        assert isinstance(e, exp.Select)
        # pid never read; other names are the statement's own aliases (a subquery's counts)
        aliases = {a.alias for a in e.find_all(exp.Alias)}
        assert {c.name for c in e.find_all(exp.Column)} <= declared | aliases, e.sql()
        assert {t.name for t in e.find_all(exp.Table)} <= {"t", "u"}
        # Round-trips: what ran is what sqlglot generated.
        assert exp.maybe_parse(e.sql("duckdb"), dialect="duckdb").sql("duckdb") == e.sql("duckdb")
    cube.close()
    with pytest.raises(OperationalError):
        cube.histogram("t")


def test_simple_count_is_one_pushed_down_where() -> None:
    df = make_frame(8)
    seen: list[str] = []
    with Cube(df, Schema((T,))) as cube:
        real = cube._execute
        cube._execute = lambda e, **kw: (seen.append(e.sql("duckdb")), real(e, **kw))[1]  # type: ignore[method-assign]
        q = LinearQuery.from_grid(T, ["age", "sex"], [[0, 2, 5], [0, 1, 2]], np.array([[0, 0, 0], [0, 1.0, 0], [0, 0, 0]]))
        assert cube.true_numerator(q) == ref_numerator(q, T, df)
    assert len(seen) == 1
    assert seen[0].startswith("SELECT COUNT(*) FROM") and " WHERE " in seen[0] and "FILTER" not in seen[0]


# -- errors and fingerprint ---------------------------------------------------------------
def test_missing_tables_and_columns_are_named(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"tables \['u'\]"):
        Cube({"t": make_frame(0)}, SCHEMA)
    with pytest.raises(SchemaError, match=r"columns \['t.flag', 't.Weird Name'\]"):
        Cube(make_frame(0).drop(columns=["flag", "Weird Name"]), Schema((T,)))
    with pytest.raises(SchemaError, match="one-table schema"):
        Cube(make_frame(0), SCHEMA)
    with pytest.raises(OperationalError, match="does not exist"):
        Cube(tmp_path / "nope.duckdb", SCHEMA)
    with pytest.raises(TypeError):
        Cube(42, SCHEMA)


def test_fingerprint_dataframe() -> None:
    df = make_frame(9)
    fp = Cube(df, Schema((T,))).fingerprint()
    assert Cube(df.copy(), Schema((T,))).fingerprint() == fp
    assert Cube(df.sample(frac=1, random_state=1), Schema((T,))).fingerprint() == fp  # row order
    assert Cube(df.assign(pid=-1), Schema((T,))).fingerprint() == fp  # undeclared column
    other = df.copy()
    other.loc[5, "age"] = 3.0 if other.loc[5, "age"] != 3.0 else 4.0
    assert Cube(other, Schema((T,))).fingerprint() != fp
    assert Cube(df.iloc[:-1], Schema((T,))).fingerprint() != fp


def test_fingerprint_duckdb_file(tmp_path: Path) -> None:
    df = make_frame(10)
    write_db(tmp_path / "a.duckdb", {"t": df, "u": U})
    shutil.copy(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    other = df.copy()
    other.loc[7, "city"] = "x" if other.loc[7, "city"] != "x" else "y z"
    write_db(tmp_path / "c.duckdb", {"t": other, "u": U})
    fps = [Cube(tmp_path / f"{n}.duckdb", SCHEMA).fingerprint() for n in "abc"]
    assert fps[0] == fps[1] != fps[2]
    # A re-written copy of the same data, in another file, gives the same fingerprint.
    write_db(tmp_path / "d.duckdb", {"t": df, "u": U})
    assert Cube(tmp_path / "d.duckdb", SCHEMA).fingerprint() == fps[0]


def test_concurrent_use_is_serialised() -> None:
    from concurrent.futures import ThreadPoolExecutor

    df = make_frame(11)
    qs = random_queries(11)
    want = [ref_numerator(q, T, df) for q in qs]
    with Cube(df, Schema((T,))) as cube, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: cube.true_numerators(qs), range(8)))
    assert all(g == want for g in got)


@pytest.mark.parametrize(
    "knobs",
    [
        {},  # filtered counts
        {"_MAX_FILTER_LEAVES": 0},  # every query via a histogram on the union grid
        {"_MAX_FILTER_LEAVES": 0, "_MAX_BATCH_GRID": 0},  # each query on its own grid
        {"_MAX_BATCH_TERMS": 0},  # batch via the union grid
        {"_CASE_SLABS": 1},  # slabs grouped by cell index and reduced in numpy
    ],
)
def test_every_strategy_is_exact(monkeypatch: pytest.MonkeyPatch, knobs: dict[str, int]) -> None:
    import dpgate.release.cube as cube_mod

    for k, v in knobs.items():
        monkeypatch.setattr(cube_mod, k, v)
    df = make_frame(12)
    qs = random_queries(12, k=25)
    # A GROUP BY-shaped batch: one query per age cell, restricted to city 'x'.
    age = T.column("age")
    for a in range(age.n_cells):
        w = np.zeros((age.n_cells, 2))
        w[a, 0] = 1
        qs.append(LinearQuery.from_grid(T, ["age", "city"], [list(range(age.n_cells)), [0, 1]], w))
    want = [ref_numerator(q, T, df) for q in qs]
    with Cube(df, Schema((T,))) as cube:
        assert cube.true_numerators(qs) == want
        assert [cube.true_numerator(q) for q in qs[:25]] == want[:25]
        assert np.array_equal(cube.histogram("t"), ref_histogram(T, df))
        assert np.array_equal(
            cube.histogram("t", ["inc", "age"], [[0, 2], [0, 3, 7, 10]]),
            np.add.reduceat(np.add.reduceat(ref_histogram(T, df).sum(axis=(1, 2, 4, 5)).T, [0, 2], axis=0), [0, 3, 7, 10], axis=1),
        )


WIDE = Schema.from_dict({"tables": {"w": {"columns": {
    "v": {"type": "integer", "min": 0, "max": 300},
    "g": {"type": "categorical", "values": ["a", "b", "c"]},
    "n": {"type": "integer", "min": 0, "max": 4},
}}}})


def test_wide_queries_are_exact_on_occupied_boxes() -> None:
    """Queries with more weights than a batch of filtered counts (``SUM(v)`` over a wide column,
    grouped, filtered, with coarse slabs elsewhere, or weights near int64's end) are summed over
    the engine's occupied boxes (``Cube._numerators_on_rows``): the same integers as row by row."""
    table = WIDE.table("w")
    rng = np.random.default_rng(5)
    n = 400
    v = rng.integers(-20, 330, n).astype(float)
    v[rng.random(n) < 0.1] = np.nan
    g = rng.choice(np.array(["a", "b", "c", "d", None], dtype=object), n)
    df = pd.DataFrame({"v": v, "g": g, "n": rng.integers(0, 5, n)})
    cells = table.column("v").n_cells
    values = np.append(np.arange(cells - 1), 0.0)  # SUM(v): each cell's value, 0 on NULL
    qs = []
    for group in range(table.column("g").n_cells):  # SUM(v) … GROUP BY g
        w = np.zeros((cells, table.column("g").n_cells))
        w[:, group] = values
        qs.append(LinearQuery.from_grid(table, ["v", "g"], [list(range(cells)), list(range(w.shape[1]))], w))
    w = np.where(np.arange(cells) >= 40, values - 150, 0.0)[:, None] * np.array([[1.0, 0.0]])  # WHERE v >= 40 AND n < 2
    qs.append(LinearQuery.from_grid(table, ["v", "n"], [list(range(cells)), [0, 2]], w))
    qs.append(LinearQuery.from_grid(table, ["v"], [list(range(cells))], rng.integers(-3, 90, cells) / 4))
    qs.append(LinearQuery.from_grid(table, ["v"], [list(range(cells))], values * 2.0**46))  # Σ beyond int64's exact range
    qs.append(LinearQuery.from_grid(table, ["g"], [[0, 1]], np.array([1.0, 0.0])))  # a narrow one in the batch
    want = [ref_numerator(q, table, df) for q in qs]
    with Cube(df, WIDE) as cube:
        assert cube.true_numerators(qs) == want
        assert [cube.true_numerator(q) for q in qs] == want
