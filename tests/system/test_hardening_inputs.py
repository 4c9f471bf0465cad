"""Regression tests for issue 13, findings 5 and 8: accepted inputs that crashed.

On the starting commit (722f926) every test here fails: the extreme accuracies
raised ``ValueError: math domain error`` or ``ZeroDivisionError`` from
``dpgate.inference``, the deep or long SQL texts a ``RecursionError`` from
sqlglot's parser or ``columns_in``, ClickHouse's ``FINAL`` a ``ValueError`` from
sqlglot's generator, a list-valued or lone-surrogate column a ``TypeError`` /
``UnicodeEncodeError`` from pandas' hashing when the gateway opened, and the
schema accepted ``"<other>"`` as a category, ``true`` as a row count and echoed
a YAML alias bomb in full.  Now each raises a specific ``dpgate.Error`` (or
simply works), and no budget is spent on a refusal.
"""

from __future__ import annotations

import time

import pytest
import yaml

import dpgate
from dpgate.compile import compile_sql
from dpgate.compile.statement import MAX_NESTING_DEPTH, MAX_OPERATORS, MAX_SQL_LENGTH
from dpgate.datasets import load_pums
from dpgate.errors import QueryTooComplex
from dpgate.plan.requirement import MIN_CONFIDENCE
from dpgate.schema.domains import Schema

COUNT = "SELECT COUNT(*) FROM pums"


@pytest.fixture(scope="module")
def pums():
    return load_pums()


@pytest.fixture
def gw(pums):
    df, schema = pums
    return dpgate.Gateway(df, schema, budget=1.0, seed=0)


# --------------------------------------------------------------------------- extreme requirements


@pytest.mark.parametrize("accuracy", [1e-9, 1e-30, 5e-324])
def test_a_tiny_accuracy_is_refused_by_the_budget(gw, accuracy):
    with pytest.raises(dpgate.BudgetExhausted) as info:
        gw.query(COUNT, accuracy=accuracy)
    assert info.value.needed > gw.budget
    assert gw.spent == 0.0


@pytest.mark.parametrize("accuracy", [1e17, 1e300])
def test_a_huge_accuracy_is_met_for_almost_nothing(gw, accuracy):
    (a,) = gw.query(COUNT, accuracy=accuracy).answers
    assert a.source == "fresh" and a.meets_requirement
    assert a.high - a.value <= accuracy
    assert 0 < gw.spent < 1e-9


@pytest.mark.parametrize("confidence", [1e-300, 5e-324, 0.1, 0.4999])
def test_a_confidence_below_the_minimum_is_refused_with_the_range(gw, confidence):
    with pytest.raises(dpgate.InvalidRequirement, match=rf"\[{MIN_CONFIDENCE}, 1\)"):
        gw.query(COUNT, accuracy=25, confidence=confidence)
    assert gw.spent == 0.0


def test_a_confidence_next_to_one_is_refused_by_the_budget(gw):
    with pytest.raises(dpgate.BudgetExhausted):
        gw.query(COUNT, accuracy=1, confidence=1 - 1e-16)
    assert gw.spent == 0.0


# --------------------------------------------------------------------------- SQL size and depth

DEEP = {
    "100 nested parentheses": "SELECT COUNT(*) FROM pums WHERE " + "(" * 100 + "age < 30" + ")" * 100,
    "2000 NOTs": "SELECT COUNT(*) FROM pums WHERE " + "NOT " * 2000 + "age < 30",
    "300 nested CASEs": "SELECT SUM(" + "CASE WHEN age < 30 THEN " * 300 + "1" + " ELSE 0 END" * 300 + ") FROM pums",
    "5000 flat ANDs": "SELECT COUNT(*) FROM pums WHERE " + " AND ".join(["age < 30"] * 5000),
    "1 MB OR-chain": "SELECT COUNT(*) FROM pums WHERE " + " OR ".join(["age < 30"] * 90_000),
    "400 additions": "SELECT SUM(" + " + ".join(["age"] * 400) + ") FROM pums",
}


@pytest.mark.parametrize("sql", DEEP.values(), ids=DEEP.keys())
def test_deep_or_long_sql_is_refused_before_parsing(gw, sql):
    start = time.perf_counter()
    with pytest.raises(QueryTooComplex, match="limit of"):
        gw.query(sql, accuracy=25)
    assert time.perf_counter() - start < 10
    assert gw.spent == 0.0


def test_query_too_complex_is_an_unsupported_query():
    assert issubclass(QueryTooComplex, dpgate.UnsupportedQuery)
    assert dpgate.QueryTooComplex is QueryTooComplex


