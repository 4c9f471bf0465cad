"""IncrementalBLUE equals the batch solve after any appends and splits; pricing a fresh answer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate.errors import InvalidArgument
from dpgate.inference import ErrorLaw, IncrementalBLUE, estimate, minimal_scale
from dpgate.inference._basis_form import BasisForm
from dpgate.inference._information_form import InformationForm


def batch(state: IncrementalBLUE, Q: np.ndarray):  # type: ignore[no-untyped-def]
    # sensitivity = b and alpha = 1 make the batch scales equal the stored ones.
    m = state.n_rows
    return estimate(state.rows, state.values, np.ones(m), Q, sensitivity=state.scales,
                    lattice=state.lattice)


def assert_same(state: IncrementalBLUE, Q: np.ndarray) -> None:
    inc, ref = state.estimate(Q), batch(state, Q)
    assert inc.estimable == ref.estimable
    if not ref.estimable:
        assert math.isnan(inc.value) and inc.posterior is None
        return
    scale = max(1.0, float(np.abs(ref.weights).max(initial=0.0)))
    np.testing.assert_allclose(inc.weights, ref.weights, rtol=1e-8, atol=1e-8 * scale)
    mag = float(np.abs(ref.weights * state.values).sum()) + 1.0
    assert abs(inc.value - ref.value) <= 1e-8 * mag
    assert inc.variance == pytest.approx(ref.variance, rel=1e-8, abs=1e-12)


@st.composite
def histories(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    state = IncrementalBLUE(np.array(sizes, dtype=float))
    ops = draw(st.lists(st.sampled_from(["append", "append", "append", "split", "copy", "extend"]), max_size=16))
    for op in ops:
        n = state.n_atoms
        if op == "extend":  # a block of rows at once (all new directions: the block path)
            k = draw(st.integers(2, 4))
            rows = draw(st.lists(st.lists(st.integers(-2, 2), min_size=n, max_size=n), min_size=k, max_size=k))
            scales = draw(st.lists(st.sampled_from([0.25, 1.0, 3.0]), min_size=k, max_size=k))
            state.extend(np.array(rows, dtype=float), scales, draw(st.lists(st.floats(-50, 50), min_size=k, max_size=k)))
        elif op == "copy":  # the copy shares the basis: appends to the original must not reach it
            old, state = state, state.copy()
            old.append(np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float), 1.0, 7.0)
            old.split(np.arange(n), old.cell_sizes)
        elif op == "append":
            h = draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
            scale = draw(st.sampled_from([0.25, 1.0, 3.0, 10.0]))
            value = draw(st.floats(-100, 100))
            lat = draw(st.sampled_from([0.0, 0.0, scale / 1024]))
            state.append(np.array(h, dtype=float), scale, value, lat)
        else:
            d = state.cell_sizes
            parent, new = [], []
            for j, dj in enumerate(d):
                cut = draw(st.integers(0, int(dj) - 1)) if dj >= 2 else 0
                pieces = [cut, dj - cut] if cut else [dj]
                parent += [j] * len(pieces)
                new += pieces
            state.split(np.array(parent), np.array(new, dtype=float))
    n = state.n_atoms
    queries = [np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float)]
    if state.n_rows:
        w = draw(st.lists(st.integers(-2, 2), min_size=state.n_rows, max_size=state.n_rows))
        queries.append(np.array(w, dtype=float) @ state.rows)  # in the row space
    return state, queries


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_incremental_equals_batch(case) -> None:  # type: ignore[no-untyped-def]
    state, queries = case
    for Q in queries:
        assert_same(state, Q)
    # V stays orthonormal under the atom-size inner product.
    V = state.basis()
    np.testing.assert_allclose((V * state.cell_sizes) @ V.T, np.eye(state.rank), atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(histories(), st.sampled_from([0.1, 1.0, 7.0]))
def test_estimate_with_equals_append(case, scale: float) -> None:  # type: ignore[no-untyped-def]
    state, queries = case
    rng = np.random.default_rng(0)
    h = rng.integers(-1, 2, state.n_atoms).astype(float)
    for Q in queries + [h]:
        wh, wn, var, ok = state.estimate_with(Q, h, scale)
        after = state.copy()
        after.append(h, scale, 0.0)
        ref = after.estimate(Q)
        assert ok == ref.estimable
        if ok:
            tol = 1e-8 * max(1.0, float(np.abs(ref.weights).max(initial=0.0)))
            np.testing.assert_allclose(np.append(wh, wn), ref.weights, rtol=1e-8, atol=tol)
            assert var == pytest.approx(ref.variance, rel=1e-8, abs=1e-12)
        else:
            assert math.isnan(var)


@settings(max_examples=80, deadline=None)
@given(histories(), st.data())
def test_restriction_filter_never_drops_a_completable_restriction(case, data) -> None:  # type: ignore[no-untyped-def]
    """``restrictions_possible`` says False only where the exact test (``estimable_with`` of
    Q after appending Q with the atoms left out) says False, on random histories, queries and
    left-out sets — and, on a history that cannot complete them, it does rule some out."""
    state, queries = case
    n = state.n_atoms
    for Q in queries:
        sets = [np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(3, n)))),
                         dtype=np.intp) for _ in range(3)]
        for idx, ok in zip(sets, state.restrictions_possible(Q, sets), strict=True):
            h_keep = Q.copy()
            h_keep[idx] = 0.0
            if not ok:
                assert not state.estimable_with(Q, h_keep)


def test_restriction_filter_rules_out_what_history_cannot_complete() -> None:
    # History pins down atoms 0+1 only; Q = atoms 0..3.  Leaving out atom 3 (or 2) can never be
    # completed (atoms 2, 3 are unknown); leaving out atoms 0 and 1 can: history determines them.
    state = IncrementalBLUE(np.ones(6))
    state.append(np.array([1.0, 1, 0, 0, 0, 0]), 1.0, 3.0)
    state.append(np.array([0.0, 0, 0, 0, 1, 1]), 1.0, 3.0)
    Q = np.array([1.0, 1, 1, 1, 0, 0])
    sets = [np.array([3]), np.array([2, 3]), np.array([0, 1])]
    got = state.restrictions_possible(Q, sets)
    want = []
    for idx in sets:
        h_keep = Q.copy()
        h_keep[idx] = 0.0
        want.append(state.estimable_with(Q, h_keep))
    assert want == [False, False, True]
    assert got == [False, True, True]  # {2, 3}: h_keep adds no direction outside history, so "maybe"


def test_long_random_history_against_batch() -> None:
    rng = np.random.default_rng(9)
    n = 40
    state = IncrementalBLUE(rng.integers(1, 5, n).astype(float))
    for _ in range(120):
        h = (rng.random(n) < 0.3) * rng.integers(-3, 4, n)
        state.append(h.astype(float), float(np.exp(rng.uniform(-2, 3))), float(rng.normal() * 50))
    for _ in range(5):
        assert_same(state, rng.integers(-2, 3, n).astype(float))
    assert_same(state, rng.normal(size=state.n_rows) @ state.rows)


def assert_same_states(seq: IncrementalBLUE, block: IncrementalBLUE, queries: tuple[np.ndarray, ...]) -> None:
    """Row-by-row and block-built states estimate alike, and the block one equals the batch solve."""
    for Q in queries:
        a, b_ = seq.estimate(Q), block.estimate(Q)
        assert a.estimable == b_.estimable
        if a.estimable:
            np.testing.assert_allclose(b_.weights, a.weights, rtol=1e-9, atol=1e-12)
            assert b_.value == pytest.approx(a.value, rel=1e-9, abs=1e-9)
        assert_same(block, Q)


def test_extend_block_equals_appends() -> None:
    rng = np.random.default_rng(14)
    n = 60
    sizes = rng.integers(1, 5, n).astype(float)
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)
    for st_ in (seq, block):
        st_.append((rng.random(n) < 0.5).astype(float), 2.0, 30.0)
    rng2 = np.random.default_rng(15)
    groups = np.eye(20)[rng.permutation(np.arange(n) % 20)].T  # 20 disjoint groups (a GROUP BY)
    scales, values = rng2.uniform(0.5, 3, 20), rng2.normal(size=20) * 10
    for h, b, y in zip(groups, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    assert block._extend_block(groups, scales, values, np.zeros(20))  # the block path applies
    assert block.rank == seq.rank == 21 and block.n_rows == seq.n_rows == 21
    assert_same_states(seq, block, (*groups[:3], np.ones(n), rng.integers(-2, 3, n).astype(float)))


def test_extend_spanning_tree_equals_appends() -> None:
    """A binary tree over 16 atoms (31 ranges, leaves included) on an empty history: one
    Cholesky factorisation gives what 31 appends give, and later appends and splits work on."""
    rng = np.random.default_rng(3)
    n = 16
    sizes = rng.integers(1, 4, n).astype(float)
    rows = [np.repeat(np.eye(n // w), w, axis=1) for w in (16, 8, 4, 2, 1)]
    H = np.concatenate(rows)[rng.permutation(31)]
    scales, values = rng.uniform(0.5, 3, 31), rng.normal(size=31) * 20
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    assert block._extend_block(H, scales, values, np.zeros(31))
    extra = rng.integers(-1, 2, n).astype(float)
    for st_ in (seq, block):
        st_.append(extra, 1.5, 3.0)
        st_.split(np.repeat(np.arange(n), 2), np.repeat(sizes / 2, 2))
    assert block.rank == seq.rank == n
    assert_same_states(seq, block, (np.ones(2 * n), rng.integers(-2, 3, 2 * n).astype(float),
                                    np.repeat(rng.normal(size=n), 2)))


def test_split_validation() -> None:
    state = IncrementalBLUE(np.array([2.0, 3.0]))
    with pytest.raises(ValueError):
        state.split(np.array([0, 1]), np.array([1.0, 3.0]))  # sizes do not add up
    with pytest.raises(ValueError):
        state.split(np.array([0, 0]), np.array([1.0, 1.0]))  # atom 1 left without a piece
    with pytest.raises(ValueError):
        state.split(np.array([0, 2]), np.array([2.0, 3.0]))  # out of range
    with pytest.raises(ValueError):
        IncrementalBLUE(np.array([1.0, 0.0]))
    with pytest.raises(ValueError):
        state.append(np.ones(3), 1.0, 0.0)
    with pytest.raises(ValueError):
        state.append(np.ones(2), 0.0, 0.0)
    state.split(np.array([0, 0, 1]), np.array([1.0, 1.0, 3.0]))
    assert state.n_atoms == 3 and state.cell_sizes.tolist() == [1.0, 1.0, 3.0]


def test_copy_is_independent() -> None:
    a = IncrementalBLUE(np.ones(3))
    a.append(np.array([1.0, 1.0, 0.0]), 1.0, 5.0)
    b = a.copy()
    b.append(np.array([1.0, 0.0, 0.0]), 1.0, 2.0)
    assert a.n_rows == 1 and b.n_rows == 2 and a.rank == 1 and b.rank == 2


# ---------------------------------------------------------------- minimal_scale
def test_minimal_scale_empty_history_is_the_laplace_formula() -> None:
    state = IncrementalBLUE(np.ones(3))
    Q = np.array([1.0, 1.0, 0.0])
    b = minimal_scale(state, Q, Q, accuracy=10.0, confidence=0.95)
    exact = 10.0 / math.log(20.0)  # the paper's α = S ln(1/δ)/ε, as a scale
    assert b is not None and exact * (1 - 2e-4) <= b <= exact
    # Discrete noise on the lattice b/1024: the exact discrete law still meets the target.
    bd = minimal_scale(state, Q, Q, 10.0, 0.95, lattice=1 / 1024)
    assert bd is not None and ErrorLaw([1.0], [bd], [bd / 1024]).halfwidth(0.95) <= 10.0
    assert bd == pytest.approx(exact, rel=2e-3)


def test_minimal_scale_uses_history() -> None:
    rng = np.random.default_rng(4)
    n = 6
    state = IncrementalBLUE(np.ones(n))
    for _ in range(8):
        state.append(rng.integers(0, 2, n).astype(float), 4.0, 0.0)
    Q = np.ones(n)
    acc, conf = 4.0, 0.9
    hist = state.estimate(Q)
    assert hist.estimable and hist.halfwidth(conf) > acc
    b = minimal_scale(state, Q, Q, acc, conf)
    assert b is not None and b > acc / -math.log(1 - conf)  # cheaper than ignoring history
    for scale, meets in ((b, True), (b * (1 + 3e-4), False)):
        wh, wn, _, ok = state.estimate_with(Q, Q, scale)
        law = ErrorLaw(np.append(wh, wn), np.append(state.scales, scale))
        assert ok and (law.halfwidth(conf) <= acc) == meets
    # Cap, history that already suffices, impossible targets.
    assert minimal_scale(state, Q, Q, acc, conf, max_scale=b / 2) == b / 2
    assert minimal_scale(state, Q, Q, 1e6, conf) == math.inf
    e0 = np.eye(n)[0]
    other = IncrementalBLUE(np.ones(n))
    other.append(np.ones(n), 100.0, 0.0)
    assert minimal_scale(other, Q - e0, e0, 1.0, 0.95) is None  # ones − e0 needs both rows
    assert minimal_scale(IncrementalBLUE(np.ones(n)), Q, e0, 1.0, 0.95) is None


def test_minimal_scale_validates() -> None:
    state = IncrementalBLUE(np.ones(2))
    Q = np.ones(2)
    for kwargs in (dict(accuracy=0.0, confidence=0.9), dict(accuracy=1.0, confidence=1.0),
                   dict(accuracy=float("nan"), confidence=0.9)):
        with pytest.raises(ValueError):
            minimal_scale(state, Q, Q, **kwargs)


def test_wide_scale_range_matches_batch() -> None:
    """Scales spanning six orders of magnitude: compare the noise contributions u = A·b."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        n = 30
        state = IncrementalBLUE(rng.integers(1, 4, n).astype(float))
        for _ in range(200):
            lo, hi = sorted(rng.integers(0, n + 1, 2))
            h = np.zeros(n)
            h[lo : max(hi, lo + 1)] = 1.0
            state.append(h, float(np.exp(rng.uniform(-7, 7))), float(rng.normal() * 100))
        G = state.rows / state.scales[:, None]
        for _ in range(3):
            Q = rng.integers(-1, 2, n).astype(float)
            inc = state.estimate(Q)
            assert inc.estimable
            u_ref = np.linalg.lstsq(G.T, Q, rcond=None)[0]  # minimum-norm solution of Gᵀu = Q
            err = np.abs(inc.weights * state.scales - u_ref).max()
            assert err <= 1e-9 * np.abs(u_ref).max()
            assert inc.variance == pytest.approx(2 * u_ref @ u_ref, rel=1e-9)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_estimates_of_repeats_from_their_own_rows(case) -> None:  # type: ignore[no-untyped-def]
    """A stored row estimated with its index (coordinates from C, no projection) equals the
    dense batch BLUE of that row; a row index out of range is refused."""
    state, _ = case
    for i in range(state.n_rows):
        Q = np.array(state.rows[i])
        (est,) = state.copy().estimate_many(Q[None, :], [i])
        ref = batch(state, Q)
        assert est.estimable == ref.estimable
        if ref.estimable:
            scale = max(1.0, float(np.abs(ref.weights).max(initial=0.0)))
            np.testing.assert_allclose(est.weights, ref.weights, rtol=1e-8, atol=1e-8 * scale)
            assert est.variance == pytest.approx(ref.variance, rel=1e-8, abs=1e-12)
    if isinstance(state.form, BasisForm):
        with pytest.raises(InvalidArgument, match="stored rows"):
            state.estimate_many(np.ones((1, state.n_atoms)), [state.n_rows])


