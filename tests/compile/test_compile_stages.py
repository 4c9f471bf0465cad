"""Unit tests of the compiler's stage modules, each through its own public functions.

``tests/compile/test_compile.py`` and the SQL fixtures test the compiler end to end
(SQL → LinearQuery); here each module of ``dpgate/compile/`` is tested on its own:

* :mod:`dpgate.compile.statement` — hints, SET, parameter binding, literals, the one-statement rule;
* :mod:`dpgate.compile.cells` — constants, LIKE patterns, bare columns' values, candidate cells,
  bins kept whole, categorical and binned comparisons;
* :mod:`dpgate.compile.evaluate` — the :class:`Evaluator` on conditions, checked cell by cell
  against a brute-force evaluation in SQL's three-valued logic;
* :mod:`dpgate.compile.aggregates` — linear combinations of aggregates, GROUP BY columns, and the
  weights of SUM / CASE / COUNT FILTER against brute force over every cell;
* :mod:`dpgate.compile.post` — HAVING / ORDER BY / LIMIT / OFFSET on given released rows.

The table is small enough (528 cells) to enumerate: ``age`` integer 0..9, ``sex``
categorical '0'/'1', ``inc`` in bins [0, 10, 20, 30), ``m`` boolean — each with its
NULL cell (and ``other`` for ``sex``).

The file is over 500 lines on purpose: one short section per stage module, all sharing
that table, its per-cell values and the three-valued-logic helpers of the brute force.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlglot
from sqlglot import exp

from dpgate.compile import aggregates, cells, compile_sql, compile_statement, evaluate, post, statement
from dpgate.errors import (
    InvalidArgumentType,
    InvalidRequirement,
    ProgrammingError,
    QuerySyntaxError,
    SchemaError,
    UnsupportedQuery,
)
from dpgate.schema.domains import OTHER_LABEL, Schema

SCHEMA = Schema.load({"tables": {"t": {"columns": {
    "age": {"type": "integer", "min": 0, "max": 9},
    "sex": {"type": "categorical", "values": ["0", "1"]},
    "inc": {"type": "numeric", "bins": [0, 10, 20, 30]},
    "m": {"type": "boolean"},
}}}})
T = SCHEMA.table("t")
AGE, SEX, INC, M = (T.column(n) for n in ("age", "sex", "inc", "m"))
DUCKDB = statement.dialect_of("duckdb")

#: What a row of each cell holds, in cell order: integers, category labels, a bin's lower edge, booleans;
#: None is NULL.
CELL_VALUES: dict[str, list[Any]] = {
    "age": [*range(10), None],
    "sex": ["0", "1", OTHER_LABEL, None],
    "inc": [0, 10, 20, None],
    "m": [False, True, None],
}
COLUMNS = [c.name for c in T.columns]
SHAPE = tuple(c.n_cells for c in T.columns)


def expr(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="duckdb")


def every_cell() -> list[tuple[tuple[int, ...], dict[str, Any]]]:
    """Each cell's index and the values a row in it holds."""
    out = []
    for idx in itertools.product(*(range(n) for n in SHAPE)):
        out.append((idx, {c: CELL_VALUES[c][i] for c, i in zip(COLUMNS, idx, strict=True)}))
    return out


# -- SQL's three-valued logic, written out for the brute force ----------------------------------------
def and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def not3(a: bool | None) -> bool | None:
    return None if a is None else not a


def known(x: Any, f: Callable[[Any], bool]) -> bool | None:
    """``f(x)``, or unknown when ``x`` is NULL."""
    return None if x is None else f(x)


# ================================================================================================
# statement
# ================================================================================================
def hints_of(sql: str) -> dict[str, str]:
    return statement.hints(statement.tokenize(sql, DUCKDB), sql)


def test_hints_are_read_from_comments_only() -> None:
    assert hints_of("SELECT COUNT(*) FROM t /*+ dpgate accuracy=25 confidence=0.95 */") == {
        "accuracy": "25", "confidence": "0.95",
    }
    assert hints_of("/*+ dpgate method=pca, allow_partial=on */ SELECT COUNT(*) FROM t") == {
        "method": "pca", "allow_partial": "on",
    }
    # Not hints: inside a string literal, a plain comment, another system's optimizer hint.
    assert hints_of("SELECT COUNT(*) FROM t WHERE sex = '/*+ dpgate accuracy=1 */'") == {}
    assert hints_of("SELECT COUNT(*) FROM t /* dpgate accuracy=5 */") == {}
    assert hints_of("SELECT /*+ INDEX(t) */ COUNT(*) FROM t") == {}
    # The same value twice is one hint.
    assert hints_of("SELECT COUNT(*) /*+ dpgate accuracy=5 */ FROM t /*+ dpgate accuracy=5 */") == {"accuracy": "5"}


