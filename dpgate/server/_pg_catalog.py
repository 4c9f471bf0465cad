"""A small read-only ``pg_catalog`` built from the declared schema, for the describe queries of clients.

Why one module of over 500 lines: the interpreter's relations, joins, derived tables and expressions
share one statement's state (:class:`_Run`); split, each part would reach into the others.

psql's describe family (``\\d``, ``\\d+``, ``\\dt+``, ``\\l``, ``\\dn``, ``\\dv``, ``\\df``,
``\\du`` …) and the reflection queries of SQLAlchemy read ``pg_class``, ``pg_attribute``,
``pg_namespace`` … and read the result *by column position*: an answer must have exactly
the columns the statement asks for (psql 15 crashed on a 7-column answer to its
11-column ``\\d+`` query).  So a statement that reads only catalogue relations is
evaluated here, on virtual rows: ``pg_class`` holds the declared tables, ``pg_attribute``
their columns (the declared domain is the column's description, ``col_description``),
``pg_namespace`` the schema ``public``, ``pg_constraint`` each unit (a check constraint) and each declared
reference (a foreign key), ``pg_database`` the database, ``pg_roles`` the
analyst, ``pg_am`` ``heap``, ``pg_type`` and ``pg_description`` the columns' types and domains
(to a statement that reads ``pg_attribute``); every other catalogue relation is empty.  Its select list,
``FROM``/``JOIN``s (tables and derived tables), ``WHERE``, ``ORDER BY`` and ``LIMIT`` are
evaluated by a small interpreter of columns, constants, parameters, comparisons, ``CASE``,
``NULLIF``, ``row_number() OVER`` and the catalogue functions psql calls; what it does not know is ``NULL`` (in a condition: true, so an
unknown filter never hides a declared table).  Nothing here reads data or the ledger.

Bounds: the statement is within the compiler's size and nesting limits before it is
parsed; a join may produce at most :data:`MAX_ROWS` rows; client regular expressions are
never compiled (psql's ``^(name)$`` patterns become linear LIKE patterns, ``^prefix`` a
prefix test, anything else is refused).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from dpgate.compile.bounds import check_deadline, excerpt
from dpgate.compile.cells import like_regex
from dpgate.compile.statement import check_statement, dialect_of
from dpgate.errors import QuerySyntaxError, QueryTooComplex, UnsupportedQuery
from dpgate.schema.domains import Column, Schema, Table
from dpgate.server._protocol import Field
from dpgate.server._values import BOOL, INT8, OID, TEXT, TYPE_SIZES

__all__ = ["answer", "MAX_ROWS", "FIRST_OID", "column_comment", "table_comment", "unit_constraint", "psql_like",
           "foreign_keys"]

FIRST_OID = 16384
MAX_ROWS = 100_000  # rows a join of virtual relations may produce before the statement is refused
_NAMESPACE, _OWNER, _DATABASE = 2200, 10, 16383
_TYPES = {"integer": (20, "bigint"), "categorical": (25, "text"), "binned": (25, "text"), "boolean": (16, "boolean"),
          "date": (1082, "date"), "timestamp": (1114, "timestamp without time zone")}
_TYPE_NAMES = {oid: name for oid, name in _TYPES.values()}
_SHOWN_VALUES = 20  # declared categories listed in a column's description

Row = dict[str, dict[str, Any]]  # alias -> column -> value


def column_comment(col: Column) -> str:
    """The declared domain of ``col`` in words, as ``\\d+`` shows it in the Description column."""
    if col.kind == "integer":
        text = f"integer {col.min}..{col.max}"
    elif col.kind == "binned":
        text = f"bins {list(col.edges)}" + (f" over {col.min}..{col.max}" if col.min is not None else "")
    elif col.kind == "categorical":
        shown = ", ".join(repr(v) for v in col.values[:_SHOWN_VALUES])
        more = f", … ({len(col.values)} values)" if len(col.values) > _SHOWN_VALUES else ""
        text = f"one of {shown}{more}" + ("; other values: '<other>'" if col.other else "")
    elif col.kind in ("date", "timestamp"):
        declared = col.to_dict()  # the range as dates, not granule ordinals
        text = f"{col.kind} {declared['min']}..{declared['max']} by {col.granularity}"
    else:
        text = "true or false"
    return f"dpgate domain: {text}" + ("; NULL allowed" if col.nullable else "")


def table_comment(table: Table) -> str:
    """The table's public facts, as ``\\dt+`` shows them in the Description column."""
    unit = table.max_rows_per_individual
    rows = f"; {table.rows} rows (declared)" if table.rows is not None else ""
    who = f"each {table.privacy_unit}" if table.privacy_unit else "one person"
    if table.links.public:  # no one's data: read only as a lookup by declared joins
        return (f"dpgate: public dimension, key {table.links.key}: joined as a lookup along declared "
                "references, never queried alone")
    return (f"dpgate: differentially private counts only; privacy unit: {who}, up to {unit} "
            f"row{'s' if unit != 1 else ''}{rows}")


