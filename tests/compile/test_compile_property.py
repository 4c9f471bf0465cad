"""Property test: compiled linear query · cell histogram == an independent pandas
evaluation on the raw rows, exactly.

Random small schemas (two integer ranges, a real-valued binned column, a
categorical, a boolean), random rows including NULLs and out-of-domain values,
random supported queries generated as SQL text together with an independent
evaluator.  The independent side implements the schema's row → value rules
(floor + clamp, clamp into the first / last bin, ``other``, NULL) and SQL's
three-valued logic with pandas' nullable dtypes (Kleene ``& | ~``) — it shares
no code with the compiler.  The histogram comes from :class:`dpgate.release.cube.Cube`
and is cross-checked against a numpy histogram of the independent mapping.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate.compile import compile_statement
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

NA = pd.NA
OTHER = object()  # the independent side's "other" marker


# -- schema and data ---------------------------------------------------------------------------------
@st.composite
def schemas(draw):
    amin = draw(st.integers(-3, 3))
    amax = amin + draw(st.integers(0, 6))
    bmax = draw(st.integers(1, 3))
    edges = sorted(draw(st.sets(st.sampled_from([-1.0, 0.0, 0.5, 1.5, 2.0, 4.0]), min_size=2, max_size=4)))
    values = draw(st.lists(st.sampled_from(["x", "y", "xy", "zz"]), min_size=1, max_size=3, unique=True))
    nullable = {c: draw(st.booleans()) for c in "a b bn c f".split()}
    other = draw(st.booleans())
    return {
        "a": (amin, amax),
        "b": (0, bmax),
        "bn": edges,
        "c": values,
        "nullable": nullable,
        "other": other,
        "schema": Schema.from_dict(
            {
                "tables": {
                    "t": {
                        "columns": {
                            "a": {"type": "integer", "min": amin, "max": amax, "nullable": nullable["a"]},
                            "b": {"type": "integer", "min": 0, "max": bmax, "nullable": nullable["b"]},
                            "bn": {"type": "numeric", "bins": edges, "nullable": nullable["bn"]},
                            "c": {"type": "categorical", "values": values, "nullable": nullable["c"], "other": other},
                            "f": {"type": "boolean", "nullable": nullable["f"]},
                        }
                    }
                }
            }
        ),
    }


def every_cell_frame(s) -> pd.DataFrame:
    """One raw row per cell of the product domain (NULL and an undeclared category included)."""
    a = [*range(s["a"][0], s["a"][1] + 1), np.nan]
    b = [*range(s["b"][0], s["b"][1] + 1), np.nan]
    bn = [*s["bn"][:-1], np.nan]
    c = [*s["c"], "w", None]  # "w" is never declared
    f = [False, True, None]
    rows = list(itertools.product(a, b, bn, c, f))
    return pd.DataFrame({
        "a": pd.Series([r[0] for r in rows], dtype="float64"),
        "b": pd.Series([r[1] for r in rows], dtype="float64"),
        "bn": pd.Series([r[2] for r in rows], dtype="float64"),
        "c": pd.Series([r[3] for r in rows], dtype="object"),
        "f": pd.Series([r[4] for r in rows], dtype="boolean"),
    })


def expected_keys(s, group, where) -> list[tuple[int, ...]]:
    """The declared keys (NULL only where nullable, other only where declared) that some cell
    satisfying WHERE reaches — independently of the compiler."""
    if not group:
        return [()]
    declared_count = {"a": s["a"][1] - s["a"][0] + 1, "b": s["b"][1] - s["b"][0] + 1,
                      "bn": len(s["bn"]) - 1, "c": len(s["c"]), "f": 2}
    per_column = []
    for g in group:
        n = declared_count[g]
        cells = list(range(n))
        if g == "c":
            if s["other"]:
                cells.append(n)
            n += 1
        if s["nullable"][g]:
            cells.append(n)
        per_column.append(cells)
    m = Mapped(s, every_cell_frame(s))
    cells = np.array(m.cells(), dtype=np.int64).reshape(-1, 5)
    ok = _true(where[1](m)) if where is not None else np.ones(m.n, dtype=bool)
    reached = {tuple(int(x) for x in row[[AXES[g] for g in group]]) for row in cells[ok]}
    return [k for k in itertools.product(*per_column) if k in reached]


def _num_values(rng, n, lo, hi):
    """NULLs, in-range integers, out-of-range integers and fractional values (floored by the schema)."""
    kind = rng.choice(["null", "in", "in", "in", "out", "frac"], size=n)
    inside = rng.integers(lo, hi + 1, size=n).astype(float)
    out = rng.choice([lo - 3, lo - 1, hi + 1, hi + 5], size=n).astype(float)
    frac = rng.integers(lo - 1, hi + 1, size=n) + 0.5
    return np.select([kind == "null", kind == "in", kind == "out"], [np.nan, inside, out], frac)


@st.composite
def frames(draw, s):
    """Random rows from a drawn seed (fast); NULLs and out-of-domain values in every column."""
    n = draw(st.integers(0, 25))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bn_pool = [np.nan, -2.0, -1.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 9.0]
    c_pool = [None, *s["c"], "w", "X", ""]
    f_pool = [None, True, False]
    return pd.DataFrame(
        {
            "a": pd.Series(_num_values(rng, n, *s["a"]), dtype="float64"),
            "b": pd.Series(_num_values(rng, n, *s["b"]), dtype="float64"),
            "bn": pd.Series(rng.choice(bn_pool, size=n), dtype="float64"),
            "c": pd.Series([c_pool[i] for i in rng.integers(0, len(c_pool), size=n)], dtype="object"),
            "f": pd.Series([f_pool[i] for i in rng.integers(0, 3, size=n)], dtype="boolean"),
        }
    )


class Mapped:
    """The independent row → value mapping (schema rules re-implemented with pandas)."""

    def __init__(self, s, df):
        self.s = s
        amin, amax = s["a"]
        bmin, bmax = s["b"]
        self.a = self._int(df["a"], amin, amax)
        self.b = self._int(df["b"], bmin, bmax)
        edges = s["bn"]
        k = len(edges) - 1
        raw = df["bn"]
        idx = [None if pd.isna(v) else min(max(sum(e <= v for e in edges) - 1, 0), k - 1) for v in raw]
        self.bn_bin = idx
        # A representative value of the row's (clamped) bin: its lower edge.
        self.bn = pd.array([NA if i is None else edges[i] for i in idx], dtype="Float64")
        self.c = [None if v is None or (isinstance(v, float) and math.isnan(v)) else (v if v in s["c"] else OTHER) for v in df["c"]]
        self.f = pd.array(df["f"], dtype="boolean")
        self.n = len(df)

    @staticmethod
    def _int(raw, lo, hi):
        return pd.array(
            [NA if pd.isna(v) else int(min(max(math.floor(v), lo), hi)) for v in raw], dtype="Int64"
        )

    def cells(self) -> list[tuple[int, ...]]:
        s = self.s
        out = []
        for i in range(self.n):
            a = self.a[i]
            b = self.b[i]
            c = self.c[i]
            f = self.f[i]
            out.append(
                (
                    (s["a"][1] - s["a"][0] + 1) if a is NA else a - s["a"][0],
                    (s["b"][1] - s["b"][0] + 1) if b is NA else b - s["b"][0],
                    (len(s["bn"]) - 1) if self.bn_bin[i] is None else self.bn_bin[i],
                    (len(s["c"]) + 1) if c is None else (len(s["c"]) if c is OTHER else s["c"].index(c)),
                    2 if f is NA else int(bool(f)),
                )
            )
        return out

    def cat_eq(self, value: str) -> pd.arrays.BooleanArray:
        return pd.array([NA if v is None else (v is not OTHER and v == value) for v in self.c], dtype="boolean")

    def cat_like(self, pattern: str) -> pd.arrays.BooleanArray:
        glob = pattern.replace("%", "*").replace("_", "?")
        return pd.array(
            [NA if v is None else (v is not OTHER and fnmatch.fnmatchcase(v, glob)) for v in self.c], dtype="boolean"
        )

    def null(self, col: str) -> pd.arrays.BooleanArray:
        if col == "c":
            return pd.array([v is None for v in self.c], dtype="boolean")
        return pd.array(pd.isna(getattr(self, col)), dtype="boolean")


# -- random queries: (SQL text, independent evaluator) --------------------------------------------------
OPS = {
    "=": lambda x, y: x == y,
    "<>": lambda x, y: x != y,
    "<": lambda x, y: x < y,
    "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y,
}
FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _lit(x) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@st.composite
def predicates(draw, s, depth=2):
    kinds = ["cmp", "between", "in", "isnull", "cat", "catin", "like", "bin", "bool", "cmp2"]
    if depth > 0:
        kinds += ["not", "and", "or", "not", "and", "or"]
    kind = draw(st.sampled_from(kinds))
    if kind == "cmp":
        col = draw(st.sampled_from(["a", "b"]))
        lo, hi = s[col]
        k = draw(st.one_of(st.integers(lo - 2, hi + 2), st.integers(lo - 2, hi + 1).map(lambda v: v + 0.5)))
        op = draw(st.sampled_from(list(OPS)))
        if draw(st.booleans()):
            return f"{_lit(k)} {FLIP[op]} {col}", lambda m: OPS[op](getattr(m, col), k)
        return f"{col} {op} {_lit(k)}", lambda m: OPS[op](getattr(m, col), k)
    if kind == "between":
        col = draw(st.sampled_from(["a", "b"]))
        lo, hi = s[col]
        x, y = sorted([draw(st.integers(lo - 1, hi + 1)), draw(st.integers(lo - 1, hi + 1))])
        neg = draw(st.booleans())
        sql = f"{col} {'NOT ' if neg else ''}BETWEEN {x} AND {y}"

        def ev(m):
            v = getattr(m, col)
            r = (v >= x) & (v <= y)
            return ~r if neg else r

        return sql, ev
    if kind == "in":
        col = draw(st.sampled_from(["a", "b"]))
        lo, hi = s[col]
        ks = draw(st.lists(st.integers(lo - 1, hi + 1), min_size=1, max_size=3))
        neg = draw(st.booleans())
        sql = f"{col} {'NOT ' if neg else ''}IN ({', '.join(map(str, ks))})"

        def ev(m):
            v = getattr(m, col)
            r = v == ks[0]
            for k in ks[1:]:
                r = r | (v == k)
            return ~r if neg else r

        return sql, ev
    if kind == "isnull":
        col = draw(st.sampled_from(["a", "b", "bn", "c", "f"]))
        neg = draw(st.booleans())
        return f"{col} IS {'NOT ' if neg else ''}NULL", lambda m: ~m.null(col) if neg else m.null(col)
    if kind == "cat":
        value = draw(st.sampled_from(s["c"]))
        op = draw(st.sampled_from(["=", "<>", "!="]))
        sql = f"c {op} '{value}'" if draw(st.booleans()) else f"'{value}' {op} c"
        return sql, (lambda m: m.cat_eq(value)) if op == "=" else (lambda m: ~m.cat_eq(value))
    if kind == "catin":
        vals = draw(st.lists(st.sampled_from(s["c"]), min_size=1, max_size=3))
        neg = draw(st.booleans())
        sql = f"c {'NOT ' if neg else ''}IN ({', '.join(repr(v) for v in vals)})"

        def ev(m):
            r = m.cat_eq(vals[0])
            for v in vals[1:]:
                r = r | m.cat_eq(v)
            return ~r if neg else r

        return sql, ev
    if kind == "like":
        pattern = draw(st.sampled_from(["%", "x%", "%y", "_", "x_", "%z%", "xy", "__"]))
        neg = draw(st.booleans())
        sql = f"c {'NOT ' if neg else ''}LIKE '{pattern}'"
        return sql, (lambda m: ~m.cat_like(pattern)) if neg else (lambda m: m.cat_like(pattern))
    if kind == "bin":
        e = draw(st.sampled_from(s["bn"]))
        op = draw(st.sampled_from(["<", ">="]))
        if draw(st.booleans()):
            return f"{_lit(e)} {FLIP[op]} bn", lambda m: OPS[op](m.bn, e)
        return f"bn {op} {_lit(e)}", lambda m: OPS[op](m.bn, e)
    if kind == "bool":
        form = draw(st.sampled_from(["f", "f = true", "f = false", "f = 1", "f IS TRUE", "f IS NOT FALSE"]))
        evs = {
            "f": lambda m: m.f,
            "f = true": lambda m: m.f == True,  # noqa: E712
            "f = false": lambda m: m.f == False,  # noqa: E712
            "f = 1": lambda m: m.f == True,  # noqa: E712
            "f IS TRUE": lambda m: m.f.fillna(False),
            "f IS NOT FALSE": lambda m: ~((m.f == False).fillna(False)),  # noqa: E712
        }
        return form, evs[form]
    if kind == "cmp2":
        op = draw(st.sampled_from(list(OPS)))
        return f"a {op} b", lambda m: OPS[op](m.a, m.b)
    if kind == "not":
        sql, ev = draw(predicates(s, depth - 1))
        return f"NOT ({sql})", lambda m: ~ev(m)
    sql1, ev1 = draw(predicates(s, depth - 1))
    sql2, ev2 = draw(predicates(s, depth - 1))
    if kind == "and":
        return f"({sql1}) AND ({sql2})", lambda m: ev1(m) & ev2(m)
    return f"({sql1}) OR ({sql2})", lambda m: ev1(m) | ev2(m)


@st.composite
def values(draw, s, depth=2):
    kinds = ["col", "col", "const", "bool"]
    if depth > 0:
        kinds += ["add", "sub", "scale", "prod", "case", "coalesce"]
    kind = draw(st.sampled_from(kinds))
    if kind == "col":
        col = draw(st.sampled_from(["a", "b"]))
        return col, lambda m: getattr(m, col)
    if kind == "const":
        k = draw(st.integers(-3, 3))
        return f"({k})", lambda m: pd.array([k] * m.n, dtype="Int64")
    if kind == "bool":
        return "CAST(f AS INTEGER)", lambda m: m.f.astype("Int64")
    if kind == "coalesce":
        col = draw(st.sampled_from(["a", "b"]))
        k = draw(st.integers(-2, 2))
        return f"COALESCE({col}, {k})", lambda m: getattr(m, col).fillna(k)
    if kind == "prod":
        return "a * b", lambda m: m.a * m.b
    if kind == "scale":
        sql, ev = draw(values(s, depth - 1))
        k = draw(st.integers(-3, 3))
        return f"{k} * ({sql})", lambda m: ev(m) * k
    if kind == "case":
        p, pev = draw(predicates(s, 1))
        v1, e1 = draw(values(s, depth - 1))
        if draw(st.booleans()):
            v2, e2 = draw(values(s, depth - 1))
            sql = f"CASE WHEN {p} THEN {v1} ELSE {v2} END"
        else:
            sql, e2 = f"CASE WHEN {p} THEN {v1} END", lambda m: pd.array([NA] * m.n, dtype="Int64")

        def ev(m):
            cond = pd.array(pev(m), dtype="boolean").fillna(False)
            a, b = pd.array(e1(m), dtype="Int64"), pd.array(e2(m), dtype="Int64")
            return pd.array([a[i] if cond[i] else b[i] for i in range(m.n)], dtype="Int64")

        return sql, ev
    v1, e1 = draw(values(s, depth - 1))
    v2, e2 = draw(values(s, depth - 1))
    if kind == "add":
        return f"({v1}) + ({v2})", lambda m: e1(m) + e2(m)
    return f"({v1}) - ({v2})", lambda m: e1(m) - e2(m)


def _true(mask) -> np.ndarray:
    return np.asarray(pd.array(mask, dtype="boolean").fillna(False), dtype=bool)


@st.composite
def aggregates(draw, s):
    kind = draw(st.sampled_from(["count_star", "count_col", "sum", "sum", "count_if"]))
    if kind == "count_star":
        sql, ev = "COUNT(*)", lambda m: np.ones(m.n, dtype=np.int64)
    elif kind == "count_col":
        col = draw(st.sampled_from(["a", "b", "bn", "c", "f"]))
        sql, ev = f"COUNT({col})", lambda m: (~np.asarray(m.null(col), dtype=bool)).astype(np.int64)
    elif kind == "count_if":
        p, pev = draw(predicates(s, 1))
        return f"COUNT_IF({p})", lambda m: _true(pev(m)).astype(np.int64)
    else:
        v, vev = draw(values(s))
        sql = f"SUM({v})"

        def ev(m):
            x = pd.array(vev(m), dtype="Int64")
            return np.asarray(x.fillna(0), dtype=np.int64)

    if draw(st.booleans()):
        p, pev = draw(predicates(s, 1))
        inner = ev
        return f"{sql} FILTER (WHERE {p})", lambda m: np.where(_true(pev(m)), inner(m), 0)
    return sql, ev


@st.composite
def queries(draw, s):
    outputs = []
    for _ in range(draw(st.integers(1, 2))):
        terms = draw(st.lists(st.tuples(st.integers(-3, 3), aggregates(s)), min_size=1, max_size=2))
        offset = draw(st.integers(-5, 5))
        halve = draw(st.booleans())
        sql = " + ".join(f"{k} * {a}" for k, (a, _) in terms) + f" + {offset}"
        if halve:
            sql = f"({sql}) / 2"
        outputs.append((sql, [(Fraction(k), ev) for k, (_, ev) in terms], Fraction(offset), halve))
    where = draw(st.one_of(st.none(), predicates(s)))
    group = draw(st.lists(st.sampled_from(["a", "bn", "c", "f"]), max_size=2, unique=True))
    sql = "SELECT " + ", ".join([*group, *[f"{o[0]} AS out{i}" for i, o in enumerate(outputs)]])
    sql += " FROM t"
    if where is not None:
        sql += f" WHERE {where[0]}"
    if group:
        sql += " GROUP BY " + ", ".join(group)
    return sql, outputs, where, group


AXES = {"a": 0, "b": 1, "bn": 2, "c": 3, "f": 4}
_CON = duckdb.connect(":memory:")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_compiled_query_matches_independent_evaluation(data):
    s = data.draw(schemas())
    df = data.draw(frames(s))
    sql, outputs, where, group = data.draw(queries(s))
    schema = s["schema"]
    table = schema.table("t")
    m = Mapped(s, df)

    # Histogram over the full product domain: the cube, cross-checked with numpy.
    shape = tuple(c.n_cells for c in table.columns)
    mine = np.zeros(shape, dtype=np.int64)
    for cell in m.cells():
        mine[cell] += 1
    _CON.register("t", df)
    try:
        with Cube(_CON, schema) as cube:  # a shared connection: the caller keeps ownership
            hist = cube.histogram("t")
    finally:
        _CON.unregister("t")
    assert hist.shape == shape
    assert np.array_equal(hist, mine), "cube histogram differs from the independent mapping"

    stmt = compile_statement(sql, schema)
    row_cells = np.array(m.cells(), dtype=np.int64).reshape(-1, 5)
    where_mask = _true(where[1](m)) if where is not None else np.ones(m.n, dtype=bool)
    per_output = []
    for _, terms, offset, halve in outputs:
        contrib = [(k, np.where(where_mask, ev(m), 0)) for k, ev in terms]
        per_output.append((contrib, offset, halve))

    keys = expected_keys(s, group, where)
    assert len(stmt.group_keys) == len(keys)
    assert len(stmt.queries) == len(keys) * len(outputs)
    for gi, key in enumerate(keys):
        in_group = np.ones(m.n, dtype=bool)
        for g, k in zip(group, key, strict=True):
            in_group &= row_cells[:, AXES[g]] == k
        labels = tuple(table.column(g).labels()[k] for g, k in zip(group, key, strict=True))
        assert stmt.group_keys[gi] == (labels if group else ())
        for j, (contrib, offset, halve) in enumerate(per_output):
            q = stmt.queries[gi * len(outputs) + j]
            assert q.label == f"out{j}"
            assert tuple(v for _, v in q.group) == labels
            expected = sum((k * int(np.sum(c[in_group])) for k, c in contrib), Fraction(0)) + offset
            if halve:
                expected /= 2
            num = np.asarray(q.expand(table, [c.name for c in table.columns], [range(n) for n in shape]))
            got = Fraction(int(np.sum(num.astype(np.int64) * hist)), q.denominator) + q.offset
            assert got == expected, (sql, labels, j)


# -- large integer columns: the sparse (candidate-cell) evaluation vs every cell ---------------------------
@st.composite
def big_predicates(draw, lo, hi, depth=2):
    kind = draw(st.sampled_from(["cmp", "between", "in", "isnull"] + (["not", "and", "or"] * 2 if depth else [])))
    const = st.one_of(st.integers(lo - 3, hi + 3), st.integers(lo - 3, hi + 3).map(lambda v: v + 0.5))
    if kind == "cmp":
        k, op = draw(const), draw(st.sampled_from(list(OPS)))
        if draw(st.booleans()):
            return f"{_lit(k)} {FLIP[op]} v", lambda x: OPS[op](x, k)
        return f"v {op} {_lit(k)}", lambda x: OPS[op](x, k)
    if kind == "between":
        a, b = draw(const), draw(const)
        return f"v BETWEEN {_lit(a)} AND {_lit(b)}", lambda x: (x >= a) & (x <= b)
    if kind == "in":
        ks = draw(st.lists(const, min_size=1, max_size=4))

        def ev(x):
            r = x == ks[0]
            for k in ks[1:]:
                r = r | (x == k)
            return r

        return f"v IN ({', '.join(_lit(k) for k in ks)})", ev
    if kind == "isnull":
        return "v IS NULL", lambda x: pd.array(pd.isna(x), dtype="boolean")
    if kind == "not":
        sql, ev = draw(big_predicates(lo, hi, depth - 1))
        return f"NOT ({sql})", lambda x: ~ev(x)
    (s1, e1), (s2, e2) = draw(big_predicates(lo, hi, depth - 1)), draw(big_predicates(lo, hi, depth - 1))
    if kind == "and":
        return f"({s1}) AND ({s2})", lambda x: e1(x) & e2(x)
    return f"({s1}) OR ({s2})", lambda x: e1(x) | e2(x)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_large_integer_column_predicates_match_every_cell(data):
    lo = data.draw(st.integers(-50, 10))
    hi = lo + data.draw(st.integers(300, 2000))
    schema = Schema.from_dict({"tables": {"big": {"columns": {"v": {"type": "integer", "min": lo, "max": hi}}}}})
    sql, ev = data.draw(big_predicates(lo, hi))
    (q,) = compile_statement(f"SELECT COUNT(*) FROM big WHERE {sql}", schema).queries
    col = schema.table("big").column("v")
    cells = pd.array([*range(lo, hi + 1), NA], dtype="Int64")
    expected = _true(ev(cells)).astype(np.int64)
    got = np.asarray(q.expand(schema.table("big"), ["v"], [range(col.n_cells)])).reshape(-1) if q.columns else (
        np.full(col.n_cells, q.numerators.item())
    )
    assert q.denominator == 1
    assert np.array_equal(np.broadcast_to(got, (col.n_cells,)), expected), sql
