"""The table a declared join makes: a virtual :class:`~dpgate.schema.tables.Table`.

A query may join tables along declared ``references`` (:mod:`dpgate.schema._links`) that
form a tree from one *root* table — the only table no other joined table references, the
fact table (``orders`` in ``orders → customers``, ``flights`` in ``flights → airlines,
planes``).  The join is then one table to every later stage (compiler, cube, ledger):

* its columns are the joined tables' declared columns, each under its own name, or
  ``table.column`` when two joined tables declare that name;
* its privacy unit is the root's, and its bound ``k`` the root's ``max_rows_per_unit``: the
  cube keeps at most ``k`` rows of each person in the root *before* joining, at most one row
  of each person in every other joined unit table (all its units are the root's: a reference
  to a person comes from the referencing table's own unit), and a public table's key is
  unique, so a person has at most ``k`` rows in the join;
* its name says which paths it joins, e.g. ``orders JOIN customers ON orders.customer_id =
  customers.id``: the same name for the same paths however the query writes them (order,
  aliases, ``USING``), so that its answers are one history, charged as one table (see
  ``docs/privacy_unit.md``, "Joins").

:meth:`Schema.table` resolves such a name (:func:`join_named`), so a ledger reopened in a
new process finds the table its records were made on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from dpgate.errors import SchemaError, UnsupportedQuery
from dpgate.schema.tables import Table


class Schema(Protocol):
    """What this module reads of a :class:`dpgate.schema.domains.Schema` (which imports it)."""

    @property
    def tables(self) -> tuple[Table, ...]: ...

    def table(self, name: str) -> Table: ...

__all__ = ["Edge", "JoinedTable", "declared_edges", "join_named", "joined", "paths_text"]


@dataclass(frozen=True)
class Edge:
    """A declared join path ``table.column = target.target_column`` (declared names)."""

    table: str
    column: str
    target: str
    target_column: str

    @property
    def label(self) -> str:
        return f"{self.table}.{self.column} = {self.target}.{self.target_column}"


@dataclass(frozen=True)
class JoinedTable(Table):
    """A join along declared paths, as one table (module docstring).

    Attributes:
        root: the fact table's declared name.
        edges: the joined paths, parents before children.
        sources: per column of the join, ``(table, declared column)`` it is.
        ambiguous: lower-cased names two joined tables declare (written ``table.column``).
    """

    root: str = ""
    edges: tuple[Edge, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()
    ambiguous: tuple[str, ...] = ()

    @property
    def tables(self) -> tuple[str, ...]:
        """The joined tables' declared names, root first."""
        return (self.root, *(e.target for e in self.edges))


def declared_edges(schema: Schema) -> list[Edge]:
    """Every declared join path of the schema."""
    return [Edge(t.name, r.column, schema.table(r.target).name, r.target_column)
            for t in schema.tables for r in t.links.references]


def paths_text(schema: Schema, tables: Sequence[str] = ()) -> str:
    """The declared paths (of ``tables`` when given) as a message fragment."""
    low = {t.lower() for t in tables}
    found = [e.label for e in declared_edges(schema) if not low or e.table.lower() in low or e.target.lower() in low]
    return "declared join paths: " + ("; ".join(found) if found else "none (declare references: {column: table.column})")


def _cache(schema: Schema) -> dict[str, JoinedTable]:
    # A frozen dataclass's __dict__ takes a private cache without changing its fields (eq, fingerprint).
    got: dict[str, JoinedTable] = schema.__dict__.setdefault("_dpgate_joins", {})
    return got


def joined(schema: Schema, edges: Sequence[Edge]) -> JoinedTable:
    """The table the declared paths ``edges`` make (module docstring).

    Raises:
        UnsupportedQuery: the paths do not form a tree from one fact table, or join only public tables.
        SchemaError: the fact table declares a privacy unit without its bound.
    """
    targets = [e.target.lower() for e in edges]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        into = [e.label for e in edges if e.target.lower() in twice]
        raise UnsupportedQuery(
            f"the join reaches table {twice[0]!r} twice ({'; '.join(into)}): a person's rows would be counted once per "
            f"path; join each table once (a self-join or two fact tables sharing a table is not supported), or send "
            f"one query per path. {paths_text(schema, twice)}."
        )
    sources = {e.table.lower() for e in edges}
    roots = sorted(sources - set(targets))
    if len(roots) != 1:
        raise UnsupportedQuery(
            f"the joined paths ({'; '.join(e.label for e in edges)}) do not hang from one fact table; join tables "
            f"along a chain of declared references from one table. {paths_text(schema)}."
        )
    root = schema.table(roots[0])
    order: list[Edge] = []
    frontier = [root.name.lower()]
    while frontier:
        parent = frontier.pop(0)
        for e in sorted((e for e in edges if e.table.lower() == parent), key=lambda e: e.label.lower()):
            order.append(e)
            frontier.append(e.target.lower())
    if len(order) != len(edges):  # a cycle (a → b → a) leaves some paths unreached
        raise UnsupportedQuery(
            f"the joined paths ({'; '.join(e.label for e in edges)}) form a cycle; join each table once. "
            f"{paths_text(schema)}."
        )
    name = root.name + "".join(f" JOIN {e.target} ON {e.label}" for e in order)
    cache = _cache(schema)
    if name in cache:
        return cache[name]
    if root.links.public:
        raise UnsupportedQuery(
            f"{name!r} joins only public tables: their rows are public, so dpgate does not answer them; read them "
            "from the database directly."
        )
    k = root.bound()  # a unit without its bound: refused, naming the fact table
    tables = [root, *(schema.table(e.target) for e in order)]
    counts: dict[str, int] = {}
    for t in tables:
        for c in t.columns:
            counts[c.name.lower()] = counts.get(c.name.lower(), 0) + 1
    ambiguous = tuple(sorted(n for n, m in counts.items() if m > 1))
    cols, src = [], []
    for t in tables:
        for c in t.columns:
            cols.append(replace(c, name=f"{t.name}.{c.name}" if c.name.lower() in ambiguous else c.name))
            src.append((t.name, c.name))
    unit = root.privacy_unit
    if unit is not None and unit.lower() in {c.name.lower() for c in cols}:
        unit = None  # a joined table's column has the unit's name: the join's unit stays internal
    out = JoinedTable(name, tuple(cols), max_rows_per_unit=k, privacy_unit=unit, root=root.name,
                      edges=tuple(order), sources=tuple(src), ambiguous=ambiguous)
    cache[name] = out
    return out


def join_named(schema: Schema, name: str) -> JoinedTable | None:
    """The join whose name (:func:`joined`) is ``name``, or None when it names none."""
    if " join " not in name.lower():
        return None
    found = _cache(schema).get(name)
    if found is not None:
        return found
    low = name.lower()
    root = low.split(" join ", 1)[0]
    if not any(t.name.lower() == root for t in schema.tables):
        return None
    edges = [e for e in declared_edges(schema) if f" on {e.label.lower()} join " in low + " join "]
    try:
        table = joined(schema, edges) if edges else None
    except (SchemaError, UnsupportedQuery):
        return None
    return table if table is not None and table.name.lower() == low else None
