"""The Spark backend: Spark SQL generated in sqlglot's ``spark`` dialect (internal).

Each generated SELECT runs through ``SparkSession.sql``; Spark plans and
executes the aggregation on its executors, and ``collect()`` brings back only the
aggregated result — per-cell counts, one row per cell at most.  Spark SQL has no
read-only transactions; what makes this path read-only is that only sqlglot
``SELECT`` trees built by dpgate reach ``sql()`` (:func:`checked_select`).
On a cluster nothing changes but the ``SparkSession``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlglot import exp

from dpgate.backends._base import TableBinding, checked_select, columns_of, engine_failure
from dpgate.errors import InvalidArgumentType, SchemaError

__all__ = ["SparkBackend"]


class SparkBackend:
    """Spark: ``(SparkSession, "table")``, ``(SparkSession, {name: "db.table"})``, a
    Spark DataFrame (one-table schema) or ``{name: DataFrame}``.

    DataFrames are registered as temporary views with private random names (dropped
    at :meth:`close`); tables are read through the session's catalog.

    Args:
        spark: the session (``None`` when ``source`` holds DataFrames).
        source: a table name, a DataFrame, or a mapping of declared name to either.
        tables: the declared table names.
    """

    dialect = "spark"

    def __init__(self, spark: Any, source: Any, tables: Sequence[str]) -> None:
        if isinstance(source, (str, bytes)) or not isinstance(source, Mapping):
            if len(tables) != 1:
                raise SchemaError(
                    f"one Spark table or DataFrame needs a one-table schema, but the schema declares {list(tables)}; "
                    "pass {table_name: table or DataFrame}."
                )
            source = {tables[0]: source}
        self._views: list[str] = []
        self._names: dict[str, str] = {}
        for name, src in source.items():
            if isinstance(src, str):
                if spark is None:
                    raise InvalidArgumentType(f"table {name!r} is a name: pass (SparkSession, {{...}}).")
                self._names[str(name).lower()] = src
            elif type(src).__module__.startswith("pyspark") and hasattr(src, "createOrReplaceTempView"):
                spark = spark or src.sparkSession
                view = f"dpgate_{uuid.uuid4().hex}"
                src.createOrReplaceTempView(view)
                self._views.append(view)
                self._names[str(name).lower()] = view
            else:
                raise InvalidArgumentType(
                    f"Spark table {name!r} must be a table name or a Spark DataFrame, got {type(src).__name__}; "
                    "pass a SparkSession together with a table name: (spark, 'db.table')."
                )
        self.spark = spark
        self._lock = threading.Lock()

    def catalog(self, tables: Sequence[str]) -> dict[str, TableBinding]:
        """Declared tables with their Spark schema (metadata only: no job runs)."""
        out: dict[str, TableBinding] = {}
        for t in tables:
            name = self._names.get(t.lower())
            if name is None:
                continue
            try:
                fields = self.spark.table(name).schema.fields
            except Exception:  # the catalog does not know it: reported as a missing table
                continue
            ref = exp.to_table(name, dialect="spark")
            for part in ("this", "db", "catalog"):
                ident = ref.args.get(part)
                if isinstance(ident, exp.Identifier):
                    ident.set("quoted", True)
            out[t.lower()] = TableBinding(ref, {f.name.lower(): (f.name, f.dataType.simpleString()) for f in fields})
        return out

    def run(self, select: exp.Select, *, numpy: bool = False) -> Any:
        """Run one generated SELECT; collects only its (aggregated) result rows."""
        sql = checked_select(select, "spark")
        with self._lock:
            try:
                df = self.spark.sql(sql)
                names, rows = df.columns, [tuple(r) for r in df.collect()]
            except Exception as exc:
                raise engine_failure("Spark", exc) from None
        return columns_of(names, rows) if numpy else rows

    def row_hash(self, columns: Sequence[exp.Expression]) -> exp.Expression:
        """Spark's ``xxhash64(…)`` of the row's values (64-bit, seed 42)."""
        return cast(exp.Expression, exp.func("xxhash64", *columns))

    def close(self) -> None:
        """Drop the private views of registered DataFrames (the session stays the caller's)."""
        views, self._views = self._views, []
        for view in views:
            try:
                self.spark.catalog.dropTempView(view)
            except Exception:  # the session was stopped first: its views are gone with it
                pass
