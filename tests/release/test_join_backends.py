"""Declared joins (:mod:`dpgate.release._join_sql`): each unit table bounded first, then joined.

Brute force: the join is rebuilt in pandas — the fact table bounded to ``K`` rows per unit and
the unit table to one, each by the keyed order of ``tests/release/test_bounding.py`` (MD5 of the
key and the row's declared parts; ties broken by a second MD5 that includes the join keys),
then merged — and every true count the cube computes for compiled join queries must equal its
count there, on DuckDB, PostgreSQL and Spark.  Then through the gateway: coverage of the
intervals over seeded gateways, history reuse, and the charge.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _pgserver import load_database, plain_rows

import dpgate
from dpgate.compile import compile_statement
from dpgate.release._bounding import ROW_ORDER, row_order_key
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

K = 3
START = dt.date(2024, 1, 1)
SPEC: dict[str, Any] = {"tables": {
    "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {
        "id": {"type": "key"},
        "age": {"type": "integer", "min": 0, "max": 9},
        "tier": {"type": "categorical", "values": ["gold", "silver"], "other": True},
    }},
    "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": K,
               "references": {"customer_id": "customers.id", "shop": "shops.shop"}, "columns": {
        "customer_id": {"type": "key"},
        "shop": {"type": "key"},
        "amount": {"type": "integer", "min": 0, "max": 20, "nullable": True},
        "status": {"type": "categorical", "values": ["paid", "refunded"], "other": True},
        "placed": {"type": "date", "min": "2024-01-01", "max": "2024-12-31"},
    }},
    "shops": {"public": True, "key": "shop", "columns": {
        "shop": {"type": "key"},
        "region": {"type": "categorical", "values": ["north", "south"]},
    }},
}}
SCHEMA = Schema.from_dict(SPEC)
SECRET = b"j" * 32
JOIN_CU = "FROM orders o JOIN customers c ON o.customer_id = c.id"
CORPUS = [
    f"SELECT COUNT(*) {JOIN_CU}",
    f"SELECT c.age, COUNT(*) {JOIN_CU} GROUP BY c.age",
    "SELECT region, SUM(amount) FROM orders JOIN shops ON orders.shop = shops.shop "
    "JOIN customers ON customers.id = orders.customer_id WHERE customers.age > 3 GROUP BY region",
    "SELECT s.region, COUNT(*) FROM orders JOIN shops s USING (shop) WHERE status = 'paid' GROUP BY s.region",
    f"SELECT tier, COUNT(*) FILTER (WHERE amount >= 10), SUM(o.amount) {JOIN_CU} WHERE c.tier IN ('gold', 'silver') "
    "GROUP BY tier",
    f"SELECT COUNT(*) {JOIN_CU} WHERE o.placed BETWEEN DATE '2024-03-01' AND DATE '2024-05-31' AND c.age < 5",
    f"SELECT date_trunc('month', o.placed) AS m, COUNT(*) {JOIN_CU} GROUP BY 1",
    "SELECT COUNT(DISTINCT id) FROM customers",
]


def make_data(seed: int = 0, units: int = 40) -> dict[str, pd.DataFrame]:
    """Customers (a few with two rows, ages and tiers, a few unknown), orders (1 to ~15 per
    customer, many above K, repeated rows, orders of unknown customers and shops, NULLs), shops."""
    rng = np.random.default_rng(seed)
    ids = np.arange(units)
    cust = pd.DataFrame({"id": ids, "age": rng.integers(0, 10, units),
                         "tier": rng.choice(np.array(["gold", "silver", "platinum", None], dtype=object), units)})
    twice = cust.iloc[rng.choice(units, 4, replace=False)].assign(age=lambda d: (d["age"] + 3) % 10)
    cust = pd.concat([cust.iloc[2:], twice], ignore_index=True)  # customers 0, 1: no row; 4 with two rows
    sizes = rng.geometric(0.2, units + 5)
    cid = pd.array(np.repeat(np.arange(units + 5), sizes), dtype="Int64")  # 5 unknown customers
    n = len(cid)
    cid[rng.random(n) < 0.03] = pd.NA
    amount = pd.array(rng.integers(0, 21, n), dtype="Int64")
    amount[rng.random(n) < 0.1] = pd.NA
    orders = pd.DataFrame({
        "customer_id": cid,
        "shop": rng.choice(np.array(["a", "b", "c", "zz", None], dtype=object), n, p=[0.3, 0.3, 0.3, 0.05, 0.05]),
        "amount": amount,
        "status": rng.choice(np.array(["paid", "refunded", "void", None], dtype=object), n, p=[0.5, 0.3, 0.1, 0.1]),
        "placed": [START + dt.timedelta(days=int(d)) for d in rng.integers(0, 366, n)],
    })
    dup = orders.iloc[rng.choice(n, 20)].assign(shop=lambda d: rng.choice(["a", "b"], len(d)))  # ties but the shop
    orders = pd.concat([orders, dup], ignore_index=True).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    shops = pd.DataFrame({"shop": ["a", "b", "c"], "region": ["north", "south", "north"]})
    return {"customers": cust, "orders": orders, "shops": shops}


# -- the reference: the keyed order, in plain Python -------------------------------------------
def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _text(v: Any) -> str:
    return "N" if v is None or pd.isna(v) else _md5(str(v))


def _digits(v: Any) -> str:
    return "N" if v is None or pd.isna(v) else str(int(v))


def _bounded(df: pd.DataFrame, unit: str, k: int, parts: Any, key: str, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    known = df[df[unit].notna()].copy()
    texts = [",".join([key, *parts(r)]) for r in known.itertuples(index=False)]
    known["h"] = [_md5(t) for t in texts]
    known["h2"] = [_md5(",".join([t, *(_text(getattr(r, c)) for c in keys)]))
                   for t, r in zip(texts, known.itertuples(index=False), strict=True)]
    known = known.sort_values([unit, "h", "h2"], kind="stable")
    return known[known.groupby(unit).cumcount() < k].drop(columns=["h", "h2"])


def reference_join(data: dict[str, pd.DataFrame], secret: bytes, shops: bool = True, customers: bool = True) -> pd.DataFrame:
    """The join the cube reads, built in pandas (module docstring)."""
    key = row_order_key(secret)
    orders = _bounded(data["orders"], "customer_id", K, lambda r: [
        _digits(r.amount), _text(r.status), str(min(max((r.placed - START).days, 0), 365))], key, ("shop",))
    out = orders
    if customers:
        cust = _bounded(data["customers"], "id", 1, lambda r: [_digits(r.age), _text(r.tier)], key)
        out = out.merge(cust, left_on="customer_id", right_on="id", suffixes=("", "_c"))
    if shops:
        out = out.merge(data["shops"], on="shop")
    return out


def truths(data: dict[str, pd.DataFrame], secret: bytes) -> list[list[float]]:
    """Per CORPUS statement, the true answers per group and output, in dpgate's group order."""
    j = reference_join(data, secret, shops=False)
    js = reference_join(data, secret)
    jo = reference_join(data, secret, customers=False)
    cust = _bounded(data["customers"], "id", 1, lambda r: [_digits(r.age), _text(r.tier)], row_order_key(secret))
    region_sum = js[js["age"] > 3].groupby("region")["amount"].sum()
    paid = jo[jo["status"] == "paid"].groupby("region").size()
    tiers = [j[j["tier"] == t] for t in ("gold", "silver")]
    spring = j[(j["placed"] >= dt.date(2024, 3, 1)) & (j["placed"] <= dt.date(2024, 5, 31)) & (j["age"] < 5)]
    months = pd.Series([p.month for p in j["placed"]]).value_counts()
    return [
        [len(j)],
        [int((j["age"] == a).sum()) for a in range(10)],
        [int(region_sum.get(r, 0)) for r in ("north", "south")],
        [int(paid.get(r, 0)) for r in ("north", "south")],
        [v for t in tiers for v in (int((t["amount"] >= 10).sum()), int(t["amount"].sum()))],
        [len(spring)],
        [int(months.get(m, 0)) for m in range(1, 13)],
        [len(cust)],
    ]


