"""Wide queries on (atom, moment) coordinates (``dpgate.plan._moments``, issue 28).

* :func:`lift` is exact: on every cell the lifted query's count weight plus its moment weight
  times the cell's value is the query's weight (brute force over small domains), and a query
  that is not linear on few slabs is not lifted;
* a gateway answers wide SUM / AVG outputs from every wide release over their column, not
  only from exact repeats (a total from its groups, a union of groups), and does not mark them
  isolated;
* those intervals cover: over independent seeded sessions, each kind of answer holds the
  pandas truth at least ``confidence − 3·SE`` of the time.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _coverage import assert_covers

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.plan._moments import MAX_PIECES, Moments, lift, lifted_table
from dpgate.schema.domains import Schema

SCHEMA = Schema.from_dict({"tables": {"t": {"columns": {
    "v": {"type": "integer", "min": -5, "max": 60},
    "g": {"type": "categorical", "values": ["a", "b", "c"]},
    "n": {"type": "integer", "min": 0, "max": 3},
}}}})
T = SCHEMA.table("t")


def _cells_weights(q: LinearQuery) -> np.ndarray:
    """``q``'s numerators on every cell of ``T`` (v, g, n)."""
    return np.asarray(q.expand(T, [c.name for c in T.columns], [tuple(range(c.n_cells)) for c in T.columns]))


def _lifted_cells(q: LinearQuery) -> np.ndarray:
    """The lifted form's weight on every cell: count part + moment part × the cell's value."""
    found = lift(T, q)
    assert found is not None
    lt = lifted_table(T)
    full = np.asarray(found.query.expand(lt, [c.name for c in lt.columns],
                                         [tuple(range(c.n_cells)) for c in lt.columns]))
    values = np.append(np.arange(-5, 61), 0).astype(np.int64)  # v's value per cell (NULL: no moment)
    out = full[..., 0] + full[..., 1] * values[:, None, None]
    assert not full[..., 2].any()  # the virtual column's NULL cell weighs nothing
    return out * found.query.denominator


def _random_linear(rng: np.random.Generator) -> LinearQuery:
    """A query linear in v on random pieces, with a group / filter on g and n."""
    cells = T.column("v").n_cells
    cuts = sorted({0, *rng.choice(np.arange(1, cells), int(rng.integers(0, 5)), replace=False).tolist()})
    w = np.zeros((cells, 4, 4))
    value = np.append(np.arange(-5, 61), np.nan)
    for a, b in zip(cuts, [*cuts[1:], cells], strict=True):
        for g in range(4):
            for n in range(4):
                if rng.random() < 0.4:
                    continue
                slope, base = int(rng.integers(-3, 4)), int(rng.integers(-50, 50))
                w[a:b, g, n] = base + slope * value[a:b]
    w[-1] = np.where(rng.random((4, 4)) < 0.5, rng.integers(-3, 4, (4, 4)), 0)  # the NULL cell: any weight
    return LinearQuery.from_grid(T, ["v", "g", "n"], [range(cells), range(4), range(4)], w / rng.choice([1, 2, 3]))


@pytest.mark.parametrize("seed", range(40))
def test_lift_is_exact(seed: int) -> None:
    q = _random_linear(np.random.default_rng(seed))
    if q.is_zero:
        return
    assert np.array_equal(_lifted_cells(q), _cells_weights(q))


def test_a_query_with_many_slopes_is_not_lifted() -> None:
    cells = T.column("v").n_cells
    square = np.append(np.arange(-5, 61) ** 2, 0).astype(float)  # SUM(v * v): a new slope every other cell
    q = LinearQuery.from_grid(T, ["v"], [range(cells)], square)
    assert np.array_equal(_lifted_cells(q), _cells_weights(q))  # 33 pieces of two cells: still exact
    wide = Schema.from_dict({"tables": {"t": {"columns": {"v": {"type": "integer", "min": 0, "max": 1000}}}}}).table("t")
    square = np.append(np.arange(1001) ** 2, 0).astype(float)
    assert lift(wide, LinearQuery.from_grid(wide, ["v"], [range(1002)], square)) is None  # > MAX_PIECES
    g_only = LinearQuery.from_grid(T, ["g"], [[0, 1]], np.array([1.0, 0.0]))  # no integer column
    assert lift(T, g_only) is None
    assert MAX_PIECES < 500


