"""Bounds on what an analyst sends, checked on the text before any other work.

Everything here runs in time linear in its input (hand scanners, no regular
expression that can backtrack), so a hostile statement or parameter costs no
more than reading it.  The size and nesting limits of
:mod:`dpgate.compile.statement` (:func:`~dpgate.compile.statement.check_statement`)
come first on every path that parses (query, EXPLAIN, catalogue, Describe, SET);
numbers are range-checked on their text before anything converts them (a
``Fraction`` of ``1e10000000`` computes ``10**10000000``; ``format`` of the
Decimal ``1E+999999999`` writes a billion digits); refusals quote at most
:data:`EXCERPT` characters of what was sent, and no message passes
:data:`MAX_MESSAGE` characters.
"""

from __future__ import annotations

import contextvars
import numbers
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from fractions import Fraction

from dpgate.errors import QueryTooComplex, UnsupportedQuery

__all__ = [
    "EXCERPT", "MAX_MESSAGE", "MAX_NUMBER_DIGITS", "MAX_EXPONENT", "MAX_PARAMETER_LENGTH", "LARGEST_EXPONENT",
    "excerpt", "bounded_message", "skip_blank", "check_number_text", "number_order", "refuse_out_of_range",
    "check_parameter", "too_many_outputs", "deadline", "check_deadline", "DEFAULT_MAX_MEMORY", "memory_budget",
    "reserve_memory"]

#: Most characters of the input a refusal quotes.
EXCERPT = 80
#: Most characters of an error message (refusals quote SQL fragments and parameters).
MAX_MESSAGE = 2000
#: Most digits in a numeric constant or parameter (mantissa, before and after the point).
MAX_NUMBER_DIGITS = 1000
#: Largest magnitude of the exponent written in a numeric constant or parameter (``1e-1000``).
MAX_EXPONENT = 1000
#: Most characters of one string parameter (as :data:`~dpgate.compile.statement.MAX_SQL_LENGTH` of a statement).
MAX_PARAMETER_LENGTH = 100_000
#: Constants are within ±10**LARGEST_EXPONENT (the floating-point range, with a margin).
LARGEST_EXPONENT = 300


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """``repr`` of ``text``, cut to its first ``limit`` characters (with the total length) when longer."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def bounded_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """An error message cut to about ``limit`` characters (it may quote SQL or parameters of any length):
    its beginning and its end, where refusals say what to change."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]} … ({len(text) - limit} characters cut) … {text[-(limit // 2):]}"


def skip_blank(sql: str, pos: int = 0, *, line_comments: bool = True) -> int:
    """The index of the first character at or after ``pos`` that is neither white space nor inside a
    ``/* … */`` comment (nor, with ``line_comments``, a ``-- …`` comment).  An unclosed ``/*``
    runs to the end.  Linear: every character is looked at once."""
    n = len(sql)
    while pos < n:
        ch = sql[pos]
        if ch.isspace():
            pos += 1
        elif sql.startswith("/*", pos):
            end = sql.find("*/", pos + 2)
            pos = n if end < 0 else end + 2
        elif line_comments and sql.startswith("--", pos):
            end = sql.find("\n", pos + 2)
            pos = n if end < 0 else end + 1
        else:
            break
    return pos


def _split_number(text: str) -> tuple[str, str, str] | None:
    """``(integer digits, fraction digits, exponent text)`` of ``[+-]digits[.digits][e[+-]digits]``, else None."""
    body = text[1:] if text[:1] in "+-" else text
    mantissa, e, exponent = body.partition("e") if "e" in body else body.partition("E")
    whole, _, fraction = mantissa.partition(".")
    exponent_digits = exponent[1:] if exponent[:1] in "+-" else exponent
    ok = (whole or fraction) and (whole + fraction).isdigit() and whole.isascii() and fraction.isascii() \
        and (not e or (exponent_digits.isdigit() and exponent_digits.isascii()))
    return (whole, fraction, exponent) if ok else None


