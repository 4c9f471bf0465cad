"""Warm starts (issue 7): identity, hierarchical, ISPE and ISPE's MMSE estimator.

Per-cell costs are recomputed here from ``gw.history`` (Theorem 5.5), independently
of the gateway's own accounting.  Coverage tests redraw *all* noise per trial (a
new gateway with a new seed, warm start included) on small domains built from the
embedded histograms.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

import dpgate
from dpgate import datasets
from dpgate.compile.query import LinearQuery
from dpgate.errors import BudgetExhausted, InvalidRequirement, SchemaError, UnsupportedQuery
from dpgate.warmstart import design as warmstart
from dpgate.warmstart._ispe import gaussian_mask, grow_regions, is_connected, neighbour_offsets, smooth


# -- fixtures ------------------------------------------------------------------------------
def _head(name: str, cells: int) -> tuple[pd.DataFrame, dpgate.Schema, np.ndarray]:
    """The first ``cells`` cells of an embedded 4096-cell histogram, one row per unit
    (NETTRACE's units all lie in cells 0..138, with a long decreasing tail)."""
    df, _ = datasets.load_histogram(name)
    hist = np.bincount(df["value"].to_numpy(), minlength=4096)[:cells]
    frame = pd.DataFrame({"value": np.repeat(np.arange(cells), hist)})
    schema = dpgate.Schema.from_dict(
        {"tables": {name: {"columns": {"value": {"type": "integer", "min": 0, "max": cells - 1}}}}}
    )
    return frame, schema, hist


@pytest.fixture(scope="module")
def net256():
    return _head("nettrace", 256)


@pytest.fixture(scope="module")
def net64():
    return _head("nettrace", 64)


@pytest.fixture(scope="module")
def net16():
    return _head("nettrace", 16)


def _grid2d(seed: int = 0) -> tuple[pd.DataFrame, dpgate.Schema]:
    rng = np.random.default_rng(seed)
    n = 3000
    a = np.clip(rng.normal(6, 2, n).round(), 0, 11).astype(int)
    b = np.clip((a * 0.5 + rng.normal(2, 1.5, n)).round(), 0, 8).astype(int)
    df = pd.DataFrame({"a": a, "b": b, "c": rng.choice(["x", "y", "z"], n)})
    schema = dpgate.Schema.from_dict({"tables": {"t": {"columns": {
        "a": {"type": "integer", "min": 0, "max": 11},
        "b": {"type": "integer", "min": 0, "max": 8},
        "c": {"type": "categorical", "values": ["x", "y", "z"]},
    }}}})
    return df, schema


def _per_cell_costs(gw: dpgate.Gateway, table: str) -> np.ndarray:
    """B_j = Σ_i (α_i/S_i)|q_ij| over every cell of the table, from the ledger's history."""
    t = gw.schema.table(table)
    B = np.zeros([c.n_cells for c in t.columns])
    for _, rec in gw.history.iterrows():
        if rec["table"].lower() != table.lower():
            continue
        q = LinearQuery.from_json(rec["query"])
        B = B + rec["alpha"] / rec["sensitivity"] * np.abs(q.dense(t))
    return B


def _range(table: str, a: int, b: int) -> str:
    return f"SELECT COUNT(*) FROM {table} WHERE value BETWEEN {a} AND {b}"


# -- per-cell cost = ε -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy,columns,options",
    [
        ("identity", ["a", "c"], {}),
        ("identity", "b", {}),
        ("hierarchical", "a", {}),
        ("hierarchical", "a", {"split": "geometric"}),
        ("hierarchical", "b", {"branching": 3, "split": "geometric", "ratio": 1.5}),
        ("ispe", "a", {}),
        ("ispe", ["a", "b"], {"alpha1_fraction": 0.3, "xi": 40.0, "connectivity": math.sqrt(2)}),
    ],
)
def test_every_cell_costs_exactly_epsilon(strategy, columns, options):
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=3)
    ws = gw.warm_start(strategy, 0.4, columns, **options)
    B = _per_cell_costs(gw, "t")
    assert B.min() == pytest.approx(0.4, abs=1e-12) and B.max() == pytest.approx(0.4, abs=1e-12)
    assert gw.spent == pytest.approx(0.4, abs=1e-12)
    assert len(gw.history) == len(ws.queries) == len(ws.values)
    assert set(gw.history["kind"]) == {"warm_start"}