def unit_constraint(table: Table) -> str:
    """A unit table's unit and bound, as psql's ``\\d`` prints a check constraint (``"dpgate_privacy_unit" CHECK (…)``)."""
    unit, k = table.privacy_unit, table.max_rows_per_unit
    if k is None:
        return f"CHECK (privacy unit {unit}: no max_rows_per_unit declared, every query is refused)"
    return (f"CHECK (privacy unit {unit}: at most {k} row{'s' if k != 1 else ''} of each {unit} counted, the rest "
            f"dropped; every charge ×{k})")


def foreign_keys(schema: Schema) -> list[tuple[int, int, str, str]]:
    """Each declared reference as psql's ``\\d`` prints a foreign key: (index of the referencing table, of the
    referenced one, constraint name as PostgreSQL names it, ``FOREIGN KEY (col) REFERENCES target(col)``)."""
    index = {t.name.lower(): i for i, t in enumerate(schema.tables)}
    return [(i, index[r.target.lower()], f"{t.name}_{r.column}_fkey",
             f"FOREIGN KEY ({r.column}) REFERENCES {schema.tables[index[r.target.lower()]].name}({r.target_column})")
            for i, t in enumerate(schema.tables) for r in t.links.references]


def _relations(schema: Schema, user: str, database: str) -> dict[str, list[dict[str, Any]]]:
    """The virtual rows of the catalogue relations that are not empty."""
    fkeys, n = foreign_keys(schema), len(schema.tables)
    linked = {i for i, j, _, _ in fkeys} | {j for _, j, _, _ in fkeys}  # psql reads foreign keys of these only
    classes = [{"oid": FIRST_OID + i, "relname": t.name, "relnamespace": _NAMESPACE, "relkind": "r",
                "relowner": _OWNER, "relchecks": int(t.privacy_unit is not None), "relhasindex": False,
                "relhasrules": False, "relhastriggers": i in linked, "relrowsecurity": False, "relforcerowsecurity": False,
                "relispartition": False, "relhasoids": False, "reloptions": None, "reltablespace": 0,
                "reloftype": 0, "relpersistence": "p", "relreplident": "d", "relam": 2, "reltoastrelid": 0,
                "reltuples": float(t.rows) if t.rows is not None else -1.0, "relnatts": len(t.columns),
                "relacl": None, "relpartbound": None, "relisshared": False, "_table": t}
               for i, t in enumerate(schema.tables)]
    attributes = [{"attrelid": FIRST_OID + i, "attname": c.name, "attnum": n, "atttypid": _TYPES[c.kind][0],
                   "atttypmod": -1, "attnotnull": False, "atthasdef": False, "attisdropped": False,
                   "attidentity": "", "attgenerated": "", "attstorage": "p" if c.kind in ("integer", "boolean")
                   else "x", "attcompression": "", "attstattarget": -1,
                   "attcollation": 100 if _TYPES[c.kind][0] == 25 else 0, "attlen": -1, "attndims": 0,
                   "_column": c}
                  for i, t in enumerate(schema.tables) for n, c in enumerate(t.columns, 1)]
    return {
        "pg_class": classes,
        "pg_attribute": attributes,
        "pg_namespace": [{"oid": _NAMESPACE, "nspname": "public", "nspowner": _OWNER, "nspacl": None}],
        "pg_database": [{"oid": _DATABASE, "datname": database, "datdba": _OWNER, "encoding": 6, "datcollate": "C",
                         "datctype": "C", "daticulocale": None, "datlocprovider": "c", "datacl": None,
                         "datistemplate": False, "datallowconn": True, "datconnlimit": -1}],
        "pg_roles": [{"oid": _OWNER, "rolname": user, "rolsuper": False, "rolinherit": True, "rolcreaterole": False,
                      "rolcreatedb": False, "rolcanlogin": True, "rolconnlimit": -1, "rolvaliduntil": None,
                      "rolreplication": False, "rolbypassrls": False}],
        "pg_am": [{"oid": 2, "amname": "heap", "amtype": "t"}],
        # a unit table's unit and bound, as the one "check constraint" \d lists under the columns; each declared
        # reference as a foreign key (\d's "Foreign-key constraints:" and, on the referenced table, "Referenced by:")
        "pg_constraint": [{"oid": FIRST_OID + n + i, "conname": "dpgate_privacy_unit", "contype": "c",
                           "conrelid": FIRST_OID + i, "confrelid": 0, "conparentid": 0, "connamespace": _NAMESPACE,
                           "_def": unit_constraint(t)}
                          for i, t in enumerate(schema.tables) if t.privacy_unit is not None]
        + [{"oid": FIRST_OID + 2 * n + f, "conname": name, "contype": "f", "conrelid": FIRST_OID + i,
            "confrelid": FIRST_OID + j, "conparentid": 0, "connamespace": _NAMESPACE, "_def": text}
           for f, (i, j, name, text) in enumerate(fkeys)],
        # pgjdbc's getImportedKeys reads max_index_keys first; at its default, psql's \dconfig does not list it
        "pg_settings": [{"name": "max_index_keys", "setting": "32", "source": "default", "boot_val": "32"}],
        # the declared columns' types and domains, for statements joining pg_attribute to pg_type and pg_description
        # (pgjdbc's getColumns: the REMARKS BI tools show); answer() empties both for the others (psql's \dT,
        # psycopg's type lookups), whose filters it cannot evaluate
        "pg_description": [{"objoid": FIRST_OID + i, "classoid": 1259, "objsubid": n, "description": column_comment(c)}
                           for i, t in enumerate(schema.tables) for n, c in enumerate(t.columns, 1)],
        "pg_type": [{"oid": oid, "typname": {"bigint": "int8", "boolean": "bool"}.get(name, name), "typnamespace": 11,
                     "typtype": "b", "typnotnull": False, "typbasetype": 0, "typtypmod": -1, "typrelid": 0}
                    for oid, name in _TYPE_NAMES.items()],
    }


