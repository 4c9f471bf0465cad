"""The argument checks written once (dpgate._validate)."""

from __future__ import annotations

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest

from dpgate import _validate
from dpgate._validate import (
    FALSE_WORDS,
    TRUE_WORDS,
    finite,
    finite_array,
    is_true,
    nonnegative_finite,
    points,
    positive_finite,
    probability,
    readonly,
    real,
)
from dpgate.errors import InvalidArgument, InvalidArgumentType, InvalidRequirement, SchemaError


def test_doctests() -> None:
    assert doctest.testmod(_validate).failed == 0


@pytest.mark.parametrize("x", [1, 2.5, np.float64(3.0), np.int64(4), Fraction(1, 3), -math.inf])
def test_real_accepts_numbers(x: object) -> None:
    assert real(x, "x") == float(x)  # type: ignore[arg-type]
    assert type(real(x, "x")) is float


@pytest.mark.parametrize("x", [True, "1", None, [1.0], 1j])
def test_real_refuses_non_numbers_as_a_type_error(x: object) -> None:
    with pytest.raises(InvalidArgumentType, match="x must be a number"):
        real(x, "x")


def test_the_error_class_is_the_callers() -> None:
    with pytest.raises(InvalidRequirement, match="budget"):
        positive_finite(0, "budget", error=InvalidRequirement)
    with pytest.raises(SchemaError):  # not a TypeError when the caller names its own class
        real("a", "edge", error=SchemaError)


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (finite, [0.0, -1.0, 1e308], [math.inf, -math.inf, math.nan]),
        (positive_finite, [1e-300, 2.0], [0.0, -1.0, math.inf, math.nan]),
        (nonnegative_finite, [0.0, 2.0], [-1e-300, math.inf, math.nan]),
    ],
)
def test_finiteness_and_sign(check, good: list[float], bad: list[float]) -> None:  # type: ignore[no-untyped-def]
    for x in good:
        assert check(x, "x") == x
    for x in bad:
        with pytest.raises(InvalidArgument, match="^x must"):
            check(x, "x")
        with pytest.raises(ValueError):  # InvalidArgument is a ValueError
            check(x, "x")


def test_probability_intervals() -> None:
    assert probability(0.5, "p") == 0.5
    for p in (0.0, 1.0, -0.1, 1.1, math.nan, math.inf):
        with pytest.raises(InvalidArgument, match=r"\(0, 1\)|number"):
            probability(p, "p")
    assert probability(0.0, "p", open_interval=False) == 0.0
    assert probability(1.0, "p", open_interval=False) == 1.0
    with pytest.raises(InvalidArgument, match=r"\[0, 1\]"):
        probability(1.5, "p", open_interval=False)


def test_true_and_false_words() -> None:
    assert all(is_true(w) and is_true(w.upper()) and is_true(f" {w} ") for w in TRUE_WORDS)
    assert not any(is_true(w) for w in FALSE_WORDS)
    assert not TRUE_WORDS & FALSE_WORDS
    assert is_true(1) and not is_true(0) and not is_true("maybe")


def test_finite_array() -> None:
    np.testing.assert_array_equal(finite_array([[1, 2]], "H", ndim=2, size=2), [[1.0, 2.0]])
    assert finite_array([1], "y").dtype == np.float64
    with pytest.raises(InvalidArgument, match="H must have 2 dimension"):
        finite_array([1.0], "H", ndim=2)
    with pytest.raises(InvalidArgument, match="y must have 3 entries; got 2"):
        finite_array([1.0, 2.0], "y", size=3)
    with pytest.raises(InvalidArgument, match="2 NaN or infinite"):
        finite_array([math.nan, 1.0, -math.inf], "y")
    with pytest.raises(InvalidArgumentType):
        finite_array(["a"], "y")
    with pytest.raises(InvalidRequirement):
        finite_array([math.inf], "alpha", error=InvalidRequirement)


def test_points() -> None:
    arr, scalar = points(2)
    assert scalar and arr.tolist() == [2.0]
    arr, scalar = points([[1, math.inf]])
    assert not scalar and arr.tolist() == [1.0, math.inf]  # infinities are valid points
    with pytest.raises(InvalidArgument, match="q must not be NaN"):
        points([0.0, math.nan], "q")
    with pytest.raises(InvalidArgumentType):
        points("x")


def test_readonly_is_a_frozen_copy() -> None:
    src = np.array([1, 2])
    out = readonly(src)
    assert out.dtype == np.float64 and not out.flags.writeable
    src[0] = 9
    assert out[0] == 1.0
    with pytest.raises(ValueError):
        out[0] = 5.0
