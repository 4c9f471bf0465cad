"""The PEP 249 side of ``dpgate.dbapi`` that is not a connection or a cursor.

PEP 249 type objects and constructors (re-exported by :mod:`dpgate.dbapi`), and
the rows of a result set built from a released :class:`~dpgate.answer.result.Result`
(one row per declared GROUP BY key, HAVING / ORDER BY / LIMIT applied to the
released values).  Building rows is post-processing: nothing is read or spent.

Also what the connection and the cursor share without importing each other: a
statement compiled once (:class:`Prepared`) and what a cursor asks of its
connection (:class:`Statements`).
"""

from __future__ import annotations

import datetime as _dt
import math
import time as _time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dpgate.answer.result import Answer, Result
from dpgate.compile import CompiledStatement, SetOption
from dpgate.errors import ProgrammingError
from dpgate.plan.explain import COLUMNS, Explanation
from dpgate.schema.domains import Schema

__all__ = [
    "DBAPITypeObject",
    "STRING",
    "BINARY",
    "NUMBER",
    "DATETIME",
    "ROWID",
    "Date",
    "Time",
    "Timestamp",
    "Binary",
    "DateFromTicks",
    "TimeFromTicks",
    "TimestampFromTicks",
    "ResultSet",
    "NO_ROWS",
    "Prepared",
    "Statements",
    "result_set",
    "explain_set",
]


# -- PEP 249 type objects and constructors ----------------------------------------------------
class DBAPITypeObject:
    """Compares equal to every type code of its group (PEP 249 "Type Objects")."""

    def __init__(self, name: str, *values: str) -> None:
        self.name = name
        self.values = frozenset(values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DBAPITypeObject):
            return self.values == other.values
        return other in self.values

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"<dpgate.dbapi.{self.name}>"


#: PEP 249 type object: text columns (group keys of categorical and binned columns, ``source``).
STRING = DBAPITypeObject("STRING", "VARCHAR")
#: PEP 249 type object: binary columns (dpgate returns none).
BINARY = DBAPITypeObject("BINARY", "BLOB")
#: PEP 249 type object: numbers (released values, intervals, integer and boolean keys).
NUMBER = DBAPITypeObject("NUMBER", "DOUBLE", "BIGINT", "BOOLEAN")
#: PEP 249 type object: dates and times (dpgate returns none).
DATETIME = DBAPITypeObject("DATETIME", "DATE", "TIME", "TIMESTAMP")
#: PEP 249 type object: row ids (dpgate returns none).
ROWID = DBAPITypeObject("ROWID", "ROWID")

