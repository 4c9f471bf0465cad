"""Answers to the catalogue queries clients send, from the *declared schema only*.

PostgreSQL clients ask the server about itself on connect and when they list
or describe tables.  ``dpgate serve`` answers the statements the common ones
send: a statement that reads only ``pg_catalog`` relations — psql 15's describe
family (``psql -E``), SQLAlchemy 2's reflection, psycopg 3's type lookups — is
evaluated on the virtual catalogue of :mod:`dpgate.server._pg_catalog`, with
exactly the columns it asks for (SQLAlchemy's ``get_columns`` keeps its own answer
here); plus ``version()``,
``current_schema()``, ``current_database()``, ``current_user``, ``SELECT 1``
(connection pools' liveness check), a ``SELECT … FROM <declared table> … LIMIT 0`` (Metabase's and
DBeaver's "can this table be read?" probe: no rows, whatever the data, so its columns and types
are all it answers), and the ``information_schema.tables``,
``.columns`` and ``.schemata`` queries of the shape BI tools (DBeaver, Metabase)
send: plain columns or ``*``, a ``WHERE`` of ``=``/``<>``/``IN``/``NOT IN``/``LIKE``
comparisons with constants or parameters joined by ``AND``, ``ORDER BY``, ``LIMIT``
— any other query of ``information_schema`` is refused with the shape that is
answered (``UnsupportedQuery``).  Every answer is
built from the public schema declaration (table and column names, declared
types); nothing here reads the data, and the ledger only for the budget state of
``\\dt+``.  Any other statement goes to the counting-query compiler, which refuses
it like any unsupported query.

Declared tables live in schema ``public``, owned by ``dpgate``, with OIDs
16384, 16385, … in declaration order; integer columns are ``bigint``,
categorical and binned ones ``text``, booleans ``boolean``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from dpgate.compile.bounds import check_number_text
from dpgate.compile.cells import like_regex
from dpgate.compile.statement import check_statement, dialect_of
from dpgate.errors import UnsupportedQuery
from dpgate.schema.domains import Column, Schema
from dpgate.server import _pg_catalog
from dpgate.server._protocol import Field
from dpgate.server._values import BOOL, CHAR, INT4, JSON, NAME, NUMERIC, TEXT, TYPE_SIZES, VARCHAR

__all__ = ["CatalogAnswer", "answer", "SERVER_VERSION", "VERSION_STRING"]

SERVER_VERSION = "15.0"
VERSION_STRING = f"PostgreSQL {SERVER_VERSION} (dpgate: differentially private counting queries only)"
_PG_TYPES = {"integer": ("bigint", 20), "categorical": ("text", 25), "binned": ("text", 25),
             "boolean": ("boolean", 16), "date": ("date", 1082), "timestamp": ("timestamp without time zone", 1114)}


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


def _format_type(col: Column) -> str:
    return _PG_TYPES[col.kind][0]


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


def _empty_probe(sql: str, schema: Schema) -> CatalogAnswer | None:
    """``SELECT <columns, constants or *> FROM <declared table> [WHERE …] LIMIT 0``: no rows and the
    columns' declared types, or None when ``sql`` is not of that shape (the compiler then refuses it).

    Its result is empty whatever the data, so it reveals nothing and costs nothing; the ``WHERE``
    is never evaluated."""
    _check_statement(sql)
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.ParseError:
        return None
    limit = tree.args.get("limit")
    value = limit.expression if isinstance(limit, exp.Limit) else None
    if (not isinstance(tree, exp.Select) or not isinstance(value, exp.Literal) or str(value.this) != "0"
            or any(tree.args.get(k) for k in ("joins", "group", "having", "with", "offset", "distinct", "laterals"))):
        return None
    table = tree.args.get("from_")
    source = table.this if isinstance(table, exp.From) else None
    if not isinstance(source, exp.Table) or source.catalog or source.db.lower() not in ("", "public"):
        return None
    declared = {t.name.lower(): t for t in schema.tables}.get(source.name.lower())
    if declared is None:
        return None
    columns = {c.name.lower(): c for c in declared.columns}
    fields: list[Field] = []
    for e in tree.expressions:
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, exp.Star):
            fields += [_f(c.name, _PG_TYPES[c.kind][1]) for c in declared.columns]
            continue
        if isinstance(inner, exp.Column) and inner.name.lower() in columns:
            col = columns[inner.name.lower()]
            oid = _PG_TYPES[col.kind][1]
        elif isinstance(inner, exp.Boolean):
            oid = BOOL
        elif isinstance(inner, exp.Literal):
            oid = TEXT if inner.is_string else INT4 if inner.this.isdigit() else NUMERIC
        else:
            return None
        fields.append(_f(e.alias_or_name if isinstance(e, exp.Alias) or isinstance(inner, exp.Column) else "?column?", oid))
    return CatalogAnswer(tuple(fields), ())


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


def answer(sql: str, params: Sequence[Any], schema: Schema, *, user: str, database: str,
           budget_note: Callable[[], str] | None = None) -> CatalogAnswer | None:
    """The answer to a catalogue statement, or None when ``sql`` is not one this module knows
    (``budget_note``: the budget state, for the tables' descriptions)."""
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
    if re.search(r"\blimit\s+0$", text):
        probe = _empty_probe(sql, schema)
        if probe is not None:
            return probe
    # reads a view (psql's \dt names the schema in a string); not a function (pgjdbc's _pg_expandarray on pg_index)
    if re.search(r'\binformation_schema"?\s*\.(?!\s*"?_pg_)', text):
        return _information_schema(sql, params, schema, database)
    if "pg_catalog." not in text and "pg_" not in text:
        return None
    # SQLAlchemy's get_columns (its has_table and get_table_names: the virtual pg_catalog, below).
    names = [p for p in params if isinstance(p, str)]
    names += re.findall(r"relname in \(\s*'((?:[^']|'')*)'", text)
    if text.startswith("select pg_catalog.pg_attribute.attname as name, pg_catalog.format_type("):
        return _columns_sqlalchemy(schema, names)
    found = _pg_catalog.answer(sql, params, schema, user=user, database=database, budget_note=budget_note)
    return None if found is None else CatalogAnswer(*found)
