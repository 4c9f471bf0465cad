"""Data backends: the engines that count rows per cell for the cube.

**Internal: never release.**  A backend runs the SELECT statements that
:mod:`dpgate.release.cube` generates with sqlglot builders from the public schema —
never the analyst's SQL text — and returns their (exact, private) results to
the cube only.  The decision, inference and noise all stay on the gateway: the
only things that cross the wire are per-cell counts.

A backend is anything with this small interface (:class:`Backend`):

* ``dialect`` — the sqlglot dialect its SQL is written in;
* ``catalog(tables)`` — the physical table reference and the column names and type
  names of each declared table (metadata only);
* ``run(select, numpy=False)`` — run one generated, read-only ``SELECT`` and return its
  rows (or its columns as numpy arrays);
* ``row_hash(columns)`` — an expression hashing a row's declared columns to a 64-bit
  integer on the engine, for the ledger binding's fingerprint (see :meth:`Cube.fingerprint
  <dpgate.release.cube.Cube.fingerprint>`);
* ``close()``.

:func:`open_backend` chooses one from what ``Gateway(data=…)`` / ``connect(…)`` receive:

============================================================  =========================
``data``                                                      backend
============================================================  =========================
DuckDB file path, ``duckdb`` connection, DataFrame(s)          :class:`DuckDBBackend`
``"postgresql://…"`` / ``"postgresql+psycopg://…"`` URL,       :class:`PostgresBackend`
SQLAlchemy ``Engine``, psycopg / pg8000 DB-API connection
``(SparkSession, "table")``, ``(SparkSession, {name: table})``  :class:`SparkBackend`
a Spark DataFrame, ``{name: Spark DataFrame}``
an object implementing :class:`Backend`                        itself
============================================================  =========================

:func:`open_data_file` turns a file named on a command line (DuckDB, CSV, Parquet)
into such ``data``.

Adding another engine that sqlglot writes SQL for (Trino, BigQuery, Snowflake …)
takes a few lines: subclass :class:`DbapiBackend`, set ``dialect``, write
``row_hash`` with the engine's 64-bit hash function, and make ``_begin`` open a
read-only transaction if the engine has them (see the README's "Backends").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dpgate.backends._base import Backend, TableBinding, engine_failure, information_schema_catalog
from dpgate.backends._dbapi import DbapiBackend, PostgresBackend
from dpgate.backends._duckdb import DuckDBBackend
from dpgate.backends._spark import SparkBackend
from dpgate.errors import InvalidArgument, InvalidArgumentType

if TYPE_CHECKING:
    from dpgate.schema.domains import Schema

__all__ = [
    "Backend",
    "DbapiBackend",
    "DuckDBBackend",
    "PostgresBackend",
    "SparkBackend",
    "TableBinding",
    "engine_failure",
    "information_schema_catalog",
    "is_external",
    "is_postgres_url",
    "open_backend",
    "open_data_file",
    "data_schema",
]

_PG_SCHEMES = ("postgresql://", "postgres://", "postgresql+")


def is_postgres_url(data: Any) -> bool:
    """Whether ``data`` is a PostgreSQL SQLAlchemy URL string (``postgresql://…``, ``postgresql+psycopg://…``)."""
    return isinstance(data, str) and data.lower().startswith(_PG_SCHEMES)


def _module(obj: Any) -> str:
    return type(obj).__module__ or ""


def _is_spark(obj: Any) -> bool:
    return _module(obj).startswith("pyspark")


def is_external(data: Any) -> bool:
    """Whether ``data`` is a PostgreSQL, Spark or custom source (not DuckDB or pandas)."""
    if isinstance(data, Backend) or is_postgres_url(data):
        return True
    if isinstance(data, tuple) and len(data) == 2 and _is_spark(data[0]):
        return True
    return _is_spark(data) or _module(data).startswith(("sqlalchemy", "psycopg", "pg8000"))


def open_backend(data: Any, tables: list[str]) -> Backend:
    """The backend for ``data`` (see the table in the module docstring).

    Args:
        data: what the user passed as the data source.
        tables: the declared table names (a lone DataFrame needs exactly one).

    Raises:
        InvalidArgumentType: ``data`` is none of the accepted kinds.
        OperationalError: the source cannot be opened.
    """
    if isinstance(data, Backend):
        return data
    if is_postgres_url(data):
        return PostgresBackend(data)
    if isinstance(data, tuple) and len(data) == 2 and _is_spark(data[0]):
        return SparkBackend(data[0], data[1], tables)
    if _is_spark(data) or (isinstance(data, Mapping) and data and all(_is_spark(v) for v in data.values())):
        return SparkBackend(None, data, tables)
    mod = _module(data)
    if mod.startswith("sqlalchemy") or mod.startswith(("psycopg", "pg8000")):
        return PostgresBackend(data)
    if isinstance(data, (str, os.PathLike, Mapping)) or mod.lstrip("_").startswith(("duckdb", "pandas")):
        return DuckDBBackend(data, tables)
    raise InvalidArgumentType(
        "data must be a DuckDB file path, a duckdb connection, a pandas DataFrame or a dict of DataFrames; "
        "a PostgreSQL URL ('postgresql://…'), SQLAlchemy Engine or DB-API connection; a Spark DataFrame or "
        f"(SparkSession, table name); or a dpgate.backends.Backend — got {type(data).__name__}."
    )


def data_schema(data: str, schema_path: str | None, *, error: type[Exception] = InvalidArgument) -> Schema:
    """The schema a command line names: ``--schema``'s file, else an embedded data set's own (``--data pums``).

    Raises:
        error: no ``--schema`` and ``data`` names no embedded data set.
    """
    from dpgate.datasets import list_datasets, schema_of
    from dpgate.schema.domains import Schema

    if schema_path is not None:
        return Schema.load(schema_path)
    if not os.path.exists(data) and data.lower() in list_datasets():
        return schema_of(data.lower())
    if not os.path.exists(data):
        raise error(f"--data {data!r} is neither a file nor an embedded data set ({', '.join(list_datasets())}).")
    raise error(f"--schema is required (a YAML file declaring each table's public domain), except with an embedded "
                f"data set: --data {' / '.join(list_datasets())}.")


def open_data_file(data: str, schema: Schema, *, error: type[Exception] = InvalidArgument) -> Any:
    """``data`` for a ``Gateway`` from a file named on a command line (``dpgate query``, ``dpgate serve`` …),
    or an embedded data set's name (``--data pums``: :func:`dpgate.datasets.connect_duckdb`).

    A DuckDB file path as is; a CSV/Parquet file as a view named like the schema's one
    table, in a new in-memory duckdb connection (the caller closes it).  The file is
    never modified.

    Raises:
        FileNotFoundError: no file at ``data``.
        error: the file is neither DuckDB, CSV nor Parquet, or holds one table for a
            schema of several (the command lines pass ``click.UsageError``).
    """
    import duckdb

    from dpgate.datasets import connect_duckdb, list_datasets

    if not os.path.exists(data):
        if data.lower() in list_datasets():  # --data pums: an embedded data set, when no such file exists
            return connect_duckdb(data.lower())
        raise FileNotFoundError(f"no data file at {data!r} (nor an embedded data set: {', '.join(list_datasets())}).")
    lower = data.lower()
    if lower.endswith((".duckdb", ".db", ".ddb")):
        return data
    readers = {".csv": "read_csv", ".tsv": "read_csv", ".parquet": "read_parquet", ".pq": "read_parquet"}
    ext = os.path.splitext(lower)[1]
    if ext not in readers:
        raise error(f"--data must be a .duckdb, .csv or .parquet file, got {data!r}.")
    if len(schema.tables) != 1:
        raise error(
            f"a {ext} file holds one table but the schema declares {len(schema.tables)}; "
            "use a DuckDB file for several tables."
        )
    con = duckdb.connect()
    getattr(con, readers[ext])(data).create_view(schema.tables[0].name)
    return con
