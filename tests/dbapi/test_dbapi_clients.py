"""What SQL clients send, in process: typed placeholder casts (SQLAlchemy's ``%(x)s::BIGINT``), syntax errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpgate.datasets
import dpgate.dbapi as dbapi
from dpgate.errors import DataError, QuerySyntaxError, QueryTooComplex, UnsupportedQuery

PUMS, PUMS_SCHEMA = dpgate.datasets.load_pums()
PLAIN = "SELECT COUNT(*) FROM pums WHERE age < 30 AND sex = '1'"


@pytest.fixture
def con():
    c = dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=10.0, seed=1, accuracy=25)
    yield c
    c.close()


@pytest.mark.parametrize(("sql", "params"), [
    ("SELECT COUNT(*) FROM pums WHERE age < %s::BIGINT AND sex = %s::VARCHAR", [30, "1"]),
    ("SELECT COUNT(*) FROM pums WHERE age < %(a)s::BIGINT AND sex = %(s)s::TEXT", {"a": 30, "s": "1"}),
    ("SELECT COUNT(*) FROM pums WHERE age < ?::BIGINT AND sex = ?::VARCHAR", [30, "1"]),
    ("SELECT COUNT(*) FROM pums WHERE age < CAST(? AS BIGINT) AND sex = CAST(? AS TEXT)", ["30", "1"]),
    ("SELECT COUNT(*) FROM pums WHERE age < (?)::INTEGER AND sex = ?", [30, "1"]),
    ("SELECT COUNT(*) FROM pums WHERE age < $1::int8 AND sex = $2::varchar", [30, "1"]),
])
def test_typed_placeholder_casts_bind_the_value(con, sql: str, params) -> None:
    expected = con.cursor().execute(PLAIN).fetchone()
    # the same statement as the plain one: answered from history, the same number
    assert con.cursor().execute(sql, params).fetchone() == expected


def test_placeholders_are_rewritten_on_tokens() -> None:
    from sqlglot.dialects.dialect import Dialect

    from dpgate.compile.placeholders import placeholders
    from dpgate.compile.statement import tokenize

    duckdb = Dialect.get_or_raise("duckdb")
    for sql, expected in (("a < %s::BIGINT", "a < ? ::BIGINT"), ("a < ?::INT", "a < ? ::INT"),
                          ("a < %(x)s", "a < :x"), ("'%s' || b", "'%s' || b"), ("a < %s", "a < ?")):
        assert placeholders(sql, tokenize(sql, duckdb), duckdb)[0] == expected, sql


def test_a_text_cast_to_a_number_must_be_one(con) -> None:
    spent = con.spent
    with pytest.raises(DataError, match="is cast to BIGINT but is not a number"):
        con.cursor().execute("SELECT COUNT(*) FROM pums WHERE age < ?::BIGINT", ["3x"])
    with pytest.raises(QueryTooComplex, match="limit of 1000"):
        con.cursor().execute("SELECT COUNT(*) FROM pums WHERE age < CAST(? AS BIGINT)", ["9" * 5000])
    with pytest.raises(UnsupportedQuery, match="CAST to TEXT is not supported"):  # a number is not text
        con.cursor().execute("SELECT COUNT(*) FROM pums WHERE sex = CAST(? AS TEXT)", [1])
    assert con.spent == spent


def test_a_word_that_starts_no_statement_is_a_syntax_error(con) -> None:
    with pytest.raises(QuerySyntaxError, match=r"syntax error at or near 'SELEC'.*did you mean SELECT\?"):
        con.cursor().execute("SELEC COUNT(*) FROM pums")
    with pytest.raises(QuerySyntaxError, match="at or near 'frobnicate'"):
        con.cursor().execute("frobnicate")
    for statement in ("EXPORT DATABASE 'x'", "VACUUM", "INSERT INTO pums VALUES (1)"):
        with pytest.raises(UnsupportedQuery, match="statements are refused"):
            con.cursor().execute(statement)


def test_connect_reads_a_csv_or_parquet_file_like_the_cli(tmp_path) -> None:
    import duckdb

    from dpgate.errors import OperationalError, SchemaError

    csv = Path(dpgate.__file__).parent / "data" / "PUMS.csv"
    parquet = tmp_path / "pums.parquet"
    duckdb.connect().read_csv(str(csv)).write_parquet(str(parquet))
    answers = []
    for path in (str(csv), parquet):
        with dbapi.connect(path, schema=PUMS_SCHEMA, budget=1.0, seed=1, accuracy=25) as c:
            answers.append(c.cursor().execute(PLAIN).fetchone())
    assert answers[0] == answers[1]  # the same rows, the same seeded noise
    with pytest.raises(OperationalError, match="does not exist"):
        dbapi.connect(str(tmp_path / "nope.csv"), schema=PUMS_SCHEMA)
    two = {"tables": {"a": {"columns": {"x": {"type": "boolean"}}}, "b": {"columns": {"y": {"type": "boolean"}}}}}
    with pytest.raises(SchemaError, match="holds one table but the schema declares 2"):
        dbapi.connect(str(csv), schema=two)


def test_confidence_is_checked_where_it_is_given_and_a_percentage_is_recognised(con) -> None:
    from dpgate.errors import InvalidRequirement

    with pytest.raises(InvalidRequirement, match=r"must lie in \[0.5, 1\), got 95; did you mean 0.95\?"):
        dbapi.connect(PUMS, schema=PUMS_SCHEMA, confidence=95)
    cur = con.cursor()
    for sql, message in (("SET dpgate.confidence = 0.3", r"^SET dpgate.confidence must lie in \[0.5, 1\), got 0.3;"),
                         ("SET dpgate.confidence = 95", r"did you mean 0.95\?"),
                         ("SET dpgate.accuracy = -1", r"^SET dpgate.accuracy must be a finite number > 0"),
                         ("SET dpgate.intervals = maybe", r"^SET dpgate.intervals must be on or off")):
        with pytest.raises(InvalidRequirement, match=message):
            cur.execute(sql)
    assert con.settings["confidence"] == 0.95  # refused at SET: nothing changed
    with pytest.raises(InvalidRequirement, match=r"hint confidence must lie in .*did you mean 0.95\?"):
        cur.execute("SELECT /*+ dpgate confidence=95 */ COUNT(*) FROM pums")
