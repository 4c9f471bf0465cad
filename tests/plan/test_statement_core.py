"""Issue 14's decision core: one plan per GROUP BY, statements that leave no trace, and
queries the atoms do not hold (wide sums, atom limits) answered on their own."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile import compile_sql
from dpgate.compile.query import LinearQuery
from dpgate.inference import ErrorLaw
from dpgate.plan import decide
from dpgate.plan.state import MAX_ATOM_WEIGHTS, TableState, isolation_key
from dpgate.schema.domains import Schema

warnings.filterwarnings("ignore", category=dpgate.Warning)


def _gw(pums, **kw) -> dpgate.Gateway:
    df, schema = pums
    return dpgate.Gateway(df, schema, budget=kw.pop("budget", 100.0), seed=kw.pop("seed", 0), **kw)


# -- GROUP BY: one plan ------------------------------------------------------------------------------------
def test_groups_history_says_nothing_about_are_their_own_releases(pums) -> None:
    gw = _gw(pums)
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=20)
    res = gw.query("SELECT age, COUNT(*) FROM pums GROUP BY age", accuracy=25)
    ages = [a for a in res.answers if a.group and a.group[0][1] is not None]
    assert len(ages) == 101 and {a.source for a in res.answers} == {"fresh"}
    scales = set()
    for a in res.answers:
        (term,) = [(w, b) for w, b in zip(a.posterior.law.coefficients, a.posterior.law.scales, strict=True) if w]
        assert term[0] == 1.0  # the release itself, history weighs nothing
        scales.add(term[1])
        assert a.halfwidth <= 25 * (1 + decide.ACCURACY_RTOL)
    assert len(scales) == 1  # one scale for every group, found once
    # Disjoint groups: the statement costs what one group costs (Theorem 5.5).
    one = _gw(pums).query("SELECT COUNT(*) FROM pums WHERE age = 40", accuracy=25)
    assert res.epsilon_spent == pytest.approx(one.epsilon_spent, rel=1e-12)


def test_a_group_by_plan_is_the_per_group_plan_on_a_fresh_table(pums) -> None:
    """With no history, each group of a GROUP BY is planned exactly as the group asked alone."""
    df, schema = pums
    table = schema.table("pums")
    qs = compile_sql("SELECT educ, COUNT(*) FROM pums GROUP BY educ", schema)
    state = TableState.new(table).refined(qs, isolate=True)
    batch = decide.plan(state, qs, 10.0, 0.9, "minimal").steps
    for q, step in zip(qs, batch, strict=True):
        alone = decide.plan(TableState.new(table).refined([q], isolate=True), [q], 10.0, 0.9, "minimal").steps[0]
        assert step.kind == alone.kind == "fresh"
        assert [m.scale for m in step.measurements] == [m.scale for m in alone.measurements]


# -- statements leave no trace unless they release -----------------------------------------------------
def test_a_refused_group_by_changes_nothing(pums) -> None:
    gw = _gw(pums, budget=0.5)
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
    with gw.locked_view("pums") as before:
        pass
    with pytest.raises(dpgate.BudgetExhausted):
        gw.query("SELECT age, race, COUNT(*) FROM pums GROUP BY age, race", accuracy=0.5)
    with gw.locked_view("pums") as after:
        pass
    assert after.atoms.n_atoms == before.atoms.n_atoms and after.atoms.breakpoints == before.atoms.breakpoints
    assert gw.spent == pytest.approx(before_spent(gw))


def before_spent(gw: dpgate.Gateway) -> float:
    return float(gw.history["cost_after"].iloc[-1])


def test_answers_from_history_do_not_refine_the_live_atoms(pums) -> None:
    gw = _gw(pums)
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=5)
    with gw.locked_view("pums") as v:
        n = v.atoms.n_atoms
    a = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30 AND age >= 0", accuracy=25).answer
    assert a.source == "history"
    with gw.locked_view("pums") as v:
        assert v.atoms.n_atoms == n


# -- queries outside the atoms ---------------------------------------------------------------------------------
def test_a_wide_sum_is_answered_on_its_own_and_reused_across_rescalings(pums) -> None:
    df, _ = pums
    gw = _gw(pums, budget=1e6)
    a = gw.query("SELECT SUM(income) FROM pums", accuracy=2e6).answer
    # Held on (atom, moment) coordinates with every wide release over income: not isolated (issue 28).
    assert a.source == "fresh" and not a.isolated and a.low <= df["income"].sum() <= a.high
    # Its cost: α on every cell of its support (sensitivity 500 000, the largest income).
    alpha = float(gw.history["alpha"].iloc[-1])
    assert gw.spent == pytest.approx(alpha, rel=1e-12)
    # An exact rescaling is answered from it, for free, with the rescaled interval.
    b = gw.query("SELECT 2 * SUM(income) FROM pums", accuracy=4e6).answer
    assert b.source == "history" and not b.isolated and b.epsilon_spent == 0.0
    assert b.value == pytest.approx(2 * a.value) and b.halfwidth == pytest.approx(2 * a.halfwidth)
    # A tighter requirement tops it up: the two releases are combined (inverse-variance).
    c = gw.query("SELECT SUM(income) FROM pums", accuracy=1e6).answer
    assert c.source == "fresh" and not c.isolated and c.halfwidth <= 1e6 * (1 + decide.ACCURACY_RTOL)
    assert np.count_nonzero(c.posterior.law.coefficients) == 2
    # Other queries are not combined with it.
    d = gw.query("SELECT COUNT(*) FROM pums WHERE income > 50000", accuracy=25).answer
    assert d.source == "fresh" and not d.isolated


def test_the_issue_sequence_is_answered(pums) -> None:
    gw = _gw(pums, budget=1e6)
    for sql in [
        "SELECT SUM(age) FROM pums",
        "SELECT educ, race, sex, married, COUNT(*) FROM pums GROUP BY educ, race, sex, married",
        "SELECT COUNT(*) FROM pums WHERE income > 50000",
    ]:
        res = gw.query(sql, accuracy=25)
        assert all(math.isfinite(a.value) for a in res.answers)


def test_max_atoms_is_settable_and_isolates_what_exceeds_it(pums) -> None:
    gw = _gw(pums, max_atoms=8)
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
    before = gw.spent
    res = gw.query("SELECT educ, COUNT(*) FROM pums GROUP BY educ", accuracy=25)
    # A GROUP BY is held whole or not at all: its 17 groups do not fit 8 atoms.
    assert all(a.isolated for a in res.answers)
    # Charged on the cost atoms exactly as planned and checked against the budget.
    assert gw.spent == pytest.approx(before + res.epsilon_spent, abs=1e-12)
    with gw.locked_view("pums") as v:
        assert v.atoms.n_atoms <= 8
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(dpgate.InvalidArgument, match="max_atoms"):
            _gw(pums, max_atoms=bad)
    df, schema = pums
    conn = dpgate.connect(df, schema=schema, budget=10.0, seed=0, max_atoms=8)
    assert conn.gateway.max_atoms == 8


def test_isolated_releases_replay_to_the_same_costs_and_estimates(pums, tmp_path) -> None:
    df, schema = pums
    path = tmp_path / "l.db"
    with dpgate.Gateway(df, schema, budget=1e6, ledger=path, seed=1) as gw:
        gw.query("SELECT SUM(age) FROM pums", accuracy=300)
        gw.query("SELECT sex, SUM(age) FROM pums GROUP BY sex", accuracy=300)
        gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
        spent = gw.spent
        a = gw.query("SELECT SUM(age) FROM pums", accuracy=300).answer
    with dpgate.Gateway(df, schema, budget=1e6, ledger=path, seed=2) as again:
        assert again.spent == pytest.approx(spent, rel=1e-12)
        b = again.query("SELECT SUM(age) FROM pums", accuracy=300).answer
        assert b.source == "history" and (b.value, b.halfwidth) == pytest.approx((a.value, a.halfwidth), rel=1e-12)


def test_the_live_state_after_each_statement_is_the_replayed_state(pums, tmp_path) -> None:
    """A recorded statement installs its planning copy as the live state (nothing refined or
    priced twice); that must be exactly what applying its ledger records gives: the same atoms,
    cost grid and exact per-cell costs, released queries, isolated histories and estimates."""
    df, schema = pums
    path = tmp_path / "l.db"
    statements = (
        ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15.0),
        ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 39", 10.0),
        ("SELECT COUNT(*) AS n, SUM(age >= 50) AS old FROM pums", 15.0),  # n from history: recorded as records
        ("SELECT age, COUNT(*) FROM pums GROUP BY age", 12.0),  # over max_atoms: isolated
        ("SELECT SUM(age) FROM pums", 1500.0),  # wide: isolated
        ("SELECT educ, COUNT(*) FROM pums WHERE married GROUP BY educ", 12.0),
        ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29", 6.0),  # partly from history: a restriction
        ("SELECT age, COUNT(*) FROM pums GROUP BY age", 8.0),  # a top-up of isolated repeats
    )
    with dpgate.Gateway(df, schema, budget=1e6, ledger=path, seed=1, max_atoms=120) as gw:
        for sql, acc in statements:
            gw.query(sql, accuracy=acc)
            live = gw._history.state("pums")
            with dpgate.Gateway(df, schema, budget=1e6, ledger=path, max_atoms=120) as again:
                replayed = again._history.state("pums")
                assert replayed.atoms.n_atoms == live.atoms.n_atoms
                assert replayed.atoms.breakpoints == live.atoms.breakpoints
                np.testing.assert_array_equal(replayed.atoms.labels, live.atoms.labels)
                assert replayed.cost_atoms.breakpoints == live.cost_atoms.breakpoints
                np.testing.assert_array_equal(replayed.costs.units, live.costs.units)
                assert replayed.costs.charge_units == live.costs.charge_units
                assert replayed.record_ids == live.record_ids and replayed.queries == live.queries
                assert sorted(replayed.isolated) == sorted(live.isolated)
                for key, hist in live.isolated.items():
                    assert replayed.isolated[key].rows == hist.rows
                    np.testing.assert_array_equal(replayed.isolated[key].blue().values, hist.blue().values)
                for q in live.queries:
                    a, b = live.blue.estimate(live.atoms.vector(q)), replayed.blue.estimate(replayed.atoms.vector(q))
                    assert (a.value, a.variance) == pytest.approx((b.value, b.variance), rel=1e-9, abs=1e-9)


def test_a_recorded_plan_is_installed_only_when_refined_for_its_releases(pums) -> None:
    """The gateway records a statement from its plan: when the plan's copy was refined for exactly
    the measured queries, the copy becomes the table's state (nothing refined or priced again);
    a plan that measures another query (a restriction) is applied from its records instead."""
    gw = _gw(pums, budget=1e6)
    plans = []
    inner = gw._plan
    gw._plan = lambda *a: plans.append(inner(*a)) or plans[-1]  # type: ignore[method-assign]
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=5.0)
    assert plans[-1].installable and gw._history.state("pums") is plans[-1].refined
    gw.query("SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 39", accuracy=20.0)
    # Measures ages 30 to 39 only: with the loose count of them, at no more per cell than
    # measuring ages < 40 at the paper's α (the guard of dpgate.plan._guard).
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 40", accuracy=10.0)
    (step,) = plans[-1].steps
    assert step.kind == "fresh" and [m.query for m in step.measurements] != [step.query.linear_part]
    assert not plans[-1].installable and gw._history.state("pums") is not plans[-1].refined
    assert plans[-1].refined.refined_for is not None  # the plan's copy was left as planned


def test_isolation_keys_name_queries_up_to_a_factor(pums) -> None:
    _, schema = pums
    (q,) = compile_sql("SELECT SUM(age) FROM pums WHERE sex = '1'", schema)
    (q3,) = compile_sql("SELECT -3 * SUM(age) FROM pums WHERE sex = '1'", schema)
    (other,) = compile_sql("SELECT SUM(age) FROM pums WHERE sex = '0'", schema)
    (k, f), (k3, f3) = isolation_key(q), isolation_key(q3)
    assert k == k3 and f3 == -3 * f and isolation_key(other)[0] != k
    assert np.unique(q.numerators).size > MAX_ATOM_WEIGHTS + 1  # wide: kept outside the atoms


# -- hold(): one split for many disjoint queries ---------------------------------------------------------------
_GRID = Schema.from_dict({"tables": {"t": {"columns": {
    "a": {"type": "integer", "min": 0, "max": 11},
    "b": {"type": "integer", "min": 0, "max": 5},
}}}}).table("t")


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=13 * 7, max_size=13 * 7),
    weights=st.lists(st.integers(1, 3), min_size=5, max_size=5),
    first=st.integers(0, 3),
)
def test_hold_gives_the_partition_refining_one_by_one_gives(labels, weights, first) -> None:
    """Disjoint queries (a cell's group, weighted) split the atoms in one step exactly as one by one."""
    grid = np.array(labels).reshape(13, 7)
    bps = (tuple(range(13)), tuple(range(7)))
    qs = [LinearQuery.from_grid(_GRID, ("a", "b"), bps, np.where(grid == g, weights[g] * (1 + (grid % 2)), 0.0))
          for g in range(5) if (grid == g).any()]
    start = TableState.new(_GRID)
    start.refine(LinearQuery.from_grid(_GRID, ("a",), (tuple(range(13)),), (np.arange(13) >= first * 3) * 1.0))
    one, many = start.refined(qs, isolate=False), start.refined([])
    assert not many.hold(qs)  # one split holds them all
    assert many.atoms.n_atoms == one.atoms.n_atoms
    for q in qs:  # each query is constant on the prepared atoms: refining again changes nothing
        assert many.atoms.refine(q) is None
        np.testing.assert_array_equal(np.sort(many.atoms.vector(q)), np.sort(one.atoms.vector(q)))
    np.testing.assert_allclose(np.sort(many.atoms.cell_sizes), np.sort(one.atoms.cell_sizes))


def _box_query(draw: st.DrawFn) -> LinearQuery:
    """A query over ``a``, ``b`` or both, non-zero on one to three random boxes of its own grid."""
    cols = draw(st.sampled_from([("a",), ("b",), ("a", "b")]))
    bps = tuple((0, *sorted(draw(st.sets(st.integers(1, _GRID.column(c).n_cells - 1), max_size=4)))) for c in cols)
    nums = np.zeros(tuple(len(b) for b in bps))
    for _ in range(draw(st.integers(1, 3))):
        nums[tuple(draw(st.integers(0, len(b) - 1)) for b in bps)] = draw(st.integers(-2, 3))
    return LinearQuery.from_grid(_GRID, cols, bps, nums)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.composite(_box_query)(), min_size=2, max_size=6))
