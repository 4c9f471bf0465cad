"""``Schema.from_dataframe``: a one-table schema from a DataFrame's *declarations*.

Kept apart from ``dpgate.schema.domains`` (which stays free of pandas).  Domains come from
what the caller declares — ``categories``, ``bounds``, ``bins`` — and from ``bool``
dtypes, never from values: a ``Categorical`` dtype is not a declaration, because
``read_csv(dtype="category")`` and ``astype("category")`` build its categories from
the data.  ``unsafe_infer_from_data=True`` reads undeclared domains from the data,
with a warning.

``df.dp.configure`` declares only the columns it names (``declared_only=True``): the
frame's other columns are left out of the schema, so queries cannot use them, and their
values are never read for a domain.  Every problem with the declarations (an unknown or
non-string name, a column declared twice, bounds that are not finite whole numbers, a
category list over the limit, an undeclared column where all are needed) is collected and
reported in one :class:`~dpgate.errors.SchemaError`, each saying what to write.
"""

from __future__ import annotations

import itertools
import math
import numbers
import reprlib
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from dpgate.errors import SchemaError
from dpgate.schema._temporal import parse_instant
from dpgate.schema.tables import MAX_DECLARED_VALUES, Column, Table

__all__ = ["table_from_dataframe", "undeclared_columns_error", "undeclared_message"]


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
    declared_only: bool = False,
) -> Table:
    """The table :meth:`dpgate.Schema.from_dataframe` declares (see there).

    ``declared_only=True`` (``df.dp.configure``): a column neither named in ``categories`` /
    ``bounds`` / ``bins`` nor ``bool`` is left out of the table (not usable in queries) instead of
    refused; its values are not read.  Every problem with the declarations is reported in one
    :class:`SchemaError`, each with what to write.
    """

    problems: list[str] = []
    declared = {arg: _named(arg, given, problems) for arg, given in
                (("categories", categories), ("bounds", bounds), ("bins", bins))}
    frame: dict[str, list[Any]] = {}
    for col in df.columns:
        frame.setdefault(str(col), []).append(col)
    named = [c for arg in declared.values() for c in arg]
    unknown = [c for c in dict.fromkeys(named) if c not in frame]
    if unknown:
        problems.append(f"categories/bounds/bins name columns not in the DataFrame: {_brief(unknown)}; "
                        f"its columns are {_brief(list(frame))}.")
    twice = sorted(set(declared["categories"]) & (set(declared["bounds"]) | set(declared["bins"])))
    if twice:
        problems.append(f"columns {twice} are declared both in categories= and in bounds=/bins=; pick one.")
    doubled = {c for c, labels in frame.items() if len(labels) > 1}
    if doubled & set(named) or (doubled and not declared_only):
        shown = sorted(doubled & set(named) if declared_only else doubled)
        problems.append(f"the DataFrame has several columns named {_brief(shown)} (as strings); rename them apart "
                        "(df.columns = [...]) before declaring.")
    unit = dict(unit or {"privacy_unit": None, "max_rows_per_unit": 1})
    if unit["privacy_unit"] is not None and str(unit["privacy_unit"]) not in frame:
        problems.append(f"privacy_unit={unit['privacy_unit']!r} names no column of the DataFrame.")
    cols: list[Column] = []
    inferred: list[str] = []
    for cname, labels in frame.items():
        if cname == unit["privacy_unit"] or cname in doubled:  # the unit identifies people: never queryable
            continue
        s = df[labels[0]]
        try:
            column = _declared_column(cname, s, name, declared)
        except SchemaError as exc:
            problems.append(str(exc))
            continue
        if column is not None:
            cols.append(column)
        elif unsafe_infer_from_data:
            inferred.append(cname)
            try:
                cols.append(_inferred_column(cname, s))
            except (TypeError, ValueError):  # unhashable or unorderable values: no domain to read
                problems.append(f"DataFrame column {cname!r}: its values (of mixed or non-scalar types) give no "
                                f"domain to infer; declare it, e.g. categories={{{cname!r}: [...]}}.")
        elif not declared_only:
            problems.append(undeclared_message(cname, s))
    usable = {c.name for c in cols}
    flags = {"nullable": _names("nullable", nullable, problems), "other": _names("other", other, problems)}
    for key, names in flags.items():
        absent = sorted(names - set(frame))
        if absent:
            problems.append(f"{key}= names columns not in the DataFrame: {_brief(absent)}.")
        if declared_only and (names & set(frame)) - usable:
            problems.append(f"{key}= names columns that are not declared: {sorted((names & set(frame)) - usable)}; "
                            "declare them in categories= or bounds= too.")
    if declared_only and not named and not problems and not unsafe_infer_from_data and len(cols) < len(frame):
        problems.append(
            "df.dp.configure declares no column: name every column your queries will use, e.g. "
            "categories={'col': [...every possible value...]} or bounds={'col': (min, max)} "
            f"(bool columns are declared by their type); the DataFrame's columns are {_brief(list(frame))}."
        )
    if problems:
        raise SchemaError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems with the declared domains (fix them all):\n- "
                          + "\n- ".join(problems))
    if inferred:
        warnings.warn(
            f"unsafe_infer_from_data=True: the domains of {inferred} were read from the private data; "
            "this leaks information and voids the privacy guarantee for them.",
            UserWarning,
            stacklevel=3,
        )
    cols = [replace(c, nullable=c.name in flags["nullable"], other=c.name in flags["other"]) for c in cols]
    return Table(name, tuple(cols), **unit)


