"""The per-cell accounting's atoms in blocks (dpgate.plan.cost_grid, dpgate.plan.accounting).

A release that would push the main cost grid over its limit is charged on a side grid, and
the table costs ``k · Σ_b max B_b``.  Checked against a brute force over the whole domain
(``B_j = Σ_i (α_i/S_i)|q_ij|`` per cell, the definition of Xiao & Xiong's Theorem 5.5): the
charge is never below the true ``k · max_j B_j`` (no under-count), equal to it while no
side grid exists, and the blocks' arithmetic is that of adding their charges one by one.
Also: a session of cross-cutting GROUP BYs that used to build one dense array per group
over a grid of millions of boxes now stays small; a statement beyond ``max_memory`` is
refused before anything is read or spent.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
import dpgate.datasets
from dpgate.compile import compile_sql
from dpgate.errors import QueryTooComplex
from dpgate.plan.accounting import UNITS_PER_EPSILON, CellCosts
from dpgate.plan.cost_grid import CostGrid
from dpgate.plan.state import RecordedRelease, TableState
from dpgate.schema.domains import Schema

SCHEMA = Schema.load({"tables": {"t": {"max_rows_per_individual": 2, "columns": {
    "a": {"type": "integer", "min": 0, "max": 5},
    "b": {"type": "categorical", "values": ["x", "y", "z", "w"]},
    "c": {"type": "integer", "min": 0, "max": 3},
}}}})
T = SCHEMA.table("t")

#: Statements over one, two and three columns, groups and sums: cuts that multiply.
STATEMENTS = [
    "SELECT COUNT(*) FROM t WHERE a < 3",
    "SELECT b, COUNT(*) FROM t GROUP BY b",
    "SELECT c, COUNT(*) FROM t GROUP BY c",
    "SELECT a, COUNT(*) FROM t GROUP BY a",
    "SELECT b, c, COUNT(*) FROM t GROUP BY b, c",
    "SELECT SUM(a) FROM t WHERE b = 'y'",
    "SELECT COUNT(*) FROM t WHERE a BETWEEN 1 AND 4 AND c <> 2",
    "SELECT COUNT(*) FROM t WHERE b IN ('x', 'w') OR c = 0",
    "SELECT a, b, COUNT(*) FROM t WHERE c < 2 GROUP BY a, b",
    "SELECT 2 * COUNT(*) FILTER (WHERE a = 5) - COUNT(*) FROM t",
]


def true_charge(releases: list[tuple[object, float]]) -> float:
    """``k · max_j Σ_i (α_i/S_i)|q_ij|`` over every cell of the domain (the definition)."""
    total = np.zeros(T.n_cells)
    for q, alpha in releases:
        w = np.abs(q.dense(T)).ravel()  # type: ignore[attr-defined]
        total += alpha / q.sensitivity * w  # type: ignore[attr-defined]
    return T.max_rows_per_individual * float(total.max(initial=0.0))


def session(order: list[int], alphas: list[float], max_boxes: int) -> tuple[TableState, list[tuple[object, float]]]:
    state = TableState.new(T)
    state.cost_atoms = CostGrid(T, max_boxes=max_boxes)
    done: list[tuple[object, float]] = []
    for n, (i, alpha) in enumerate(zip(order, alphas, strict=True)):
        qs = [q.linear_part for q in compile_sql(STATEMENTS[i], SCHEMA) if not q.is_zero]
        state.record_many([RecordedRelease(10 * n + k, q, q.sensitivity / alpha, 0.0, 1.0, alpha, q.sensitivity)
                           for k, q in enumerate(qs)])
        done += [(q, alpha) for q in qs]
    return state, done


@settings(max_examples=60, deadline=None)
@given(order=st.lists(st.integers(0, len(STATEMENTS) - 1), min_size=1, max_size=8),
       data=st.data(), max_boxes=st.sampled_from([2, 6, 24, 10**6]))
def test_charge_is_never_below_the_per_cell_definition(order: list[int], data: st.DataObject, max_boxes: int) -> None:
    alphas = data.draw(st.lists(st.sampled_from([0.05, 0.1, 0.3, 1.0]), min_size=len(order), max_size=len(order)))
    state, done = session(order, alphas, max_boxes)
    charged, truth = state.costs.charge, true_charge(done)
    assert state.costs.units.size == state.cost_atoms.n_atoms
    assert charged >= truth - 1e-9
    assert charged <= T.max_rows_per_individual * sum(a for _, a in done) + 1e-9
    if not state.cost_atoms.sides:  # one block: exactly the definition (up to the rounding up)
        assert charged == pytest.approx(truth, rel=1e-12, abs=1e-12)
    if max_boxes >= T.n_cells:
        assert not state.cost_atoms.sides


def test_side_grids_charge_a_group_by_once_as_the_main_grid_would() -> None:
    """Disjoint groups on a side grid cost their α once (parallel composition), and when the
    blocks' maxima are reached on a common cell the bound is the exact charge."""
    small, exact = (session([1, 2, 4], [0.5, 0.5, 0.5], m)[0] for m in (5, 10**6))
    assert small.cost_atoms.sides  # b × c did not fit the main grid of 5 boxes
    assert small.costs.charge == pytest.approx(exact.costs.charge) == pytest.approx(2 * 1.5)


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data(), k=st.integers(1, 3))
def test_blocks_add_up_like_one_release_at_a_time(sizes: list[int], data: st.DataObject, k: int) -> None:
    """``charge_units`` is k · Σ_b max_b; add_sparse, add_disjoint and charge_with agree with it."""
    starts = tuple(int(x) for x in np.cumsum([0, *sizes[:-1]]))
    n = sum(sizes)
    costs = CellCosts(n, k)
    costs.regrid(lambda u: u, starts)
    brute = np.zeros(n)
    for _ in range(data.draw(st.integers(1, 6))):
        block = data.draw(st.integers(0, len(sizes) - 1))
        lo = starts[block]
        cells = data.draw(st.lists(st.integers(lo, lo + sizes[block] - 1), min_size=1, unique=True))
        weights = np.array(data.draw(st.lists(st.sampled_from([1.0, 2.0, 0.5]), min_size=len(cells),
                                              max_size=len(cells))))
        alpha = data.draw(st.sampled_from([0.1, 0.25, 1.0]))
        S = float(weights.max())
        expected = costs.charge_with([(np.array(cells), weights, alpha, S)])
        if data.draw(st.booleans()):
            costs.add_sparse(np.array(cells), weights, alpha, S)
        else:  # one cell per "group": disjoint
            after = costs.add_disjoint([(np.array([c]), weights[i:i + 1]) for i, c in enumerate(cells)], alpha, S)
            if after is None:
                costs.add_sparse(np.array(cells), weights, alpha, S)
        brute[cells] += alpha / S * weights
        assert costs.charge == pytest.approx(expected, rel=1e-12)
    per_block = [brute[s:s + z].max() for s, z in zip(starts, sizes, strict=True)]
    assert costs.charge == pytest.approx(k * sum(per_block), rel=1e-12, abs=1e-15)
    assert costs.charge_units >= k * sum(round(x * UNITS_PER_EPSILON) for x in per_block) - len(sizes) * k * 8


