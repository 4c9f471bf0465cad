"""df.dp: differentially private SQL over a pandas DataFrame, with a budget that follows the data.

Run:  python examples/pandas_accessor.py
seed= makes the output reproducible and is INSECURE — never pass it in production.
"""

from __future__ import annotations

import os
import tempfile

import pandas as pd

import dpgate.accessor  # noqa: F401 - registers df.dp (``import dpgate`` does it too)
import dpgate.datasets

raw, _ = dpgate.datasets.load_pums()
path = os.path.join(tempfile.mkdtemp(), "pums.csv")
raw.to_csv(path, index=False)


def load() -> pd.DataFrame:
    """Read the CSV and declare public domains: categoricals for codes, bool for flags."""
    df = pd.read_csv(path)
    df["sex"] = df["sex"].astype(str).astype(pd.CategoricalDtype(["0", "1"]))
    df["race"] = df["race"].astype(str).astype(pd.CategoricalDtype(list("123456")))
    df["married"] = df["married"].astype(bool)
    return df


pd.set_option("display.width", 120)
BOUNDS = {"age": (0, 100), "educ": (1, 16), "income": (0, 500000)}  # public, not read from the data

df = load()
df.dp.configure(bounds=BOUNDS, budget=1.0, seed=0)
print(df.dp.query("SELECT race, COUNT(*) AS n FROM df GROUP BY race ORDER BY n DESC LIMIT 3", accuracy=15))
print(f"spent {df.dp.spent:.3f}")

# The budget follows the data: a copy, or re-reading the same file, does not reset it.
again = load()
again.dp.configure(bounds=BOUNDS, budget=1.0, seed=0)
print(f"re-read spent {again.dp.spent:.3f}; copy spent {df.copy().dp.spent:.3f}")
out = again.dp.query("SELECT COUNT(*) AS n FROM df WHERE race IN ('1', '2')", accuracy=30)
print(out, "\n(answered from history: free)")

# Different data is a different budget.
older = df[df["age"] >= 65].copy()
print(f"a derived frame starts at {older.dp.spent:.3f} — query the configured frame with WHERE instead")

print(df.dp.history[["id", "sql", "alpha", "value"]].tail(3).to_string())
