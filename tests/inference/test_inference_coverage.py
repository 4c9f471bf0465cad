"""Frequentist coverage of the credible intervals: ≥ 1 − δ − 3 SE over ≥ 5000 fresh histories.

Every trial redraws all of the history's noise.  The weights A and the
half-width depend only on (H, α, Q), not on the answers, so each trial only
recomputes ``θ̂ = A·y``; a sample of trials also goes through the full
``estimate()`` to check that shortcut.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgate.inference import IncrementalBLUE, estimate

TRIALS = 6000


def discrete_noise(rng: np.random.Generator, b: np.ndarray, g: np.ndarray, size: int) -> np.ndarray:
    """Two-sided geometric noise on the lattice g with P(z) ∝ exp(−|z| g/b)."""
    q = -np.expm1(-g / b)
    return g * (rng.geometric(q, (size, b.size)) - rng.geometric(q, (size, b.size)))


def coverage(H, alpha, x, Q, delta, seed, lattice=None, sens=None):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    m = H.shape[0]
    S = np.abs(H).max(axis=1) if sens is None else sens
    b = S / alpha
    est = estimate(H, np.zeros(m), alpha, Q, sensitivity=sens, lattice=lattice)
    assert est.estimable
    q = est.posterior.halfwidth(1 - delta)
    if lattice is None:
        noise = rng.laplace(0.0, b, size=(TRIALS, m))
    else:
        noise = discrete_noise(rng, b, lattice, TRIALS)
    y = H @ x + noise
    theta = Q @ x
    theta_hat = y @ est.weights
    hits = np.abs(theta_hat - theta) <= q
    for t in range(0, TRIALS, TRIALS // 20):  # the shortcut equals the full pipeline
        full = estimate(H, y[t], alpha, Q, sensitivity=sens, lattice=lattice)
        assert full.value == pytest.approx(theta_hat[t], abs=1e-9 * (1 + abs(theta_hat[t])))
        lo, hi = full.posterior.interval(1 - delta)
        assert (lo <= theta <= hi) == hits[t]
    return hits.mean(), q, est


def se(delta: float) -> float:
    return math.sqrt(delta * (1 - delta) / TRIALS)


@pytest.mark.parametrize("delta", [0.05, 0.2])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_coverage_random_histories(delta: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = 6, int(rng.integers(4, 25))
    H = rng.integers(-1, 3, size=(m, n)).astype(float)
    H[0] = 1.0  # keep the total estimable
    alpha = rng.uniform(0.05, 1.0, m)
    x = rng.integers(0, 100, n).astype(float)
    Q = np.ones(n) if seed != 2 else rng.normal(size=m) @ H  # any estimable query
    rate, _, _ = coverage(H, alpha, x, Q, delta, seed)
    assert rate >= 1 - delta - 3 * se(delta)
    assert rate <= 1 - delta + 4 * se(delta)  # and the interval is not wastefully wide


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_rank_deficient(delta: float) -> None:
    rng = np.random.default_rng(77)
    base = rng.integers(0, 2, size=(4, 8)).astype(float)
    H = np.vstack([base, base[:2].sum(axis=0), base[2] - base[3], base[1]])
    alpha = rng.uniform(0.1, 1.0, H.shape[0])
    x = rng.integers(0, 50, 8).astype(float)
    Q = base[0] + 2 * base[3]
    rate, _, _ = coverage(H, alpha, x, Q, delta, 5)
    assert rate >= 1 - delta - 3 * se(delta)


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_one_dominant_laplace_term(delta: float) -> None:
    """Error ≈ one Laplace term: a Gaussian interval θ̂ ± z·sd would under-cover here."""
    H = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    alpha = np.array([0.1, 10.0, 10.0])  # scales 10, 0.1, 0.1
    x = np.array([40.0, 7.0])
    Q = np.array([1.0, 1.0])
    rate, q, est = coverage(H, alpha, x, Q, delta, 11)
    assert rate >= 1 - delta - 3 * se(delta)
    # The Gaussian approximation would fail this very test at δ = 0.05.
    from scipy.stats import norm

    z = norm.ppf(1 - delta / 2)
    rng = np.random.default_rng(11)
    b = 1.0 / alpha
    err = rng.laplace(0.0, b, size=(TRIALS, 3)) @ est.weights
    gauss_rate = np.mean(np.abs(err) <= z * math.sqrt(est.variance))
    if delta == 0.05:
        assert gauss_rate < 1 - delta - 3 * se(delta)
        assert q > z * math.sqrt(est.variance)


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_discrete_noise(delta: float) -> None:
    rng = np.random.default_rng(21)
    n, m = 4, 10
    H = rng.integers(0, 3, size=(m, n)).astype(float)
    H[0] = 1.0
    alpha = rng.uniform(0.2, 1.0, m)
    b = np.abs(H).max(axis=1) / alpha
    lattice = b / 4.0  # much coarser than the gateway's b/1024 to stress the widening
    x = rng.integers(0, 30, n).astype(float)
    rate, _, _ = coverage(H, alpha, x, np.ones(n), delta, 8, lattice=lattice)
    assert rate >= 1 - delta - 3 * se(delta)


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_single_discrete_term_exact(delta: float) -> None:
    H = np.array([[1.0, 1.0]])
    alpha = np.array([0.5])
    rate, q, est = coverage(H, alpha, np.array([3.0, 4.0]), np.array([1.0, 1.0]), delta, 9,
                            lattice=np.array([1.0]))
    assert rate >= 1 - delta - 3 * se(delta)
    assert q == int(q)  # a lattice point: the exact discrete quantile


def test_coverage_through_incremental_state() -> None:
    rng = np.random.default_rng(31)
    n, delta = 5, 0.1
    x = rng.integers(0, 40, n).astype(float)
    rows = [rng.integers(0, 2, n).astype(float) for _ in range(7)] + [np.ones(n)]
    scales = rng.uniform(1.0, 8.0, len(rows))
    hits = 0
    trials = 2000
    for _ in range(trials):
        state = IncrementalBLUE(np.ones(n))
        for h, s in zip(rows, scales, strict=True):
            state.append(h, s, float(h @ x + rng.laplace(0.0, s)))
        lo, hi = state.estimate(np.ones(n)).posterior.interval(1 - delta)
        hits += lo <= x.sum() <= hi
    assert hits / trials >= 1 - delta - 3 * math.sqrt(delta * (1 - delta) / trials)