def cube_answers(cube: Cube) -> list[list[float]]:
    out = []
    for sql in CORPUS:
        st = compile_statement(sql, SCHEMA)
        out.append([float(v) for v in cube.true_numerators(st.queries)])
    return out


def check(cube: Cube, data: dict[str, pd.DataFrame]) -> None:
    assert cube_answers(cube) == truths(data, SECRET)


# -- DuckDB ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_duckdb_joins_the_bounded_tables(seed: int) -> None:
    data = make_data(seed)
    sizes = data["orders"].groupby("customer_id").size()
    assert sizes.max() > 2 * K and (sizes < K).any()  # the bound bites
    with Cube(data, SCHEMA, row_order=SECRET) as cube:
        check(cube, data)
        # The fact table's kept rows are those of its single-table queries: one bounded table.
        alone = cube.true_numerators(compile_statement("SELECT COUNT(*) FROM orders", SCHEMA).queries)
    assert alone == [len(_bounded(data["orders"], "customer_id", K, lambda r: [
        _digits(r.amount), _text(r.status), str((r.placed - START).days)], row_order_key(SECRET)))]


def test_the_group_keys_of_a_join_are_the_declared_ones() -> None:
    st = compile_statement(CORPUS[1], SCHEMA)
    assert st.group_keys == tuple((a,) for a in range(10)) and st.output_names == ("age", "COUNT(*)")
    st = compile_statement(f"SELECT c.age AS a, o.status, COUNT(*) {JOIN_CU} GROUP BY c.age, o.status", SCHEMA)
    assert st.output_names == ("a", "status", "COUNT(*)") and len(st.group_keys) == 10 * 3