def _is_catalog(table: exp.Table, schema: Schema) -> bool:
    name, db = table.name.lower(), table.db.lower()
    if db == "pg_catalog":
        return True
    return not db and name.startswith("pg_") and not any(t.name.lower() == name for t in schema.tables)


def answer(sql: str, params: Sequence[Any], schema: Schema, *, user: str, database: str,
           budget_note: Callable[[], str] | None = None) -> tuple[tuple[Field, ...], tuple[tuple[Any, ...], ...]] | None:
    """Columns and rows of a statement that reads only catalogue relations, or None for any other.

    Raises:
        QueryTooComplex: the statement is beyond the size or nesting limits, or a join of more than
            :data:`MAX_ROWS` rows.
        UnsupportedQuery: a regular expression other than psql's name patterns.
    """
    try:
        check_statement(sql, dialect_of("postgres"))
    except QuerySyntaxError:
        return None
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
    tables = list(tree.find_all(exp.Table))
    # a function in FROM (pgjdbc's generate_series over current_schemas) is empty, beside catalogue relations only
    catalog = [_is_catalog(t, schema) for t in tables]
    if not isinstance(tree, (exp.Select, exp.Union)) or not any(catalog) \
            or not all(c or isinstance(t.this, exp.Func) for c, t in zip(catalog, tables, strict=True)):
        return None
    relations = _relations(schema, user, database)
    if not any(t.name.lower() == "pg_attribute" for t in tables):
        relations["pg_type"] = relations["pg_description"] = []
    run = _Run(relations, params, budget_note)
    names, rows = run.query(tree)
    fields = tuple(_field(n, p) for n, p in zip(names, run.prototype(tree), strict=True))
    texts = [f.type_oid == TEXT for f in fields]
    return fields, tuple(tuple(("t" if v else "f") if t and isinstance(v, bool) else v  # as PostgreSQL writes it
                               for v, t in zip(r, texts, strict=True)) for r in rows)