def test_group_of_repeats_from_their_own_rows() -> None:
    """Many stored rows estimated together with their indices (the batched path, coordinates
    from C) equal the dense batch BLUE of each row."""
    rng = np.random.default_rng(12)
    n, m = 30, 24
    state = IncrementalBLUE(rng.integers(1, 4, n).astype(float))
    for _ in range(m):
        lo, hi = sorted(rng.integers(0, n, 2))
        h = np.zeros(n)
        h[lo: hi + 1] = 1.0
        state.append(h, float(rng.choice([0.5, 2.0])), float(rng.normal() * 10))
    assert 0 < state.rank < n
    rows = np.array(state.rows)
    for est, Q in zip(state.copy().estimate_many(rows, list(range(m))), rows, strict=True):
        ref = batch(state, Q)
        assert est.estimable and ref.estimable
        np.testing.assert_allclose(est.weights, ref.weights, rtol=1e-8, atol=1e-8 * max(1.0, np.abs(ref.weights).max()))
        assert est.variance == pytest.approx(ref.variance, rel=1e-8, abs=1e-12)


def test_coefficient_rows_stay_in_few_blocks() -> None:
    """Rows frozen by a copy after every statement are joined like a binary counter: after
    300 one-row statements C is in at most log₂ 300 + 2 blocks, and reads the same."""
    from dpgate.inference._factors import Rows

    rng = np.random.default_rng(3)
    C, expected = Rows(), []
    for k in range(300):
        row = rng.normal(size=(1, 1 + k // 10))
        C.add(row)
        expected.append(np.pad(row[0], (0, 30 - row.shape[1])))
        C = C.copy()
    assert len(C._blocks) <= math.log2(300) + 2
    np.testing.assert_array_equal(C.dense(30), np.array(expected))
    np.testing.assert_array_equal(C.row(123, 30), expected[123])


# ---------------------------------------------------------------- information form
@st.composite
def spanning_histories(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A block spanning every atom on an empty history (the information form), then random
    appends (some adding directions after splits), splits, copies and blocks."""
    n = draw(st.integers(2, 6))
    sizes = np.array(draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)), dtype=float)
    state = IncrementalBLUE(sizes)
    extra = draw(st.lists(st.lists(st.integers(-2, 2), min_size=n, max_size=n), max_size=3))
    H = np.concatenate([np.eye(n), np.array([r for r in extra if any(r)], dtype=float).reshape(-1, n)])
    k = H.shape[0]
    scales = draw(st.lists(st.sampled_from([0.25, 1.0, 3.0]), min_size=k, max_size=k))
    state.extend(H, scales, draw(st.lists(st.floats(-50, 50), min_size=k, max_size=k)))
    assert isinstance(state.form, InformationForm) and state.rank == n
    ops = draw(st.lists(st.sampled_from(["append", "append", "split", "copy", "extend"]), max_size=12))
    for op in ops:
        n = state.n_atoms
        row = st.lists(st.integers(-2, 2), min_size=n, max_size=n)
        if op == "extend":
            k = draw(st.integers(2, 3))
            state.extend(np.array(draw(st.lists(row, min_size=k, max_size=k)), dtype=float),
                         draw(st.lists(st.sampled_from([0.5, 2.0]), min_size=k, max_size=k)), np.arange(k, dtype=float))
        elif op == "copy":
            old, state = state, state.copy()
            old.append(np.array(draw(row), dtype=float), 1.0, 7.0)
            old.split(np.repeat(np.arange(n), 2), np.repeat(old.cell_sizes / 2, 2))
        elif op == "append":
            scale = draw(st.sampled_from([0.25, 1.0, 3.0, 10.0]))
            state.append(np.array(draw(row), dtype=float), scale, draw(st.floats(-100, 100)),
                         draw(st.sampled_from([0.0, scale / 1024])))
        else:
            pieces = [2 if draw(st.booleans()) else 1 for _ in range(n)]
            parent = np.repeat(np.arange(n), pieces)
            sizes = np.concatenate([[d] if p == 1 else [d / 3, 2 * d / 3]
                                    for d, p in zip(state.cell_sizes, pieces, strict=True)])
            order = np.array(draw(st.permutations(range(parent.size))))  # pieces need not be adjacent
            state.split(parent[order], sizes[order])
    n = state.n_atoms
    queries = [np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float)]
    w = draw(st.lists(st.integers(-2, 2), min_size=state.n_rows, max_size=state.n_rows))
    queries.append(np.array(w, dtype=float) @ state.rows)  # in the row space
    return state, queries


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spanning_histories(), st.sampled_from([0.3, 2.0]))
def test_information_form_equals_batch(case, scale: float) -> None:  # type: ignore[no-untyped-def]
    """Estimates, variances and estimability of the information form equal the dense batch
    BLUE's; pricing a new row equals appending it; the rank is the batch rank."""
    state, queries = case
    assert isinstance(state.form, InformationForm)
    assert state.rank == np.linalg.matrix_rank(state.rows / state.scales[:, None])
    rng = np.random.default_rng(1)
    h = rng.integers(-1, 2, state.n_atoms).astype(float)
    for Q in queries:
        assert_same(state, Q)
    for Q in queries + [h]:
        wh, wn, var, ok = state.estimate_with(Q, h, scale)
        after = state.copy()
        after.append(h, scale, 0.0)
        ref = batch(after, Q)
        assert ok == ref.estimable == state.estimable_with(Q, h)
        if ok:
            tol = 1e-8 * max(1.0, float(np.abs(ref.weights).max(initial=0.0)))
            np.testing.assert_allclose(np.append(wh, wn), ref.weights, rtol=1e-8, atol=tol)
            assert var == pytest.approx(ref.variance, rel=1e-8, abs=1e-12)


def test_information_form_folds_and_matches_the_basis_form() -> None:
    """A tree over 64 atoms, then many more ranges than the pending limit (folds), then a split
    and ranges over the new atoms: the information form and the basis form (row by row) agree."""
    from dpgate.inference._information import MAX_PENDING

    rng = np.random.default_rng(5)
    n = 64
    sizes = rng.integers(1, 4, n).astype(float)
    H = np.concatenate([np.repeat(np.eye(n // w), w, axis=1) for w in (64, 32, 16, 8, 4, 2, 1)])
    scales, values = rng.uniform(0.5, 3, H.shape[0]), rng.normal(size=H.shape[0]) * 20
    info, seq = IncrementalBLUE(sizes, keep_rows=False), IncrementalBLUE(sizes, keep_rows=False)
    info.extend(H, scales, values)
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    assert isinstance(info.form, InformationForm) and isinstance(seq.form, BasisForm)

    def ranges(k: int, n: int) -> list[np.ndarray]:
        out = []
        for _ in range(k):
            lo, hi = sorted(rng.integers(0, n + 1, 2))
            h = np.zeros(n)
            h[lo: max(hi, lo + 1)] = 1.0
            out.append(h)
        return out

    for h in ranges(2 * MAX_PENDING + 3, n):
        for st_ in (info, seq):
            st_.append(h, 2.0, 1.0)
    info.split(np.repeat(np.arange(n), 2), np.repeat(sizes / 2, 2))
    seq.split(np.repeat(np.arange(n), 2), np.repeat(sizes / 2, 2))
    assert info.rank == seq.rank == n
    for h in ranges(10, 2 * n):
        for st_ in (info, seq):
            st_.append(h, 1.0, 2.0)
    assert info.rank == seq.rank
    for Q in (*ranges(5, 2 * n), np.ones(2 * n), np.repeat(rng.normal(size=n), 2)):
        a, b_ = info.estimate(Q), seq.estimate(Q)
        assert a.estimable == b_.estimable
        if a.estimable:
            np.testing.assert_allclose(a.weights, b_.weights, rtol=1e-8, atol=1e-10)
            assert a.value == pytest.approx(b_.value, rel=1e-8, abs=1e-8)


@st.composite
def hierarchies(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """Rows ``c·1_S`` of a hierarchy with its leaves over permuted atoms: every set of
    several atoms split into 2–3 children down to single atoms, sets repeated or left
    out (the leaves never), signs and scales drawn."""
    n = draw(st.integers(1, 24))
    sets: list[tuple[int, int]] = []

    def split(lo: int, hi: int) -> None:
        if hi - lo == 1 or draw(st.integers(0, 3)):
            sets.extend([(lo, hi)] * (1 if hi - lo == 1 else draw(st.integers(0, 2))))
        if hi - lo > 1:
            cuts = sorted(set(draw(st.lists(st.integers(lo + 1, hi - 1), min_size=1, max_size=2))))
            for a, b in zip([lo, *cuts], [*cuts, hi], strict=True):
                split(a, b)

    split(0, n)
    perm = np.array(draw(st.permutations(range(n))))
    G = np.zeros((len(sets), n))
    for i, (lo, hi) in enumerate(sets):
        G[i, perm[lo:hi]] = draw(st.sampled_from([-2.0, 0.3, 1.0, 1.7]))
    order = np.array(draw(st.permutations(range(len(sets)))))
    return G[order]


@settings(max_examples=150, deadline=None)
@given(hierarchies())
def test_hierarchy_inverse_equals_the_dense_inverse(G: np.ndarray) -> None:
    """The bottom-up inverse of a hierarchy's information equals the dense inverse, and is
    exactly symmetric (the information form reads one triangle)."""
    import scipy.sparse as sp

    from dpgate.inference._information import _hierarchy_inverse

    M = _hierarchy_inverse(sp.csr_matrix(G))
    assert M is not None
    ref = np.linalg.inv(G.T @ G)
    np.testing.assert_allclose(M, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_array_equal(M, M.T)


@pytest.mark.parametrize("rows", [
    [[1, 1, 0], [0, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]],  # two sets cross
    [[1, 2, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]],  # a row that is not a multiple of a set
    [[1, 1, 1], [0, 1, 0], [0, 0, 1]],  # atom 0 has no set of its own
])
def test_hierarchy_inverse_declines_other_rows(rows: list[list[float]]) -> None:
    """Rows that are no hierarchy with its leaves get None (the Cholesky inverse takes them)."""
    import scipy.sparse as sp

    from dpgate.inference._information import _hierarchy_inverse

    assert _hierarchy_inverse(sp.csr_matrix(np.array(rows, dtype=float))) is None


@pytest.mark.parametrize("spanning", [True, False])
def test_sparse_rows_extend_like_dense_ones(spanning: bool) -> None:
    """A block of rows given as a sparse matrix builds exactly the state the dense block
    builds: into the information form (a tree), or chunk by chunk (rows that do not span)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(11)
    n = 64
    if spanning:
        H = np.concatenate([np.repeat(np.eye(n // w), w, axis=1) for w in (64, 32, 16, 8, 4, 2, 1)])
    else:
        H = np.zeros((600, n))
        for i in range(600):
            lo, hi = sorted(rng.integers(0, n - 1, 2))
            H[i, lo: hi + 1] = 1.0
    scales, values = rng.uniform(0.5, 3, H.shape[0]), rng.normal(size=H.shape[0]) * 20
    dense, sparse = IncrementalBLUE(np.ones(n), keep_rows=False), IncrementalBLUE(np.ones(n))
    dense.extend(H, scales, values)
    sparse.extend(sp.csr_matrix(H), scales, values)
    assert isinstance(dense.form, InformationForm) == isinstance(sparse.form, InformationForm) == spanning
    np.testing.assert_array_equal(sparse.rows, H)
    for Q in (np.ones(n), rng.integers(-1, 2, n).astype(float), H[3]):
        a, b_ = dense.estimate(Q), sparse.estimate(Q)
        assert a.estimable == b_.estimable
        np.testing.assert_array_equal(a.weights, b_.weights)


def test_pickled_state_estimates_alike_and_grows() -> None:
    """A checkpoint's copy of the state (spare capacity trimmed) estimates as the original and
    takes further appends, in both forms."""
    import pickle

    rng = np.random.default_rng(8)
    n = 12
    basis, info = IncrementalBLUE(np.ones(n)), IncrementalBLUE(np.ones(n))
    info.extend(np.concatenate([np.eye(n), np.ones((1, n))]), np.ones(n + 1), rng.normal(size=n + 1))
    for _ in range(7):
        basis.append(rng.integers(0, 2, n).astype(float), 1.5, float(rng.normal()))
    for st_ in (basis, info):
        back = pickle.loads(pickle.dumps(st_))
        for other in (st_, back):
            other.append(np.ones(n), 2.0, 3.0)
        Q = rng.integers(-1, 2, n).astype(float)
        a, b_ = st_.estimate(Q), back.estimate(Q)
        assert a.estimable == b_.estimable and back.n_rows == st_.n_rows
        if a.estimable:
            np.testing.assert_allclose(b_.weights, a.weights, rtol=1e-12, atol=1e-12)
        assert_same(back, Q)


def test_mixed_block_equals_appends() -> None:
    """A block mixing repeats, rows in the row space and rows adding directions (random ranges
    once the history nearly spans the atoms) enters in one update, as appending row by row."""
    rng = np.random.default_rng(21)
    n = 30
    sizes = rng.integers(1, 4, n).astype(float)
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)

    def ranges(k: int) -> np.ndarray:
        H = np.zeros((k, n))
        for i in range(k):
            lo, hi = sorted(rng.integers(0, n + 1, 2))
            H[i, lo: max(hi, lo + 1)] = 1.0
        return H

    for H in (ranges(12), ranges(25), np.concatenate([ranges(6), ranges(3).repeat(2, axis=0)])):
        scales, values = rng.uniform(0.5, 3, len(H)), rng.normal(size=len(H)) * 10
        m, r = block.n_rows, block.rank
        for h, b, y in zip(H, scales, values, strict=True):
            seq.append(h, float(b), float(y))
        assert block._extend_block(H, scales, values, np.zeros(len(H)))  # one block update
        assert block.n_rows == m + len(H) and block.rank == seq.rank >= r
        assert_same_states(seq, block, (*ranges(4), np.ones(n), rng.integers(-2, 3, n).astype(float)))


def random_ranges(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k random ranges ``[lo, hi]`` over n atoms, as rows."""
    H = np.zeros((k, n))
    for i in range(k):
        lo, hi = sorted(rng.integers(0, n, 2))
        H[i, lo: hi + 1] = 1.0
    return H


def test_a_block_of_several_panels_equals_appends() -> None:
    """A block longer than several panels of the square root's delayed updates, with rows that
    add directions and rows that do not in every panel, enters as appending row by row does."""
    from dpgate.inference._factors import _PANEL

    rng = np.random.default_rng(8)
    n = 120
    sizes = rng.integers(1, 5, n).astype(float)
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)

    first = random_ranges(rng, n, 40)
    H = np.concatenate([random_ranges(rng, n, 3 * _PANEL), first[rng.integers(0, 40, _PANEL)]])[rng.permutation(4 * _PANEL)]
    first_values = rng.normal(size=len(first))
    for same in (seq, block):
        same.extend(first, np.full(len(first), 2.0), first_values)
    scales, values = rng.uniform(0.5, 3, len(H)), rng.normal(size=len(H)) * 10
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    r, rows_in, root = block.rank, [], block.form._S
    append_rows = root.append_rows
    root.append_rows = lambda P, L, adds: (rows_in.append(adds.copy()), append_rows(P, L, adds))[1]
    assert block._extend_block(H, scales, values, np.zeros(len(H)))
    (adds,) = rows_in  # one update of the square root, the rows delayed in panels
    per_panel = adds.reshape(4, _PANEL).sum(axis=1)
    assert block.rank == seq.rank == r + adds.sum() and (per_panel > 0).all() and (per_panel < _PANEL).all()
    # The square root itself, not only the estimates (a solve's refinement would hide its errors).
    S_seq, S_block = seq.form._S.copy().dense(), block.form._S.copy().dense()
    np.testing.assert_allclose(S_block, S_seq, rtol=0, atol=1e-10 * np.abs(S_seq).max())
    assert_same_states(seq, block, (*random_ranges(rng, n, 6), np.ones(n), rng.integers(-2, 3, n).astype(float)))


def test_blocks_after_far_noisier_releases_keep_the_square_root_accurate() -> None:
    """Releases 30 000 times noisier than later blocks (an analyst's ±1e7 question beside ±300
    ones) make the square root shrink by orders of magnitude.  Blocks update it row by row
    (Potter), so a solve's first residual stays as small as appending row by row leaves it
    (one factorisation of the whole block's update left it at 1e-4–1e-2: every later solve
    refined for several O(m r) steps)."""
    rng = np.random.default_rng(3)
    n = 120
    state = IncrementalBLUE(np.ones(n))

    state.extend(random_ranges(rng, n, 40), np.full(40, 100.0), np.zeros(40))
    state.extend(random_ranges(rng, n, 10), np.full(10, 3e6), np.zeros(10))
    for _ in range(3):
        state.extend(random_ranges(rng, n, 80), np.full(80, 100.0), np.zeros(80))
        for Q in random_ranges(rng, n, 3):
            c, _ = state.form._project_now(Q)
            S, C = state.form._S, state.form._C
            z = S.times(S.t_times(c))
            first = np.abs(c - C.times_and_gram(z, state.rank)[1]).max() / np.abs(c).max()
            assert first < 1e-5  # appending row by row: 1e-6 right after the noisy rows, then 1e-11
            assert_same(state, Q)


def test_copy_module_copy_is_independent_in_both_forms() -> None:
    """``copy.copy`` (how a planning state copies its BLUE) must not share what later
    appends and splits change."""
    import copy

    n = 6
    for spanning in (False, True):
        st_ = IncrementalBLUE(np.ones(n))
        rows = np.concatenate([np.eye(n) if spanning else np.tri(n), np.ones((1, n))])
        st_.extend(rows, np.ones(n + 1), np.arange(n + 1.0))
        assert isinstance(st_.form, InformationForm) == spanning
        trial = copy.copy(st_)
        trial.split(np.repeat(np.arange(n), 2), np.full(2 * n, 0.5))
        trial.append(np.ones(2 * n), 1.0, 3.0)
        assert st_.n_atoms == n and st_.n_rows == n + 1 and trial.n_rows == n + 2
        st_.split(np.arange(n), np.ones(n))
        assert_same(st_, np.ones(n))
        assert_same(trial, np.ones(2 * n))


def test_large_blocks_enter_once() -> None:
    """Blocks above the chunk size: a spanning one becomes the information form, another is
    added chunk by chunk; each row enters exactly once and the estimates are the batch's."""
    rng = np.random.default_rng(2)
    n = 300
    H = np.concatenate([np.eye(n), (rng.random((40, n)) < 0.1).astype(float)])
    spanning = IncrementalBLUE(np.ones(n))
    spanning.extend(H, np.ones(len(H)), rng.normal(size=len(H)))
    assert isinstance(spanning.form, InformationForm) and spanning.n_rows == len(H)
    chunked = IncrementalBLUE(np.ones(n))
    chunked.extend(H[::-1][:290], np.ones(290), rng.normal(size=290))
    assert isinstance(chunked.form, BasisForm) and chunked.n_rows == 290
    for st_ in (spanning, chunked):
        assert_same(st_, rng.integers(-1, 2, n).astype(float))
        assert_same(st_, np.ones(n))


def test_remembered_results_never_outlive_a_change() -> None:
    """An estimate asked before a change (append, block, split) is not served after it."""
    n = 300
    for rows in (np.eye(n), np.eye(n)[:5]):  # a spanning block above the chunk size, a small one
        st_ = IncrementalBLUE(np.ones(n))
        Q = np.eye(n)[0]
        assert not st_.estimate(Q).estimable
        st_.extend(rows, np.ones(len(rows)), np.arange(len(rows), dtype=float))
        assert st_.estimate(Q).estimable and st_.estimate(Q).value == 0.0
        st_.append(Q, 1.0, 4.0)
        assert st_.estimate(Q).value == pytest.approx(2.0)
        st_.split(np.repeat(np.arange(n), 2), np.full(2 * n, 0.5))
        assert not st_.estimate(np.eye(2 * n)[0]).estimable


def test_one_pass_products_with_the_rows_are_the_products() -> None:
    """``Rows.times_and_gram`` (C z and Cᵀ C z in one pass over cache-sized chunks of C) equals
    the two products of the dense C, over frozen blocks of several widths and a tail."""
    from dpgate.inference import _blocks
    from dpgate.inference._factors import Rows

    rng = np.random.default_rng(7)
    rows = Rows()
    widths = [3, 5, 5, 9]
    for w in widths:
        rows.add(rng.normal(size=(int(rng.integers(1, 40)), w)))
        rows = rows.copy() if w != widths[-1] else rows  # freeze all but the last into blocks
    r = max(widths)
    C = rows.dense(r)
    for z in (rng.normal(size=r), rng.normal(size=(r, 3))):  # one right-hand side, or several
        for chunked in (True, False):
            chunk, whole = _blocks.CHUNK_BYTES, _blocks.WHOLE_BYTES
            if chunked:
                _blocks.CHUNK_BYTES, _blocks.WHOLE_BYTES = 8 * 9 * 4, 0  # chunks of a few rows
            try:
                Cz, gram = rows.times_and_gram(z, r)
            finally:
                _blocks.CHUNK_BYTES, _blocks.WHOLE_BYTES = chunk, whole
            assert Cz.shape == (C @ z).shape and gram.shape == z.shape
            np.testing.assert_allclose(Cz, C @ z, rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(gram, C.T @ (C @ z), rtol=1e-12, atol=1e-12)


def test_a_state_pickled_before_the_two_forms_is_refused() -> None:
    """A pickle without the form (an older build's checkpoint) fails to load, so the checkpoint
    is replayed, rather than loading a state that fails at its first use."""
    import pickle

    old = IncrementalBLUE(np.ones(3))
    old.__dict__ = {"_d": np.ones(3), "_m": 0, "_r": 0, "_info": None}
    with pytest.raises(TypeError, match="older dpgate build"):
        pickle.loads(pickle.dumps(old))


def test_revalue_gives_the_state_appending_the_values_gives() -> None:
    """Rows appended as placeholders while planning, then revalued once the values exist: the
    same estimates, bit for bit, as appending them with their values (and no stale estimate)."""
    rng = np.random.default_rng(5)
    d = rng.integers(1, 4, 12).astype(float)
    base = IncrementalBLUE(d)
    for _ in range(8):
        base.append(rng.integers(0, 2, 12).astype(float), scale=2.0, value=float(rng.normal(50, 5)))
    h = rng.integers(0, 2, 12).astype(float)
    q = h  # estimable once h is appended
    planned, direct = base.copy(), base.copy()
    planned.append(h, 1.5, 0.0)
    before = planned.estimate(q)  # remembered, with the placeholder
    planned.revalue([42.5])
    direct.append(h, 1.5, 42.5)
    got, want = planned.estimate(q), direct.estimate(q)
    assert got.estimable and want.estimable
    assert got.value == want.value and got.variance == want.variance and got.value != before.value
    np.testing.assert_array_equal(planned.values, direct.values)
    with pytest.raises(InvalidArgument):
        planned.revalue(np.zeros(planned.n_rows + 1))
    with pytest.raises(InvalidArgument):
        planned.revalue([float("nan")])