def test_joint_split_by_boxes_equals_the_grid_pass(qs: list[LinearQuery]) -> None:
    """The joint split of a statement's leading disjoint queries, built box by box, is the one
    a pass over the whole joint grid per query gives (same codes, same leading run)."""
    from dpgate.plan import _joint

    qs = [q for q in qs if not q.is_zero]
    split, run = _joint._compute_joint_split(_GRID, qs)
    cols = tuple(c.name for c in _GRID.columns if any(c.name in q.columns for q in qs))
    grid = tuple(tuple(sorted({b for q in qs for c, bp in zip(q.columns, q.breakpoints, strict=True)
                               if c == name for b in bp})) for name in cols)
    code, base, want = np.zeros(tuple(len(b) for b in grid), dtype=np.int64), 0, len(qs)
    for k, q in enumerate(qs):
        e = q.expand(_GRID, cols, grid)
        if code[e != 0].any():
            want = k
            break
        _, rank = np.unique(e[e != 0], return_inverse=True)
        code[e != 0] = base + 1 + rank
        base += int(rank.max(initial=0)) + 1
    assert run == want
    if want < 2:
        assert split is None
    else:
        assert split is not None
        np.testing.assert_array_equal(split.expand(_GRID, cols, grid), code)


def test_an_own_release_law_is_the_single_laplace(pums) -> None:
    gw = _gw(pums)
    res = gw.query("SELECT race, COUNT(*) FROM pums GROUP BY race", accuracy=10, confidence=0.9)
    for a in res.answers:
        m = a.posterior.law
        single = ErrorLaw([1.0], [max(m.scales[np.flatnonzero(m.coefficients)])], lattice=[m.lattice[-1]])
        c = a.interval_confidence  # 0.9 stated; the first ask's interval is at 1 − 0.9·0.1 (dpgate.plan.asks)
        lo, hi = a.posterior.certified_interval(c)  # the released interval may be cut at 0 (race 5 is empty)
        assert (hi - lo) / 2 == pytest.approx(single.halfwidth(c), rel=1e-12)
        assert (a.low, a.high) == pytest.approx(a.posterior.interval(c), rel=1e-14)