def _named(arg: str, given: Any, problems: list[str]) -> dict[str, Any]:
    """``categories`` / ``bounds`` / ``bins`` as ``{column name: declaration}``; bad keys go to ``problems``."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        problems.append(f"{arg}= must be a dict of column name to declaration, e.g. {_EXAMPLE[arg]}; "
                        f"got {type(given).__name__}.")
        return {}
    out = {}
    for key, value in given.items():
        if isinstance(key, str):
            out[key] = value
        else:
            problems.append(
                f"{arg}= names column {_brief(key)} ({type(key).__name__}): column names are declared as "
                f"strings; write {_brief(str(key))} (and rename the DataFrame's columns with "
                "df.rename(columns=str) if they are not strings)."
            )
    return out


def _names(arg: str, given: Iterable[str], problems: list[str]) -> set[str]:
    """``nullable`` / ``other`` as a set of column names; a bare string or a non-string name is a problem."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        problems.append(f"{arg}= takes a list of column names, e.g. {arg}=['col']; got {_brief(given)}.")
        return set()
    out = set()
    for c in itertools.islice(given, MAX_DECLARED_VALUES + 1):
        if isinstance(c, str):
            out.add(c)
        else:
            problems.append(f"{arg}= lists {_brief(c)} ({type(c).__name__}); column names are strings.")
    return out


def _declared_column(cname: str, s: Any, table: str, declared: Mapping[str, Mapping[str, Any]]) -> Column | None:
    """The column ``cname`` is declared as (by ``categories`` / ``bounds`` / ``bins`` or a bool dtype), else None."""
    import pandas as pd

    cats, bounds, bins = declared["categories"], declared["bounds"], declared["bins"]
    if cname in cats:
        if cname in bounds or cname in bins:
            return None  # reported as declared twice
        return Column.from_dict(cname, {"type": "categorical", "values": _values(cname, cats[cname])}, table)
    if cname in bins:
        edges = _values(cname, bins[cname], arg="bins", example="[0, 18, 65, 120]")
        spec: dict[str, Any] = {"type": "numeric", "bins": edges}
        if cname in bounds:
            lo, hi = _integer_bounds(cname, bounds[cname])
            spec = {"type": "integer", "min": lo, "max": hi, "bins": edges}
        return Column.from_dict(cname, spec, table)
    if cname in bounds and _temporal_bounds(bounds[cname]):
        return Column.from_dict(cname, _temporal_spec(bounds[cname]), table)
    if cname in bounds:
        lo, hi = _integer_bounds(cname, bounds[cname])
        return Column.from_dict(cname, {"type": "integer", "min": lo, "max": hi}, table)
    if pd.api.types.is_bool_dtype(s.dtype):
        return Column(cname, "boolean")
    return None


