"""ρ-zCDP conversions (dpgate.plan.zcdp): tight, never above Bun & Steinke, and guarded both ways."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgate.errors import InvalidArgument, InvalidRequirement
from dpgate.plan.zcdp import budget_in, check_privacy, epsilon_of, rho_of, rho_of_pure

RHOS = [1e-6, 1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 50.0]
DELTAS = [1e-10, 1e-6, 1e-3, 0.1, 0.5]


def _grid_min(rho: float, delta: float) -> float:
    """Canonne–Kamath–Steinke's ε(α) minimised over a dense grid of orders (brute force)."""
    alpha = 1 + np.exp(np.linspace(-20, 20, 200_001))
    eps = alpha * rho + (math.log(1 / delta) + (alpha - 1) * np.log1p(-1 / alpha) - np.log(alpha)) / (alpha - 1)
    return max(0.0, float(eps.min()))


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", DELTAS)
def test_epsilon_of_is_the_tight_conversion_and_below_bun_steinke(rho: float, delta: float) -> None:
    eps = epsilon_of(rho, delta)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12
    assert eps == pytest.approx(_grid_min(rho, delta), rel=1e-7, abs=1e-9)


def test_epsilon_of_is_increasing_in_rho_and_decreasing_in_delta() -> None:
    eps = [epsilon_of(r, 1e-6) for r in RHOS]
    assert eps == sorted(eps)
    assert epsilon_of(0.3, 1e-9) > epsilon_of(0.3, 1e-6) > epsilon_of(0.3, 1e-3)
    assert epsilon_of(0.0, 1e-6) == 0.0


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_rho_of_is_the_largest_rho_that_converts_within_epsilon(eps: float, delta: float) -> None:
    rho = rho_of(eps, delta)
    assert rho > 0 and epsilon_of(rho, delta) <= eps
    assert epsilon_of(rho * (1 + 1e-9), delta) > eps * (1 - 1e-6)  # largest, up to the bisection
    # Bun & Steinke's inverse (ε = ρ + 2√(ρ ln 1/δ)) is never larger than the tight one
    bs = (math.sqrt(math.log(1 / delta) + eps) - math.sqrt(math.log(1 / delta))) ** 2
    assert rho >= bs * (1 - 1e-12)


def test_pure_epsilon_converts_to_half_its_square() -> None:
    assert rho_of_pure(0.2) == pytest.approx(0.02)


def test_budget_in_reads_rho_or_an_epsilon_delta_pair() -> None:
    assert budget_in("zcdp", 0.5) == 0.5
    assert budget_in("zcdp", (1.0, 1e-6)) == rho_of(1.0, 1e-6)
    assert budget_in("pure", 2) == 2.0


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "1", True, None, (1.0,), (1.0, 2.0), (1.0, 0.0),
                                 (-1.0, 1e-6), (1.0, 1e-6, 3), ("a", 1e-6)])
def test_bad_zcdp_budgets_are_specific_errors(bad: object) -> None:
    with pytest.raises(InvalidRequirement):
        budget_in("zcdp", bad)


def test_a_pair_given_to_a_pure_gateway_is_refused() -> None:
    with pytest.raises(InvalidRequirement, match="privacy='zcdp'"):
        budget_in("pure", (1.0, 1e-6))


@pytest.mark.parametrize("bad_delta", [0.0, 1.0, -0.1, 2.0, math.nan, "x"])
def test_delta_outside_the_open_unit_interval_is_refused(bad_delta: object) -> None:
    with pytest.raises(InvalidRequirement, match="δ"):
        epsilon_of(0.1, bad_delta)  # type: ignore[arg-type]


def test_check_privacy() -> None:
    assert check_privacy("ZCDP") == "zcdp" and check_privacy("pure") == "pure"
    with pytest.raises(InvalidArgument, match="'pure'"):
        check_privacy("approx")
