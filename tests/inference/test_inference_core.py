"""The gateway's inference core against a brute-force dense BLUE over every cell.

Random small sessions (counts over ranges and values, GROUP BYs — released as
batched blocks — and sums) on a tiny table: after each session, every probe query
history determines gets the value and interval of Xiao & Xiong (2012)'s BLUE computed
densely over all cells from the ledger alone, the charge is the per-cell formula
(Theorem 5.5) over all cells, and a batched GROUP BY gives what appending its
groups one by one gives.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.inference import IncrementalBLUE, estimate, system_cost
from dpgate.inference._information_form import InformationForm

SCHEMA = {"tables": {"t": {"columns": {"a": {"type": "integer", "min": 0, "max": 5},
                                       "b": {"type": "categorical", "values": ["x", "y", "z"]}}}}}
_rng = np.random.default_rng(14)
DATA = pd.DataFrame({"a": _rng.integers(0, 6, 200), "b": _rng.choice(["x", "y", "z"], 200)})

STATEMENTS = (
    [f"SELECT COUNT(*) FROM t WHERE a BETWEEN {lo} AND {hi}" for lo in range(6) for hi in range(lo, 6)]
    + [f"SELECT COUNT(*) FROM t WHERE b = '{v}'" for v in "xyz"]
    + ["SELECT b, COUNT(*) FROM t GROUP BY b", "SELECT a, COUNT(*) FROM t GROUP BY a",
       "SELECT a, COUNT(*) FROM t WHERE b = 'y' GROUP BY a", "SELECT SUM(a) FROM t",
       "SELECT b, SUM(a) FROM t GROUP BY b", "SELECT COUNT(*) FROM t WHERE a < 3 AND b <> 'z'"]
)
PROBES = (
    "SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t WHERE a <= 2", "SELECT COUNT(*) FROM t WHERE b = 'x'",
    "SELECT COUNT(*) FROM t WHERE a = 4 AND b = 'y'", "SELECT SUM(a) FROM t", "SELECT SUM(a) FROM t WHERE b = 'z'",
)


def _dense(gw: dpgate.Gateway) -> tuple[np.ndarray, ...]:
    """The ledger's releases as dense rows over every cell of the table, with α, S, y, γ."""
    table = gw.schema.table("t")
    cols = [c.name for c in table.columns]
    grid = [list(range(c.n_cells)) for c in table.columns]
    recs = gw.ledger.records()
    H = np.array([LinearQuery.from_json(r.query).expand(table, cols, grid).ravel()
                  / LinearQuery.from_json(r.query).denominator for r in recs])
    return (H, np.array([r.alpha for r in recs]), np.array([r.sensitivity for r in recs]),
            np.array([r.value for r in recs]), np.array([r.lattice for r in recs]), cols, grid)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(STATEMENTS), st.sampled_from([3.0, 8.0, 20.0, 200.0])),
                min_size=1, max_size=7),
       st.integers(0, 2**16))
