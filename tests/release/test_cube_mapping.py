"""The cube's fast GROUP BY SQL maps every row to exactly the cell the row-by-row reference does.

Counting per raw value first (two-level aggregation), the LIST_POSITION lookup of
text categoricals, the binary-search CASE of binned columns and the prefix-sum
evaluation of query batches are checked for exact equality against the plain-Python
reference mapping of ``tests/release/test_cube.py``, on both SQL paths (two-level and direct).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlglot import exp
from test_cube import ref_cells, ref_histogram

from dpgate.compile.query import LinearQuery
from dpgate.datasets import load_pums
from dpgate.release import _cube_sql
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

REGIONS = [f"r{i:02d}" for i in range(50)]


def pums_like(seed: int, n: int = 600) -> tuple[pd.DataFrame, Schema]:
    """PUMS_null (NULLs in every column) plus text, typed and wide-binned columns with
    undeclared values, and columns whose names clash with the SQL's internal aliases."""
    df, schema = load_pums(null=True)
    df = df.iloc[:n].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    region = rng.choice(np.array([*REGIONS, "elsewhere", "R01", "r1"], dtype=object), n)
    region[rng.random(n) < 0.1] = None
    df["region"] = region
    df["race_txt"] = df["race"].astype("string")  # integers as text, declared as categorical strings
    df["score"] = rng.normal(50, 30, n)  # float, 40 bins: binary search, never two-level
    df.loc[rng.random(n) < 0.05, "score"] = np.nan
    amount = pd.array(rng.integers(-20, 450, n), dtype="Int64")  # integers, 40 bins: numpy-binned keys
    amount[:5] = [0, 10, 100, 101, 390]  # on and around edges (100.5 is one)
    amount[rng.random(n) < 0.05] = pd.NA
    df["amount"] = amount
    df["n"] = rng.integers(-1, 6, n)  # names of the SQL's aliases
    df["k0"] = rng.choice(np.array(["a", "b", "c"], dtype=object), n)
    df["dpgate_0"] = pd.array(rng.choice([0, 1, 2, 7], n), dtype="Int64")
    spec = schema.to_dict()
    cols = spec["tables"]["pums"]["columns"]
    cols["race"] = {"type": "categorical", "values": ["1", "2", "3"]}  # 4..6 undeclared: other
    cols["region"] = {"type": "categorical", "values": REGIONS}
    cols["race_txt"] = {"type": "categorical", "values": ["1", "2", "3", "01"]}
    cols["score"] = {"type": "numeric", "bins": [float(e) for e in np.linspace(0, 100, 41)]}
    edges = [*range(0, 100, 10), 100.5, *range(110, 400, 10), 400]
    cols["amount"] = {"type": "integer", "min": 0, "max": 399, "bins": edges}
    cols["n"] = {"type": "integer", "min": 0, "max": 4}
    cols["k0"] = {"type": "categorical", "values": ["a", "b"]}
    cols["dpgate_0"] = {"type": "categorical", "values": ["0", "1", "2"]}
    return df, Schema.from_dict(spec)


def sub_table(t: Any, names: list[str]) -> Any:
    """The declared table restricted to ``names`` (declaration order kept)."""
    keep = {n.lower() for n in names}
    cols = {c.name: c.to_dict() for c in t.columns if c.name.lower() in keep}
    return Schema.from_dict({"tables": {t.name: {"columns": cols}}}).table(t.name)


def ref_numerator(q: LinearQuery, t: Any, df: pd.DataFrame) -> int:
    """Row by row: each row's box on the query's own grid (no dense full domain)."""
    if not q.columns:
        return int(q.numerators) * len(df)
    sub = sub_table(t, list(q.columns))
    cells = ref_cells(sub, df[[c.name for c in sub.columns]])
    box = tuple(np.searchsorted(np.asarray(bp), cells[:, j], side="right") - 1 for j, bp in enumerate(q.breakpoints))
    return sum(int(v) for v in np.asarray(q.numerators)[box].tolist())  # Python ints: no overflow


