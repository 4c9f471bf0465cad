"""lattice_for in integer arithmetic equals the rational-arithmetic definition."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import example, given
from hypothesis import strategies as st

from dpgate.release.noise import LATTICE_FACTOR, MAX_LATTICE_EXPONENT, lattice_for


def _reference(scale: float, denominator: int) -> tuple[float, int]:
    """The former implementation: a loop over k in exact rationals."""
    target = Fraction(scale) * denominator
    k = 0
    while k < MAX_LATTICE_EXPONENT and target * (1 << k) < LATTICE_FACTOR:
        k += 1
    mult = 1 << k
    return 1 / (denominator * mult), mult


@given(
    st.floats(min_value=5e-324, max_value=1.7e308, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=2**70),
)
@example(1024.0, 1)
@example(1023.9999999999999, 1)
@example(1.0, 1024)
@example(1.0, 3)
@example(2.0**-60 * 1024, 1)
@example(2.0**-61 * 1024, 1)
@example(5e-324, 1)
@example(341.3333333333333, 3)
def test_lattice_for_equals_the_rational_loop(scale: float, denominator: int) -> None:
    assert lattice_for(scale, denominator) == _reference(scale, denominator)


@given(st.integers(min_value=-80, max_value=20), st.integers(min_value=1, max_value=4096))
def test_lattice_for_at_powers_of_two(e: int, denominator: int) -> None:
    # Boundaries of the comparison sit on powers of two (and their neighbours).
    for scale in (2.0**e, 2.0**e * (1 + 2.0**-52), 2.0**e * (1 - 2.0**-53)):
        assert lattice_for(scale, denominator) == _reference(scale, denominator)
