"""Compiler tests: canonical equality, GROUP BY keys, post-processing, parameters,
hints and SET, the package layout (stages, dispatch table, ``__all__``).

Table-like cases (SQL → weights over cells, offset, sensitivity; refused SQL →
error class and message) are fixtures in ``tests/fixtures/compile/*.sql``, run by
``tests/compile/test_compile_fixtures.py``; the schema is ``tests/fixtures/compile/schema.yaml``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

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
from dpgate.schema.domains import Schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "compile"
SCHEMA = Schema.load(str(FIXTURES / "schema.yaml"))
PUMS = SCHEMA.table("pums")


def one(sql: str, **kw) -> object:
    (q,) = compile_sql(sql, SCHEMA, **kw)
    return q


def dense_on(q, cols: list[str]) -> np.ndarray:
    """Weights on the full cells of ``cols`` (which must include the query's columns)."""
    t = SCHEMA.table(q.table)
    cols = [c.name for c in t.columns if c.name in cols]
    assert set(q.columns) <= set(cols), (q.columns, cols)
    return np.asarray(q.expand(t, cols, [range(t.column(c).n_cells) for c in cols])) / q.denominator


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
    for s, q in zip(group, qs, strict=True):
        assert q == qs[0], s
        assert hash(q) == hash(qs[0]), s
        assert q.to_json() == qs[0].to_json(), s


def test_filter_equals_where_and_equalities_distinguish():
    assert one("SELECT COUNT(*) FILTER (WHERE sex = '0') FROM pums") == one(
        "SELECT COUNT(*) FROM pums WHERE sex = '0'"
    )
    assert one("SELECT COUNT(*) FROM pums WHERE age < 30") != one("SELECT COUNT(*) FROM pums WHERE age < 31")
    assert one("SELECT COUNT(*) FROM pums WHERE sex <> '1'") != one("SELECT COUNT(*) FROM pums WHERE sex = '0'")


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
    for (key,), q in zip(st.group_keys, st.queries, strict=True):
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
    for key, vals in zip(st.group_keys, values, strict=True):
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


# -- package layout: the stage tuple, the dispatch table, public names -------------------------------------
def test_package_all_is_the_public_api():
    import dpgate
    import dpgate.compile as pkg

    assert sorted(pkg.__all__) == sorted(
        [
            "compile_sql", "compile_statement", "compile_tree", "CompiledStatement", "Output", "PostProcess",
            "SetOption", "STAGES", "HINT_KEYS", "SET_OPTIONS", "METHOD_VALUES", "MODEL_METHODS", "MAX_GROUPS",
        ]
    )
    assert all(hasattr(pkg, name) for name in pkg.__all__)
    assert dpgate.compile_sql is compile_sql


def test_no_private_names_cross_module_boundaries():
    """Modules of dpgate.compile import each other's public names only."""
    import ast

    root = Path(__file__).resolve().parents[2] / "dpgate" / "compile"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpgate"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


def test_stages_run_in_order_and_each_writes_its_own_fields():
    import sqlglot

    from dpgate.compile.stages import STAGES, Compilation

    owns = {
        "check_shape": {"select", "aggregate_nodes"},
        "resolve_table": {"table", "qualifiers", "evaluator"},
        "select_items": {"items"},
        "group_by": {"group_columns", "aggregates"},
        "output_columns": {"outputs"},
        "post_process": {"postprocess"},
        "bind_where": {"where"},
        "prepare_cells": {"n_groups"},
        "weigh": {"queries", "group_keys"},
    }
    assert [s.__name__ for s in STAGES] == list(owns)
    tree = sqlglot.parse_one("SELECT sex, COUNT(*) FROM pums WHERE age > 3 GROUP BY sex", read="duckdb")
    c = Compilation(tree, SCHEMA, "duckdb")

    def present() -> set[str]:
        return {f for f in Compilation.__slots__ if hasattr(c, f)}

    before = present()
    assert before == {"tree", "schema", "dialect", "max_outputs"}  # the inputs
    for stage in STAGES:
        stage(c)
        after = present()
        assert after - before == owns[stage.__name__], stage.__name__
        before = after
    assert c.queries == compile_tree(tree, SCHEMA).queries


def test_dispatch_table_resolves_subclasses_and_refuses_the_rest():
    from sqlglot import exp

    from dpgate.compile.nodes import handler_for

    assert handler_for(exp.TryCast) is handler_for(exp.Cast)
    assert handler_for(exp.ILike) is handler_for(exp.Like)

    class MyCast(exp.Cast):  # a subclass sqlglot does not know: resolved through the MRO
        pass

    assert handler_for(MyCast) is handler_for(exp.Cast)
    assert handler_for(exp.Sqrt) is handler_for(exp.Anonymous)  # no handler: the refusal
    with pytest.raises(UnsupportedQuery, match="function SQRT is not supported"):
        compile_sql("SELECT SUM(SQRT(age)) FROM pums", SCHEMA)