@pytest.fixture(params=["two_level", "direct"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test on both SQL paths: counting per raw value first, and mapping every row."""
    if request.param == "direct":
        monkeypatch.setattr(_cube_sql.BoundColumn, "few_values", lambda self: False)
    return str(request.param)


@pytest.mark.parametrize("seed", [0, 1])
def test_every_column_and_pair_matches_the_reference(path: str, seed: int) -> None:
    df, schema = pums_like(seed)
    t = schema.table("pums")
    with Cube(df, schema) as cube:
        names = [c.name for c in t.columns]
        for name in names:
            sub = sub_table(t, [name])
            assert np.array_equal(cube.histogram("pums", [name]), ref_histogram(sub, df[[name]])), name
        for a, b in [("region", "age"), ("race", "region"), ("score", "k0"), ("n", "dpgate_0"), ("race_txt", "married"), ("amount", "region")]:
            sub = sub_table(t, [a, b])
            order = [c.name for c in sub.columns]
            assert np.array_equal(cube.histogram("pums", order), ref_histogram(sub, df[order])), (a, b)


def group_by(t: Any, col: str, where: tuple[str, list[int], np.ndarray] | None = None) -> list[LinearQuery]:
    """The per-group indicator queries a ``GROUP BY col`` (optionally filtered) compiles to."""
    n = t.column(col).n_cells
    out = []
    for g in range(n):
        if where is None:
            out.append(LinearQuery.from_grid(t, [col], [list(range(n))], np.eye(n)[g]))
        else:
            wcol, wbp, keep = where
            w = np.zeros((n, len(wbp)))
            w[g] = keep
            out.append(LinearQuery.from_grid(t, [col, wcol], [list(range(n)), wbp], w))
    return out


def test_group_by_batches_match_the_reference(path: str) -> None:
    df, schema = pums_like(3)
    t = schema.table("pums")
    with Cube(df, schema) as cube:
        for qs in [
            group_by(t, "region"),
            group_by(t, "age"),
            group_by(t, "score"),
            group_by(t, "race_txt"),
            group_by(t, "amount"),
            group_by(t, "amount", ("sex", [0, 1], np.array([1, 0]))),
            group_by(t, "region", ("age", [0, 30, 65], np.array([0, 1, 0]))),
            group_by(t, "score", ("region", [0, 10, 50, 51], np.array([1, 0, 1, 0]))),
        ]:
            assert cube.true_numerators(qs) == [ref_numerator(q, t, df) for q in qs]


def test_mixed_batches_of_many_grids_match_the_reference(path: str) -> None:
    """More queries than the filtered-count limit, each on its own grid: the union-grid
    histogram and its prefix sums give every query exactly."""
    df, schema = pums_like(4)
    t = schema.table("pums")
    rng = np.random.default_rng(11)
    qs = []
    for _ in range(90):
        names = list(rng.choice(["age", "region", "income", "score", "race", "married"], int(rng.integers(0, 4)), replace=False))
        bps = []
        for nme in names:
            n = t.column(nme).n_cells
            inner = rng.choice(np.arange(1, n), int(rng.integers(0, min(5, n - 1) + 1)), replace=False)
            bps.append([0, *sorted(int(i) for i in inner)])
        shape = [len(b) for b in bps]
        w = rng.integers(-3, 4, shape) if rng.random() < 0.5 else (rng.random(shape) < 0.3).astype(int)
        qs.append(LinearQuery.from_grid(t, names, bps, np.asarray(w, dtype=float) / rng.choice([1, 3])))
    with Cube(df, schema) as cube:
        assert cube.true_numerators(qs) == [ref_numerator(q, t, df) for q in qs]


def test_text_categorical_group_by_is_a_lookup_not_a_case_chain() -> None:
    df, schema = pums_like(5)
    t = schema.table("pums")
    seen: list[exp.Expression] = []
    with Cube(df, schema) as cube:
        real = cube._execute

        def spy(e: exp.Expression, **kw: Any) -> Any:
            seen.append(e)
            return real(e, **kw)

        cube._execute = spy  # type: ignore[method-assign]
        cube.true_numerators(group_by(t, "region"))
    (stmt,) = seen
    # One level, the analyst's own GROUP BY of the text: no branch per value, no second pass;
    # the few distinct values are mapped to cells in numpy.
    assert not list(stmt.find_all(exp.If)) and not list(stmt.find_all(exp.Subquery))
    assert [g.sql() for g in stmt.args["group"].expressions] == ["1"]


def test_binned_cells_use_a_binary_search() -> None:
    _, schema = pums_like(6)
    col = schema.table("pums").column("score")
    bound = _cube_sql.BoundColumn(col, "score", "float")
    case = bound.cell_index()
    # 40 bins: nested CASEs of depth ceil(log2 40) = 6 below the NULL test, not 39 branches.
    nested = 0
    node: exp.Expression = case.args["default"]
    while isinstance(node, exp.Case):
        nested += 1
        node = node.args["default"]
    assert nested == 6


def test_huge_weights_are_summed_exactly(path: str) -> None:
    """Numerators near 2**62 (all queries zero-based: one union-grid scan): the bulk int64
    sums would overflow, so the exact fallback runs."""
    df, schema = pums_like(7)
    t = schema.table("pums")
    big = 2**61 + 12345
    n = t.column("age").n_cells
    qs = []
    for g in range(0, n, 7):  # one-column queries (bulk path) and two-column ones (per query)
        qs.append(LinearQuery("pums", ("age",), ((0, g, g + 1) if g else (0, 1),),
                              np.array([0, big, -3] if g else [big, 0], dtype=np.int64)))
    qs.append(LinearQuery("pums", ("age", "region"), ((0, 30), (0, 5)), np.array([[big, 0], [1, -big]], dtype=np.int64)))
    qs = [q for q in qs if all(b[-1] < t.column(c).n_cells for c, b in zip(q.columns, q.breakpoints, strict=True))]
    with Cube(df, schema) as cube:
        got = cube.true_numerators(qs)
    assert got == [ref_numerator(q, t, df) for q in qs]
    assert max(abs(v) for v in got) > 2**63  # beyond int64: Python ints throughout


@pytest.mark.parametrize("values", [
    ["", "a,b", "[x]", "it's", 'q"uote', "ünï", "tab\tx", "1"],
    ["plain", "has\x1fus", " plain", "plain "],  # control characters, spaces kept
])
def test_declared_text_values_map_exactly_whatever_they_contain(values: list[str]) -> None:
    """A text categorical keyed by its value and mapped to cells in numpy: each row lands in its
    declared value's cell (exact equality, whatever characters it holds), others and NULL in theirs."""
    raw = [*values, *values[:2], "undeclared", None, "A,B", ""]
    df = pd.DataFrame({"c": pd.Series(raw, dtype="object")})
    schema = Schema.load({"tables": {"t": {"columns": {
        "c": {"type": "categorical", "values": values, "nullable": True}}}}})
    expected = np.zeros(len(values) + 2, dtype=np.int64)  # declared cells, other, NULL
    for v in raw:
        expected[len(values) + 1 if v is None else values.index(v) if v in values else len(values)] += 1
    with Cube(df, schema) as cube:
        assert cube.histogram("t").tolist() == expected.tolist()
        q = LinearQuery.from_grid(schema.table("t"), ["c"], [list(range(len(values) + 2))],
                                  np.arange(1, len(values) + 3, dtype=float))
        assert cube.true_numerators([q]) == [int(np.dot(np.arange(1, len(values) + 3), expected))]


def test_many_distinct_undeclared_texts_map_to_the_other_cell() -> None:
    """More distinct texts than the Python lookup takes (pandas' hash table maps them): exact too."""
    raw = ["a", "a", "b", *[f"u{i}" for i in range(_cube_sql._TEXT_LOOKUP_LOOP + 10)], None, None]
    df = pd.DataFrame({"c": pd.Series(raw, dtype="object")})
    schema = Schema.load({"tables": {"t": {"columns": {
        "c": {"type": "categorical", "values": ["a", "b"], "nullable": True}}}}})
    with Cube(df, schema) as cube:
        assert cube.histogram("t").tolist() == [2, 1, _cube_sql._TEXT_LOOKUP_LOOP + 10, 2]
