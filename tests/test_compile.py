"""Compiler tests: refusals (fixture corpus), canonical equality, GROUP BY keys,
weights / offsets / sensitivity, post-processing, parameters, hints and SET."""

from __future__ import annotations

import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpgate.errors as errors
from dpgate.compile import (
    MAX_GROUPS,
    CompiledStatement,
    Output,
    SetOption,
    compile_sql,
    compile_statement,
    compile_tree,
)
from dpgate.errors import (
    InvalidRequirement,
    ProgrammingError,
    QuerySyntaxError,
    UnsupportedQuery,
)
from dpgate.schema import Schema

SCHEMA = Schema.from_dict(
    {
        "tables": {
            "pums": {
                "columns": {
                    "age": {"type": "integer", "min": 0, "max": 100},
                    "income": {
                        "type": "integer",
                        "min": 0,
                        "max": 500000,
                        "bins": [0, 10000, 25000, 50000, 100000, 500001],
                    },
                    "educ": {"type": "integer", "min": 1, "max": 16},
                    "educ0": {"type": "integer", "min": 0, "max": 16},
                    "sex": {"type": "categorical", "values": ["0", "1"]},
                    "race": {"type": "categorical", "values": ["white", "black", "asian", "other_race", "50%"]},
                    "married": {"type": "boolean"},
                    "score": {"type": "numeric", "bins": [0, 0.5, 1, 2]},
                }
            },
            "t": {
                "columns": {
                    "x": {"type": "integer", "min": 0, "max": 9},
                    "big": {"type": "integer", "min": 0, "max": 3000},
                    "big2": {"type": "integer", "min": 0, "max": 3000},
                }
            },
        }
    }
)
PUMS = SCHEMA.table("pums")
FIXTURES = Path(__file__).parent / "fixtures" / "compile"


def one(sql: str, **kw) -> object:
    (q,) = compile_sql(sql, SCHEMA, **kw)
    return q


def dense_on(q, cols: list[str]) -> np.ndarray:
    """Weights on the full cells of ``cols`` (which must include the query's columns)."""
    t = SCHEMA.table(q.table)
    cols = [c.name for c in t.columns if c.name in cols]
    assert set(q.columns) <= set(cols), (q.columns, cols)
    return np.asarray(q.expand(t, cols, [range(t.column(c).n_cells) for c in cols])) / q.denominator


# -- the refusal corpus --------------------------------------------------------------------------
def _load_corpus() -> list[tuple[str, str, str, str]]:
    cases = []
    for path in sorted(FIXTURES.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        for block in re.split(r"(?m)^-- name: ", text)[1:]:
            lines = block.split("\n")
            name = lines[0].strip()
            meta, body = {}, []
            for line in lines[1:]:
                m = re.match(r"-- (error|match): (.*)$", line)
                if m and not body:
                    meta[m.group(1)] = m.group(2).strip()
                else:
                    body.append(line)
            cases.append((name, meta["error"], meta["match"], "\n".join(body).strip("\n")))
    return cases


CORPUS = _load_corpus()


def test_corpus_is_large_and_names_are_unique():
    names = [c[0] for c in CORPUS]
    assert len(names) >= 40
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name,error,match,sql", CORPUS, ids=[c[0] for c in CORPUS])
def test_refused(name, error, match, sql):
    cls = getattr(errors, error)
    with pytest.raises(cls) as info:
        compile_statement(sql, SCHEMA)
    msg = str(info.value)
    assert re.search(match, msg, re.IGNORECASE | re.DOTALL), msg
    # Every refusal is a PEP 249 ProgrammingError the gateway turns into a refusal.
    assert isinstance(info.value, ProgrammingError)
    assert msg.strip().endswith((".", ")", "]")) or len(msg) > 20


def test_compile_needs_no_database(monkeypatch):
    """compile_sql takes no connection and works with duckdb unimportable."""
    import builtins

    real_import = builtins.__import__

    def guarded(name, *args, **kwargs):
        if name == "duckdb" or name.startswith("duckdb."):
            raise AssertionError("the compiler must not touch DuckDB")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded)
    for mod in [m for m in sys.modules if m == "duckdb" or m.startswith("duckdb.")]:
        monkeypatch.delitem(sys.modules, mod)
    qs = compile_sql("SELECT sex, COUNT(*), SUM(age) FROM pums WHERE income < 25000 GROUP BY sex", SCHEMA)
    assert len(qs) == 4 * 2
    with pytest.raises(UnsupportedQuery):
        compile_sql("SELECT COUNT(*) FROM pums; DROP TABLE pums", SCHEMA)


