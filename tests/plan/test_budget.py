"""The budget rule (dpgate.plan.budget): the slack boundary, and refusals that carry their numbers."""

from __future__ import annotations

import math

import pytest

import dpgate
from dpgate.plan.budget import SLACK, exhausted, fits, remaining


def test_the_slack_is_1e_12() -> None:
    assert SLACK == 1e-12


@pytest.mark.parametrize("spent, budget_", [(0.0, 1.0), (0.25, 1.0), (0.0, 0.5), (3.0, 3.0)])
def test_a_charge_of_what_remains_plus_the_slack_fits_and_no_more(spent: float, budget_: float) -> None:
    left = budget_ - spent
    assert fits(spent, left, budget_)
    assert fits(spent, left + 1e-12, budget_)  # exactly the slack over
    assert not fits(spent, left + 2e-12, budget_)  # a bit more
    assert not fits(spent, left + 1e-9, budget_)


def test_rounding_of_sums_is_absorbed() -> None:
    spent = 0.0
    for _ in range(9):
        assert fits(spent, 0.1, 1.0)
        spent += 0.1
    assert fits(spent, 0.1, 1.0)  # 0.1 × 10 rounds to 0.9999999999999999 or 1.0000000000000002; both fit


def test_nan_never_fits() -> None:
    assert not fits(math.nan, 0.1, 1.0) and not fits(0.0, math.nan, 1.0) and not fits(0.0, 0.1, math.nan)


def test_remaining_is_never_negative() -> None:
    assert remaining(0.25, 1.0) == 0.75 and remaining(1.5, 1.0) == 0.0


def test_the_gateway_refusal_is_one_sentence_with_the_numbers() -> None:
    err = exhausted(0.41, 0.88, 1.0, what="This query", purpose=" to reach ±25 at 95%",
                    hint=" History alone does not determine this query.", estimate="e")
    assert isinstance(err, dpgate.BudgetExhausted) and isinstance(err, dpgate.OperationalError)
    assert str(err) == ("This query needs ε = 0.41 to reach ±25 at 95%; 0.12 of 1 remains. "
                        "History alone does not determine this query.")
    assert err.needed == 0.41 and err.remaining == pytest.approx(0.12) and err.estimate == "e"


def test_overspent_remains_zero() -> None:
    err = exhausted(0.5, 1.2, 1.0, what="This hierarchical warm start")
    assert str(err) == "This hierarchical warm start needs ε = 0.5; 0 of 1 remains." and err.remaining == 0.0


def test_an_analyst_refusal_names_the_analyst_and_their_cap() -> None:
    err = exhausted(0.1198, 0.11983, 0.2, what="This statement", purpose=" (EXPLAIN quotes it)", analyst="bob",
                    hint=" Nothing was spent.")
    msg = str(err)
    assert msg.startswith("This statement needs ε = 0.1198 (EXPLAIN quotes it); "
                          "analyst 'bob' has ε = 0.08017 left of their cap 0.2. Nothing was spent. ")
    assert "raise your cap" in msg and "remains" not in msg  # told apart from the gateway's budget
    assert err.needed == 0.1198 and err.remaining == pytest.approx(0.08017)


def test_every_message_has_its_numbers_to_four_digits() -> None:
    msg = str(exhausted(1 / 3, 0.1, 0.75, what="This query"))
    assert "ε = 0.3333" in msg and "0.65 of 0.75 remains" in msg

