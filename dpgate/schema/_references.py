"""Declared join paths and public tables: the keys ``references``, ``public`` and ``key``, stored and checked.

**Minimal, and provisional**: this module only accepts and validates the declaration keys that
declared joins (issue 30, item 4) will read; nothing in the compiler reads them yet, so a query
still names one table, and a public table is still answered like a row-level one (charged).
The joins work may replace it::

    tables:
      flights:
        privacy_unit: tailnum
        max_rows_per_unit: 250
        references: {tailnum: planes.tailnum, carrier: airlines.carrier}   # column -> table.column
      planes:
        privacy_unit: tailnum          # one row per unit: a reference target
        max_rows_per_unit: 1
      airlines:
        public: true                   # a public dimension (a lookup table)
        key: carrier                   # the column identifying its rows: a reference target

A reference's column is one of the table's declared columns or its privacy unit; its target
is ``table.column`` where the column is that table's ``key`` or its privacy unit.  A public
table declares no privacy unit.  ``key`` names a physical column; like the unit it needs no
domain unless it is also declared under ``columns``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from dpgate.errors import SchemaError

__all__ = ["reference_declaration", "check_references", "reference_keys"]

#: Longest name in a reference or a key (names are echoed in messages).
_MAX_NAME = 256


class Table(Protocol):
    """What this module reads of a :class:`dpgate.schema.tables.Table` (which imports it)."""

    @property
    def name(self) -> str: ...
    @property
    def privacy_unit(self) -> str | None: ...
    @property
    def references(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def public(self) -> bool: ...
    @property
    def key(self) -> str | None: ...

    def has_column(self, name: str) -> bool: ...


def _name(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip()) and len(v) <= _MAX_NAME and "\x00" not in v and v.isprintable()


def reference_declaration(table: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """``references``, ``public`` and ``key`` of a table's declaration, as ``Table`` keywords.

    Raises:
        SchemaError: a key of the wrong shape, with what to write instead.
    """
    where = f"table {table!r}"
    out: dict[str, Any] = {}
    if "public" in spec:
        if not isinstance(spec["public"], bool):
            raise SchemaError(f"{where}: public must be true or false, got {str(spec['public'])[:40]!r}.")
        out["public"] = spec["public"]
    if "key" in spec:
        if not _name(spec["key"]):
            raise SchemaError(f"{where}: key must name the column identifying its rows (e.g. key: carrier), "
                              f"got {str(spec['key'])[:40]!r}.")
        out["key"] = spec["key"]
    if "references" in spec:
        refs = spec["references"]
        if not isinstance(refs, Mapping) or not refs:
            raise SchemaError(f"{where}: references must map a column to 'table.column', e.g. "
                              "references: {customer_id: customers.id}.")
        pairs = []
        for col, target in refs.items():
            parts = target.split(".") if isinstance(target, str) else []
            if not _name(col) or len(parts) != 2 or not all(_name(p) for p in parts):
                raise SchemaError(f"{where}: references {str(col)[:40]!r}: {str(target)[:60]!r} must be written "
                                  "'table.column' (e.g. customer_id: customers.id).")
            pairs.append((str(col), str(target)))
        out["references"] = tuple(pairs)
    return out


def check_references(tables: Iterable[Table]) -> None:
    """Every reference of every table starts at a declared column or the unit and ends at a
    declared table's key or unit; no public table declares a privacy unit.

    Raises:
        SchemaError: naming the reference and what it may point to.
    """
    by_name = {t.name.lower(): t for t in tables}
    for t in by_name.values():
        if t.public and t.privacy_unit is not None:
            raise SchemaError(f"table {t.name!r}: a public table holds no one's data, so it declares no privacy_unit; "
                              "drop 'public: true' or 'privacy_unit'.")
        for col, target in t.references:
            if not t.has_column(col) and (t.privacy_unit or "").lower() != col.lower():
                raise SchemaError(f"table {t.name!r}: references {col!r}, which is neither a declared column nor its "
                                  "privacy_unit; declare the column first.")
            tname, tcol = target.split(".")
            if tname.lower() == t.name.lower():
                raise SchemaError(f"table {t.name!r}: references {col!r} -> {target!r} points at the table itself; "
                                  "a reference joins two tables: name another one.")
            other = by_name.get(tname.lower())
            if other is None:
                raise SchemaError(f"table {t.name!r}: references {col!r} -> {target!r}, but no table {tname!r} is "
                                  f"declared; declared tables: {sorted(x.name for x in by_name.values())}.")
            ends = [c for c in (other.key, other.privacy_unit) if c is not None]
            if tcol.lower() not in (c.lower() for c in ends):
                raise SchemaError(
                    f"table {t.name!r}: references {col!r} -> {target!r}, but {tcol!r} is not the key of "
                    f"{other.name!r} (its key: {other.key!r}, its privacy_unit: {other.privacy_unit!r}); a reference "
                    f"ends at a column identifying one row: declare 'key: {tcol}' on {other.name!r}."
                )


def reference_keys(table: Table) -> dict[str, Any]:
    """The declaration's ``references`` / ``public`` / ``key``, only those set (so that a schema
    declaring none keeps its fingerprint and its ledgers)."""
    out: dict[str, Any] = {}
    if table.references:
        out["references"] = dict(table.references)
    if table.public:
        out["public"] = True
    if table.key is not None:
        out["key"] = table.key
    return out
