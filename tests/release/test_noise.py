"""Tests of dpgate.release.noise: the law of the noise, the lattice, the coupling, the sources.

The secure source is unseeded by design, so its statistical tests use a
significance level of 1e-4: a correct sampler fails one of them about once in
ten thousand runs.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

from dpgate.errors import InvalidRequirement
from dpgate.release import noise
from dpgate.release.noise import (
    NoiseSource,
    NoisyRelease,
    SecureNoise,
    SeededNoise,
    lattice_for,
    noise_source,
    release,
    release_many,
)

REPO = Path(__file__).resolve().parents[2]
P_MIN = 1e-4  # significance level of the statistical tests


# ----------------------------------------------------------------------------- exact law


def dl_cdf(z: np.ndarray | float, t: float) -> np.ndarray:
    """Exact CDF of the two-sided geometric law P(z) ∝ exp(-|z|/t), at integers z."""
    p = math.exp(-1 / t)
    z = np.floor(np.asarray(z, dtype=float))
    neg = np.power(p, np.maximum(-z, 0.0)) / (1 + p)
    pos = 1 - np.power(p, np.maximum(z + 1, 0.0)) / (1 + p)
    return np.where(z < 0, neg, pos)


def dl_variance(t: float) -> float:
    p = math.exp(-1 / t)
    return 2 * p / (1 - p) ** 2


def chi_square_pvalue(z: list[int], t: float, bins: int = 40) -> float:
    """Chi-square goodness of fit of integer draws to the exact law, on ~equiprobable bins."""
    z = np.asarray(z, dtype=float)
    # integer edges near the law's quantiles; bins are [e_i, e_{i+1})
    qs = np.linspace(0, 1, bins + 1)[1:-1]
    b = t  # continuous Laplace quantiles are close enough to place edges
    cont = np.where(qs < 0.5, b * np.log(2 * qs), -b * np.log(2 * (1 - qs)))
    edges = np.unique(np.ceil(cont))
    cdf_at = dl_cdf(edges - 1, t)  # P(Z < edge)
    probs = np.diff(np.concatenate([[0.0], cdf_at, [1.0]]))
    idx = np.searchsorted(edges, z, side="right")
    observed = np.bincount(idx, minlength=len(probs))
    expected = probs * len(z)
    keep = expected > 0
    assert observed[~keep].sum() == 0
    return float(stats.chisquare(observed[keep], expected[keep]).pvalue)


def variance_z(z: list[int], t: float) -> float:
    """z-score of the sample variance against the exact variance (4th moment via CLT)."""
    z = np.asarray(z, dtype=float)
    var = dl_variance(t)
    # fourth moment of the two-sided geometric, E[Z^4] = 2 Σ_k k^4 P(k), by the series
    p = math.exp(-1 / t)
    c = (1 - p) / (1 + p)
    m4 = 2 * c * p * (1 + 11 * p + 11 * p**2 + p**3) / (1 - p) ** 5
    se = math.sqrt((m4 - var**2) / len(z))
    return (float(np.mean(z**2)) - var) / se


SOURCES = [pytest.param(lambda: SecureNoise(), id="secure"), pytest.param(lambda: SeededNoise(12345), id="seeded")]


@pytest.mark.parametrize("make", SOURCES)
@pytest.mark.parametrize("t", [0.3, 2.5, 1024.0, 1e6])
def test_batch_draws_have_the_declared_law(make, t):
    z = make().discrete_laplace_many(t, 40_000)
    assert all(type(v) is int for v in z[:100])
    assert chi_square_pvalue(z, t) > P_MIN
    assert abs(variance_z(z, t)) < 4.5


@pytest.mark.parametrize("make", SOURCES)
def test_single_draws_have_the_declared_law(make):
    t = 4.0
    source = make()
    z = [source.discrete_laplace(t) for _ in range(6_000)]
    assert chi_square_pvalue(z, t, bins=20) > P_MIN
    assert abs(variance_z(z, t)) < 4.5


def test_large_parameter_decomposition_has_the_declared_law(monkeypatch):
    # Force the exact decomposition Z = m·W + R1 − R2 at a testable size.
    monkeypatch.setattr(noise, "_OPENDP_MAX_T", 64.0)
    t = 1000.0
    z = [SecureNoise().discrete_laplace(t) for _ in range(6_000)]
    assert chi_square_pvalue(z, t, bins=20) > P_MIN
    assert abs(variance_z(z, t)) < 4.5
    # and a parameter that is not a multiple of the block size
    z = [SecureNoise().discrete_laplace(333.3) for _ in range(4_000)]
    assert chi_square_pvalue(z, 333.3, bins=20) > P_MIN


@pytest.mark.parametrize("t", [2.0**57, 1e18, 1e30])
def test_huge_parameters_do_not_saturate(t):
    z = SecureNoise().discrete_laplace_many(t, 1_000)
    assert all(abs(v) != 2**63 - 1 and v != -(2**63) for v in z)
    mean_abs = np.mean([abs(v) / t for v in z])  # E|Z|/t → 1 for large t
    assert abs(mean_abs - 1) < 0.15
    assert np.mean([v > 0 for v in z]) == pytest.approx(0.5, abs=0.07)


def test_tiny_parameters_give_zero_noise():
    assert set(SecureNoise().discrete_laplace_many(1e-300, 100)) == {0}
    assert set(SeededNoise(0).discrete_laplace_many(1e-300, 100)) == {0}


def test_seeded_noise_is_reproducible_and_insecure():
    a = SeededNoise(7).discrete_laplace_many(10.0, 50)
    b = [SeededNoise(7).discrete_laplace(10.0)] + SeededNoise(8).discrete_laplace_many(10.0, 49)
    assert a == SeededNoise(7).discrete_laplace_many(10.0, 50)
    assert a != b
    assert SeededNoise(7).secure is False
    assert "insecure" in SeededNoise.__doc__.lower()
    assert "tests and benchmarks only" in SeededNoise.__doc__.lower()


def test_noise_source_factory():
    assert isinstance(noise_source(None), SecureNoise) and noise_source(None).secure
    s = noise_source(3)
    assert isinstance(s, SeededNoise) and not s.secure and s.seed == 3
    assert isinstance(noise_source(np.int64(3)), SeededNoise)
    for bad in ("3", 1.5, True):
        with pytest.raises(InvalidRequirement):
            noise_source(bad)


# ----------------------------------------------------------------------------- default path uses no numpy RNG


def _forbid(*_a, **_k):
    raise AssertionError("the secure noise path touched a numpy random generator")


def test_secure_path_does_not_touch_numpy_rngs(monkeypatch):
    state = np.random.get_state()
    for name in ("default_rng", "Generator", "RandomState", "PCG64", "MT19937", "SeedSequence",
                 "random", "rand", "randn", "randint", "integers", "exponential", "geometric",
                 "laplace", "uniform", "normal", "seed", "shuffle", "permutation", "choice"):
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, _forbid)
    src = noise_source(None)
    src.discrete_laplace(3.0)
    src.discrete_laplace_many(3.0, 10)
    src.discrete_laplace(2.0**60)  # the decomposition path
    r = release(10, 3, sensitivity=1.0, alpha=0.1, source=src)
    assert r.secure
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]


def test_secure_path_does_not_touch_numpy_rngs_from_a_fresh_import():
    """Same check in a fresh interpreter, so OpenDP's first import is covered too."""
    code = textwrap.dedent(
        """
        import numpy as np, random
        import dpgate  # the package imports scipy, which needs numpy.random's classes intact
        state = np.random.get_state(); pystate = random.getstate()
        def forbid(*a, **k):
            raise AssertionError("numpy RNG touched")
        for name in ("default_rng", "Generator", "RandomState", "PCG64", "SeedSequence",
                     "random", "rand", "randint", "exponential", "geometric", "laplace", "seed"):
            setattr(np.random, name, forbid)
        from dpgate.release.noise import noise_source, release
        src = noise_source(None)
        zs = [src.discrete_laplace(5.0) for _ in range(20)] + src.discrete_laplace_many(5.0, 20)
        release(1, 1, 1.0, 1.0, src); src.discrete_laplace(1e19)
        after = np.random.get_state()
        assert after[0] == state[0] and (after[1] == state[1]).all() and after[2:] == state[2:]
        assert random.getstate() == pystate
        print("ok", len(set(zs)) > 3)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok True"


def test_secure_draws_are_not_reproducible():
    a = SecureNoise().discrete_laplace_many(1e9, 20)
    b = SecureNoise().discrete_laplace_many(1e9, 20)
    assert a != b


# ----------------------------------------------------------------------------- lattice


@settings(max_examples=300, deadline=None)
@given(
    scale=st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False),
    denominator=st.integers(min_value=1, max_value=10**12),
)
def test_lattice_is_the_coarsest_fine_enough_power_of_two(scale, denominator):
    gamma, mult = lattice_for(scale, denominator)
    k = mult.bit_length() - 1
    assert mult == 1 << k and 0 <= k <= noise.MAX_LATTICE_EXPONENT
    exact = Fraction(1, denominator * mult)
    assert gamma == float(exact)
    if k < noise.MAX_LATTICE_EXPONENT:
        assert exact <= Fraction(scale) / 1024
    if k > 0:
        assert Fraction(1, denominator * (mult // 2)) > Fraction(scale) / 1024


def test_lattice_cap_and_examples():
    assert lattice_for(1e-40, 1) == (2.0**-60, 2**60)
    assert lattice_for(1024.0, 1) == (1.0, 1)
    assert lattice_for(1023.0, 1) == (0.5, 2)
    assert lattice_for(1.0, 1024) == (1 / 1024, 1)


class Recording(NoiseSource):
    """Wraps a source and records (t, z) of every draw."""

    def __init__(self, inner: NoiseSource):
        self.inner, self.secure, self.draws = inner, inner.secure, []

    def discrete_laplace(self, t: float) -> int:
        z = self.inner.discrete_laplace(t)
        self.draws.append((t, z))
        return z


@settings(max_examples=200, deadline=None)
@example(num=0, den=1, sens=131072.99999999988, alpha=1.0, seed=0)  # S·d snapped up to 131073
@given(
    num=st.integers(min_value=-(10**15), max_value=10**15),
    den=st.integers(min_value=1, max_value=10**6),
    sens=st.floats(min_value=1e-6, max_value=1e6),
    alpha=st.floats(min_value=1e-6, max_value=1e3),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_release_is_the_exact_rational_on_the_lattice(num, den, sens, alpha, seed):
    src = Recording(SeededNoise(seed))
    r = release(num, den, sensitivity=sens, alpha=alpha, source=src)
    b = sens / alpha
    gamma, mult = lattice_for(b, den)
    ((t, z),) = src.draws
    # t is S·d·2^k/α rounded up: the realised ε = (S/γ)/t never exceeds α.  An S·d within
    # 2^-50 below an integer is first snapped up to it (more noise, never less); then t
    # is at most 1 ulp above the exact value.
    steps = Fraction(sens) * den
    if math.ceil(steps) - steps <= steps / 2**50:
        steps = Fraction(math.ceil(steps))
    exact_t = steps * mult / Fraction(alpha)
    assert Fraction(t) >= Fraction(sens) / Fraction(alpha) * den * mult
    assert Fraction(sens) * den * mult / Fraction(t) <= Fraction(alpha)
    assert t in (float(exact_t), math.nextafter(float(exact_t), math.inf))
    exact = Fraction(num * mult + z, den * mult)
    assert r.value == float(exact)
    # true value exactly on the lattice; released − true is a multiple of γ
    assert (Fraction(num, den) / Fraction(1, den * mult)).denominator == 1
    assert ((exact - Fraction(num, den)) / Fraction(1, den * mult)).denominator == 1
    assert r == NoisyRelease(value=r.value, scale=b, lattice=gamma, secure=False)


@settings(max_examples=50, deadline=None)
@given(
    items=st.lists(
        st.tuples(
            st.integers(min_value=-(10**9), max_value=10**9),
            st.sampled_from([1, 3, 8]),
            st.sampled_from([1.0, 0.5, 2.0]),
            st.sampled_from([0.125, 0.37, 1.0]),
        ),
        min_size=1,
        max_size=12,
    ),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_release_many_releases_each_item_as_release_does(items, seed):
    src = Recording(SeededNoise(seed))
    out = release_many(items, src)
    assert len(out) == len(items) == len(src.draws)  # one draw per item, batched by t
    draws = list(src.draws)
    for (num, den, sens, alpha), r in zip(items, out, strict=True):
        one = Recording(SeededNoise(0))
        single = release(num, den, sens, alpha, one)
        ((t, _),) = one.draws
        assert (r.scale, r.lattice, r.secure) == (single.scale, single.lattice, False)
        _, mult = lattice_for(sens / alpha, den)
        match = next(d for d in draws if d[0] == t and float(Fraction(num * mult + d[1], den * mult)) == r.value)
        draws.remove(match)
    seq = SeededNoise(seed)
    assert release_many(items, SeededNoise(seed)) == [release(*it, seq) for it in items]  # same draws, same order
    bad = Recording(SeededNoise(seed))
    with pytest.raises(InvalidRequirement):
        release_many([*items, (1, 1, 1.0, -1.0)], bad)
    assert bad.draws == []  # every item checked before any draw


@pytest.mark.parametrize("make", SOURCES)
def test_released_error_has_the_declared_scale(make):
    src = make()
    num, den, sens, alpha = 12345, 7, 1.0, 0.25
    b = sens / alpha
    errs = np.array([release(num, den, sens, alpha, src).value - num / den for _ in range(5_000)])
    # Laplace(b) has variance 2b²; the lattice changes it by O(γ²), invisible here
    se = math.sqrt(20 * b**4 / len(errs))  # var of X² for Laplace: E X^4 − (2b²)² = 24b⁴ − 4b⁴
    assert abs(np.mean(errs**2) - 2 * b**2) < 4.5 * se
    assert stats.kstest(errs, stats.laplace(scale=b).cdf).pvalue > P_MIN


# ----------------------------------------------------------------------------- coupling


def test_coupling_with_continuous_laplace_is_within_one_lattice_step():
    """SeededNoise draws Z = ⌊X1⌋ − ⌊X2⌋; replaying its generator gives the coupled L = γ(X1 − X2)."""
    seed, num, den, sens, alpha = 99, 5000, 3, 2.0, 0.7
    src = SeededNoise(seed)
    b = sens / alpha
    gamma, mult = lattice_for(b, den)
    t = float(Fraction(b) * den * mult)
    replay = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(20_000):
        r = release(num, den, sens, alpha, src)
        x1, x2 = replay.exponential(t, size=2)
        coupled = Fraction(num, den) + Fraction(gamma) * Fraction(float(x1 - x2))
        worst = max(worst, abs(Fraction(r.value) - coupled) / Fraction(gamma))
    assert worst < 1 + 1e-6
    assert gamma <= b / 1024


@pytest.mark.parametrize(("sens", "alpha", "den"), [(1.0, 1.0, 1), (1.0, 0.01, 1), (3.0, 2.0, 7), (1.0, 5e3, 1)])
def test_discrete_law_is_sandwiched_by_shifted_laplace(sens, alpha, den):
    """Coupling ⇒ F_L(x − γ) ≤ F_{Zγ}(x) ≤ F_L(x + γ): exactly, and for secure draws within DKW."""
    b = sens / alpha
    gamma, mult = lattice_for(b, den)
    t = b / gamma
    lap = stats.laplace(scale=b)
    xs = np.linspace(-8 * b, 8 * b, 4001)
    f = dl_cdf(np.floor(xs / gamma + 1e-9), t)
    assert np.all(lap.cdf(xs - gamma) <= f + 1e-12)
    assert np.all(f <= lap.cdf(xs + gamma) + 1e-12)
    # empirical: secure releases, one-sided DKW band at 1e-4
    n = 20_000
    z = np.sort(np.array(SecureNoise().discrete_laplace_many(t, n), dtype=float) * gamma)
    ecdf_hi = np.arange(1, n + 1) / n
    eps = math.sqrt(math.log(2 / P_MIN) / (2 * n))
    assert np.all(ecdf_hi <= lap.cdf(z + gamma) + eps)
    assert np.all(np.arange(n) / n >= lap.cdf(z - gamma) - eps)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": math.inf}, "alpha"),
        ({"alpha": math.nan}, "alpha"),
        ({"sensitivity": 0.0}, "sensitivity"),
        ({"sensitivity": math.inf}, "sensitivity"),
        ({"sensitivity": "1"}, "sensitivity"),
        ({"denominator": 0}, "denominator"),
        ({"denominator": 1.5}, "denominator"),
        ({"denominator": True}, "denominator"),
        ({"true_numerator": 1.5}, "true_numerator"),
        ({"true_numerator": True}, "true_numerator"),
        ({"source": object()}, "source"),
        ({"alpha": 1e-320, "sensitivity": 1e10}, "scale"),
    ],
)
def test_release_validates_its_inputs(kwargs, match):
    args = {"true_numerator": 1, "denominator": 1, "sensitivity": 1.0, "alpha": 1.0, "source": SeededNoise(0)}
    args.update(kwargs)
    with pytest.raises(InvalidRequirement, match=match):
        release(**args)


@pytest.mark.parametrize("t", [0.0, -1.0, math.inf, math.nan, "x"])
def test_sources_validate_the_parameter(t):
    for src in (SecureNoise(), SeededNoise(0)):
        with pytest.raises(InvalidRequirement):
            src.discrete_laplace(t)
        with pytest.raises(InvalidRequirement):
            src.discrete_laplace_many(t, 3)


def test_lattice_validates_its_inputs():
    for scale, den in [(0.0, 1), (-1.0, 1), (math.inf, 1), (1.0, 0), (1.0, 2.0)]:
        with pytest.raises(InvalidRequirement):
            lattice_for(scale, den)


def test_noisy_release_is_frozen():
    r = release(1, 1, 1.0, 1.0, SeededNoise(0))
    with pytest.raises(AttributeError):
        r.value = 0.0  # type: ignore[misc]


def test_module_doctests():
    import doctest

    assert doctest.testmod(noise).failed == 0
