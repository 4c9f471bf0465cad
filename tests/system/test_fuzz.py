"""Fuzz the gateway's inputs (issue 13, acceptance): only ``dpgate.Error`` escapes.

Hypothesis generates, deterministically (``derandomize=True``), 10 400 inputs
in total (about 70 s on one core; most cases stop at the compiler, which is
where the SQL text is checked, and a sample goes through the whole gateway):

* near-valid SQL from a small grammar over the declared PUMS schema (aggregates,
  predicates, GROUP BY, HAVING, ORDER BY, LIMIT, hints) answered by a gateway;
* the same SQL mutated character-wise (deletions, insertions, duplications);
* token soup: random sequences of SQL keywords, operators, names and literals;
* arbitrary Unicode text;
* the numeric arguments — accuracy, confidence and budget — drawn from floats
  (subnormals, extremes, NaN, ±inf), integers, booleans, strings and None.

Each case may succeed or raise a ``dpgate.Error`` subclass, nothing else, and a
refused call never spends budget.  Gateways use seeded (insecure) noise, as the
other tests do.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile import compile_statement
from dpgate.datasets import load_pums

DF, SCHEMA = load_pums()


def fuzz(examples: int) -> settings:
    """Deterministic settings: the same cases on every run, no example database."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def _gateway(budget: float = 1e9) -> dpgate.Gateway:
    return dpgate.Gateway(DF, SCHEMA, budget=budget, seed=0)


# One gateway for the query-level fuzz: later cases mostly hit history, which keeps it fast.
GW = _gateway()


def _spends_only_on_success(gw: dpgate.Gateway, call) -> None:
    """Run ``call``; it may succeed or raise a dpgate.Error, and a refusal spends nothing."""
    before = gw.spent
    try:
        call()
    except dpgate.Error:
        assert gw.spent == before, "a refused call spent budget"


# --------------------------------------------------------------------------- the SQL grammar

COLUMNS = ["age", "sex", "educ", "race", "married", "AGE", '"age"', "nope", "pums.age"]
LITERALS = ["0", "1", "30", "-1", "2.5", "1e308", "'1'", "'x'", "NULL", "TRUE", "'<other>'", "100000000000000000000"]
COMPARE = ["=", "<>", "!=", "<", "<=", ">", ">=", "LIKE", "IS", "IS NOT"]

column = st.sampled_from(COLUMNS)
literal = st.sampled_from(LITERALS)
atom = st.one_of(
    st.builds(lambda c, op, v: f"{c} {op} {v}", column, st.sampled_from(COMPARE), literal),
    st.builds(lambda c, a, b: f"{c} BETWEEN {a} AND {b}", column, literal, literal),
    st.builds(lambda c, vs: f"{c} IN ({', '.join(vs)})", column, st.lists(literal, min_size=0, max_size=4)),
    st.builds(lambda c: f"{c} IS NULL", column),
    column,
)
condition = st.recursive(
    atom,
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
        st.builds(lambda a, b: f"{a} OR {b}", inner, inner),
        st.builds(lambda a: f"NOT ({a})", inner),
    ),
    max_leaves=6,
)
value = st.recursive(
    st.one_of(column, literal),
    lambda inner: st.one_of(
        st.builds(lambda a, op, b: f"({a} {op} {b})", inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner),
        st.builds(lambda c, a, b: f"CASE WHEN {c} THEN {a} ELSE {b} END", condition, inner, inner),
        st.builds(lambda a: f"CAST({a} AS INTEGER)", inner),
        st.builds(lambda a: f"ABS({a})", inner),
    ),
    max_leaves=4,
)
aggregate = st.one_of(
    st.just("COUNT(*)"),
    st.builds(lambda v: f"COUNT({v})", value),
    st.builds(lambda v: f"SUM({v})", value),
    st.builds(lambda c: f"COUNT_IF({c})", condition),
    st.builds(lambda v, c: f"SUM({v}) FILTER (WHERE {c})", value, condition),
    st.builds(lambda k, a: f"{k} * {a} - 1", st.sampled_from(["2", "0.5", "-3"]), st.just("COUNT(*)")),
    st.sampled_from(["AVG(age)", "MIN(age)", "COUNT(DISTINCT sex)", "*", "age", "ROW_NUMBER() OVER ()"]),
)


