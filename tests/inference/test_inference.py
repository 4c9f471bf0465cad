"""BLUE, posterior and per-cell cost: seed 001's worked example and the public interface."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpgate.inference as inference
from dpgate.inference import ErrorLaw, Estimate, Posterior, estimate, system_cost

# Seed 001, equations (20), (22), §3 example.
H = np.array(
    [[1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 0],
     [0, 1, 0, 1], [2, 1, 0, 0], [0, 0, 2, -1], [0, -1, 0, 1]], dtype=float
)
ALPHA = np.array([0.05, 0.1, 0.05, 0.1, 0.1, 0.05, 0.05, 0.1])
Y = np.array([30.8, 30.3, 46.9, 20.2, 30.4, 68.9, 38.9, 9.5])
Q = np.array([1.0, 0.0, 1.0, 0.0])


def test_public_names() -> None:
    assert sorted(inference.__all__) == sorted(
        ["estimate", "system_cost", "Estimate", "SystemCost", "Posterior", "ErrorLaw",
         "IncrementalBLUE", "minimal_scale", "single_release_scale", "halfwidths", "Support", "support_of"]
    )
    for name in inference.__all__:
        assert hasattr(inference, name)


def test_worked_example_blue() -> None:
    est = estimate(H, Y, ALPHA, Q)
    assert est.estimable
    assert round(est.value, 1) == 42.0
    np.testing.assert_allclose(
        est.weights, [0.48, 0.36, -0.03, 0.50, -0.50, 0.26, 0.07, 0.24], atol=0.005
    )
    x_hat = [estimate(H, Y, ALPHA, e).value for e in np.eye(4)]
    # The paper prints [24.9, 10.1, 17.0, 19.5]: the same numbers cut (not rounded) to one decimal.
    np.testing.assert_allclose(np.trunc(np.array(x_hat) * 10) / 10, [24.9, 10.1, 17.0, 19.5])
    np.testing.assert_allclose(est.scales, [20, 10, 20, 10, 10, 40, 40, 10])
    # Corollary 3.2: Var = 2 Q (Hᵀ W H)⁻¹ Qᵀ (H has full column rank here).
    W = np.diag((ALPHA / np.abs(H).max(axis=1)) ** 2)
    assert est.variance == pytest.approx(2 * Q @ np.linalg.solve(H.T @ W @ H, Q), rel=1e-10)


def test_worked_example_cost() -> None:
    cost = system_cost(H, ALPHA)
    np.testing.assert_allclose(cost.per_cell, [0.1, 0.275, 0.25, 0.375])
    assert cost.max == pytest.approx(0.375)
    assert not cost.per_cell.flags.writeable
    assert system_cost(H, ALPHA, cell_sizes=[1, 1, 1, 0]).max == pytest.approx(0.275)


def test_worked_example_interval_vs_monte_carlo() -> None:
    """The paper prints [−41, 125] and P(θ > 0) = 0.88; its own model gives ≈[−5.4, 89.4] and 0.962."""
    est = estimate(H, Y, ALPHA, Q)
    post = est.posterior
    assert post is not None
    lo, hi = post.interval(0.95)
    p_pos = post.probability(low=0.0)
    n = 2_000_000
    rng = np.random.default_rng(2024)
    err = np.zeros(n)
    for a_k, b_k in zip(est.weights, est.scales, strict=True):
        err += a_k * rng.laplace(0.0, b_k, n)
    theta = est.value - err  # posterior draws under the uninformative prior
    q_mc = np.quantile(np.abs(err), 0.95)
    # Quantile standard error from the density at the quantile.
    dens = np.mean(np.abs(np.abs(err) - q_mc) < 0.5)  # P(|E| within ±0.5 of q)
    q_se = math.sqrt(0.95 * 0.05 / n) / dens
    assert hi - est.value == pytest.approx(q_mc, abs=5 * q_se + 1e-6)
    assert est.value - lo == pytest.approx(hi - est.value)
    p_mc = np.mean(theta > 0)
    assert p_pos == pytest.approx(p_mc, abs=5 * math.sqrt(p_mc * (1 - p_mc) / n))
    # Neither printed number follows from the model.
    assert not (lo < -40 and hi > 124)
    assert abs(p_pos - 0.88) > 0.05
    assert (round(lo, 1), round(hi, 1), round(p_pos, 3)) == (-5.4, 89.4, 0.962)


def test_rank_deficient_history() -> None:
    rng = np.random.default_rng(1)
    base = rng.integers(-2, 3, size=(3, 6)).astype(float)
    Hd = np.vstack([base, base[0] + base[1], 2 * base[2], np.zeros(6)])  # rank 3, a zero row
    alpha = rng.uniform(0.1, 1.0, Hd.shape[0])
    y = rng.normal(size=Hd.shape[0])
    q_in = np.array([1.0, -2.0, 0.5]) @ base
    est = estimate(Hd, y, alpha, q_in)
    assert est.estimable and math.isfinite(est.value) and est.weights[-1] == 0.0
    lo, hi = est.posterior.interval(0.9)
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
    # Unbiased: A H = Q on the row space.
    np.testing.assert_allclose(est.weights @ Hd, q_in, atol=1e-10)
    # The weights are the minimum-variance ones: compare with the generalised inverse formula.
    S = np.abs(Hd).max(axis=1)
    S[-1] = 1.0
    W = np.diag((alpha / S) ** 2)
    A_ref = q_in @ np.linalg.pinv(Hd.T @ W @ Hd) @ Hd.T @ W
    np.testing.assert_allclose(est.weights, A_ref, atol=1e-9)
    # A query outside the row space.
    null = np.linalg.svd(base)[2][-1]
    out = estimate(Hd, y, alpha, q_in + null)
    assert not out.estimable and out.posterior is None and math.isnan(out.value)
    assert math.isnan(out.variance) and np.isnan(out.weights).all()
    assert out.halfwidth(0.95) == math.inf


def test_empty_history_and_zero_query() -> None:
    est = estimate(np.zeros((0, 3)), [], [], [1.0, 0.0, 0.0])
    assert not est.estimable
    zero = estimate(H, Y, ALPHA, np.zeros(4))
    assert zero.estimable and zero.value == 0.0 and zero.variance == 0.0
    assert zero.posterior.interval(0.95) == (0.0, 0.0)


def test_badly_scaled_rows_still_count() -> None:
    # A direction measured only with enormous noise is estimable, with a huge variance.
    Hb = np.array([[1.0, 0.0], [0.0, 1.0]])
    est = estimate(Hb, [1.0, 2.0], [1.0, 1e-12], [0.0, 1.0])
    assert est.estimable and est.value == pytest.approx(2.0)
    assert est.variance == pytest.approx(2e24, rel=1e-9)


@pytest.mark.parametrize(
    "kwargs",
    [dict(H=np.ones(3), y=[1.0], alpha=[1.0], Q=[1.0, 1.0, 1.0]),
     dict(H=H, y=Y[:-1], alpha=ALPHA, Q=Q),
     dict(H=H, y=Y, alpha=-ALPHA, Q=Q),
     dict(H=H, y=Y, alpha=ALPHA, Q=Q[:3]),
     dict(H=H, y=np.where(Y > 40, np.nan, Y), alpha=ALPHA, Q=Q),
     dict(H=H, y=Y, alpha=ALPHA, Q=Q, sensitivity=np.zeros(8))],
)
def test_estimate_validates(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        estimate(**kwargs)


def test_estimate_is_frozen_and_comparable() -> None:
    a = estimate(H, Y, ALPHA, Q)
    b = estimate(H, Y, ALPHA, Q)
    assert isinstance(a, Estimate) and a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.value = 1.0  # type: ignore[misc]
    assert not a.weights.flags.writeable
    nope = estimate(H[:2], Y[:2], ALPHA[:2], Q)
    assert nope == estimate(H[:2], Y[:2], ALPHA[:2], Q)  # nan == nan in the canonical form


# ---------------------------------------------------------------- posterior interface
@pytest.fixture(params=["exact", "single", "discrete"])
def posterior(request: pytest.FixtureRequest) -> Posterior:
    if request.param == "exact":
        return estimate(H, Y, ALPHA, Q).posterior
    if request.param == "single":
        return Posterior(5.0, ErrorLaw([1.0], [2.0]))
    return Posterior(5.0, ErrorLaw([1.0], [2.0], [0.25]))


def test_posterior_interface(posterior: Posterior) -> None:
    c = posterior.center
    assert posterior.mean() == posterior.median() == c
    assert posterior.std() == pytest.approx(math.sqrt(posterior.var()))
    lo, hi = posterior.interval(0.9)
    assert c - lo == pytest.approx(hi - c)
    assert posterior.probability(lo, hi) >= 0.9 - 1e-9
    assert posterior.cdf(c) >= 0.5 - 1e-9 and posterior.sf(c) <= 0.5 + 1e-9
    xs = c + np.linspace(-3, 3, 13) * posterior.std()
    cdf = np.asarray(posterior.cdf(xs))
    assert np.all(np.diff(cdf) >= -1e-12)
    np.testing.assert_allclose(cdf + np.asarray(posterior.sf(xs)), 1.0, atol=1e-9)
    assert posterior.ppf(0.0) == -math.inf and posterior.ppf(1.0) == math.inf
    for p in (0.05, 0.3, 0.5, 0.8, 0.99):
        x = posterior.ppf(p)
        assert posterior.cdf(x) >= p - 1e-9
    assert posterior.probability() == pytest.approx(1.0)
    assert np.asarray(posterior.pdf(xs)).min() >= 0


def test_posterior_ppf_inverts_cdf_continuous() -> None:
    post = estimate(H, Y, ALPHA, Q).posterior
    for x in (-30.0, 0.0, 42.0, 60.0, 120.0):
        assert post.ppf(post.cdf(x)) == pytest.approx(x, abs=1e-6)


@pytest.mark.parametrize("call", [
    lambda p: p.cdf(float("nan")), lambda p: p.sf(np.array([1.0, np.nan])),
    lambda p: p.pdf(float("nan")), lambda p: p.ppf(-0.1), lambda p: p.ppf(1.1),
    lambda p: p.ppf(float("nan")), lambda p: p.interval(1.0), lambda p: p.interval(0.0),
    lambda p: p.interval(float("nan")), lambda p: p.probability(3.0, 1.0),
    lambda p: p.probability(float("nan"), 1.0), lambda p: p.halfwidth(2.0),
])
def test_posterior_rejects_bad_input(call) -> None:  # type: ignore[no-untyped-def]
    post = estimate(H, Y, ALPHA, Q).posterior
    with pytest.raises(ValueError):
        call(post)


def test_posterior_probability_claims() -> None:
    post = Posterior(0.0, ErrorLaw([1.0], [1.0]))
    assert post.probability(low=0.0) == pytest.approx(0.5)
    assert post.probability(-1.0, 1.0) == pytest.approx(1 - math.exp(-1))
    disc = Posterior(0.0, ErrorLaw([1.0], [1.0], [0.5]))
    p = math.exp(-0.5)
    assert disc.probability(0.0, 0.0) == pytest.approx((1 - p) / (1 + p))
    assert disc.probability(-0.5, 0.5) == pytest.approx(1 - 2 * p**2 / (1 + p))
    with pytest.raises(ValueError):
        Posterior(float("inf"), ErrorLaw([1.0], [1.0]))


def test_methods_through_estimate() -> None:
    mc = estimate(H, Y, ALPHA, Q, method="montecarlo", law_options=dict(rng=3, samples=200_000))
    ex = estimate(H, Y, ALPHA, Q)
    pc = estimate(H, Y, ALPHA, Q, method="convolution", law_options=dict(gamma=1e-4))
    q = ex.posterior.halfwidth(0.95)
    assert mc.posterior.halfwidth(0.95) == pytest.approx(q, rel=0.03)
    assert q <= pc.posterior.halfwidth(0.95) <= 1.05 * q
