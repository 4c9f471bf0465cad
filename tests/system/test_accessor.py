"""The pandas accessor ``df.dp``: schema from dtypes, queries, and a budget that follows the data."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

import dpgate.accessor as accessor
from dpgate.answer.result import Result
from dpgate.errors import BudgetExhausted, LedgerError, ProgrammingError, SchemaError

BOUNDS = {"age": (0, 100), "educ": (1, 16), "income": (0, 500000)}
CATEGORIES = {"sex": ["0", "1"], "race": ["1", "2", "3", "4", "5", "6"]}
SEX = pd.CategoricalDtype(["0", "1"])
RACE = pd.CategoricalDtype(["1", "2", "3", "4", "5", "6"])
Q = "SELECT sex, COUNT(*) AS n FROM df GROUP BY sex"


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """PUMS as an analyst would type it: categoricals for codes, bool for married."""
    out = df.copy()
    out["sex"] = out["sex"].astype(str).astype(SEX)
    out["race"] = out["race"].astype(str).astype(RACE)
    out["married"] = out["married"].astype(bool)
    return out


pytestmark = pytest.mark.usefixtures("fresh_registry")


@pytest.fixture
def pums_frame(pums) -> pd.DataFrame:
    """A fresh copy of PUMS per test (``prepare`` copies): tests configure and mutate it."""
    return prepare(pums[0])


@pytest.fixture
def csv_path(tmp_path, pums):
    """PUMS as the CSV file it ships as (plain codes, no categoricals)."""
    path = tmp_path / "pums.csv"
    pums[0].to_csv(path, index=False)
    return path


def configure(df: pd.DataFrame, **kw) -> None:
    kw.setdefault("seed", 0)
    df.dp.configure(bounds=BOUNDS, categories=CATEGORIES, **kw)


def test_registered_and_query_shape(pums_frame):
    assert hasattr(pd.DataFrame, "dp")
    configure(pums_frame, budget=1.0)
    out = pums_frame.dp.query(Q, accuracy=15, confidence=0.9)
    assert list(out.columns) == ["sex", "n", "n_low", "n_high", "n_secure", "n_source"]
    assert not out["n_secure"].any()  # seeded noise
    assert out["sex"].tolist() == ["0", "1"]  # the declared keys only
    assert (out["n_source"] == "fresh").all()
    assert (out["n_high"] - out["n"] <= 15 * (1 + 1e-6) + 0.01).all()
    true = pums_frame["sex"].value_counts()
    assert abs(out["n"][0] - true["0"]) < 60
    assert 0 < pums_frame.dp.spent <= 1.0 and pums_frame.dp.remaining == pytest.approx(1.0 - pums_frame.dp.spent)
    assert pums_frame.dp.budget == 1.0 and len(pums_frame.dp.history) == 2
    # The group sex = 1 asked again (looser, at the same confidence: its interval's level holds): free.
    res = pums_frame.dp.result("SELECT COUNT(*) FROM df WHERE sex = '1'", accuracy=20, confidence=0.9)
    assert isinstance(res, Result) and res.answer.source == "history"  # free: implied by the histogram
    assert pums_frame.dp.query("/*+ dpgate accuracy=20 */ SELECT COUNT(*) AS n FROM df", intervals=False).columns.tolist() == ["n"]


def test_schema_from_categoricals_and_bounds(pums_frame):
    with pytest.raises(SchemaError, match="bounds"):
        pums_frame.dp.configure()  # numeric columns need public bounds
    with pytest.raises(ProgrammingError, match="configure"):
        pums_frame.dp.query(Q, accuracy=10)  # unconfigured: refused, never a silent default budget
    only_codes = pums_frame[["sex", "race", "married"]]
    only_codes.dp.configure(categories=CATEGORIES, seed=0, nullable=["married"], other=["race"])
    out = only_codes.dp.query("SELECT married, COUNT(*) AS n FROM df GROUP BY married", accuracy=20)
    assert out["married"].tolist()[:2] == [False, True] and pd.isna(out["married"].iloc[2])  # declared nullable
    assert str(out["married"].dtype) == "boolean"
    races = only_codes.dp.query("SELECT race FROM df GROUP BY race")  # keys only: free
    assert races["race"].tolist() == [*CATEGORIES["race"], "<other>"]
    # The same people under a second schema would get a second budget: refused (a new process may).
    with pytest.raises(ProgrammingError, match="another schema"):
        pums_frame.dp.configure(bounds=BOUNDS, categories=CATEGORIES)
    accessor._forget_all()
    schema = {"tables": {"people": {"columns": {"age": {"type": "integer", "min": 0, "max": 100}}}}}
    pums_frame.dp.configure(schema=schema, seed=0)
    assert len(pums_frame.dp.query("SELECT COUNT(*) AS n FROM people WHERE age < 30", accuracy=20)) == 1
    with pytest.raises(SchemaError, match="differs"):
        pums_frame.dp.configure(schema=schema, name="df")
    with pytest.raises(SchemaError):
        pums_frame.dp.configure(name="t", bounds={"nope": (0, 1)})


def test_copy_shares_budget(pums_frame):
    configure(pums_frame, budget=1.0)
    pums_frame.dp.query(Q, accuracy=10)
    spent = pums_frame.dp.spent
    twin = pums_frame.copy()
    assert twin.dp.spent == spent  # not configured: adopts the configuration of equal content
    assert twin.dp.gateway is pums_frame.dp.gateway
    configure(twin, budget=1.0)  # configured identically: same budget, not a fresh one
    again = twin.dp.query(Q, accuracy=11)
    assert (again["n_source"] == "history").all() and twin.dp.spent == spent
    shuffled = pums_frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    assert shuffled.dp.spent == spent


def test_reread_of_same_file_shares_budget(csv_path):
    first = prepare(pd.read_csv(csv_path))
    configure(first, budget=1.0)
    first.dp.query(Q, accuracy=10)
    spent = first.dp.spent
    second = prepare(pd.read_csv(csv_path))  # another object, another dtype history (int64, not Int64)
    configure(second, budget=1.0)
    assert second.dp.spent == spent
    assert (second.dp.query(Q, accuracy=11)["n_source"] == "history").all()


def test_new_accessor_on_equal_content_shares_budget(pums_frame):
    configure(pums_frame, budget=1.0)
    pums_frame.dp.query(Q, accuracy=10)
    rebuilt = pd.DataFrame({c: list(pums_frame[c]) for c in pums_frame.columns})  # fresh object, fresh accessor
    for c in ("sex", "race"):
        rebuilt[c] = rebuilt[c].astype(pums_frame[c].dtype)
    assert rebuilt.dp is not pums_frame.dp
    assert rebuilt.dp.spent == pums_frame.dp.spent > 0


def test_overlapping_content_is_refused_disjoint_content_gets_a_fresh_budget(pums_frame):
    unique = pums_frame.drop_duplicates()  # PUMS has equal rows; they would be shared by both halves
    first, rest = unique.iloc[:500].copy(), unique.iloc[500:].copy()
    configure(first, budget=1.0)
    first.dp.query(Q, accuracy=10)
    configure(rest, budget=1.0)  # no shared row: other people
    assert rest.dp.spent == 0
    with pytest.raises(ProgrammingError, match="shares rows"):
        configure(first.iloc[1:].copy(), budget=1.0)
    changed = first.copy()
    changed.loc[0, "age"] = (changed.loc[0, "age"] + 1) % 100
    with pytest.raises(ProgrammingError, match="shares rows"):
        configure(changed, budget=1.0)
    # Editing a configured frame in place makes it other rows on the same people: refused.
    spent = first.dp.spent
    first.loc[1, "educ"] = 1 + first.loc[1, "educ"] % 16
    with pytest.raises(ProgrammingError, match="shares rows"):
        _ = first.dp.spent
    first.loc[1, "educ"] = 1 + (first.loc[1, "educ"] - 2) % 16  # back to the original content
    assert first.dp.spent == spent


def test_reconfiguring_live_data_with_other_settings_is_refused(pums_frame):
    configure(pums_frame, budget=1.0)
    pums_frame.dp.query(Q, accuracy=10)
    with pytest.raises(ProgrammingError, match="budget=1.0 \\(asked 5.0\\)"):
        configure(pums_frame.copy(), budget=5.0)
    with pytest.raises(ProgrammingError, match="ledger"):
        configure(pums_frame.copy(), budget=1.0, ledger="elsewhere.db")
    configure(pums_frame.copy(), budget=1.0, policy="paper")  # the policy is per query, not per budget


def test_ledger_path_persists_budget_across_processes(tmp_path, csv_path):
    ledger = tmp_path / "budget.db"
    df = prepare(pd.read_csv(csv_path))
    configure(df, budget=1.0, ledger=ledger)
    df.dp.query(Q, accuracy=10)
    spent = df.dp.spent
    accessor._forget_all()  # as if Python restarted: the ledger is all that remains
    script = textwrap.dedent(
        f"""
        import sys, pandas as pd
        sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        import dpgate.accessor
        from test_accessor import prepare, BOUNDS, CATEGORIES
        df = prepare(pd.read_csv({str(csv_path)!r}))
        df.dp.configure(bounds=BOUNDS, categories=CATEGORIES, budget=1.0, ledger={str(ledger)!r}, seed=0)
        out = df.dp.query({Q!r}, accuracy=11)
        print(repr(df.dp.spent), ",".join(out["n_source"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    child_spent, sources = proc.stdout.split()
    assert float(child_spent) == pytest.approx(spent)
    assert sources == "history,history"
    # The same ledger refuses other data (in a new process: within this one, overlap is refused first).
    accessor._forget_all()
    with pytest.raises(LedgerError):
        configure(df.iloc[5:].copy(), budget=1.0, ledger=ledger)


def test_budget_exhausted(pums_frame):
    configure(pums_frame, budget=0.05)
    with pytest.raises(BudgetExhausted):
        pums_frame.dp.query(Q, accuracy=5)
    assert pums_frame.dp.spent == 0
    out = pums_frame.dp.query(Q, accuracy=5, allow_partial=True)
    assert (out["n_source"] == "unavailable").all() and out["n"].isna().all()


def test_fingerprint_normalises_dtypes_not_values():
    a = pd.DataFrame({"x": [1, 2, None], "c": pd.Categorical(["u", "v", "u"])})
    b = pd.DataFrame({"x": pd.array([1, 2, None], dtype="Int64"), "c": ["u", "v", "u"]}, index=[7, 8, 9])
    assert accessor.content_fingerprint(a) == accessor.content_fingerprint(b)
    assert accessor.content_fingerprint(a) == accessor.content_fingerprint(a.iloc[::-1])
    assert accessor.content_fingerprint(a) != accessor.content_fingerprint(a.assign(x=[1, 3, None]))
    assert accessor.content_fingerprint(a) != accessor.content_fingerprint(a.rename(columns={"x": "y"}))
    assert accessor.content_fingerprint(a, ["c"]) == accessor.content_fingerprint(b.assign(x=0), ["c"])
    assert accessor.content_fingerprint(pd.DataFrame({"x": np.arange(3)})) != accessor.content_fingerprint(
        pd.DataFrame({"x": np.arange(4)})
    )
