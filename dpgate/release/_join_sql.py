"""The relation a declared join reads: each table bounded first, then joined.

**Internal.**  For a :class:`~dpgate.schema._joins.JoinedTable` the cube reads::

    SELECT t0."a" AS "dpgate_j0", …, t1."age" AS "dpgate_j5", …
    FROM (<the fact table, at most k rows per unit>) AS t0
    JOIN (<a unit table, at most 1 row per unit>) AS t1 ON t0."customer_id" = t1."id"
    JOIN <a public table> AS t2 ON t0."shop" = t2."code"

Each unit table is bounded by the same keyed-hash order as its single-table queries
(:func:`dpgate.release._bounding.bounded_table`), *before* the join: a person's rows in
the join are their kept fact rows, each joined with at most one row of every other table,
so adding or removing a person changes at most ``k`` rows of the join, all theirs — what the
join's charge ``k·max_j B_j`` assumes (``docs/privacy_unit.md``, "Joins").  Public tables
are read as they are; their keys must be unique (:func:`duplicate_keys`, run on the public
table before its first join: a key on two rows would join a person's row twice).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from dpgate.errors import SchemaError
from dpgate.release._bounding import bounded_table
from dpgate.release._cube_sql import BoundColumn
from dpgate.schema._joins import JoinedTable
from dpgate.schema.domains import Schema

__all__ = ["duplicate_keys", "joined_relation"]


def _physical(found: Mapping[str, tuple[str, str]], table: str, name: str) -> str:
    hit = found.get(name.lower())
    if hit is None:
        raise SchemaError(
            f"table {table!r} joins on column {name!r}, but the data source has no column of that name; "
            "add it to the source, or fix the declared references."
        )
    return hit[0]


def duplicate_keys(ref: exp.Table, key: str) -> exp.Select:
    """``SELECT n``: how many values of the public table's ``key`` occur on several rows."""
    col = exp.column(key, quoted=True)
    dup = (exp.select(col.copy()).from_(ref.copy()).where(exp.Not(this=exp.Is(this=col.copy(), expression=exp.Null())))
           .group_by(col.copy()).having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1))))
    return exp.select(exp.alias_(exp.Count(this=exp.Star()), "n")).from_(dup.subquery("dpgate_dup"))


def public_keys(jt: JoinedTable, schema: Schema, found: Mapping[str, Mapping[str, tuple[str, str]]]) -> list[tuple[str, str]]:
    """``(table, physical key)`` of every public table the join reads."""
    out = []
    for e in jt.edges:
        t = schema.table(e.target)
        if t.links.public:
            out.append((t.name, _physical(found[t.name.lower()], t.name, e.target_column)))
    return out


def joined_relation(
    jt: JoinedTable,
    schema: Schema,
    tables: Mapping[str, tuple[exp.Table, dict[str, BoundColumn]]],
    units: Mapping[str, str],
    found: Mapping[str, Mapping[str, tuple[str, str]]],
    key: str,
    dialect: str,
) -> tuple[exp.Subquery, dict[str, BoundColumn]]:
    """The join's relation (module docstring) and its columns bound to it.

    ``tables``, ``units``, ``found``: the cube's per-table references and bound columns,
    physical unit columns and catalog columns (lower-cased table names).
    """
    names = list(jt.tables)
    alias = {n.lower(): f"t{i}" for i, n in enumerate(names)}
    needs: dict[str, list[str]] = {n.lower(): [] for n in names}
    for e in jt.edges:
        needs[e.table.lower()].append(_physical(found[e.table.lower()], e.table, e.column))
        needs[e.target.lower()].append(_physical(found[e.target.lower()], e.target, e.target_column))
    rels: dict[str, exp.Expr] = {}
    for n in names:
        low = n.lower()
        t = schema.table(n)
        ref, cols = tables[low]
        unit = units.get(low)
        if unit is None:  # a public table, or a row-level fact table: read as is
            rels[low] = exp.alias_(ref.copy(), alias[low], table=True)
            continue
        k = t.bound() if low == jt.root.lower() else 1  # the fact table's bound; one row of the others
        carry = [unit, *needs[low]]
        rels[low] = bounded_table(ref, alias[low], unit, [cols[c.name.lower()] for c in t.columns], k, key, dialect,
                                  carry=carry)
    select_items: list[exp.Expr] = []
    bound: dict[str, BoundColumn] = {}
    for i, (col, (tname, cname)) in enumerate(zip(jt.columns, jt.sources, strict=True)):
        src = tables[tname.lower()][1][cname.lower()]
        out = f"dpgate_j{i}"
        select_items.append(exp.alias_(exp.column(src.name, table=alias[tname.lower()], quoted=True), out, quoted=True))
        bound[col.name.lower()] = BoundColumn(col, out, src.tclass, dialect)
    q = exp.select(*select_items, copy=False).from_(rels[names[0].lower()], copy=False)
    for e in jt.edges:
        on = exp.EQ(
            this=exp.column(_physical(found[e.table.lower()], e.table, e.column), table=alias[e.table.lower()], quoted=True),
            expression=exp.column(_physical(found[e.target.lower()], e.target, e.target_column),
                                  table=alias[e.target.lower()], quoted=True),
        )
        q = q.join(rels[e.target.lower()], on=on, join_type="inner", copy=False)
    return q.subquery("dpgate_join", copy=False), bound
