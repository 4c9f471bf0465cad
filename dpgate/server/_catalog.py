"""Answers to the catalogue queries clients send, from the *declared schema only*.

PostgreSQL clients ask the server about itself on connect and when they list
or describe tables.  ``dpgate serve`` answers the statements the common ones
send — captured from psql 15 (``psql -E``: ``\\dt``, ``\\d``, ``\\d table``),
SQLAlchemy 2's PostgreSQL dialect (connect, ``has_table``, ``get_columns``) and
psycopg 3 (type lookups) against a real PostgreSQL — plus ``version()``,
``current_schema()``, ``current_database()``, ``current_user``, ``SELECT 1``
(connection pools' liveness check), and the ``information_schema.tables``,
``.columns`` and ``.schemata`` queries of the shape BI tools (DBeaver, Metabase)
send: plain columns or ``*``, a ``WHERE`` of ``=``/``<>``/``IN``/``NOT IN``/``LIKE``
comparisons with constants or parameters joined by ``AND``, ``ORDER BY``, ``LIMIT``
— any other query of ``information_schema`` is refused with the shape that is
answered (``UnsupportedQuery``).  Every answer is
built from the public schema declaration (table and column names, declared
types); nothing here reads the data or the ledger.  A catalogue statement not
recognised here is not answered: it goes to the counting-query compiler, which
refuses it like any unsupported query.

Declared tables live in schema ``public``, owned by ``dpgate``, with OIDs
16384, 16385, … in declaration order; integer columns are ``bigint``,
categorical and binned ones ``text``, booleans ``boolean``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from dpgate.compile.bounds import check_number_text, excerpt
from dpgate.compile.cells import like_regex
from dpgate.compile.statement import check_statement, dialect_of
from dpgate.errors import QuerySyntaxError, UnsupportedQuery
from dpgate.schema.domains import Column, Schema, Table
from dpgate.server._protocol import Field
from dpgate.server._values import BOOL, CHAR, INT2, INT4, JSON, NAME, OID, TEXT, TYPE_SIZES, VARCHAR

__all__ = ["CatalogAnswer", "answer", "SERVER_VERSION", "VERSION_STRING"]

SERVER_VERSION = "15.0"
VERSION_STRING = f"PostgreSQL {SERVER_VERSION} (dpgate: differentially private counting queries only)"
_FIRST_OID = 16384
_PG_TYPES = {"integer": ("bigint", 20), "categorical": ("text", 25), "binned": ("text", 25),
             "boolean": ("boolean", 16), "date": ("date", 1082), "timestamp": ("timestamp without time zone", 1114)}
# Catalogue relations that hold nothing for a declared schema (no policies, indexes, inheritance …).
_EMPTY = frozenset({
    "pg_policy", "pg_statistic_ext", "pg_publication", "pg_publication_rel", "pg_publication_namespace",
    "pg_inherits", "pg_trigger", "pg_constraint", "pg_index", "pg_rewrite", "pg_attrdef", "pg_description",
    "pg_sequence", "pg_foreign_table", "pg_extension", "pg_partitioned_table", "pg_event_trigger",
})


@dataclass(frozen=True)
class CatalogAnswer:
    """A result set: columns, rows of Python values, and the command tag."""

    fields: tuple[Field, ...]
    rows: tuple[tuple[Any, ...], ...]

    @property
    def tag(self) -> str:
        """The CommandComplete tag, ``SELECT <rows>``."""
        return f"SELECT {len(self.rows)}"


def _f(name: str, oid: int = TEXT) -> Field:
    return Field(name, oid, TYPE_SIZES.get(oid, -1))


def _one(name: str, value: Any, oid: int = TEXT) -> CatalogAnswer:
    return CatalogAnswer((_f(name, oid),), ((value,),))


def _oid(schema: Schema, table: Table) -> int:
    return _FIRST_OID + list(schema.tables).index(table)


def _by_oid(schema: Schema, text: str) -> Table | None:
    m = re.search(r"\.(?:attrelid|oid|polrelid|stxrelid|inhrelid|prrelid)\s*=\s*'?(\d+)'?", text)
    if m is None or len(m.group(1)) > 12:  # no such OID (and int() of a long text is not free)
        return None
    i = int(m.group(1)) - _FIRST_OID
    return schema.tables[i] if 0 <= i < len(schema.tables) else None


def _pattern_tables(schema: Schema, text: str) -> list[Table]:
    """Tables matching psql's ``c.relname OPERATOR(pg_catalog.~) '^(…)$'`` filter (all without one)."""
    m = re.search(r"relname operator\(pg_catalog\.~\) '((?:[^']|'')*)'", text)
    if m is None:
        return list(schema.tables)
    like = _psql_like(m.group(1).replace("''", "'"))
    if like is None:
        raise UnsupportedQuery(
            f"dpgate serve matches psql name patterns made of names and the wildcards * and ? only, not the "
            f"regular expression {excerpt(m.group(1))}; nothing was read."
        )
    pattern = like_regex(like, "\\", ci=False)
    return [t for t in schema.tables if pattern.fullmatch(t.name)]


