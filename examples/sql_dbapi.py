"""dpgate as a PEP 249 database: SQL in, noisy rows with honest intervals out.

Run:  python examples/sql_dbapi.py
Uses the embedded PUMS sample and a temporary ledger; seed= makes the output
reproducible and is INSECURE — never pass it in production.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import pandas as pd

import dpgate.datasets
from dpgate.dbapi import connect

df, schema = dpgate.datasets.load_pums()
ledger = os.path.join(tempfile.mkdtemp(), "ledger.db")

with connect(df, schema=schema, budget=1.0, ledger=ledger, accuracy=25, seed=0) as con:
    cur = con.cursor()

    # Connection-level accuracy (±25 at 95 %): a GROUP BY returns one row per declared key.
    cur.execute("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex")
    print([d[0] for d in cur.description], cur.fetchall())
    print(f"spent {con.spent:.3f} of {con.budget}")

    # Session settings: tighter accuracy, interval columns on.
    cur.execute("SET dpgate.accuracy = 15")
    cur.execute("SET dpgate.intervals = on")
    cur.execute("SELECT COUNT(*) AS young FROM pums WHERE age < ?", (30,))
    print(cur.fetchone())
    # psycopg-style placeholders work too; a quoted number compares as a number.
    cur.execute("SELECT COUNT(*) AS young FROM pums WHERE age < %(age)s", {"age": "30"})
    print(cur.fetchone(), "(the same query: from history)")

    # A per-statement hint beats the session; answers implied by history are free.
    cur.execute("SELECT /*+ dpgate accuracy=40 */ COUNT(*) AS women FROM pums WHERE sex = '1'")
    (a,) = cur.answers
    print(f"women ≈ {a.value:.1f} in [{a.low:.1f}, {a.high:.1f}] from {a.source}, cost {a.epsilon_spent}")

    # Anything else is refused before the data are touched.
    try:
        cur.execute("SELECT age FROM pums")
    except con.ProgrammingError as exc:
        print("refused:", exc)

    # pandas speaks DB-API too (it warns that only SQLAlchemy/sqlite3 are "tested").
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        print(pd.read_sql_query("SELECT married, COUNT(*) AS n FROM pums GROUP BY married", con))

    # Running out of budget is an OperationalError (dpgate.BudgetExhausted).
    try:
        cur.execute("SELECT COUNT(*) FROM pums WHERE educ > 12 /*+ dpgate accuracy=0.5 */")
    except con.OperationalError as exc:
        print("refused:", exc)
    print(f"spent {con.spent:.3f}; {len(con.history)} releases recorded in {ledger}")
