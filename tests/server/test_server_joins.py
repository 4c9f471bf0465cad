"""``dpgate serve`` over a warehouse of three tables: declared joins through psql (answers, EXPLAIN,
history), and every refused join refused over the wire with nothing recorded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import yaml
from _dpserve import ledger_records, psql, spawn_server, users_file

SCHEMA = {"tables": {
    "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {
        "id": {"type": "key"}, "age": {"type": "integer", "min": 0, "max": 9}}},
    "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": 4,
               "references": {"customer_id": "customers.id", "shop": "shops.code"}, "columns": {
        "customer_id": {"type": "key"}, "shop": {"type": "key"}, "amount": {"type": "integer", "min": 0, "max": 99}}},
    "shops": {"public": True, "key": "code", "columns": {
        "code": {"type": "key"}, "region": {"type": "categorical", "values": ["n", "s"]}}},
}}
JOIN = "FROM orders o JOIN customers c ON o.customer_id = c.id"


def _serve(tmp: Path) -> tuple[subprocess.Popen[str], int]:
    rng = np.random.default_rng(0)
    n = 600
    frames = {"customers": pd.DataFrame({"id": np.arange(50), "age": rng.integers(0, 10, 50)}),
              "orders": pd.DataFrame({"customer_id": rng.integers(0, 50, n), "shop": rng.choice(["a", "b"], n),
                                      "amount": rng.integers(0, 100, n)}),
              "shops": pd.DataFrame({"code": ["a", "b"], "region": ["n", "s"]})}
    db = tmp / "shop.duckdb"
    con = duckdb.connect(str(db))
    for name, df in frames.items():
        con.register("frame", df)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM frame")
        con.unregister("frame")
    con.close()
    (tmp / "shop.yaml").write_text(yaml.safe_dump(SCHEMA))
    users_file(tmp, {"alice": 5.0})
    return spawn_server(tmp, budget=5.0, data=db, schema=tmp / "shop.yaml")


def test_joins_over_the_wire(tmp_path: Path) -> None:
    proc, port = _serve(tmp_path)
    try:
        refused = {
            "SELECT COUNT(*) FROM orders o LEFT JOIN customers c ON o.customer_id = c.id": "outer join",
            "SELECT COUNT(*) FROM orders, customers": "comma or CROSS JOIN",
            "SELECT COUNT(*) FROM orders o JOIN orders p ON o.customer_id = p.customer_id": "self-join",
            "SELECT COUNT(*) FROM orders o JOIN customers c ON o.amount = c.age": "not a declared join path",
            f"SELECT COUNT(DISTINCT o.customer_id) {JOIN}": "counts people",
            "SELECT COUNT(*) FROM shops": "is public",
        }
        for sql, message in refused.items():
            out = psql(port, sql)
            assert out.returncode != 0 and message in out.stderr, out
        assert not (tmp_path / "ledger.db").exists() or ledger_records(tmp_path) == 0  # refusals record nothing
        out = psql(port, f"EXPLAIN SELECT c.age, COUNT(*) {JOIN} GROUP BY c.age")
        assert out.returncode == 0 and out.stdout.count("\n") >= 9, out
        assert not (tmp_path / "ledger.db").exists() or ledger_records(tmp_path) == 0  # EXPLAIN is free
        sql = "SELECT region, COUNT(*) FROM orders JOIN shops ON orders.shop = shops.code GROUP BY region"
        first = psql(port, sql)
        assert first.returncode == 0, first.stderr
        rows = [line.split("|") for line in first.stdout.strip().splitlines()]
        assert [r[0] for r in rows] == ["n", "s"] and abs(sum(float(r[1]) for r in rows) - 50 * 4) < 80  # 4 orders of each of 50 count, not 600
        made = ledger_records(tmp_path)
        again = psql(port, sql.replace("orders.shop = shops.code", "shops.code = orders.shop"))
        assert again.returncode == 0 and again.stdout == first.stdout and ledger_records(tmp_path) == made  # history
    finally:
        proc.terminate()
        proc.wait(timeout=30)
