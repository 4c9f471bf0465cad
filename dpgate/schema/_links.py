"""How tables link: declared join paths (``references``), public dimension tables, key columns.

A table may declare

* ``references: {customer_id: customers.id}`` — the join path ``table.customer_id =
  customers.id``; the referenced column must be the referenced table's ``privacy_unit``
  (the same person: the referencing column must then be this table's own privacy unit), or
  the declared ``key`` of a public table (a lookup: ``references: {carrier: airlines.carrier}``);
* ``public: true`` — a dimension table (a calendar, a product catalogue) whose rows are
  public: joins with it are lookups, and its ``key: <column>`` is unique (checked on the data
  at the first join, which may read a public table); queried alone it is refused (read it
  from the database directly: it needs no privacy);
* columns of ``{type: key}`` — identifiers used only to join (a unit, a foreign key, a public
  key): like the privacy unit they need no domain and are never grouped on, filtered on or
  returned, so they are not among the table's queryable columns.

Which joins a query may write, and the table they make, are :mod:`dpgate.schema._joins`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpgate.errors import SchemaError

__all__ = ["Links", "Reference", "check_links", "is_key_column", "links_declaration"]


@dataclass(frozen=True)
class Reference:
    """One declared join path ``<table>.column = target.target_column`` (names as declared)."""

    column: str
    target: str
    target_column: str


@dataclass(frozen=True)
class Links:
    """A table's join declarations.

    Attributes:
        references: the declared join paths from this table.
        public: the table's rows are public (a dimension table).
        key: a public table's unique lookup column, or None.
        keys: physical columns declared ``{type: key}`` (join identifiers, not queryable), but the unit.
    """

    references: tuple[Reference, ...] = ()
    public: bool = False
    key: str | None = None
    keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The declaration keys (only those declared, so that older schemas keep their fingerprint)."""
        out: dict[str, Any] = {}
        if self.references:
            out["references"] = {r.column: f"{r.target}.{r.target_column}" for r in self.references}
        if self.public:
            out["public"] = True
        if self.key is not None:
            out["key"] = self.key
        return out

    def key_columns(self) -> dict[str, dict[str, str]]:
        """The ``{type: key}`` column declarations, as written in the schema file."""
        return {k: {"type": "key"} for k in self.keys}

    def has_physical(self, table: Any, name: str) -> bool:
        """Whether ``name`` is a column of ``table`` (the :class:`Table` of these links) a join may
        use: declared, key or unit."""
        low = name.lower()
        return (table.has_column(name) or any(k.lower() == low for k in self.keys)
                or (table.privacy_unit is not None and table.privacy_unit.lower() == low))


def is_key_column(spec: Any) -> bool:
    """Whether a column declaration is ``{type: key}``."""
    return isinstance(spec, Mapping) and spec.get("type") == "key"


def links_declaration(table: str, spec: Mapping[str, Any]) -> Links:
    """``references``, ``public``, ``key`` and the ``{type: key}`` columns of a table's declaration."""
    where = f"table {table!r}"
    public = spec.get("public", False)
    if not isinstance(public, bool):
        raise SchemaError(f"{where}: public must be true or false, got {str(public)[:80]!r}.")
    key = spec.get("key")
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise SchemaError(f"{where}: key must name one column (key: <column>), got {str(key)[:80]!r}.")
    if key is not None and not public:
        raise SchemaError(
            f"{where}: key declares the unique lookup column of a public table; add 'public: true' (its rows are "
            "then public), or drop key (a table with people's rows is joined by its privacy_unit)."
        )
    if public and any(k in spec for k in ("privacy_unit", "max_rows_per_unit", "max_rows_per_individual", "references")):
        raise SchemaError(
            f"{where}: a public table holds no one's rows, so it declares no privacy_unit, max_rows_per_unit or "
            "references; other tables reference its key (references: {column: " + f"{table}.<key>" + "})."
        )
    refs = spec.get("references", {})
    if not isinstance(refs, Mapping):
        raise SchemaError(
            f"{where}: references must map a column to the column it joins, e.g. "
            "references: {customer_id: customers.id}, got " + f"{str(refs)[:80]!r}."
        )
    out = []
    for col, target in refs.items():
        if not isinstance(target, str) or target.count(".") != 1 or not all(p.strip() for p in target.split(".")):
            raise SchemaError(
                f"{where}: references.{col} must be '<table>.<column>' (e.g. customers.id), got {str(target)[:80]!r}."
            )
        t, c = target.split(".")
        out.append(Reference(str(col), t.strip(), c.strip()))
    columns, unit = spec.get("columns", {}), str(spec.get("privacy_unit")).lower()
    # The unit is kept apart (Table.privacy_unit), as before keys existed: the same fingerprint.
    keys = (tuple(str(n) for n, c in columns.items() if is_key_column(c) and str(n).lower() != unit)
            if isinstance(columns, Mapping) else ())
    return Links(tuple(out), public, key, keys)


def check_links(tables: Sequence[Any]) -> None:
    """Refuse references that do not name a declared path to a person or a public key."""
    by_name = {t.name.lower(): t for t in tables}
    for t in tables:
        if t.links.key is not None and not t.links.has_physical(t, t.links.key):
            raise SchemaError(
                f"table {t.name!r}: its key {t.links.key!r} is not one of its columns; declare it under columns "
                f"(e.g. {t.links.key}: " + "{type: key})."
            )
    for t in tables:
        seen: set[str] = set()
        for r in t.links.references:
            path = f"{t.name}.{r.column} → {r.target}.{r.target_column}"
            if r.column.lower() in seen:
                raise SchemaError(f"table {t.name!r}: column {r.column!r} references two tables; keep one.")
            seen.add(r.column.lower())
            if not t.links.has_physical(t, r.column):
                raise SchemaError(
                    f"table {t.name!r}: references {path}, but {r.column!r} is not one of its columns; declare it "
                    f"(e.g. {r.column}: " + "{type: key})."
                )
            target = by_name.get(r.target.lower())
            if target is None:
                raise SchemaError(
                    f"table {t.name!r}: references {path}, but table {r.target!r} is not declared; declared tables: "
                    f"{[x.name for x in tables]}."
                )
            if target is t:
                raise SchemaError(f"table {t.name!r}: references {path}, itself; self-joins are not supported.")
            unit = target.privacy_unit
            if unit is not None and unit.lower() == r.target_column.lower():
                if t.privacy_unit is None or t.privacy_unit.lower() != r.column.lower():
                    mine = f"its privacy unit is {t.privacy_unit!r}" if t.privacy_unit else "it declares no privacy_unit"
                    raise SchemaError(
                        f"table {t.name!r}: references {path}, the privacy unit of {target.name!r} (a person), but "
                        f"{mine}; a reference to a person must come from the table's own unit: declare "
                        f"'privacy_unit: {r.column}' on {t.name!r}, or reference a public table's key instead."
                    )
                continue
            if target.links.public and target.links.key is not None and target.links.key.lower() == r.target_column.lower():
                continue
            what = (f"the public table's key is {target.links.key!r}" if target.links.public and target.links.key
                    else "it is public but declares no key" if target.links.public
                    else f"its privacy unit is {unit!r}" if unit else "it is neither public nor has a privacy_unit")
            raise SchemaError(
                f"table {t.name!r}: references {path}, but {r.target_column!r} is neither {target.name!r}'s privacy "
                f"unit nor the key of a public table ({what}); reference {target.name}'s privacy_unit, or declare "
                f"'public: true' and 'key: {r.target_column}' on {target.name!r} if its rows are public."
            )