def number_order(text: str) -> int | None:
    """The decimal order of magnitude of a numeric text (``floor(log10(|x|))``), None for zero or a
    text that is not ``[+-]digits[.digits][e±digits]``; checks :func:`check_number_text` first."""
    check_number_text(text)
    parts = _split_number(text.replace("_", ""))
    if parts is None:
        return None
    whole, fraction, exponent = parts
    significant = (whole + fraction).lstrip("0")
    if not significant:
        return None
    written = int(exponent) if exponent else 0
    return len(significant) - len(fraction) - 1 + written


def check_number_text(text: str, what: str = "the constant") -> None:
    """Refuse a numeric text with more than :data:`MAX_NUMBER_DIGITS` digits or an exponent beyond
    ±:data:`MAX_EXPONENT`, before anything converts it (texts of another shape are left to the caller).

    Raises:
        QueryTooComplex: naming the limit.
    """
    parts = _split_number(text.replace("_", ""))
    if parts is None:
        return
    whole, fraction, exponent = parts
    if len(whole) + len(fraction) > MAX_NUMBER_DIGITS:
        raise QueryTooComplex(
            f"{what} {excerpt(text)} has {len(whole) + len(fraction)} digits, more than the limit of "
            f"{MAX_NUMBER_DIGITS}; write it with fewer digits."
        )
    digits = exponent.lstrip("+-").lstrip("0")
    if len(digits) > len(str(MAX_EXPONENT)) or (digits and int(digits) > MAX_EXPONENT):
        raise QueryTooComplex(
            f"{what} {excerpt(text)} has an exponent beyond ±{MAX_EXPONENT}, the limit; constants are within "
            f"±1e{LARGEST_EXPONENT}."
        )


def refuse_out_of_range(text: str, what: str = "the constant") -> UnsupportedQuery:
    """The refusal of a number outside ±1e300 (dpgate's floating-point range)."""
    return UnsupportedQuery(
        f"{what} {excerpt(text)} is outside the floating-point range (|x| ≤ 1e{LARGEST_EXPONENT}); use a "
        "smaller number."
    )


def check_parameter(value: object) -> None:
    """Refuse a parameter value beyond the size and range limits, before it is written out as a
    literal; values of other types (and non-finite Decimals) are left to the caller."""
    if isinstance(value, str) and len(value) > MAX_PARAMETER_LENGTH:
        raise QueryTooComplex(
            f"a string parameter has {len(value)} characters, more than the limit of {MAX_PARAMETER_LENGTH}."
        )
    if isinstance(value, Fraction) or (isinstance(value, Decimal) and value.is_finite()):
        _check_decimal(value)
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        _check_integer(int(value))


def _check_decimal(value: Decimal | Fraction, what: str = "the parameter") -> None:
    """Refuse a finite Decimal or Fraction beyond the digit, exponent or range limits, before it is
    written out as a literal (``format(Decimal("1E+999999999"), "f")`` is a billion characters)."""
    if isinstance(value, Fraction):
        bits = max(value.numerator.bit_length(), value.denominator.bit_length())
        if bits > _MAX_BITS:
            raise QueryTooComplex(
                f"{what} is a fraction of {bits}-bit integers, more than the limit of {MAX_NUMBER_DIGITS} digits; "
                "pass a float or a shorter Decimal."
            )
        return
    sign, digits, exponent = value.as_tuple()
    shown = excerpt(str(value)) if len(digits) <= MAX_NUMBER_DIGITS else f"(a Decimal of {len(digits)} digits)"
    if len(digits) > MAX_NUMBER_DIGITS:
        raise QueryTooComplex(
            f"{what} {shown} has {len(digits)} digits, more than the limit of {MAX_NUMBER_DIGITS}; "
            "pass it with fewer digits."
        )
    if not isinstance(exponent, int):  # NaN or infinity: left to the caller
        return
    if value and value.adjusted() > LARGEST_EXPONENT:
        raise refuse_out_of_range(str(value), what)
    if (value and value.adjusted() < -MAX_EXPONENT) or -exponent > MAX_EXPONENT + MAX_NUMBER_DIGITS:
        raise QueryTooComplex(
            f"{what} {shown} has an exponent beyond ±{MAX_EXPONENT}, the limit; pass a larger number or 0."
        )


def _check_integer(value: int, what: str = "the parameter") -> None:
    """Refuse an integer outside ±1e300 (before it is written out in decimal)."""
    if value.bit_length() > 996 and abs(value) > 10**LARGEST_EXPONENT:
        raise UnsupportedQuery(
            f"{what} (an integer of {value.bit_length()} bits) is outside the floating-point range "
            f"(|x| ≤ 1e{LARGEST_EXPONENT}); use a smaller number."
        )