def test_gateway_equals_dense_blue(session: list[tuple[str, float]], seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(DATA, SCHEMA, budget=1e6, seed=seed)
        for sql, acc in session:
            gw.query(sql, accuracy=acc, confidence=0.9)
    H, alpha, sens, y, lat, cols, grid = _dense(gw)
    table = gw.schema.table("t")
    assert gw.spent == pytest.approx(system_cost(H, alpha, sens).max, rel=1e-9, abs=1e-12)
    for sql in PROBES:
        (q,) = gw.compile(sql).queries
        Q = q.expand(table, cols, grid).ravel() / q.denominator
        ref = estimate(H, y, alpha, Q, sensitivity=sens, lattice=lat)
        if not ref.estimable:
            with pytest.raises(dpgate.NotEstimable):
                gw.probability(sql)
            continue
        spent = gw.spent
        got = gw.query(sql, accuracy=1e12, confidence=0.9).answer
        assert got.source == "history" and gw.spent == spent
        c = got.interval_confidence  # 0.9 stated; a query's k-th interval is at 1 − δ_k (dpgate.plan.asks)
        half = ref.halfwidth(c)
        assert got.value == pytest.approx(ref.value + float(q.offset), rel=1e-7, abs=1e-7 * (1 + half))
        lo, hi = got.posterior.certified_interval(c)  # certified; the released one is cut at 0 for counts
        assert (hi - lo) / 2 == pytest.approx(half, rel=1e-6, abs=1e-9)
        assert lo - 1e-9 <= got.low <= got.high <= hi + 1e-9


def test_batched_group_by_equals_group_by_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """GROUP BY releases go into the BLUE as one block; row by row gives the same answers."""
    session = [("SELECT COUNT(*) FROM t WHERE b = 'x'", 5.0), ("SELECT a, COUNT(*) FROM t GROUP BY a", 4.0),
               ("SELECT a, COUNT(*) FROM t WHERE b = 'y' GROUP BY a", 4.0),
               ("SELECT b, COUNT(*) FROM t WHERE a >= 2 GROUP BY b", 4.0), ("SELECT a, COUNT(*) FROM t GROUP BY a", 9.0),
               ("SELECT COUNT(*) FROM t WHERE b = 'x' AND a = 1", 2.0)]
    blocks: list[bool] = []
    real = IncrementalBLUE._extend_block

    def spy(self: IncrementalBLUE, *args: np.ndarray) -> bool:
        blocks.append(real(self, *args))
        return blocks[-1]

    def run() -> list[tuple[object, ...]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dpgate.Warning)
            gw = dpgate.Gateway(DATA, SCHEMA, budget=1e6, seed=5)
            return [(a.source, round(a.epsilon_spent, 12), round(a.value, 8), round(a.low, 8), round(a.high, 8))
                    for sql, acc in session for a in gw.query(sql, accuracy=acc, confidence=0.95).answers]

    monkeypatch.setattr(IncrementalBLUE, "_extend_block", spy)
    blocked = run()
    assert sum(blocks) >= 2  # the first GROUP BYs went in as blocks
    monkeypatch.setattr(IncrementalBLUE, "_extend_block", lambda self, *args: False)  # row by row
    assert run() == blocked


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n=st.integers(2, 9), m=st.integers(0, 8), blocks=st.booleans())
def test_estimable_with_many_is_estimable_with_row_by_row(seed, n, m, blocks):
    rng = np.random.default_rng(seed)
    blue = IncrementalBLUE(rng.integers(1, 5, n).astype(float))
    rows = rng.integers(-1, 2, (m, n)).astype(float)
    if blocks and m > 1:  # two blocks of the basis (extend), besides single appends
        blue.extend(rows[: m // 2], np.ones(m // 2), np.zeros(m // 2))
        rows = rows[m // 2:]
    for r in rows:
        blue.append(r, 1.0, 0.0)
    Q = rng.integers(-2, 3, (12, n)).astype(float)
    H = Q * (rng.random((12, n)) < 0.6)  # restrictions of Q, as the planner asks
    H[0] = Q[0]  # the query itself
    assert blue.estimable_with_many(Q, H) == [blue.estimable_with(q, h) for q, h in zip(Q, H, strict=True)]


#: Rescalings of STATEMENTS' queries: the same weight pattern over another denominator.
SCALED = ["SELECT COUNT(*) / 4 FROM t WHERE a < 3", "SELECT 3 * COUNT(*) FROM t WHERE a < 3",
          "SELECT COUNT(*) FROM t WHERE a < 3", "SELECT b, COUNT(*) / 2 FROM t GROUP BY b", "SELECT SUM(a) / 5 FROM t"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(STATEMENTS + SCALED), st.sampled_from([3.0, 8.0, 20.0, 200.0])),
                min_size=1, max_size=7),
       st.integers(1, 6), st.integers(0, 2**16))
def test_charges_are_per_cell_exact_whatever_the_atoms_hold(session: list[tuple[str, float]], max_atoms: int,
                                                            seed: int) -> None:
    """With inference atoms too few to hold the session, statements are estimated from their exact
    repeats only — and still charged exactly the per-cell formula over all cells (the cost atoms
    hold every release), as planned and quoted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(DATA, SCHEMA, budget=1e6, seed=seed, max_atoms=max_atoms)
        for sql, acc in session:
            quoted = gw.explain(sql, accuracy=acc, confidence=0.9).epsilon
            before = gw.spent
            res = gw.query(sql, accuracy=acc, confidence=0.9)
            assert gw.spent - before == pytest.approx(res.epsilon_spent, abs=1e-12)
            assert res.epsilon_spent == pytest.approx(quoted, abs=1e-12)
        with gw.locked_view("t") as v:
            assert v.atoms.n_atoms <= max_atoms
    H, alpha, sens, *_ = _dense(gw)
    assert gw.spent == pytest.approx(system_cost(H, alpha, sens).max, rel=1e-12, abs=1e-12)


def test_a_rescaled_query_is_charged_its_own_weights() -> None:
    """``COUNT(*) / 4`` and ``COUNT(*)`` share a weight pattern but not their weights: each release
    is charged ``(α/S)|q_j|`` of its own query (a charge memo keyed on the pattern alone charged the
    second at a quarter of its cost)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(DATA, SCHEMA, budget=1e6, seed=3, policy="no_reuse")
        for sql in ("SELECT COUNT(*) / 4 FROM t WHERE a = 5 AND b = 'z'", "SELECT COUNT(*) FROM t WHERE a = 5 AND b = 'z'"):
            gw.query(sql, accuracy=1, confidence=0.9)
    H, alpha, sens, *_ = _dense(gw)
    assert gw.spent == pytest.approx(system_cost(H, alpha, sens).max, rel=1e-12)


def _split_history(seed: int, na: int, nb: int, m: int, spoil: bool) -> tuple[IncrementalBLUE, np.ndarray]:
    """A BLUE over ``na`` atoms, its history rows (some in an extended block), then each atom
    split into ``nb`` pieces (a GROUP BY over a column history never split), and, if
    ``spoil``, a row that tells some pieces apart.  Returns it and the pieces' column ``b``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, (na, nb)).astype(float)
    blue = IncrementalBLUE(sizes.sum(axis=1))
    rows = rng.integers(-1, 3, (m, na)).astype(float)
    if m > 1:
        blue.extend(rows[: m // 2], np.ones(m // 2), np.zeros(m // 2))
        rows = rows[m // 2:]
    for r in rows:
        blue.append(r, 1.0, 0.0)
    blue.split(np.repeat(np.arange(na), nb), sizes.ravel())
    if spoil:
        blue.append((rng.random(na * nb) < 0.3).astype(float), 2.0, 0.0)
    return blue, np.tile(np.arange(nb), na)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), na=st.integers(1, 6), nb=st.integers(2, 4), m=st.integers(0, 6),
       spoil=st.booleans())
def test_twin_atoms_take_one_value_in_every_history_row(seed, na, nb, m, spoil):
    """Atoms of one twin class have equal basis columns and equal history columns."""
    blue, _ = _split_history(seed, na, nb, m, spoil)
    twins = blue.twin_classes()
    if twins is None:  # history spanned the atoms before the split: the information form
        assert isinstance(blue.form, InformationForm)
        return
    assert twins.shape == (blue.n_atoms,)
    V, H = blue.basis(), blue.rows
    for c in np.unique(twins):
        members = np.flatnonzero(twins == c)
        assert (V[:, members] == V[:, members[:1]]).all()
        assert (H[:, members] == H[:, members[:1]]).all()
    if not spoil and m:
        assert len(np.unique(twins)) <= na  # the pieces of an atom are twins


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), na=st.integers(1, 6), nb=st.integers(2, 4), m=st.integers(0, 6),
       spoil=st.booleans())
def test_estimate_many_is_estimate_row_by_row(seed, na, nb, m, spoil):
    """Batched estimates (a GROUP BY's groups, and rows history determines) are the one-by-one
    ones: the same estimability, and value, weights and variance equal up to rounding (the
    batch's matrix products sum in another order than one row's vector products)."""
    many, b = _split_history(seed, na, nb, m, spoil)
    one, _ = _split_history(seed, na, nb, m, spoil)  # its own memo: nothing shared
    rng = np.random.default_rng(seed + 1)
    groups = [(b == v).astype(float) for v in range(b.max() + 1)]
    spanned = [one.rows[i] * 2 for i in range(min(2, one.n_rows))]
    Q = np.array(groups + spanned + [rng.integers(-1, 2, one.n_atoms).astype(float), np.zeros(one.n_atoms)])
    from dpgate.inference import _basis_form

    batch, _basis_form._BATCH_ROWS = _basis_form._BATCH_ROWS, 2  # the batched test, on these few rows
    try:
        got_all = many.estimate_many(Q)
    finally:
        _basis_form._BATCH_ROWS = batch
    for got, q in zip(got_all, Q, strict=True):
        want = one.estimate(q)
        assert got.estimable == want.estimable
        if want.estimable:
            top = float(np.abs(want.weights).max(initial=1.0))
            np.testing.assert_allclose(got.weights, want.weights, rtol=0, atol=1e-12 * top)
            assert got.value == pytest.approx(want.value, rel=1e-12, abs=1e-12 * top)
            assert got.variance == pytest.approx(want.variance, rel=1e-12)
            # Certified half-widths bound negligible terms and round scales up: equal to 1e-5.
            assert got.halfwidth(0.95) == pytest.approx(want.halfwidth(0.95), rel=1e-5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), na=st.integers(1, 6), nb=st.integers(2, 4), m=st.integers(0, 6),
       spoil=st.booleans())
def test_restrictions_refused_by_twins_are_refused_by_projection(seed, na, nb, m, spoil):
    """The planner's structural refusal of restriction candidates (twin atoms outside a group)
    refuses only what the projections refuse: the same answer as without it."""
    from dpgate.plan import decide

    blue, b = _split_history(seed, na, nb, m, spoil)
    rng = np.random.default_rng(seed + 2)
    charged = rng.integers(0, 4, blue.n_atoms).astype(float)
    hs = [(b == v).astype(float) * rng.integers(1, 3) for v in range(b.max() + 1)]
    hs.append(np.where(rng.random(blue.n_atoms) < 0.5, 1.0, 0.0))
    pairs, decide._TWIN_PAIRS = decide._TWIN_PAIRS, 1  # twins asked however few the candidates
    try:
        with_twins = decide._restrictable_many(blue, charged, hs)
    finally:
        decide._TWIN_PAIRS = pairs
    real = IncrementalBLUE.twin_classes
    try:
        IncrementalBLUE.twin_classes = lambda self: None  # type: ignore[method-assign]
        without = decide._restrictable_many(blue, charged, hs)
    finally:
        IncrementalBLUE.twin_classes = real  # type: ignore[method-assign]
    assert with_twins == without
