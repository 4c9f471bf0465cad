"""Averages, spreads and quotes: AVG / STDDEV on the embedded PUMS sample, priced first.

Run:  python examples/averages_and_quotes.py

``gw.explain`` quotes a statement — per output: free or fresh, the ε it would charge,
the budget left after it — without reading data or spending anything; the query then
charges exactly the quote.  AVG and STDDEV are answered from the COUNT and SUMs they are
made of, so ``accuracy`` is in *rows* (README "AVG, VAR and STDDEV"): at accuracy=10 the
mean age on 1 000 rows comes out within about ±0.5 years.

``seed=`` makes the printed numbers reproducible and is INSECURE (recorded as such);
leave it out in production.
"""

from __future__ import annotations

import warnings

import dpgate
from dpgate.datasets import load_pums

warnings.simplefilter("ignore", dpgate.Warning)  # the one-time "seeded noise" warning
df, schema = load_pums()  # 1 000 rows of US Census microdata and their public schema
gw = dpgate.Gateway(df, schema, budget=3.0, seed=0)  # seed: reproducible output only

# 1. A price before paying: reads no data, spends nothing.
SQL = "SELECT AVG(age) AS mean_age, STDDEV(age) AS sd FROM pums"
quote = gw.explain(SQL, accuracy=10)
print(quote.to_pandas()[["output", "source", "epsilon", "remaining"]].to_string(index=False))
print(f"quoted ε = {quote.epsilon:.4f}; spent so far {gw.spent:.4f}")

# 2. The query charges exactly the quote.  Each interval is a 95 % Bonferroni box over the
#    components (COUNT, SUM(age − 50), SUM((age − 50)²)), clipped to the declared range.
before = gw.spent
res = gw.query(SQL, accuracy=10)
for a in res.answers:
    print(f"{a.label:9s} {a.value:7.2f}  [{a.low:6.2f}, {a.high:6.2f}]  {a.source}")
charged = gw.spent - before
print(f"charged ε = {charged:.4f}; charge equals quote: {abs(charged - quote.epsilon) < 1e-9}")

# 3. Asked again: every component is in history, so the answer is free.
again = gw.query("SELECT AVG(age) FROM pums", accuracy=10).answers[0]
print(f"AVG(age) again: {again.value:.2f} from {again.source}, ε={again.epsilon_spent}")

# 4. A mean per declared group: one row per sex (keys come from the schema, not the data).
#    accuracy=10 is ±10 rows on each component; income's range is wide, so the half-width
#    in dollars is larger.  ORDER BY sorts the released values (free post-processing).
res = gw.query("SELECT sex, AVG(income) AS mean_income FROM pums GROUP BY sex ORDER BY mean_income DESC",
               accuracy=10)
print(res.to_pandas()[["sex", "mean_income", "mean_income_low", "mean_income_high"]].round(0).to_string(index=False))

# 5. round=True rounds counts to integers (free post-processing of the same release).
counts = gw.query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", accuracy=30, round=True)
print(counts.to_pandas()[["sex", "n", "n_low", "n_high", "n_source"]].to_string(index=False))

# 6. The declared keys alone are public: listing them reads nothing and costs nothing.
before = gw.spent
educ = gw.query("SELECT educ FROM pums GROUP BY educ").to_pandas()["educ"].tolist()
print(f"declared educ codes: {educ}; cost {gw.spent - before}")

# 7. What left the gateway: one history row per release, with what it measured.
print(gw.history[["id", "measured", "cost_after"]].to_string(index=False))
print(f"spent {gw.spent:.4f} of {gw.budget}")
