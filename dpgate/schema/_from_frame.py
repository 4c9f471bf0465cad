"""``Schema.from_dataframe``: a one-table schema from a DataFrame's *declarations*.

Kept apart from ``dpgate.schema.domains`` (which stays free of pandas).  Domains come from
what the caller declares — ``categories``, ``bounds``, ``bins`` — and from ``bool``
dtypes, never from values: a ``Categorical`` dtype is not a declaration, because
``read_csv(dtype="category")`` and ``astype("category")`` build its categories from
the data.  ``unsafe_infer_from_data=True`` reads undeclared domains from the data,
with a warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from dpgate.errors import SchemaError
from dpgate.schema._temporal import parse_instant
from dpgate.schema.tables import Column, Table

__all__ = ["table_from_dataframe"]


def table_from_dataframe(
    df: Any,
    name: str,
    *,
    categories: Mapping[str, Iterable[Any]] | None,
    bounds: Mapping[str, tuple[Any, ...]] | None,
    bins: Mapping[str, Iterable[float]] | None,
    unsafe_infer_from_data: bool,
    nullable: Iterable[str] = (),
    other: Iterable[str] = (),
    unit: Mapping[str, Any] | None = None,
) -> Table:
    """The table :meth:`dpgate.Schema.from_dataframe` declares (see there)."""
    import pandas as pd

    flags = {"nullable": {str(c) for c in nullable}, "other": {str(c) for c in other}}
    for key, names in flags.items():
        missing = sorted(names - {str(c) for c in df.columns})
        if missing:
            raise SchemaError(f"{key}= names columns not in the DataFrame: {missing}.")

    declared = {str(k): tuple(str(v) for v in vs) for k, vs in (categories or {}).items()}
    bounds = dict(bounds or {})
    bins = {k: list(v) for k, v in (bins or {}).items()}
    unknown = (set(declared) | set(bounds) | set(bins)) - {str(c) for c in df.columns}
    if unknown:
        raise SchemaError(f"categories/bounds/bins name columns not in the DataFrame: {sorted(unknown)}.")
    twice = sorted(set(declared) & (set(bounds) | set(bins)))
    if twice:
        raise SchemaError(f"columns {twice} are declared both in categories= and in bounds=/bins=; pick one.")
    cols: list[Column] = []
    inferred: list[str] = []
    unit = dict(unit or {"privacy_unit": None, "max_rows_per_unit": 1})
    if unit["privacy_unit"] is not None and str(unit["privacy_unit"]) not in {str(c) for c in df.columns}:
        raise SchemaError(f"privacy_unit={unit['privacy_unit']!r} names no column of the DataFrame.")
    for col in df.columns:
        cname, s = str(col), df[col]
        if cname == unit["privacy_unit"]:  # identifies people: no domain, never queryable
            continue
        if cname in declared:
            cols.append(Column.from_dict(cname, {"type": "categorical", "values": list(declared[cname])}, name))
        elif pd.api.types.is_bool_dtype(s.dtype):
            cols.append(Column(cname, "boolean"))
        elif cname in bins:
            spec: dict[str, Any] = {"type": "numeric", "bins": bins[cname]}
            if cname in bounds:
                spec = {"type": "integer", "min": bounds[cname][0], "max": bounds[cname][1], "bins": bins[cname]}
            cols.append(Column.from_dict(cname, spec, name))
        elif cname in bounds and _temporal_bounds(bounds[cname]):
            cols.append(Column.from_dict(cname, _temporal_spec(bounds[cname]), name))
        elif cname in bounds:
            lo, hi = bounds[cname]
            cols.append(Column.from_dict(cname, {"type": "integer", "min": lo, "max": hi}, name))
        elif unsafe_infer_from_data:
            inferred.append(cname)
            cols.append(_inferred_column(cname, s))
        else:
            raise SchemaError(_undeclared(cname, s))
    if inferred:
        warnings.warn(
            f"unsafe_infer_from_data=True: the domains of {inferred} were read from the private data; "
            "this leaks information and voids the privacy guarantee for them.",
            UserWarning,
            stacklevel=3,
        )
    cols = [replace(c, nullable=c.name in flags["nullable"], other=c.name in flags["other"]) for c in cols]
    return Table(name, tuple(cols), **unit)


def _inferred_column(cname: str, s: Any) -> Column:
    """The domain of ``s`` read from its values (only under ``unsafe_infer_from_data=True``)."""
    import pandas as pd

    where = f"DataFrame column {cname!r}"
    if isinstance(s.dtype, pd.CategoricalDtype):
        # Categories built by read_csv/astype("category") are the observed values: data, not declaration.
        values = [str(v) for v in s.cat.categories]
        if not values:
            raise SchemaError(f"{where}: a Categorical with no categories has no domain to infer; declare it.")
        return Column(cname, "categorical", values=tuple(values))
    if pd.api.types.is_datetime64_any_dtype(s.dtype):  # days from the earliest to the latest value
        lo, hi = s.min(), s.max()
        if pd.isna(lo):
            raise SchemaError(f"{where}: no non-NULL values to infer a date range from; declare bounds.")
        return Column.from_dict(cname, {"type": "date", "min": lo.to_pydatetime(), "max": hi.to_pydatetime()})
    if pd.api.types.is_numeric_dtype(s.dtype):
        lo, hi = s.min(), s.max()
        if pd.isna(lo):
            raise SchemaError(f"{where}: no non-NULL values to infer bounds from; declare bounds.")
        return Column(cname, "integer", min=int(math.floor(lo)), max=int(math.ceil(hi)))
    values = sorted({str(v) for v in s.dropna().unique()})
    if not values:
        raise SchemaError(f"{where}: no non-NULL values to infer a domain from; declare it.")
    return Column(cname, "categorical", values=tuple(values))


def _undeclared(cname: str, s: Any) -> str:
    """The refusal for a column without a declared domain, saying how to declare one."""
    import pandas as pd

    where = f"DataFrame column {cname!r}"
    if isinstance(s.dtype, pd.CategoricalDtype):
        return (
            f"{where} is Categorical, but its categories are not a public domain: read_csv(dtype='category') "
            "and astype('category') build them from the data, so a category can reveal one person. Declare "
            f"its values: df.dp.configure(categories={{{cname!r}: [...every possible value...]}}) (or "
            f"Schema.from_dataframe(df, categories={{{cname!r}: [...]}}))."
        )
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        return (
            f"{where}: date and timestamp columns need a public range; pass bounds={{{cname!r}: "
            "('2024-01-01', '2024-12-31')} (days), or (min, max, 'hour') for another granularity "
            "(minute, hour, day, month, year)."
        )
    if pd.api.types.is_numeric_dtype(s.dtype):
        return (
            f"{where}: numeric columns need public bounds; pass bounds={{{cname!r}: (min, max)}} "
            f"or bins={{{cname!r}: [edges]}}, or categories={{{cname!r}: [...]}} for codes."
        )
    return (
        f"{where}: dtype {s.dtype} has no public domain; declare its values: "
        f"df.dp.configure(categories={{{cname!r}: [...every possible value...]}})."
    )


def _temporal_bounds(b: Any) -> bool:
    """Whether ``bounds=`` declares a date range: (min, max[, granularity]) with dates, datetimes or ISO text."""
    return isinstance(b, (tuple, list)) and len(b) in (2, 3) and all(parse_instant(v) is not None for v in b[:2])


def _temporal_spec(b: Any) -> dict[str, Any]:
    """The declaration of a date range from ``bounds=``: a date column unless the granularity is finer than a day."""
    gran = str(b[2]).lower() if len(b) == 3 else "day"
    kind = "timestamp" if gran in ("hour", "minute") else "date"
    return {"type": kind, "min": b[0], "max": b[1], "granularity": gran}