def test_line_comment_tail_is_inert():
    """A '-- ; DROP' tail is a comment: the statement is one plain count, nothing else."""
    assert one("SELECT COUNT(*) FROM pums -- ; DROP TABLE pums") == one("SELECT COUNT(*) FROM pums")


def test_syntax_error_carries_position():
    with pytest.raises(QuerySyntaxError) as info:
        compile_sql("SELECT COUNT(*)\nFROM pums\nWHERE age >> > 3", SCHEMA)
    assert "line 3" in str(info.value)
    assert info.value.__cause__ is not None  # sqlglot's ParseError is chained


def test_schema_argument_forms(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCHEMA.to_dict()))
    a = one("SELECT COUNT(*) FROM pums WHERE age < 3")
    assert a == compile_sql("SELECT COUNT(*) FROM pums WHERE age < 3", SCHEMA.to_dict())[0]
    assert a == compile_sql("SELECT COUNT(*) FROM pums WHERE age < 3", str(path))[0]


# -- canonical equality ----------------------------------------------------------------------------
EQUIVALENT = [
    [
        "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29",
        "SELECT COUNT(*) FROM pums WHERE age >= 20 AND age < 30",
        "SELECT COUNT(*) FROM pums WHERE age > 19 AND age <= 29",
        "SELECT COUNT(*) FROM pums WHERE age IN (20, 21, 22, 23, 24, 25, 26, 27, 28, 29)",
        "SELECT COUNT(*) FROM pums WHERE 20 <= age AND 29.5 > age",
        "SELECT COUNT(*) FROM pums WHERE NOT (age < 20 OR age >= 30)",
        "select count(*) from PUMS where AGE between 20 and 29",
        'SELECT COUNT(*) FROM main."pums" WHERE "age" BETWEEN 20 AND 29',
        "SELECT COUNT(1) FROM pums p WHERE p.age BETWEEN 20 AND 29",
        "SELECT COUNT(*) FILTER (WHERE age BETWEEN 20 AND 29) FROM pums",
        "SELECT COUNT_IF(age BETWEEN 20 AND 29) FROM pums",
        "SELECT SUM(CASE WHEN age BETWEEN 20 AND 29 THEN 1 ELSE 0 END) FROM pums",
        "SELECT SUM(CAST(age BETWEEN 20 AND 29 AS INTEGER)) FROM pums",
        "FROM pums SELECT COUNT(*) WHERE age BETWEEN 20 AND 29",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE age < 30",
        "SELECT COUNT(*) FROM pums WHERE NOT (age >= 30) AND age IS NOT NULL",
        "SELECT COUNT(*) FROM pums WHERE NOT (age >= 30)",
        "SELECT COUNT(*) FROM pums WHERE age <= 29.9",
    ],
    [
        "SELECT SUM(CASE WHEN sex = '1' THEN 1 ELSE 0 END) FROM pums",
        "SELECT COUNT(*) FROM pums WHERE sex = '1'",
        "SELECT COUNT(*) FROM pums WHERE sex = 1",
        "SELECT COUNT(*) FROM pums WHERE sex IN ('1')",
        "SELECT COUNT(*) FROM pums WHERE sex LIKE '1'",
        "SELECT COUNT(*) FROM pums WHERE '1' = sex",
        "SELECT SUM(IF(sex = '1', 1, 0)) FROM pums",
        "SELECT SUM(CASE sex WHEN '1' THEN 1 END) FROM pums",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE married",
        "SELECT COUNT(*) FROM pums WHERE married = true",
        "SELECT COUNT(*) FROM pums WHERE married = 1",
        "SELECT COUNT(*) FROM pums WHERE married IS TRUE",
        "SELECT COUNT(*) FROM pums WHERE NOT married = false",
        "SELECT SUM(married) FROM pums",
        "SELECT SUM(CAST(married AS INT)) FROM pums",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE income < 25000",
        "SELECT COUNT(*) FROM pums WHERE income <= 24999",
        "SELECT COUNT(*) FROM pums WHERE income BETWEEN 0 AND 24999",
        "SELECT COUNT(*) FROM pums WHERE NOT income >= 25000",
    ],
    [
        "SELECT COUNT(age) FROM pums",
        "SELECT COUNT(*) FROM pums WHERE age IS NOT NULL",
        "SELECT COUNT(*) FROM pums WHERE age = age",
        "SELECT COUNT(*) FILTER (WHERE NOT age IS NULL) FROM pums",
    ],
    [
        "SELECT COUNT(*) FILTER (WHERE married) - COUNT(*) FILTER (WHERE NOT married) FROM pums",
        "SELECT SUM(CASE WHEN married THEN 1 WHEN NOT married THEN -1 ELSE 0 END) FROM pums",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE race LIKE '%a%'",
        "SELECT COUNT(*) FROM pums WHERE race IN ('black', 'asian', 'other_race')",
        "SELECT COUNT(*) FROM pums WHERE race ILIKE '%A%'",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE race NOT LIKE '%a%'",
        "SELECT COUNT(*) FROM pums WHERE NOT race LIKE '%a%'",
        "SELECT COUNT(*) FROM pums WHERE race NOT IN ('black', 'asian', 'other_race')",
        "SELECT COUNT(*) FROM pums WHERE race NOT ILIKE '%A%'",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE race NOT LIKE '50!%' ESCAPE '!'",
        "SELECT COUNT(*) FROM pums WHERE race <> '50%'",
    ],
    [
        "SELECT COUNT(*) FROM pums WHERE race LIKE '50!%' ESCAPE '!'",
        "SELECT COUNT(*) FROM pums WHERE race = '50%'",
    ],
]


