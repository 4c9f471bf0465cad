"""Quickstart: the Python API of dpgate.Gateway on the embedded PUMS sample.

Run:  python examples/quickstart.py

It shows a fresh answer, the same count asked again in other words (free), a total
implied by released parts (free), a GROUP BY charged like one query, a free
probability, a refusal when the budget cannot pay and the partial answer history
still gives, and a durable ledger that survives a restart.

``seed=`` makes the printed numbers reproducible and is INSECURE: it is recorded as
such in the ledger.  Leave it out in production (OpenDP's secure sampler is used).
"""

from __future__ import annotations

import os
import tempfile

import dpgate
from dpgate.datasets import load_pums

SEED = 0  # for reproducible output only — never in production

df, schema = load_pums()  # 1 000 rows of US Census microdata and their public schema
ledger = os.path.join(tempfile.mkdtemp(), "pums.ledger")
gw = dpgate.Gateway(df, schema, budget=1.0, ledger=ledger, seed=SEED)


def show(label: str, res: dpgate.Result) -> None:
    for a in res.answers:
        group = f" {dict(a.group)}" if a.group else ""
        print(f"{label:34s}{group} {a.value:9.1f}  [{a.low:8.1f}, {a.high:8.1f}]  "
              f"{a.source:11s} ε={a.epsilon_spent:.4f}")


# 1. A fresh answer: dpgate reads the data once and charges the smallest ε for ±25 at 95 %.
show("age 20–29", gw.query("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", accuracy=25))

# 2. The same count, phrased differently: recognised, answered from history, free.
show("same count, other words", gw.query(
    "SELECT COUNT(*) FILTER (WHERE age >= 20 AND age < 30) FROM pums", accuracy=25))

# 3. Disjoint parts released ... imply their total, which is then free.
show("age 30–49", gw.query("SELECT COUNT(*) FROM pums WHERE age >= 30 AND age < 50", accuracy=25))
show("age 20–49 (implied by the parts)", gw.query(
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 49", accuracy=45))

# 4. GROUP BY: one row per declared key, in declared order (empty groups included: keys
#    never come from the data; a NULL / <other> group only where the schema declares one);
#    the groups are disjoint, so the statement costs what one group costs.  Each interval
#    covers its true count 95 % of the time — so about one in twenty does not.
#    round=True shows integer counts (free post-processing); the keys alone are free.
res = gw.query("SELECT sex, COUNT(*) AS n FROM PUMS.pums GROUP BY sex", accuracy=30, round=True)
show("by sex", res)
print(res.to_pandas().to_string(index=False))
print("declared educ codes:", gw.query("SELECT educ FROM pums GROUP BY educ").to_pandas()["educ"].tolist())

# 5. Claims about the truth are post-processing of released answers: free.
p = gw.probability("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", low=150)
print(f"P(count of ages 20–29 ≥ 150 | history) = {p:.3f}")

# 6. A requirement the budget cannot pay is refused before any data is read ...
print(f"spent {gw.spent:.4f} of {gw.budget}, {gw.remaining:.4f} left")
try:
    gw.query("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", accuracy=2)
except dpgate.BudgetExhausted as exc:
    print("refused:", exc)
#    ... unless you accept history's best estimate with its true, wider interval.
show("age 20–29, partial", gw.query(
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", accuracy=2, allow_partial=True))

# 7. Every release is in the durable ledger; reopening restores history and budget.
print(gw.history[["id", "sql", "alpha", "value", "cost_after", "secure"]].to_string(index=False))
spent = gw.spent
gw.close()
with dpgate.Gateway(df, schema, budget=1.0, ledger=ledger, seed=SEED) as again:
    assert again.spent == spent
    show("after a restart, from history", again.query(
        "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", accuracy=25))
