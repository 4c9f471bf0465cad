"""Dates and timestamps as cells: granularities, granule ordinals, ISO literals.

A ``date`` or ``timestamp`` column declares a range and a *granularity*; its cells are the
granules (days, hours, months, …) of the range, numbered by their *ordinal*, an integer
counted from a fixed origin so that consecutive granules have consecutive ordinals:

===========  ==============================================  ====================
granularity  ordinal of a value                               kinds
===========  ==============================================  ====================
minute       whole minutes since 1970-01-01 00:00             timestamp
hour         whole hours since 1970-01-01 00:00               timestamp
day          days since 1970-01-01                            date, timestamp
month        ``12 · year + month - 1``                        date, timestamp
year         the year                                         date, timestamp
===========  ==============================================  ====================

A value is *truncated to its granule* before anything else (as integers are floored): an
hour column holds ``10:00`` for a row at ``10:42``.  Every function here is pure Python on
public text (literals of a query, bounds of a declaration): parsing is one anchored regular
expression without nested repetition on at most :data:`MAX_LITERAL_CHARS` characters.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from dpgate.errors import SchemaError

__all__ = [
    "TEMPORAL_KINDS", "GRANULARITIES", "GROUPING_UNITS", "DEFAULT_GRANULARITY", "MAX_LITERAL_CHARS", "EPOCH",
    "declared_range", "parse_instant", "ordinal", "granule_start", "granule_seconds", "iso", "finer_or_equal",
]

#: Column kinds whose cells are granules of time.
TEMPORAL_KINDS = ("date", "timestamp")
#: Granularities, finest first; each kind's allowed ones (:data:`KIND_GRANULARITIES`).
GRANULARITIES = ("minute", "hour", "day", "month", "year")
KIND_GRANULARITIES = {"date": ("day", "month", "year"), "timestamp": GRANULARITIES}
#: Also the compiler's coarser cells of ``GROUP BY date_trunc('week' | 'quarter', …)`` (weeks from Monday);
#: not declarable: the generated SQL maps only :data:`GRANULARITIES`.
GROUPING_UNITS = (*GRANULARITIES, "week", "quarter")
#: Unit → the granularities whose granules tile it.
_TILES = {"minute": {"minute"}, "hour": {"minute", "hour"}, "day": {"minute", "hour", "day"},
          "week": {"minute", "hour", "day", "week"}, "month": {"minute", "hour", "day", "month"},
          "quarter": {"minute", "hour", "day", "month", "quarter"},
          "year": {"minute", "hour", "day", "month", "quarter", "year"}}
DEFAULT_GRANULARITY = {"date": "day", "timestamp": "hour"}
#: Longest date/timestamp literal read (``2024-01-01 00:00:00.000000+00:00`` has 32 characters).
MAX_LITERAL_CHARS = 40
EPOCH = dt.datetime(1970, 1, 1)

_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?"
)


def parse_instant(value: Any) -> dt.datetime | None:
    """A ``datetime.date`` / ``datetime.datetime`` or an ISO text (``YYYY-MM-DD`` or
    ``YYYY-MM-DD HH:MM[:SS[.ffffff]]``, ``T`` accepted) as a naive datetime; None if it is none.

    Time zones are not read: a timestamp is its wall-clock time."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, str) or len(value) > MAX_LITERAL_CHARS:
        return None
    m = _ISO.fullmatch(value.strip())
    if m is None:
        return None
    y, mo, d, h, mi, s, frac = m.groups()
    try:
        return dt.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0),
                           int((frac or "0").ljust(6, "0")))
    except ValueError:
        return None


def ordinal(t: dt.datetime, granularity: str) -> int:
    """The ordinal of the granule holding ``t`` (see the module docstring)."""
    if granularity == "year":
        return t.year
    if granularity == "quarter":
        return 4 * t.year + (t.month - 1) // 3
    if granularity == "month":
        return 12 * t.year + t.month - 1
    days = (t.date() - EPOCH.date()).days
    if granularity == "day":
        return days
    if granularity == "week":  # Monday 1969-12-29 starts week 0
        return (days + 3) // 7
    if granularity == "hour":
        return 24 * days + t.hour
    return (24 * days + t.hour) * 60 + t.minute


def granule_start(k: int, granularity: str) -> dt.datetime:
    """The first instant of the granule with ordinal ``k``."""
    if granularity == "year":
        return dt.datetime(k, 1, 1)
    if granularity == "quarter":
        return dt.datetime(k // 4, (k % 4) * 3 + 1, 1)
    if granularity == "month":
        return dt.datetime(k // 12, k % 12 + 1, 1)
    if granularity == "week":
        return EPOCH + dt.timedelta(days=7 * k - 3)
    unit = {"day": 1440, "hour": 60, "minute": 1}[granularity]
    return EPOCH + dt.timedelta(minutes=k * unit)


def granule_seconds(k: int, granularity: str) -> float:
    """:func:`granule_start` as seconds since 1970-01-01 (the compiler's number for a cell)."""
    return (granule_start(k, granularity) - EPOCH).total_seconds()


def iso(t: dt.datetime, kind: str) -> str:
    """``t`` as the literal a query would write: a date, or a timestamp to the minute."""
    return t.date().isoformat() if kind == "date" else t.strftime("%Y-%m-%d %H:%M")


def finer_or_equal(a: str, b: str) -> bool:
    """Whether granularity ``a`` is at least as fine as ``b`` (every ``b`` granule is whole ``a`` granules)."""
    return a in _TILES[b]


def declared_range(spec: Any, kind: str, where: str, max_cells: int) -> tuple[int, int, str]:
    """``(min ordinal, max ordinal, granularity)`` of a date/timestamp declaration
    ``{type: date, min: 2024-01-01, max: 2024-12-31, granularity: day}``.

    ``min`` and ``max`` are inclusive and may be ``datetime.date`` (as YAML loads
    ``2024-01-01``), ``datetime.datetime`` or ISO text; each lies in its granule.

    Raises:
        SchemaError: a bound is missing or not a date, the granularity is unknown for the
            kind, or the range is empty or has more than ``max_cells`` cells.
    """
    gran = spec.get("granularity", DEFAULT_GRANULARITY[kind])
    allowed = KIND_GRANULARITIES[kind]
    if not isinstance(gran, str) or gran.lower() not in allowed:
        raise SchemaError(f"{where}: granularity {str(gran)[:40]!r} is not one of {list(allowed)} for a {kind} column.")
    gran = gran.lower()
    bounds = []
    example = "2024-01-01" if kind == "date" else "'2024-01-01 00:00'"
    for key in ("min", "max"):
        raw = spec.get(key)
        t = parse_instant(raw)
        if t is None:
            raise SchemaError(
                f"{where}: a {kind} column needs {key!r} as a date such as {example} "
                f"(ISO 8601: YYYY-MM-DD[ HH:MM[:SS]]), got {str(raw)[:40]!r}."
            )
        bounds.append(ordinal(t, gran))
    lo, hi = bounds
    if hi < lo:
        raise SchemaError(f"{where}: max ({spec.get('max')}) is before min ({spec.get('min')}).")
    if hi - lo + 2 > max_cells:
        coarser = [g for g in allowed if not finer_or_equal(g, gran)]
        raise SchemaError(
            f"{where}: {hi - lo + 1} {gran}s from {spec.get('min')} to {spec.get('max')} are more than the limit "
            f"of {max_cells} cells; declare a shorter range or a coarser granularity ({', '.join(coarser)})."
        )
    return lo, hi, gran
