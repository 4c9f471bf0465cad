"""Existing DuckDB warehouses: several tables, Parquet/CSV behind views, opened read-only, never modified."""

from __future__ import annotations

import hashlib
import os

import duckdb
import numpy as np
import pandas as pd
import pytest
import yaml

import dpgate.dbapi as dbapi
from dpgate.errors import LedgerError, UnsupportedQuery


def sha256(path: os.PathLike[str] | str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def warehouse(tmp_path, pums):
    """A warehouse file with two tables and two views over files (absolute paths), plus its schema."""
    pums_df, pums_schema = pums
    rng = np.random.default_rng(5)
    visits = pd.DataFrame({"day": rng.integers(0, 7, 400), "device": rng.choice(["web", "ios", "android"], 400)})
    orders = pd.DataFrame({"amount": rng.integers(0, 200, 300), "paid": rng.random(300) < 0.8})
    csv_path, parquet_path = tmp_path / "visits.csv", tmp_path / "orders.parquet"
    visits.to_csv(csv_path, index=False)
    path = tmp_path / "warehouse.duckdb"
    con = duckdb.connect(str(path))
    con.register("src_pums", pums_df)
    con.register("src_orders", orders)
    con.execute("CREATE TABLE pums AS SELECT * FROM src_pums")
    con.execute("CREATE SCHEMA sales")
    con.execute("CREATE TABLE sales.orders_raw AS SELECT * FROM src_orders")
    con.execute(f"COPY sales.orders_raw TO '{parquet_path}' (FORMAT parquet)")
    con.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{parquet_path}')")
    con.execute(f"CREATE VIEW visits AS SELECT * FROM read_csv('{csv_path}', header = true)")
    con.close()
    schema = {
        "tables": {
            "pums": {"columns": pums_schema.to_dict()["tables"]["pums"]["columns"]},
            "visits": {"columns": {"day": {"type": "integer", "min": 0, "max": 6},
                                   "device": {"type": "categorical", "values": ["web", "ios", "android"]}}},
            "orders": {"columns": {"amount": {"type": "integer", "min": 0, "max": 199, "bins": [0, 50, 100, 200]},
                                   "paid": {"type": "boolean"}}},
        }
    }
    schema_path = tmp_path / "schema.yaml"
    schema_path.write_text(yaml.safe_dump(schema))
    return path, schema_path, {"pums": pums_df, "visits": visits, "orders": orders}


def test_serves_tables_and_views_read_only_and_never_modifies_the_file(warehouse, tmp_path):
    path, schema_path, truth = warehouse
    before = sha256(path)
    files = set(os.listdir(tmp_path))
    ledger = tmp_path / "ledger.db"
    with dbapi.connect(str(path), schema=str(schema_path), ledger=str(ledger), budget=3.0, accuracy=15,
                       seed=0, policy="paper") as con:
        cur = con.cursor()
        cur.execute("SELECT COUNT(*) AS n FROM pums WHERE age >= 65")
        assert abs(cur.fetchone()[0] - (truth["pums"]["age"] >= 65).sum()) < 60
        cur.execute("SELECT device, COUNT(*) AS n FROM visits GROUP BY device ORDER BY device")  # CSV view
        rows = cur.fetchall()
        assert [r[0] for r in rows] == ["android", "ios", "web"]  # the declared devices, ordered
        cur.execute("SELECT COUNT(*) FILTER (WHERE paid) AS paid, COUNT(*) AS n FROM orders WHERE amount < 100")
        paid, n = cur.fetchone()  # Parquet view, binned column
        assert abs(n - (truth["orders"]["amount"] < 100).sum()) < 60
        # Another reader may open the warehouse at the same time (both read-only).
        other = duckdb.connect(str(path), read_only=True)
        assert other.execute("SELECT COUNT(*) FROM pums").fetchone() == (1000,)
        other.close()
        # Writes are refused by the compiler before anything runs ...
        for sql in ["CREATE TABLE t (a INT)", "INSERT INTO pums SELECT * FROM pums", "DROP VIEW orders",
                    "COPY pums TO 'leak.csv'", "DETACH warehouse", "CHECKPOINT", "SELECT COUNT(*) FROM sales.orders_raw"]:
            with pytest.raises(dbapi.ProgrammingError):
                cur.execute(sql)
        # ... and the file itself is open read-only underneath.
        with pytest.raises(duckdb.Error, match="(?i)read.only"):
            con.gateway._cube._backend.con.execute("CREATE TABLE t (a INT)")
        spent = con.spent
        assert 0 < spent <= 3.0
    assert sha256(path) == before
    assert {f for f in set(os.listdir(tmp_path)) - files if not f.startswith("ledger.db")} == set()
    assert not (tmp_path / "warehouse.duckdb.wal").exists()
    # The budget lives in the ledger: a new connection continues from it.
    with dbapi.connect(str(path), schema=str(schema_path), ledger=str(ledger), budget=3.0, accuracy=15) as con:
        assert con.spent == pytest.approx(spent)
        assert len(con.history) >= 4
    assert sha256(path) == before


def test_undeclared_tables_and_raw_files_are_unreachable(warehouse):
    path, schema_path, _ = warehouse
    with dbapi.connect(str(path), schema=str(schema_path), accuracy=20, seed=0) as con:
        for sql in ["SELECT COUNT(*) FROM orders_raw", "SELECT COUNT(*) FROM 'orders.parquet'",
                    "SELECT COUNT(*) FROM read_parquet('orders.parquet')", "SELECT COUNT(*) FROM duckdb_tables()"]:
            with pytest.raises(dbapi.ProgrammingError):
                con.execute(sql)
        assert con.spent == 0


def test_ledger_is_bound_to_the_warehouse_content(warehouse, tmp_path):
    path, schema_path, _ = warehouse
    ledger = str(tmp_path / "ledger.db")
    with dbapi.connect(str(path), schema=str(schema_path), ledger=ledger, accuracy=20, seed=0) as con:
        con.execute("SELECT COUNT(*) FROM pums")
    w = duckdb.connect(str(path))
    w.execute("DELETE FROM pums WHERE age = 30")
    w.close()
    with pytest.raises(LedgerError):
        dbapi.connect(str(path), schema=str(schema_path), ledger=ledger, accuracy=20)


def test_missing_file_and_missing_table_are_clear_errors(warehouse, tmp_path):
    path, schema_path, _ = warehouse
    with pytest.raises(dbapi.OperationalError, match="does not exist"):
        dbapi.connect(str(tmp_path / "nope.duckdb"), schema=str(schema_path))
    assert not (tmp_path / "nope.duckdb").exists()  # unlike sqlite3, nothing is created
    bad = yaml.safe_load(schema_path.read_text())
    bad["tables"]["customers"] = {"columns": {"x": {"type": "boolean"}}}
    with pytest.raises(dbapi.ProgrammingError, match="customers"):
        dbapi.connect(str(path), schema=bad)
    with pytest.raises(UnsupportedQuery):
        with dbapi.connect(str(path), schema=str(schema_path), accuracy=20) as con:
            con.execute("SELECT COUNT(*) FROM pums JOIN visits ON true")