@pytest.mark.parametrize("group", EQUIVALENT, ids=[g[0][:60] for g in EQUIVALENT])
def test_canonical_equality(group):
    qs = [one(s) for s in group]
    for s, q in zip(group, qs):
        assert q == qs[0], s
        assert hash(q) == hash(qs[0]), s
        assert q.to_json() == qs[0].to_json(), s


def test_filter_equals_where_and_equalities_distinguish():
    assert one("SELECT COUNT(*) FILTER (WHERE sex = '0') FROM pums") == one(
        "SELECT COUNT(*) FROM pums WHERE sex = '0'"
    )
    assert one("SELECT COUNT(*) FROM pums WHERE age < 30") != one("SELECT COUNT(*) FROM pums WHERE age < 31")
    assert one("SELECT COUNT(*) FROM pums WHERE sex <> '1'") != one("SELECT COUNT(*) FROM pums WHERE sex = '0'")


# -- semantics on cells: NULL, other, clamping -----------------------------------------------------
def weights_of(sql: str, col: str) -> np.ndarray:
    return dense_on(one(sql), [col])


def test_not_keeps_null_unknown():
    w = weights_of("SELECT COUNT(*) FROM pums WHERE NOT (age < 30)", "age")
    assert w[-1] == 0 and w[30] == 1 and w[29] == 0
    w = weights_of("SELECT COUNT(*) FROM pums WHERE NOT (age < 30) OR age IS NULL", "age")
    assert w[-1] == 1


def test_count_star_counts_null_and_count_col_skips():
    assert dense_on(one("SELECT COUNT(*) FROM pums"), []) == 1
    w = weights_of("SELECT COUNT(age) FROM pums", "age")
    assert w[-1] == 0 and w[:-1].min() == 1


def test_other_cell():
    w = weights_of("SELECT COUNT(*) FROM pums WHERE sex <> '1'", "sex")
    assert list(w) == [1, 0, 1, 0]  # '0', '1', other, NULL
    w = weights_of("SELECT COUNT(*) FROM pums WHERE sex NOT IN ('0', '1')", "sex")
    assert list(w) == [0, 0, 1, 0]
    w = weights_of("SELECT COUNT(*) FROM pums WHERE race LIKE '%'", "race")
    assert list(w) == [1, 1, 1, 1, 1, 0, 0]  # other matches no pattern, NULL is unknown
    w = weights_of("SELECT COUNT(*) FROM pums WHERE sex IS NULL", "sex")
    assert list(w) == [0, 0, 0, 1]


