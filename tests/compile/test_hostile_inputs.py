"""Hostile statements and parameters, in process: a specific refusal (or the right answer) in bounded time.

Each input here took seconds to minutes before issue 27 (exponential or quadratic
regular expressions, numbers converted before their range check); the bound is
generous for a loaded 2-core machine, the work itself is milliseconds.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from dpgate.compile import compile_statement
from dpgate.compile.bounds import MAX_MESSAGE, bounded_message, check_number_text, number_order, skip_blank
from dpgate.compile.cells import like_regex, parse_number
from dpgate.compile.statement import literal
from dpgate.errors import InvalidRequirement, ProgrammingError, QueryTooComplex, UnsupportedQuery
from dpgate.plan.explain import strip_explain

LIMIT_S = 1.0
SCHEMA = {"tables": {"t": {"columns": {
    "age": {"type": "integer", "min": 0, "max": 100},
    "label": {"type": "categorical", "values": ["a" * 40, "a" * 39 + "b", "short"]},
}}}}


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``(result or raised exception, seconds)``."""
    start = time.perf_counter()
    try:
        out: Any = call()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        out = exc
    return out, time.perf_counter() - start


def refused(call: Callable[[], Any], kind: type[Exception], match: str) -> Exception:
    out, seconds = timed(call)
    assert seconds < LIMIT_S, f"{seconds:.2f} s"
    assert isinstance(out, kind), out
    assert re.search(match, str(out)), str(out)
    assert len(str(out)) <= MAX_MESSAGE + 100
    return out


# -- regular expressions that backtracked ---------------------------------------------------------
def test_a_run_of_comments_before_no_explain_is_read_once() -> None:
    for n in (26, 40, 5000):
        out, seconds = timed(lambda n=n: strip_explain("/**/" * n + "SELECT 1"))
        assert out is None and seconds < LIMIT_S, (n, seconds)
    assert strip_explain("/**/ /* a */ -- b\nEXPLAIN SELECT 1") == "/**/ /* a */ -- b\n SELECT 1"
    assert strip_explain("/**/" * 40 + "explain(SELECT 1)") == "/**/" * 40 + " (SELECT 1)"
    assert strip_explain("EXPLAINED") is None and strip_explain("/* open EXPLAIN") is None
    with pytest.raises(UnsupportedQuery, match="EXPLAIN ANALYZE"):
        strip_explain("/**/" * 40 + "EXPLAIN  analyse SELECT 1")
    assert strip_explain("EXPLAIN ANALYZED") == " ANALYZED"
    assert skip_blank("  /* x */ -- y\n z") == 16 and skip_blank("/* x */ -- y", line_comments=False) == 8


def test_compile_a_statement_of_many_comments_in_bounded_time() -> None:
    refused(lambda: compile_statement("/**/" * 26 + "EXPLAIN", SCHEMA), UnsupportedQuery, "EXPLAIN")
    out, seconds = timed(lambda: compile_statement("/**/" * 20_000 + "SELECT COUNT(*) FROM t", SCHEMA))
    assert seconds < 5 * LIMIT_S and not isinstance(out, Exception), out  # 80 000 characters of comments


def test_a_hint_with_a_long_run_of_blanks_is_refused_quickly() -> None:
    sql = "SELECT COUNT(*) FROM t /*+ dpgate " + " " * 90_000 + "! */"
    out = refused(lambda: compile_statement(sql, SCHEMA), UnsupportedQuery, "malformed dpgate hint")
    assert len(str(out)) < 300  # the hint is quoted by a bounded excerpt
    sql = "SELECT COUNT(*) FROM t /*+ dpgate" + " accuracy=5" * 8000 + " */"
    out, seconds = timed(lambda: compile_statement(sql, SCHEMA))
    assert seconds < 5 * LIMIT_S and not isinstance(out, Exception), out
    assert compile_statement("SELECT COUNT(*) FROM t /*+ dpgate accuracy = 5 ,confidence=0.9 */", SCHEMA).hints \
        == {"accuracy": "5", "confidence": "0.9"}


def test_like_with_many_wildcards_on_a_long_label() -> None:
    pattern = "%a" * 30 + "%c"  # matches no label: .*a.*a….*c backtracked through every split
    stmt, seconds = timed(lambda: compile_statement(f"SELECT COUNT(*) FROM t WHERE label LIKE '{pattern}'", SCHEMA))
    assert seconds < LIMIT_S and not isinstance(stmt, Exception), stmt
    (q,) = stmt.queries
    assert q.sensitivity == 0.0  # no declared label matches: a constant 0, nothing to measure
    hit, seconds = timed(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE label LIKE '" + "%a" * 30 + "%b'",
                                                   SCHEMA))
    assert seconds < LIMIT_S and not isinstance(hit, Exception), hit
    assert hit.queries[0].sensitivity == 1.0
    rx = like_regex("%a" * 500 + "%b", None, ci=False)
    out, seconds = timed(lambda: rx.fullmatch("a" * 5000))
    assert out is None and seconds < LIMIT_S