def _psql_like(regex: str) -> str | None:
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


def _format_type(col: Column) -> str:
    return _PG_TYPES[col.kind][0]


def _columns_psql(schema: Schema, table: Table) -> CatalogAnswer:
    fields = (_f("attname", NAME), _f("format_type"), _f("pg_get_expr"), _f("attnotnull", BOOL),
              _f("attcollation", NAME), _f("attidentity", CHAR), _f("attgenerated", CHAR))
    rows = tuple((c.name, _format_type(c), None, False, None, "", "") for c in table.columns)
    return CatalogAnswer(fields, rows)


def _columns_sqlalchemy(schema: Schema, names: Sequence[str]) -> CatalogAnswer:
    fields = (_f("name", NAME), _f("format_type"), _f("default"), _f("not_null", BOOL), _f("table_name", NAME),
              _f("comment"), _f("generated", CHAR), _f("identity_options", JSON), _f("collation", JSON))
    rows = tuple((c.name, _format_type(c), None, False, t.name, None, "", None, None)
                 for t in sorted((t for t in schema.tables if t.name in names), key=lambda t: t.name)
                 for c in t.columns)
    return CatalogAnswer(fields, rows)


def _check_statement(sql: str) -> None:
    """The size and nesting limits, before sqlglot parses ``sql`` (a ``-- pg_`` comment sends any
    statement here: parsed first, a too deeply nested one raised RecursionError)."""
    check_statement(sql, dialect_of("postgres"))


def _reads_empty(select: exp.Select) -> bool:
    """Whether a SELECT's FROM or an inner join reads a relation that is empty for a declared schema."""
    from_ = select.args.get("from_") or select.args.get("from")  # the key's name changed in sqlglot 26
    first = from_.this.name.lower() if from_ is not None and isinstance(from_.this, exp.Table) else ""
    inner = [j.this.name.lower() for j in select.args.get("joins") or []
             if isinstance(j.this, exp.Table) and not j.side]
    return first in _EMPTY or any(t in _EMPTY for t in inner)


def _empty(sql: str) -> CatalogAnswer | None:
    """Zero rows, if ``sql`` reads a catalogue relation that is empty for a declared schema."""
    try:
        _check_statement(sql)
    except QuerySyntaxError:
        return None  # not a catalogue statement dpgate reads: the compiler refuses it
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
    tables = list(tree.find_all(exp.Table))
    if not tables or not all(t.name.lower().startswith("pg_") or t.db.lower() == "pg_catalog" for t in tables):
        return None
    branches = [tree]
    while any(isinstance(b, exp.Union) for b in branches):
        branches = [part for b in branches for part in ((b.left, b.right) if isinstance(b, exp.Union) else (b,))]
    if not all(isinstance(b, exp.Select) for b in branches):
        return None
    if "to_regtype(" not in sql.lower() and not all(isinstance(b, exp.Select) and _reads_empty(b) for b in branches):
        return None
    return CatalogAnswer(tuple(_f(e.alias_or_name or "?column?") for e in branches[0].expressions), ())