def test_integer_thresholds_and_clamping():
    w = weights_of("SELECT COUNT(*) FROM pums WHERE age < 29.5", "age")
    assert w[29] == 1 and w[30] == 0
    w = weights_of("SELECT COUNT(*) FROM pums WHERE age > 1000", "age")
    assert not w.any()
    w = weights_of("SELECT COUNT(*) FROM pums WHERE age >= 100", "age")
    assert w[100] == 1 and w[99] == 0 and w[-1] == 0  # clamped rows above 100 live in cell 100


def test_sum_values_and_sensitivity():
    q = one("SELECT SUM(age) FROM pums")
    assert q.sensitivity == 100
    w = weights_of("SELECT SUM(age) FROM pums", "age")
    assert list(w[:-1]) == list(range(101)) and w[-1] == 0
    q = one("SELECT 2*COUNT(*) FROM pums")
    assert q.sensitivity == 2 and q.offset == 0
    q = one("SELECT 2*COUNT(*) - 10 FROM pums")
    assert q.sensitivity == 2 and q.offset == -10
    q = one("SELECT (COUNT(*) + 3) / 2 + 0.25 FROM pums")
    assert q.sensitivity == 0.5 and q.offset == Fraction(7, 4)
    q = one("SELECT SUM(age * 0.5 - 1) FROM pums WHERE age > 10")
    assert q.sensitivity == 49 and q.denominator == 2
    q = one("SELECT SUM(age * educ) FROM pums")
    assert q.sensitivity == 1600
    q = one("SELECT SUM(age % 7) FROM pums")
    assert q.sensitivity == 6


def test_guarded_division_is_fine():
    q = one("SELECT SUM(CASE WHEN educ0 <> 0 THEN 16 / educ0 ELSE 0 END) FROM pums")
    assert q.sensitivity == 16
    q2 = one("SELECT SUM(16 / educ0) FILTER (WHERE educ0 > 0) FROM pums")
    assert q2 == q


def test_coalesce_and_abs():
    w = weights_of("SELECT SUM(COALESCE(age, 7)) FROM pums", "age")
    assert w[-1] == 7 and w[3] == 3
    w = weights_of("SELECT SUM(ABS(age - 50)) FROM pums", "age")
    assert w[0] == 50 and w[60] == 10


def test_binned_comparisons_on_edges():
    w = weights_of("SELECT COUNT(*) FROM pums WHERE score >= 0.5 AND score < 2", "score")
    assert list(w) == [0, 1, 1, 0]
    w = weights_of("SELECT COUNT(*) FROM pums WHERE income >= 100000", "income")
    assert list(w) == [0, 0, 0, 0, 1, 0]
    w = weights_of("SELECT COUNT(*) FROM pums WHERE income IS NULL", "income")
    assert list(w) == [0, 0, 0, 0, 0, 1]


# -- GROUP BY ----------------------------------------------------------------------------------------
def test_group_by_every_domain_key_in_order():
    st = compile_statement("SELECT sex, married, COUNT(*) AS n FROM pums GROUP BY sex, married", SCHEMA)
    assert isinstance(st, CompiledStatement)
    assert st.group_columns == ("sex", "married")
    expected = [(s, m) for s in ["0", "1", "<other>", None] for m in [False, True, None]]
    assert list(st.group_keys) == expected
    assert [tuple(v for _, v in q.group) for q in st.queries] == expected
    assert all(q.label == "n" for q in st.queries)
    # The groups partition the table: the weights sum to COUNT(*) everywhere.
    total = sum(dense_on(q, ["sex", "married"]) for q in st.queries)
    assert np.all(total == 1)


def test_group_by_position_alias_all_and_order_of_outputs():
    a = compile_statement("SELECT COUNT(*), SUM(age), sex FROM pums GROUP BY 3", SCHEMA)
    b = compile_statement("SELECT COUNT(*), SUM(age), sex AS s FROM pums GROUP BY s", SCHEMA)
    c = compile_statement("SELECT COUNT(*), SUM(age), sex FROM pums GROUP BY ALL", SCHEMA)
    for st in (a, b, c):
        assert st.queries == a.queries
        assert len(st.queries) == 8
        assert [q.label for q in st.queries[:2]] == ["COUNT(*)", "SUM(age)"]
        assert st.query(1, 1) == st.queries[3]
    assert b.outputs == (
        Output("COUNT(*)", "aggregate", None, 0),
        Output("SUM(age)", "aggregate", None, 1),
        Output("s", "group", "sex", 0),
    )


