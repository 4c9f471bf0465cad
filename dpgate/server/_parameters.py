"""The types and valid dummy values of a statement's ``$n`` parameters, for Describe before Bind.

A client that prepares a statement without typing its parameters (OID 0 / ``unknown``) learns
their types from ParameterDescription; psycopg and pg8000 then send values of those types.  A
parameter compared with a declared column gets the column's type (``int8``, ``text``, ``bool``)
and a value of its domain; one inside a cast (``$1::int8``, ``CAST($1 AS BIGINT)``, as
SQLAlchemy writes ``%(age_1)s::BIGINT``) gets the cast's type — never the empty string, which
the compiler refuses as a number.
"""

from __future__ import annotations

from typing import Any

import sqlglot
from sqlglot import exp

from dpgate import errors
from dpgate.compile.statement import check_statement, dialect_of
from dpgate.schema._temporal import granule_start, iso
from dpgate.server._values import BOOL, FLOAT8, INT8, TEXT

__all__ = ["infer_parameters", "KINDS_OID"]

# Date/timestamp keys as ISO text (a GROUP BY EXTRACT(…) of a date column has integer keys).
KINDS_OID = {"integer": INT8, "categorical": TEXT, "binned": TEXT, "boolean": BOOL, "date": TEXT, "timestamp": TEXT}


def _cast_guess(cast: exp.Cast) -> tuple[int, Any] | None:
    """The type OID and a dummy value of a parameter cast to a numeric or boolean type (None: another type)."""
    to = cast.to
    if to.is_type(*exp.DataType.INTEGER_TYPES):
        return INT8, 0
    if to.is_type(*exp.DataType.REAL_TYPES):
        return FLOAT8, 0.0
    if to.is_type(exp.DataType.Type.BOOLEAN):
        return BOOL, True
    return None


def infer_parameters(sql: str, schema: Any, dialect: str) -> list[tuple[int, Any]]:
    """``(type OID, a valid dummy value)`` per ``$n`` placeholder, from the column it is compared with.

    Raises:
        QueryTooComplex: ``sql`` is beyond the size or nesting limits (checked before it is parsed).
    """
    try:
        check_statement(sql, dialect_of(dialect))
    except errors.QuerySyntaxError:
        return []
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except sqlglot.errors.SqlglotError:
        return []
    holders = [h for h in tree.find_all(exp.Placeholder) if str(h.this or "").isdigit()]
    if not holders:
        return []
    table = None
    src = tree.find(exp.Table)
    if src is not None:
        try:
            table = schema.table(src.name)
        except errors.Error:
            table = None
    out: dict[int, tuple[int, Any]] = {}
    for h in holders:
        guess: tuple[int, Any] = (TEXT, "")
        node: exp.Expression = h
        typed = False  # by its innermost cast: $1::int8, CAST($1 AS BIGINT), ($1)::int8
        while isinstance(node.parent, (exp.Cast, exp.Paren)):
            node = node.parent
            if isinstance(node, exp.Cast) and not typed:
                typed, guess = True, _cast_guess(node) or guess
        parent = node.parent
        if isinstance(parent, (exp.Limit, exp.Offset)):
            guess = (INT8, 1)
        col = parent.find(exp.Column) if parent is not None else None
        if col is not None and table is not None:
            try:
                c = table.column(col.name)
            except errors.Error:
                c = None
            if c is not None and (not typed or guess[0] == KINDS_OID[c.kind]):
                dummy = {"integer": c.min, "binned": c.min, "boolean": True}.get(
                    c.kind, c.values[0] if c.values else iso(granule_start(c.min or 0, c.granularity), c.kind)
                    if c.granularity else "")  # a date column: its first granule
                guess = (KINDS_OID[c.kind], dummy)
        out[int(str(h.this))] = guess
    return [out.get(i, (TEXT, "")) for i in range(1, max(out) + 1)]