def _like_reference(pattern: str, escape: str | None, ci: bool, text: str) -> bool:
    """LIKE by dynamic programming over (pattern position, text position): the definition, slowly."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        if escape and pattern[i] == escape and i + 1 < len(pattern):
            tokens.append(("lit", pattern[i + 1]))
            i += 2
            continue
        tokens.append(("any", "") if pattern[i] == "%" else ("one", "") if pattern[i] == "_" else ("lit", pattern[i]))
        i += 1
    same = (lambda a, b: a.lower() == b.lower()) if ci else (lambda a, b: a == b)
    reach = {0}
    for kind, ch in tokens:
        if kind == "any":
            reach = set(range(min(reach), len(text) + 1)) if reach else set()
        else:
            reach = {j + 1 for j in reach if j < len(text) and (kind == "one" or same(text[j], ch))}
    return len(text) in reach


def test_like_regex_agrees_with_the_definition() -> None:
    rng = random.Random(27)
    for _ in range(4000):
        pattern = "".join(rng.choice("ab%_!.*") for _ in range(rng.randint(0, 7)))
        text = "".join(rng.choice("abAB%_!.\n") for _ in range(rng.randint(0, 8)))
        escape = rng.choice([None, "!"])
        ci = rng.random() < 0.3
        got = like_regex(pattern, escape, ci).fullmatch(text) is not None
        assert got == _like_reference(pattern, escape, ci, text), (pattern, escape, ci, text)


# -- numbers: range-checked on their text ----------------------------------------------------------
@pytest.mark.parametrize("number", ["1e10000000", "1E+999999999", "-1e100000000", "1e-10000000", "0.5e-1001"])
def test_a_constant_with_a_huge_exponent_is_refused_on_its_text(number: str) -> None:
    sql = f"SELECT COUNT(*) FROM t WHERE age < {number}"
    refused(lambda: compile_statement(sql, SCHEMA), QueryTooComplex, r"exponent beyond ±1000")
    refused(lambda: parse_number(number.lstrip("-")), QueryTooComplex, r"exponent beyond ±1000")


def test_constants_out_of_range_or_with_too_many_digits() -> None:
    refused(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE age < 1e400", SCHEMA), UnsupportedQuery,
            r"floating-point range \(\|x\| ≤ 1e300\)")
    refused(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE age < 9" + "0" * 350, SCHEMA), UnsupportedQuery,
            "floating-point range")
    refused(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE age < 0." + "0" * 5000 + "1", SCHEMA),
            QueryTooComplex, "5002 digits, more than the limit of 1000")
    refused(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE age < '1e99999999'", SCHEMA), QueryTooComplex,
            "exponent")
    # Within the limits, nothing changes.
    for sql in ("age < 1e-300", "age < 2.5e1", "age < 0.000001", "age < 1e300", "age < 1_000"):
        compile_statement(f"SELECT COUNT(*) FROM t WHERE {sql}", SCHEMA)
    assert parse_number("1e-999") == Fraction(1, 10**999)
    assert [number_order(t) for t in ("0.00123", "123.4e2", "0e5", "x")] == [-3, 4, None, None]
    check_number_text("inf")  # another shape: left to the caller


@pytest.mark.parametrize(("value", "kind", "match"), [
    (Decimal("1E+999999999"), UnsupportedQuery, "floating-point range"),
    (Decimal("-1E+400"), UnsupportedQuery, "floating-point range"),
    (Decimal("1E-999999999"), QueryTooComplex, r"exponent beyond ±1000"),
    (Decimal("0E-999999999"), QueryTooComplex, r"exponent beyond ±1000"),
    (Decimal("1." + "1" * 5000), QueryTooComplex, "5001 digits"),
    (10**5000, UnsupportedQuery, "floating-point range"),
    (Fraction(10**5000 + 1, 3), QueryTooComplex, "limit of 1000 digits"),
    ("x" * 200_000, QueryTooComplex, "200000 characters"),
], ids=["huge", "large", "tiny", "zero", "digits", "int", "fraction", "string"])
def test_a_hostile_parameter_is_refused_before_it_is_written_out(value: Any, kind: type[Exception], match: str) -> None:
    sql = "SELECT COUNT(*) FROM t WHERE age < ?" if not isinstance(value, str) else \
        "SELECT COUNT(*) FROM t WHERE label = ?"
    refused(lambda: compile_statement(sql, SCHEMA, params=[value]), kind, match)
    refused(lambda: literal(value), kind, match)


def test_ordinary_parameters_bind_as_before() -> None:
    assert literal(Decimal("2.50")).sql() == "2.50" and literal(Fraction(1, 4)).sql() == "0.25"
    assert literal(10**300).sql() == "1" + "0" * 300 and literal(Decimal("1E+3")).sql() == "1000"
    assert literal(Decimal("1E-5")).sql() == "0.00001" and literal("short").sql() == "'short'"
    with pytest.raises(ProgrammingError, match="not a finite number"):
        literal(Decimal("NaN"))
    (q,) = compile_statement("SELECT COUNT(*) FROM t WHERE age < ?", SCHEMA, params=[Decimal("30")]).queries
    assert q == compile_statement("SELECT COUNT(*) FROM t WHERE age < 30", SCHEMA).queries[0]


# -- messages quote a bounded prefix ----------------------------------------------------------------
def test_refusals_quote_a_bounded_prefix_of_long_input() -> None:
    long = "z" * 90_000
    refused(lambda: compile_statement(f"SELECT COUNT(*) FROM t WHERE label = '{long}'", SCHEMA), UnsupportedQuery,
            "not a declared value")
    refused(lambda: compile_statement("SELECT COUNT(*) FROM t WHERE label = ?", SCHEMA, params=[long]),
            UnsupportedQuery, r"'… \(90000 characters\) is not a declared value")
    cut = bounded_message("head " + "x" * 10_000 + " what to change")
    assert len(cut) < MAX_MESSAGE + 60 and cut.startswith("head ") and cut.endswith(" what to change")
    refused(lambda: compile_statement(f"SET dpgate.accuracy = '{long}'", SCHEMA), InvalidRequirement, "not a number")
    refused(lambda: compile_statement(f"SET dpgate.method = {long}", SCHEMA), InvalidRequirement, "must be one of")
    refused(lambda: compile_statement(f"SET search_path = {long}", SCHEMA), UnsupportedQuery, "only SET dpgate")
