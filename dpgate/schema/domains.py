"""The schema: the public domain of every table dpgate may answer queries about.

A :class:`Schema` is a tuple of :class:`~dpgate.schema.tables.Table` declarations, loaded from a
dict, a YAML file or pandas frames (:meth:`Schema.from_dataframe`); the cells, kinds and
declaration format of columns are documented in :mod:`dpgate.schema.tables`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dpgate.errors import SchemaError
from dpgate.schema._from_frame import table_from_dataframe
from dpgate.schema._references import check_references, reference_declaration
from dpgate.schema._unit import frame_unit, queryable_columns, unit_declaration
from dpgate.schema.tables import NULL_LABEL, OTHER_LABEL, Column, Table

__all__ = ["Column", "Table", "Schema", "NULL_LABEL", "OTHER_LABEL"]


@dataclass(frozen=True)
class Schema:
    """The public domain of every table dpgate may answer queries about.

    Build one with :meth:`from_dict`, :meth:`from_yaml`, :meth:`load` (any of
    these, or an existing Schema) or :meth:`from_dataframe`.

    Example:
        >>> s = Schema.from_dict({"tables": {"t": {"columns": {"age": {"type": "integer", "min": 0, "max": 9}}}}})
        >>> s.table("t").column("age").n_cells
        11
    """

    tables: tuple[Table, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [t.name.lower() for t in self.tables]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"tables declared twice (names are case-insensitive): {dup}.")
        check_references(self.tables)

    def table(self, name: str) -> Table:
        """The table called ``name`` (case-insensitive); SchemaError names the declared ones."""
        for t in self.tables:
            if t.name.lower() == name.lower():
                return t
        raise SchemaError(f"table {name!r} is not declared in the schema; declared tables: {[t.name for t in self.tables]}.")

    def to_dict(self) -> dict[str, Any]:
        """The schema in its file format."""
        return {"tables": {t.name: t.to_dict() for t in self.tables}}

    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON form; a ledger is bound to it."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    # -- constructors -------------------------------------------------------
    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Schema:
        """Build a schema from the file format (a dict with a ``tables`` key)."""
        if not isinstance(spec, Mapping) or not isinstance(spec.get("tables"), Mapping) or not spec["tables"]:
            raise SchemaError("a schema needs a non-empty 'tables' mapping: {tables: {name: {columns: {...}}}}.")
        tables = []
        for tname, tspec in spec["tables"].items():
            if not isinstance(tspec, Mapping) or not isinstance(tspec.get("columns"), Mapping):
                raise SchemaError(f"table {tname!r}: needs a 'columns' mapping of column name to declaration.")
            unknown = set(tspec) - {"columns", "rows", "privacy_unit", "max_rows_per_unit", "max_rows_per_individual",
                                    "schema", "description", "references", "public", "key"}
            if unknown:
                raise SchemaError(
                    f"table {tname!r}: unknown keys {sorted(unknown)}; allowed: columns, rows, "
                    "privacy_unit, max_rows_per_unit, references, public, key, schema, description."
                )
            cols = tuple(Column.from_dict(str(c), cs, str(tname)) for c, cs in queryable_columns(tspec).items())
            unit = unit_declaration(str(tname), tspec)
            tables.append(Table(str(tname), cols, rows=tspec.get("rows"), schema=tspec.get("schema"), **unit,
                                **reference_declaration(str(tname), tspec)))
        return cls(tuple(tables))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Schema:
        """Load a schema from a YAML file."""
        import yaml

        try:
            with open(path, encoding="utf-8") as fh:
                spec = yaml.safe_load(fh)
        except OSError as exc:
            raise SchemaError(f"cannot read schema file {os.fspath(path)!r}: {exc.strerror}.") from None
        except yaml.YAMLError as exc:
            raise SchemaError(f"schema file {os.fspath(path)!r} is not valid YAML: {exc}.") from None
        return cls.from_dict(spec)

    @classmethod
    def load(cls, schema: Schema | Mapping[str, Any] | str | os.PathLike[str]) -> Schema:
        """Accept a Schema, a dict in the file format, or a YAML path."""
        if isinstance(schema, Schema):
            return schema
        if isinstance(schema, Mapping):
            return cls.from_dict(schema)
        if isinstance(schema, (str, os.PathLike)):
            return cls.from_yaml(schema)
        raise SchemaError(f"expected a dpgate.Schema, a dict or a YAML path, got {type(schema).__name__}.")

    @classmethod
    def from_dataframe(
        cls,
        df: Any,
        name: str = "df",
        *,
        categories: Mapping[str, Iterable[Any]] | None = None,
        bounds: Mapping[str, tuple[Any, ...]] | None = None,
        bins: Mapping[str, Iterable[float]] | None = None,
        unsafe_infer_from_data: bool = False,
        max_rows_per_individual: int = 1,
        nullable: Iterable[str] = (),
        other: Iterable[str] = (),
        privacy_unit: str | None = None,
        max_rows_per_unit: int | None = None,
    ) -> Schema:
        """Declare a one-table schema for a pandas DataFrame.

        Every domain is declared by the caller: ``categories={col: [values]}`` for
        categorical columns (any dtype; values compared as strings), ``bounds={col:
        (min, max)}`` (inclusive integers) or ``bins={col: edges}`` for numeric columns, ``bounds={col:
        ("2024-01-01", "2024-12-31"[, "hour"])}`` (dates, datetimes or ISO text) for dates and timestamps;
        ``bool`` columns are boolean by their type.  ``nullable=[cols]`` and ``other=[cols]``
        declare that those columns may hold NULL / undeclared categories (``GROUP BY``
        then emits their NULL / ``<other>`` groups).  A ``Categorical`` dtype is *not*
        a declaration: ``read_csv(dtype="category")`` and ``astype("category")`` build
        its categories from the values, so a category may exist only because one person
        is in the data — such a column is refused until its values are declared.

        With ``unsafe_infer_from_data=True`` undeclared domains are read from the data
        (a Categorical's categories, observed strings, min/max of numbers) — which leaks
        information about individuals and voids the privacy guarantee for those
        columns — with a warning naming them.

        ``privacy_unit="user_id", max_rows_per_unit=k`` declare the frame's column identifying a
        person (it needs no domain and is never queryable) and how many rows of one person count
        (see the README, "Privacy units"); ``max_rows_per_individual`` is their deprecated,
        unchecked predecessor.

        Raises:
            SchemaError: a column has no declared domain, or a declaration is invalid or names
                a column the frame lacks — every such problem in one error, each showing what to
                write.  (``df.dp.configure`` instead leaves undeclared columns out of the schema.)

        Example:
            >>> import pandas as pd
            >>> df = pd.DataFrame({"zip": pd.Categorical(["10001", "10002"]), "age": [31, 45]})
            >>> t = Schema.from_dataframe(df, categories={"zip": ["10001", "10002", "10003"]},
            ...                           bounds={"age": (0, 100)}).table("df")
            >>> t.column("zip").values
            ('10001', '10002', '10003')
        """
        table = table_from_dataframe(
            df, name, categories=categories, bounds=bounds, bins=bins,
            unsafe_infer_from_data=unsafe_infer_from_data, nullable=nullable, other=other,
            unit=frame_unit(name, privacy_unit, max_rows_per_unit, max_rows_per_individual),
        )
        return cls((table,))