def test_a_warm_start_simulates_its_charges_once(monkeypatch):
    """The charge checked against the budget is handed to the recording step, not recomputed."""
    from dpgate.plan.state import TableState

    calls = []
    real = TableState.recorded_charges
    monkeypatch.setattr(TableState, "recorded_charges", lambda *a: calls.append(1) or real(*a))
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=3)
    gw.warm_start("hierarchical", 0.4, "a")
    assert calls == [1] and gw.spent == pytest.approx(0.4, abs=1e-12)


def test_rows_per_individual_multiplies_the_charge():
    df, schema = _grid2d()
    spec = schema.to_dict()
    spec["tables"]["t"]["max_rows_per_individual"] = 2
    gw = dpgate.Gateway(df, spec, budget=1.0, seed=0)
    gw.warm_start("identity", 0.3, "b")
    assert gw.spent == pytest.approx(0.6)
    with pytest.raises(BudgetExhausted, match="needs ε = 0.6"):
        gw.warm_start("hierarchical", 0.3, "a")


def test_hierarchical_levels_and_budgets():
    assert warmstart.tree_levels(1, 2) == [[(0, 1)]]
    lv = warmstart.tree_levels(100, 2)
    assert len(lv) == 8 and lv[-1] == [(i, i + 1) for i in range(100)]
    for nodes in lv:  # each level partitions the cells
        assert nodes[0][0] == 0 and nodes[-1][1] == 100
        assert all(a[1] == b[0] for a, b in itertools.pairwise(nodes))
    assert sum(warmstart.level_budgets(0.3, 13, "even")) == pytest.approx(0.3, abs=1e-15)
    geo = warmstart.level_budgets(0.3, 13, "geometric")
    assert sum(geo) == pytest.approx(0.3, abs=1e-15) and geo[-1] == pytest.approx(2 * geo[-2])