# -- information_schema: tables, columns, schemata -----------------------------------------------
# Names and base types as PostgreSQL's views (sql_identifier: name, character_data and yes_or_no:
# varchar, cardinal_number: int4); the columns tools ask for, not every one of the standard's.
_INFO_COLUMNS: dict[str, tuple[tuple[str, int], ...]] = {
    "tables": (("table_catalog", NAME), ("table_schema", NAME), ("table_name", NAME), ("table_type", VARCHAR),
               ("is_insertable_into", VARCHAR), ("is_typed", VARCHAR), ("commit_action", VARCHAR)),
    "columns": (("table_catalog", NAME), ("table_schema", NAME), ("table_name", NAME), ("column_name", NAME),
                ("ordinal_position", INT4), ("column_default", VARCHAR), ("is_nullable", VARCHAR),
                ("data_type", VARCHAR), ("character_maximum_length", INT4), ("numeric_precision", INT4),
                ("numeric_precision_radix", INT4), ("numeric_scale", INT4), ("udt_catalog", NAME),
                ("udt_schema", NAME), ("udt_name", NAME), ("is_identity", VARCHAR), ("is_generated", VARCHAR),
                ("is_updatable", VARCHAR)),
    "schemata": (("catalog_name", NAME), ("schema_name", NAME), ("schema_owner", NAME)),
}
_UDT = {"bigint": ("int8", 64, 2, 0), "text": ("text", None, None, None), "boolean": ("bool", None, None, None)}
_SHAPE = ("dpgate answers information_schema.tables, .columns and .schemata from the declared schema, as "
          "SELECT <columns or *> FROM information_schema.<view> [WHERE <column> = / <> / IN / NOT IN / LIKE "
          "<constants or parameters>, joined with AND] [ORDER BY <columns>] [LIMIT n]")


def _info_rows(view: str, schema: Schema, database: str) -> list[dict[str, Any]]:
    if view == "schemata":
        return [{"catalog_name": database, "schema_name": "public", "schema_owner": "dpgate"}]
    tables = [{"table_catalog": database, "table_schema": "public", "table_name": t.name, "table_type": "BASE TABLE",
               "is_insertable_into": "NO", "is_typed": "NO", "commit_action": None} for t in schema.tables]
    if view == "tables":
        return tables
    out = []
    for t, base in zip(schema.tables, tables, strict=True):
        for i, c in enumerate(t.columns, 1):
            name = _format_type(c)
            udt, precision, radix, scale = _UDT[name]
            out.append({**{k: base[k] for k in ("table_catalog", "table_schema", "table_name")},
                        "column_name": c.name, "ordinal_position": i, "column_default": None, "is_nullable": "YES",
                        "data_type": name, "character_maximum_length": None, "numeric_precision": precision,
                        "numeric_precision_radix": radix, "numeric_scale": scale, "udt_catalog": database,
                        "udt_schema": "pg_catalog", "udt_name": udt, "is_identity": "NO", "is_generated": "NEVER",
                        "is_updatable": "NO"})
    return out


def _refuse(what: str) -> UnsupportedQuery:
    return UnsupportedQuery(f"{what}; {_SHAPE}. Nothing was read.")


def _info_value(e: exp.Expression, params: Sequence[Any]) -> Any:
    if isinstance(e, exp.Literal):
        if not e.is_string:
            check_number_text(e.this)  # before int() or float() reads it
        return e.this if e.is_string else int(e.this) if e.this.isdigit() else float(e.this)
    if isinstance(e, (exp.Placeholder, exp.Parameter)):  # $n
        n = str(e.this.this if isinstance(e.this, exp.Literal) else e.this or "")
        if n.isdigit() and 0 < int(n) <= len(params):
            return params[int(n) - 1]
    if isinstance(e, exp.Null):
        return None
    raise _refuse(f"information_schema: {e.sql('postgres')!r} is not a constant or a parameter")


