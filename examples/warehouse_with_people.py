"""A warehouse with people: many rows per person, several tables, timestamps (nycflights13).

Run:  python examples/warehouse_with_people.py

The embedded ``flights`` data set (CC0; dpgate/data/README.md) has every flight that left New
York City in 2013 (336 776 rows) and the planes that flew them.  A plane (``tailnum``) stands in
for a person: the guarantee protects everything one plane contributes, not one row.

* ``flights``: unit-level, ``privacy_unit: tailnum``, ``max_rows_per_unit: 250``: at most 250
  flights of each plane count (the rest are dropped by a keyed hash of the row, the same in every
  statement), and every charge is multiplied by 250;
* ``planes``: unit-level, one row per plane;
* ``airlines``, ``airports``: public dimensions (``public: true``, with a ``key``); joins with
  them are lookups along the declared ``references`` (section 10).

``seed=`` makes the output reproducible and is INSECURE — never pass it in production.
"""

from __future__ import annotations

import os
import tempfile

import dpgate
from dpgate import datasets

SEED = 0  # for reproducible output only — never in production

schema = datasets.schema_of("flights")
for t in schema.tables:  # the guarantee, table by table
    if t.links.public:
        said = f"public dimension (key {t.links.key}): no one's data"
    else:
        said = f"unit-level: privacy unit {t.privacy_unit}, at most {t.max_rows_per_unit} row(s) each"
    print(f"{t.name:9s} {said}")

warehouse = datasets.connect_duckdb("flights")  # four tables in DuckDB, as a warehouse would hold them
ledger = os.path.join(tempfile.mkdtemp(), "flights.ledger")
gw = dpgate.Gateway(warehouse, schema, budget=5.0, ledger=ledger, seed=SEED)  # ε per plane, for all time


def show(label: str, res: dpgate.Result, limit: int = 4) -> None:
    for a in res.answers[:limit]:
        group = ", ".join(f"{k}" for _, k in a.group)
        print(f"  {label:24s} {group:20s} {a.value:9.1f}  [{a.low:9.1f}, {a.high:9.1f}]  {a.source:8s}"
              f" ε={a.epsilon_spent:.4f}")
    if len(res.answers) > limit:
        print(f"  … {len(res.answers) - limit} more groups")


# 1. Flights per month: a timestamp truncated to its month, one group per declared month.
print("\n1. flights per month (±1500 at 95 %)")
month = "SELECT date_trunc('month', time_hour) AS month, COUNT(*) AS n FROM flights GROUP BY month"
show("per month", gw.query(month, accuracy=1500))

# 2. Delays by carrier: a WHERE on an integer column, GROUP BY a declared categorical.
print("\n2. departures more than 15 minutes late, by carrier (±800)")
show("late by carrier", gw.query(
    "SELECT carrier, COUNT(*) AS late FROM flights WHERE dep_delay > 15 GROUP BY carrier", accuracy=800))

# 3. A range over dates: the third quarter is the sum of three released months: free.
print("\n3. a range of dates, implied by the months already released")
show("Jul–Sep", gw.query("SELECT COUNT(*) FROM flights WHERE time_hour BETWEEN DATE '2013-07-01' "
                         "AND TIMESTAMP '2013-09-30 23:00'", accuracy=3000))

# 4. The same question again: answered from history, free.
print("\n4. the monthly counts again")
again = gw.query(month, accuracy=1500)
show("per month, again", again, limit=2)
print(f"  monthly counts again: ε={again.epsilon_spent}")

# 5. EXPLAIN: what a question would cost, naming the unit and the bound, before anything is read.
print("\n5. EXPLAIN")
quote = gw.explain("SELECT origin, COUNT(*) FROM flights WHERE arr_delay > 60 GROUP BY origin", accuracy=500)
print(" ", quote)
print("  note:", quote.rows()[-1][-1])

# 6. The budget is per plane: every plane's privacy loss, over every answer ever given, is at most
#    gw.spent.  The same answer on a table declared one row per person would cost 250 times less —
#    and protect each plane 250 times less.
print(f"\n6. spent ε = {gw.spent:.4f} of {gw.budget} per plane; {gw.remaining:.4f} left")
per_row = schema.to_dict()
per_row["tables"]["flights"]["max_rows_per_unit"] = 1
with dpgate.Gateway(warehouse, per_row, budget=5.0, seed=SEED) as naive:
    sql = "SELECT origin, COUNT(*) FROM flights WHERE arr_delay > 60 GROUP BY origin"
    print(f"  the same quote with one row per plane: ε = {naive.explain(sql, accuracy=500).epsilon:.5f}"
          f" instead of {quote.epsilon:.5f}")

print("\n7. what the bound does")
# 7. What the bound does to the truth.  nycflights13 is public, so we may look at the distribution of
#    flights per plane that chose K (in a real warehouse, choose K from public knowledge): planes with
#    more than K flights lose the rest, so counts are about the bounded table, a little low.
sizes = warehouse.execute("SELECT COUNT(*) FROM flights WHERE tailnum IS NOT NULL GROUP BY tailnum").fetchall()
n = [s for (s,) in sizes]
for k in (50, 250, 400):
    kept = sum(min(x, k) for x in n) / sum(n)
    print(f"  K = {k:3d}: keeps {kept:6.1%} of the flights; every charge ×{k}")
print("  without a unit, a plane with 575 flights in a table declared 'one row per person' would be\n"
      "  protected 575 times less than stated; with privacy_unit it counts at most K times.")

# 8. planes: one row per plane.
print("\n8. planes by number of engines (±40)")
show("planes", gw.query("SELECT engines, COUNT(*) FROM planes GROUP BY engines", accuracy=40))

# 9. Synthetic rows would not tie a plane's flights together: refused, with what to do instead.
try:
    gw.synthesize("flights", rows=100)
except dpgate.NotSupportedError as exc:
    print("\n9. synthesize refused:", exc)


# 10. Declared joins: flights × planes along ``references: {tailnum: planes.tailnum}`` (a plane's
# flights, at most 250, each with its one planes row), and lookups in the public dimensions.
print("\n10. joins along the declared references")
show("by manufacturer", gw.query(
    "SELECT p.manufacturer, COUNT(*) FROM flights f JOIN planes p ON f.tailnum = p.tailnum "
    "GROUP BY p.manufacturer", accuracy=2000))
show("late, by engines", gw.query(
    "SELECT p.engines, COUNT(*) FROM flights f JOIN planes p ON f.tailnum = p.tailnum "
    "WHERE f.dep_delay > 60 GROUP BY p.engines", accuracy=1500))
show("by airline name", gw.query(
    "SELECT a.name, COUNT(*) FROM flights f JOIN airlines a USING (carrier) GROUP BY a.name", accuracy=2000))
try:  # not a declared path: refused before anything is read
    gw.query("SELECT COUNT(*) FROM flights f JOIN airports a ON f.carrier = a.faa", accuracy=2000)
except dpgate.Error as exc:
    print("  undeclared join refused:", str(exc)[:100], "…")

print(f"\nreleases recorded: {len(gw.ledger.records())}; spent ε = {gw.spent:.4f} of {gw.budget}")
gw.close()
warehouse.close()