# -- refusals change nothing -------------------------------------------------------------------
@pytest.mark.parametrize("strategy,columns", [("identity", "a"), ("hierarchical", "a"), ("ispe", ["a", "b"])])
def test_overspending_warm_start_is_refused_and_changes_nothing(strategy, columns):
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
    gw.warm_start("identity", 0.7, "b")
    before = (gw.spent, len(gw.history))
    with pytest.raises(BudgetExhausted, match=r"needs ε = 0.5; 0.3 of 1 remains"):
        gw.warm_start(strategy, 0.5, columns)
    assert (gw.spent, len(gw.history)) == before


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda gw: gw.warm_start("wavelet", 0.1, "a"), InvalidRequirement, "strategy must be one of"),
        (lambda gw: gw.warm_start("identity", 0.0, "a"), InvalidRequirement, "epsilon"),
        (lambda gw: gw.warm_start("identity", float("nan"), "a"), InvalidRequirement, "epsilon"),
        (lambda gw: gw.warm_start("identity", 0.1, []), InvalidRequirement, "columns"),
        (lambda gw: gw.warm_start("identity", 0.1, "nope"), SchemaError, "not declared"),
        (lambda gw: gw.warm_start("hierarchical", 0.1, "c"), InvalidRequirement, "ordered"),
        (lambda gw: gw.warm_start("hierarchical", 0.1, ["a", "b"]), InvalidRequirement, "ONE ordered column"),
        (lambda gw: gw.warm_start("hierarchical", 0.1, "a", branching=1), InvalidRequirement, "branching"),
        (lambda gw: gw.warm_start("hierarchical", 0.1, "a", split="log"), InvalidRequirement, "split"),
        (lambda gw: gw.warm_start("hierarchical", 0.1, "a", depth=3), InvalidRequirement, "unknown option"),
        (lambda gw: gw.warm_start("ispe", 0.1, "c"), InvalidRequirement, "ordered"),
        (lambda gw: gw.warm_start("ispe", 0.1, "a", alpha1_fraction=1.0), InvalidRequirement, "alpha1_fraction"),
        (lambda gw: gw.warm_start("ispe", 0.1, "a", mask_size=2), ValueError, "mask_size"),
        (lambda gw: gw.warm_start("ispe", 0.1, "a", xi=-1), InvalidRequirement, "xi"),
        (lambda gw: gw.warm_start("identity", 0.1, "a", table="other"), SchemaError, "not declared"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_read(call, exc, match):
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
    with pytest.raises(exc, match=match):
        call(gw)
    assert gw.spent == 0 and len(gw.history) == 0


def test_identity_refuses_huge_grids_and_suggests_hierarchical():
    df, schema = datasets.load_pums()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
    with pytest.raises(UnsupportedQuery, match=r'500002 counts.*strategy="hierarchical"'):
        gw.warm_start("identity", 0.5, "income")
    assert gw.spent == 0 and len(gw.history) == 0


# -- hierarchical: every range is estimable, free when loose, covers ------------------------------
def test_hierarchical_answers_every_range_for_free(net256):
    df, schema, hist = net256
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=11)
    ws = gw.warm_start("hierarchical", 1.0, "value", split="geometric")
    assert len(ws.queries) == 511 + 1 and gw.remaining == pytest.approx(0.0)
    rng = np.random.default_rng(0)
    pairs = [(0, 255), (0, 0), (255, 255), (17, 17), (1, 254)] + [
        tuple(sorted(rng.integers(0, 256, 2).tolist())) for _ in range(60)
    ]
    spent = gw.spent
    for a, b in pairs:
        sql = _range("nettrace", a, b)
        lo, hi = gw.probability(sql, -1e12, None), 1.0  # estimable: does not raise
        assert 0 < lo <= hi
        ans = gw.query(sql, accuracy=1e6, confidence=0.95).answer  # nothing left: must come from history
        assert ans.source == "history" and ans.epsilon_spent == 0.0 and ans.meets_requirement
    assert gw.spent == spent
    tot = gw.query("SELECT COUNT(*) FROM nettrace", accuracy=1e6).answer  # NULL cell measured too
    assert tot.source == "history"


def test_hierarchical_intervals_cover(net16):
    """Coverage at 90 % over 200 independent redraws of the whole warm start."""
    df, schema, hist = net16
    queries = [(0, 15), (0, 0), (5, 5), (3, 12), (10, 13), (8, 15), (1, 14), (6, 7)]
    truths = np.array([hist[a : b + 1].sum() for a, b in queries], dtype=float)
    trials = 200
    hits = np.zeros(len(queries))
    for s in range(trials):
        gw = dpgate.Gateway(df, schema, budget=1.0, seed=1000 + s)
        gw.warm_start("hierarchical", 0.5, "value", split="geometric" if s % 2 else "even")
        for i, (a, b) in enumerate(queries):
            ans = gw.query(_range("nettrace", a, b), accuracy=1e6, confidence=0.9).answer
            hits[i] += ans.low <= truths[i] <= ans.high
        gw.close()
    cov = hits / trials
    se = math.sqrt(0.9 * 0.1 / trials)
    assert cov.mean() >= 0.9 - 3 * se, cov  # each query's coverage is binomial(200, ≥0.9)
    assert cov.min() >= 0.9 - 4 * se, cov
    assert cov.mean() <= 0.9 + 4 * se, cov  # honest, not needlessly wide


# -- ISPE: smoothing and region growing on small grids -----------------------------------------------
def test_gaussian_mask_matches_the_paper():
    m2 = np.outer(gaussian_mask(3, 0.5), gaussian_mask(3, 0.5))
    np.testing.assert_allclose(m2, [[0.0113, 0.0838, 0.0113], [0.0838, 0.6193, 0.0838], [0.0113, 0.0838, 0.0113]], atol=1e-4)
    assert gaussian_mask(5, 1.0).sum() == pytest.approx(1.0)