def _info_column(e: exp.Expression, names: Sequence[str]) -> str:
    if isinstance(e, exp.Column) and e.name.lower() in names:
        return e.name.lower()
    raise _refuse(f"information_schema: {e.sql('postgres')!r} is not a column of the view ({', '.join(names)})")


def _same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and str(a) == str(b)


def _info_filter(cond: exp.Expression, names: Sequence[str], params: Sequence[Any]) -> Any:
    """``row -> bool`` for a conjunction of simple comparisons."""
    if isinstance(cond, exp.Paren):
        return _info_filter(cond.this, names, params)
    if isinstance(cond, exp.And):
        left, right = _info_filter(cond.this, names, params), _info_filter(cond.expression, names, params)
        return lambda r: left(r) and right(r)
    negate = isinstance(cond, exp.Not)
    inner = cond.this if negate else cond
    if isinstance(inner, exp.In) and not inner.args.get("query"):
        col, values = _info_column(inner.this, names), [_info_value(v, params) for v in inner.expressions]
        return lambda r: r[col] is not None and any(_same(r[col], v) for v in values) != negate
    if not negate and isinstance(cond, (exp.EQ, exp.NEQ, exp.Like)):
        col, value = _info_column(cond.this, names), _info_value(cond.expression, params)
        if isinstance(cond, exp.Like):  # linear time, even on a long client-chosen database name
            pattern = like_regex(str(value), None, ci=False)
            return lambda r: r[col] is not None and pattern.fullmatch(str(r[col])) is not None
        want = isinstance(cond, exp.EQ)
        return lambda r: r[col] is not None and value is not None and _same(r[col], value) == want
    raise _refuse(f"information_schema: the condition {cond.sql('postgres')!r} is not supported")


def _sort_key(col: str, row: dict[str, Any]) -> tuple[bool, Any]:
    return row[col] is None, row[col]  # NULLs last, as PostgreSQL sorts ascending


def _information_schema(sql: str, params: Sequence[Any], schema: Schema, database: str) -> CatalogAnswer:
    _check_statement(sql)
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.SqlglotError as exc:
        raise _refuse(f"cannot parse this information_schema query ({exc})") from None
    tables = list(tree.find_all(exp.Table))
    if not isinstance(tree, exp.Select) or len(tables) != 1 or tree.args.get("joins") or tree.args.get("with") \
            or tree.args.get("group") or tree.args.get("having") or tree.args.get("distinct") \
            or tables[0].db.lower() != "information_schema" or tables[0].name.lower() not in _INFO_COLUMNS:
        raise _refuse("this information_schema query has another shape")
    view = tables[0].name.lower()
    names = [n for n, _ in _INFO_COLUMNS[view]]
    oids = dict(_INFO_COLUMNS[view])
    picked: list[tuple[str, str]] = []  # (output name, view column)
    for e in tree.expressions:
        if isinstance(e, exp.Star):
            picked += [(n, n) for n in names]
        else:
            col = _info_column(e.this if isinstance(e, exp.Alias) else e, names)
            picked.append((e.alias_or_name if isinstance(e, exp.Alias) else col, col))
    rows = _info_rows(view, schema, database)
    where = tree.args.get("where")
    if where is not None:
        keep = _info_filter(where.this, names, params)
        rows = [r for r in rows if keep(r)]
    order = tree.args.get("order")
    for o in reversed(order.expressions if order is not None else []):
        key = o.this
        col = picked[int(key.this) - 1][1] if isinstance(key, exp.Literal) and key.this.isdigit() \
            and 0 < int(key.this) <= len(picked) else _info_column(key, names)
        rows.sort(key=functools.partial(_sort_key, col), reverse=bool(o.args.get("desc")))
    limit = tree.args.get("limit")
    if limit is not None:
        n = _info_value(limit.expression, params)
        rows = rows[: int(n)] if isinstance(n, int) else rows
    return CatalogAnswer(tuple(_f(out, oids[col]) for out, col in picked),
                         tuple(tuple(r[col] for _, col in picked) for r in rows))


