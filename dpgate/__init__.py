"""dpgate: differentially private answers to SQL and pandas counting queries.

Before spending any privacy budget dpgate runs Bayesian inference over every
answer it has already released; when history already meets the analyst's
accuracy requirement the answer is free, otherwise it charges the smallest
budget that does.  Every answer carries an honest interval.
"""

from __future__ import annotations

from dpgate import accessor as _accessor  # noqa: F401  (registers DataFrame.dp)
from dpgate import dbapi, errors, inference
from dpgate._version import __version__ as __version__
from dpgate.answer.result import Answer, Result
from dpgate.compile import compile_sql
from dpgate.compile.query import LinearQuery
from dpgate.dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)
from dpgate.errors import *  # noqa: F403  (the exception classes: errors.__all__)
from dpgate.gateway import POLICIES, Gateway
from dpgate.ledger.core import Ledger
from dpgate.plan.explain import Explanation
from dpgate.schema.domains import Column, Schema, Table

__all__ = [
    "Answer",
    "BINARY",
    "Binary",
    "Column",
    "DATETIME",
    "Date",
    "DateFromTicks",
    "Explanation",
    "NUMBER",
    "ROWID",
    "STRING",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Gateway",
    "Ledger",
    "LinearQuery",
    "POLICIES",
    "Result",
    "Schema",
    "Table",
    "apilevel",
    "compile_sql",
    "connect",
    "dbapi",
    "inference",
    "paramstyle",
    "threadsafety",
]
__all__ += errors.__all__  # the exception classes, listed once in dpgate.errors