@pytest.mark.parametrize(
    ("hint", "error"),
    [
        ("dpgate budget=1", UnsupportedQuery),  # unknown key
        ("dpgate accuracy", UnsupportedQuery),  # malformed
        ("dpgate accuracy=-1", InvalidRequirement),
        ("dpgate accuracy=inf", InvalidRequirement),
        ("dpgate confidence=1.5", InvalidRequirement),
        ("dpgate confidence=high", InvalidRequirement),
        ("dpgate method=guess", InvalidRequirement),
        ("dpgate allow_partial=maybe", InvalidRequirement),
    ],
)
def test_bad_hints_are_refused(hint: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        hints_of(f"SELECT COUNT(*) FROM t /*+ {hint} */")


def test_conflicting_hints_are_refused() -> None:
    with pytest.raises(UnsupportedQuery, match="twice"):
        hints_of("SELECT COUNT(*) /*+ dpgate accuracy=5 */ FROM t /*+ dpgate accuracy=6 */")


def test_exactly_one_select_or_set_statement() -> None:
    def check(sql: str) -> None:
        statement.split_check(statement.tokenize(sql, DUCKDB))

    check("SELECT COUNT(*) FROM t;;")  # empty statements between semicolons do not count
    check("SET dpgate.accuracy = 5")
    check("(SELECT COUNT(*) FROM t)")
    with pytest.raises(UnsupportedQuery, match="2 statements"):
        check("SELECT COUNT(*) FROM t; SELECT COUNT(*) FROM t")
    with pytest.raises(UnsupportedQuery, match=r"SELECT, DROP"):
        check("SELECT COUNT(*) FROM t; DROP TABLE t")
    with pytest.raises(UnsupportedQuery, match="empty"):
        check(" ; -- nothing")
    for sql, word in [
        ("WITH x AS (SELECT 1) SELECT COUNT(*) FROM x", "common table"),
        ("VALUES (1)", "VALUES"),
        ("DELETE FROM t", "DELETE"),
    ]:
        with pytest.raises(UnsupportedQuery, match=word):
            check(sql)


def test_parse_errors_carry_line_and_column() -> None:
    with pytest.raises(QuerySyntaxError, match="line 2"):
        statement.parse("SELECT COUNT(*)\nFROM t WHERE (age < 3", DUCKDB)
    with pytest.raises(ProgrammingError, match="unknown SQL dialect"):
        statement.dialect_of("no-such-dialect")


def set_of(sql: str) -> statement.SetOption:
    tree = statement.parse(sql, DUCKDB)
    assert isinstance(tree, exp.Set)
    return statement.set_option(tree)


def test_set_options_become_typed_values() -> None:
    assert set_of("SET dpgate.accuracy = 25") == statement.SetOption("accuracy", 25.0)
    assert set_of("SET dpgate.confidence = 0.9") == statement.SetOption("confidence", 0.9)
    assert set_of("SET dpgate.intervals = on") == statement.SetOption("intervals", True)
    assert set_of("SET dpgate.intervals = false") == statement.SetOption("intervals", False)
    assert set_of("SET dpgate.allow_partial = 0") == statement.SetOption("allow_partial", False)
    assert set_of("SET dpgate.method = 'PCA'") == statement.SetOption("method", "pca")
    assert set(statement.HINT_KEYS) <= set(statement.SET_OPTIONS)  # every hint can also be SET
    with pytest.raises(UnsupportedQuery, match="unknown option"):
        set_of("SET dpgate.budget = 1")
    with pytest.raises(UnsupportedQuery, match="only SET dpgate"):
        set_of("SET threads = 4")
    with pytest.raises(InvalidRequirement):
        set_of("SET dpgate.confidence = 2")
    with pytest.raises(InvalidRequirement):
        set_of("SET dpgate.accuracy = -3")


def test_bind_replaces_placeholders_by_literals_on_a_copy() -> None:
    tree = statement.parse("SELECT COUNT(*) FROM t WHERE age < ? AND sex = ?", DUCKDB)
    before = tree.sql()
    bound = statement.bind(tree, (5, "1"))
    assert bound.sql() == "SELECT COUNT(*) FROM t WHERE age < 5 AND sex = '1'"
    assert tree.sql() == before  # the parsed tree is not changed
    # $n may come in any order and repeat; :name is case-insensitive.
    tree = statement.parse("SELECT COUNT(*) FROM t WHERE age < $2 AND sex = $1 AND age > $2 - 4", DUCKDB)
    assert statement.bind(tree, ("1", 5)).sql() == "SELECT COUNT(*) FROM t WHERE age < 5 AND sex = '1' AND age > 5 - 4"
    tree = statement.parse("SELECT COUNT(*) FROM t WHERE age < :lo AND m = :flag", DUCKDB)
    assert statement.bind(tree, {"LO": 2.5, "flag": True}).sql() == "SELECT COUNT(*) FROM t WHERE age < 2.5 AND m = TRUE"
    # A SQL-looking string stays one string literal.
    tree = statement.parse("SELECT COUNT(*) FROM t WHERE sex = ?", DUCKDB)
    assert statement.bind(tree, ["1' OR '1'='1"]).sql() == "SELECT COUNT(*) FROM t WHERE sex = '1'' OR ''1''=''1'"
    plain = statement.parse("SELECT COUNT(*) FROM t", DUCKDB)
    assert statement.bind(plain, None) is plain


@pytest.mark.parametrize(
    ("sql", "params", "error"),
    [
        ("SELECT COUNT(*) FROM t WHERE age < ?", (1, 2), ProgrammingError),
        ("SELECT COUNT(*) FROM t WHERE age < ?", None, ProgrammingError),
        ("SELECT COUNT(*) FROM t", (1,), ProgrammingError),
        ("SELECT COUNT(*) FROM t WHERE age < $1 AND age > $3", (1, 2), ProgrammingError),
        ("SELECT COUNT(*) FROM t WHERE age < ? AND age > :lo", (1, 2), ProgrammingError),
        ("SELECT COUNT(*) FROM t WHERE age < :lo", (1,), InvalidArgumentType),
        ("SELECT COUNT(*) FROM t WHERE age < :lo", {"hi": 1}, ProgrammingError),
        ("SELECT COUNT(*) FROM t WHERE age < ?", {"lo": 1}, InvalidArgumentType),
        ("SELECT COUNT(*) FROM t WHERE age < ?", "5", InvalidArgumentType),
    ],
)
def test_bind_refuses_mismatched_parameters(sql: str, params: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        statement.bind(statement.parse(sql, DUCKDB), params)


def test_literal_nodes_of_python_values() -> None:
    assert isinstance(statement.literal(None), exp.Null)
    assert statement.literal(True) == exp.Boolean(this=True)
    assert statement.literal(np.True_) == exp.Boolean(this=True)  # numpy 2 names its bool type "bool"
    assert statement.literal("x") == exp.Literal.string("x")
    assert statement.literal(3).sql() == "3"
    assert statement.literal(np.int64(4)).sql() == "4"
    assert statement.literal(2.5).sql() == "2.5"
    assert statement.literal(Fraction(1, 4)).sql() == "0.25"  # exact, not via float
    assert statement.literal(Decimal("1.50")).sql() == "1.50"
    for bad in (float("nan"), float("inf"), Decimal("NaN")):
        with pytest.raises(ProgrammingError, match=r"finite|NaN"):
            statement.literal(bad)
    with pytest.raises(InvalidArgumentType):
        statement.literal(object())


# ================================================================================================
# cells
# ================================================================================================
def test_constants_are_exact_rationals() -> None:
    assert cells.parse_number("0.1") == Fraction(1, 10)
    assert cells.parse_number("1e3") == 1000
    assert cells.parse_number("1_000") == 1000
    assert cells.constant(expr("(1 + 2) * 3 / 4")) == Fraction(9, 4)
    assert cells.constant(expr("-(2 - 5)")) == 3
    assert cells.constant(expr("age + 1")) is None
    assert cells.constant(expr("'1'")) is None  # a string is no number
    with pytest.raises(UnsupportedQuery, match="division by zero"):
        cells.constant(expr("1 / (2 - 2)"))
    with pytest.raises(UnsupportedQuery, match="floating-point range"):
        cells.parse_number("1e400")


def test_like_patterns_have_two_wildcards_and_an_escape() -> None:
    rx = cells.like_regex("a%b_", None, ci=False)
    assert [bool(rx.fullmatch(s)) for s in ("axxbc", "abc", "axxb", "Abc", "a.b?")] == [True, True, False, False, True]
    assert cells.like_regex("a%b_", None, ci=True).fullmatch("AXBC")
    rx = cells.like_regex("50!%", "!", ci=False)
    assert [bool(rx.fullmatch(s)) for s in ("50%", "500", "50")] == [True, False, False]
    assert cells.like_regex("(.*)", None, ci=False).fullmatch("(.*)")  # regex characters are literal
    assert not cells.like_regex("(.*)", None, ci=False).fullmatch("(ab)")


def test_numbers_print_as_sql_constants() -> None:
    assert [cells.fmt_number(x) for x in (3.0, 2.5, -0.0, 1e20)] == ["3", "2.5", "0", "100000000000000000000"]


def test_bare_columns_take_one_value_per_cell() -> None:
    age = cells.base_value(AGE)
    assert age.kind == cells.NUM
    np.testing.assert_array_equal(age.v, [*range(10), 0.0])
    np.testing.assert_array_equal(age.null, [False] * 10 + [True])
    m = cells.base_value(M)
    assert m.kind == cells.BOOL
    np.testing.assert_array_equal(m.v, [False, True, False])
    np.testing.assert_array_equal(m.null, [False, False, True])
    sex = cells.base_value(SEX)
    assert (sex.kind, sex.col) == (cells.CAT, SEX)
    np.testing.assert_array_equal(sex.v, [0, 1, 2, 3])
    np.testing.assert_array_equal(sex.null, [False, False, False, True])
    inc = cells.base_value(INC, np.array([1, 3]))  # only the listed cells
    assert inc.kind == cells.BIN
    np.testing.assert_array_equal(inc.v, [1, 3])
    np.testing.assert_array_equal(inc.null, [False, True])


def test_candidate_cells_of_a_large_integer_column() -> None:
    big = Schema.load({"tables": {"b": {"columns": {"x": {"type": "integer", "min": 0, "max": 1000}}}}})
    x = big.table("b").column("x")
    # floor/ceil of each constant and the next integer, plus cell 0 and the NULL cell (1001).
    np.testing.assert_array_equal(cells.candidate_cells(expr("x < 10.5"), x), [0, 10, 11, 12, 1001])
    np.testing.assert_array_equal(
        cells.candidate_cells(expr("x BETWEEN 3 AND 7 OR x IN (500) OR x IS NULL"), x),
        [0, 3, 4, 7, 8, 500, 501, 1001],
    )
    assert cells.candidate_cells(expr("x"), x) is None  # its value is needed, not a comparison
    assert cells.candidate_cells(expr("x * 2 < 3"), x) is None  # arithmetic on the column
    assert cells.candidate_cells(expr("x < 2 * x"), x) is None  # not a constant
    assert cells.candidate_cells(expr("age < 3"), AGE) is None  # small columns are evaluated whole


def test_candidate_cells_give_the_exact_comparison() -> None:
    """Evaluating a comparison at the candidate cells only and reading it back per cell is exact."""
    big = Schema.load({"tables": {"b": {"columns": {"x": {"type": "integer", "min": 0, "max": 1000}}}}}).table("b")
    for sql, truth in [
        ("x < 10.5", lambda v: v < 10.5),
        ("x BETWEEN 3 AND 7 OR x = 500", lambda v: 3 <= v <= 7 or v == 500),
        ("NOT (x >= 999.5)", lambda v: not v >= 999.5),
    ]:
        ev = evaluate.Evaluator(big, ["b"])
        node = expr(sql)
        ev.prepare(node)
        assert len(ev.cuts["x"]) <= 8  # a handful of slabs, not 1002 cells
        _, (bps,) = ev.set_grid(["x"])
        slab = np.searchsorted(bps, np.arange(1002), side="right") - 1
        got = np.broadcast_to(ev.truth(node), (len(bps),))[slab]
        want = [truth(v) for v in range(1001)] + [False]
        np.testing.assert_array_equal(got, want)


def test_change_points_mark_value_and_null_changes() -> None:
    val = cells.Val(cells.NUM, np.array([1.0, 1.0, 2.0, 2.0, 7.0]), np.array([False, False, False, True, True]))
    np.testing.assert_array_equal(cells.change_points(val), [2, 3])  # what a NULL cell holds is ignored
    cond = cells.boolean(np.array([True, True, False]), np.array([False, False, True]))
    np.testing.assert_array_equal(cells.change_points(cond), [2])
    np.testing.assert_array_equal(cells.change_points(cells.base_value(SEX)), [1, 2, 3])  # categories: every cell


def test_bins_are_kept_whole_or_refused() -> None:
    node = expr("inc < 5")
    assert cells.bin_truth(INC, "<", 0, 10, 10, node) is True
    assert cells.bin_truth(INC, ">=", 0, 10, 10, node) is False
    assert cells.bin_truth(INC, "<>", 0, 10, 10, node) is True  # 10 is not in [0, 10)
    with pytest.raises(UnsupportedQuery, match=r"splits bin \[0, 10\) of column 'inc'"):
        cells.bin_truth(INC, "<", 0, 10, 5, node)
    # An integer-valued binned column holds integers: [10, 20) is 10..19.
    ib = Schema.load({"tables": {"u": {"columns": {
        "n": {"type": "integer", "min": 0, "max": 29, "bins": [0, 10, 20, 30]}}}}}).table("u").column("n")
    assert cells.bin_truth(ib, "<=", 10, 20, 19, node) is True
    assert cells.bin_truth(ib, "<=", 10, 20, 19.5, node) is True
    assert cells.bin_truth(ib, "<", 10, 20, 9.5, node) is False
    with pytest.raises(UnsupportedQuery, match="splits bin"):
        cells.bin_truth(ib, "<", 10, 20, 19, node)
    with pytest.raises(UnsupportedQuery, match="splits bin"):
        cells.bin_truth(INC, "<=", 10, 20, 19.5, node)  # real values: 19.7 is in the bin


def test_categorical_and_binned_comparisons_with_constants() -> None:
    sex, inc, node = cells.base_value(SEX), cells.base_value(INC), expr("x = 1")
    one_text = cells.Val(cells.STR, "1", False)
    one_number = cells.Val(cells.NUM, 1.0, False, text="1")
    for b in (one_text, one_number):  # sex = 1 means sex = '1'
        got = cells.categorical_compare("=", sex, b, node)
        np.testing.assert_array_equal(got.v, [False, True, False, False])
        np.testing.assert_array_equal(got.null, [False, False, False, True])
    # other <> '1' holds; NULL <> '1' is unknown.
    np.testing.assert_array_equal(cells.categorical_compare("<>", sex, one_text, node).v, [True, False, True, False])
    with pytest.raises(UnsupportedQuery, match="not a declared value"):
        cells.categorical_compare("=", sex, cells.Val(cells.STR, "2", False), node)
    with pytest.raises(UnsupportedQuery, match="supports =, <>"):
        cells.categorical_compare("<", sex, one_text, node)
    got = cells.binned_compare(">=", inc, cells.Val(cells.NUM, 10.0, False), node)
    np.testing.assert_array_equal(got.v, [False, True, True, False])
    np.testing.assert_array_equal(got.null, [False, False, False, True])
    with pytest.raises(UnsupportedQuery, match="numeric constants"):
        cells.binned_compare(">=", inc, one_text, node)


# ================================================================================================
# evaluate
# ================================================================================================
CONDITIONS: list[tuple[str, Callable[[dict[str, Any]], bool | None]]] = [
    ("age < 3.5", lambda r: known(r["age"], lambda a: a < 3.5)),
    ("NOT (age < 3)", lambda r: not3(known(r["age"], lambda a: a < 3))),
    ("age BETWEEN 2 AND 4 OR m", lambda r: or3(known(r["age"], lambda a: 2 <= a <= 4), r["m"])),
    ("sex = '1' AND age >= 5", lambda r: and3(known(r["sex"], lambda s: s == "1"), known(r["age"], lambda a: a >= 5))),
    ("sex <> '1'", lambda r: known(r["sex"], lambda s: s != "1")),
    ("sex IN ('0', '1')", lambda r: known(r["sex"], lambda s: s in ("0", "1"))),
    ("sex NOT IN ('0')", lambda r: known(r["sex"], lambda s: s != "0")),
    ("sex LIKE '%'", lambda r: known(r["sex"], lambda s: s != OTHER_LABEL)),  # other matches no pattern
    ("age IS NULL", lambda r: r["age"] is None),
    ("m IS NOT TRUE", lambda r: r["m"] is not True),
    ("NOT m", lambda r: not3(r["m"])),
    ("m = 1", lambda r: known(r["m"], lambda v: v == 1)),
    ("age % 3 = 0", lambda r: known(r["age"], lambda a: a % 3 == 0)),
    ("ABS(age - 5) <= 2", lambda r: known(r["age"], lambda a: abs(a - 5) <= 2)),
    ("age / 2 > 2", lambda r: known(r["age"], lambda a: a / 2 > 2)),
    ("COALESCE(age, 7) = 7", lambda r: (7 if r["age"] is None else r["age"]) == 7),
    ("inc >= 10 AND inc < 30", lambda r: known(r["inc"], lambda lo: 10 <= lo < 30)),
    (
        "age + 2 * CAST(m AS INTEGER) > 6",
        lambda r: None if r["age"] is None or r["m"] is None else r["age"] + 2 * int(r["m"]) > 6,
    ),
    (
        "CASE WHEN sex = '0' THEN age ELSE 9 - age END >= 5",
        lambda r: known(r["age"], lambda a: (a if r["sex"] == "0" else 9 - a) >= 5),
    ),
    ("IF(m, age, 0) > 4", lambda r: known(r["age"] if r["m"] is True else 0, lambda v: v > 4)),
    (
        "age > 3 AND (sex = '1' OR m)",
        lambda r: and3(known(r["age"], lambda a: a > 3), or3(known(r["sex"], lambda s: s == "1"), r["m"])),
    ),
]


def evaluate_per_cell(sql: str) -> tuple[np.ndarray, np.ndarray, evaluate.Evaluator]:
    """The Evaluator's truth and unknown masks of a condition, read back on every cell of the table."""
    node = expr(sql)
    ev = evaluate.Evaluator(T, ["t"])
    ev.prepare(node)
    names, bps = ev.set_grid(COLUMNS)
    assert names == COLUMNS
    val = ev.cond(node)
    slabs = [np.searchsorted(b, np.arange(n), side="right") - 1 for b, n in zip(bps, SHAPE, strict=True)]
    truth = np.broadcast_to(np.asarray(val.v, dtype=bool), ev.shape)[np.ix_(*slabs)]
    unknown = np.broadcast_to(np.asarray(val.null, dtype=bool), ev.shape)[np.ix_(*slabs)]
    return truth, unknown, ev


@pytest.mark.parametrize(("sql", "brute"), CONDITIONS, ids=[c[0] for c in CONDITIONS])
def test_evaluator_matches_brute_force_on_every_cell(sql: str, brute: Callable[[dict[str, Any]], bool | None]) -> None:
    truth, unknown, _ = evaluate_per_cell(sql)
    want_true, want_unknown = np.zeros(SHAPE, dtype=bool), np.zeros(SHAPE, dtype=bool)
    for idx, row in every_cell():
        value = brute(row)
        want_true[idx], want_unknown[idx] = value is True, value is None
    np.testing.assert_array_equal(truth, want_true)
    np.testing.assert_array_equal(unknown & ~truth, want_unknown)


def test_evaluator_cuts_a_column_only_where_a_condition_changes() -> None:
    _, _, ev = evaluate_per_cell("age < 3.5 AND inc >= 10")
    assert ev.cuts == {"age": {0, 4, 10}, "inc": {0, 1, 3}}  # 0..3 | 4..9 | NULL ; [0,10) | [10,30) | NULL
    assert ev.shape == (3, 1, 3, 1)
    _, _, ev = evaluate_per_cell("age + CAST(m AS INTEGER) > 6")  # two columns in arithmetic: unit slabs
    assert ev.cuts["age"] == set(range(11)) and ev.cuts["m"] == {0, 1, 2}


def test_evaluator_resolves_columns_and_refuses_what_it_cannot_weigh() -> None:
    ev = evaluate.Evaluator(T, ["t", "x"])
    assert ev.column(expr("AGE")) is AGE  # case-insensitive
    assert ev.column(expr("x.sex")) is SEX
    assert ev.columns_in(expr("age + CAST(m AS INTEGER) > inc")) == {"age", "m", "inc"}
    with pytest.raises(SchemaError, match="not declared"):
        ev.column(expr("salary"))
    with pytest.raises(SchemaError, match="qualified by 'u'"):
        ev.column(expr("u.age"))
    for sql, match in [
        ("sex < '1'", "supports =, <>"),
        ("age = 'x3'", "'x3' is not a number, so it cannot be compared with integer column 'age'"),
        ("m = 'maybe'", "'maybe' is not a boolean"),
        ("sex = m", "categorical column 'sex' can only be compared with constants"),
        ("10 / age > 1", "not a finite number"),  # age can be 0
        ("NOT age", "not a condition"),
    ]:
        with pytest.raises(UnsupportedQuery, match=match):
            evaluate_per_cell(sql)


# ================================================================================================
# aggregates
# ================================================================================================
def test_linear_splits_items_into_terms_and_offset() -> None:
    terms, off = aggregates.linear(expr("2*COUNT(*) - 10"))
    assert off == -10 and [(k, a.kind, a.arg, a.cond) for k, a in terms] == [(2, "count", None, None)]
    terms, off = aggregates.linear(expr("(SUM(age) + COUNT(*) FILTER (WHERE m)) / 4 + 0.5"))
    assert off == Fraction(1, 2)
    assert [(k, a.kind) for k, a in terms] == [(Fraction(1, 4), "sum"), (Fraction(1, 4), "count")]
    assert terms[0][1].arg == expr("age") and terms[1][1].cond == expr("m")
    terms, off = aggregates.linear(expr("-(COUNT(age))"))
    assert off == 0 and [(k, a.arg) for k, a in terms] == [(-1, expr("age"))]
    (k, agg), = aggregates.linear(expr("COUNT_IF(m) FILTER (WHERE age > 3)"))[0]
    assert (k, agg.kind, agg.arg) == (1, "count", None)
    assert agg.cond == expr("m AND age > 3")  # both conditions, ANDed
    for sql, match in [
        ("COUNT(*) * COUNT(*)", "multiplies two non-constant"),
        ("SUM(age) / COUNT(*)", "divides by a non-constant"),
        ("COUNT(*) / 0", "divides by zero"),
        ("AVG(age)", "AVG is answered from SUM and COUNT only as a whole output column"),
        ("MAX(age)", "MIN / MAX"),
        ("COUNT(DISTINCT age)", "distinct counts"),
        ("SUM(*)", "SUM needs an expression"),
        ("age + COUNT(*)", "outside an aggregate"),
        ("SUM(COUNT(*))", "SUM's argument cannot use the aggregate"),
    ]:
        with pytest.raises(UnsupportedQuery, match=match):
            aggregates.linear(expr(sql))


def test_unparen_and_no_aggregates() -> None:
    assert aggregates.unparen(expr("((age))")) == expr("age")
    aggregates.no_aggregates(expr("age > 3 AND m"), "WHERE")
    with pytest.raises(UnsupportedQuery, match="WHERE cannot use the aggregate"):
        aggregates.no_aggregates(expr("COUNT(*) > 3"), "WHERE")


def select_items(sql: str) -> tuple[exp.Select, list[aggregates.SelectItem]]:
    tree = expr(sql)
    assert isinstance(tree, exp.Select)
    ev = evaluate.Evaluator(T, ["t"])
    items = []
    for node in tree.expressions:
        body = node.this if isinstance(node, exp.Alias) else node
        if isinstance(body, exp.Column):
            items.append(aggregates.SelectItem(node, body, ev.column(body), [], Fraction(0)))
        else:
            terms, off = aggregates.linear(body)
            items.append(aggregates.SelectItem(node, body, None, terms, off))
    return tree, items


def test_group_columns_by_name_alias_position_and_all() -> None:
    ev = evaluate.Evaluator(T, ["t"])
    tree, items = select_items("SELECT sex AS s, m, COUNT(*) FROM t GROUP BY s, 2, sex")
    assert aggregates.group_columns(tree, items, ev) == [SEX, M]  # repeats dropped, order kept
    tree, items = select_items("SELECT m, sex, COUNT(*) FROM t GROUP BY ALL")
    assert aggregates.group_columns(tree, items, ev) == [M, SEX]
    tree, items = select_items("SELECT COUNT(*) FROM t")
    assert aggregates.group_columns(tree, items, ev) == []
    for sql, match in [
        ("SELECT COUNT(*) FROM t GROUP BY 1", "refers to an aggregate"),
        ("SELECT sex, COUNT(*) FROM t GROUP BY 3", "not a position"),
        ("SELECT COUNT(*) FROM t GROUP BY age + 1", "GROUP BY expression"),
        ("SELECT COUNT(*) FROM t GROUP BY ROLLUP (sex)", "not supported"),
    ]:
        tree, items = select_items(sql)
        with pytest.raises(UnsupportedQuery, match=match):
            aggregates.group_columns(tree, items, ev)


#: SELECT item → the weight a row in a cell adds (brute force over cell values).
WEIGHTS: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
    ("COUNT(*)", lambda r: 1.0),
    ("COUNT(age)", lambda r: float(r["age"] is not None)),
    ("COUNT(*) FILTER (WHERE m)", lambda r: float(r["m"] is True)),
    ("COUNT_IF(age < 4 OR sex = '1')", lambda r: float(or3(known(r["age"], lambda a: a < 4), known(r["sex"], lambda s: s == "1")) is True)),
    ("SUM(age)", lambda r: float(r["age"] or 0)),
    ("SUM(age / 2)", lambda r: (r["age"] or 0) / 2),
    ("SUM(m)", lambda r: float(r["m"] is True)),
    (
        "SUM(CASE WHEN sex = '1' THEN age ELSE 0 END)",
        lambda r: float((r["age"] or 0) if r["sex"] == "1" else 0),
    ),
    (
        "SUM(CASE sex WHEN '0' THEN 1 WHEN '1' THEN 2 ELSE 5 END)",
        lambda r: {"0": 1.0, "1": 2.0}.get(r["sex"], 5.0),
    ),
    ("SUM(age) FILTER (WHERE sex <> '0')", lambda r: float(r["age"] or 0) if r["sex"] not in ("0", None) else 0.0),
    ("3*COUNT(*) - SUM(CAST(m AS INTEGER))", lambda r: 3.0 - float(r["m"] is True)),
    ("SUM(COALESCE(age, 10)) FILTER (WHERE inc < 20)", lambda r: (10.0 if r["age"] is None else r["age"]) if r["inc"] in (0, 10) else 0.0),
]


@pytest.mark.parametrize(("item", "brute"), WEIGHTS, ids=[w[0] for w in WEIGHTS])
def test_weights_match_brute_force_on_every_cell(item: str, brute: Callable[[dict[str, Any]], float]) -> None:
    (q,) = compile_sql(f"SELECT {item} FROM t WHERE age IS NULL OR age <> 8", SCHEMA)
    want = np.zeros(SHAPE)
    for idx, row in every_cell():
        if row["age"] != 8:  # WHERE
            want[idx] = brute(row)
    np.testing.assert_allclose(q.dense(T), want, rtol=0, atol=1e-12)
    assert q.offset == 0
    assert q.sensitivity == pytest.approx(float(np.abs(want).max()))


def test_group_weights_directly() -> None:
    """group_weights on a prepared Evaluator: one LinearQuery per group key, offset kept, empty groups included."""
    terms, off = aggregates.linear(expr("2*SUM(age) FILTER (WHERE m) + 1"))
    where = expr("sex <> '1'")
    ev = evaluate.Evaluator(T, ["t"])
    ev.prepare(where)
    for _, agg in terms:
        for part in (agg.arg, agg.cond):
            if part is not None:
                ev.prepare(part)
    ev.need_unit(SEX)
    qs = aggregates.group_weights(ev, where, terms, off, [SEX], T, "x")
    assert [dict(q.group)["sex"] for q in qs] == ["0", "1", OTHER_LABEL, None]
    for q, key in zip(qs, CELL_VALUES["sex"], strict=True):
        assert (q.label, q.offset) == ("x", 1)
        want = np.zeros(SHAPE)
        for idx, row in every_cell():
            if row["sex"] == key and key not in ("1", None) and row["m"] is True:
                want[idx] = 2.0 * (row["age"] or 0)
        np.testing.assert_array_equal(q.dense(T), want)
    assert qs[1].is_zero and qs[3].is_zero  # sex = '1' is filtered out; sex <> '1' is unknown on NULL


# ================================================================================================
# post
# ================================================================================================
RELEASED = pd.DataFrame({"sex": ["0", "1", OTHER_LABEL, None], "n": [10.0, 3.0, 7.5, 6.0], "s": [1.0, 2.0, 2.0, 0.5]})


def sexes(df: pd.DataFrame) -> list[Any]:
    """The ``sex`` labels of released rows, NULL as None (pandas may store it as NaN)."""
    return [None if pd.isna(v) else v for v in df["sex"]]


def postprocess_of(sql: str) -> post.PostProcess:
    stmt = compile_statement(sql, SCHEMA)
    assert not isinstance(stmt, statement.SetOption)
    return stmt.postprocess


def test_having_order_by_limit_on_given_rows() -> None:
    pp = postprocess_of("SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM t GROUP BY sex HAVING n > 5 ORDER BY n DESC LIMIT 2")
    assert (pp.having, pp.order_by, pp.limit, pp.offset) == ('"n" > 5', ('"n" DESC',), 2, None)
    out = pp.apply(RELEASED, ["sex", "n", "s"])
    assert sexes(out) == ["0", OTHER_LABEL]
    assert out.index.tolist() == [0, 1]
    # A HAVING aggregate that is a SELECT output (named by its SQL) is rewritten to it; ties keep the
    # domain order.
    pp = postprocess_of("SELECT sex, COUNT(*), SUM(age) AS s FROM t GROUP BY sex HAVING COUNT(*) < 8 ORDER BY s")
    out = pp.apply(RELEASED.rename(columns={"n": "COUNT(*)"}), ["sex", "COUNT(*)", "s"])
    assert sexes(out) == [None, "1", OTHER_LABEL]
    # Positions, OFFSET, NULLS FIRST on a group column.
    pp = postprocess_of("SELECT sex, COUNT(*) AS n FROM t GROUP BY sex ORDER BY 1 NULLS FIRST LIMIT 3 OFFSET 1")
    assert sexes(pp.apply(RELEASED, ["sex", "n"])) == ["0", "1", OTHER_LABEL]
    # Output names that are not identifiers.
    pp = postprocess_of('SELECT sex, COUNT(*) AS "n n" FROM t GROUP BY sex HAVING "n n" BETWEEN 4 AND 8')
    assert sexes(pp.apply(RELEASED.rename(columns={"n": "n n"}), ["sex", "n n"])) == [OTHER_LABEL, None]


def test_no_clause_is_a_noop() -> None:
    pp = postprocess_of("SELECT sex, COUNT(*) AS n FROM t GROUP BY sex")
    assert pp.is_noop and pp == post.PostProcess()
    assert pp.apply(RELEASED, ["sex", "n"]) is RELEASED
    assert pp.sql() == f'SELECT "{post.ROW_ID}" FROM {post.RELEASED} ORDER BY "{post.ROW_ID}"'


def test_build_from_a_parsed_select() -> None:
    tree = expr("SELECT sex, COUNT(*) AS n FROM t GROUP BY sex HAVING sex <> '1' ORDER BY n LIMIT 1")
    assert isinstance(tree, exp.Select)
    items = [("sex", expr("sex"), "sex"), ("n", expr("COUNT(*)"), None)]
    pp = post.build(tree, T, {"t"}, items, "duckdb")
    assert pp.having == "\"sex\" <> '1'"
    assert sexes(pp.apply(RELEASED, ["sex", "n"])) == [OTHER_LABEL]  # NULL <> '1' is unknown
    with pytest.raises(ProgrammingError, match="lacks the output columns"):
        pp.apply(RELEASED[["sex"]], ["sex", "n"])


@pytest.mark.parametrize(
    ("clauses", "error", "match"),
    [
        ("HAVING age > 3", UnsupportedQuery, "not an output of the SELECT"),
        ("HAVING SUM(age) > 3", UnsupportedQuery, "not in the SELECT list"),
        ("HAVING salary > 3", SchemaError, "neither an output column"),
        ("HAVING u.n > 3", SchemaError, "not a column of"),
        ("HAVING LENGTH(sex) > 1", UnsupportedQuery, "is not allowed"),
        ("ORDER BY 3", UnsupportedQuery, "out of range"),
        ("LIMIT -1", UnsupportedQuery, "non-negative integer constant"),
        ("LIMIT 1.5", UnsupportedQuery, "non-negative integer constant"),
    ],
)
def test_post_processing_refuses_what_the_released_rows_cannot_answer(
    clauses: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        postprocess_of(f"SELECT sex, COUNT(*) AS n FROM t GROUP BY sex {clauses}")