def _field(name: str, first: Any) -> Field:
    """A result column typed by its value on the relations' first rows — whatever the parameters and the
    WHERE clause, so that Describe before Bind and the run agree (psql reads booleans as ``t``/``f``)."""
    oid = BOOL if isinstance(first, bool) else (OID if name.endswith("oid") else INT8) if isinstance(first, int) \
        else 701 if isinstance(first, float) else TEXT
    return Field(name, oid, TYPE_SIZES.get(oid, -1))


def _output_name(e: exp.Expression) -> str:
    """The column name PostgreSQL gives a select-list expression (its FigureColname)."""
    if isinstance(e, exp.Alias):
        return e.alias
    if isinstance(e, exp.Dot):
        return _output_name(e.expression)
    if isinstance(e, exp.Column):
        return e.name
    if isinstance(e, exp.Anonymous):
        return str(e.this).lower()
    if isinstance(e, exp.Cast):
        inner = _output_name(e.this)
        return inner if inner != "?column?" else e.to.sql("postgres").split(".")[-1].lower()
    if isinstance(e, exp.Case):
        return "case"
    if isinstance(e, exp.Array):
        return "array"
    if isinstance(e, exp.Subquery) and isinstance(e.this, exp.Select) and e.this.expressions:
        return _output_name(e.this.expressions[0])
    if isinstance(e, exp.Func) and not isinstance(e, exp.Binary):
        return e.sql_name().lower()
    return "?column?"


class _RegClass(str):
    """``x::regclass``: a relation written as its name (``conrelid::regclass AS ontable``), compared as its oid."""

    oid: int | None


