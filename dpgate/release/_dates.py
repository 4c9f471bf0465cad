"""The generated SQL of date and timestamp columns: a stored value → its granule ordinal.

:class:`~dpgate.release._cube_sql.BoundColumn` maps a date/timestamp column through the
integer mapping (clamp to ``[min, max]``, then subtract ``min``) applied to the value's
granule *ordinal* (:mod:`dpgate.schema._temporal`), which this module builds from the
calendar fields alone — ``EXTRACT(YEAR | MONTH | DAY | HOUR | MINUTE …)`` of a DATE or
TIMESTAMP, or the digits of ISO text — with integer arithmetic that DuckDB, PostgreSQL and
Spark evaluate alike (no time-zone or interval functions, whose behaviour differs; DuckDB reads
day, hour and minute ordinals of typed columns from their epoch seconds instead,
:func:`_epoch_ordinal`, which tests check against the arithmetic).  ``±infinity`` (DuckDB,
PostgreSQL) is NULL:

* days since 1970-01-01 of ``y-m-d``: ``365·y' + ⌊y'/4⌋ - ⌊y'/100⌋ + ⌊y'/400⌋ + ⌊(153·m' + 2)/5⌋ + d - 719 469``
  with ``y' = y - [m ≤ 2]`` and ``m' = (m + 9) mod 12`` (the proleptic Gregorian calendar,
  years 1 … 9999, where ``y' ≥ 0`` so every floor is of a non-negative number);
* hours, minutes: ``24·days + hour``, ``60·hours + minute``; months ``12·y + m - 1``; years ``y``.

A TIMESTAMP WITH TIME ZONE is read as the engine's session shows it (its wall-clock time).
Text that is not ISO 8601 (``YYYY-MM-DD``, optionally ``[ T]HH:MM[:SS[.f]]`` and a zone,
which is ignored) is NULL: no generated expression fails on a stored value.  A text day that
does not exist (``2024-02-30``) counts as the day its number of days reaches.
"""

from __future__ import annotations

from sqlglot import exp

__all__ = ["temporal_class", "granule_ordinal"]

#: ISO 8601 text with month 01-12, day 01-31, hour 00-23, minute and second 00-59.
_ISO_RE = (r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
           r"([ T]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]+)?)?)?([zZ]|[-+][0-9]{2}(:?[0-9]{2})?)?$")


def temporal_class(data_type: str) -> str:
    """``"date"``, ``"timestamp"`` or ``"text"`` (anything else is read as ISO text) for an engine's type name."""
    t = data_type.upper().strip()
    if t == "DATE":
        return "date"
    if t.startswith("TIMESTAMP") or t.startswith("DATETIME"):
        return "timestamp"
    return "text"


def _n(v: int) -> exp.Expression:
    return exp.Literal.number(v)


def _floor_div(a: exp.Expression, d: int) -> exp.Expression:
    return exp.Floor(this=exp.Div(this=exp.Cast(this=a, to=exp.DataType.build("DOUBLE")), expression=_n(d)))


def _add(*parts: exp.Expression) -> exp.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = exp.Add(this=out, expression=p)
    return exp.Paren(this=out)


def _mul(k: int, a: exp.Expression) -> exp.Expression:
    return exp.Mul(this=_n(k), expression=exp.Paren(this=a))


def _days(y: exp.Expression, m: exp.Expression, d: exp.Expression) -> exp.Expression:
    early = exp.LTE(this=m.copy(), expression=_n(2))
    yy = exp.Paren(this=exp.Sub(this=y, expression=exp.Case(ifs=[exp.If(this=early, true=_n(1))], default=_n(0))))
    mm = exp.Case(ifs=[exp.If(this=early.copy(), true=exp.Add(this=m.copy(), expression=_n(9)))],
                  default=exp.Sub(this=m, expression=_n(3)))
    return _add(_mul(365, yy.copy()), _floor_div(yy.copy(), 4), exp.Neg(this=_floor_div(yy.copy(), 100)),
                _floor_div(yy, 400), _floor_div(exp.Add(this=_mul(153, mm), expression=_n(2)), 5), d,
                exp.Neg(this=_n(719469)))


def _epoch_ordinal(x: exp.Expression, granularity: str, dialect: str) -> exp.Expression:
    """DuckDB, a DATE or TIMESTAMP ``x`` at day, hour or minute granularity: whole units of its
    wall-clock seconds since 1970-01-01 (``CAST(x AS TIMESTAMP)`` drops a zone as the session
    shows it); one short expression, which DuckDB evaluates several times faster than the
    calendar arithmetic.  (Not PostgreSQL: its epoch of ``'infinity'`` is infinite, and the cast
    to BIGINT would fail; its calendar fields of ``'infinity'`` are NULL, as DuckDB's epoch.)"""
    ts = exp.Cast(this=x, to=exp.DataType.build("TIMESTAMP"))
    secs = (exp.Anonymous(this="epoch", expressions=[ts]) if dialect == "duckdb"
            else exp.Extract(this=exp.var("EPOCH"), expression=ts))
    unit = {"day": 86400, "hour": 3600, "minute": 60}[granularity]
    return exp.Cast(this=exp.Floor(this=exp.Div(this=secs, expression=_n(unit))), to=exp.DataType.build("BIGINT"))


def granule_ordinal(x: exp.Expression, granularity: str, tclass: str, dialect: str = "") -> exp.Expression:
    """The BIGINT granule ordinal of the stored value ``x`` (NULL for NULL and non-ISO text)."""
    if tclass != "text" and dialect == "duckdb" and granularity in ("day", "hour", "minute"):
        return _epoch_ordinal(x, granularity, dialect)
    if tclass == "text":
        text = exp.Cast(this=x, to=exp.DataType.build("VARCHAR"))

        def field(start: int, length: int) -> exp.Expression:
            sub = exp.Substring(this=text.copy(), start=_n(start), length=_n(length))
            return exp.Cast(this=sub, to=exp.DataType.build("INT"))

        def timed(start: int) -> exp.Expression:
            has = exp.GTE(this=exp.Length(this=text.copy()), expression=_n(16))
            return exp.Case(ifs=[exp.If(this=has, true=field(start, 2))], default=_n(0))

        y, m, d, h, mi = field(1, 4), field(6, 2), field(9, 2), timed(12), timed(15)
    else:
        def part(unit: str) -> exp.Expression:
            return exp.Extract(this=exp.var(unit), expression=x.copy())

        y, m, d = part("YEAR"), part("MONTH"), part("DAY")
        h, mi = (part("HOUR"), part("MINUTE")) if tclass == "timestamp" else (_n(0), _n(0))
    if granularity == "year":
        out: exp.Expression = y
    elif granularity == "month":
        out = _add(_mul(12, y), m, exp.Neg(this=_n(1)))
    else:
        out = _days(y, m, d)
        if granularity in ("hour", "minute"):
            out = _add(_mul(24, out), h)
        if granularity == "minute":
            out = _add(_mul(60, out), mi)
    out = exp.Cast(this=out, to=exp.DataType.build("BIGINT"))
    if tclass == "text":
        iso = exp.RegexpLike(this=text.copy(), expression=exp.Literal.string(_ISO_RE))
        return exp.Case(ifs=[exp.If(this=iso, true=out)])
    return out