def test_moment_history_estimates_a_sum_of_groups() -> None:
    """Two disjoint wide releases determine their sum (never a query they do not cover)."""
    cells = T.column("v").n_cells
    value = np.append(np.arange(-5, 61), 0).astype(float)
    groups = []
    for g in range(2):
        w = np.zeros((cells, 4))
        w[:, g] = value
        groups.append(LinearQuery.from_grid(T, ["v", "g"], [range(cells), range(4)], w))
    both = np.zeros((cells, 4))
    both[:, :2] = value[:, None]
    total = LinearQuery.from_grid(T, ["v", "g"], [range(cells), range(4)], both)
    every = LinearQuery.from_grid(T, ["v"], [range(cells)], value)
    history = Moments.new(T)
    for k, (q, y) in enumerate(zip(groups, (100.0, 250.0), strict=True)):
        found = history.plus(f"k{k}", lift(T, q), 2.0, y, 0.0)  # type: ignore[arg-type]
        assert found is not None
        history = found
    for q, estimable in ((total, True), (every, False)):
        lifted = lift(T, q)
        assert lifted is not None
        held = history.refined(lifted)
        assert held is not None
        est = held.estimate(held.vector(lifted))
        assert est.estimable is estimable
        if estimable:
            assert est.value == pytest.approx(350.0)


# -- through a gateway ------------------------------------------------------------------------
def _truth(df, where=None):  # type: ignore[no-untyped-def]
    income = df["income"].clip(0, 500_000)
    return float(income[where].sum() if where is not None else income.sum())


def test_wide_outputs_are_answered_from_every_wide_release(pums) -> None:  # type: ignore[no-untyped-def]
    df, schema = pums
    warnings.simplefilter("ignore")
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=3)
    first = gw.query("SELECT race, SUM(income) FROM pums GROUP BY race", accuracy=2e6, confidence=0.95)
    assert not any(a.isolated for a in first.answers)
    spent = gw.spent
    union = gw.query("SELECT SUM(income) FROM pums WHERE race IN ('1', '2')", accuracy=4e6, confidence=0.95)
    (a,) = union.answers
    assert a.source == "history" and not a.isolated and gw.spent == spent
    avg = gw.query("SELECT race, AVG(income) FROM pums GROUP BY race", accuracy=20, confidence=0.95)
    assert not any(x.isolated for x in avg.answers)
    gw.close()


def test_coverage_of_wide_answers_from_history(pums) -> None:  # type: ignore[no-untyped-def]
    """Over independent sessions: a GROUP BY race of SUM(income), then the union of two groups
    (from history), the total (top-up: history plus a fresh release) and a repeat of one group."""
    df, schema = pums
    warnings.simplefilter("ignore")
    conf = 0.8
    union_where = df["race"].astype(str).isin(["1", "2"])
    hits: dict[str, list[bool]] = {"group": [], "union": [], "total": []}
    sources: dict[str, set[str]] = {k: set() for k in hits}
    races = sorted(df["race"].astype(str).unique())
    for seed in range(120):
        gw = dpgate.Gateway(df, schema, budget=1e9, seed=seed)
        groups = gw.query("SELECT race, SUM(income) FROM pums GROUP BY race", accuracy=3e6, confidence=conf)
        for ans in groups.answers:
            key = str(dict(ans.group)["race"])
            if key in races:
                hits["group"].append(ans.low <= _truth(df, df["race"].astype(str) == key) <= ans.high)
        (u,) = gw.query("SELECT SUM(income) FROM pums WHERE race IN ('1', '2')", accuracy=6e6,
                        confidence=conf).answers
        hits["union"].append(u.low <= _truth(df, union_where) <= u.high)
        sources["union"].add(u.source)
        (t,) = gw.query("SELECT SUM(income) FROM pums", accuracy=2.5e6, confidence=conf).answers
        hits["total"].append(t.low <= _truth(df) <= t.high)
        sources["total"].add(t.source)
        gw.close()
    assert sources["union"] == {"history"}
    assert_covers(hits, conf)