def answer(sql: str, params: Sequence[Any], schema: Schema, *, user: str, database: str) -> CatalogAnswer | None:
    """The answer to a catalogue statement, or None when ``sql`` is not one this module knows."""
    text = " ".join(sql.lower().split()).rstrip(";").strip()
    simple = {
        "select version()": ("version", VERSION_STRING),
        "select pg_catalog.version()": ("version", VERSION_STRING),
        "select current_schema()": ("current_schema", "public"),
        "select current_schema": ("current_schema", "public"),
        "select current_database()": ("current_database", database),
        "select current_user": ("current_user", user),
        "select session_user": ("session_user", user),
        "select current_user()": ("current_user", user),
    }
    if text in simple:
        return _one(*simple[text], oid=NAME if "version" not in text else TEXT)
    if text == "select 1":  # connection pools' and BI tools' liveness check (SQLAlchemy pool_pre_ping)
        return _one("?column?", 1, INT4)
    if re.search(r'\binformation_schema"?\s*\.', text):  # reads a view (psql's \dt names the schema in a string)
        return _information_schema(sql, params, schema, database)
    if "pg_catalog." not in text and "pg_" not in text:
        return None
    # psql \dt, \d (list): Schema, Name, Type, Owner of the relations.
    if 'as "schema"' in text and 'as "owner"' in text and "from pg_catalog.pg_class c" in text:
        if "c.relkind in ('r'" not in text:
            return None
        fields: tuple[Field, ...] = (_f("Schema", NAME), _f("Name", NAME), _f("Type"), _f("Owner", NAME))
        rows: tuple[tuple[Any, ...], ...] = tuple(("public", t.name, "table", "dpgate") for t in sorted(_pattern_tables(schema, text),
                                                                          key=lambda t: t.name))
        return CatalogAnswer(fields, rows)
    # psql \d NAME, step 1: the matching relations' OIDs.
    if text.startswith("select c.oid, n.nspname, c.relname from pg_catalog.pg_class c"):
        fields = (_f("oid", OID), _f("nspname", NAME), _f("relname", NAME))
        return CatalogAnswer(fields, tuple((_oid(schema, t), "public", t.name)
                                           for t in sorted(_pattern_tables(schema, text), key=lambda t: t.name)))
    # psql \d NAME, step 2: the relation's properties.
    if text.startswith("select c.relchecks, c.relkind,"):
        table = _by_oid(schema, text)
        cols = ("relchecks", "relkind", "relhasindex", "relhasrules", "relhastriggers", "relrowsecurity",
                 "relforcerowsecurity", "relhasoids", "relispartition", "?column?", "reltablespace", "reloftype",
                 "relpersistence", "relreplident", "amname")
        oids = (INT2, CHAR, BOOL, BOOL, BOOL, BOOL, BOOL, BOOL, BOOL, TEXT, OID, TEXT, CHAR, CHAR, NAME)
        row = (0, "r", False, False, False, False, False, False, False, "", 0, "", "p", "d", "heap")
        return CatalogAnswer(tuple(_f(n, o) for n, o in zip(cols, oids, strict=True)),
                             () if table is None else (row,))
    # psql \d NAME, step 3: the columns.
    if text.startswith("select a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)") \
            and "from pg_catalog.pg_attribute a" in text:
        table = _by_oid(schema, text)
        return _columns_psql(schema, table) if table is not None else CatalogAnswer(_columns_psql(
            schema, schema.tables[0]).fields, ())
    # SQLAlchemy: has_table (relname IN (…)) and get_columns.
    names = [p for p in params if isinstance(p, str)]
    names += re.findall(r"relname in \(\s*'((?:[^']|'')*)'", text)
    if text.startswith("select pg_catalog.pg_class.relname from pg_catalog.pg_class join pg_catalog.pg_namespace"):
        return CatalogAnswer((_f("relname", NAME),), tuple((t.name,) for t in schema.tables if t.name in names))
    if text.startswith("select pg_catalog.pg_attribute.attname as name, pg_catalog.format_type("):
        return _columns_sqlalchemy(schema, names)
    return _empty(sql)
