"""The DuckDB backend: a database file (read-only), a connection, or pandas frames (internal)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlglot import exp

from dpgate.backends._base import TableBinding, checked_select, engine_failure, information_schema_catalog
from dpgate.errors import InvalidArgumentType, OperationalError, SchemaError, map_exceptions

__all__ = ["DuckDBBackend", "FILE_READERS"]

#: DuckDB's reader of each file kind that holds one table.
FILE_READERS = {".csv": "read_csv", ".tsv": "read_csv", ".parquet": "read_parquet", ".pq": "read_parquet"}


def _file_view(path: str, reader: str, tables: Sequence[str]) -> Any:
    """A new in-memory connection where the CSV or Parquet file at ``path`` is a view named like the
    schema's one table (read by DuckDB on each query; the file is never modified)."""
    import duckdb

    if not os.path.isfile(path):
        raise OperationalError(f"data file {path!r} does not exist.")
    if len(tables) != 1:
        raise SchemaError(f"a {os.path.splitext(path)[1]} file holds one table but the schema declares "
                          f"{len(tables)} {list(tables)}; use a DuckDB file or a dict of DataFrames for several.")
    con = duckdb.connect(":memory:")
    with map_exceptions({duckdb.Error: OperationalError}, f"Cannot read {path!r} with DuckDB's {reader}: {{exc}}."):
        try:
            getattr(con, reader)(path).create_view(tables[0])
        except BaseException:
            con.close()
            raise
    return con



class DuckDBBackend:
    """DuckDB: a database file path (opened ``read_only=True``), a caller's
    ``duckdb`` connection (left open at close), or a pandas DataFrame / ``{name: DataFrame}``
    registered in a private in-memory connection.

    Internal: never release what :meth:`run` returns.

    Attributes:
        frames: the registered DataFrames by lower-cased name (``None`` for a database);
            the cube fingerprints frames with pandas rather than SQL.
    """

    dialect = "duckdb"

    def __init__(self, data: Any, tables: Sequence[str]) -> None:
        import duckdb

        self.owns = True
        self.frames: dict[str, Any] | None = None
        if isinstance(data, (str, os.PathLike)):
            path = os.fspath(data)
            reader = FILE_READERS.get(os.path.splitext(path.lower())[1])
            if reader is not None:  # a CSV or Parquet file: a view named like the one declared table
                self.con = _file_view(path, reader, tables)
                return
            if not os.path.isfile(path):
                raise OperationalError(f"DuckDB database file {path!r} does not exist.")
            with map_exceptions(
                {duckdb.Error: OperationalError},
                f"Cannot open the DuckDB database {path!r} read-only: {{exc}}; check that the file "
                "is a DuckDB database and that no other process writes to it.",
            ):
                self.con = duckdb.connect(path, read_only=True)
            return
        if isinstance(data, duckdb.DuckDBPyConnection):
            self.con, self.owns = data, False
            return
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            if len(tables) != 1:
                raise SchemaError(
                    f"a single DataFrame needs a one-table schema, but the schema declares "
                    f"{len(tables)} tables {list(tables)}; pass a dict {{table_name: DataFrame}}."
                )
            frames = {tables[0]: data}
        elif isinstance(data, Mapping):
            frames = dict(data)
            bad = [k for k, v in frames.items() if not isinstance(v, pd.DataFrame)]
            if bad:
                raise InvalidArgumentType(f"dict values must be pandas DataFrames; not so for {bad}.")
        else:
            raise InvalidArgumentType(
                "data must be a DuckDB file path, a duckdb connection, a pandas DataFrame or a "
                f"dict of DataFrames, got {type(data).__name__}."
            )
        self.con = duckdb.connect(":memory:")
        for name, df in frames.items():
            self.con.register(str(name), df)
        self.frames = {str(k).lower(): v for k, v in frames.items()}

    def catalog(self, tables: Sequence[str]) -> dict[str, TableBinding]:
        """Declared tables found through ``information_schema`` (metadata only)."""
        return information_schema_catalog(lambda e: self._fetch(e.sql(dialect="duckdb"), False), tables)

    def run(self, select: exp.Select, *, numpy: bool = False) -> Any:
        """Run one generated SELECT (``fetchnumpy`` with ``numpy``)."""
        return self._fetch(checked_select(select, "duckdb"), numpy)

    def _fetch(self, sql: str, numpy: bool) -> Any:
        import duckdb

        try:
            res = self.con.execute(sql)
            return res.fetchnumpy() if numpy else res.fetchall()
        except duckdb.Error as exc:  # e.g. a CSV behind a view that changed: its message quotes the line
            raise engine_failure("duckdb", exc) from None

    def row_hash(self, columns: Sequence[exp.Expression]) -> exp.Expression:
        """DuckDB's ``hash(…)`` (unsigned 64-bit; may change across DuckDB releases)."""
        return cast(exp.Expression, exp.func("hash", *columns))

    def close(self) -> None:
        """Close the connection unless the caller owns it."""
        if self.owns:
            self.con.close()
