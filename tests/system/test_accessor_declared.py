"""Issue 32, ``df.dp``: declare only the columns you use, every missing declaration in one
error, and ``df.dp.explain``.

On the starting commit (526d05a) the README's own example failed on the PUMS frame (every
column had to be declared, one missing column reported at a time), and there was no
``df.dp.explain``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpgate
import dpgate.accessor as accessor
import dpgate.datasets
from dpgate.errors import InvalidArgumentType, LedgerError, SchemaError
from dpgate.schema.tables import MAX_DECLARED_VALUES

README = Path(__file__).parents[2] / "README.md"

pytestmark = pytest.mark.usefixtures("fresh_registry")


@pytest.fixture
def pums() -> pd.DataFrame:
    return dpgate.datasets.load_pums()[0]


def _readme_pandas_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("### pandas", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _spent_nothing(df: pd.DataFrame) -> None:
    assert df.dp.spent == 0 and len(df.dp.history) == 0


# -- 1. declare only what you use -----------------------------------------------------------------
def test_the_readmes_example_runs_on_pums() -> None:
    block = _readme_pandas_block()
    assert 'configure(categories={"sex": ["0", "1"]}, bounds={"age": (0, 100)}' in block
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    df = scope["df"]
    assert isinstance(df, pd.DataFrame) and list(df.columns) == ["age", "sex", "educ", "race", "income", "married"]
    (table,) = df.dp.gateway.schema.tables
    assert [c.name for c in table.columns] == ["age", "sex"]  # only the declared columns
    assert 0 < df.dp.spent <= 1.0
    out = df.dp.query("SELECT sex, COUNT(*) AS n FROM df WHERE age < 30 GROUP BY sex", accuracy=10)
    assert out["sex"].tolist() == ["0", "1"]


def test_a_query_using_an_undeclared_column_is_refused_naming_it(pums) -> None:
    pums.dp.configure(categories={"sex": ["0", "1"]}, bounds={"age": (0, 100)}, budget=1.0)
    calls = {
        "query": lambda sql: pums.dp.query(sql, accuracy=10),
        "explain": lambda sql: pums.dp.explain(sql, accuracy=10),
        "probability": lambda sql: pums.dp.probability(sql, 0, 10),
    }
    for name, call in calls.items():
        with pytest.raises(SchemaError) as exc:
            call("SELECT COUNT(*) AS n FROM df WHERE educ > 12 AND age < 30")
        msg = str(exc.value)
        assert "'educ'" in msg and "bounds={'educ': (min, max)}" in msg and "categories={'educ'" in msg, name
        assert "did not declare" in msg and "nothing was read or spent" in msg
        assert "'age'" not in msg.split("\n- ", 1)[1]  # hints for the undeclared columns only
    with pytest.raises(SchemaError) as exc:  # every undeclared column of the query, in one error
        pums.dp.query("SELECT race, COUNT(*) FROM df WHERE income > 0 GROUP BY race", accuracy=10)
    assert "['race', 'income']" in str(exc.value) and str(exc.value).count("\n- ") == 2
    _spent_nothing(pums)
    with pytest.raises(SchemaError, match="'nope' is not declared"):  # not a frame column: the gateway's message
        pums.dp.query("SELECT COUNT(*) FROM df WHERE nope = 1", accuracy=10)


def test_undeclared_columns_are_not_read_and_not_handed_to_the_gateway(pums) -> None:
    n = len(pums)
    # Values no domain and no engine could take: lists, lone surrogates, arbitrary objects.
    hostile = pums.assign(junk=[[1, 2]] * n, text=["\udcff"] * n, obj=[object()] * n)
    hostile.dp.configure(categories={"sex": ["0", "1"]}, bounds={"age": (0, 100)}, budget=1.0)
    out = hostile.dp.query("SELECT COUNT(*) AS n FROM df WHERE age < 30", accuracy=10)
    assert out["n_source"].tolist() == ["fresh"]
    with pytest.raises(SchemaError, match="'text'"):
        hostile.dp.query("SELECT COUNT(*) FROM df WHERE text = 'a'", accuracy=10)


def test_the_ledger_fingerprint_covers_the_declared_columns_only(pums, tmp_path) -> None:
    ledger = tmp_path / "l.db"
    declare = {"categories": {"sex": ["0", "1"]}, "bounds": {"age": (0, 100)}, "budget": 1.0, "ledger": ledger}
    pums.dp.configure(**declare)
    pums.dp.query("SELECT COUNT(*) FROM df WHERE age < 30", accuracy=10)
    spent = pums.dp.spent
    accessor._forget_all()  # as a new process would
    other_undeclared = pums.assign(educ=pums["educ"][::-1].to_numpy(), income=0).drop(columns="race")
    other_undeclared.dp.configure(**declare)  # same declared data: the same ledger
    assert other_undeclared.dp.spent == pytest.approx(spent)
    accessor._forget_all()
    with pytest.raises(LedgerError):  # a declared column changed: other data
        pums.assign(age=np.minimum(pums["age"] + 1, 100)).dp.configure(**declare)


def test_bool_columns_are_declared_by_type_and_nothing_declared_is_refused() -> None:
    df = pd.DataFrame({"flag": [True, False] * 100, "x": list(range(200)), "c": ["a", "b"] * 100})
    with pytest.raises(SchemaError, match="declares no column") as exc:
        df.dp.configure()
    assert "categories={'col'" in str(exc.value) and "['flag', 'x', 'c']" in str(exc.value)
    df.dp.configure(categories={"c": ["a", "b"]}, nullable=["flag"], seed=0)
    with pytest.warns(dpgate.Warning, match="seed"):
        out = df.dp.query("SELECT flag, COUNT(*) AS n FROM df GROUP BY flag", accuracy=30)
    assert len(out) == 3  # False, True, NULL (nullable)
    with pytest.raises(SchemaError, match="'x'"):
        df.dp.query("SELECT COUNT(*) FROM df WHERE x < 5", accuracy=30)


# -- 2. every problem in one error ------------------------------------------------------------------
def test_every_declaration_problem_is_reported_in_one_error(pums) -> None:
    with pytest.raises(SchemaError) as exc:
        pums.dp.configure(
            categories={"sex": ["0", "1"], "race": "123456", "zip": ["1"]},
            bounds={"age": (0, float("inf")), "educ": (16, 1), "income": (float("nan"), 9), "sex": (0, 1)},
            nullable=["married", "ghost"],
        )
    msg = str(exc.value)
    problems = msg.split("\n- ")[1:]
    assert msg.startswith(f"{len(problems)} problems") and len(problems) == 8, msg
    for expected in ("['zip']",                                   # not in the frame
                     "['sex'] are declared both",                 # twice
                     "categories={'race': ...} must be a list",   # a string is not a list of values
                     "bounds={'age': ...} must be (min, max) as finite whole numbers",
                     "bounds={'income': ...} must be (min, max)",
                     "bounds={'educ': (16, 1)}: min is above max; write (1, 16)",
                     "nullable= names columns not in the DataFrame: ['ghost']",
                     "nullable= names columns that are not declared: ['married']"):
        assert expected in msg, expected
    with pytest.raises(SchemaError) as exc:  # one problem: the message itself
        pums.dp.configure(bounds={"age": (0, 100)}, other=["sex"])
    assert str(exc.value).startswith("other= names columns that are not declared: ['sex']")
    with pytest.raises(SchemaError) as exc:  # Schema.from_dataframe (every column needed): all of them at once
        dpgate.Schema.from_dataframe(pums, bounds={"age": (0, 100)})
    assert all(f"'{c}'" in str(exc.value) for c in ("sex", "educ", "race", "income", "married"))
    with pytest.raises(dpgate.ProgrammingError, match="no dpgate budget"):
        _ = pums.dp.spent  # nothing was configured


# -- 3. df.dp.explain ---------------------------------------------------------------------------------
def test_explain_is_free_and_quotes_the_next_querys_charge(pums) -> None:
    pums.dp.configure(categories={"sex": ["0", "1"]}, bounds={"age": (0, 100)}, budget=1.0)
    sql = "SELECT COUNT(*) AS n FROM df WHERE age < 30"
    quote = pums.dp.explain(sql, accuracy=10, confidence=0.9)
    assert list(quote.columns) == ["output", "group", "source", "epsilon", "halfwidth", "confidence", "remaining",
                                   "note"]
    assert quote["source"].tolist() == ["fresh"] and quote["halfwidth"].iloc[0] <= 10 * (1 + 1e-9)
    _spent_nothing(pums)
    res = pums.dp.result(sql, accuracy=10, confidence=0.9)
    assert res.answer.epsilon_spent == pytest.approx(quote["epsilon"].iloc[0], rel=1e-12)
    assert pums.dp.spent == pytest.approx(quote["epsilon"].iloc[0], rel=1e-12)
    assert pums.dp.remaining == pytest.approx(quote["remaining"].iloc[0], rel=1e-12)
    again = pums.dp.explain(sql, accuracy=12, confidence=0.9)  # answerable from history: free
    assert again["source"].tolist() == ["history"] and again["epsilon"].tolist() == [0.0]
    # A GROUP BY: one row per group and a (statement) total, which is what the query charges.
    group_sql = "SELECT sex, COUNT(*) AS n FROM df WHERE age >= 30 GROUP BY sex"
    before = pums.dp.spent
    quote = pums.dp.explain(group_sql, accuracy=15)
    assert quote["output"].tolist() == ["n", "n", "(statement)"] and pums.dp.spent == before
    pums.dp.query(group_sql, accuracy=15)
    assert pums.dp.spent - before == pytest.approx(quote["epsilon"].iloc[-1], rel=1e-9)


# -- hostile declarations --------------------------------------------------------------------------
def test_hostile_declarations_get_specific_errors_quickly(pums) -> None:
    start = time.perf_counter()
    cases = {
        "a huge category list": ({"categories": {"sex": [str(i) for i in range(MAX_DECLARED_VALUES + 5)]}},
                                 SchemaError, "more than the limit of 100000 values"),
        "an endless category iterator": ({"categories": {"sex": iter(int, 1)}}, SchemaError, "more than the limit"),
        "infinite bounds": ({"bounds": {"age": (-np.inf, np.inf)}}, SchemaError, "finite whole numbers"),
        "NaN bounds": ({"bounds": {"age": (0, np.nan)}}, SchemaError, "finite whole numbers"),
        "non-numeric bounds": ({"bounds": {"age": ("young", "old")}}, SchemaError, "finite whole numbers"),
        "a bare number as bounds": ({"bounds": {"age": 100}}, SchemaError, "finite whole numbers"),
        "a range too wide": ({"bounds": {"age": (0, 10**15)}}, SchemaError, "more than 10000000 cells"),
        "non-finite bin edges": ({"bins": {"income": [0, np.inf]}}, SchemaError, "finite"),
        "an int column name": ({"bounds": {0: (0, 9)}}, SchemaError, "column names are declared as strings; write '0'"),
        "a None column name": ({"categories": {None: ["a"]}}, SchemaError, "(NoneType)"),
        "a tuple column name": ({"bounds": {("a", "b"): (0, 1)}}, SchemaError, "(tuple)"),
        "nested category values": ({"categories": {"sex": [["0"], ["1"]]}}, SchemaError, "scalar values"),
        "declarations not a dict": ({"bounds": [("age", (0, 1))]}, SchemaError, "must be a dict"),
        "a bare string for nullable": ({"bounds": {"age": (0, 100)}, "nullable": "age"}, SchemaError,
                                       "takes a list of column names"),
        "a non-string table name": ({"bounds": {"age": (0, 100)}, "name": 7}, InvalidArgumentType, "a string"),
    }
    for label, (kw, error, text) in cases.items():
        with pytest.raises(error) as exc:
            pums.dp.configure(**kw)
        assert text in str(exc.value), (label, str(exc.value))
        assert len(str(exc.value)) < 2000, label  # a huge declaration is not echoed back
    assert time.perf_counter() - start < 30
    with pytest.raises(dpgate.ProgrammingError, match="no dpgate budget"):
        _ = pums.dp.spent  # none of them configured anything


def test_frame_column_names_that_are_not_strings(pums) -> None:
    ints = pd.DataFrame({0: [1, 2, 3] * 100, 1: ["a", "b", "c"] * 100})
    ints.dp.configure(bounds={"0": (0, 5)})  # matched by their string form
    assert len(ints.dp.query('SELECT COUNT(*) AS n FROM df WHERE "0" < 3', accuracy=60)) == 1
    with pytest.raises(SchemaError, match="'1'"):
        ints.dp.query("SELECT COUNT(*) FROM df WHERE \"1\" = 'a'", accuracy=60)
    clash = pd.DataFrame([[1, 2, 3]] * 50, columns=["a", "a", "b"])  # one name twice
    with pytest.raises(SchemaError, match=r"several columns named \['a'\]"):
        clash.dp.configure(bounds={"a": (0, 5), "b": (0, 5)})
    clash.dp.configure(bounds={"b": (0, 5)})  # a doubled name left undeclared is not in the way


def test_unsafe_inference_of_non_scalar_values_is_refused_specifically() -> None:
    df = pd.DataFrame({"a": [[1], [2]] * 20, "c": [1, 2] * 20})
    with pytest.raises(SchemaError, match="'a': its values .* give no domain to infer"):
        df.dp.configure(bounds={"c": (0, 3)}, unsafe_infer_from_data=True)
    df.dp.configure(bounds={"c": (0, 3)})  # left undeclared, the list column is not in the way