def test_group_by_with_where_and_offsets():
    st = compile_statement(
        "SELECT age, 2*COUNT(*) - 10 FROM pums WHERE sex = '1' GROUP BY age", SCHEMA
    )
    assert len(st.queries) == 102
    assert [k for (k,) in st.group_keys] == [*range(101), None]
    for (key,), q in zip(st.group_keys, st.queries):
        assert q.offset == -10 and q.sensitivity == 2
        d = dense_on(q, ["age", "sex"])
        expect = np.zeros((102, 4))
        expect[101 if key is None else key, 1] = 2
        assert np.array_equal(d, expect)
    # Absent keys are still there: the compiler never sees data.
    assert st.group_keys[100] == (100,)


def test_group_labels_for_binned():
    st = compile_statement("SELECT income, COUNT(*) FROM pums GROUP BY income", SCHEMA)
    assert [k for (k,) in st.group_keys] == [
        "[0, 10000)", "[10000, 25000)", "[25000, 50000)", "[50000, 100000)", "[100000, 500001)", None
    ]


def test_max_groups_constant():
    assert MAX_GROUPS >= 4096


# -- output names ------------------------------------------------------------------------------------
def test_output_names_and_duplicates():
    st = compile_statement("SELECT COUNT(*), COUNT(*), SUM(age) AS s FROM pums", SCHEMA)
    assert st.output_names == ("COUNT(*)", "COUNT(*)_1", "s")


# -- post-processing ------------------------------------------------------------------------------------
def _released(st: CompiledStatement, values: list[list[float]]) -> pd.DataFrame:
    rows = []
    for key, vals in zip(st.group_keys, values):
        row, j = {}, 0
        for o in st.outputs:
            if o.kind == "group":
                row[o.name] = key[o.index]
            else:
                row[o.name] = vals[j]
                j += 1
        rows.append(row)
    return pd.DataFrame(rows)


def test_having_order_limit_on_released_rows():
    st = compile_statement(
        "SELECT sex, COUNT(*) AS n, SUM(age) FROM pums GROUP BY sex "
        "HAVING COUNT(*) > 5 AND SUM(age) >= 0 ORDER BY n DESC LIMIT 2",
        SCHEMA,
    )
    df = _released(st, [[10.5, 1], [3.0, 2], [7.25, 3], [20.0, -1]])
    out = st.apply_postprocessing(df)
    assert list(out["sex"]) == ["0", "<other>"]
    assert list(out["n"]) == [10.5, 7.25]
    assert st.postprocess.limit == 2
    assert st.postprocess.having == '"n" > 5 AND "SUM(age)" >= 0'


def test_order_by_position_group_column_and_offset():
    st = compile_statement(
        "SELECT married AS m, COUNT(*) FROM pums GROUP BY married ORDER BY 2, married DESC NULLS FIRST LIMIT 5 OFFSET 1",
        SCHEMA,
    )
    df = _released(st, [[1.0], [1.0], [0.5]])
    out = st.apply_postprocessing(df)
    assert list(out["m"]) == [True, False]
    assert st.postprocess.offset == 1


def test_no_postprocessing_is_identity_and_limit_keeps_domain_order():
    st = compile_statement("SELECT sex, COUNT(*) FROM pums GROUP BY sex", SCHEMA)
    df = _released(st, [[1], [2], [3], [4]])
    assert st.apply_postprocessing(df) is df
    st = compile_statement("SELECT sex, COUNT(*) FROM pums GROUP BY sex LIMIT 3", SCHEMA)
    assert list(st.apply_postprocessing(_released(st, [[4], [3], [2], [1]]))["sex"]) == ["0", "1", "<other>"]


def test_postprocessing_keeps_extra_columns():
    st = compile_statement("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY n", SCHEMA)
    df = _released(st, [[4], [3], [2], [1]])
    df["n_low"] = df["n"] - 1
    out = st.apply_postprocessing(df)
    assert list(out["n_low"]) == [0, 1, 2, 3]


