"""Contribution bounding: at most ``k`` rows per privacy unit, in every statement the cube runs.

**Internal.**  A table that declares ``privacy_unit: u`` and ``max_rows_per_unit: k``
(:mod:`dpgate.schema._unit`) is never read directly: every generated statement reads
this derived table instead::

    SELECT <declared columns> FROM (
        SELECT <declared columns>,
               ROW_NUMBER() OVER (PARTITION BY u ORDER BY MD5('<key>' || ',' || <cells of the row>)) AS rank
        FROM <table> WHERE u IS NOT NULL
    ) WHERE rank <= k

Why this order.  Which rows of a person are kept must not depend on the query, or two
answers would measure two different tables and the BLUE could not combine them: the
order is a keyed hash of the row, the same in every statement, process and session of a
ledger (the key is derived from the ledger's key, :func:`row_order_key`).  It is secret,
so an analyst cannot predict which rows count; the guarantee does not rest on that
secrecy, though: for any fixed key, a person's kept rows are a function of their own
rows only, so adding or removing a person adds or removes at most ``k`` rows of the
bounded table, in at most ``k`` cells — what the charge ``k·max_j B_j`` assumes.

What is hashed.  Each declared column enters as text every engine writes alike: integer
columns as their digits, text categoricals as the MD5 of their text, and the others
(floating-point, decimal, boolean, text read as numbers) as their *cell*; ``N`` for NULL.
Each part determines the column's cell, so rows that hash alike are equal on every cell —
interchangeable for every query — and ties, which ``ROW_NUMBER`` breaks arbitrarily,
cannot change any count.  The hash is MD5 on all three
engines and the hex digests are compared bytewise (``COLLATE "C"`` on PostgreSQL), so
DuckDB, PostgreSQL and Spark keep the same rows of the same data.

Rows whose unit is NULL belong to no known person and are dropped: kept, they would be
one pseudo-person whose ``k`` rows could change when anyone's unknown rows do.

The key appears in the SQL text the engine receives (and in its statement log, if
kept); the engine's operator sees the raw data anyway.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from sqlglot import exp

from dpgate.errors import SchemaError
from dpgate.release._cube_sql import BoundColumn, number, sql_type
from dpgate.schema.tables import Table

__all__ = ["ROW_ORDER", "bounded_table", "row_order_key", "unit_column"]

#: What a ledger's key is bound to when it orders rows (domain separation from its MACs):
#: the gateway passes ``Ledger.derived_key(ROW_ORDER)`` to ``Cube.order_rows``.
ROW_ORDER = b"dpgate: order of a privacy unit's rows v1"


def row_order_key(secret: bytes) -> str:
    """The hex key written into the SQL, derived from a secret (HMAC-SHA256): hex digits only."""
    return hmac.new(secret, ROW_ORDER, hashlib.sha256).hexdigest()


def unit_column(table: Table, found: Mapping[str, tuple[str, str]]) -> str:
    """The physical name of ``table``'s privacy-unit column among the source's ``found`` columns.

    Raises:
        SchemaError: the source has no such column.
    """
    assert table.privacy_unit is not None
    hit = found.get(table.privacy_unit.lower())
    if hit is None:
        raise SchemaError(
            f"table {table.name!r} declares privacy_unit {table.privacy_unit!r}, but the data source has no "
            f"column of that name; name the column that identifies a person in {table.name!r}, or add it to the source."
        )
    return hit[0]


def _part(col: BoundColumn) -> exp.Expression:
    """One column's contribution to the hashed text (never NULL, never containing ``,``)."""
    null = exp.Literal.string("N")
    if col.decl.kind == "categorical" and col.tclass == "other":
        return exp.Coalesce(this=exp.MD5(this=col.value()), expressions=[null])
    if col.tclass == "int":  # its digits: the same on every engine, and no per-row CASE over many cells
        return exp.Coalesce(this=exp.Cast(this=col.raw(), to=sql_type("VARCHAR")), expressions=[null])
    return exp.Cast(this=col.cell_index(), to=sql_type("VARCHAR"))


def bounded_table(
    ref: exp.Table, alias: str, unit: str, columns: Sequence[BoundColumn], k: int, key: str, dialect: str
) -> exp.Subquery:
    """The table ``ref`` with at most ``k`` rows per ``unit`` (see the module docstring), as a
    derived table named ``alias`` exposing the physical ``columns`` under their own names."""
    text: exp.Expression = exp.Literal.string(key)
    for col in columns:
        text = exp.DPipe(this=exp.DPipe(this=text, expression=exp.Literal.string(",")), expression=_part(col))
    order: exp.Expression = exp.MD5(this=text)
    if dialect == "postgres":  # a locale's collation could order hex digits otherwise
        order = exp.Collate(this=order, expression=exp.Identifier(this="C", quoted=True))
    taken = {c.name.lower() for c in columns} | {unit.lower()}
    rank = next(n for n in (f"dpgate_rank_{i}" for i in range(len(taken) + 1)) if n not in taken)
    window = exp.Window(this=exp.RowNumber(), partition_by=[exp.column(unit, quoted=True)],
                        order=exp.Order(expressions=[exp.Ordered(this=order)]))
    raw = [c.raw() for c in columns]
    known = exp.Not(this=exp.Is(this=exp.column(unit, quoted=True), expression=exp.Null()))
    ranked = (exp.select(*raw, exp.alias_(window, rank, quoted=True), copy=False)
              .from_(ref.copy(), copy=False).where(known, copy=False))
    kept = (exp.select(*[c.raw() for c in columns], copy=False)
            .from_(ranked.subquery("dpgate_ranked", copy=False), copy=False)
            .where(exp.LTE(this=exp.column(rank, quoted=True), expression=number(k)), copy=False))
    return kept.subquery(exp.to_identifier(alias, quoted=True), copy=False)
