"""dpgate's exception tree: the PEP 249 classes, with dpgate's own errors below.

::

    Exception
     ├── Warning                      PEP 249
     └── Error                        PEP 249; every dpgate error is one
          ├── InterfaceError          PEP 249: misuse of the driver objects
          └── DatabaseError           PEP 249
               ├── DataError          PEP 249
               │    └── InvalidRequirement   bad accuracy / confidence / budget values
               ├── OperationalError   PEP 249
               │    ├── BudgetExhausted      the query would overspend the budget
               │    └── LedgerError          the ledger is unusable or bound elsewhere
               ├── IntegrityError     PEP 249
               ├── InternalError      PEP 249
               │    └── DPGateInternalError  "... this is a bug in dpgate"
               ├── ProgrammingError   PEP 249
               │    ├── InvalidArgument      a malformed argument (also a ValueError)
               │    │    └── InvalidArgumentType   an argument of the wrong type (also a TypeError)
               │    ├── SchemaError          the declared domain is invalid or missing
               │    └── UnsupportedQuery     parsed SQL that dpgate refuses
               │         ├── QuerySyntaxError   SQL that does not parse
               │         └── QueryTooComplex    SQL longer or more deeply nested than dpgate's limits
               └── NotSupportedError  PEP 249
                    └── NotEstimable         history cannot answer and no budget may be spent

Every error is raised before any data is read and before any budget is spent,
unless its docstring says otherwise.

Errors of the layers below (sqlite3, duckdb, sqlglot) are translated into this
tree at the boundary, with :func:`map_exceptions` (httpx's pattern), so a caller
catches ``dpgate.Error`` and nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

# The one list of dpgate's exception classes: ``dpgate`` and ``dpgate.dbapi`` (PEP 249 wants them
# on the driver module) re-export exactly these with ``from dpgate.errors import *`` and extend
# their own ``__all__`` with it.  ``map_exceptions`` is for dpgate's own modules, so not listed.
__all__ = [
    "Warning",
    "Error",
    "InterfaceError",
    "DatabaseError",
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
    "InvalidArgument",
    "InvalidArgumentType",
    "SchemaError",
    "UnsupportedQuery",
    "QuerySyntaxError",
    "QueryTooComplex",
    "BudgetExhausted",
    "LedgerError",
    "InvalidRequirement",
    "NotEstimable",
    "DPGateInternalError",
]

_builtin_warning = Warning


class Warning(_builtin_warning):  # noqa: A001 - PEP 249 requires this name
    """PEP 249 ``Warning``: important warnings such as data truncation."""


class Error(Exception):
    """Base class of every error dpgate raises (PEP 249 ``Error``)."""


class InterfaceError(Error):
    """PEP 249: an error of the driver interface rather than the database (e.g. a closed cursor)."""


class DatabaseError(Error):
    """PEP 249: an error related to the database."""


class DataError(DatabaseError):
    """PEP 249: a problem with the processed data or a parameter value."""


class OperationalError(DatabaseError):
    """PEP 249: an error in the database's operation, not necessarily under the caller's control.

    ``sqlstate``: for a data source's failure, the SQLSTATE of its class of failure
    (``dpgate.backends``), which ``dpgate serve`` sends; None otherwise."""

    sqlstate: str | None = None


class IntegrityError(DatabaseError):
    """PEP 249: relational integrity is affected."""


class InternalError(DatabaseError):
    """PEP 249: the database hit an internal error."""


class ProgrammingError(DatabaseError):
    """PEP 249: a programming error, e.g. a bad table name or SQL syntax."""


class NotSupportedError(DatabaseError):
    """PEP 249: a method or API the database does not support was used."""


class InvalidArgument(ProgrammingError, ValueError):
    """An argument of a dpgate function is malformed (a wrong shape, a non-finite number, ...).

    It is also a ``ValueError``, so code written against scipy-style interfaces
    (a posterior's ``ppf`` with a probability outside [0, 1]) catches it as usual.
    """


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of a dpgate function has the wrong type; also a ``TypeError``."""


class SchemaError(ProgrammingError):
    """The declared public domain is invalid, or a query names an undeclared table or column."""


class UnsupportedQuery(NotSupportedError, ProgrammingError):
    """dpgate refuses this SQL: it is not a linear counting query over a declared table.

    The message says what was refused and what to write instead.  Raised by the
    compiler, before any data is read and before any budget is spent.
    """


class QuerySyntaxError(UnsupportedQuery):
    """The SQL text does not parse; the message carries sqlglot's position."""


class QueryTooComplex(UnsupportedQuery):
    """The SQL text exceeds a size or nesting limit of the compiler, or the statement has
    more outputs than the gateway answers in one go.

    The limits (``dpgate.compile.statement.MAX_SQL_LENGTH``, ``MAX_TOKENS``,
    ``MAX_NESTING_DEPTH``, ``MAX_OPERATORS``) are checked on the tokens, before
    the parser recurses; ``Gateway(max_outputs=...)`` after compiling, before any
    data is read.  The message names the limit and the value found.
    """


class BudgetExhausted(OperationalError):
    """Answering would spend more privacy budget than remains.

    Attributes:
        needed: the budget the query would cost (increase of the system cost).
        remaining: the budget left.
        estimate: the best estimate history alone gives (an ``Answer``), or ``None``.
    """

    def __init__(self, message: str, *, needed: float, remaining: float, estimate: object = None):
        super().__init__(message)
        self.needed = needed
        self.remaining = remaining
        self.estimate = estimate


class LedgerError(OperationalError):
    """The ledger cannot be used: it is bound to other data or another schema, or is corrupt."""


class InvalidRequirement(DataError, ValueError):
    """An accuracy, confidence, budget or similar argument is out of range."""


class NotEstimable(NotSupportedError):
    """History does not determine this query and the caller forbade spending budget."""


class DPGateInternalError(InternalError):
    """An invariant inside dpgate failed; the message ends with "this is a bug in dpgate"."""

    def __init__(self, message: str):
        super().__init__(f"{message}; this is a bug in dpgate")


@contextlib.contextmanager
def map_exceptions(
    mapping: Mapping[type[BaseException], type[Error]],
    message: str | Callable[[BaseException], str] = "{exc}",
) -> Iterator[None]:
    """Re-raise a lower layer's exception as a dpgate error, chained with ``from``.

    Inside the ``with`` block an exception that is an instance of a key of
    ``mapping`` (the first matching key, in order) is re-raised as the mapped
    dpgate class; any other exception, and any ``dpgate.Error``, passes
    unchanged.  The original stays reachable as ``__cause__``.

    Args:
        mapping: lower-layer exception class -> dpgate error class; the dpgate
            class is built from the message alone.
        message: the new error's text, a full sentence telling the user what to
            change.  A string has its literal ``{exc}`` replaced by the lower
            error's text (no other ``{...}`` is interpreted, so paths and SQL
            with braces are safe); a callable gets the lower exception and
            returns the text (e.g. to quote a parser's position).

    Example:
        >>> import sqlite3
        >>> try:
        ...     with map_exceptions({sqlite3.OperationalError: LedgerError},
        ...                         "Cannot read the ledger: {exc}."):
        ...         raise sqlite3.OperationalError("database is locked")
        ... except LedgerError as err:
        ...     print(err, "|", type(err.__cause__).__name__)
        Cannot read the ledger: database is locked. | OperationalError
    """
    try:
        yield
    except Error:
        raise
    except BaseException as exc:
        target = next((to for source, to in mapping.items() if isinstance(exc, source)), None)
        if target is None:
            raise
        text = message(exc) if callable(message) else message.replace("{exc}", str(exc))
        raise target(text) from exc
