"""Wide SUM / AVG columns (``income`` 0..500 000 on PUMS): the compact ledger encoding of a
query's weights, and the SUM / AVG statements with GROUP BY or WHERE that a COUNT accepts.

True values are computed by pandas on the frame (independent of dpgate); noise is seeded, so
every run draws the same answers.  Timing is measured by ``benchmarks/bench_wide.py``, not here.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpgate
from dpgate.compile.query import LinearQuery, decode_runs, encode_runs

#: Numerators are below 2⁶² in absolute value (``rationalise`` refuses larger weights).
BIG = 2**62 - 1


def _old_json(q: LinearQuery) -> str:
    """A query's ledger JSON as dpgate wrote it before the run encoding (plain nested lists)."""
    return json.dumps({"table": q.table, "columns": list(q.columns), "breakpoints": [list(b) for b in q.breakpoints],
                       "numerators": q.numerators.tolist(), "denominator": q.denominator, "offset": str(q.offset)},
                      separators=(",", ":"))


@st.composite
def numerator_arrays(draw: st.DrawFn) -> np.ndarray:
    """1-D int64 arrays: arithmetic runs, constants, single values and arbitrary integers (negative too)."""
    parts: list[np.ndarray] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["run", "constant", "single", "random"]))
        if kind == "run":
            count = draw(st.integers(1, 300))
            step = draw(st.integers(-1000, 1000))
            start = draw(st.integers(-BIG // 2, BIG // 2 - 1000 * 300))
            parts.append(start + step * np.arange(count, dtype=np.int64))
        elif kind == "constant":
            parts.append(np.full(draw(st.integers(1, 200)), draw(st.integers(-BIG, BIG)), dtype=np.int64))
        elif kind == "single":
            parts.append(np.array([draw(st.integers(-BIG, BIG))], dtype=np.int64))
        else:
            parts.append(np.array(draw(st.lists(st.integers(-BIG, BIG), min_size=1, max_size=40)), dtype=np.int64))
    return np.concatenate(parts)


@given(numerator_arrays())
def test_runs_round_trip_exactly(values: np.ndarray) -> None:
    encoded = encode_runs(values)
    if encoded is None:  # not shorter as runs: the plain list is kept
        assert values.size < 16 or len(values) <= 2 * np.count_nonzero(np.diff(np.diff(values))) + 3
        return
    assert json.loads(json.dumps(encoded)) == encoded  # plain JSON
    decoded = decode_runs(json.loads(json.dumps(encoded)))
    assert decoded.dtype == np.int64 and np.array_equal(decoded, values)
    assert encode_runs(decoded) == encoded  # canonical


@given(numerator_arrays(), st.integers(0, 2), st.integers(1, 6), st.integers(1, 10**6), st.fractions(max_denominator=7))
def test_a_querys_json_round_trips_exactly_and_old_json_still_reads(
    values: np.ndarray, axis: int, other: int, denominator: int, offset: Fraction,
) -> None:
    # A grid with the drawn values along one axis (any of three), the other axes ``other`` slabs wide.
    shape = [other, other, other]
    shape[axis] = values.size
    nums = np.moveaxis(np.broadcast_to(values, (other, other, values.size)) * np.int64(1), 2, axis).copy()
    nums[(0,) * 3] = 0  # not constant along the other axes
    nums = np.clip(nums, -BIG, BIG)
    bps = tuple(tuple(range(n)) for n in shape)
    q = LinearQuery("pums", ("a", "b", "c"), bps, nums, denominator, offset)
    text = q.to_json()
    back = LinearQuery.from_json(text)
    assert back == q and back.breakpoints == q.breakpoints and back.to_json() == text
    assert np.array_equal(back.numerators, q.numerators)
    old = _old_json(q)
    assert LinearQuery.from_json(old) == q  # ledgers written before the run encoding
    if "{" not in text[1:]:  # no runs: the text is exactly what older versions wrote
        assert text == old


def test_small_queries_keep_their_former_ledger_text() -> None:
    q = LinearQuery("t", ("x", "y"), ((0, 4), (0, 2, 5)), np.array([[1, -2, 0], [3, 0, 1]]), 3, Fraction(1, 2))
    assert q.to_json() == _old_json(q)
    scalar = LinearQuery("t", (), (), np.array(7), 1, Fraction(0))
    assert scalar.to_json() == _old_json(scalar) and LinearQuery.from_json(scalar.to_json()) == scalar


def test_sum_income_is_a_few_runs_in_the_ledger(pums) -> None:
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    stmt = gw.compile("SELECT sex, married, SUM(income) FROM pums GROUP BY sex, married")
    for q in stmt.queries:
        text = q.to_json()
        assert len(text) < 1000, len(text)  # 500 002 weights and breakpoints as a few runs
        assert LinearQuery.from_json(text) == q and len(_old_json(q)) > 1_000_000


def _truth(df, agg: str, group: list[str], where: str | None = None) -> dict[tuple, float]:
    """SQL's SUM / AVG of income per group (NULLs skipped; groups without rows absent), by pandas."""
    frame = df.query(where) if where else df
    grouped = frame.groupby(group)["income"]
    values = grouped.sum() if agg == "SUM" else grouped.mean()
    return {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): float(v) for k, v in values.items()}


WIDE = [
    ("AVG", ["educ"], None, 20),
    ("SUM", ["educ"], None, 20),
    ("SUM", ["sex", "married"], None, 20),
    ("AVG", ["sex", "married"], None, 20),
    ("AVG", ["race"], "age > 30", 20),
    ("SUM", ["race"], "age > 30", 20),
]


@pytest.mark.parametrize(("agg", "group", "where", "accuracy"), WIDE)
def test_wide_sums_and_averages_with_group_by_and_where_are_answered_honestly(pums, agg, group, where, accuracy) -> None:
    """Refused before (a grid of 8 000 032 boxes over the compiler's limit): answered now, every
    interval holding the true value, and the budget spent as a COUNT-sized statement would."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=11)
    cols = ", ".join(group)
    sql = f"SELECT {cols}, {agg}(income) AS v FROM pums" + (f" WHERE {where}" if where else "") + f" GROUP BY {cols}"
    frame = gw.query(sql, accuracy=accuracy, confidence=0.999).to_pandas()
    truth = _truth(df, agg, group, where)
    assert gw.spent > 0
    checked = 0
    for _, row in frame.iterrows():
        key = tuple(int(row[c]) for c in group)  # labels "0", True, 7 … as the frame's integers
        expected = truth.get(key)
        if expected is None:  # a declared group without rows: SQL shows none (SUM is then 0)
            if agg == "SUM":
                assert row["v_low"] <= 0 <= row["v_high"]
            continue
        assert row["v_low"] - 1e-6 <= expected <= row["v_high"] + 1e-6, (sql, key, expected, row.to_dict())
        checked += 1
    assert checked >= 3
    again = gw.query(sql, accuracy=accuracy, confidence=0.999).to_pandas()  # a repeat: from history, free
    assert (again["v_source"] == "history").all()


def test_wide_statements_compile_like_counts_or_are_refused_cleanly(pums) -> None:
    """The statements of the issue compile as SUM and AVG as they do as COUNT; one whose
    per-group queries would hold too many weights is refused with a dpgate error (no budget)."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=0)
    for tail in ("GROUP BY educ", "GROUP BY sex, married", "WHERE age > 30 GROUP BY race",
                 "WHERE income > 1000 GROUP BY educ"):
        for agg in ("COUNT(*)", "SUM(income)", "AVG(income)"):
            assert gw.compile(f"SELECT {agg} FROM pums {tail}").queries
    tail = "GROUP BY educ, race, sex, married"  # 384 groups × 500 002 weights held (each a block of its own)
    assert gw.compile(f"SELECT COUNT(*) FROM pums {tail}").queries
    with pytest.raises(dpgate.UnsupportedQuery, match="more than the limit|weights"):
        gw.query(f"SELECT SUM(income) FROM pums {tail}", accuracy=20)
    assert gw.spent == 0