def _values(cname: str, given: Any, *, arg: str = "categories", example: str = "['0', '1']") -> list[Any]:
    """A declared list (category values or bin edges), read no further than the limit."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise SchemaError(f"{arg}={{{cname!r}: ...}} must be a list, e.g. {arg}={{{cname!r}: {example}}}; "
                          f"got {_brief(given)}.")
    values = list(itertools.islice(given, MAX_DECLARED_VALUES + 1))
    if len(values) > MAX_DECLARED_VALUES:
        raise SchemaError(f"{arg}={{{cname!r}: ...}} lists more than the limit of {MAX_DECLARED_VALUES} values; "
                          + ("declare a coarser domain (group rare values into one, or use other=)."
                             if arg == "categories" else "use fewer, wider bins."))
    return values


def _integer_bounds(cname: str, given: Any) -> tuple[int, int]:
    """``bounds=`` for an integer column: two finite whole numbers, low first."""
    pair = tuple(given) if isinstance(given, (tuple, list)) else None
    ok = pair is not None and len(pair) == 2 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()
        for v in pair)
    if not ok or pair is None:
        raise SchemaError(f"bounds={{{cname!r}: ...}} must be (min, max) as finite whole numbers, e.g. "
                          f"bounds={{{cname!r}: (0, 100)}}, or dates ('2024-01-01', '2024-12-31'); got {_brief(given)}.")
    lo, hi = int(pair[0]), int(pair[1])
    if hi < lo:
        raise SchemaError(f"bounds={{{cname!r}: ({lo}, {hi})}}: min is above max; write ({hi}, {lo}).")
    return lo, hi


def _brief(v: Any) -> str:
    """A bounded repr for messages (a huge declaration cannot flood one)."""
    text = _ECHO.repr(v)
    return text if len(text) <= 200 else text[:199] + "…"


_ECHO = reprlib.Repr()
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxset = 8
_ECHO.maxstring = _ECHO.maxother = 40
_EXAMPLE = {"categories": "categories={'sex': ['0', '1']}", "bounds": "bounds={'age': (0, 100)}",
            "bins": "bins={'income': [0, 10000, 50000]}"}


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


def undeclared_columns_error(df: Any, table: Table, missing: list[str]) -> SchemaError:
    """The refusal of a query using columns ``missing`` of ``df`` that ``df.dp.configure`` did not
    declare (so not in ``table``): each with what to write (from its dtype, never its values)."""
    import pandas as pd

    frame = {str(c).lower(): c for c in df.columns}
    hints = []
    for n in missing:
        column = df[frame[n.lower()]]
        hints.append(undeclared_message(n, column) if isinstance(column, pd.Series) else
                     f"DataFrame column {n!r}: declare it with categories={{{n!r}: [...]}} or bounds={{{n!r}: (lo, hi)}}.")
    which = f"column {missing[0]!r}" if len(missing) == 1 else f"columns {missing}"
    return SchemaError(
        f"the query uses {which} of the DataFrame, which df.dp.configure did not declare: only declared columns "
        f"are part of table {table.name!r} ({[c.name for c in table.columns]}), and nothing was read or spent. "
        "Declare every column you query when you configure these rows — categories={'col': [...]} or "
        "bounds={'col': (lo, hi)}; configuring the same rows again with another schema is refused in this process "
        "(one budget per set of people), so declare them in the first df.dp.configure call or in a new process:\n- "
        + "\n- ".join(hints)
    )


def undeclared_message(cname: str, s: Any) -> str:
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
