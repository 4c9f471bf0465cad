"""Wide SUM / AVG (``income``: 500 002 cells) with GROUP BY over several columns and a WHERE:
every such statement a COUNT accepts is accepted (issue 28), its group queries holding in memory
only their group's block (:mod:`dpgate.compile._padded`), the same queries as the dense
construction; a statement beyond the compiler's bound is still refused, and fast.

True values by pandas on the frame; noise seeded.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile._padded import divided, nonzero_box, padded_query, support_query
from dpgate.compile.aggregates import MAX_WIDE_BOXES
from dpgate.compile.query import LinearQuery

#: Statements refused before (their group queries held more than MAX_WIDE_BOXES dense weights)
#: whose COUNT(*) twins were answered: (aggregate, group columns, WHERE).
REFUSED_BEFORE = [
    ("SUM", ["sex", "race"], "age >= 30"),  # 2 group columns × WHERE on a third
    ("AVG", ["sex", "race"], "age >= 30"),
    ("SUM", ["sex", "race", "married"], None),  # 3 group columns
    ("SUM", ["educ", "race"], "age >= 30"),  # 16 × 6 keys × WHERE
    ("SUM", ["educ", "sex"], "married"),  # the example of benchmarks/README.md
]


def _sql(agg: str, group: list[str], where: str | None) -> str:
    cols = ", ".join(group)
    return f"SELECT {cols}, {agg}(income) AS v FROM pums" + (f" WHERE {where}" if where else "") + f" GROUP BY {cols}"


def _truth(df, agg: str, group: list[str], where: str | None) -> dict[tuple, float]:
    frame = df.query("married == 1" if where == "married" else where) if where else df  # pandas: the int column
    grouped = frame.groupby(group)["income"]
    values = grouped.sum() if agg == "SUM" else grouped.mean()
    return {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): float(v) for k, v in values.items()}


# -- the compact construction is from_grid's, exactly --------------------------------------------------
@st.composite
def padded_cases(draw: st.DrawFn) -> tuple[list[int], list[int], np.ndarray, list[int]]:
    """A grid on PUMS's age, sex, educ (axis sizes), a block inside it and where it starts."""
    sizes = [draw(st.integers(1, 6)) for _ in range(3)]
    block_shape = [draw(st.integers(1, n)) for n in sizes]
    origin = [draw(st.integers(0, n - b)) for n, b in zip(sizes, block_shape, strict=True)]
    kind = draw(st.sampled_from(["int", "half", "tenth", "sparse"]))
    values = draw(st.lists(st.integers(-3, 3), min_size=int(np.prod(block_shape)), max_size=int(np.prod(block_shape))))
    block = np.array(values, dtype=float).reshape(block_shape)
    if kind == "half":
        block = block / 2
    elif kind == "tenth":
        block = block * 0.1
    elif kind == "sparse":
        block[block < 2] = 0
    return sizes, block_shape, block, origin


@settings(max_examples=300, deadline=None)
@given(padded_cases(), st.permutations([0, 1, 2]))
def test_padded_query_is_from_grid_of_the_padded_weights(pums, case, order) -> None:
    _, schema = pums
    table = schema.table("pums")
    sizes, _, block, origin = case
    names = ["age", "sex", "educ"]
    n_cells = {"age": 101, "sex": 2, "educ": 16}
    bps = [tuple(sorted({0, *range(1, n_cells[c])[: sizes[i] - 1]})) for i, c in enumerate(names)]
    sizes = [len(b) for b in bps]
    block = block[tuple(slice(0, n) for n in sizes)]
    origin = [min(o, n - b) for o, n, b in zip(origin, sizes, block.shape, strict=True)]
    dense = np.zeros(sizes)
    dense[tuple(slice(o, o + b) for o, b in zip(origin, block.shape, strict=True))] = block
    # columns in any order: both constructions put them in declaration order
    cols = [names[i] for i in order]
    expected = LinearQuery.from_grid(table, cols, [bps[i] for i in order], np.transpose(dense, order), Fraction(3, 2))
    got, held = padded_query(table, cols, [bps[i] for i in order], np.transpose(block, order),
                             [origin[i] for i in order], Fraction(3, 2))
    assert got == expected and got.key == expected.key
    assert (got.columns, got.breakpoints, got.denominator) == (expected.columns, expected.breakpoints, expected.denominator)
    assert np.array_equal(got.numerators, expected.numerators) and held <= max(block.size, 1)
    assert support_query(table, got) == LinearQuery.from_grid(
        table, expected.columns, expected.breakpoints, (expected.numerators != 0).astype(float))
    scaled = divided(got, 1, 7)
    assert scaled.denominator == 7 and np.array_equal(scaled.numerators, got.numerators)


