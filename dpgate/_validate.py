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

Arrays get the same treatment: :func:`finite_array` checks shape and
finiteness, :func:`points` reads the argument of a scipy-style method
(``cdf(x)`` with a scalar or an array), and :func:`readonly` freezes an array
an object hands out, so a caller cannot alter its state through it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

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
    "confidence_level",
    "MIN_CONFIDENCE",
    "finite_array",
    "points",
    "readonly",
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
    if type(x) is float:  # the common case, without the slow abstract-class check below
        if x != x:
            raise error(f"{name} must be a number, got NaN.")
        return x
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


#: The lowest confidence 1−δ dpgate accepts: below it an interval says little.
MIN_CONFIDENCE = 0.5


def confidence_level(p: object, name: str, *, error: type[Error] = InvalidArgument) -> float:
    """``p`` as a confidence 1−δ in [:data:`MIN_CONFIDENCE`, 1); a percentage (``95``) is refused
    with the fraction it probably means (``did you mean 0.95?``)."""
    f = real(p, name, error=error)
    if MIN_CONFIDENCE <= f < 1.0:
        return f
    hint = f"did you mean {f / 100:g}?" if 100 * MIN_CONFIDENCE <= f < 100 else "ask for e.g. 0.95."
    raise error(f"{name} must lie in [{MIN_CONFIDENCE}, 1), got {p!r}; {hint}")


def finite_array(
    x: ArrayLike,
    name: str,
    *,
    ndim: int | None = None,
    size: int | None = None,
    error: type[Error] = InvalidArgument,
) -> NDArray[np.float64]:
    """``x`` as a float64 array whose entries are all finite.

    Args:
        x: anything ``numpy.asarray`` reads as numbers.
        name: the argument's name, for the message.
        ndim: the required number of dimensions (``None``: any).
        size: the required number of entries (``None``: any).
        error: the class raised on a wrong shape or a non-finite entry.

    >>> finite_array([1, 2], "y", ndim=1).tolist()
    [1.0, 2.0]
    >>> finite_array([1.0, float("inf")], "y")
    Traceback (most recent call last):
    ...
    dpgate.errors.InvalidArgument: y must be finite; it has 1 NaN or infinite entries.
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentType(f"{name} must be an array of numbers ({exc}).") from exc
    if ndim is not None and arr.ndim != ndim:
        raise error(f"{name} must have {ndim} dimension(s); got shape {arr.shape}.")
    if size is not None and arr.size != size:
        raise error(f"{name} must have {size} entries; got {arr.size}.")
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    if bad:
        raise error(f"{name} must be finite; it has {bad} NaN or infinite entries.")
    return arr


def points(x: ArrayLike, name: str = "x") -> tuple[NDArray[np.float64], bool]:
    """The points a scipy-style method (``cdf(x)``, ``ppf(p)``) is evaluated at.

    Returns the points as a flat float64 array and whether ``x`` was a scalar
    (so the method can return a float).  Infinities are valid points; NaN is
    refused, because a distribution method must never return NaN.

    >>> points(0.5)
    (array([0.5]), True)
    >>> points([[1, 2]], "q")[0].tolist()
    [1.0, 2.0]
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentType(f"{name} must be a number or an array of numbers ({exc}).") from exc
    if np.isnan(arr).any():
        raise InvalidArgument(f"{name} must not be NaN.")
    return np.atleast_1d(arr).ravel(), arr.ndim == 0


def readonly(a: ArrayLike) -> NDArray[np.float64]:
    """A read-only float64 copy of ``a``.

    >>> r = readonly([1, 2])
    >>> r.flags.writeable
    False
    """
    out = np.array(a, dtype=np.float64, copy=True)
    out.setflags(write=False)
    return out
