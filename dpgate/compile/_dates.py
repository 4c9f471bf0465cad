"""Dates and timestamps in the compiler: literals, comparisons, ``EXTRACT`` and ``date_trunc``.

A date/timestamp column's value on a cell is a :data:`TIME` value: the first instant of the
cell's granule (:mod:`dpgate.schema._temporal`), as seconds since 1970-01-01.  Everything
here is evaluated on cells, from the schema and the query's constants alone:

* ``DATE '2024-03-01'``, ``TIMESTAMP '2024-03-01 10:00'``, ``CAST('…' AS DATE)`` and an ISO
  string compared with a date (``d >= '2024-03-01'``) are TIME constants.  Compared with a
  column (or its ``date_trunc``), a constant must lie on a granule boundary of that column
  (or of the truncation unit) and within its declared range (its end included), else the
  query is refused, naming the literal to write instead.
* ``EXTRACT(unit FROM x)`` is a number (``year``, ``quarter``, ``month``, ``day``, ``dow``
  (0 = Sunday), ``isodow`` (7 = Sunday), ``doy``, ``hour``, ``minute``); ``date_trunc(unit, x)``
  is a TIME value (``minute``, ``hour``, ``day``, ``week`` (Mondays), ``month``, ``quarter``,
  ``year``).  A unit finer than the column's granularity is refused: the cells do not hold it.
* A TIME value is not a number: ``SUM(d)`` and ``d + 1`` are refused (``EXTRACT`` gives numbers).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.compile.bounds import excerpt
from dpgate.compile.cells import NULL, NUM, STR, TIME, Val
from dpgate.errors import InvalidArgumentType, QuerySyntaxError, UnsupportedQuery
from dpgate.schema._temporal import EPOCH, finer_or_equal, granule_seconds, granule_start, iso, parse_instant

__all__ = ["time_literal", "time_operands", "extract", "date_trunc", "is_time_cast",
           "TRUNC_UNITS", "EXTRACT_UNITS", "shown", "date_parameter"]

#: date_trunc unit → the coarsest granularity whose cells hold it.
TRUNC_UNITS = {"minute": "minute", "hour": "hour", "day": "day", "week": "day", "month": "month",
               "quarter": "month", "year": "year"}
#: EXTRACT unit → the coarsest granularity whose cells hold it.
EXTRACT_UNITS = {"year": "year", "quarter": "month", "month": "month", "day": "day", "dow": "day",
                 "isodow": "day", "doy": "day", "hour": "hour", "minute": "minute"}
_TIME_TYPES = {exp.DataType.Type.DATE, exp.DataType.Type.DATETIME, exp.DataType.Type.TIMESTAMP,
               exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ}
_DAY = 86400


def is_time_cast(node: exp.Cast) -> bool:
    """Whether ``node`` casts to a date or timestamp type (``DATE '…'`` parses as one)."""
    return node.args["to"].this in _TIME_TYPES


def time_literal(node: exp.Cast, value: Val) -> Val:
    """``DATE '…'`` / ``TIMESTAMP '…'`` / ``CAST('…' AS DATE)``: a TIME constant; ``DATE`` drops a time of day."""
    if value.kind == NULL:
        return value
    if value.kind == TIME:  # CAST(ts AS DATE) is date_trunc('day', ts); a cast to a timestamp keeps the value
        if node.args["to"].this != exp.DataType.Type.DATE or value.col is not None and value.col.granularity in (
                "day", "month", "year"):
            return value
        return date_trunc(value, exp.TimestampTrunc(this=node.this.copy(), unit=exp.var("DAY")))
    if value.kind != STR:
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: only a string constant may be cast to a date or timestamp, e.g. DATE '2024-01-01'."
        )
    t = _parse(str(value.v), node)
    if node.args["to"].this == exp.DataType.Type.DATE:
        t = dt.datetime(t.year, t.month, t.day)
    return Val(TIME, (t - EPOCH).total_seconds(), False, text=str(value.v))


def _parse(text: str, node: exp.Expr) -> dt.datetime:
    t = parse_instant(text)
    if t is None:
        raise QuerySyntaxError(
            f"{excerpt(text)} in {excerpt(node.sql())} is not a date or timestamp; write DATE 'YYYY-MM-DD' or "
            "TIMESTAMP 'YYYY-MM-DD HH:MM[:SS]' (ISO 8601, a real calendar day)."
        )
    return t


def time_operands(a: Val, b: Val, node: exp.Expr) -> tuple[Val, Val]:
    """Both sides of a comparison involving a TIME value, as numbers (seconds) after checking
    that a constant compared with a column lies on its granule boundaries and in its range."""
    out = []
    for this, other in ((a, b), (b, a)):
        if this.kind == STR:
            t = _parse(str(this.v), node)
            this = Val(TIME, (t - EPOCH).total_seconds(), False, text=str(this.v))
        if this.kind not in (TIME, NULL):
            raise UnsupportedQuery(
                f"{excerpt(node.sql())} compares a date or timestamp with a {this.kind}; compare it with a date such "
                "as DATE '2024-01-01', or compare EXTRACT(year FROM col) (a number) with numbers."
            )
        if this.kind == TIME and this.col is None and other.kind == TIME and other.col is not None:
            _check_constant(float(this.v), other, node)
        out.append(Val(NUM, this.v, this.null))
    return out[0], out[1]


def _check_constant(secs: float, side: Val, node: exp.Expr) -> None:
    col = side.col
    assert col is not None
    unit = side.text or col.granularity or "day"  # a date_trunc value carries its unit as text
    lo, hi = col.int_range()
    gran = col.granularity or "day"
    first = float(_trunc(np.array([granule_seconds(lo, gran)]), unit)[0])
    end = granule_seconds(hi + 1, gran)
    start = float(_trunc(np.array([secs]), unit)[0])
    t = EPOCH + dt.timedelta(seconds=secs)
    what = f"column {col.name!r}" if side.text is None else f"date_trunc({unit!r}, {col.name})"
    if start != secs:
        floor = EPOCH + dt.timedelta(seconds=start)
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: {t} is not on a {unit} boundary of {what} ({col.kind}, granularity "
            f"{gran}); its cells cannot tell part of a {unit}. Write the {unit}'s start, e.g. "
            f"'{iso(floor, col.kind if unit not in ('hour', 'minute') else 'timestamp')}'."
        )
    if not first <= secs <= end:
        a = iso(granule_start(lo, gran), col.kind)
        b = iso(granule_start(hi, gran), col.kind)
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: {t} is outside the declared range of {what} ({a} .. {b}); rows outside it "
            f"are counted at the nearest end, so compare with a date in the range (or the range's end, "
            f"'{iso(granule_start(hi + 1, gran), col.kind)}')."
        )


def shown(node: exp.Expr) -> str:
    """``node`` as a query would write it (sqlglot renders date_trunc as TIMESTAMP_TRUNC(x, UNIT))."""
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = node.args.get("unit")
        return excerpt(f"date_trunc('{(unit.name if unit is not None else '?').lower()}', {node.this.sql()})")
    return excerpt(node.sql())


def _unit(node: exp.Expr, units: dict[str, str], fn: str) -> str:
    raw = node.args.get("unit") if fn == "date_trunc" else node.this
    name = raw.name if isinstance(raw, (exp.Var, exp.Literal, exp.Identifier, exp.Column)) else ""
    name = name.lower()[:20]
    if name not in units:
        raise UnsupportedQuery(
            f"{shown(node)}: {excerpt(name or str(raw))} is not a {fn} unit dpgate supports; use one of "
            f"{', '.join(units)}."
        )
    return name


def _time_arg(a: Val, node: exp.Expr, unit: str, units: dict[str, str], fn: str) -> None:
    if a.kind not in (TIME, NULL):
        raise UnsupportedQuery(
            f"{shown(node)}: {fn} needs a date or timestamp (a declared date/timestamp column or "
            f"DATE '…'), got a {a.kind}."
        )
    col = a.col
    if col is not None and not finer_or_equal(col.granularity or "day", units[unit]):
        coarser = [u for u, g in units.items() if finer_or_equal(col.granularity or "day", g)]
        raise UnsupportedQuery(
            f"{shown(node)}: column {col.name!r} is declared with granularity {col.granularity}, so its cells "
            f"do not hold the {unit}; use one of {', '.join(coarser)} (or declare a finer granularity)."
        )


def extract(a: Val, node: exp.Extract) -> Val:
    """``EXTRACT(unit FROM a)`` on every cell: a number."""
    unit = _unit(node, EXTRACT_UNITS, "EXTRACT")
    _time_arg(a, node, unit, EXTRACT_UNITS, "EXTRACT")
    if a.kind == NULL:
        return a
    s = np.asarray(a.v, dtype=float).astype(np.int64)
    days = s // _DAY
    t = s.astype("datetime64[s]")
    month0 = t.astype("datetime64[M]").astype(np.int64)  # months since 1970-01
    values: dict[str, Any] = {
        "year": t.astype("datetime64[Y]").astype(np.int64) + 1970,
        "quarter": (month0 % 12) // 3 + 1,
        "month": month0 % 12 + 1,
        "day": days - t.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64) + 1,
        "doy": days - t.astype("datetime64[Y]").astype("datetime64[D]").astype(np.int64) + 1,
        "dow": (days + 4) % 7,
        "isodow": (days + 3) % 7 + 1,
        "hour": (s // 3600) % 24,
        "minute": (s // 60) % 60,
    }
    v = np.asarray(values[unit], dtype=float)
    return Val(NUM, v if v.ndim else float(v), a.null)


def date_trunc(a: Val, node: exp.Expr) -> Val:
    """``date_trunc(unit, a)`` on every cell: a TIME value that remembers its column and unit."""
    unit = _unit(node, TRUNC_UNITS, "date_trunc")
    _time_arg(a, node, unit, TRUNC_UNITS, "date_trunc")
    if a.kind == NULL:
        return a
    v = _trunc(np.asarray(a.v, dtype=float), unit)
    return Val(TIME, v if v.ndim else float(v), a.null, a.col, text=unit if a.col is not None else None)


def _trunc(secs: np.ndarray, unit: str) -> np.ndarray:
    s = secs.astype(np.int64)
    if unit in ("minute", "hour", "day"):
        step = {"minute": 60, "hour": 3600, "day": _DAY}[unit]
        out = s - s % step
    elif unit == "week":  # Monday 00:00 (1970-01-01 was a Thursday)
        days = s // _DAY
        out = (days - (days + 3) % 7) * _DAY
    else:
        months = s.astype("datetime64[s]").astype("datetime64[M]").astype(np.int64)
        months = months - months % {"month": 1, "quarter": 3, "year": 12}[unit]
        out = months.astype("datetime64[M]").astype("datetime64[s]").astype(np.int64)
    return out.astype(float)


def date_parameter(value: Any) -> exp.Expr:
    """A bound ``datetime.date`` / ``datetime.datetime`` parameter as ``DATE '…'`` / ``TIMESTAMP '…'``
    (its wall-clock time; a zone is dropped); any other type is refused."""
    if isinstance(value, dt.datetime):
        text = value.replace(tzinfo=None).isoformat(sep=" ")
        return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("TIMESTAMP"))
    if isinstance(value, dt.date):
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build("DATE"))
    raise InvalidArgumentType(
        f"parameter of type {type(value).__name__} is not supported; pass None, bool, int, float, Decimal, str, "
        "datetime.date or datetime.datetime."
    )
