"""What the analyst asks for, resolved once: ``±accuracy`` at ``confidence``, and ``allow_partial``.

A requirement can be given at several levels — a call's arguments, a statement's
``/*+ dpgate … */`` hints, a DB-API session's ``SET dpgate.*`` settings, a
connection's arguments — and each caller has its own precedence.  Every caller
resolves and validates through :func:`resolve_requirement`, so the rules and the
error messages cannot drift between the gateway and the DB-API driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dpgate._validate import MIN_CONFIDENCE, confidence_level, is_true, positive_finite
from dpgate.errors import InvalidRequirement

__all__ = [
    "DEFAULT_CONFIDENCE",
    "MIN_CONFIDENCE",
    "Requirement",
    "hinted",
    "resolve_accuracy",
    "resolve_confidence",
    "resolve_requirement",
    "of_call",
]

#: Confidence 1−δ when no level of a requirement gives one.
DEFAULT_CONFIDENCE = 0.95
#: Lowest confidence accepted: an interval that misses the truth more often than it
#: covers it is no accuracy guarantee (and at levels near 0 the noise scale overflows).


@dataclass(frozen=True)
class Requirement:
    """What the analyst asked for: ``±accuracy`` at ``confidence`` (1−δ), and whether
    history's best (wider) estimate is acceptable when the budget cannot pay."""

    accuracy: float
    confidence: float = DEFAULT_CONFIDENCE
    allow_partial: bool = False


def resolve_requirement(*levels: Mapping[str, object], missing: str) -> Requirement:
    """The requirement given by ``levels``, most specific first, validated once.

    For each of ``accuracy``, ``confidence`` and ``allow_partial`` the first level
    holding a value other than ``None`` wins.  A level is a call's arguments, a
    DB-API session's settings or a statement's hints read by :func:`hinted`;
    ``Gateway.query`` passes ``(arguments, hints)``, the DB-API ``(hints, session
    settings)`` (the session starts from the connection's arguments).  Confidence
    defaults to :data:`DEFAULT_CONFIDENCE`.

    Raises:
        InvalidRequirement: no level gives an accuracy (the message is ``missing``,
            which says where the caller can set one), or a value is out of range.

    >>> resolve_requirement({"accuracy": None}, hinted({"accuracy": "25", "allow_partial": "on"}), missing="")
    Requirement(accuracy=25.0, confidence=0.95, allow_partial=True)
    """
    accuracy = resolve_accuracy(*levels)
    if accuracy is None:
        raise InvalidRequirement(missing)
    return Requirement(accuracy, resolve_confidence(*levels), bool(_first(levels, "allow_partial")))


def hinted(hints: Mapping[str, str]) -> dict[str, float | bool]:
    """A statement's ``/*+ dpgate … */`` hints as a requirement level: numbers and an on/off flag.

    On/off words follow :data:`dpgate._validate.TRUE_WORDS`.  (Only hints are text:
    a string given as an argument is refused by the range checks.)

    Raises:
        InvalidRequirement: a hinted accuracy or confidence is not a number.
    """
    out: dict[str, float | bool] = {}
    for name in ("accuracy", "confidence"):
        if name in hints:
            out[name] = _number(hints[name], name)
    if "allow_partial" in hints:
        out["allow_partial"] = is_true(hints["allow_partial"])
    return out


def resolve_accuracy(*levels: Mapping[str, object]) -> float | None:
    """The accuracy of ``levels`` (most specific first), validated; ``None`` when no level gives one.

    Raises:
        InvalidRequirement: the value is not a finite number > 0.
    """
    given = _first(levels, "accuracy")
    if given is None:
        return None
    return positive_finite(given, "accuracy (the interval half-width)", error=InvalidRequirement)


def resolve_confidence(*levels: Mapping[str, object]) -> float:
    """The confidence of ``levels`` (most specific first), else :data:`DEFAULT_CONFIDENCE`; validated.

    Raises:
        InvalidRequirement: the value is not a number in [:data:`MIN_CONFIDENCE`, 1).
    """
    given = _first(levels, "confidence")
    value = DEFAULT_CONFIDENCE if given is None else given
    return confidence_level(value, "confidence (1−δ)", error=InvalidRequirement)


def _first(levels: Sequence[Mapping[str, object]], name: str) -> object:
    return next((lv[name] for lv in levels if lv.get(name) is not None), None)


def _number(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidRequirement(f"hint {name}={text!r} is not a number; write e.g. {name}=25.") from None


def of_call(hints: Mapping[str, str], accuracy: float | None, confidence: float | None,
            allow_partial: bool | None) -> Requirement:
    """The requirement of a call: its arguments, else the statement's ``hints``."""
    return resolve_requirement(
        {"accuracy": accuracy, "confidence": confidence, "allow_partial": allow_partial or None},
        hinted(hints),
        missing="no accuracy given: pass accuracy= (the half-width of the interval you need, e.g. 25) "
        "or add a hint /*+ dpgate accuracy=25 */.",
    )
