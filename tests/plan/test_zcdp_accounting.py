"""Per-cell ρ accounting (``CellCosts(..., zcdp=True)``), checked by brute force on small domains.

A neighbour adds or removes one unit of up to ``k`` rows anywhere in the domain.  The exact zCDP
loss of releases ``y_i = h_i·x + N_i`` with Gaussian noise of deviation ``σ_i = S_i/α_i`` is
``Σ_i (h_i·Δx / σ_i)² / 2`` (the Rényi divergence of two normals, at every order), and the same
expression bounds Laplace releases of scale ``S_i/α_i`` (each ``ε``-DP, hence ``ε²/2``-zCDP, by
group privacy for the unit).  The recorded charge must never be below it, and must equal its
maximum (attained by all ``k`` rows in one cell).
"""

from __future__ import annotations

import itertools
import pickle
from fractions import Fraction

import numpy as np
import pytest

from dpgate.plan.accounting import UNITS_PER_EPSILON, CellCosts, release_units, summed_units


def _brute_force(H: np.ndarray, alphas: np.ndarray, k: int) -> float:
    """The largest zCDP loss over every unit of 1..k rows (a multiset of cells)."""
    n = H.shape[1]
    sens = np.abs(H).max(axis=1)
    best = 0.0
    for size in range(1, k + 1):
        for cells in itertools.combinations_with_replacement(range(n), size):
            dx = np.bincount(cells, minlength=n)
            loss = float(np.sum((alphas * (H @ dx) / sens) ** 2) / 2)
            best = max(best, loss)
    return best


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_recorded_rho_is_the_brute_force_loss(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = 4, int(rng.integers(1, 6))
    H = rng.integers(-3, 4, size=(m, n)).astype(float)
    H[np.abs(H).max(axis=1) == 0, 0] = 1.0
    alphas = rng.uniform(0.05, 2.0, m)
    costs = CellCosts(n, k, zcdp=True)
    for h, a in zip(H, alphas, strict=True):
        costs.add(h, a, float(np.abs(h).max()))
    brute = _brute_force(H, alphas, k)
    assert costs.charge >= brute * (1 - 1e-12)  # never an under-count
    assert costs.charge == pytest.approx(brute, rel=1e-12, abs=1e-15)  # attained: all k rows in one cell


def test_one_release_units_are_rounded_up_from_the_exact_rho() -> None:
    units = int(release_units(np.array([1.0, 3.0]), 0.3, 3.0, zcdp=True)[0])
    exact = (Fraction(0.3) * Fraction(1, 3)) ** 2 / 2 * UNITS_PER_EPSILON
    assert exact <= units < exact + 2


def test_the_unit_multiplier_is_k_squared_for_rho_and_k_for_epsilon() -> None:
    pure, zcdp = CellCosts(2, 3), CellCosts(2, 3, zcdp=True)
    for c in (pure, zcdp):
        c.add(np.array([1.0, 0.0]), 0.5, 1.0)
    assert pure.charge == pytest.approx(3 * 0.5)
    assert zcdp.charge == pytest.approx(9 * 0.5**2 / 2)


def test_sparse_increase_and_copy_agree_with_dense_adds() -> None:
    rng = np.random.default_rng(3)
    dense, sparse = CellCosts(6, 2, zcdp=True), CellCosts(6, 2, zcdp=True)
    for _ in range(5):
        h = rng.integers(0, 3, 6).astype(float)
        h[0] = 1.0
        s, a = float(h.max()), float(rng.uniform(0.1, 1.0))
        atoms = np.flatnonzero(h)
        predicted = sparse.charge_with([(atoms, h[atoms], a, s)])
        increase = dense.increase(h, a, s)
        before = dense.charge
        dense.add(h, a, s)
        sparse.add_sparse(atoms, h[atoms], a, s)
        assert dense.charge == sparse.charge == pytest.approx(predicted) == pytest.approx(before + increase)
        cells, units = summed_units([(atoms, h[atoms], a, s)], zcdp=True)
        assert units.tolist() == release_units(h, a, s, zcdp=True)[cells].tolist()
    twin = dense.copy()
    assert twin.zcdp and twin.charge == dense.charge and twin.k == 4


def test_an_old_checkpoints_costs_read_as_pure() -> None:
    old = CellCosts(3, 2)
    state = old.__dict__.copy()
    del state["zcdp"], state["rows"]
    revived = CellCosts.__new__(CellCosts)
    revived.__setstate__(state)
    assert revived.zcdp is False and revived.rows == 2 and revived.k == 2
    assert pickle.loads(pickle.dumps(CellCosts(3, 2, zcdp=True))).k == 4
