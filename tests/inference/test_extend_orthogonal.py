"""A large GROUP BY recorded as one orthogonal block (``BasisForm.extend_orthogonal``) gives
the state that appending its groups one by one gives: the same estimates, variances and
estimability answers, on random disjoint histories that leave atoms uncovered, and after a
further overlapping release."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from dpgate.inference import IncrementalBLUE
from dpgate.inference._basis_form import BasisForm
from dpgate.inference._incremental import _CHUNK


def _groups(rng: np.random.Generator, n: int, k: int, atoms: np.ndarray) -> np.ndarray:
    """k disjoint non-zero rows over ``atoms`` (each atom in one group), with count or SUM-like weights."""
    assign = rng.permutation(np.concatenate([np.arange(k), rng.integers(0, k, atoms.size - k)]))
    H = np.zeros((k, n))
    weights = rng.choice([1.0, 1.0, 2.5, -3.0], size=atoms.size)
    H[assign, atoms] = weights
    return H


def _same(a: IncrementalBLUE, b: IncrementalBLUE, queries: list[np.ndarray]) -> None:
    assert (a.rank, a.n_rows) == (b.rank, b.n_rows)
    for Q in queries:
        ea, eb = a.estimate(Q), b.estimate(Q)
        assert ea.estimable == eb.estimable == a.estimable(Q) == b.estimable(Q)
        if not ea.estimable:
            assert math.isnan(eb.value)
            continue
        mag = float(np.abs(ea.weights * a.values).sum()) + 1.0
        assert abs(ea.value - eb.value) <= 1e-9 * mag
        assert eb.variance == pytest.approx(ea.variance, rel=1e-9)
        # Weights: to the solver's precision (a block and rows one by one round differently;
        # so did the chunked path this replaces); estimates and variances to 1e-9.
        np.testing.assert_allclose(eb.weights, ea.weights, rtol=1e-7, atol=1e-10 * float(np.abs(ea.weights).max()))
    many_a, many_b = a.estimate_many(np.array(queries)), b.estimate_many(np.array(queries))
    for ea, eb in zip(many_a, many_b, strict=True):
        assert ea.estimable == eb.estimable
        if ea.estimable:
            assert eb.variance == pytest.approx(ea.variance, rel=1e-9)


def _queries(rng: np.random.Generator, H: np.ndarray, uncovered: np.ndarray, n: int) -> list[np.ndarray]:
    out = [H[0], H[-1], H[:5].sum(axis=0), H.sum(axis=0), np.ones(n), rng.integers(-2, 3, n).astype(float)]
    if uncovered.size:
        out.append(np.eye(n)[uncovered[0]])  # an atom no row touches: not estimable
        out.append(H[1] + np.eye(n)[uncovered[-1]])
    out.append(rng.normal(size=H.shape[0]) @ H)  # in the row space
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sparse", [False, True])
def test_large_disjoint_release_equals_appends(seed: int, sparse: bool) -> None:
    rng = np.random.default_rng(seed)
    n, k = 420, _CHUNK + 60 + 10 * seed
    sizes = rng.integers(1, 4, n).astype(float)
    uncovered = rng.choice(n, size=rng.integers(1, 30), replace=False)
    covered = np.setdiff1d(np.arange(n), uncovered)
    H = _groups(rng, n, k, covered)
    scales, values = rng.uniform(0.5, 4.0, k), rng.normal(size=k) * 30
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    block.extend(sp.csr_matrix(H) if sparse else H, scales, values)
    assert isinstance(block.form, BasisForm) and len(block.form._C._blocks) == 1  # one block, not chunks
    _same(seq, block, _queries(rng, H, uncovered, n))
    _same(seq, pickle.loads(pickle.dumps(block)), _queries(rng, H, uncovered, n))  # a checkpoint
    rebuilt = block.copy()
    assert isinstance(rebuilt.form, BasisForm)
    rebuilt.form._refresh()  # S rebuilt from C (sparse block and all)
    _same(seq, rebuilt, _queries(rng, H, uncovered, n))
    # A repeat of the groups: their coordinates are read from C's (sparse) rows.
    for ea, eb in zip(seq.estimate_many(H[:20], list(range(20))), block.estimate_many(H[:20], list(range(20))),
                      strict=True):
        assert eb.value == pytest.approx(ea.value, rel=1e-9) and eb.variance == pytest.approx(ea.variance, rel=1e-9)
    assert block.estimable_with(np.eye(n)[uncovered[0]], np.eye(n)[uncovered[0]])
    assert not block.estimable_with(np.eye(n)[uncovered[0]], H[0])

    # A further release overlapping the groups (another GROUP BY), into both and into a copy.
    twin = block.copy()
    H2 = _groups(rng, n, 40, rng.permutation(n)[: n - 5])
    s2, v2 = rng.uniform(0.5, 4.0, 40), rng.normal(size=40) * 30
    for h, b, y in zip(H2, s2, v2, strict=True):
        seq.append(h, float(b), float(y))
    block.extend(H2, s2, v2)
    _same(seq, block, _queries(rng, H, uncovered, n) + [H2[0], H2.sum(axis=0) + H[3]])
    assert twin.n_rows == k  # the copy did not see the later release


def test_orthogonal_block_after_history_and_fallback() -> None:
    """A GROUP BY over atoms no earlier release touched enters as one block after a history
    (S grows block-diagonally); one that overlaps the history goes the chunked way — both equal appends."""
    rng = np.random.default_rng(7)
    n = 700
    sizes = rng.integers(1, 3, n).astype(float)
    first = np.zeros((3, n))
    first[0, :100], first[1, 50:150], first[2, :20] = 1.0, 2.0, 1.0
    seq, block = IncrementalBLUE(sizes), IncrementalBLUE(sizes)
    for st_ in (seq, block):
        for h in first:
            st_.append(h, 1.5, 10.0)
    H = _groups(rng, n, _CHUNK + 40, np.arange(150, n - 3))  # orthogonal to the history
    scales, values = rng.uniform(0.5, 4.0, H.shape[0]), rng.normal(size=H.shape[0]) * 30
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    calls: list[bool] = []
    real = BasisForm.extend_orthogonal

    def spy(self: BasisForm, *args: object) -> bool:
        calls.append(real(self, *args))  # type: ignore[arg-type]
        return calls[-1]

    BasisForm.extend_orthogonal = spy  # type: ignore[method-assign]
    try:
        block.extend(H, scales, values)
        H2 = _groups(rng, n, _CHUNK + 20, np.arange(n))  # overlaps everything: the chunked path
        s2, v2 = rng.uniform(0.5, 4.0, H2.shape[0]), rng.normal(size=H2.shape[0]) * 30
        block.extend(H2, s2, v2)
    finally:
        BasisForm.extend_orthogonal = real  # type: ignore[method-assign]
    assert calls == [True, False]
    uncovered = np.arange(n - 3, n)
    for h, b, y in zip(H2, s2, v2, strict=True):
        seq.append(h, float(b), float(y))
    _same(seq, block, _queries(rng, H, uncovered, n) + [first[1], H2[0] + first[0]])


def _same_partition(a: np.ndarray | None, b: np.ndarray | None) -> None:
    assert a is not None and b is not None
    assert np.unique(np.stack([a, b], axis=1), axis=0).shape[0] == np.unique(a).size == np.unique(b).size


def test_sparse_basis_block_answers_like_dense() -> None:
    """The orthogonal block keeps its basis rows sparse: twin classes, restriction filters,
    batched estimability, splits and merges of blocks answer as the row-by-row (dense) state."""
    rng = np.random.default_rng(11)
    n, k = 330, _CHUNK + 20
    sizes = rng.integers(1, 4, n).astype(float)
    H = _groups(rng, n, k, np.arange(n - 10))
    scales, values = rng.uniform(0.5, 4.0, k), rng.normal(size=k) * 30
    seq, block = IncrementalBLUE(sizes, keep_rows=False), IncrementalBLUE(sizes, keep_rows=False)
    for h, b, y in zip(H, scales, values, strict=True):
        seq.append(h, float(b), float(y))
    block.extend(H, scales, values)
    _same_partition(seq.twin_classes(), block.twin_classes())
    Q = H[0] + H[1] + np.eye(n)[n - 1]
    left_out = [np.flatnonzero(H[0])[:1], np.array([n - 1]), np.flatnonzero(H[1])]
    assert seq.restrictions_possible(Q, left_out) == block.restrictions_possible(Q, left_out)
    Qs = np.array([H[0], H[2] + np.eye(n)[n - 2], np.ones(n)] * 6)
    Hs = np.array([np.eye(n)[n - 2], np.eye(n)[n - 2], np.eye(n)[n - 3]] * 6)
    assert seq.estimable_with_many(Qs, Hs) == block.estimable_with_many(Qs, Hs)
    # A block that cannot add a direction per row (r + k > n): appended as rows one by one
    # would (Root.append_rows on the diagonal S₀).
    more = (rng.random((60, n)) < 0.05) * rng.integers(1, 3, (60, n)).astype(float)
    s3, v3 = rng.uniform(0.5, 4.0, 60), rng.normal(size=60) * 30
    for h, b, y in zip(more, s3, v3, strict=True):
        seq.append(h, float(b), float(y))
    assert block._extend_block(more, s3, v3, np.zeros(60))
    _same(seq, block, [H[0], more[0], more[1] + H[2], np.ones(n), np.eye(n)[n - 1]])
    # Split some atoms in two (the sparse block records the map), then append to both.
    parent = np.sort(np.concatenate([np.arange(n), rng.choice(n, 40, replace=False)]))
    new_sizes = sizes[parent].copy()
    first = np.r_[True, parent[1:] != parent[:-1]]
    new_sizes[~first] = 1.0
    new_sizes[first] = sizes - np.bincount(parent[~first], minlength=n)
    parent, new_sizes = parent[new_sizes > 0], new_sizes[new_sizes > 0]
    for st_ in (seq, block):
        st_.split(parent, new_sizes)
        st_.append(rng.integers(0, 2, parent.size).astype(float), 1.0, 5.0)
    m = parent.size
    queries = [H[0][parent], H[3][parent] + H[4][parent], np.ones(m), rng.integers(-1, 2, m).astype(float),
               np.eye(m)[m - 1]]
    _same(seq, block, queries)
    # After the append, rounding may part twins differently in the two states; each state's
    # classes must still hold atoms with equal columns in its basis.
    classes, V = block.twin_classes(), block.basis()
    assert classes is not None
    for c in np.unique(classes):
        cols = V[:, classes == c]
        assert (cols == cols[:, :1]).all()


def test_many_sparse_blocks_merge() -> None:
    """Five GROUP BYs on atoms no earlier one touched: five sparse blocks, merged sparse on a copy."""
    rng = np.random.default_rng(12)
    k, parts = _CHUNK + 1, 5
    n = k * parts + 7
    sizes = rng.integers(1, 3, n).astype(float)
    seq, block = IncrementalBLUE(sizes, keep_rows=False), IncrementalBLUE(sizes, keep_rows=False)
    blocks = []
    for p in range(parts):
        H = np.zeros((k, n))
        H[np.arange(k), p * k + np.arange(k)] = 1.0
        scales, values = rng.uniform(0.5, 4.0, k), rng.normal(size=k) * 30
        for h, b, y in zip(H, scales, values, strict=True):
            seq.append(h, float(b), float(y))
        block.extend(H, scales, values)
        blocks.append(H)
    merged = block.copy()
    assert isinstance(merged.form, BasisForm) and len(merged.form._blocks) < parts
    Hall = np.concatenate(blocks)
    _same(seq, merged, [Hall[0], Hall[-1], Hall.sum(axis=0), np.ones(n), Hall[5] + Hall[700]])
