"""Contribution bounding (:mod:`dpgate.release._bounding`): at most ``k`` rows per privacy unit.

Brute force: the bounded table is rebuilt in pandas with the same keyed order (MD5 of the key
and the row's cells, per unit, ascending) and every count the cube returns — full histograms,
coarse grids, random weighted queries, in one statement or in batches — must equal its count
on that table, on DuckDB, PostgreSQL and Spark alike.  Real engines: the PostgreSQL server and
Spark session of ``tests/conftest.py``.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _pgserver import load_database, plain_rows

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.errors import SchemaError
from dpgate.ledger._key import read_key
from dpgate.release._bounding import ROW_ORDER, row_order_key
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

K = 3
SPEC: dict[str, Any] = {"tables": {"orders": {"privacy_unit": "uid", "max_rows_per_unit": K, "columns": {
    "amount": {"type": "integer", "min": 0, "max": 20, "nullable": True},
    "band": {"type": "numeric", "bins": [0, 1.5, 3, 10]},
    "status": {"type": "categorical", "values": ["paid", "refunded"], "other": True},
    "paid": {"type": "boolean"},
}}}}
SCHEMA = Schema.from_dict(SPEC)
T = SCHEMA.table("orders")
SECRET = b"s" * 32
PG_TYPES = "uid integer, amount integer, band double precision, status text, paid boolean"
SPARK_TYPES = "uid int, amount int, band double, status string, paid boolean"


def make_orders(seed: int = 0, units: int = 40) -> pd.DataFrame:
    """Units with 1 to ~15 rows (many above K), repeated rows within a unit, NULLs everywhere,
    a few rows of no known unit, out-of-domain values."""
    rng = np.random.default_rng(seed)
    sizes = rng.geometric(0.2, units)
    uid = np.repeat(np.arange(units), sizes).astype(object)
    n = len(uid)
    uid[rng.random(n) < 0.03] = None
    amount = pd.array(rng.integers(-2, 24, n), dtype="Int64")
    amount[rng.random(n) < 0.1] = pd.NA
    band = rng.choice([0.5, 1.5, 2.9, 7.0, 12.0, np.nan], n)
    status = rng.choice(np.array(["paid", "refunded", "void", None], dtype=object), n, p=[0.5, 0.3, 0.1, 0.1])
    paid = pd.array(rng.choice([True, False], n), dtype="boolean")
    paid[rng.random(n) < 0.1] = pd.NA
    df = pd.DataFrame({"uid": pd.array(uid, dtype="Int64"), "amount": amount, "band": band, "status": status,
                       "paid": paid})
    dup = df.iloc[rng.choice(n, 20)]  # identical rows of one unit: ties in the order
    return pd.concat([df, dup], ignore_index=True).sample(frac=1.0, random_state=seed).reset_index(drop=True)


# -- the reference: cells and the keyed order, in plain Python ------------------------------
def cells(row: Any) -> tuple[int, int, int, int]:
    amount = 21 if pd.isna(row.amount) else min(max(int(row.amount), 0), 20)
    band = 3 if pd.isna(row.band) else min(max(bisect.bisect_right([0, 1.5, 3, 10], row.band) - 1, 0), 2)
    status = 3 if pd.isna(row.status) else {"paid": 0, "refunded": 1}.get(row.status, 2)
    paid = 2 if pd.isna(row.paid) else int(bool(row.paid))
    return amount, band, status, paid


def order_of(row: Any, key: str) -> str:
    """Integers as their digits, text categories as the MD5 of their text, other columns as their cell."""
    _, b, _, p = cells(row)
    amount = "N" if pd.isna(row.amount) else str(int(row.amount))
    status = "N" if pd.isna(row.status) else hashlib.md5(row.status.encode()).hexdigest()
    return hashlib.md5(",".join([key, amount, str(b), status, str(p)]).encode()).hexdigest()


def bounded(df: pd.DataFrame, secret: bytes = SECRET, k: int = K) -> pd.DataFrame:
    """The rows a cube keyed by ``secret`` keeps: the ``k`` first of each known unit by the keyed order."""
    key = row_order_key(secret)
    known = df[df["uid"].notna()].copy()
    known["h"] = [order_of(r, key) for r in known.itertuples(index=False)]
    known = known.sort_values(["uid", "h"], kind="stable")
    return known[known.groupby("uid").cumcount() < k].drop(columns="h")


def histogram(df: pd.DataFrame) -> np.ndarray:
    out = np.zeros([c.n_cells for c in T.columns], dtype=np.int64)
    for cell, n in Counter(cells(r) for r in df.itertuples(index=False)).items():
        out[cell] += n
    return out


def random_queries(seed: int, n: int = 10) -> list[LinearQuery]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        names = list(rng.choice([c.name for c in T.columns], int(rng.integers(1, 4)), replace=False))
        bps = []
        for name in names:
            size = T.column(name).n_cells
            inner = rng.choice(np.arange(1, size), int(rng.integers(0, min(3, size - 1) + 1)), replace=False)
            bps.append([0, *sorted(int(i) for i in inner)])
        w = rng.integers(-2, 3, [len(b) for b in bps]).astype(float)
        out.append(LinearQuery.from_grid(T, names, bps, w))
    return out


def ref_numerator(q: LinearQuery, hist: np.ndarray) -> int:
    full = q.expand(T, [c.name for c in T.columns], [range(c.n_cells) for c in T.columns])
    return int(np.sum(np.asarray(full, dtype=np.int64) * hist))


def check(cube: Cube, df: pd.DataFrame, seed: int) -> np.ndarray:
    """Every way the cube counts agrees with the bounded table built in pandas."""
    want = histogram(bounded(df))
    got = cube.histogram("orders")
    assert np.array_equal(got, want)
    assert np.array_equal(cube.histogram("orders", ["status"]), want.sum(axis=(0, 1, 3)))
    assert np.array_equal(cube.histogram("orders", ["paid", "amount"], [[0, 1], [0, 5, 21]]), _coarse(want))
    qs = random_queries(seed)
    expected = [ref_numerator(q, want) for q in qs]
    assert [cube.true_numerator(q) for q in qs] == expected
    assert cube.true_numerators(qs) == expected
    return got


def _coarse(full: np.ndarray) -> np.ndarray:
    """``full`` on the grid paid ∈ {false | true, NULL} × amount ∈ {0..4 | 5..20 | NULL}."""
    pa = full.sum(axis=(1, 2)).T  # paid × amount
    by_paid = np.stack([pa[0], pa[1] + pa[2]])
    return np.stack([by_paid[:, :5].sum(axis=1), by_paid[:, 5:21].sum(axis=1), by_paid[:, 21]], axis=1)


# -- DuckDB ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_duckdb_keeps_k_rows_per_unit_by_the_keyed_order(seed: int) -> None:
    df = make_orders(seed)
    sizes = df.groupby("uid").size()
    assert sizes.max() > 2 * K and (sizes == K).any() and (sizes < K).any()  # the bound bites; the edge case
    with Cube(df, SCHEMA, row_order=SECRET) as cube:
        got = check(cube, df, seed)
    assert got.sum() == df.groupby("uid").size().clip(upper=K).sum() < df["uid"].notna().sum()


def test_the_order_is_keyed_and_stable() -> None:
    df = make_orders(2)
    with Cube(df, SCHEMA, row_order=SECRET) as a, Cube(df, SCHEMA, row_order=SECRET) as b:
        assert np.array_equal(a.histogram("orders"), b.histogram("orders"))
    with Cube(df, SCHEMA, row_order=b"another secret, another order") as c:
        other = c.histogram("orders")
    assert other.sum() == histogram(bounded(df)).sum()  # as many rows per unit, other ones
    assert not np.array_equal(other, histogram(bounded(df)))
    assert np.array_equal(other, histogram(bounded(df, b"another secret, another order")))


def test_a_row_level_table_is_not_bounded() -> None:
    df = make_orders(3)
    spec = {"tables": {"orders": {k: v for k, v in SPEC["tables"]["orders"].items()
                                  if k not in ("privacy_unit", "max_rows_per_unit")}}}
    with Cube(df.drop(columns="uid"), spec) as cube:
        assert cube.histogram("orders").sum() == len(df)


def test_a_missing_unit_column_is_refused_at_open() -> None:
    with pytest.raises(SchemaError, match="privacy_unit 'uid'.*no column of that name"):
        Cube(make_orders(0).drop(columns="uid"), SCHEMA)


# -- PostgreSQL and Spark: the same rows kept -------------------------------------------------
@pytest.fixture(scope="module")
def pg_units(pg_server: Any) -> str:
    """``make_orders(4)`` in PostgreSQL (database ``units``, table ``orders``)."""
    return load_database(pg_server, "units", {"orders": (PG_TYPES, make_orders(4))})


def test_postgres_and_spark_keep_the_same_rows(pg_units: str, spark: Any) -> None:
    df = make_orders(4)
    with Cube(df, SCHEMA, row_order=SECRET) as cube:
        duck = check(cube, df, 4)
    with Cube(pg_units, SCHEMA, row_order=SECRET) as cube:
        assert np.array_equal(check(cube, df, 4), duck)
    with Cube(spark.createDataFrame(plain_rows(df), SPARK_TYPES), SCHEMA, row_order=SECRET) as cube:
        assert np.array_equal(check(cube, df, 4), duck)


def test_gateways_with_one_ledger_key_give_the_same_answers_on_every_backend(pg_units: str, spark: Any) -> None:
    """The whole stack (fingerprint, ledger, planning, noise) on the bounded table: with the same
    ledger key and seed, DuckDB, PostgreSQL and Spark release the same numbers."""
    df = make_orders(4)
    sources = {"duckdb": df, "postgres": pg_units, "spark": spark.createDataFrame(plain_rows(df), SPARK_TYPES)}
    corpus = ["SELECT status, COUNT(*) FROM orders GROUP BY status", "SELECT COUNT(*) FROM orders WHERE amount < 5",
              "SELECT paid, SUM(amount) FROM orders WHERE band IS NOT NULL GROUP BY paid",
              "SELECT COUNT(*) FROM orders WHERE amount >= 0 AND amount <= 4"]
    out = {}
    for name, data in sources.items():
        with dpgate.Gateway(data, SCHEMA, budget=1e3, seed=3, ledger_key=SECRET) as gw:
            out[name] = [[(a.value, a.low, a.high, a.epsilon_spent, a.source) for a in gw.query(q, accuracy=5).answers]
                         for q in corpus]
    assert out["postgres"] == out["duckdb"] and out["spark"] == out["duckdb"]
    assert out["duckdb"][-1][0][-1] == "history"  # the same count, phrased differently: from history


# -- through the gateway: the ledger's key orders the rows -------------------------------------
def test_the_gateway_orders_rows_by_its_ledgers_key(tmp_path: Any) -> None:
    df = make_orders(5)
    path = str(tmp_path / "ledger.db")
    with dpgate.Gateway(df, SCHEMA, budget=1e6, ledger=path, seed=1) as gw:
        res = gw.query("SELECT status, COUNT(*) FROM orders GROUP BY status", accuracy=0.2, confidence=0.99)
        got = {dict(a.group)["status"]: a.value for a in res.answers}
        secret = read_key(path + ".key")
        assert gw._ledger.derived_key(ROW_ORDER) == hmac.new(secret, ROW_ORDER, hashlib.sha256).digest()
        secret = gw._ledger.derived_key(ROW_ORDER)
    want = bounded(df, secret)
    for status in ("paid", "refunded"):
        assert abs(got[status] - int((want["status"] == status).sum())) < 0.5
    with dpgate.Gateway(df, SCHEMA, budget=1e6, ledger=path, seed=2) as again:  # same ledger: same table
        assert np.array_equal(again._cube.histogram("orders"), histogram(want))


def test_a_unit_table_without_its_bound_is_refused_before_anything_is_read() -> None:
    spec = {"tables": {"orders": {"privacy_unit": "uid", "columns": SPEC["tables"]["orders"]["columns"]}}}
    with dpgate.Gateway(make_orders(7), spec, budget=10.0, seed=1) as gw:
        for call in (lambda: gw.query("SELECT COUNT(*) FROM orders", accuracy=10),
                     lambda: gw.explain("SELECT COUNT(*) FROM orders", accuracy=10),
                     lambda: gw.warm_start("identity", 1.0, ["status"])):
            with pytest.raises(dpgate.SchemaError, match="no max_rows_per_unit.*max_rows_per_unit: 5"):
                call()
        assert gw.spent == 0


@pytest.mark.parametrize("listed", [False, True])
def test_the_unit_column_is_never_queried_and_the_charge_is_k_times(listed: bool) -> None:
    """Whether or not the declaration lists the unit under ``columns`` (its entry is then ignored)."""
    df = make_orders(6)
    orders = SPEC["tables"]["orders"]
    uid = {"uid": {"type": "integer", "min": 0, "max": 100}} if listed else {}
    schema = {"tables": {"orders": {**orders, "columns": {**orders["columns"], **uid}}}}
    with dpgate.Gateway(df, schema, budget=100.0, seed=1) as gw:
        for sql in ("SELECT uid, COUNT(*) FROM orders GROUP BY uid", "SELECT COUNT(*) FROM orders WHERE uid = 3",
                    "SELECT SUM(uid) FROM orders"):
            with pytest.raises(dpgate.SchemaError, match="privacy unit"):
                gw.query(sql, accuracy=10)
        assert gw.spent == 0
        gw.query("SELECT COUNT(*) FROM orders WHERE paid", accuracy=10)
        unit_level = gw.spent
    row_level = {"tables": {"orders": {"columns": SPEC["tables"]["orders"]["columns"]}}}
    with dpgate.Gateway(df.drop(columns="uid"), row_level, budget=100.0, seed=1) as gw:
        gw.query("SELECT COUNT(*) FROM orders WHERE paid", accuracy=10)
        assert unit_level == pytest.approx(K * gw.spent)


def test_intervals_cover_the_bounded_truth() -> None:
    """Seeded gateways (one ledger key): the stated confidence holds for the truth of the bounded
    table, which differs from the raw table's by more than the intervals' width."""
    df = make_orders(8)
    secret = hmac.new(SECRET, ROW_ORDER, hashlib.sha256).digest()  # what a ledger with key SECRET derives
    truth = int((bounded(df, secret)["amount"].fillna(99) < 10).sum())
    raw = int((df["amount"].fillna(99) < 10).sum())
    hits, runs = 0, 120
    for seed in range(runs):
        with dpgate.Gateway(df, SCHEMA, budget=10.0, seed=seed, ledger_key=SECRET) as gw:
            a = gw.query("SELECT COUNT(*) FROM orders WHERE amount < 10", accuracy=4, confidence=0.8).answer
        assert a.high - a.low < raw - truth
        hits += a.low <= truth <= a.high
    assert hits >= 0.8 * runs - 3 * (runs * 0.8 * 0.2) ** 0.5, hits