@st.composite
def statements(draw: st.DrawFn) -> str:
    group = draw(st.lists(st.sampled_from(["sex", "race", "married", "educ", "age", "1"]), max_size=2))
    items = [*group, *draw(st.lists(aggregate, min_size=1, max_size=2))]
    sql = f"SELECT {', '.join(items)} FROM {draw(st.sampled_from(['pums', 'PUMS', 'main.pums', 'other']))}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(condition)}"
    if group:
        sql += f" GROUP BY {', '.join(group)}"
        if draw(st.booleans()):
            sql += f" HAVING COUNT(*) > {draw(literal)}"
    if draw(st.booleans()):
        sql += f" ORDER BY {draw(st.sampled_from(['1', '2', 'sex', 'COUNT(*) DESC']))}"
    if draw(st.booleans()):
        sql += f" LIMIT {draw(st.sampled_from(['1', '0', '-1', 'age', '10 OFFSET 2']))}"
    if draw(st.booleans()):
        acc = draw(st.sampled_from(["25", "0", "-1", "nan", "1e400", "x", "1e-300"]))
        sql = f"/*+ dpgate accuracy={acc} */ {sql}"
    return sql


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(statements())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "duplicate"]))
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(list("()'\";,*-/+ ") + ["\\", "--", "/*", "\x00", "\ud800", "é"])) + text[i:]
        else:
            text = text[:i] + text[i:i + 8] * draw(st.integers(2, 40)) + text[i:]
    return text


SOUP = [
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "HAVING", "ORDER", "LIMIT", "OFFSET", "AND", "OR", "NOT", "CASE",
    "WHEN", "THEN", "ELSE", "END", "COUNT", "SUM", "(", ")", "*", ",", ";", "=", "<", ">", "+", "-", "/", "%",
    "IN", "BETWEEN", "IS", "NULL", "LIKE", "FILTER", "DISTINCT", "JOIN", "UNION", "WITH", "AS", "SET", "FINAL",
    "pums", "age", "sex", "married", "'1'", "1", "0.5", "?", "$1", ":x", "/*+ dpgate accuracy=25 */", "--",
    "DROP", "TABLE", "INSERT", "VALUES", "read_csv('x')", "dpgate.accuracy", "OVER", "CAST", "INTEGER",
]
soup = st.lists(st.sampled_from(SOUP), min_size=1, max_size=40).map(" ".join)


# --------------------------------------------------------------------------- SQL fuzz


@fuzz(2000)
@given(sql=statements())
def test_near_valid_sql_compiles_or_refuses(sql: str) -> None:
    try:
        compile_statement(sql, SCHEMA)
    except dpgate.Error:
        pass


@fuzz(40)
@given(sql=statements(), accuracy=st.sampled_from([25, 1e3, 1e6]))
def test_near_valid_sql_answers_or_refuses(sql: str, accuracy: float) -> None:
    # The whole path (plan, budget check, ledger, release) is slower than compiling,
    # so fewer cases; the compile test above covers the grammar more widely.
    _spends_only_on_success(GW, lambda: GW.query(sql, accuracy=accuracy, allow_partial=True))


@fuzz(2500)
@given(sql=mutated())
def test_mutated_sql_compiles_or_refuses(sql: str) -> None:
    try:
        compile_statement(sql, SCHEMA)
    except dpgate.Error:
        pass


@fuzz(3000)
@given(sql=soup, dialect=st.sampled_from(["duckdb", "clickhouse", "postgres", "mysql", "sqlite", "bigquery"]))
def test_token_soup_compiles_or_refuses(sql: str, dialect: str) -> None:
    try:
        compile_statement(sql, SCHEMA, dialect)
    except dpgate.Error:
        pass


@fuzz(2500)
@given(sql=st.text(max_size=200))
def test_arbitrary_text_compiles_or_refuses(sql: str) -> None:
    try:
        compile_statement(sql, SCHEMA)
    except dpgate.Error:
        pass


# --------------------------------------------------------------------------- numeric arguments

number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([5e-324, 1e-308, 1e-300, 1e-9, 0.5, 1 - 1e-16, 1.0, 25.0, 1e17, 1e300, math.inf, -0.0]),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.booleans(),
    st.sampled_from(["25", "0.95", "", "nan", None]),
)


@fuzz(300)
@given(accuracy=number, confidence=number)
def test_requirements_answer_or_refuse(accuracy: object, confidence: object) -> None:
    # COUNT(*) is answered once, then from history: the fuzz explores the checks and the
    # scale search, and the gateway stays fast.
    _spends_only_on_success(
        GW, lambda: GW.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=accuracy, confidence=confidence)
    )


@fuzz(60)
@given(budget=number)
def test_budgets_open_or_refuse(budget: object) -> None:
    try:
        gw = _gateway(budget)  # type: ignore[arg-type]
    except dpgate.Error:
        return
    assert gw.spent == 0.0 and gw.budget > 0 and math.isfinite(gw.budget)


@pytest.mark.parametrize("accuracy", [5e-324, 1e-9, 1e17, 1e300])
def test_extremes_on_a_small_budget_spend_nothing_when_refused(accuracy: float) -> None:
    gw = _gateway(1.0)
    _spends_only_on_success(gw, lambda: gw.query("SELECT COUNT(*) FROM pums", accuracy=accuracy))
