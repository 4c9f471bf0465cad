"""Argument checks, written once (scipy's ``_argcheck`` habit).

Every public entry point that takes a number, a probability or an on/off word
checks it here, so the rule and its error message cannot drift between modules.
Each check returns the value as the type dpgate computes with (``float``) and
raises a :class:`dpgate.Error` subclass naming the argument and the rule.

>>> positive_finite(2, "accuracy")
2.0
>>> probability(0.95, "confidence")
0.95
>>> is_true("ON"), is_true("off")
(True, False)
"""

from __future__ import annotations

import math
import numbers

from dpgate.errors import Error, InvalidArgument, InvalidArgumentType

__all__ = [
    "TRUE_WORDS",
    "FALSE_WORDS",
    "is_true",
    "real",
    "finite",
    "positive_finite",
    "nonnegative_finite",
    "probability",
]

#: The spellings of "on" accepted in hints, ``SET`` statements and the CLI.
TRUE_WORDS = frozenset({"1", "true", "on", "yes"})
#: The spellings of "off".
FALSE_WORDS = frozenset({"0", "false", "off", "no"})


def is_true(word: object) -> bool:
    """Whether ``word`` (a hint or ``SET`` value) spells "on"; anything else is "off"."""
    return str(word).strip().lower() in TRUE_WORDS


def real(x: object, name: str, *, error: type[Error] = InvalidArgument) -> float:
    """``x`` as a float; booleans, non-numbers and NaN are refused with ``error``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        if error is InvalidArgument:
            raise InvalidArgumentType(f"{name} must be a number, got {x!r} ({type(x).__name__}).")
        raise error(f"{name} must be a number, got {x!r} ({type(x).__name__}).")
    f = float(x)
    if math.isnan(f):
        raise error(f"{name} must be a number, got NaN.")
    return f


def finite(x: object, name: str, *, error: type[Error] = InvalidArgument) -> float:
    """``x`` as a finite float."""
    f = real(x, name, error=error)
    if not math.isfinite(f):
        raise error(f"{name} must be finite, got {x!r}.")
    return f


def positive_finite(x: object, name: str, *, error: type[Error] = InvalidArgument) -> float:
    """``x`` as a float that is finite and > 0."""
    f = real(x, name, error=error)
    if not (0 < f < math.inf):
        raise error(f"{name} must be a finite number > 0, got {x!r}.")
    return f


def nonnegative_finite(x: object, name: str, *, error: type[Error] = InvalidArgument) -> float:
    """``x`` as a float that is finite and >= 0."""
    f = real(x, name, error=error)
    if not (0 <= f < math.inf):
        raise error(f"{name} must be a finite number >= 0, got {x!r}.")
    return f


def probability(
    p: object, name: str, *, open_interval: bool = True, error: type[Error] = InvalidArgument
) -> float:
    """``p`` as a float in (0, 1) (or [0, 1] with ``open_interval=False``)."""
    f = real(p, name, error=error)
    inside = 0.0 < f < 1.0 if open_interval else 0.0 <= f <= 1.0
    if not inside:
        interval = "(0, 1)" if open_interval else "[0, 1]"
        raise error(f"{name} must lie in {interval}, got {p!r}.")
    return f
