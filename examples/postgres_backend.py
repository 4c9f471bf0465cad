"""The PUMS table served from PostgreSQL: the data stays in the database.

Run:  python examples/postgres_backend.py postgresql://user@host:5432/db
      (or set DPGATE_EXAMPLE_PG_URL)

The database must hold the embedded PUMS sample (``dpgate.datasets.load_pums()``) as
table ``pums (age integer, sex text, educ smallint, race integer, income integer,
married boolean)`` — tests/system/test_examples.py loads it so with COPY.
dpgate sends PostgreSQL only SELECTs it generates from the schema, each in a READ ONLY
transaction that is rolled back; only per-cell counts come back (README "Backends").

The answers do not depend on the engine: the same data, seed and queries give the same
answers, intervals and charges on PostgreSQL as on DuckDB over the pandas frame.
``seed=`` is here only to show that; seeded noise is INSECURE — never in production.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import warnings

import psycopg

import dpgate
from dpgate.datasets import load_pums

url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DPGATE_EXAMPLE_PG_URL")
if not url:
    print(__doc__)
    print("No PostgreSQL URL given: pass one as the first argument or in DPGATE_EXAMPLE_PG_URL.")
    sys.exit(0)

warnings.simplefilter("ignore", dpgate.Warning)  # the one-time "seeded noise" warning
df, schema = load_pums()
QUERIES = ["SELECT COUNT(*) AS n FROM pums WHERE age BETWEEN 20 AND 29",
           "SELECT educ, COUNT(*) AS n FROM pums WHERE married GROUP BY educ"]


def run(data: object, **ledger: str) -> list[tuple[str, float, float, float, float]]:
    """Each query's answers as (group, value, low, high, ε) — seeded: for the comparison only."""
    with dpgate.Gateway(data, schema, budget=1.0, seed=7, **ledger) as gw:
        return [(", ".join(f"{k}={v}" for k, v in a.group) or "count", a.value, a.low, a.high, a.epsilon_spent)
                for sql in QUERIES for a in gw.query(sql, accuracy=25).answers]


on_postgres = run(url)  # a SQLAlchemy URL; an Engine or a psycopg connection work too
on_duckdb = run(df)
for group, value, low, high, eps in on_postgres[:4]:
    print(f"postgres {group:8s} {value:8.1f}  [{low:7.1f}, {high:7.1f}]  ε={eps:.4f}")
print("identical to DuckDB:", on_postgres == on_duckdb)

# A ledger in PostgreSQL, shared by gateways on several hosts; its key stays outside the
# database (a file every host has a copy of).  The example keeps it in a schema of its own
# (libpq's search_path option) and drops it at the end.
ledger_schema = "dpgate_example_" + secrets.token_hex(4)
with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as con:
    con.execute(f"CREATE SCHEMA {ledger_schema}")
try:
    sep = "&" if "?" in url else "?"
    ledger_url = f"{url}{sep}options=-csearch_path%3D{ledger_schema}"
    key = os.path.join(tempfile.mkdtemp(), "ledger.key")
    print("same answers with the ledger in PostgreSQL:", run(url, ledger=ledger_url, ledger_key=key) == on_duckdb)
    with dpgate.Gateway(url, schema, budget=1.0, ledger=ledger_url, ledger_key=key) as gw:
        print(f"ledger reopened: {len(gw.history)} releases, spent {gw.spent:.4f}")
        again = gw.query(QUERIES[0], accuracy=25).answers[0]
        print(f"asked again: {again.value:.1f} from {again.source}, ε={again.epsilon_spent}")
finally:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as con:
        con.execute(f"DROP SCHEMA {ledger_schema} CASCADE")