def _same(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if isinstance(a, _RegClass) or isinstance(b, _RegClass):
        oids = [x.oid if isinstance(x, _RegClass) else x for x in (a, b)]
        return str(oids[0]) == str(oids[1])
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower()[:1] == str(b).lower()[:1]
    return str(a) == str(b)


def psql_like(regex: str) -> str | None:
    """The LIKE pattern (escape ``\\``) of psql's ``^(name)$`` regular expression for a name pattern,
    or None when it uses other regular-expression notation.

    psql writes ``*`` as ``.*``, ``?`` as ``.`` and quotes ``$`` as ``\\$``; a client-written regular
    expression is not compiled: one like ``(a*)*(a*)*…b`` backtracks exponentially on a table name."""
    if not (regex.startswith("^(") and regex.endswith(")$")):
        return None
    body, out, i = regex[2:-2], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            out.append("\\" + body[i + 1])
            i += 2
            continue
        if body.startswith(".*", i):
            out.append("%")
            i += 2
            continue
        if ch in "%_":
            out.append("\\" + ch)
        elif ch == ".":
            out.append("_")
        elif ch in "^$()[]{}|*+?":
            return None
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _on_time() -> bool:
    """:func:`check_deadline` (the server's statement deadline), for use inside comprehensions."""
    check_deadline()
    return True


@functools.lru_cache(maxsize=32)
def _like(pattern: str, ci: bool) -> re.Pattern[str]:
    """A LIKE pattern (escape ``\\``), compiled once per statement rather than once per row."""
    return like_regex(pattern, "\\", ci=ci)


def _regex_match(value: Any, regex: Any) -> bool | None:
    """``value ~ regex`` for psql's name patterns ``^(…)$`` and a ``^prefix``; other expressions are refused."""
    if value is None or regex is None:
        return None
    regex, value = str(regex), str(value)
    like = psql_like(regex)
    if like is not None:
        return _like(like, False).fullmatch(value) is not None
    body = regex[1:]
    if regex.startswith("^") and body and all(ch.isalnum() or ch == "_" for ch in body):
        return value.startswith(body)
    raise UnsupportedQuery(f"dpgate serve matches psql name patterns made of names and the wildcards * and ? only, "
                           f"not the regular expression {excerpt(regex)}; nothing was read.")


class _Run:
    """One statement's evaluation over the virtual relations."""

    def __init__(self, relations: dict[str, list[dict[str, Any]]], params: Sequence[Any],
                 budget_note: Callable[[], str] | None = None) -> None:
        self.relations, self.params, self.budget_note = relations, params, budget_note

    def query(self, tree: exp.Expression) -> tuple[list[str], list[tuple[Any, ...]]]:
        # A chain of UNIONs parses left-deep: walked in a loop, so its length cannot recurse
        # (a right branch nests only inside parentheses, which check_complexity bounds).
        chain = []
        while isinstance(tree, exp.Union):
            chain.append(tree)
            tree = tree.this
        if not isinstance(tree, exp.Select):
            raise UnsupportedQuery("this catalogue query has another shape; nothing was read.")
        names, rows = self.select(tree, {})
        for union in reversed(chain):
            rows = rows + self.query(union.expression)[1]
            if union.args.get("distinct"):
                rows = list(dict.fromkeys(rows))
        return names, rows

    def prototype(self, tree: exp.Expression) -> list[Any]:
        """The select list's values on the first row of each relation it reads (NULL for an empty one)."""
        while isinstance(tree, exp.Union):
            tree = tree.this
        if not isinstance(tree, exp.Select):
            return []
        from_ = tree.args.get("from_") or tree.args.get("from")
        env: Row = {}
        for item in ([from_.this] if from_ is not None else []) + [j.this for j in tree.args.get("joins") or []]:
            if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):  # typed as its select list
                first = self.prototype(item.this)
                env[item.alias_or_name.lower()] = dict(zip(self._names(item.this), first, strict=True))
                continue
            rows = self.relation(item)
            env.update(rows[0] if rows else {alias: {} for alias in self._aliases(item)})
        return [self.value(e, env) for item in tree.expressions for e in self._expanded(item, tree)]

    def select(self, sel: exp.Select, outer: Row) -> tuple[list[str], list[tuple[Any, ...]]]:
        items = [c for e in sel.expressions for c in self._expanded(e, sel)]
        names = [_output_name(e) for e in items]
        envs = self.source(sel, outer)
        where = sel.args.get("where")
        if where is not None:
            envs = [r for r in envs if _on_time() and self.truth(where.this, r) is not False]
        out = [(tuple(self.value(e, r) for e in items), r) for r in envs if _on_time()]
        for i, e in enumerate(items):
            window = e.this if isinstance(e, exp.Alias) else e
            if isinstance(window, exp.Window) and isinstance(window.this, exp.RowNumber):
                out = self._row_number(i, window, out)
        order = sel.args.get("order")
        for o in reversed(order.expressions if order is not None else []):
            key = functools.partial(self._order_key, o.this, names)
            out.sort(key=key, reverse=bool(o.args.get("desc")))
        rows = [values for values, _ in out]
        limit = sel.args.get("limit")
        if limit is not None:
            n = self.value(limit.expression, {})
            if isinstance(n, int) and not isinstance(n, bool):
                rows = rows[: max(n, 0)]
        return names, rows

    def _row_number(self, i: int, window: exp.Window,
                    out: list[tuple[tuple[Any, ...], Row]]) -> list[tuple[tuple[Any, ...], Row]]:
        """``row_number() OVER (PARTITION BY … ORDER BY …)`` as value ``i`` of each row (pgjdbc numbers columns)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for k, (_, env) in enumerate(out):
            part = tuple(str(self.value(p, env)) for p in window.args.get("partition_by") or [])
            groups.setdefault(part, []).append(k)
        order = window.args.get("order")
        numbered = list(out)
        for members in groups.values():
            for o in reversed(order.expressions if order is not None else []):
                key: Callable[[int], tuple[bool, str]] = functools.partial(self._window_key, o.this, out)
                members.sort(key=key, reverse=bool(o.args.get("desc")))
            for n, k in enumerate(members, 1):
                values, env = out[k]
                numbered[k] = (values[:i] + (n,) + values[i + 1:], env)
        return numbered

    def _window_key(self, e: exp.Expression, out: list[tuple[tuple[Any, ...], Row]], k: int) -> tuple[bool, str]:
        return self._order_key(e, [], out[k])

    def _names(self, sel: exp.Select) -> list[str]:
        """The output names of a derived table's columns, as its outer query refers to them."""
        return [_output_name(c).lower() for e in sel.expressions for c in self._expanded(e, sel)]

    def _expanded(self, e: exp.Expression, sel: exp.Select) -> list[exp.Expression]:
        """A select-list item; ``*`` as the columns of the virtual relation in FROM (its own when unknown)."""
        if not isinstance(e, exp.Star):
            return [e]
        from_ = sel.args.get("from_") or sel.args.get("from")
        table = from_.this if from_ is not None else None
        if isinstance(table, exp.Subquery) and isinstance(table.this, exp.Select):
            return [exp.column(n, table.alias_or_name) for n in self._names(table.this)]
        rows = self.relations.get(table.name.lower(), []) if isinstance(table, exp.Table) else []
        alias = table.alias_or_name if isinstance(table, exp.Table) else ""
        return [exp.column(k, alias) for k in rows[0] if not k.startswith("_")] if rows else [e]

    def _order_key(self, e: exp.Expression, names: list[str], pair: tuple[tuple[Any, ...], Row]) -> tuple[bool, str]:
        values, env = pair
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit() and 0 < int(e.this) <= len(values):
            v = values[int(e.this) - 1]
        elif isinstance(e, exp.Column) and not e.table and e.name in names:
            v = values[names.index(e.name)]
        else:
            v = self.value(e, env)
        return v is None, f"{v:020d}" if isinstance(v, int) and v >= 0 else str(v)

    def source(self, sel: exp.Select, outer: Row) -> list[Row]:
        from_ = sel.args.get("from_") or sel.args.get("from")
        if from_ is None:
            return [dict(outer)]
        envs = [{**outer, **env} for env in self.relation(from_.this)]
        for join in sel.args.get("joins") or []:
            right = self.relation(join.this)
            on = join.args.get("on")
            joined: list[Row] = []
            for env in envs:
                check_deadline()  # the server's statement deadline
                matches = [{**env, **r} for r in right if on is None or self.truth(on, {**env, **r}) is not False]
                if not matches and join.side == "LEFT":
                    matches = [{**env, **{alias: {} for alias in self._aliases(join.this)}}]
                joined += matches
                if len(joined) > MAX_ROWS:
                    raise QueryTooComplex(f"this catalogue query joins more than {MAX_ROWS} rows; nothing was read.")
            envs = joined
        return envs

    @staticmethod
    def _aliases(e: exp.Expression) -> list[str]:
        # an aliased relation is known by its alias only: SQLAlchemy's foreign-key query joins pg_class twice
        return [e.alias_or_name.lower()]

    def relation(self, e: exp.Expression) -> list[Row]:
        """The rows of a FROM item, each as ``{alias: row}`` (the relation's name when it has no alias)."""
        if isinstance(e, exp.Subquery) and isinstance(e.this, exp.Select):  # a derived table (pgjdbc's getColumns)
            names, derived = self.select(e.this, {})
            return [{e.alias_or_name.lower(): dict(zip((n.lower() for n in names), r, strict=True))} for r in derived]
        if not isinstance(e, exp.Table):
            return []  # a function in FROM: nothing dpgate declares
        rows = self.relations.get(e.name.lower(), [])
        return [{alias: r for alias in self._aliases(e)} for r in rows]

    # -- expressions --------------------------------------------------------------------------
    def truth(self, e: exp.Expression, env: Row) -> bool | None:
        v = self.value(e, env)
        return None if v is None else bool(v)

    def value(self, e: exp.Expression, env: Row) -> Any:
        handler = _NODES.get(type(e))
        if handler is not None:
            return handler(self, e, env)
        if isinstance(e, exp.Binary):
            return self.binary(e, env)
        return None  # unknown: NULL

    def column(self, e: exp.Column, env: Row) -> Any:
        name, table = e.name.lower(), e.table.lower()
        if table:
            return env.get(table, {}).get(name)
        return next((row[name] for row in env.values() if name in row), None)

    def binary(self, e: exp.Binary, env: Row) -> Any:
        if isinstance(e, exp.And):
            a, b = self.truth(e.this, env), self.truth(e.expression, env)
            return False if a is False or b is False else None if a is None or b is None else True
        if isinstance(e, exp.Or):
            a, b = self.truth(e.this, env), self.truth(e.expression, env)
            return True if a or b else None if a is None or b is None else False
        if isinstance(e, exp.EQ) and isinstance(e.expression, exp.Any):  # x = ANY (ARRAY[…])
            array = e.expression.this.this if isinstance(e.expression.this, exp.Paren) else e.expression.this
            left = self.value(e.this, env)
            hits = [_same(left, self.value(v, env)) for v in array.expressions] if isinstance(array, exp.Array) else [None]
            return True if any(hits) else None if None in hits else False
        left, right = self.value(e.this, env), self.value(e.expression, env)
        if isinstance(e, exp.EQ):
            return _same(left, right)
        if isinstance(e, exp.NEQ):
            same = _same(left, right)
            return None if same is None else not same
        if isinstance(e, exp.RegexpLike):
            return _regex_match(left, right)
        if isinstance(e, (exp.Like, exp.ILike)):
            if left is None or right is None:
                return None
            return _like(str(right), isinstance(e, exp.ILike)).fullmatch(str(left)) is not None
        if isinstance(e, exp.DPipe):
            return None if left is None or right is None else f"{left}{right}"
        if isinstance(e, (exp.GT, exp.GTE, exp.LT, exp.LTE)) and isinstance(left, int) and isinstance(right, int):
            return {exp.GT: left > right, exp.GTE: left >= right, exp.LT: left < right,
                    exp.LTE: left <= right}[type(e)]
        return None

    def operator(self, e: exp.Operator, env: Row) -> Any:
        op = str(e.args.get("operator") or "").split(".")[-1]
        left, right = self.value(e.this, env), self.value(e.expression, env)
        if op == "~":
            return _regex_match(left, right)
        if op == "!~":
            match = _regex_match(left, right)
            return None if match is None else not match
        if op == "=":
            return _same(left, right)
        return None

    def function(self, e: exp.Anonymous, env: Row) -> Any:
        name = str(e.this).lower()
        args = e.expressions
        if name in ("pg_table_is_visible", "pg_function_is_visible", "pg_type_is_visible", "has_table_privilege",
                    "has_schema_privilege", "has_database_privilege"):
            return True
        if name == "pg_get_userbyid":
            return "dpgate"
        if name == "format_type":
            typ = self._int(args[0], env) if args else None
            return None if typ is None else _TYPE_NAMES.get(typ)
        if name == "col_description" and len(args) == 2:
            rel, num = self._int(args[0], env), self._int(args[1], env)
            col = next((a["_column"] for a in self.relations["pg_attribute"]
                        if a["attrelid"] == rel and a["attnum"] == num), None)
            return column_comment(col) if col is not None else None
        if name == "obj_description" and args:
            rel = self._int(args[0], env)
            table = next((c["_table"] for c in self.relations["pg_class"] if c["oid"] == rel), None)
            if table is None:
                return None
            return table_comment(table) + (f"; {self.budget_note()}" if self.budget_note is not None else "")
        if name == "pg_get_constraintdef" and args:
            oid = self._int(args[0], env)
            return next((c["_def"] for c in self.relations["pg_constraint"] if c["oid"] == oid), None)
        if name == "pg_partition_ancestors" and args:  # a table that is no partition: itself
            return self._int(args[0], env)
        if name == "pg_encoding_to_char":
            return "UTF8"
        if name in ("current_database", "current_schema", "current_user", "session_user"):
            db = self.relations["pg_database"][0]["datname"]
            user = self.relations["pg_roles"][0]["rolname"]
            return {"current_database": db, "current_schema": "public"}.get(name, user)
        return None

    def _int(self, e: exp.Expression, env: Row) -> int | None:
        v = self.value(e, env)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        return int(v) if isinstance(v, str) and v.isdigit() and len(v) <= 12 else None

    def case(self, e: exp.Case, env: Row) -> Any:
        subject = self.value(e.this, env) if e.this is not None else None
        for branch in e.args.get("ifs") or []:
            hit = _same(subject, self.value(branch.this, env)) if e.this is not None else self.truth(branch.this, env)
            if hit:
                return self.value(branch.args.get("true"), env)
        default = e.args.get("default")
        return self.value(default, env) if default is not None else None

    def literal(self, e: exp.Literal, env: Row) -> Any:
        if e.is_string:
            return e.this
        text = str(e.this)
        return int(text) if text.isdigit() and len(text) <= 18 else None

    def placeholder(self, e: exp.Expression, env: Row) -> Any:
        n = str(e.this.this if isinstance(e.this, exp.Literal) else e.this or "")
        return self.params[int(n) - 1] if n.isdigit() and len(n) <= 6 and 0 < int(n) <= len(self.params) else None

    def cast(self, e: exp.Cast, env: Row) -> Any:
        v = self.value(e.this, env)
        if v is None or e.to.sql("postgres").split(".")[-1].lower() != "regclass":
            return v
        oid = v if isinstance(v, int) else int(v) if str(v).isdigit() and len(str(v)) <= 12 else None
        rel = next((c for c in self.relations["pg_class"] if c["oid"] == oid or (oid is None and c["relname"] == v)),
                   None)
        named = _RegClass(rel["relname"] if rel is not None else str(v))
        named.oid = rel["oid"] if rel is not None else oid
        return named

    def _listed(self, query: exp.Expression) -> list[exp.Expression] | None:
        """The values of ``x IN (SELECT … UNION ALL VALUES (…))`` whose selects read no relation (psql's
        "Referenced by" query), or None for any other subquery.  Iterative: a union chain is as deep as long."""
        out: list[exp.Expression] = []
        stack = [query]
        while stack:
            q = stack.pop()
            if isinstance(q, (exp.Subquery, exp.Union)):
                stack += [q.this] if isinstance(q, exp.Subquery) else [q.expression, q.this]
                continue
            from_ = q.args.get("from_") or q.args.get("from") if isinstance(q, exp.Select) else None
            rows = from_.this.expressions if from_ is not None and isinstance(from_.this, exp.Values) else []
            tuples = [t.expressions[0] for t in rows if isinstance(t, exp.Tuple) and len(t.expressions) == 1]
            if isinstance(q, exp.Select) and from_ is None:
                out += q.expressions
            elif rows and len(tuples) == len(rows):
                out += tuples
            else:
                return None
        return out

    def in_(self, e: exp.In, env: Row) -> Any:
        listed = list(e.expressions)
        if e.args.get("query") is not None:
            found = self._listed(e.args["query"])
            if found is None:
                return None
            listed = found
        left = self.value(e.this, env)
        hits = [_same(left, self.value(v, env)) for v in listed]
        return True if any(hits) else None if None in hits else False


