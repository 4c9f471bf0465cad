"""Issue 15, items 1, 2 and 4 on the shipped PUMS data: declared group keys, typed keys and
tidy numbers, clipped intervals, rounding, and what SQL users type (coercion, the schema
prefix, keys-only SELECTs, placeholder styles)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate import dbapi
from dpgate.answer.result import Answer
from dpgate.compile import compile_sql, compile_statement
from dpgate.compile.query import LinearQuery
from dpgate.datasets import load_pums
from dpgate.errors import QuerySyntaxError, SchemaError, UnsupportedQuery

PUMS, SCHEMA = load_pums()
NULL_PUMS, NULL_SCHEMA = load_pums(null=True)


def gateway(df=PUMS, schema=SCHEMA, **kw) -> dpgate.Gateway:
    kw.setdefault("budget", 50.0)
    kw.setdefault("seed", 15)
    return dpgate.Gateway(df, schema, **kw)


# -- item 1: the groups are the declared keys -------------------------------------------------------
@pytest.mark.parametrize(("column", "keys"), [
    ("sex", ["0", "1"]),
    ("race", ["1", "2", "3", "4", "5", "6"]),
    ("educ", list(range(1, 17))),
    ("married", [False, True]),
])
def test_group_by_returns_exactly_the_declared_keys_in_order(column: str, keys: list) -> None:
    with gateway() as gw:
        out = gw.query(f"SELECT {column}, COUNT(*) AS n FROM pums GROUP BY {column}", accuracy=30).to_pandas()
    assert out[column].tolist() == keys
    assert [type(k) for k in out[column].tolist()] == [type(k) for k in keys]


def test_a_nullable_column_has_one_more_group_null_last() -> None:
    with gateway(NULL_PUMS, NULL_SCHEMA) as gw:
        out = gw.query("SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ", accuracy=30).to_pandas()
        assert len(out) == 17 and out["educ"].iloc[:16].tolist() == list(range(1, 17))
        assert pd.isna(out["educ"].iloc[16]) and str(out["educ"].dtype) == "Int64"
        # the NULL group holds the rows with a missing educ (68 of them)
        assert abs(out["n"].iloc[16] - NULL_PUMS["educ"].isna().sum()) < 30
        married = gw.query("SELECT married, COUNT(*) FROM pums GROUP BY married", accuracy=30).to_pandas()
        assert married["married"].tolist()[:2] == [False, True] and pd.isna(married["married"].iloc[2])
        assert str(married["married"].dtype) == "boolean"


def test_rows_outside_the_declared_keys_still_count_where_a_predicate_matches_them() -> None:
    schema = {"tables": {"pums": {"columns": {c.name: c.to_dict() for c in NULL_SCHEMA.table("pums").columns}}}}
    schema["tables"]["pums"]["columns"]["sex"].pop("nullable")  # sex may not be NULL, but is in 112 rows
    s = dpgate.Schema.load(schema)
    st_ = compile_statement("SELECT sex, COUNT(*) FROM pums GROUP BY sex", s)
    assert st_.group_keys == (("0",), ("1",))
    # COUNT(*) and IS NULL still reach those rows: the cells are kept, only the groups differ.
    with dpgate.Gateway(NULL_PUMS, s, budget=50.0, seed=3) as gw:
        nulls = gw.query("SELECT COUNT(*) FROM pums WHERE sex IS NULL", accuracy=10).answer
        total = gw.query("SELECT COUNT(*) FROM pums", accuracy=10).answer
    assert abs(nulls.value - 112) < 15 and abs(total.value - len(NULL_PUMS)) < 15


def test_keys_the_where_clause_cannot_reach_are_not_emitted() -> None:
    assert [k for (k,) in compile_statement("SELECT age, COUNT(*) FROM pums WHERE age < 3 GROUP BY age",
                                            SCHEMA).group_keys] == [0, 1, 2]
    st_ = compile_statement("SELECT sex, married, COUNT(*) FROM pums WHERE sex = '1' AND NOT married "
                            "GROUP BY sex, married", SCHEMA)
    assert st_.group_keys == (("1", False),)
    # a NULL group is unreachable by a comparison (NULL < 3 is unknown) ...
    assert (None,) not in compile_statement("SELECT age, COUNT(*) FROM pums WHERE age < 3 GROUP BY age",
                                            NULL_SCHEMA).group_keys
    # ... and reachable by IS NULL
    assert compile_statement("SELECT age, COUNT(*) FROM pums WHERE age IS NULL GROUP BY age",
                             NULL_SCHEMA).group_keys == ((None,),)
    # no row can pass: no group (as SQL), while an ungrouped count is still one row
    assert compile_statement("SELECT age, COUNT(*) FROM pums WHERE age > 100 GROUP BY age", SCHEMA).group_keys == ()
    assert len(compile_sql("SELECT COUNT(*) FROM pums WHERE age > 100", SCHEMA)) == 1


def test_schema_flags_are_validated_and_round_trip() -> None:
    spec = {"tables": {"t": {"schema": "S", "columns": {
        "c": {"type": "categorical", "values": ["a"], "other": True, "nullable": True},
        "i": {"type": "integer", "min": 0, "max": 2}}}}}
    s = dpgate.Schema.load(spec)
    assert dpgate.Schema.from_dict(s.to_dict()) == s and s.to_dict() == spec
    assert s.table("t").column("c").group_cells() == [0, 1, 2] and s.table("t").column("i").group_cells() == [0, 1, 2]
    with pytest.raises(SchemaError, match="'other: true' applies to categorical columns only"):
        dpgate.Schema.load({"tables": {"t": {"columns": {"i": {"type": "integer", "min": 0, "max": 2, "other": True}}}}})
    with pytest.raises(SchemaError, match="'nullable' must be true or false"):
        dpgate.Schema.load({"tables": {"t": {"columns": {"b": {"type": "boolean", "nullable": "yes"}}}}})
    # Without the new keys a schema keeps its fingerprint (ledgers bound to it stay valid).
    plain = {"tables": {"t": {"columns": {"i": {"type": "integer", "min": 0, "max": 2}}}}}
    assert dpgate.Schema.load(plain).to_dict() == plain


# -- item 2: values and types ---------------------------------------------------------------------------
def test_keys_are_typed_in_dbapi_rows_and_pandas() -> None:
    with dbapi.connect(PUMS, schema=SCHEMA, budget=50.0, accuracy=30, seed=1) as con:
        for col, kind in (("educ", int), ("married", bool), ("sex", str)):
            rows = con.execute(f"SELECT {col}, COUNT(*) FROM pums GROUP BY {col}").fetchall()
            assert all(type(r[0]) is kind for r in rows), col
    with gateway() as gw:
        out = gw.query("SELECT educ, married, COUNT(*) AS n FROM pums GROUP BY educ, married",
                       accuracy=30).to_pandas()
    assert str(out["educ"].dtype) == "int64" and str(out["married"].dtype) == "bool"


def test_answers_have_no_binary_float_artefacts() -> None:
    a = Answer(497.4999999999999, 472.49999999999994, 522.5000000000001, 0.95, 25.0, "history", 0.0)
    assert (a.value, a.low, a.high) == (497.5, 472.5, 522.5)
    assert repr(a.value) == "497.5"
    with gateway() as gw:
        gw.query("SELECT age, COUNT(*) FROM pums WHERE age < 40 GROUP BY age", accuracy=30)
        res = gw.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=200)  # a sum of 40 releases
    v = res.answer.value
    assert res.answer.source == "history" and len(repr(v)) <= 17 and v == float(f"{v:.15g}")


def test_intervals_of_counts_are_clipped_at_zero_without_losing_coverage() -> None:
    """200 independent releases of an almost empty count (truth 0): the released interval
    starts at 0 or above, and covers the truth at least as often as stated (≥ 95 % − 3 SE)."""
    truth = int((PUMS["age"] == 90).sum())
    assert truth <= 2
    n, hits = 200, 0
    # Each at 95 % on its own (reasks="independent"): with δ-spending the 200 asks of one query would
    # be at ever higher confidences, and the coverage bound below would test nothing.
    with gateway(budget=1e6, policy="no_reuse", reasks="independent") as gw:
        for _ in range(n):
            a = gw.query("SELECT COUNT(*) FROM pums WHERE age = 90", accuracy=3).answer
            assert a.low >= 0.0 and a.high >= 0.0
            lo, hi = a.posterior.certified_interval(0.95)  # before the cut to [0, rows]
            assert (a.low, a.high) == pytest.approx(a.posterior.interval(0.95), rel=1e-14, abs=1e-300)
            assert a.low == max(lo, 0.0) and a.high >= max(hi, (hi - lo) / 2)  # never [0, 0]
            if lo <= truth <= hi:  # the truth is ≥ 0, so the cut never loses it
                assert a.low <= truth <= a.high
            hits += a.low <= truth <= a.high
    se = math.sqrt(0.95 * 0.05 / n)
    assert hits / n >= 0.95 - 3 * se
    # weights of both signs: nothing to clip
    with gateway() as gw:
        d = gw.query("SELECT COUNT(*) FILTER (WHERE age = 90) - COUNT(*) FILTER (WHERE age = 91) FROM pums",
                     accuracy=3).answer
    lo, hi = d.posterior.certified_interval(d.interval_confidence)
    assert (d.low, d.high) == pytest.approx((lo, hi), rel=1e-14)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=100))
def test_weight_sign_is_cached_and_clips_answers_by_it(weights: list[int]) -> None:
    w = np.array(weights, dtype=np.int64)
    q = LinearQuery("t", ("a",), (tuple(range(len(w))),), w, offset=Fraction(2))
    expected = 1 if w.min() >= 0 else -1 if w.max() <= 0 else 0
    assert q.weight_sign == expected and "weight_sign" in vars(q)  # computed once, then cached
    a = Answer(1.0, -5.0, 10.0, 0.95, 7.5, "fresh", 0.1, query=q)  # θ̂ = 2.5, q = 7.5
    # cut to the support, and stretched to at least q beside the bound (dpgate.inference._support)
    want = {1: (2.0, 10.0), -1: (-5.5, 2.0), 0: (-5.0, 10.0)}[expected] if w.any() else (2.0, 2.0)
    assert (a.low, a.high) == want


def test_round_returns_integer_counts_everywhere() -> None:
    with gateway() as gw:
        res = gw.query("SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM pums GROUP BY sex", accuracy=30, round=True)
        for a in res.answers:
            assert all(type(x) is int for x in (a.value, a.low, a.high)) and a.low <= a.value <= a.high
            lo, hi = a.posterior.certified_interval(a.interval_confidence)
            assert math.ceil(lo) == a.low and math.floor(hi) == a.high  # inward: coverage unchanged
        assert str(res.to_pandas()["n"].dtype) == "int64"
        spent = gw.spent
        again = gw.query("SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM pums GROUP BY sex", accuracy=30)
        assert gw.spent == spent and all(isinstance(a.value, float) for a in again.answers)  # rounding is free
        # non-integer weights are left alone
        half = gw.query("SELECT COUNT(*) / 2 FROM pums", accuracy=30, round=True).answer
        assert isinstance(half.value, float)
    with dbapi.connect(PUMS, schema=SCHEMA, budget=50.0, accuracy=30, seed=2) as con:
        con.execute("SET dpgate.round = on")
        cur = con.execute("SELECT COUNT(*) AS n FROM pums WHERE age < 30")
        assert type(cur.fetchone()[0]) is int and cur.description[0][1] == "BIGINT"
        assert con.settings["round"] is True
    from dpgate import accessor

    accessor._forget_all()  # the registry is per process: other tests configure the same rows
    try:
        PUMS.dp.configure(schema=SCHEMA, budget=10.0, seed=3)
        out = PUMS.dp.query("SELECT married, COUNT(*) AS n FROM pums GROUP BY married", accuracy=30, round=True)
    finally:
        accessor._forget_all()
    assert str(out["n"].dtype) == "int64" and (out["n_low"] >= 0).all()


# -- item 4: what SQL users type ----------------------------------------------------------------------
def test_select_of_group_keys_alone_is_free_and_unrecorded() -> None:
    with gateway() as gw:
        res = gw.query("SELECT educ FROM pums GROUP BY educ")  # no accuracy needed
        assert res.to_pandas()["educ"].tolist() == list(range(1, 17)) and res.answers == ()
        few = gw.query("SELECT sex, married FROM PUMS.PUMS WHERE married GROUP BY sex, married").to_pandas()
        assert few.values.tolist() == [["0", True], ["1", True]]
        assert gw.spent == 0.0 and len(gw.history) == 0 and len(gw.ledger.records()) == 0
    with dbapi.connect(PUMS, schema=SCHEMA, budget=1.0, seed=0) as con:  # no accuracy anywhere
        assert con.execute("SELECT race FROM pums GROUP BY race").fetchall() == [(r,) for r in "123456"]
        assert con.spent == 0.0 and len(con.history) == 0


def test_string_constants_take_the_column_type_symmetrically() -> None:
    pairs = [
        ("educ = '8'", "educ = 8"),
        ("'8' = educ", "educ = 8"),
        ("educ IN ('8', '9')", "educ IN (8, 9)"),
        ("age BETWEEN '20' AND '29'", "age BETWEEN 20 AND 29"),
        ("married = 'true'", "married"),
        ("sex = 1", "sex = '1'"),
    ]
    for a, b in pairs:
        assert compile_sql(f"SELECT COUNT(*) FROM pums WHERE {a}", SCHEMA) == compile_sql(
            f"SELECT COUNT(*) FROM pums WHERE {b}", SCHEMA), a
    with gateway() as gw:
        first = gw.query("SELECT COUNT(*) FROM pums WHERE educ = 8", accuracy=20).answer
        again = gw.query("SELECT COUNT(*) FROM pums WHERE educ = '8'", accuracy=20).answer
        assert again.source == "history" and again.value == first.value
    with pytest.raises(UnsupportedQuery, match=r"'eight' is not a number, so it cannot be compared with integer "
                                               r"column 'educ' \(1\.\.16\)"):
        compile_sql("SELECT COUNT(*) FROM pums WHERE educ = 'eight'", SCHEMA)
    with pytest.raises(UnsupportedQuery, match="not a boolean, so it cannot be compared with boolean column"):
        compile_sql("SELECT COUNT(*) FROM pums WHERE married = 'sometimes'", SCHEMA)


def test_declared_schema_prefix() -> None:
    base = compile_sql("SELECT COUNT(*) FROM pums WHERE age < 30", SCHEMA)
    for name in ("PUMS.PUMS", "pums.pums", "main.pums", '"PUMS"."PUMS"', "public.pums", '"public"."pums"'):
        assert compile_sql(f"SELECT COUNT(*) FROM {name} WHERE age < 30", SCHEMA) == base, name
    assert compile_sql("SELECT COUNT(*) FROM PUMS.PUMS AS p WHERE p.age < 30", SCHEMA) == base
    with pytest.raises(SchemaError, match=r"schema 'census' .* accepts 'main', 'public' and its declared schema 'PUMS'"):
        compile_sql("SELECT COUNT(*) FROM census.pums", SCHEMA)
    with pytest.raises(SchemaError, match="schema 'x.PUMS'"):
        compile_sql("SELECT COUNT(*) FROM x.PUMS.pums", SCHEMA)


STYLES = [
    ("SELECT COUNT(*) FROM pums WHERE age < ? AND sex = ?", (30, "1")),
    ("SELECT COUNT(*) FROM pums WHERE age < $1 AND sex = $2", (30, "1")),
    ("SELECT COUNT(*) FROM pums WHERE age < :a AND sex = :s", {"a": 30, "s": "1"}),
    ("SELECT COUNT(*) FROM pums WHERE age < %s AND sex = %s", (30, "1")),
    ("SELECT COUNT(*) FROM pums WHERE age < %(a)s AND sex = %(s)s", {"a": 30, "s": "1"}),
    ("SELECT COUNT(*) FROM pums WHERE age<%(limit)s AND sex=%s", None),  # checked apart: mixed styles
]


def test_every_placeholder_style_binds_on_the_dbapi() -> None:
    assert dbapi.paramstyle == "qmark"
    with dbapi.connect(PUMS, schema=SCHEMA, budget=5.0, accuracy=20, seed=4) as con:
        cur = con.cursor()
        for i, (sql, params) in enumerate(STYLES[:5]):
            cur.execute(sql, params)
            (a,) = cur.answers
            assert a.source == ("fresh" if i == 0 else "history"), sql  # the same query every time
        cur.execute("SELECT COUNT(*) FROM pums WHERE age<%(limit)s AND sex=%(sex)s", {"limit": 30, "sex": 1})
        assert cur.answers[0].source == "history"  # a keyword as the name, no spaces, a number for sex
        with pytest.raises(dbapi.ProgrammingError, match="mixes positional and named"):
            cur.execute(STYLES[5][0], {"limit": 30})
        # a '%s' inside a string literal is text, not a placeholder
        cur.execute("SELECT COUNT(*) FROM pums WHERE age % 2 = 1 AND sex LIKE '%s' AND age < ?", (5,))
        assert cur.answers[0].source == "exact"


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM pums WHERE age < %d",
    "SELECT COUNT(*) FROM pums WHERE age < %(a)d",
    "SELECT COUNT(*) FROM pums WHERE age < @a",
    "SELECT COUNT(*) FROM pums WHERE age < %",
])
def test_a_wrong_placeholder_names_the_accepted_styles(sql: str) -> None:
    with dbapi.connect(PUMS, schema=SCHEMA, budget=1.0, accuracy=20, seed=5) as con:
        with pytest.raises(QuerySyntaxError) as exc:
            con.execute(sql, (1,))
        assert con.spent == 0.0
    msg = str(exc.value)
    assert all(style in msg for style in ("?", "$1", ":name", "%s", "%(name)s")), msg
    assert "Required keyword" not in msg and "sqlglot" not in msg


# -- hypothesis: coercion and binding are the literal they stand for ---------------------------------------
@settings(max_examples=60, deadline=None)
@given(col=st.sampled_from(["age", "educ", "income"]), k=st.integers(-5, 500_005),
       op=st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), spaces=st.booleans())
def test_quoted_numbers_compile_as_numbers(col: str, k: int, op: str, spaces: bool) -> None:
    text = f" {k} " if spaces else str(k)
    assert compile_sql(f"SELECT COUNT(*) FROM pums WHERE {col} {op} '{text}'", SCHEMA) == compile_sql(
        f"SELECT COUNT(*) FROM pums WHERE {col} {op} {k}", SCHEMA)


@settings(max_examples=40, deadline=None)
@given(age=st.integers(-3, 104), sex=st.sampled_from(["0", "1"]), married=st.booleans(),
       style=st.sampled_from(range(5)))
def test_bound_parameters_equal_literals(age: int, sex: str, married: bool, style: int) -> None:
    sql, _ = STYLES[style]
    sql += " AND married = " + {0: "?", 1: "$3", 2: ":m", 3: "%s", 4: "%(m)s"}[style]
    params = (age, sex, married) if style in (0, 1, 3) else {"a": age, "s": sex, "m": married}
    literal = f"SELECT COUNT(*) FROM pums WHERE age < {age} AND sex = '{sex}' AND married = {str(married).lower()}"
    assert compile_statement(sql, SCHEMA, params=params).queries == compile_sql(literal, SCHEMA)


def test_cli_round_prints_integers_and_null_keys_as_json_null(tmp_path) -> None:
    import json
    import subprocess
    import sys

    import yaml

    csv, schema = tmp_path / "pums_null.csv", tmp_path / "pums_null.yaml"
    NULL_PUMS.to_csv(csv, index=False)
    schema.write_text(yaml.safe_dump(NULL_SCHEMA.to_dict()), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "dpgate.cli", "query", "--schema", str(schema), "--data", str(csv),
                        "--budget", "1", "--accuracy", "30", "--round", "--json",
                        "SELECT sex, COUNT(*) AS n FROM PUMS.pums GROUP BY sex"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["sex"] for row in rows] == ["0", "1", None]  # nullable: the NULL group, as JSON null
    assert all(isinstance(row[k], int) for row in rows for k in ("n", "n_low", "n_high"))
    assert np.all([row["n_low"] <= row["n"] <= row["n_high"] for row in rows])
