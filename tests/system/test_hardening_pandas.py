"""Issue 13, findings 2–4: the pandas path reads no domain from the data, its budget follows
people rather than frames, and seeded noise neither travels to derived frames nor passes as secure.

Each test but ``test_schema_path_still_works`` and ``test_disjoint_rows_are_other_people`` (which
guard against over-refusing) failed on the starting commit (722f926), checked by running this
file against it; the findings 3 and 4 tests configure through ``schema=``, which
that commit had, so they fail there on the bug itself:

* finding 2 — ``configure`` accepted a Categorical built by ``astype("category")`` and
  ``GROUP BY zip`` returned the key that exists only because one person is in the data;
  ``Schema.from_dataframe`` took the categories silently (no ``categories=`` parameter);
* finding 3 — a dropped, duplicated or sampled row, or the same rows under another table
  name, got a fresh budget, and an unconfigured frame silently got budget 1.0;
* finding 4 — ``configure(seed=0)`` was written to ``df.attrs`` and inherited by
  ``df.drop(index=17)``, whose answer had the same noise; ``Answer`` had no ``secure``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd
import pytest

import dpgate
import dpgate.accessor as accessor
import dpgate.datasets
from dpgate import _rowhash
from dpgate.errors import ProgrammingError, SchemaError

BOUNDS = {"age": (0, 100), "educ": (1, 16), "income": (0, 500000)}
CATEGORIES = {"sex": ["0", "1"], "race": ["1", "2", "3", "4", "5", "6"]}
SCHEMA = dpgate.datasets.load_pums()[1]  # table "pums"
Q = "SELECT COUNT(*) AS n FROM pums WHERE age < 40"


pytestmark = pytest.mark.usefixtures("fresh_registry")


@pytest.fixture
def pums() -> pd.DataFrame:
    return dpgate.datasets.load_pums()[0]


def configure(df: pd.DataFrame, **kw) -> None:
    df.dp.configure(schema=SCHEMA, **kw)


# -- finding 2: domains from declarations only -----------------------------------------------------
def test_inferred_categorical_is_refused_with_how_to_declare_it(pums):
    df = pums.assign(zip=["10001"] * 999 + ["99999"])  # one person alone in zip 99999
    df["zip"] = df["zip"].astype("category")  # categories read from the data
    df[["sex", "race"]] = df[["sex", "race"]].astype(str).astype("category")
    # The starting commit took all three as declared; now an undeclared column is not part of the
    # schema (issue 32), and a query using one is refused naming it and how to declare it.
    df.dp.configure(bounds={**BOUNDS, "married": (0, 1)}, categories=CATEGORIES)
    for sql in ("SELECT zip, COUNT(*) AS n FROM df GROUP BY zip", "SELECT COUNT(*) FROM df WHERE zip = '99999'"):
        with pytest.raises(SchemaError) as exc:
            df.dp.query(sql, accuracy=20)
        msg = str(exc.value)
        assert "'zip'" in msg and "Categorical" in msg and "df.dp.configure(categories={'zip': [" in msg
        assert "10001" not in msg and "99999" not in msg  # the refusal names no value
    assert df.dp.spent == 0 and len(df.dp.history) == 0
    with pytest.raises(SchemaError, match="categories=") as exc:
        dpgate.Schema.from_dataframe(df[["zip", "sex"]])
    assert "'zip'" in str(exc.value) and "'sex'" in str(exc.value)  # every undeclared column in one error


def test_declared_categories_are_the_domain_not_the_datas(pums):
    df = pums.assign(zip=pd.Categorical(["10001"] * 999 + ["99999"]))
    df.dp.configure(bounds={**BOUNDS, "married": (0, 1)}, categories={**CATEGORIES, "zip": ["10001", "10002"]})
    out = df.dp.query("SELECT zip, COUNT(*) AS n FROM df GROUP BY zip", accuracy=20)
    assert out["zip"].tolist() == ["10001", "10002"]  # 99999 is not a key
    t = dpgate.Schema.from_dataframe(df[["zip", "age"]], categories={"zip": ["a", "b"]}, bounds={"age": (0, 9)})
    assert t.table("df").column("zip").values == ("a", "b")


def test_unsafe_opt_in_still_reads_categories_with_a_warning(pums):
    df = pums[["sex"]].astype(str).astype("category")
    with pytest.warns(UserWarning, match="unsafe_infer_from_data"):
        schema = dpgate.Schema.from_dataframe(df, unsafe_infer_from_data=True)
    assert schema.table("df").column("sex").values == ("0", "1")


def test_schema_path_still_works(pums):
    schema = {"tables": {"people": {"columns": {
        "age": {"type": "integer", "min": 0, "max": 100},
        "sex": {"type": "categorical", "values": ["0", "1"]},
    }}}}
    df = pums.assign(sex=pums["sex"].astype(str).astype("category"))
    df.dp.configure(schema=schema)
    assert len(df.dp.query("SELECT sex, COUNT(*) FROM people GROUP BY sex", accuracy=30)) == 2
    assert df.dp.query("SELECT sex, COUNT(*) AS n FROM people GROUP BY sex", accuracy=31)["n_source"].eq("history").all()


# -- finding 3: the budget follows people ---------------------------------------------------------
NEAR_COPIES = {
    "dropped row": lambda df: df.drop(index=17),
    "duplicated row": lambda df: pd.concat([df, df.iloc[[3]]]),
    "sample 0.999": lambda df: df.sample(frac=0.999, random_state=1),
    "one edited value": lambda df: df.assign(age=np.where(df.index == 5, (df["age"] + 1) % 100, df["age"])),
    "filter": lambda df: df[df["age"] >= 30],
}


@pytest.mark.parametrize("derive", NEAR_COPIES.values(), ids=list(NEAR_COPIES))
def test_near_copies_get_no_fresh_budget(pums, derive):
    configure(pums, budget=0.3)
    pums.dp.query(Q, accuracy=12)
    derived = derive(pums)
    with pytest.raises(ProgrammingError, match="shares rows") as exc:
        derived.dp.query(Q, accuracy=12)
    assert "WHERE" in str(exc.value)
    with pytest.raises(ProgrammingError, match="shares rows"):
        configure(derived, budget=0.3)
    with pytest.raises(ProgrammingError, match="shares rows"):
        configure(derived.copy(), budget=50.0)


def test_same_rows_share_one_budget_whatever_the_frame(pums):
    configure(pums, budget=1.0)
    pums.dp.query(Q, accuracy=12)
    spent = pums.dp.spent
    for same in (pums.assign(unused=1), pums[["age", "sex"]], pums.iloc[::-1].reset_index(drop=True)):
        assert same.dp.gateway is pums.dp.gateway and same.dp.spent == spent
    # A projection onto columns the configured frame did not declare is the same people too.
    with pytest.raises(ProgrammingError, match="another schema"):
        pums[["race"]].dp.configure(categories={"race": CATEGORIES["race"]})


def test_reconfiguring_under_another_name_or_budget_never_resets(pums):
    configure(pums, budget=0.3)
    pums.dp.query(Q, accuracy=12)
    spent = pums.dp.spent
    renamed = {"tables": {"people": SCHEMA.to_dict()["tables"]["pums"]}}
    with pytest.raises(ProgrammingError, match="another schema"):
        pums.copy().dp.configure(schema=renamed, budget=0.3)
    with pytest.raises(ProgrammingError, match="budget=0.3 \\(asked 5.0\\)"):
        configure(pums.copy(), budget=5.0)
    assert pums.dp.spent == spent and pums.dp.budget == 0.3


def test_unconfigured_frame_is_refused_not_given_a_budget():
    df = pd.DataFrame({"flag": [True, False, True]})
    with pytest.raises(ProgrammingError, match=r"df\.dp\.configure\("):
        df.dp.query("SELECT COUNT(*) FROM df", accuracy=5)
    with pytest.raises(ProgrammingError, match="configure"):
        _ = df.dp.spent


def test_disjoint_rows_are_other_people(pums):
    unique = pums.drop_duplicates()
    first, rest = unique.iloc[:400].copy(), unique.iloc[400:].copy()
    configure(first, budget=1.0)
    first.dp.query(Q, accuracy=12)
    configure(rest, budget=1.0)
    assert rest.dp.spent == 0 and rest.dp.gateway is not first.dp.gateway


def test_row_hashes_are_keyed_and_dtype_blind(pums):
    a = pd.DataFrame({"x": [1, 2, None], "c": pd.Categorical(["u", "v", "u"])})
    b = pd.DataFrame({"x": pd.array([1, 2, None], dtype="Int64"), "c": ["u", "v", "u"]}, index=[7, 8, 9])
    assert accessor.content_fingerprint(a) == accessor.content_fingerprint(b)
    # Keyed: what pandas computes without the process's secret is not what the registry holds.
    plain = np.sort(pd.util.hash_pandas_object(pd.DataFrame({"x": [1.0, 2.0, np.nan]}), index=False).to_numpy())
    keyed = _rowhash.hashed({"x": np.array([1.0, 2.0, np.nan])})
    assert not np.array_equal(plain, keyed)
    # Integer codes declared as categories match their string form.
    ints = pums.assign(sex=pums["sex"].astype(int))
    strs = pums.assign(sex=pums["sex"].astype(str).astype("category"))
    ints.dp.configure(bounds={**BOUNDS, "married": (0, 1)}, categories=CATEGORIES)
    assert strs.dp.gateway is ints.dp.gateway


def test_a_million_rows_are_recognised_quickly():
    rng = np.random.default_rng(0)
    n = 1_000_000
    big = pd.DataFrame({"a": rng.integers(0, 100, n), "c": rng.choice(list("abcdef"), n)})
    big.dp.configure(categories={"c": list("abcdef")}, bounds={"a": (0, 99)})
    start = time.perf_counter()
    assert big.copy().dp.gateway is big.dp.gateway
    with pytest.raises(ProgrammingError, match="shares rows"):
        _ = big.iloc[1:].dp.gateway
    assert time.perf_counter() - start < 10  # ~1 s on one idle core


# -- finding 4: seeds stay with their gateway and are flagged -----------------------------------------
def test_seed_is_not_inherited_by_derived_frames(pums):
    configure(pums, seed=0)
    assert "dpgate" not in pums.attrs and "seed" not in repr(pums.attrs)
    derived = pums.drop(index=17)
    assert "seed" not in repr(derived.attrs)
    with pytest.raises(ProgrammingError):
        derived.dp.query(Q, accuracy=12)  # no inherited budget, no inherited seed


def test_answers_say_whether_their_noise_was_secure(pums):
    df, schema = dpgate.datasets.load_pums()
    with dpgate.Gateway(df, schema, seed=0) as gw:
        with pytest.warns(dpgate.Warning, match="seed"):
            fresh = gw.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=10).answer
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once per gateway
            again = gw.query("SELECT COUNT(*) FROM pums WHERE age >= 40", accuracy=10).answer
            free = gw.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=12).answer
        assert (fresh.source, again.source, free.source) == ("fresh", "fresh", "history")
        assert not fresh.secure and not again.secure and not free.secure
        est = gw.estimate("SELECT COUNT(*) FROM pums WHERE age < 30", method="pca", a=np.inf)
        assert not any(a.secure for a in est.answers)
    with dpgate.Gateway(df, schema) as gw:
        with warnings.catch_warnings():
            warnings.simplefilter("error", dpgate.Warning)  # secure noise never warns
            res = gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=20)
        assert all(a.secure for a in res.answers)
        assert res.to_pandas().filter(like="_secure").all().all()
        assert gw.query("SELECT COUNT(*) FROM pums WHERE sex = '1'", accuracy=25).answer.secure  # history


def test_to_pandas_shows_insecure_answers(pums):
    configure(pums, seed=0)
    with pytest.warns(dpgate.Warning):
        out = pums.dp.query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", accuracy=15)
    assert list(out.columns) == ["sex", "n", "n_low", "n_high", "n_secure", "n_source"]
    assert not out["n_secure"].any()
