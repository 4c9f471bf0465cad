"""The discrete Gaussian release step (dpgate.release._gaussian): law, lattice, zCDP cost, coupling."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpgate.errors import InvalidRequirement
from dpgate.release._gaussian import discrete_gaussian_many, quantile_coupling_holds, release_gaussian_many
from dpgate.release.noise import SecureNoise, SeededNoise, _opendp, lattice_for


def _pmf(s: float, support: np.ndarray) -> np.ndarray:
    wide = np.arange(-int(40 * s) - 5, int(40 * s) + 6)
    norm = np.exp(-(wide.astype(float) ** 2) / (2 * s * s)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * s * s)) / norm


@pytest.mark.parametrize("source", [SeededNoise(4), SecureNoise()], ids=["seeded", "secure"])
def test_the_law_is_the_discrete_gaussian(source) -> None:
    s, n = 2.3, 40_000
    draws = np.array(discrete_gaussian_many(source, s, n))
    values, counts = np.unique(draws, return_counts=True)
    expected = _pmf(s, values) * n
    live = expected > 50
    # every well-populated value within 5 standard errors of its expected count
    assert np.all(np.abs(counts[live] - expected[live]) < 5 * np.sqrt(expected[live]))
    assert abs(draws.mean()) < 5 * s / math.sqrt(n)


def test_secure_draws_at_lattice_scales() -> None:
    draws = np.array(discrete_gaussian_many(SecureNoise(), 1500.0, 20_000))
    assert draws.dtype.kind == "i" and abs(draws.std() / 1500.0 - 1) < 0.03


def test_release_is_on_the_lattice_and_costs_alpha_squared_over_two() -> None:
    items = [(42, 1, 1.0, 0.5), (7, 3, 2.0, 0.1), (-5, 4, 0.75, 2.0)]
    for (num, den, sens, alpha), rel in zip(items, release_gaussian_many(items, SeededNoise(0)), strict=True):
        sigma = sens / alpha
        gamma, mult = lattice_for(sigma, den)
        assert rel.scale == sigma and rel.lattice == gamma and not rel.secure
        z = Fraction(rel.value) * den * mult - num
        assert abs(z - round(z)) < 1e-6 * max(1, abs(z))  # the value is the exact lattice point, as a float
        s = sigma * den * mult  # the parameter drawn at (rounded up: never less noise)
        dp = _opendp()
        meas = dp.m.make_gaussian(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=float(s))
        delta = math.ceil(sens * den * mult)  # the query's lattice sensitivity S/γ
        assert meas.map(delta) <= alpha**2 / 2 * (1 + 1e-9)


@pytest.mark.parametrize("s", [1024.0, 1100.3, 1337.77, 1500.0, 1777.1, 1999.99, 2047.9, 4096.5, 12345.6, 0.7, 3.2])
def test_quantile_coupling_moves_no_draw_a_whole_step(s: float) -> None:
    assert quantile_coupling_holds(s)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, 3])
def test_bad_parameters_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRequirement):
        discrete_gaussian_many(SeededNoise(0), bad, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequirement):
        discrete_gaussian_many(SeededNoise(0), 1.0, -1)