def test_smoothing_known_answers():
    x = np.array([0.0, 0.0, 9.0, 0.0, 0.0])
    g = gaussian_mask(3, 0.5)
    np.testing.assert_allclose(smooth(x, 1), [0, 9 * g[0], 9 * g[1], 9 * g[0], 0])
    np.testing.assert_allclose(smooth(x, 0), x)
    np.testing.assert_allclose(smooth(np.full((3, 4), 2.5), 7), 2.5)  # constants survive (edges renormalised)
    y = np.random.default_rng(1).normal(size=(6, 7))
    np.testing.assert_allclose(smooth(y, 3), smooth(y.T, 3).T)  # separable: axis order irrelevant
    assert smooth(y, 10).std() < y.std() / 2


def test_region_growing_known_answers():
    assert grow_regions(np.array([0.0, 0.5, 1.0, 9.0, 9.2, 0.1]), xi=1.0).tolist() == [0, 0, 0, 1, 1, 2]
    # chaining: each step compares with the cell it grows from (Algorithm 2)
    assert grow_regions(np.arange(6.0) * 0.9, xi=1.0).tolist() == [0] * 6
    img = np.zeros((4, 4))
    img[1:3, 1:3] = 10.0
    lab = grow_regions(img, xi=1.0, d=1.0)
    assert lab.tolist() == [[0, 0, 0, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]]
    diag = np.array([[5.0, 0.0], [0.0, 5.0]])
    assert grow_regions(diag, xi=1.0, d=1.0).tolist() == [[0, 1], [2, 3]]
    assert grow_regions(diag, xi=1.0, d=math.sqrt(2)).tolist() == [[0, 1], [1, 0]]
    assert len(neighbour_offsets(3, 1.0)) == 6 and len(neighbour_offsets(1, 2.0)) == 4


def _check_partition(ws: warmstart.WarmStart, schema: dpgate.Schema) -> None:
    t = schema.table(ws.table)
    labels = ws.labels
    shape = tuple(t.column(c).n_cells for c in ws.columns)
    assert labels.shape == shape and not labels.flags.writeable
    assert sorted(np.unique(labels).tolist()) == list(range(ws.n_regions))  # ids 0..R-1, none empty
    d = ws.options["connectivity"]
    spatial = tuple(slice(0, n - 1) for n in shape)
    for r in range(ws.n_regions):
        mask = labels == r
        if mask[spatial].any():
            assert not (mask & ~_spatial_mask(shape)).any()  # NULL cells never join a region
            assert is_connected(mask[spatial], d)
        else:
            assert mask.sum() == 1  # a NULL-coordinate cell is its own region
    # the phase-2 queries are exactly the region indicators: they cover every cell once
    cover = np.zeros(shape)
    for q in ws.queries[math.prod(shape):]:
        w = q.dense(t)
        w = w.reshape([n if c.name in ws.columns else c.n_cells for c, n in zip(t.columns, w.shape, strict=True)])
        cover = cover + _marginal(w, t, ws.columns)
    np.testing.assert_array_equal(cover, 1.0)


def _spatial_mask(shape):
    m = np.zeros(shape, dtype=bool)
    m[tuple(slice(0, n - 1) for n in shape)] = True
    return m


def _marginal(dense, t, cols):
    """The weight on the ``cols`` grid of a query constant along the other columns."""
    idx = tuple(slice(None) if c.name in cols else 0 for c in t.columns)
    return dense[idx]


@pytest.mark.parametrize("columns,options", [("a", {"xi": 300.0}), (["a", "b"], {"xi": 30.0}), (["a", "b"], {"xi": 30.0, "connectivity": math.sqrt(2)})])
def test_ispe_partition_covers_every_cell_once_with_connected_regions(columns, options):
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=5)
    ws = gw.warm_start("ispe", 1.0, columns, **options)
    assert 1 < ws.n_regions < math.prod(ws.labels.shape)
    _check_partition(ws, schema)
    np.testing.assert_allclose(ws.smoothed, smooth(ws.cell_values[tuple(slice(0, n - 1) for n in ws.labels.shape)], 5))
    # reproducible under a fixed seed
    ws2 = dpgate.Gateway(df, schema, budget=1.0, seed=5).warm_start("ispe", 1.0, columns, **options)
    np.testing.assert_array_equal(ws.labels, ws2.labels)
    assert ws.values == ws2.values


