"""Answers to the catalogue queries clients send, from the *declared schema only*.

PostgreSQL clients ask the server about itself on connect and when they list
or describe tables.  ``dpgate serve`` answers the statements the common ones
send — captured from psql 15 (``psql -E``: ``\\dt``, ``\\d``, ``\\d table``),
SQLAlchemy 2's PostgreSQL dialect (connect, ``has_table``, ``get_columns``) and
psycopg 3 (type lookups) against a real PostgreSQL — plus ``version()``,
``current_schema()``, ``current_database()``, ``current_user``, and ``SELECT 1``
(connection pools' liveness check).  Every answer is
built from the public schema declaration (table and column names, declared
types); nothing here reads the data or the ledger.  A catalogue statement not
recognised here is not answered: it goes to the counting-query compiler, which
refuses it like any unsupported query.

Declared tables live in schema ``public``, owned by ``dpgate``, with OIDs
16384, 16385, … in declaration order; integer columns are ``bigint``,
categorical and binned ones ``text``, booleans ``boolean``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from dpgate.schema import Column, Schema, Table
from dpgate.server._protocol import Field
from dpgate.server._values import BOOL, CHAR, INT2, INT4, JSON, NAME, OID, TEXT, TYPE_SIZES

__all__ = ["CatalogAnswer", "answer", "SERVER_VERSION", "VERSION_STRING"]

SERVER_VERSION = "15.0"
VERSION_STRING = f"PostgreSQL {SERVER_VERSION} (dpgate: differentially private counting queries only)"
_FIRST_OID = 16384
_PG_TYPES = {"integer": ("bigint", 20), "categorical": ("text", 25), "binned": ("text", 25),
             "boolean": ("boolean", 16)}
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
    if m is None:
        return None
    i = int(m.group(1)) - _FIRST_OID
    return schema.tables[i] if 0 <= i < len(schema.tables) else None


def _pattern_tables(schema: Schema, text: str) -> list[Table]:
    """Tables matching psql's ``c.relname OPERATOR(pg_catalog.~) '^(…)$'`` filter (all without one)."""
    m = re.search(r"relname operator\(pg_catalog\.~\) '((?:[^']|'')*)'", text)
    if m is None:
        return list(schema.tables)
    try:
        pattern = re.compile(m.group(1).replace("''", "'"))
    except re.error:
        return []
    return [t for t in schema.tables if pattern.search(t.name)]


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