REGIONS = [f"r{i:02d}" for i in range(50)]


def warehouse(n: int = 2000) -> tuple[pd.DataFrame, dict[str, object]]:
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"income": rng.integers(0, 4096, n), "region": rng.choice(REGIONS, n),
                       "age": rng.integers(0, 100, n), "sex": rng.choice(["1", "2"], n),
                       "race": rng.choice([str(i) for i in range(1, 10)], n)})
    schema = {"tables": {"w": {"columns": {
        "income": {"type": "integer", "min": 0, "max": 4095},
        "region": {"type": "categorical", "values": REGIONS},
        "age": {"type": "integer", "min": 0, "max": 99},
        "sex": {"type": "categorical", "values": ["1", "2"]},
        "race": {"type": "categorical", "values": [str(i) for i in range(1, 10)]},
    }}}}
    return df, schema


def test_cross_cutting_group_bys_stay_small() -> None:
    """The session that ran out of memory: GROUP BYs whose cuts multiply past the main cost
    grid's limit were each charged over every box of it (one 128 MiB array per group)."""
    df, schema = warehouse()
    gw = dpgate.Gateway({"w": df}, schema, budget=1e6, seed=3)
    tracemalloc.start()
    try:
        for sql in ["SELECT region, COUNT(*) FROM w GROUP BY region",
                    "SELECT age, COUNT(*) FROM w GROUP BY age",
                    "SELECT income, COUNT(*) FROM w WHERE income < 317 GROUP BY income",
                    "SELECT region, sex, COUNT(*) FROM w GROUP BY region, sex",
                    "SELECT region, race, COUNT(*) FROM w GROUP BY region, race"]:
            result = gw.query(sql, accuracy=50, confidence=0.9)
            assert all(a.meets_requirement for a in result.answers)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 600 * 2**20
    # Each GROUP BY's groups are disjoint, and some cell (income < 317) is in one group of
    # each: the charge is the sum of the statements' largest α, side grids or not.
    history = gw.history
    assert gw.spent == pytest.approx(history.groupby("sql")["alpha"].max().sum(), rel=1e-9)


def test_a_statement_beyond_max_memory_is_refused_before_anything_is_spent() -> None:
    df, schema = dpgate.datasets.load_pums()
    gw = dpgate.Gateway(df, schema, budget=10.0, seed=0, max_memory=2**20)
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=50)
    spent, released = gw.spent, len(gw.history)
    with pytest.raises(QueryTooComplex, match=r"max_memory"):  # 500 001 weights: 8 MB (a text no other test
        gw.query("SELECT married, SUM(income) AS probe FROM pums GROUP BY married", accuracy=1e6)  # compiled: cached)
    assert (gw.spent, len(gw.history)) == (spent, released)
    ok = dpgate.Gateway(df, schema, budget=10.0, seed=0)  # the default budget answers it
    assert ok.query("SELECT sex, SUM(income) FROM pums GROUP BY sex", accuracy=1e6).answers
    for bad in (0, -1, 1.5, True, "1GB"):
        with pytest.raises(dpgate.InvalidArgument, match="max_memory"):
            dpgate.Gateway(df, schema, budget=1.0, max_memory=bad)  # type: ignore[arg-type]