def test_a_public_key_on_two_rows_is_refused_before_a_join_is_counted() -> None:
    data = make_data(2)
    data["shops"] = pd.DataFrame({"shop": ["a", "a", "b"], "region": ["north", "south", "south"]})
    with dpgate.Gateway(data, SCHEMA, budget=10.0, seed=1) as gw:
        with pytest.raises(dpgate.SchemaError, match="public table 'shops' declares key 'shop'.*unique"):
            gw.query("SELECT COUNT(*) FROM orders JOIN shops USING (shop)", accuracy=10)
        assert gw.spent == 0
        gw.query(f"SELECT COUNT(*) {JOIN_CU}", accuracy=10)  # a join without it is fine


# -- PostgreSQL and Spark: the same join ------------------------------------------------------
PG_TYPES = {"customers": "id integer, age integer, tier text",
            "orders": "customer_id integer, shop text, amount integer, status text, placed date",
            "shops": "shop text, region text"}
SPARK_TYPES = {"customers": "id int, age int, tier string",
               "orders": "customer_id int, shop string, amount int, status string, placed date",
               "shops": "shop string, region string"}


@pytest.fixture(scope="module")
def pg_joins(pg_server: Any) -> str:
    """``make_data(4)`` in PostgreSQL (database ``joins``)."""
    return load_database(pg_server, "joins", {name: (PG_TYPES[name], df) for name, df in make_data(4).items()})


def test_postgres_and_spark_join_the_same_rows(pg_joins: str, spark: Any) -> None:
    data = make_data(4)
    with Cube(data, SCHEMA, row_order=SECRET) as cube:
        check(cube, data)
    with Cube(pg_joins, SCHEMA, row_order=SECRET) as cube:
        check(cube, data)
    frames = {n: spark.createDataFrame(plain_rows(df), SPARK_TYPES[n]) for n, df in data.items()}
    with Cube(frames, SCHEMA, row_order=SECRET) as cube:
        check(cube, data)


# -- through the gateway -----------------------------------------------------------------------
def test_join_intervals_cover_the_bounded_truth() -> None:
    """Over 200 seeded gateways with one ledger key: the stated confidence holds for the join's truth."""
    data = make_data(8, units=12)
    secret = hmac.new(SECRET, ROW_ORDER, hashlib.sha256).digest()  # what a ledger with key SECRET derives
    j = reference_join(data, secret, shops=False)
    truth = int((j["age"] >= 5).sum())
    sql = f"SELECT COUNT(*) {JOIN_CU} WHERE c.age >= 5"
    hits, runs, conf = 0, 200, 0.8
    for seed in range(runs):
        with dpgate.Gateway(data, SCHEMA, budget=10.0, seed=seed, ledger_key=SECRET) as gw:
            a = gw.query(sql, accuracy=3, confidence=conf).answer
        hits += a.low <= truth <= a.high
    assert hits >= conf * runs - 3 * (runs * conf * (1 - conf)) ** 0.5, hits


def test_a_repeated_join_is_answered_from_history_and_charged_as_its_own_table() -> None:
    data = make_data(3)
    with dpgate.Gateway(data, SCHEMA, budget=100.0, seed=1) as gw:
        first = gw.query(f"SELECT c.age, COUNT(*) {JOIN_CU} GROUP BY c.age", accuracy=10)
        spent = gw.spent
        again = gw.query("SELECT customers.age, COUNT(*) FROM customers JOIN orders ON customers.id = "
                         "orders.customer_id GROUP BY customers.age", accuracy=10)
        assert gw.spent == spent and {a.source for a in again.answers} == {"history"}
        assert [a.value for a in again.answers] == [a.value for a in first.answers]
        # The same join over the fact table alone is another table: charged apart, added up.
        gw.query("SELECT COUNT(*) FROM orders", accuracy=10)
        alone = gw.spent - spent
    with dpgate.Gateway(data, SCHEMA, budget=100.0, seed=1) as gw:
        gw.query("SELECT COUNT(*) FROM orders", accuracy=10)
        assert gw.spent == pytest.approx(alone)
        gw.query(f"SELECT c.age, COUNT(*) {JOIN_CU} GROUP BY c.age", accuracy=10)
        assert gw.spent == pytest.approx(spent + alone)


def test_a_reopened_ledger_finds_its_joins(tmp_path: Any) -> None:
    """The join's table is named by its paths, so a new process resolves the records made on it."""
    data, path = make_data(5), str(tmp_path / "ledger.db")
    sql = f"SELECT tier, COUNT(*) {JOIN_CU} GROUP BY tier"
    with dpgate.Gateway(data, SCHEMA, budget=100.0, ledger=path) as gw:
        first = gw.query(sql, accuracy=10)
        spent = gw.spent
    with dpgate.Gateway(data, Schema.from_dict(SPEC), budget=100.0, ledger=path) as gw:
        assert gw.spent == pytest.approx(spent)
        again = gw.query(sql.replace("o JOIN customers c", "AS o INNER JOIN customers AS c"), accuracy=10)
        assert {a.source for a in again.answers} == {"history"} and gw.spent == pytest.approx(spent)
        assert [a.value for a in again.answers] == [a.value for a in first.answers]