def test_groups_answer_the_same_on_pandas_frames_as_on_duckdb(pums) -> None:
    df, schema = pums
    sql = "SELECT married, COUNT(*) FROM pums GROUP BY married"
    a = dpgate.Gateway(df, schema, budget=5.0, seed=4).query(sql, accuracy=20).to_pandas()
    b = dpgate.Gateway({"pums": df.copy()}, schema, budget=5.0, seed=4).query(sql, accuracy=20).to_pandas()
    pd.testing.assert_frame_equal(a, b)


def test_max_outputs_refuses_a_huge_group_by_before_any_work(pums) -> None:
    gw = _gw(pums)
    sql = "SELECT age, educ, race, COUNT(*) FROM pums GROUP BY age, educ, race"
    with pytest.raises(dpgate.QueryTooComplex, match=r"9696 outputs .* max_outputs = 4096"):
        gw.query(sql, accuracy=25)
    assert gw.spent == 0.0 and len(gw.history) == 0
    with pytest.raises(dpgate.QueryTooComplex, match="max_outputs = 50"):
        _gw(pums, max_outputs=50).query("SELECT age, COUNT(*) FROM pums GROUP BY age", accuracy=25)
    for bad in (0, 1.5, None):
        with pytest.raises(dpgate.InvalidArgument, match="max_outputs"):
            _gw(pums, max_outputs=bad)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.0, -1.0, 0.5, 3.0]), st.floats(0.5, 50.0),
                          st.floats(-1e4, 1e4), st.sampled_from([0.0, 1.0, 0.5])), min_size=1, max_size=6),
       st.sampled_from([1.0, 2.0, -0.25]))
def test_repeats_estimate_in_closed_form_what_their_blue_estimates(rows, factor) -> None:
    """An isolated query's repeats are estimated in closed form (one unknown); that must be the
    BLUE over them: same value, weights, variance and certified half-width."""
    from dpgate.plan.state import Repeats

    repeats = Repeats()
    for row in rows:
        repeats = repeats.plus(*row)
    fast, blue = repeats.estimate(factor), repeats.blue().estimate([factor])
    assert fast.value == pytest.approx(blue.value, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(fast.weights, blue.weights, rtol=1e-9, atol=1e-12)
    assert fast.variance == pytest.approx(blue.variance, rel=1e-9)
    assert fast.halfwidth(0.95) == pytest.approx(blue.halfwidth(0.95), rel=1e-9)
