"""Checks on a pandas frame's declared columns before the gateway registers it.

Separate from :mod:`dpgate.release.cube` (which registers and counts) so the cube module
stays about its one job.  Messages name a column and the kind of bad value, never
a value or its row: they describe private data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgate.errors import DataError
from dpgate.schema.domains import Table

__all__ = ["check_frame_values"]


def check_frame_values(df: Any, table: Table) -> None:
    """Refuse declared columns whose values DuckDB and the ledger's hashing cannot read.

    pandas object columns can hold anything: a list or dict in a cell, or text with
    a lone surrogate (bytes decoded with ``errors="surrogateescape"``), would make
    registering or hashing the frame fail deep inside pandas.  The message names
    the column and the kind of value, never the value or its row.

    Raises:
        DataError: a declared column holds a non-scalar value or invalid Unicode text.
    """
    import pandas as pd

    by_name = {str(k).lower(): k for k in df.columns}
    for col in table.columns:
        key = by_name.get(col.name.lower())
        if key is None:
            continue  # _bind reports missing columns with the others
        series = df[key]
        if isinstance(series, pd.DataFrame):
            continue  # duplicated labels: _bind's catalog lookup reports those
        if isinstance(series.dtype, pd.CategoricalDtype):
            values = series.cat.categories.to_numpy(dtype=object)
        elif series.dtype == object or isinstance(series.dtype, pd.StringDtype):
            values = series.to_numpy(dtype=object)
        else:
            continue  # numeric, boolean and datetime dtypes hold scalars only
        kinds = {type(v) for v in values}
        container = next((k for k in kinds if issubclass(k, _CONTAINERS)), None)
        where = f"column {col.name!r} of table {table.name!r}"
        if container is not None:
            raise DataError(
                f"{where} holds {container.__name__} values; dpgate counts scalar values (text, numbers, "
                "booleans, NULL) — flatten or drop the non-scalar values before opening the gateway."
            )
        texts = [v for v in values if isinstance(v, str)]
        try:
            "".join(texts).encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(
                f"{where} holds text that is not valid Unicode (a lone surrogate, e.g. from decoding bytes "
                "with errors='surrogateescape'); decode the source again, e.g. with errors='replace'."
            ) from None


# Cell values of these types are refused by _check_values (strings are sequences too,
# but scalars for SQL).
_CONTAINERS: tuple[type, ...] = (list, tuple, dict, set, frozenset, np.ndarray)