_MAX_BITS = 3322 + 10  # bits of an integer of MAX_NUMBER_DIGITS decimal digits (1000 × log2(10)), and a margin


def too_many_outputs(n_outputs: int, max_outputs: int) -> QueryTooComplex:
    """The refusal of a statement of ``n_outputs`` outputs (groups × aggregates), more than ``max_outputs``."""
    return QueryTooComplex(
        f"this statement has {n_outputs} outputs (groups × aggregates), more than this gateway's "
        f"max_outputs = {max_outputs}; group by fewer or coarser columns, or raise the limit with "
        "Gateway(max_outputs=...) / connect(max_outputs=...)."
    )


#: When the statement being worked on in this thread must be refused, if it is still being
#: compiled or planned (``time.monotonic()``), or None.
_DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("dpgate_deadline", default=None)


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Within the block, compiling and planning refuse a statement after ``seconds`` (None: never).

    Checked (:func:`check_deadline`) between the groups the compiler weighs and the outputs the
    planner decides — never once a release has begun, so a refused statement has read no data
    and spent nothing, and the gateway's lock is given up as the refusal unwinds."""
    token = _DEADLINE.set(None if seconds is None else (time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """Raise :class:`QueryTooComplex` if this thread's statement is past its :func:`deadline`."""
    found = _DEADLINE.get()
    if found is not None and time.monotonic() > found[0]:
        raise QueryTooComplex(
            f"this statement was still being compiled or planned after its deadline of {found[1]:g} s "
            "(nothing was read or spent); ask for fewer groups or outputs, or split it."
        )


#: Default ``Gateway(max_memory=...)``: bytes of large arrays one statement may build.
DEFAULT_MAX_MEMORY = 2**30


class _MemoryBudget:
    """One statement's memory budget: its limit and what it has reserved so far."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0


#: The memory budget of the statement being compiled or planned in this thread, or None.
_MEMORY: contextvars.ContextVar[_MemoryBudget | None] = contextvars.ContextVar("dpgate_memory", default=None)


@contextmanager
def memory_budget(nbytes: int) -> Iterator[None]:
    """Within the block, compiling and planning may build large arrays (query weight grids, the
    grids of the atoms and of the per-cell costs) of at most ``nbytes`` in all; beyond, they
    refuse the statement (:func:`reserve_memory`).  A block inside another keeps the outer
    one's budget (one statement, one budget)."""
    if _MEMORY.get() is not None:
        yield
        return
    token = _MEMORY.set(_MemoryBudget(int(nbytes)))
    try:
        yield
    finally:
        _MEMORY.reset(token)


def reserve_memory(nbytes: int, what: str, *, transient: bool = False) -> None:
    """Count ``nbytes`` — ``what``, about to be built — against this thread's statement's
    :func:`memory_budget` (outside one, against :data:`DEFAULT_MAX_MEMORY` alone).

    The count is of every large array the statement builds for planning, freed or not: an
    upper bound on its working memory.  A ``transient`` array (a query's weights while it
    is compiled: the compiler bounds what a statement keeps, ``MAX_WIDE_BOXES``) must fit
    in what is left but is not counted.  Refusing happens before the array is built and
    before anything is read or spent, and the gateway's live state is untouched
    (statements are planned on copies).

    Raises:
        QueryTooComplex: the statement would pass its budget.
    """
    budget = _MEMORY.get()
    used, limit = (0, DEFAULT_MAX_MEMORY) if budget is None else (budget.used, budget.limit)
    if used + nbytes > limit:
        raise QueryTooComplex(
            f"this statement would build {what} of {nbytes / 2**20:,.0f} MiB, beyond its memory budget of "
            f"{limit / 2**20:,.0f} MiB ({used / 2**20:,.0f} MiB used so far; nothing was read or spent); "
            "group by fewer or coarser columns, use fewer distinct range boundaries, or raise the "
            "budget with Gateway(max_memory=...) / connect(max_memory=...)."
        )
    if budget is not None and not transient:
        budget.used += nbytes
