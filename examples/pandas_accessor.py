"""df.dp: differentially private SQL over a pandas DataFrame, with a budget that follows the people.

Run:  python examples/pandas_accessor.py
seed= makes the output reproducible and is INSECURE — never pass it in production (answers then
carry secure=False and dpgate warns once).
"""

from __future__ import annotations

import os
import tempfile

import pandas as pd

import dpgate
import dpgate.accessor  # noqa: F401 - registers df.dp (``import dpgate`` does it too)
import dpgate.datasets

raw, _ = dpgate.datasets.load_pums()
path = os.path.join(tempfile.mkdtemp(), "pums.csv")
raw.to_csv(path, index=False)


def load() -> pd.DataFrame:
    """Read the CSV; flags become bool (a public domain by type)."""
    df = pd.read_csv(path)
    df["married"] = df["married"].astype(bool)
    return df


pd.set_option("display.width", 120)
# Public domains, declared — never read from the data (a Categorical dtype's categories are not a declaration).
BOUNDS = {"age": (0, 100), "educ": (1, 16), "income": (0, 500000)}
CATEGORIES = {"sex": ["0", "1"], "race": list("123456")}

df = load()
df.dp.configure(bounds=BOUNDS, categories=CATEGORIES, budget=1.0, seed=0)
print(df.dp.query("SELECT race, COUNT(*) AS n FROM df GROUP BY race ORDER BY n DESC LIMIT 3", accuracy=15))
print(f"spent {df.dp.spent:.3f}")
# The price before paying (free): what the next query would charge and leave.
print(df.dp.explain("SELECT COUNT(*) AS n FROM df WHERE age < 30", accuracy=10)[["output", "source", "epsilon",
                                                                                 "remaining"]])

# The budget follows the people: a copy, or re-reading the same file, does not reset it.
again = load()
again.dp.configure(bounds=BOUNDS, categories=CATEGORIES, budget=1.0, seed=0)
print(f"re-read spent {again.dp.spent:.3f}; copy spent {df.copy().dp.spent:.3f}")
out = again.dp.query("SELECT COUNT(*) AS n FROM df WHERE race IN ('1', '2')", accuracy=30)
print(out, "\n(answered from history: free)")

# A frame sharing rows with a configured one (a filter, a sample, a dropped row) gets no budget of its own.
older = df[df["age"] >= 65].copy()
try:
    older.dp.query("SELECT COUNT(*) AS n FROM df", accuracy=10)
except dpgate.ProgrammingError as exc:
    print(f"refused: {str(exc)[:90]}...")
print(df.dp.query("SELECT COUNT(*) AS n FROM df WHERE age >= 65", accuracy=10))  # WHERE instead

print(df.dp.history[["id", "sql", "alpha", "value"]].tail(3).to_string())