def test_ispe_partition_depends_only_on_released_values(net64):
    """Region growing is post-processing: the released phase-1 values determine it."""
    df, schema, _ = net64
    ws = dpgate.Gateway(df, schema, budget=1.0, seed=9).warm_start("ispe", 0.8, "value")
    y = ws.cell_values[:-1]
    labels = grow_regions(smooth(y, 5, 3, 0.5), ws.options["xi"], 1.0)
    np.testing.assert_array_equal(ws.labels[:-1], labels)
    assert ws.options["xi"] == pytest.approx(math.sqrt(2) / ws.alpha1)


def test_ispe_blue_intervals_cover_empirically():
    """The phase-2 design depends on phase-1 noise, so exactness is not guaranteed
    (module docstring); check coverage empirically over independent redraws, with a
    threshold ξ at which the partition really varies with the noise."""
    df, schema, hist = _head("nettrace", 32)  # 7383 … 146: a decreasing tail where regions merge
    queries = [(0, 0), (5, 5), (20, 20), (31, 31), (0, 31), (3, 9), (10, 30), (25, 28), (12, 13)]
    truths = np.array([hist[a : b + 1].sum() for a, b in queries], dtype=float)
    trials = 150
    hits = np.zeros(len(queries))
    partitions = set()
    for s in range(trials):
        gw = dpgate.Gateway(df, schema, budget=1.0, seed=5000 + s)
        ws = gw.warm_start("ispe", 0.5, "value", xi=12.0)
        partitions.add(ws.labels.tobytes())
        for i, (a, b) in enumerate(queries):
            ans = gw.query(_range("nettrace", a, b), accuracy=1e6, confidence=0.9).answer
            hits[i] += ans.low <= truths[i] <= ans.high
        gw.close()
    cov = hits / trials
    se = math.sqrt(0.9 * 0.1 / trials)
    assert len(partitions) > trials // 2  # the design did adapt to the noise
    assert cov.mean() >= 0.9 - 3 * se, cov
    assert cov.min() >= 0.9 - 4 * se, cov


# -- MMSE -------------------------------------------------------------------------------------------
def test_mmse_is_model_based_free_and_flagged(net64):
    df, schema, hist = net64
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=2)
    ws = gw.warm_start("ispe", 1.0, "value")
    spent, n_hist = gw.spent, len(gw.history)
    res = warmstart.mmse_estimate(gw, "SELECT COUNT(*) FROM nettrace WHERE value = 7", ws, confidence=0.9)
    a = res.answer
    assert a.source == "model" and a.epsilon_spent == 0.0 and not a.meets_requirement and a.posterior is None
    assert a.low < a.value < a.high and math.isfinite(a.value)
    assert res.epsilon_spent == 0.0 and gw.spent == spent and len(gw.history) == n_hist
    df_out = res.to_pandas()
    assert df_out.iloc[0, -1] == "model"
    # ranges across regions and GROUP BY work; a constant offset is kept
    r = warmstart.mmse_estimate(gw, "SELECT COUNT(*) + 5 FROM nettrace WHERE value BETWEEN 3 AND 40", ws).answer
    assert abs(r.value - 5 - hist[3:41].sum()) < 8 * (r.high - r.value) + 50
    g = warmstart.mmse_estimate(gw, "SELECT value, COUNT(*) FROM nettrace WHERE value < 4 GROUP BY value", ws)
    # only the keys the WHERE clause can reach: values 0..3
    assert [dict(x.group)["value"] for x in g.answers] == [0, 1, 2, 3] and all(x.source == "model" for x in g.answers)


