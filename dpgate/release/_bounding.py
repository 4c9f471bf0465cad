"""Contribution bounding: at most ``k`` rows per privacy unit, in every statement the cube runs.

**Internal.**  A table that declares ``privacy_unit: u`` and ``max_rows_per_unit: k``
(:mod:`dpgate.schema._unit`) is never read directly: every generated statement reads
this derived table instead::

    SELECT <declared columns> FROM (
        SELECT <declared columns>,
               ROW_NUMBER() OVER (PARTITION BY u ORDER BY MD5('<key>' || ',' || <the row's values>)) AS rank
        FROM <table> WHERE u IS NOT NULL
    ) WHERE rank <= k

(computed without ranking the rows of units that have at most ``k``: those units are found by
one ``GROUP BY u HAVING COUNT(*) > k``, the other units' rows are kept by an anti-join, and only
theirs are ranked, :func:`bounded_table`).

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
cannot change any count.  The hash is MD5 on all three engines and the hex digests are
compared bytewise (``COLLATE "C"`` on PostgreSQL), so DuckDB, PostgreSQL and Spark keep
the same rows of the same data.

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
    ref: exp.Table, alias: str, unit: str, columns: Sequence[BoundColumn], k: int, key: str, dialect: str,
    carry: Sequence[str] = (),
) -> exp.Subquery:
    """The table ``ref`` with at most ``k`` rows per ``unit`` (see the module docstring), as a
    derived table named ``alias`` exposing the physical ``columns`` under their own names.

    ``carry``: for a join (:mod:`dpgate.release._join_sql`), physical key columns exposed too,
    with the unit.  Rows are still ranked by the hash of their declared columns — the same kept
    cells as without them, so one bounded table for single-table and joined queries — and ties
    (rows equal on every declared cell) broken by a second hash that includes the keys, so that
    which key a kept row joins with is a function of the unit's own rows too.

    Units with at most ``k`` rows keep them all without hashing or sorting anything (the
    ``ROW_NUMBER`` would keep them all too); only the others' rows are ranked.  With ``k``
    at a high percentile of rows per person, as the README advises, that is a few rows, and
    a statement costs a fraction of ranking every row (2 M rows, 10 per person on average, k = 15:
    0.2 s instead of 1.2 s on DuckDB; with most units above k it costs as much as ranking all).
    The heavy units come from one aggregate rather than a per-row ``COUNT(*) OVER (PARTITION BY
    u)``, which engines evaluate once per branch of the union (20 M rows, 2 M units: 1.75 s for the
    aggregate, 4.2 s for the window; benchmarks/README.md, "bench_join.py").
    """
    text: exp.Expression = exp.Literal.string(key)
    for col in columns:
        text = exp.DPipe(this=exp.DPipe(this=text, expression=exp.Literal.string(",")), expression=_part(col))
    taken = {c.name.lower() for c in columns} | {unit.lower()}
    extra = [x for x in dict.fromkeys(carry) if x.lower() not in taken]
    taken |= {x.lower() for x in extra}
    orders: list[exp.Expression] = [exp.MD5(this=text)]
    if extra:  # ties of the declared cells broken by the keys (docstring)
        tie = text.copy()
        for x in extra:
            part = exp.Coalesce(this=exp.MD5(this=exp.Cast(this=exp.column(x, quoted=True), to=sql_type("VARCHAR"))),
                                expressions=[exp.Literal.string("N")])
            tie = exp.DPipe(this=exp.DPipe(this=tie, expression=exp.Literal.string(",")), expression=part)
        orders.append(exp.MD5(this=tie))
    if dialect == "postgres":  # a locale's collation could order hex digits otherwise
        orders = [exp.Collate(this=o, expression=exp.Identifier(this="C", quoted=True)) for o in orders]
    rows, rank = [n for n in (f"dpgate_{i}" for i in range(len(taken) + 2)) if n not in taken][:2]

    def raw() -> list[exp.Expression]:
        return [c.raw() for c in columns] + [exp.column(x, quoted=True) for x in extra]

    def out() -> list[exp.Expression]:  # what the bounded table exposes (a join's: its keys and unit too)
        return raw() + ([exp.column(unit, quoted=True)] if carry else [])

    def unit_col() -> exp.Expression:
        return exp.column(unit, quoted=True)

    known = exp.Not(this=exp.Is(this=unit_col(), expression=exp.Null()))
    # The units with more than k rows: one aggregate (cheaper than a per-row window count), few rows.
    heavy_units = (exp.select(exp.alias_(unit_col(), rows, quoted=True), copy=False).from_(ref.copy(), copy=False)
                   .where(known.copy(), copy=False).group_by(unit_col(), copy=False)
                   .having(exp.GT(this=exp.Count(this=exp.Star()), expression=number(k)), copy=False))

    def heavy() -> exp.Expression:
        return heavy_units.subquery("dpgate_heavy", copy=True)

    def heavy_unit() -> exp.Expression:
        return exp.column(rows, table="dpgate_heavy", quoted=True)

    # Rows of the other units, all kept: an anti-join (a LEFT JOIN that finds no heavy unit).
    light = (exp.select(*out(), copy=False).from_(ref.copy(), copy=False)
             .join(heavy(), on=exp.EQ(this=unit_col(), expression=heavy_unit()), join_type="left", copy=False)
             .where(exp.and_(known.copy(), exp.Is(this=heavy_unit(), expression=exp.Null()), copy=False), copy=False))
    window = exp.Window(this=exp.RowNumber(), partition_by=[unit_col()],
                        order=exp.Order(expressions=[exp.Ordered(this=o) for o in orders]))
    ranked = (exp.select(*out(), exp.alias_(window, rank, quoted=True), copy=False).from_(ref.copy(), copy=False)
              .join(heavy(), on=exp.EQ(this=unit_col(), expression=heavy_unit()), join_type="inner", copy=False))
    kept = (exp.select(*out(), copy=False).from_(ranked.subquery("dpgate_ranked", copy=False), copy=False)
            .where(exp.LTE(this=exp.column(rank, quoted=True), expression=number(k)), copy=False))
    both = exp.union(light, kept, distinct=False, copy=False)
    return exp.Subquery(this=both, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
