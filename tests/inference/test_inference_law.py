"""The law of the error: exact inversion vs closed forms, Monte Carlo and convolution."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgate.inference import ErrorLaw
from dpgate.inference._gilpelaez import ABS_CDF_ERROR, LaplaceSum, chernoff_halfwidth


def two_term_tail(a1: float, a2: float, x: np.ndarray) -> np.ndarray:
    """P(|a1 L1 + a2 L2| > x), closed form (partial fractions of the characteristic function)."""
    if a1 == a2:
        return np.exp(-x / a1) * (2.0 + x / a1) / 2.0
    return (a1**2 * np.exp(-x / a1) - a2**2 * np.exp(-x / a2)) / (a1**2 - a2**2)


@pytest.mark.parametrize(
    "a1,a2", [(1.0, 1.0), (3.0, 3.0), (1.0, 0.5), (1.0, 1e-3), (1.0, 1e-7), (5.0, 4.9)]
)
def test_exact_matches_two_term_closed_form(a1: float, a2: float) -> None:
    x = np.concatenate((np.geomspace(1e-4, 1, 20) * a1, np.linspace(0.01, 25, 200) * a1))
    law = LaplaceSum(np.array([a1, a2]))
    err = np.abs((1.0 - law.abs_cdf(x)) - two_term_tail(a1, a2, x))
    assert err.max() <= ABS_CDF_ERROR


def test_single_laplace_is_closed_form() -> None:
    law = ErrorLaw([-2.0], [1.5])
    x = np.linspace(-20, 20, 41)
    expected = np.where(x < 0, 0.5 * np.exp(x / 3.0), 1 - 0.5 * np.exp(-x / 3.0))
    np.testing.assert_allclose(law.cdf(x), expected, atol=1e-14)
    assert law.halfwidth(0.9) == pytest.approx(3.0 * math.log(10.0), rel=1e-11)
    assert law.halfwidth(0.9) >= 3.0 * math.log(10.0)
    assert law.pdf(0.0) == pytest.approx(1 / 6.0)


def test_exact_pdf_and_ppf_two_equal_terms() -> None:
    law = ErrorLaw([1.0, 1.0], [1.0, 1.0])
    x = np.linspace(-8, 8, 33)
    np.testing.assert_allclose(law.pdf(x), (1 + np.abs(x)) * np.exp(-np.abs(x)) / 4, atol=1e-7)
    for p in (0.01, 0.3, 0.5, 0.77, 0.999):
        assert law.cdf(law.ppf(p)) == pytest.approx(p, abs=1e-9)


def test_exact_vs_million_sample_monte_carlo() -> None:
    rng = np.random.default_rng(7)
    c = rng.normal(size=12)
    b = rng.uniform(0.2, 5.0, 12)
    exact = ErrorLaw(c, b)
    mc = ErrorLaw(c, b, method="montecarlo", samples=1_000_000, rng=1)
    x = np.linspace(-3, 3, 25) * exact.std
    p = np.asarray(exact.cdf(x))
    se = np.sqrt(p * (1 - p) / 1_000_000)
    assert np.all(np.abs(np.asarray(mc.cdf(x)) - p) <= 5 * se + 1e-6)


def test_chernoff_is_an_upper_bound() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0.1, 2.0, 50)
    law = LaplaceSum(a)
    for tail in (0.2, 0.05, 1e-3, 1e-6):
        x = chernoff_halfwidth(a, tail)
        assert 1 - law.abs_cdf(x)[0] <= tail


@pytest.mark.parametrize("m", [1, 2, 7, 60, 500])
def test_exact_mc_convolution_agree_on_random_problems(m: int) -> None:
    rng = np.random.default_rng(100 + m)
    c = rng.normal(size=m) * np.exp(rng.uniform(-3, 1, m))  # mixed magnitudes
    b = np.exp(rng.uniform(-1, 2, m))  # mixed scales
    exact = ErrorLaw(c, b)
    q = np.linspace(0.05, 4.0, 30) * exact.std
    f = exact._abs_cdf(q)
    # Monte Carlo: within 5 standard errors.
    n = 400_000 if m <= 60 else 100_000  # Algorithm 1 costs m × samples draws
    mc = ErrorLaw(c, b, method="montecarlo", samples=n, rng=m)
    se = np.sqrt(f * (1 - f) / n)
    assert np.all(np.abs(mc._abs_cdf(q) - f) <= 5 * se + 1e-6)
    # Convolution: its rigorous bounds contain the exact value, and the central
    # estimate is close when the grid is fine.
    conv = ErrorLaw(c, b, method="convolution", gamma=1e-4)
    lo, hi = conv.abs_cdf_bounds(q)
    assert np.all(lo <= f + ABS_CDF_ERROR) and np.all(f <= hi + ABS_CDF_ERROR)
    assert np.abs(conv._abs_cdf(q) - f).max() < 2e-3
    # Certified half-widths are never below the exact one.
    for conf in (0.8, 0.95):
        qe = exact.halfwidth(conf)
        assert exact._abs_cdf(np.array([qe]))[0] >= conf
        assert conv.halfwidth(conf) >= qe * (1 - 1e-9)
        assert mc.halfwidth(conf) == pytest.approx(qe, rel=0.03)


def test_convolution_bounds_are_honest_for_coarse_grid() -> None:
    # The paper's unit grid on a narrow law: the rounding bound must widen things.
    c, b = np.array([0.3, -0.2, 0.25]), np.array([1.0, 2.0, 1.5])
    exact = ErrorLaw(c, b)
    conv = ErrorLaw(c, b, method="convolution", gamma=0.01, step=1.0)
    q = np.linspace(0.1, 3, 15)
    lo, hi = conv.abs_cdf_bounds(q)
    f = exact._abs_cdf(q)
    assert np.all(lo <= f) and np.all(f <= hi)
    assert conv.halfwidth(0.9) >= exact.halfwidth(0.9)


def test_exact_is_fast_and_handles_tiny_terms() -> None:
    rng = np.random.default_rng(5)
    # One dominant term plus 10 000 negligible ones: the power series keeps it cheap.
    a = np.concatenate(([10.0], rng.uniform(0, 1e-6, 10_000)))
    law = ErrorLaw(a, np.ones_like(a))
    q = law.halfwidth(0.95)
    assert q == pytest.approx(10 * math.log(20), rel=1e-4)
    assert q >= 10 * math.log(20)


def test_zero_coefficients_give_a_point_mass() -> None:
    law = ErrorLaw([0.0, 0.0], [1.0, 2.0])
    assert law.halfwidth(0.99) == 0.0
    assert law.cdf(-1e-9) == 0.0 and law.cdf(0.0) == 1.0
    assert law.variance == 0.0
    with pytest.raises(ValueError):
        law.pdf(0.0)


# ---------------------------------------------------------------- discrete noise
def discrete_laplace(rng: np.random.Generator, b: float, g: float, size: int) -> np.ndarray:
    q = -math.expm1(-g / b)
    return g * (rng.geometric(q, size) - rng.geometric(q, size)).astype(float)


def test_single_discrete_term_is_exact() -> None:
    b, g, c = 3.0, 0.75, -2.0
    law = ErrorLaw([c], [b], [g])
    p = math.exp(-g / b)
    for k in range(0, 30, 3):
        q = abs(c) * g * k
        expected = 1 - 2 * p ** (k + 1) / (1 + p)
        assert law._abs_cdf(np.array([q]))[0] == pytest.approx(expected, abs=1e-14)
        assert 1 - law.two_sided_tail(q) == pytest.approx(expected, abs=1e-14)
    rng = np.random.default_rng(11)
    z = c * discrete_laplace(rng, b, g, 1_000_000)
    for conf in (0.5, 0.9, 0.95, 0.99):
        q = law.halfwidth(conf)
        assert np.mean(np.abs(z) <= q) >= conf - 5 * math.sqrt(conf * (1 - conf) / 1e6)
        # Smallest such lattice point: one step less falls short.
        assert law._abs_cdf(np.array([q - abs(c) * g]))[0] < conf
    x = np.linspace(-20, 20, 17)
    np.testing.assert_allclose(law.cdf(x), [np.mean(z <= v) for v in x], atol=3e-3)
    for pr in (0.1, 0.5, 0.93):
        v = law.ppf(pr)
        assert law.cdf(v) >= pr and law.cdf(v - abs(c) * g) < pr


def test_lattice_widening_is_certified() -> None:
    rng = np.random.default_rng(12)
    c = np.array([0.5, -0.7, 0.2])
    b = np.array([2.0, 1.0, 4.0])
    g = b / 3.0  # far coarser than the gateway's b/1024, to make the lattice matter
    law = ErrorLaw(c, b, g)
    assert law.lattice_width == pytest.approx(float(np.abs(c) @ g))
    n = 1_000_000
    e = sum(ck * discrete_laplace(rng, bk, gk, n) for ck, bk, gk in zip(c, b, g, strict=True))
    for conf in (0.8, 0.95):
        q = law.halfwidth(conf)
        assert np.mean(np.abs(e) <= q) >= conf
    mc = ErrorLaw(c, b, g, method="montecarlo", samples=n, rng=2)
    assert mc.halfwidth(0.95) <= law.halfwidth(0.95)


@pytest.mark.parametrize("bad", [dict(coefficients=[1.0], scales=[-1.0]),
                                 dict(coefficients=[1.0, 2.0], scales=[1.0]),
                                 dict(coefficients=[np.nan], scales=[1.0]),
                                 dict(coefficients=[1.0], scales=[0.0]),
                                 dict(coefficients=[1.0], scales=[1.0], method="gauss")])
def test_error_law_validates(bad: dict) -> None:
    with pytest.raises(ValueError):
        ErrorLaw(**bad)


def test_error_law_rejects_bad_levels() -> None:
    law = ErrorLaw([1.0, 1.0], [1.0, 2.0])
    for conf in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            law.halfwidth(conf)
    with pytest.raises(ValueError):
        law.cdf(float("nan"))
    with pytest.raises(ValueError):
        law.ppf(1.2)


@pytest.mark.parametrize("scale", [1e-12, 1e-6, 1e6])
def test_halfwidth_scales_with_the_noise_at_any_magnitude(scale: float) -> None:
    """E scales linearly with b, so must its half-width, even for tiny scales.

    The minimal-budget search probes scales down to 1e-12 of the paper's; the
    small-term power series must not overflow there (a 0·∞ once gave NaN).
    """
    rng = np.random.default_rng(7)
    c = np.concatenate([[1.0, 0.5], rng.uniform(1e-4, 1e-2, 200)])
    b = rng.uniform(0.5, 2.0, c.size)
    ref = ErrorLaw(c, b).halfwidth(0.9)
    got = ErrorLaw(c, b * scale).halfwidth(0.9)
    assert np.isfinite(got)
    assert got == pytest.approx(ref * scale, rel=1e-6)