Date = _dt.date
Time = _dt.time
Timestamp = _dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> _dt.date:  # noqa: N802 - PEP 249 name
    """PEP 249 constructor: the local date of a POSIX timestamp."""
    return Date(*_time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> _dt.time:  # noqa: N802 - PEP 249 name
    """PEP 249 constructor: the local time of a POSIX timestamp."""
    return Time(*_time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> _dt.datetime:  # noqa: N802 - PEP 249 name
    """PEP 249 constructor: the local date and time of a POSIX timestamp."""
    return Timestamp(*_time.localtime(ticks)[:6])


# -- result sets -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResultSet:
    """The outcome of one statement run: rows (tuples), their description and answers."""

    description: tuple[tuple[Any, ...], ...] | None
    rows: tuple[tuple[Any, ...], ...]
    result: Result | None
    answers: tuple[Answer, ...]

    @property
    def rowcount(self) -> int:
        return -1 if self.description is None else len(self.rows)


NO_ROWS = ResultSet(None, (), None, ())


@dataclass(frozen=True)
class Prepared:
    """One statement compiled once, for a connection: what the server's cap check quotes
    (``Connection.quote``) is the very value it then runs (``Connection.run``).

    Attributes:
        operation: the text as given (a leading ``EXPLAIN`` included).
        params: its parameters, checked (a list or a mapping), or None.
        compiled: the SELECT (without ``EXPLAIN``) or ``SET dpgate.*``, compiled — a frozen,
            shared value (``Gateway.compile``'s cache).
        explain: whether the text was ``EXPLAIN SELECT …``: running it returns the quote's rows.
    """

    operation: str
    params: Sequence[Any] | Mapping[str, Any] | None
    compiled: CompiledStatement | SetOption
    explain: bool


class Statements(Protocol):
    """What a cursor asks of its connection (so that the cursor need not import the connection)."""

    def _run(self, operation: str, parameters: Any) -> ResultSet:
        """Compile and run one statement; its result set."""

    def _check_open(self) -> None:
        """Raise ``InterfaceError`` if the connection is closed."""


_GROUP_TYPES = {"integer": "BIGINT", "binned": "VARCHAR", "categorical": "VARCHAR", "boolean": "BOOLEAN",
                "date": "DATE", "timestamp": "TIMESTAMP"}
_ROW_KEY = "\x00dpgate_group"


def _python(v: Any) -> Any:
    """A plain Python value for a cell of a returned row (NaN → None)."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def result_set(result: Result, intervals: bool, schema: Schema) -> ResultSet:
    """Rows of a released Result, one per group, after HAVING / ORDER BY / LIMIT."""
    st: CompiledStatement = result.statement
    n_aggs = st.n_aggregates
    table = schema.table(st.table)
    names: list[str] = []
    types: list[tuple[str, bool]] = []
    for out in st.outputs:
        if out.kind == "group":
            names.append(out.name)
            kind = table.column(st.group_columns[out.index]).kind
            if kind in ("date", "timestamp") and any(isinstance(k[out.index], int) for k in st.group_keys):
                kind = "integer"  # GROUP BY EXTRACT(… FROM a date): integer keys
            types.append((_GROUP_TYPES[kind], True))
        else:
            names.append(out.name)
            # Integers when every answer of the column was rounded (SET dpgate.round = on).
            column = result.answers[out.index :: n_aggs] if n_aggs else ()
            number = "BIGINT" if column and all(isinstance(a.value, int) for a in column) else "DOUBLE"
            types.append((number, True))
            if intervals:
                names += [f"{out.name}_low", f"{out.name}_high", f"{out.name}_source"]
                types += [(number, False), (number, False), ("VARCHAR", False)]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ProgrammingError(
            f"with dpgate.intervals on, the output columns {dup} appear twice; rename the SELECT items "
            "(an alias ending in _low, _high or _source collides with the interval columns)."
        )
    records: list[list[Any]] = []
    for g, key in enumerate(st.group_keys):
        keys: dict[str | None, Any] = dict(zip(st.group_columns, key, strict=True))
        chunk = result.answers[g * n_aggs : (g + 1) * n_aggs]
        row: list[Any] = []
        agg_i = 0
        for out in st.outputs:
            if out.kind == "group":
                row.append(keys.get(out.column))
                continue
            a = chunk[agg_i]
            agg_i += 1
            row.append(a.value)
            if intervals:
                row += [a.low, a.high, a.source]
        row.append(g)
        records.append(row)
    order = list(range(len(records)))
    if not st.postprocess.is_noop:
        import pandas as pd

        frame = pd.DataFrame(records, columns=[*names, _ROW_KEY])
        frame = st.apply_postprocessing(frame)
        order = [int(g) for g in frame[_ROW_KEY]]
    rows = tuple(tuple(_python(v) for v in records[g][:-1]) for g in order)
    answers = tuple(a for g in order for a in result.answers[g * n_aggs : (g + 1) * n_aggs])
    description = tuple((n, t, None, None, None, None, null_ok) for n, (t, null_ok) in zip(names, types, strict=True))
    return ResultSet(description, rows, result, answers)


_EXPLAIN_TYPES = ("VARCHAR", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "VARCHAR")


def explain_set(explanation: Explanation) -> ResultSet:
    """The rows of ``EXPLAIN SELECT …``: one per output, columns :data:`dpgate.plan.explain.COLUMNS`."""
    rows = tuple(tuple(_python(v) for v in row) for row in explanation.rows())
    description = tuple((n, t, None, None, None, None, True) for n, t in zip(COLUMNS, _EXPLAIN_TYPES, strict=True))
    return ResultSet(description, rows, None, ())