_NODES: dict[type, Callable[[_Run, Any, Row], Any]] = {
    exp.Column: _Run.column,
    exp.Literal: _Run.literal,
    exp.Boolean: lambda run, e, env: bool(e.this),
    exp.Null: lambda run, e, env: None,
    exp.Paren: lambda run, e, env: run.value(e.this, env),
    exp.Alias: lambda run, e, env: run.value(e.this, env),
    exp.Dot: lambda run, e, env: run.value(e.expression, env),
    exp.Collate: lambda run, e, env: run.value(e.this, env),
    exp.Cast: _Run.cast,
    exp.Not: lambda run, e, env: (lambda v: None if v is None else not v)(run.truth(e.this, env)),
    exp.Is: lambda run, e, env: (run.value(e.this, env) is None) != bool(e.args.get("negate"))  # IS [NOT] NULL
    if isinstance(e.expression, exp.Null) else None,
    exp.Operator: _Run.operator,
    exp.Anonymous: _Run.function,
    exp.Case: _Run.case,
    exp.In: _Run.in_,
    exp.Placeholder: _Run.placeholder,
    exp.Parameter: _Run.placeholder,
    exp.CurrentUser: lambda run, e, env: run.relations["pg_roles"][0]["rolname"],
    exp.Exists: lambda run, e, env: None,
    exp.Nullif: lambda run, e, env: (lambda v: None if _same(v, run.value(e.expression, env)) else v)(
        run.value(e.this, env)),
    exp.Window: lambda run, e, env: 1 if isinstance(e.this, exp.RowNumber) else None,  # numbered by select()
    exp.Neg: lambda run, e, env: (lambda v: -v if isinstance(v, int) and not isinstance(v, bool) else None)(
        run.value(e.this, env)),
}
