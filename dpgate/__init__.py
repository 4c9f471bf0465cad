"""dpgate: differentially private answers to SQL and pandas counting queries.

Before spending any privacy budget dpgate runs Bayesian inference over every
answer it has already released; when history already meets the analyst's
accuracy requirement the answer is free, otherwise it charges the smallest
budget that does.  Every answer carries an honest interval.
"""

from __future__ import annotations

from dpgate import accessor as _accessor  # noqa: F401  (registers DataFrame.dp)
from dpgate import dbapi, inference
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
from dpgate.errors import (
    BudgetExhausted,
    DatabaseError,
    DataError,
    DPGateInternalError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    InvalidArgument,
    InvalidArgumentType,
    InvalidRequirement,
    LedgerError,
    NotEstimable,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    QuerySyntaxError,
    QueryTooComplex,
    SchemaError,
    UnsupportedQuery,
    Warning,
)
from dpgate.gateway import POLICIES, Gateway
from dpgate.ledger.core import Ledger
from dpgate.plan.explain import Explanation
from dpgate.schema.domains import Column, Schema, Table

__all__ = [
    "Answer",
    "BINARY",
    "Binary",
    "BudgetExhausted",
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
    "DataError",
    "DatabaseError",
    "DPGateInternalError",
    "Error",
    "Gateway",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidRequirement",
    "Ledger",
    "LedgerError",
    "LinearQuery",
    "NotEstimable",
    "NotSupportedError",
    "OperationalError",
    "POLICIES",
    "ProgrammingError",
    "QuerySyntaxError",
    "QueryTooComplex",
    "Result",
    "Schema",
    "SchemaError",
    "Table",
    "UnsupportedQuery",
    "Warning",
    "apilevel",
    "compile_sql",
    "connect",
    "dbapi",
    "inference",
    "paramstyle",
    "threadsafety",
]
