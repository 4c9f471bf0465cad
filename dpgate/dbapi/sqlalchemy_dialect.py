"""A SQLAlchemy dialect for dpgate in process: ``create_engine("dpgate:///warehouse.duckdb?schema=s.yaml&budget=1")``.

pandas warns about any DB-API connection but sqlite3's, and SQLAlchemy Core and ORM need an
engine: with this dialect (registered as ``dpgate`` through the ``sqlalchemy.dialects`` entry
point) they work on dpgate without a server, as they do over the wire with ``dpgate serve``::

    engine = sqlalchemy.create_engine("dpgate:///warehouse.duckdb?schema=s.yaml&budget=1&accuracy=25")
    pandas.read_sql_query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", engine)

The URL's path is what :func:`dpgate.connect` takes as ``database`` — a DuckDB, CSV or Parquet
file (``dpgate:////abs/path.duckdb`` for an absolute path) or an embedded data set's name
(``dpgate:///pums``, whose own schema is used when ``schema`` is omitted); its query holds
:func:`dpgate.connect`'s keywords (``schema``, ``budget``, ``ledger``, ``accuracy``, ``confidence``,
``intervals`` …).  Data that has no URL (DataFrames, a duckdb connection) goes in
``connect_args``: ``create_engine("dpgate://", connect_args={"database": df, "schema": s})``.

Every connection of one engine shares **one** :class:`~dpgate.Gateway` — one budget and one
ledger, whatever the pool opens (a connection per pool slot with its own in-memory ledger
would spend the budget once per slot).  Reflection (``inspect(engine).get_table_names()``,
``get_columns``, ``get_foreign_keys`` (the declared references), ``Table(..., autoload_with=engine)``)
answers from the declared schema; the
pool's rollback on return is a no-op (nothing dpgate releases can be taken back).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.engine import URL, default
from sqlalchemy.engine.interfaces import ReflectedColumn, ReflectedForeignKeyConstraint, ReflectedPrimaryKeyConstraint

from dpgate.errors import InterfaceError

__all__ = ["DPGateDialect"]

_SESSION = ("accuracy", "confidence", "intervals", "allow_partial", "round")
_FLOATS = ("budget", "accuracy", "confidence", "fixed_latency")
_INTS = ("seed", "max_atoms", "max_outputs", "max_memory")
_FLAGS = ("intervals", "allow_partial", "round", "new_ledger")
_TYPES: Mapping[str, type[sqltypes.TypeEngine[Any]]] = {
    "integer": sqltypes.BigInteger, "categorical": sqltypes.Text, "binned": sqltypes.Text, "boolean": sqltypes.Boolean}
_MAX_QUERY_VALUE = 4096  # characters of one URL option (a path or a number)


def _option(key: str, text: str) -> Any:
    """One URL query option as the Python value :func:`dpgate.connect` takes."""
    if len(text) > _MAX_QUERY_VALUE:
        raise InterfaceError(f"the dpgate:// URL option {key!r} is {len(text)} characters long, more than "
                             f"{_MAX_QUERY_VALUE}.")
    try:
        if key in _FLOATS:
            return float(text)
        if key in _INTS:
            return int(text)
    except ValueError:
        raise InterfaceError(f"the dpgate:// URL option {key}={text[:40]!r} is not a "
                             f"{'number' if key in _FLOATS else 'whole number'}.") from None
    if key in _FLAGS:
        low = text.lower()
        if low not in ("true", "on", "1", "yes", "false", "off", "0", "no"):
            raise InterfaceError(f"the dpgate:// URL option {key}={text[:40]!r} must be true or false.")
        return low in ("true", "on", "1", "yes")
    return text


class DPGateDialect(default.DefaultDialect):
    """SQLAlchemy's view of :mod:`dpgate.dbapi` (``qmark`` parameters, DuckDB SQL, reflection from the schema)."""

    name = "dpgate"
    driver = "dbapi"
    default_paramstyle = "qmark"
    supports_statement_cache = True
    supports_native_boolean = True
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    supports_alter = False
    returns_native_bytes = False

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._lock = threading.Lock()
        self._gateway: Any = None

    @classmethod
    def import_dbapi(cls) -> Any:
        import dpgate.dbapi

        return dpgate.dbapi

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        options: dict[str, Any] = {}
        for key, value in url.query.items():
            if not isinstance(value, str):
                raise InterfaceError(f"the dpgate:// URL gives {key!r} several times; give it once.")
            options[key] = _option(key, value)
        if url.database:
            options["database"] = url.database
        return [], options

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        """A DB-API connection on the engine's one gateway (opened by the first connection)."""
        import dpgate.dbapi

        session = {k: cparams.pop(k) for k in _SESSION if k in cparams}
        with self._lock:
            if self._gateway is None:
                self._gateway = self._open_gateway(cparams)
        return dpgate.dbapi.connect(self._gateway, **session)

    def _open_gateway(self, options: dict[str, Any]) -> Any:
        from dpgate.backends import data_schema, open_data_file
        from dpgate.gateway import Gateway

        options = dict(options)
        database = options.pop("database", None)
        if database is None:
            raise InterfaceError("a dpgate:// URL needs the data: dpgate:///warehouse.duckdb?schema=s.yaml, "
                                 "dpgate:///pums, or connect_args={'database': dataframe, 'schema': …}.")
        opened = None
        if isinstance(database, str):  # a file, or an embedded data set's name and its schema
            options["schema"] = data_schema(database, options.get("schema"), error=InterfaceError)
            database = opened = open_data_file(database, options["schema"], error=InterfaceError)
        if "schema" not in options:
            raise InterfaceError("connect_args needs 'schema' (a dpgate.Schema, a dict or a YAML path).")
        try:
            gateway = Gateway(database, **options)
        except TypeError as exc:
            raise InterfaceError(f"{exc} (in the dpgate:// URL or connect_args)") from None
        weakref.finalize(self, gateway.close)
        if opened is not None and not isinstance(opened, str):
            weakref.finalize(self, opened.close)
        return gateway

    # -- no transactions to undo, no server to ask -------------------------------------------
    def do_rollback(self, dbapi_connection: Any) -> None:
        """Nothing to roll back: every release was recorded before it was returned."""

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        return "AUTOCOMMIT"

    def _get_server_version_info(self, connection: Any) -> tuple[int, ...]:
        return ()

    def _get_default_schema_name(self, connection: Any) -> str:
        return "main"

    def do_ping(self, dbapi_connection: Any) -> bool:
        return not dbapi_connection.closed

    # -- reflection from the declared schema -------------------------------------------------
    @staticmethod
    def _schema(connection: Any) -> Any:
        return connection.connection.dbapi_connection.gateway.schema

    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        return ["main"]

    def has_table(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> bool:
        return any(t.name.lower() == table_name.lower() for t in self._schema(connection).tables)

    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return [t.name for t in self._schema(connection).tables]

    def get_view_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return []

    def get_columns(self, connection: Any, table_name: str, schema: str | None = None,
                    **kw: Any) -> list[ReflectedColumn]:
        table = self._schema(connection).table(table_name)
        return [ReflectedColumn(name=c.name, type=_TYPES[c.kind](), nullable=c.nullable, default=None)
                for c in table.columns]

    def get_pk_constraint(self, connection: Any, table_name: str, schema: str | None = None,
                          **kw: Any) -> ReflectedPrimaryKeyConstraint:
        return ReflectedPrimaryKeyConstraint(constrained_columns=[], name=None)

    def get_foreign_keys(self, connection: Any, table_name: str, schema: str | None = None,
                         **kw: Any) -> list[ReflectedForeignKeyConstraint]:
        """The declared references, named as ``dpgate serve``'s catalogue names them (PostgreSQL's way)."""
        table = self._schema(connection).table(table_name)
        return [ReflectedForeignKeyConstraint(name=f"{table.name}_{r.column}_fkey", constrained_columns=[r.column],
                                              referred_schema=None, referred_table=r.target,
                                              referred_columns=[r.target_column], options={})
                for r in table.links.references]

    def get_indexes(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list[Any]:
        return []