# -- parameters ----------------------------------------------------------------------------------------
def test_qmark_numeric_and_named_parameters():
    ref = one("SELECT COUNT(*) FROM pums WHERE age < 30 AND sex = '1'")
    a = compile_statement("SELECT COUNT(*) FROM pums WHERE age < ? AND sex = ?", SCHEMA, params=[30, "1"])
    b = compile_statement("SELECT COUNT(*) FROM pums WHERE sex = $2 AND age < $1", SCHEMA, params=(30, "1"))
    c = compile_statement(
        "SELECT COUNT(*) FROM pums WHERE age < :lim AND sex = :s", SCHEMA, params={"lim": 30.0, "s": "1"}
    )
    for st in (a, b, c):
        assert st.queries == (ref,)


def test_parameter_values_are_literals_not_sql():
    evil = "1' OR '1'='1"
    with pytest.raises(UnsupportedQuery, match="not a declared value"):
        compile_statement("SELECT COUNT(*) FROM pums WHERE sex = ?", SCHEMA, params=[evil])
    st = compile_statement("SELECT COUNT(*) FROM pums WHERE age IS ?", SCHEMA, params=[None])
    assert st.queries == (one("SELECT COUNT(*) FROM pums WHERE age IS NULL"),)
    st = compile_statement("SELECT COUNT(*) FROM pums WHERE married = ?", SCHEMA, params=[True])
    assert st.queries == (one("SELECT COUNT(*) FROM pums WHERE married"),)
    st = compile_statement("SELECT COUNT(*) FROM pums LIMIT ?", SCHEMA, params=[np.int64(3)])
    assert st.postprocess.limit == 3


@pytest.mark.parametrize(
    "sql,params",
    [
        ("SELECT COUNT(*) FROM pums WHERE age < ?", []),
        ("SELECT COUNT(*) FROM pums WHERE age < ?", [1, 2]),
        ("SELECT COUNT(*) FROM pums WHERE age < ?", None),
        ("SELECT COUNT(*) FROM pums WHERE age < $2", [1]),
        ("SELECT COUNT(*) FROM pums WHERE age < :a", {"b": 1}),
        ("SELECT COUNT(*) FROM pums WHERE age < :a", [1]),
        ("SELECT COUNT(*) FROM pums", [1]),
        ("SELECT COUNT(*) FROM pums WHERE age < ?", [object()]),
        ("SELECT COUNT(*) FROM pums WHERE age < ?", [float("nan")]),
    ],
)
def test_parameter_mismatch(sql, params):
    with pytest.raises(ProgrammingError):
        compile_statement(sql, SCHEMA, params=params)


# -- hints and SET ----------------------------------------------------------------------------------------
def test_hints_anywhere():
    for sql in [
        "/*+ dpgate accuracy=25 confidence=0.95 */ SELECT COUNT(*) FROM pums",
        "SELECT /*+ dpgate accuracy=25, confidence=0.95 */ COUNT(*) FROM pums",
        "SELECT COUNT(*) FROM pums /*+ dpgate accuracy='25' confidence=0.95 */",
        "SELECT COUNT(*) FROM pums WHERE age > 3 /*+ dpgate accuracy=25 */ /*+ dpgate confidence=0.95 */",
    ]:
        st = compile_statement(sql, SCHEMA)
        assert st.hints == {"accuracy": "25", "confidence": "0.95"}, sql
    st = compile_statement("SELECT COUNT(*) FROM pums WHERE sex = '1' /* plain comment */", SCHEMA)
    assert st.hints == {}
    st = compile_statement("/*+ dpgate method=pca allow_partial=on */ SELECT COUNT(*) FROM pums", SCHEMA)
    assert st.hints == {"method": "pca", "allow_partial": "on"}
    with pytest.raises(InvalidRequirement, match="exact, pca, maxent, mmse"):
        compile_statement("/*+ dpgate method=gil-pelaez */ SELECT COUNT(*) FROM pums", SCHEMA)
    # Other systems' optimizer hints are ignored.
    assert compile_statement("SELECT /*+ INDEX(pums) */ COUNT(*) FROM pums", SCHEMA).hints == {}


def test_hint_inside_string_is_not_a_hint():
    with pytest.raises(UnsupportedQuery, match="not a declared value"):
        compile_statement("SELECT COUNT(*) FROM pums WHERE sex = '/*+ dpgate accuracy=1 */'", SCHEMA)


