"""Declared joins, rewritten to one SELECT over the table the join makes.

``SELECT c.age, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY
c.age`` is compiled as ``SELECT "age", COUNT(*) FROM "<the join>" GROUP BY "age"``, over the
virtual table of :mod:`dpgate.schema._joins`: every later stage sees one table.  This
module checks the join before anything else (nothing is read, nothing spent):

* only ``[INNER] JOIN … ON a = b [AND …]`` and ``JOIN … USING (col)`` between declared
  tables, each equality a declared path (``references``) — outer, cross, comma, natural
  and self-joins are refused, as are equalities that are not declared paths (a join on a
  non-key column, or between two people's tables not declared to be the same person);
* column references are resolved by qualifier (table name or alias) or, unqualified, by
  the one joined table declaring them; key and unit columns only join, and are refused
  anywhere else.

``COUNT(DISTINCT <unit>)`` — people, not rows — is exact where each person has at most
one row (the query's fact table declares ``max_rows_per_unit: 1``), and is then
``COUNT(*)``; elsewhere it is refused with what to write instead (:func:`rewrite_joins`
does this for single-table queries too).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import SchemaError, UnsupportedQuery
from dpgate.schema._joins import Edge, JoinedTable, declared_edges, joined, paths_text
from dpgate.schema.domains import Schema, Table

__all__ = ["public_alone", "rewrite_joins"]

#: Join arguments dpgate reads; any other one set (a LATERAL, ASOF's MATCH_CONDITION …) is refused.
_JOIN_ARGS = {"this", "on", "using", "kind", "pivots"}


def rewrite_joins(tree: exp.Expr, schema: Schema, dialect: str = "duckdb") -> exp.Expr:
    """``tree`` itself when it has no join and no ``COUNT(DISTINCT <unit>)``; else a copy over
    the join's table (module docstring).

    Raises:
        UnsupportedQuery, SchemaError: a join or column reference that is not allowed.
    """
    if not isinstance(tree, exp.Select) or not isinstance(tree.args.get("from_"), exp.From):
        return tree
    joins = tree.args.get("joins") or []
    if not joins and not _has_distinct_count(tree):
        return tree
    src = tree.args["from_"]
    if src.expressions:  # FROM a, b in older parsers
        raise _crossed(schema, [])
    new = tree.copy()
    try:
        first = _declared(new.args["from_"].this, schema)
    except SchemaError:
        if joins:
            raise
        first = None
    if first is None:
        return tree  # not a declared table (a subquery, a function …): the compiler's stages refuse it
    tables: dict[str, Table] = {_qualifier(new.args["from_"].this, first): first}
    edges: list[Edge] = []
    for j in new.args.get("joins") or []:
        _check_kind(j, schema, [t.name for t in tables.values()])
        t = _declared(j.this, schema)
        if t is None:
            raise UnsupportedQuery(
                f"{j.this.sql()!r}: only declared tables may be joined (no subqueries or table functions). "
                f"{paths_text(schema)}."
            )
        if any(x is t for x in tables.values()):
            raise UnsupportedQuery(
                f"self-join: table {t.name!r} appears twice; dpgate joins each declared table at most once. "
                f"{paths_text(schema, [t.name])}."
            )
        qual = _qualifier(j.this, t)
        if qual in tables:
            raise UnsupportedQuery(f"two joined tables are both called {qual!r}; give them different aliases.")
        found = _using(j, t, tables, schema) if j.args.get("using") else _on(j.args["on"], t, {**tables, qual: t}, schema)
        tables[qual] = t
        edges.extend(e for e in found if e not in edges)
    if not joins:
        _distinct_units(new, tables, schema, None)
        return _named_as_written(new, tree, dialect)
    jt = joined(schema, edges)
    new.set("joins", None)  # the ON / USING columns are the join's own, never renamed
    _distinct_units(new, tables, schema, jt)
    _rename_columns(new, tables, jt)
    new.set("from_", exp.From(this=exp.Table(this=exp.to_identifier(jt.name, quoted=True))))
    return _named_as_written(new, tree, dialect)


def _named_as_written(new: exp.Select, tree: exp.Select, dialect: str) -> exp.Select:
    """Unaliased aggregate outputs keep the name of their text as written (``SUM(o.amount)``), not of
    the rewritten one; columns keep theirs (``c.age`` is ``age``, as in SQL)."""
    items = []
    for mine, written in zip(new.expressions, tree.expressions, strict=True):
        body = mine.unnest() if isinstance(mine, exp.Paren) else mine
        if isinstance(mine, exp.Alias) or isinstance(body, exp.Column):
            items.append(mine)
        else:
            items.append(exp.alias_(mine, written.sql(dialect=dialect), quoted=True))
    new.set("expressions", items)
    return new


def public_alone(t: Table) -> UnsupportedQuery:
    """The refusal of a query on a public table alone."""
    return UnsupportedQuery(
        f"table {t.name!r} is public (a dimension table holding no one's rows): dpgate answers queries about people, "
        f"and joins public tables only as lookups; read {t.name!r} from the database directly, or join it to a "
        "table with people's rows along a declared path."
    )


# -- FROM and JOIN clauses -------------------------------------------------------------------------------
def _declared(node: exp.Expr, schema: Schema) -> Table | None:
    """The declared (physical) table ``node`` names, or None when it is no plain table."""
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        return None
    if {k for k, v in node.args.items() if v} - {"this", "db", "catalog", "alias"}:
        return None
    t = schema.table(node.name)
    if isinstance(t, JoinedTable):
        raise SchemaError(f"table {node.name!r} is not declared; declared tables: {[x.name for x in schema.tables]}.")
    if node.args.get("catalog") or (node.args.get("db") and not t.addressable_as(node.db)):
        raise SchemaError(f"schema {node.db!r} in {node.sql()!r} is not declared for table {t.name!r}; write {t.name}.")
    return t


def _qualifier(node: exp.Expr, t: Table) -> str:
    alias = node.args.get("alias")
    if alias is not None and alias.args.get("columns"):
        raise UnsupportedQuery("column aliases on a table (AS t(a, b)) are not supported; use declared names.")
    return (alias.name if alias is not None else t.name).lower()


def _crossed(schema: Schema, tables: list[str]) -> UnsupportedQuery:
    return UnsupportedQuery(
        "a comma or CROSS JOIN pairs every row with every row; join along a declared path, e.g. FROM orders JOIN "
        f"customers ON orders.customer_id = customers.id. {paths_text(schema, tables)}."
    )


def _check_kind(j: exp.Join, schema: Schema, tables: list[str]) -> None:
    side, kind, method = j.args.get("side"), (j.args.get("kind") or "").upper(), j.args.get("method")
    if side:
        raise UnsupportedQuery(
            f"{str(side).upper()} JOIN (an outer join) is not supported: rows without a match would count as a person "
            f"with NULLs; write [INNER] JOIN … ON a declared path. {paths_text(schema, tables)}."
        )
    if kind == "CROSS" or (not j.args.get("on") and not j.args.get("using") and not method and kind in ("", "INNER")):
        raise _crossed(schema, tables)
    if method or kind not in ("", "INNER"):
        raise UnsupportedQuery(
            f"{' '.join(str(x).upper() for x in (method, kind) if x)} JOIN is not supported; write [INNER] JOIN … ON "
            f"a declared path or JOIN … USING (column). {paths_text(schema, tables)}."
        )
    extra = {k for k, v in j.args.items() if v} - _JOIN_ARGS
    if extra or (j.args.get("on") and j.args.get("using")):
        raise UnsupportedQuery(f"{j.sql()!r}: only [INNER] JOIN … ON … or USING (…) is supported.")


def _edge(a: tuple[Table, str], b: tuple[Table, str], schema: Schema) -> Edge | None:
    """The declared path ``a = b`` (either way round), or None."""
    for (t1, c1), (t2, c2) in ((a, b), (b, a)):
        for r in t1.links.references:
            if (r.column.lower() == c1.lower() and r.target.lower() == t2.name.lower()
                    and r.target_column.lower() == c2.lower()):
                return Edge(t1.name, r.column, schema.table(r.target).name, r.target_column)
    return None


def _undeclared(text: str, a: Table, b: Table, schema: Schema) -> UnsupportedQuery:
    why = ""
    declared = [e.label for e in declared_edges(schema) if {e.table.lower(), e.target.lower()} == {a.name.lower(), b.name.lower()}]
    if declared:
        why = f" (the declared path between {a.name!r} and {b.name!r} is {'; '.join(declared)})"
    elif a.privacy_unit and b.privacy_unit and not a.links.public and not b.links.public:
        why = (f" ({a.name!r} and {b.name!r} hold rows of people identified by {a.privacy_unit!r} and "
               f"{b.privacy_unit!r}; no declared reference says these are the same person)")
    return UnsupportedQuery(
        f"{text} is not a declared join path{why}: dpgate joins only along declared references, on their key "
        f"columns. {paths_text(schema, [a.name, b.name])}."
    )


def _on(cond: exp.Expr, t: Table, tables: dict[str, Table], schema: Schema) -> list[Edge]:
    parts, stack = [], [cond]
    while stack:
        node = stack.pop()
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.And):
            stack.extend((node.right, node.left))
        else:
            parts.append(node)
    out = []
    for p in parts:
        if not isinstance(p, exp.EQ) or not all(isinstance(_bare(x), exp.Column) for x in (p.left, p.right)):
            raise UnsupportedQuery(
                f"JOIN … ON {p.sql()!r}: an ON clause may only equate the columns of a declared path; put other "
                f"conditions in WHERE. {paths_text(schema, [x.name for x in tables.values()])}."
            )
        a, b = (_join_column(x, tables) for x in (_bare(p.left), _bare(p.right)) if isinstance(x, exp.Column))
        edge = _edge(a, b, schema)
        if edge is None:
            raise _undeclared(repr(p.sql()), a[0], b[0], schema)
        if t.name.lower() not in (edge.table.lower(), edge.target.lower()):
            raise UnsupportedQuery(f"JOIN {t.name} ON {p.sql()!r}: the ON clause must join {t.name!r} itself.")
        out.append(edge)
    return out


def _bare(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _join_column(node: exp.Column, tables: dict[str, Table]) -> tuple[Table, str]:
    if node.table:
        t = tables.get(node.table.lower())
        if t is None:
            raise SchemaError(f"{node.sql()!r}: {node.table!r} names none of the joined tables {sorted(tables)}.")
        if not t.links.has_physical(t, node.name):
            raise SchemaError(f"{node.sql()!r}: table {t.name!r} has no column {node.name!r}.")
        return t, node.name
    holders = [t for t in tables.values() if t.links.has_physical(t, node.name)]
    if len(holders) != 1:
        raise SchemaError(
            f"column {node.name!r} in the ON clause is {'ambiguous' if holders else 'in none of the joined tables'}; "
            "qualify it with its table, e.g. orders.customer_id."
        )
    return holders[0], node.name


def _using(j: exp.Join, t: Table, tables: dict[str, Table], schema: Schema) -> list[Edge]:
    out = []
    for ident in j.args["using"]:
        name = ident.name
        found = [e for e in (_edge((x, name), (t, name), schema) for x in tables.values()) if e is not None]
        if len(found) != 1:
            others = ", ".join(x.name for x in tables.values())
            raise UnsupportedQuery(
                f"JOIN {t.name} USING ({name}) names {'several' if found else 'no'} declared path between {t.name!r} and "
                f"{others} with column {name!r} on both sides; write JOIN … ON the declared path. "
                f"{paths_text(schema, [t.name, *[x.name for x in tables.values()]])}."
            )
        out.append(found[0])
    return out


# -- columns -------------------------------------------------------------------------------------------
def _key_use(node: exp.Column, t: Table) -> SchemaError:
    what = "privacy unit (it identifies a person)" if (t.privacy_unit or "").lower() == node.name.lower() else "key"
    return SchemaError(
        f"{node.sql()!r} is {t.name!r}'s {what}: it only joins tables, and is never grouped on, filtered on or "
        "returned; use declared columns."
    )


def _resolve(node: exp.Column, tables: dict[str, Table]) -> tuple[Table, str] | None:
    """The (table, declared column) a reference names; None for a name no table declares (an output alias)."""
    if node.table:
        t = tables.get(node.table.lower())
        if t is None:
            raise SchemaError(
                f"column {node.sql()!r} is qualified by {node.table!r}, which names none of the queried tables "
                f"{sorted(tables)}; use a table's name or alias."
            )
        if t.has_column(node.name):
            return t, t.column(node.name).name
        if t.links.has_physical(t, node.name):
            raise _key_use(node, t)
        raise SchemaError(
            f"column {node.name!r} is not declared in table {t.name!r}; declared columns: {[c.name for c in t.columns]}."
        )
    holders = [t for t in tables.values() if t.has_column(node.name)]
    if len(holders) == 1:
        return holders[0], holders[0].column(node.name).name
    if not holders:
        keyed = [t for t in tables.values() if t.links.has_physical(t, node.name)]
        if keyed:
            raise _key_use(node, keyed[0])
    return None  # ambiguous (the join names it table.column) or an alias: the stages decide


def _rename_columns(tree: exp.Select, tables: dict[str, Table], jt: JoinedTable) -> None:
    for node in list(tree.find_all(exp.Column)):
        if isinstance(node.this, exp.Star):
            continue
        got = _resolve(node, tables)
        if got is None:
            continue
        t, name = got
        vname = f"{t.name}.{name}" if name.lower() in jt.ambiguous else name
        node.replace(exp.column(vname, quoted=bool(node.this.args.get("quoted"))))


def _has_distinct_count(tree: exp.Select) -> bool:
    return any(isinstance(n.this, exp.Distinct) for n in tree.find_all(exp.Count))


def _distinct_units(tree: exp.Select, tables: dict[str, Table], schema: Schema, jt: JoinedTable | None) -> None:
    """``COUNT(DISTINCT <unit>)`` as ``COUNT(*)`` where each person has one row; else refused."""
    root = schema.table(jt.root) if jt is not None else next(iter(tables.values()))
    for node in list(tree.find_all(exp.Count)):
        distinct = node.this
        if not isinstance(distinct, exp.Distinct) or len(distinct.expressions) != 1:
            continue
        col = _bare(distinct.expressions[0])
        if not isinstance(col, exp.Column) or isinstance(col.this, exp.Star):
            continue
        t = tables.get(col.table.lower()) if col.table else next(
            (x for x in tables.values() if x.links.has_physical(x, col.name) and not x.has_column(col.name)), None)
        if t is None or t.has_column(col.name) or not t.links.has_physical(t, col.name):
            continue  # a declared column (or unknown name): the stages decide
        is_unit = (t.privacy_unit or "").lower() == col.name.lower()
        if is_unit and root.privacy_unit is not None and root.max_rows_per_unit == 1:
            node.replace(exp.Count(this=exp.Star()))
            continue
        people = [x.name for x in schema.tables if x.privacy_unit and x.max_rows_per_unit == 1
                  and root.privacy_unit and any(r.target.lower() == x.name.lower() for r in root.links.references)]
        instead = (f"SELECT COUNT(*) FROM {people[0]} (one row per person)" if people else
                   "COUNT(*) over a table that declares max_rows_per_unit: 1 (one row per person)")
        raise UnsupportedQuery(
            f"{node.sql()!r} counts {'people' if is_unit else 'distinct keys'}, which dpgate answers exactly only where "
            f"each person has one row; {root.name!r} keeps up to {root.max_rows_per_unit} rows per person, where "
            f"COUNT(*) counts rows. To count people write {instead}."
        )
