"""Put dpgate in front of an existing DuckDB warehouse (tables plus Parquet/CSV views).

Run:  python examples/warehouse.py
Builds a small warehouse in a temporary directory, then serves it read-only through
``dpgate.dbapi.connect(path, schema=yaml, ledger=...)``; the file is never modified.
seed= makes the output reproducible and is INSECURE — never pass it in production.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import duckdb
import numpy as np
import pandas as pd
import yaml

import dpgate.datasets
from dpgate.dbapi import connect

tmp = tempfile.mkdtemp()
wh, csv, parquet = (os.path.join(tmp, n) for n in ("warehouse.duckdb", "visits.csv", "orders.parquet"))

# -- the warehouse some other team maintains ------------------------------------------------------------
pums, _ = dpgate.datasets.load_pums()
rng = np.random.default_rng(0)
pd.DataFrame({"day": rng.integers(0, 7, 500), "device": rng.choice(["web", "ios", "android"], 500)}).to_csv(
    csv, index=False
)
orders = pd.DataFrame({"amount": rng.integers(0, 200, 800), "paid": rng.random(800) < 0.8})
con = duckdb.connect(wh)
con.register("src_pums", pums)
con.register("src_orders", orders)
con.execute("CREATE TABLE pums AS SELECT * FROM src_pums")
con.execute(f"COPY (SELECT * FROM src_orders) TO '{parquet}' (FORMAT parquet)")
# Views must name files by absolute path: DuckDB resolves relative paths against the reader's cwd.
con.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{parquet}')")
con.execute(f"CREATE VIEW visits AS SELECT * FROM read_csv('{csv}', header = true)")
con.close()

# -- the public schema the data owner publishes ------------------------------------------------------------
schema = {"tables": {
    "pums": dpgate.datasets.schema_of("pums").to_dict()["tables"]["pums"],
    "visits": {"columns": {"day": {"type": "integer", "min": 0, "max": 6},
                           "device": {"type": "categorical", "values": ["web", "ios", "android"]}}},
    "orders": {"columns": {"amount": {"type": "integer", "min": 0, "max": 199, "bins": [0, 50, 100, 200]},
                           "paid": {"type": "boolean"}}},
}}
schema_path = os.path.join(tmp, "schema.yaml")
with open(schema_path, "w") as fh:
    yaml.safe_dump(schema, fh)

before = hashlib.sha256(open(wh, "rb").read()).hexdigest()
ledger = os.path.join(tmp, "ledger.db")
with connect(wh, schema=schema_path, ledger=ledger, budget=2.0, accuracy=20, seed=0) as db:
    cur = db.cursor()
    for sql in [
        "SELECT COUNT(*) AS over_65 FROM pums WHERE age >= 65",
        "SELECT device, COUNT(*) AS n FROM visits GROUP BY device ORDER BY n DESC",
        "SELECT paid, COUNT(*) AS n FROM orders WHERE amount >= 100 GROUP BY paid",
    ]:
        cur.execute(sql)
        print(sql, "->", [tuple(round(v, 1) if isinstance(v, float) else v for v in r) for r in cur.fetchall()])
    try:
        cur.execute("DROP TABLE pums")
    except db.NotSupportedError as exc:
        print("refused:", exc)
    print(f"spent {db.spent:.3f} of {db.budget}")

after = hashlib.sha256(open(wh, "rb").read()).hexdigest()
print("warehouse unchanged:", before == after)
with connect(wh, schema=schema_path, ledger=ledger, budget=2.0) as db:  # a later session, same ledger
    print(f"a new session sees spent {db.spent:.3f}")