def test_nonzero_box_and_divided_on_a_wide_grid() -> None:
    a = np.zeros((3, 4, 5000), dtype=np.int64)
    a[1, 2:4, 10:4000] = 6
    assert nonzero_box([a]) == (slice(1, 2), slice(2, 4), slice(10, 4000))
    assert nonzero_box([np.ones((2, 2))]) is None and nonzero_box([np.zeros((2, 2))]) is None


def test_wide_group_queries_are_the_dense_ones_and_hold_only_their_block(pums) -> None:
    """A group query's numerators equal the dense construction's; the query holds its block."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    table = schema.table("pums")
    stmt = gw.compile(_sql("SUM", ["sex", "race"], "age >= 30"))
    assert len(stmt.queries) == 12
    q = stmt.queries[3]  # sex 0, race 4
    assert q.columns == ("age", "sex", "race", "income")
    dense = LinearQuery.from_grid(table, q.columns, q.breakpoints, np.asarray(q.numerators, dtype=float))
    assert dense == q and q.sensitivity == 500_000
    # every non-zero weight is in the group's box: sex 0, race 4, age >= 30, incomes 1..500 000 (weight = income)
    box = nonzero_box([q.numerators])
    assert box is not None and q.numerators[box].size == 500_000


@pytest.mark.parametrize(("agg", "group", "where"), REFUSED_BEFORE)
def test_wide_group_bys_a_count_accepts_are_answered_honestly(pums, agg, group, where) -> None:
    df, schema = pums
    sql = _sql(agg, group, where)
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=5)
    assert gw.query(sql.replace(f"{agg}(income)", "COUNT(*)"), accuracy=20).to_pandas().shape[0] > 0
    accuracy = 20 if agg == "AVG" else 3e6
    frame = gw.query(sql, accuracy=accuracy, confidence=0.999).to_pandas()
    truth = _truth(df, agg, group, where)
    checked = 0
    for _, row in frame.iterrows():
        expected = truth.get(tuple(int(row[c]) for c in group))
        if expected is None:
            if agg == "SUM":
                assert row["v_low"] <= 0 <= row["v_high"]
            continue
        assert row["v_low"] - 1e-6 <= expected <= row["v_high"] + 1e-6, (sql, row.to_dict(), expected)
        checked += 1
    assert checked >= 6


def test_statements_beyond_the_bound_are_refused_fast(pums) -> None:
    """384 groups × 500 002 weights each: refused after its first group, nothing spent."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    # AVG's COUNT(income) component is evaluated group by group first (its 384 groups: ~3 s, as before).
    for sql, seconds in (("SELECT SUM(income) FROM pums GROUP BY educ, race, sex, married", 2.0),
                         ("SELECT AVG(income) FROM pums WHERE age > 20 GROUP BY educ, race, sex, married", 15.0),
                         ("SELECT educ, race, age, SUM(income) FROM pums WHERE age BETWEEN 30 AND 33 "
                          "GROUP BY educ, race, age", 2.0)):
        started = time.process_time()
        with pytest.raises(dpgate.UnsupportedQuery, match=f"more than {MAX_WIDE_BOXES} weights"):
            gw.query(sql, accuracy=20)
        assert time.process_time() - started < seconds, sql
    assert gw.spent == 0