def test_bad_hint_values():
    with pytest.raises(InvalidRequirement):
        compile_statement("/*+ dpgate accuracy=-3 */ SELECT COUNT(*) FROM pums", SCHEMA)
    with pytest.raises(InvalidRequirement):
        compile_statement("/*+ dpgate confidence=1.5 */ SELECT COUNT(*) FROM pums", SCHEMA)
    with pytest.raises(UnsupportedQuery, match="malformed"):
        compile_statement("/*+ dpgate accuracy */ SELECT COUNT(*) FROM pums", SCHEMA)


def test_set_options():
    assert compile_statement("SET dpgate.accuracy = 25", SCHEMA) == SetOption("accuracy", 25.0)
    assert compile_statement("SET dpgate.confidence = 0.95", SCHEMA) == SetOption("confidence", 0.95)
    assert compile_statement("SET dpgate.intervals = on", SCHEMA) == SetOption("intervals", True)
    assert compile_statement("SET dpgate.intervals TO off", SCHEMA) == SetOption("intervals", False)
    assert compile_statement("SET dpgate.intervals = false", SCHEMA) == SetOption("intervals", False)
    assert compile_statement("set DPGATE.Accuracy = ?", SCHEMA, params=[10]) == SetOption("accuracy", 10.0)
    with pytest.raises(InvalidRequirement):
        compile_statement("SET dpgate.confidence = 2", SCHEMA)
    with pytest.raises(UnsupportedQuery, match="session option"):
        compile_sql("SET dpgate.accuracy = 25", SCHEMA)


# -- misc -------------------------------------------------------------------------------------------------
def test_compile_tree_does_not_mutate_its_input():
    import sqlglot

    tree = sqlglot.parse_one(
        "SELECT sex, COUNT(*) FILTER (WHERE age > 3) AS n FROM pums GROUP BY sex HAVING n > 1 ORDER BY n",
        read="duckdb",
    )
    before = tree.sql()
    st = compile_tree(tree, SCHEMA)
    assert tree.sql() == before
    assert len(st.queries) == 4


def test_large_integer_column_stays_small():
    schema = {"tables": {"w": {"columns": {"income": {"type": "integer", "min": 0, "max": 500000}}}}}
    (q,) = compile_sql("SELECT COUNT(*) FROM w WHERE income >= 25000 AND income < 50000", schema)
    assert q.breakpoints == ((0, 25000, 50000),)
    (q,) = compile_sql("SELECT SUM(income) FROM w", schema)
    assert q.sensitivity == 500000


@pytest.mark.parametrize("dialect", ["duckdb", "postgres", "spark", "mysql", "oracle"])
def test_hints_in_dialects_that_parse_optimizer_hints(dialect):
    for sql in [
        "/*+ dpgate accuracy=25 */ SELECT COUNT(*) FROM pums",
        "SELECT /*+ dpgate accuracy=25 */ COUNT(*) FROM pums",
    ]:
        assert compile_statement(sql, SCHEMA, dialect=dialect).hints == {"accuracy": "25"}
    assert compile_statement("SELECT /* dpgate accuracy=25 */ COUNT(*) FROM pums", SCHEMA, dialect=dialect).hints == {}


def test_row_expressions_agree_with_duckdb_on_every_cell():
    """Arithmetic / CASE / COALESCE semantics (e.g. the sign of %) match DuckDB's on each cell value."""
    import duckdb

    schema = {"tables": {"s": {"columns": {"v": {"type": "integer", "min": -7, "max": 7}}}}}
    exprs = ["v % 3", "-v % 4", "v * 3 - 2", "ABS(v) + 1", "CASE WHEN v < 0 THEN v * v ELSE v END",
             "COALESCE(v, 5)", "CAST(v > 2 AS INTEGER)", "v / 2", "IF(v IN (1, 2), 7, -1)"]
    con = duckdb.connect(":memory:")
    for e in exprs:
        (q,) = compile_sql(f"SELECT SUM({e}) FROM s", schema)
        t = Schema.load(schema).table("s")
        got = np.asarray(q.expand(t, ["v"], [range(16)])).reshape(-1) / q.denominator
        want = [
            con.execute(f"SELECT COALESCE(SUM({e}), 0) FROM (SELECT ?::INTEGER AS v) AS s", [v]).fetchone()[0]
            for v in [*range(-7, 8), None]
        ]
        assert np.allclose(np.broadcast_to(got, (16,)), np.array(want, dtype=float)), e
