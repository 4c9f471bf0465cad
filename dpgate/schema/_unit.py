"""A table's privacy unit: the column identifying a person, and the public bound on their rows.

A table may declare ``privacy_unit: user_id`` (the physical column identifying a person)
and ``max_rows_per_unit: k``; dpgate then keeps at most ``k`` rows per person in every
query it runs (:mod:`dpgate.release._bounding`) and multiplies every charge by ``k``.
The unit column is *not* a queryable column: it needs no public domain, and it is never
grouped on, filtered on or returned.  A declaration file may list it under ``columns``
(its domain is then ignored); a ``Table`` never holds it among its columns.  A
table without a unit is row-level (one row per person), as before.

``max_rows_per_individual: k`` (the unchecked bound of earlier versions) still loads,
with a :class:`DeprecationWarning`; declaring it together with ``max_rows_per_unit`` is
refused.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from dpgate.errors import SchemaError
from dpgate.schema._links import is_key_column

__all__ = ["MAX_ROWS_PER_UNIT", "check_unit", "frame_unit", "queryable_columns", "unit_declaration"]

#: Largest ``max_rows_per_unit``: every charge is multiplied by it, so a bound this large
#: already makes each release cost a million times its budget.
MAX_ROWS_PER_UNIT = 1_000_000
#: Longest privacy-unit column name (names are echoed in messages and written into SQL).
_MAX_NAME = 256


def _shown(v: Any) -> str:
    """A short ``repr(v)`` (an integer too long to print is described, not printed)."""
    if isinstance(v, int) and v.bit_length() > 256:
        return f"an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 80 else text[:79] + "…"


def check_unit(table: str, unit: Any, k: Any, columns: Sequence[str]) -> None:
    """Refuse a malformed unit declaration with a message that says what to write."""
    where = f"table {table!r}"
    key = "max_rows_per_unit" if unit is not None else "max_rows_per_unit (max_rows_per_individual)"
    if k is None and unit is not None:  # declared without its bound: queries are refused (Table.bound)
        pass
    elif isinstance(k, bool) or not isinstance(k, int) or k < 1:  # True is an int, but not a count
        raise SchemaError(f"{where}: {key} must be an integer ≥ 1, got {_shown(k)}.")
    elif k > MAX_ROWS_PER_UNIT:
        raise SchemaError(
            f"{where}: {key} is {_shown(k)}, above the limit of {MAX_ROWS_PER_UNIT}: every charge is multiplied "
            "by it, so no useful answer could be afforded; aggregate the table to fewer rows per person "
            "first (e.g. one row per person and day) and declare that bound."
        )
    if unit is None:
        return
    if not isinstance(unit, str) or not unit.strip() or len(unit) > _MAX_NAME or "\x00" in unit:
        raise SchemaError(
            f"{where}: privacy_unit must name the column identifying a person (a non-empty name of at most "
            f"{_MAX_NAME} characters, e.g. privacy_unit: user_id), got {_shown(unit)}."
        )
    try:
        unit.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemaError(f"{where}: privacy_unit must be a valid Unicode name, got {_shown(unit)}.") from None
    if unit.lower() in (c.lower() for c in columns):
        raise SchemaError(
            f"{where}: the privacy unit {unit!r} is also one of the table's columns; leave it out of them. "
            "The column identifying a person needs no domain and is never grouped on, filtered on or returned."
        )


def queryable_columns(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A table declaration's ``columns`` without its privacy unit: listing the unit there (as
    SmartNoise's ``private_id`` column is) is accepted and its domain ignored, since the unit is
    never grouped on, filtered on or returned."""
    unit, columns = spec.get("privacy_unit"), spec["columns"]
    unit = unit.lower() if isinstance(unit, str) else None
    # ``{type: key}`` columns join tables (dpgate.schema._links): like the unit, never queryable.
    return {name: c for name, c in columns.items() if str(name).lower() != unit and not is_key_column(c)}


def frame_unit(table: str, unit: Any, k: Any, legacy: Any) -> dict[str, Any]:
    """``Schema.from_dataframe``'s unit keywords as ``Table`` keywords (the same rules as a file's:
    :func:`unit_declaration`; ``max_rows_per_individual=1`` is its default, not a declaration)."""
    spec: dict[str, Any] = {} if unit is None else {"privacy_unit": unit}
    if k is not None:
        spec["max_rows_per_unit"] = k
    if legacy != 1:
        spec["max_rows_per_individual"] = legacy
    return unit_declaration(table, spec)


def unit_declaration(table: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """``privacy_unit`` and ``max_rows_per_unit`` of a table's declaration, as ``Table`` keywords.

    Raises:
        SchemaError: both bounds are declared, or ``max_rows_per_unit`` without a unit.
    """
    unit = spec.get("privacy_unit")
    if "max_rows_per_unit" in spec and "max_rows_per_individual" in spec:
        raise SchemaError(
            f"table {table!r}: declares both max_rows_per_unit and max_rows_per_individual; keep only "
            "max_rows_per_unit (with privacy_unit), which replaces max_rows_per_individual."
        )
    if "max_rows_per_individual" in spec:
        k = spec["max_rows_per_individual"]
        instead = f"privacy_unit: {unit}" if unit is not None else "privacy_unit: <column identifying a person>"
        warnings.warn(
            f"table {table!r}: max_rows_per_individual is deprecated and unchecked; write '{instead}' and "
            f"'max_rows_per_unit: {_shown(k)}' instead, so that dpgate enforces the bound.",
            DeprecationWarning,
            stacklevel=4,
        )
        return {"privacy_unit": unit, "max_rows_per_unit": k}
    if "max_rows_per_unit" in spec and unit is None:
        raise SchemaError(
            f"table {table!r}: max_rows_per_unit bounds the rows of each person, so it needs "
            "'privacy_unit: <column identifying a person>'; without one a table has one row per person."
        )
    # A unit without its bound loads (k None), but every query on the table is refused (Table.bound).
    return {"privacy_unit": unit, "max_rows_per_unit": spec.get("max_rows_per_unit", None if unit is not None else 1)}