def test_mmse_whole_region_combines_both_phases():
    """For a query equal to one region, MMSE uses y_R and Σ y_cells: a known answer."""
    from dpgate.warmstart._ispe import mmse_part

    y = np.array([10.0, 12.0, 14.0])
    mean, std = mmse_part(y, 36.0, np.ones(3, bool), np.ones(3, bool), b1=1.0, b2=1.0)
    assert mean == pytest.approx(36.0, abs=1e-3) and std > 0
    # y_R says 30, Σ cells says 36; y_R is 1 Laplace(1), the sum 3 Laplace(1): closer to y_R
    mean2, _ = mmse_part(y, 30.0, np.ones(3, bool), np.ones(3, bool), b1=1.0, b2=1.0)
    assert 30.0 < mean2 < 33.0


def test_mmse_refuses_non_ispe_and_foreign_columns():
    df, schema = _grid2d()
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
    h = gw.warm_start("hierarchical", 0.3, "a")
    with pytest.raises(InvalidRequirement, match="ISPE"):
        warmstart.mmse_estimate(gw, "SELECT COUNT(*) FROM t WHERE a = 3", h)
    ws = gw.warm_start("ispe", 0.3, "a")
    with pytest.raises(UnsupportedQuery, match="outside the ISPE grid"):
        warmstart.mmse_estimate(gw, "SELECT COUNT(*) FROM t WHERE b = 3", ws)


def test_mmse_through_the_sql_hint_the_dbapi_and_session_method(net64):
    """method=mmse reaches the same estimate from gw.query, a DB-API hint and SET; all free and flagged."""
    df, schema, _ = net64
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=2)
    sql = "SELECT COUNT(*) FROM nettrace WHERE value BETWEEN 3 AND 9"
    with pytest.raises(InvalidRequirement, match="ISPE warm start"):
        gw.query("/*+ dpgate method=mmse */ " + sql)
    ws = gw.warm_start("ispe", 1.0, "value")
    spent, n_hist = gw.spent, len(gw.history)
    direct = warmstart.mmse_estimate(gw, sql, ws, confidence=0.9).answer
    hinted = gw.query("/*+ dpgate method=mmse confidence=0.9 */ " + sql).answer  # no accuracy needed
    assert hinted.source == "model" and hinted.epsilon_spent == 0 and not hinted.meets_requirement
    assert (hinted.value, hinted.low, hinted.high) == pytest.approx((direct.value, direct.low, direct.high))
    con = dpgate.connect(gw, intervals=True, confidence=0.9)
    cur = con.cursor()
    cur.execute("/*+ dpgate method=mmse */ " + sql)
    (row,) = cur.fetchall()
    assert row == pytest.approx((direct.value, direct.low, direct.high, "model"))
    cur.execute("SET dpgate.method = mmse")
    cur.execute(sql)
    assert cur.fetchone()[3] == "model" and cur.answers[0].source == "model"
    cur.execute("SET dpgate.method = exact")
    with pytest.raises(InvalidRequirement, match="accuracy"):
        cur.execute(sql)  # back to guaranteed answers, which need a requirement
    with pytest.raises(InvalidRequirement, match="pca, maxent, mmse"):
        cur.execute("SET dpgate.method = magic")
    with pytest.raises(InvalidRequirement, match="method"):
        gw.query("/*+ dpgate method=magic */ " + sql, accuracy=5)
    assert gw.spent == spent and len(gw.history) == n_hist  # model answers never touch the ledger
    con.close()


def test_pca_estimate_through_a_session_set(net64):
    df, schema, _ = net64
    con = dpgate.connect(df, schema=schema, budget=1.0, seed=4, accuracy=30, intervals=True)
    cur = con.cursor()
    for a in range(0, 60, 6):
        cur.execute(f"SELECT COUNT(*) FROM nettrace WHERE value BETWEEN {a} AND {a + 5}")
    spent, n_hist = con.spent, len(con.history)
    cur.execute("SET dpgate.method = pca")
    cur.execute("SELECT COUNT(*) FROM nettrace WHERE value BETWEEN 2 AND 40")
    value, low, high, source = cur.fetchone()
    assert source == "model" and low < value < high
    assert con.spent == spent and len(con.history) == n_hist
    con.close()