def test_the_limits_leave_room_for_real_queries(pums):
    _, schema = pums
    depth = MAX_NESTING_DEPTH - 2  # the SUM( … ) and the innermost parentheses
    nested = "SELECT SUM(" + "CASE WHEN age < 30 THEN " * (depth // 2) + "1" + " ELSE 0 END" * (depth // 2) + ") FROM pums"
    assert len(compile_sql(nested, schema)) == 1
    ands = "SELECT COUNT(*) FROM pums WHERE " + " AND ".join(f"age <> {i}" for i in range(MAX_OPERATORS - 5))
    assert len(compile_sql(ands, schema)) == 1
    long_in = "SELECT COUNT(*) FROM pums WHERE age IN (" + ", ".join(str(i % 100) for i in range(5000)) + ")"
    assert len(long_in) < MAX_SQL_LENGTH
    assert len(compile_sql(long_in, schema)) == 1


def test_the_message_names_the_limit_and_the_value(pums):
    _, schema = pums
    with pytest.raises(QueryTooComplex) as info:
        compile_sql(DEEP["100 nested parentheses"], schema)
    assert f"limit of {MAX_NESTING_DEPTH}" in str(info.value) and "100" in str(info.value)


def test_clickhouse_final_is_refused_cleanly(pums):
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=0, dialect="clickhouse")
    with pytest.raises(dpgate.UnsupportedQuery, match="FINAL"):
        gw.query("SELECT COUNT(*) FROM pums FINAL", accuracy=25)
    assert gw.spent == 0.0


# --------------------------------------------------------------------------- data values when the gateway opens

def _with_cell(df, column, value):
    out = df.copy()
    out[column] = out[column].astype(object)
    out.at[out.index[0], column] = value
    return out


@pytest.mark.parametrize(
    ("column", "value", "kind"),
    [("sex", "\ud800", "Unicode"), ("age", "\udc80", "Unicode"), ("sex", ["1", "0"], "list"),
     ("age", [1, 2], "list"), ("sex", {"a": 1}, "dict")],
)
def test_values_the_gateway_cannot_read_are_refused_without_echoing_them(pums, column, value, kind):
    df, schema = pums
    with pytest.raises(dpgate.DataError, match=kind) as info:
        dpgate.Gateway(_with_cell(df, column, value), schema, budget=1.0, seed=0)
    assert repr(value) not in str(info.value) and column in str(info.value)


# --------------------------------------------------------------------------- schema validation (finding 8)

def _schema(columns, **table):
    return Schema.load({"tables": {"t": {"columns": columns, **table}}})


def test_a_declared_other_label_is_refused():
    with pytest.raises(dpgate.SchemaError, match="<other>"):
        _schema({"c": {"type": "categorical", "values": ["a", "<other>"]}})


@pytest.mark.parametrize("value", [True, False, 1.5, "2"])
def test_max_rows_per_individual_must_be_a_true_integer(value):
    with pytest.raises(dpgate.SchemaError, match="max_rows_per_individual"):
        _schema({"c": {"type": "boolean"}}, max_rows_per_individual=value)


@pytest.mark.parametrize("key", ["min", "max"])
def test_integer_bounds_must_not_be_booleans(key):
    spec = {"type": "integer", "min": 0, "max": 10, key: True}
    with pytest.raises(dpgate.SchemaError, match=key):
        _schema({"c": spec})
    with pytest.raises(dpgate.SchemaError, match=key):
        dpgate.schema.domains.Column("c", "integer", **{"min": 0, "max": 10, key: True})


def test_rows_must_not_be_a_boolean():
    with pytest.raises(dpgate.SchemaError, match="rows"):
        _schema({"c": {"type": "boolean"}}, rows=True)


ALIAS_BOMB = """
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
tables:
  t:
    columns:
      c: {type: categorical, values: *g}
      d: {type: numeric, bins: *g}
"""


def test_a_yaml_alias_bomb_gives_a_short_message_quickly():
    start = time.perf_counter()
    with pytest.raises(dpgate.SchemaError) as info:
        Schema.load(yaml.safe_load(ALIAS_BOMB))
    assert len(str(info.value)) < 400
    assert time.perf_counter() - start < 2


def test_too_many_declared_values_are_refused_with_the_limit():
    from dpgate.schema.tables import MAX_DECLARED_VALUES

    values = [str(i) for i in range(MAX_DECLARED_VALUES + 1)]
    with pytest.raises(dpgate.SchemaError, match=f"limit of {MAX_DECLARED_VALUES}") as info:
        _schema({"c": {"type": "categorical", "values": values}})
    assert len(str(info.value)) < 400


def test_duplicates_are_named_briefly():
    values = [str(i) for i in range(5000)] + ["7"]
    with pytest.raises(dpgate.SchemaError, match=r"duplicates: \['7'\]"):
        _schema({"c": {"type": "categorical", "values": values}})


def test_a_lone_surrogate_in_a_declared_value_is_refused():
    with pytest.raises(dpgate.SchemaError, match="Unicode"):
        _schema({"c": {"type": "categorical", "values": ["a", "\ud800"]}})
