"""Per-cell accounting (dpgate.plan.accounting): B_j = Σ_i (α_i/S_i)|H_ij| and the charge k·max_j B_j.

Checked against a brute-force loop over releases and cells, and against
dpgate.inference.system_cost, on random histories.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpgate.inference import system_cost
from dpgate.plan.accounting import _DISJOINT_ATOMS, UNITS_PER_EPSILON, CellCosts


def brute_force(H: np.ndarray, alpha: np.ndarray, S: np.ndarray) -> list[float]:
    """B_j = Σ_i (α_i/S_i)|H_ij|, written as the plain double loop of the definition."""
    m, n = H.shape
    B = [0.0] * n
    for j in range(n):
        for i in range(m):
            if S[i] > 0:
                B[j] += alpha[i] / S[i] * abs(H[i, j])
    return B


def record(H: np.ndarray, alpha: np.ndarray, S: np.ndarray, k: int = 1) -> CellCosts:
    costs = CellCosts(H.shape[1], k)
    for h, a, s in zip(H, alpha, S, strict=True):
        costs.add(h, a, s)
    return costs


def random_history(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 12)), int(rng.integers(1, 20))
    H = rng.integers(-3, 4, size=(m, n)).astype(float) / rng.choice([1, 2, 4])
    H[H.any(axis=1) == 0, 0] = 1.0  # no all-zero row: each needs S > 0
    alpha = rng.uniform(0.01, 1.0, size=m)
    S = np.abs(H).max(axis=1)  # the L1 sensitivity of a counting query: max |h_ij|
    return H, alpha, S


@pytest.mark.parametrize("seed", range(25))
def test_per_cell_budget_matches_the_definition(seed: int) -> None:
    H, alpha, S = random_history(seed)
    costs = record(H, alpha, S)
    np.testing.assert_allclose(costs.per_atom, brute_force(H, alpha, S), rtol=1e-12, atol=0)
    assert costs.charge == pytest.approx(max(brute_force(H, alpha, S)), rel=1e-12)
    reference = system_cost(H, alpha, S)
    np.testing.assert_allclose(costs.per_atom, reference.per_cell, rtol=1e-12, atol=0)
    assert costs.charge == pytest.approx(reference.max, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_charge_scales_with_rows_per_individual(k: int) -> None:
    H, alpha, S = random_history(7)
    assert record(H, alpha, S, k).charge == pytest.approx(k * max(brute_force(H, alpha, S)), rel=1e-12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 8)),
               elements=st.integers(-4, 4).map(float)),
    st.integers(1, 3),
    st.data(),
)
def test_increase_is_the_charge_after_minus_before(H: np.ndarray, k: int, data: st.DataObject) -> None:
    H = H[H.any(axis=1)]
    S = np.abs(H).max(axis=1)
    alpha = np.array(data.draw(st.lists(st.floats(0.01, 2.0), min_size=len(H), max_size=len(H))))
    costs = CellCosts(H.shape[1], k)
    for h, a, s in zip(H, alpha, S, strict=True):
        before = costs.charge
        planned = costs.increase(h, a, s)
        costs.add(h, a, s)
        assert planned >= 0.0
        assert costs.charge - before == pytest.approx(planned, abs=1e-12)
    assert costs.charge == pytest.approx(k * max(brute_force(H, alpha, S), default=0.0), rel=1e-12)


def test_empty_history_costs_nothing() -> None:
    assert CellCosts(4).charge == 0.0
    assert CellCosts(0).charge == 0.0
    assert CellCosts(3).increase(np.zeros(3), 0.5, 1.0) == 0.0


def test_split_copies_the_parent_cost_to_every_piece() -> None:
    # A piece of an atom holds cells of the atom, so it has exactly the atom's cost.
    costs = CellCosts(2)
    costs.add(np.array([1.0, 0.0]), 0.3, 1.0)
    costs.add(np.array([1.0, 2.0]), 0.2, 2.0)
    costs.split(np.array([0, 0, 1, 1, 1]))
    np.testing.assert_allclose(costs.per_atom, [0.4, 0.4, 0.2, 0.2, 0.2])
    assert costs.charge == pytest.approx(0.4)


def test_copy_is_independent() -> None:
    costs = CellCosts(2, 2)
    costs.add(np.array([1.0, 1.0]), 0.1, 1.0)
    plan = costs.copy()
    plan.add(np.array([0.0, 1.0]), 0.5, 1.0)
    assert costs.charge == pytest.approx(0.2)
    assert plan.charge == pytest.approx(1.2)
    assert plan.k == costs.k == 2


# -- issue 13, finding 7: exact accounting -------------------------------------------------------


def test_tiny_releases_are_never_absorbed() -> None:
    """On 722f926 the float sum stayed at 86.0 after 169 releases of α = 3e-16 (this failed)."""
    costs = CellCosts(2)
    costs.add(np.array([1.0, 0.0]), 86.0, 1.0)
    before, before_units = costs.charge, costs.charge_units
    for _ in range(169):
        assert costs.increase_units(np.array([1.0, 1.0]), 3e-16, 1.0) > 0
        costs.add(np.array([1.0, 1.0]), 3e-16, 1.0)
    assert costs.charge_units - before_units >= 169 * 3e-16 * UNITS_PER_EPSILON
    assert costs.charge > before
    assert costs.charge >= 86.0 + 169 * 3e-16 - 2e-14  # the display value moves too


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(1e-18, 10.0), st.integers(1, 7), st.integers(1, 7)), min_size=1, max_size=20))
def test_costs_round_up_never_down(releases: list[tuple[float, int, int]]) -> None:
    """Exact units ≥ the exact rational Σ α·|num_j|/max|num| (outward rounding), and close to it."""
    costs = CellCosts(2)
    exact = [Fraction(0), Fraction(0)]
    for alpha, a, b in releases:
        d = 3  # a denominator whose weights are not floats
        h = np.array([a / d, b / d])
        costs.add(h, alpha, max(a, b) / d)
        for j, n in enumerate((a, b)):
            exact[j] += Fraction(alpha) * Fraction(n, max(a, b))
    for units, e in zip(costs.units.tolist(), exact, strict=True):
        assert Fraction(units, UNITS_PER_EPSILON) >= e
        assert Fraction(units, UNITS_PER_EPSILON) - e <= e * Fraction(1, 2**48) + Fraction(len(releases), UNITS_PER_EPSILON)


def test_large_costs_switch_to_unbounded_integers_exactly() -> None:
    costs = CellCosts(3)
    costs.add(np.array([1.0, 1.0, 0.0]), 3.5, 1.0)
    assert costs.units.dtype == np.int64
    costs.add(np.array([1.0, 0.0, 0.0]), 1e9, 1.0)  # beyond int64 in units of 2^-50
    costs.add(np.array([1.0, 0.0, 0.0]), 3e-16, 1.0)
    assert costs.charge_units == (Fraction(1e9) + Fraction(3.5)) * UNITS_PER_EPSILON + math.ceil(
        Fraction(3e-16) * UNITS_PER_EPSILON)
    np.testing.assert_array_equal(costs.per_atom, [1e9 + 3.5, 3.5, 0.0])


@settings(max_examples=60, deadline=None)
@given(
    rows=hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 7)),
                    elements=st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0, 1 / 3])),
    alpha=st.sampled_from([0.1, 0.37, 1.0, 3.5]),
    huge=st.booleans(),
)
def test_add_sparse_is_add_of_the_dense_vector(rows, alpha, huge):
    """The planner's and the ledger's sparse charges equal dense ones exactly, also past int64
    (``huge``: Python-int units), in place or not, with the max kept incrementally."""
    dense, sparse, in_place = CellCosts(rows.shape[1]), CellCosts(rows.shape[1]), CellCosts(rows.shape[1])
    for i, r in enumerate(rows):
        a, s = alpha * (1 + i) * (1e15 if huge else 1), max(1.0, float(np.abs(r).max()))
        dense.add(r, a, s)
        on = np.flatnonzero(r)
        sparse.add_sparse(on, r[on], a, s)
        in_place.add_sparse(on, r[on], a, s, in_place=True)
        assert sparse.charge_units == in_place.charge_units == dense.charge_units == dense.k * int(dense.units.max())
    assert dense.units.tolist() == sparse.units.tolist() == in_place.units.tolist()


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    rows=hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 7)),
                    elements=st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0, 1 / 3])),
    alpha=st.sampled_from([0.1, 0.37, 1.0, 3.5]),
    huge=st.booleans(),
    k=st.integers(1, 3),
)
def test_charge_with_is_the_charge_after_adding(rows, alpha, huge, k):
    """Pricing releases (overlapping or not) in O(their support) gives exactly the charge
    that adding them to a copy gives, and leaves the costs as they were."""
    costs = CellCosts(rows.shape[1], k)
    costs.add(np.arange(rows.shape[1]) % 3, alpha, 2.0)
    before = costs.units.tolist()
    releases = []
    trial = costs.copy()
    for i, r in enumerate(rows):
        a, s = alpha * (1 + i) * (1e15 if huge else 1), max(1.0, float(np.abs(r).max()))
        on = np.flatnonzero(r)
        releases.append((on, r[on], a, s))
        trial.add_sparse(on, r[on], a, s, in_place=True)
    assert costs.charge_with(releases) == trial.charge
    assert costs.units.tolist() == before


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 9),
    groups=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1.0, -1.0, 0.5, 2.0, 1 / 3])), min_size=1,
                    max_size=8),
    alpha=st.sampled_from([0.1, 0.37, 1.0, 3.5, 1e15]),
    prior=st.booleans(),
    k=st.integers(1, 3),
)
def test_add_disjoint_is_adding_one_by_one(n, groups, alpha, prior, k):
    """A GROUP BY's disjoint charges added in one pass give the costs, and the charge after
    each, that adding them one by one gives; meeting charges are refused and add nothing."""
    costs = CellCosts(n, k)
    if prior:
        costs.add(np.arange(n) % 3, 0.5, 2.0)
    one_by_one, before = costs.copy(), costs.units.tolist()
    charges, start = [], 0
    for width, w in groups:  # consecutive, hence disjoint, runs of cells (some empty)
        atoms = np.arange(start, min(start + width, n))
        charges.append((atoms, np.full(atoms.size, w)))
        start += width
    expected = []
    for atoms, weights in charges:
        one_by_one.add_sparse(atoms, weights, alpha, 2.0, in_place=True)
        expected.append(one_by_one.charge_units)
    got = costs.add_disjoint(charges, alpha, 2.0)
    if got is None:  # past int64: refused, nothing added (the caller adds them one by one)
        assert expected[-1] >= 2**63 and costs.units.tolist() == before
        return
    assert got == expected
    assert costs.units.tolist() == one_by_one.units.tolist() and costs.charge_units == one_by_one.charge_units
    meeting = costs.copy()
    if n > 1:
        assert meeting.add_disjoint([(np.array([0, 1]), np.ones(2)), (np.array([1]), np.ones(1))], 1.0, 1.0) is None
        assert meeting.units.tolist() == costs.units.tolist()


def test_add_disjoint_leaves_a_large_support_to_one_by_one() -> None:
    """Charges over more atoms than one pass is worth (a GROUP BY over a 10⁶-atom cost grid)
    are refused, adding nothing; the caller adds them one by one."""
    n = _DISJOINT_ATOMS + 2
    costs = CellCosts(n)
    costs.add_sparse(np.array([0]), np.ones(1), 1.0, 1.0)
    before = costs.units.copy()
    half = n // 2
    charges = [(np.arange(half), np.ones(half)), (np.arange(half, n), np.ones(n - half))]
    assert costs.add_disjoint(charges, 0.5, 1.0) is None
    assert np.array_equal(costs.units, before)
    small = [(a[:2], w[:2]) for a, w in charges]
    assert costs.add_disjoint(small, 0.5, 1.0) is not None


def test_a_copy_shares_the_array_until_it_is_written() -> None:
    """Copy on write: a planning copy reads the live costs without copying them, and its first
    in-place write (sparse, disjoint or through a re-grid) leaves the original exactly as it was."""
    live = CellCosts(6, 2)
    live.add(np.array([1.0, 0, 2, 0, 1, 0]), 0.5, 2.0)
    before = live.units.tolist()
    for write in (lambda c: c.add_sparse(np.array([1, 3]), np.ones(2), 1.0, 1.0, in_place=True),
                  lambda c: c.add_disjoint([(np.array([0]), np.ones(1)), (np.array([5]), np.ones(1))], 1.0, 1.0),
                  lambda c: c.regrid(lambda u: u[[0, 0, 1, 2, 3, 4, 5]]) or c.add_sparse(
                      np.array([0]), np.ones(1), 1.0, 1.0, in_place=True)):
        trial = live.copy()
        assert trial.units is live.units and trial.charge == live.charge  # nothing copied to read
        write(trial)
        assert live.units.tolist() == before and trial.units is not live.units
        assert trial.charge_units > live.charge_units
