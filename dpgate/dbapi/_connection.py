"""The DB-API ``Connection``: one session of SQL over a gateway (internal; public as
:class:`dpgate.dbapi.Connection`, where the module docstring records every choice PEP 249
leaves open)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any

from dpgate import errors
from dpgate.answer.result import Result
from dpgate.compile import CompiledStatement, SetOption
from dpgate.dbapi._cursor import Cursor
from dpgate.dbapi._rows import NO_ROWS, Prepared, ResultSet, explain_set, result_set
from dpgate.errors import (
    DPGateInternalError,
    InterfaceError,
    NotSupportedError,
    ProgrammingError,
    UnsupportedQuery,
    map_exceptions,
)
from dpgate.gateway import Gateway
from dpgate.plan.explain import Explanation, strip_explain
from dpgate.plan.requirement import Requirement, hinted, resolve_confidence, resolve_requirement

__all__ = ["Connection"]


class Connection:
    """A PEP 249 connection: one session of SQL over a :class:`~dpgate.Gateway`.

    Create with :func:`connect`.  Beyond PEP 249 it offers :meth:`execute`
    (sqlite3-style shortcut), :attr:`gateway`, :attr:`settings`, and the budget
    views :attr:`budget`, :attr:`spent`, :attr:`remaining` and :attr:`history`; and, for
    front ends such as ``dpgate serve``, :meth:`prepare`, :meth:`quote` and :meth:`run` (a
    statement compiled once, quoted, then run).
    The PEP 249 exception classes are attributes (``con.Error``, ``con.OperationalError`` …).
    """

    Warning = errors.Warning
    Error = errors.Error
    InterfaceError = errors.InterfaceError
    DatabaseError = errors.DatabaseError
    DataError = errors.DataError
    OperationalError = errors.OperationalError
    IntegrityError = errors.IntegrityError
    InternalError = errors.InternalError
    ProgrammingError = errors.ProgrammingError
    NotSupportedError = errors.NotSupportedError

    def __init__(self, gateway: Gateway, settings: dict[str, Any], *, owns_gateway: bool) -> None:
        self._gateway = gateway
        self._owns = owns_gateway
        self._settings = dict(settings)
        self._closed = False
        self._lock = threading.Lock()

    # -- PEP 249 ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (and the gateway it opened); later operations raise InterfaceError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._owns:
            self._gateway.close()

    def commit(self) -> None:
        """No-op: every release was committed to the ledger before its answer was returned."""
        self._check_open()

    def rollback(self) -> None:
        """Always raises ``NotSupportedError``: released answers and spent budget cannot be undone."""
        self._check_open()
        raise NotSupportedError(
            "rollback is not supported: dpgate is read-only, and every answer it returned was recorded in the "
            "ledger first — a release and the privacy budget it cost cannot be taken back."
        )

    def cursor(self) -> Cursor:
        """A new cursor on this connection."""
        self._check_open()
        return Cursor(self)

    def __enter__(self) -> Connection:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- extensions ------------------------------------------------------------------------------
    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        """sqlite3-style shortcut: a new cursor, executed."""
        return self.cursor().execute(operation, parameters)

    def explain(self, operation: str, parameters: Any = None) -> Explanation:
        """The quote of ``operation`` (what ``EXPLAIN`` returns as rows), under this connection's
        ``SET dpgate.*`` settings and the statement's hints; free: reads no data, spends nothing."""
        self._check_open()
        params = _params(parameters)
        return self._quote(self._gateway.compile_any(operation, params, max_outputs=self.output_limit))

    def prepare(self, operation: str, parameters: Any = None) -> Prepared:
        """``operation`` compiled once, for :meth:`quote` and :meth:`run` (``dpgate serve`` quotes a
        statement for the analyst's cap, then runs the same compiled value).  Reads no data."""
        self._check_open()
        params = _params(parameters)
        with _every_failure_a_dpgate_error():
            return self._prepare(operation, params)

    def quote(self, statement: Prepared) -> Explanation:
        """:meth:`explain` of a prepared statement (of its SELECT, for ``EXPLAIN SELECT …``): free."""
        self._check_open()
        return self._quote(statement.compiled)

    def run(self, statement: Prepared) -> ResultSet:
        """Run a prepared statement, as :meth:`Cursor.execute` runs its text: the result set
        (whose ``description`` is None after a SET).  Spends budget as ``execute`` does."""
        self._check_open()
        with _every_failure_a_dpgate_error():
            return self._answer(statement)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def gateway(self) -> Gateway:
        """The :class:`~dpgate.Gateway` answering this connection's queries."""
        self._check_open()
        return self._gateway

    @property
    def settings(self) -> Mapping[str, Any]:
        """This session's current options (read-only view): accuracy, confidence, intervals,
        allow_partial, round, method.  Change them with ``SET dpgate.<option> = <value>``."""
        return MappingProxyType(dict(self._settings))

    @property
    def budget(self) -> float:
        """The total privacy budget ε."""
        return self.gateway.budget

    @property
    def spent(self) -> float:
        """Privacy budget spent so far (by every user of the same ledger)."""
        return self.gateway.spent

    @property
    def remaining(self) -> float:
        """``budget − spent``."""
        return self.gateway.remaining

    @property
    def history(self) -> Any:
        """Every release so far, as a pandas DataFrame."""
        return self.gateway.history

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<dpgate.dbapi.Connection {state} tables={[t.name for t in self._gateway.schema.tables]}>"

    # -- internals -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this dpgate connection is closed.")

    def _run(self, operation: str, parameters: Any) -> ResultSet:
        """Compile one statement (once); apply a SET, or answer a SELECT through the gateway."""
        self._check_open()
        params = _params(parameters)
        with _every_failure_a_dpgate_error():
            return self._answer(self._prepare(operation, params))

    def _prepare(self, operation: str, params: Sequence[Any] | Mapping[str, Any] | None) -> Prepared:
        """Compile ``operation`` (its SELECT, after an ``EXPLAIN``) — through the gateway's
        compile cache, so a repeated statement is not compiled again."""
        inner = strip_explain(operation)
        text = operation if inner is None else inner
        return Prepared(operation, params, self._gateway.compile_any(text, params, max_outputs=self.output_limit),
                        inner is not None)

    @property
    def output_limit(self) -> int | None:
        """The ``max_outputs`` this connection's statements are compiled under: the gateway's while the
        session answers exactly (the compiler then refuses a larger statement before weighing its
        groups); None under a model-based ``SET dpgate.method`` (free estimates are not bound by it)."""
        return self._gateway.max_outputs if (self._settings["method"] or "exact").lower() == "exact" else None

    def _answer(self, statement: Prepared) -> ResultSet:
        """Apply a SET, or answer a SELECT through the gateway (its quote's rows for EXPLAIN)."""
        gw = self._gateway
        stmt = statement.compiled
        if statement.explain:
            return explain_set(self._quote(stmt))
        if isinstance(stmt, SetOption):
            with self._lock:
                self._settings[stmt.name] = stmt.value
            return NO_ROWS
        settings = dict(self._settings)
        if not stmt.queries:  # SELECT k … GROUP BY k: the declared keys, free and unrecorded
            return result_set(Result((), stmt, 0.0), bool(settings["intervals"]), gw.schema)
        method, req = _resolved(stmt, settings)
        if isinstance(req, float):  # a free, model-based estimate (Gateway.estimate): no accuracy needed
            result = gw.estimate(statement.operation, method, confidence=req, params=statement.params)
            return result_set(result, bool(settings["intervals"]), gw.schema)
        result = gw.run(stmt, req.accuracy, req.confidence, allow_partial=req.allow_partial,
                        round=bool(settings["round"]))
        return result_set(result, bool(settings["intervals"]), gw.schema)

    def _quote(self, stmt: CompiledStatement | SetOption) -> Explanation:
        """The quote of a compiled statement under this connection's settings and its hints (:meth:`Gateway.quote`)."""
        gw = self._gateway
        if isinstance(stmt, SetOption):
            raise UnsupportedQuery("EXPLAIN takes a SELECT; SET dpgate.* changes a setting and costs nothing.")
        method, req = _resolved(stmt, dict(self._settings))
        if isinstance(req, float):
            return gw.quote(stmt, confidence=req, method=method)
        return gw.quote(stmt, req.accuracy, req.confidence)


def _every_failure_a_dpgate_error() -> AbstractContextManager[None]:
    """The DB-API contract: every failure is a dpgate.Error (any other exception is a dpgate bug)."""
    return map_exceptions({Exception: DPGateInternalError},
                          lambda exc: f"unexpected {type(exc).__name__} while running a statement: {exc}")


def _resolved(stmt: CompiledStatement, settings: Mapping[str, Any]) -> tuple[str, Requirement | float]:
    """A statement's method and what it must meet — hint > session SET > connect(): a
    :class:`Requirement` for exact answers, only a confidence for a free model-based estimate."""
    method = (stmt.hints.get("method") or settings["method"] or "exact").lower()
    if method != "exact":
        return method, resolve_confidence(hinted(stmt.hints), settings)
    return method, resolve_requirement(hinted(stmt.hints), settings, missing=_NO_ACCURACY)


def _params(parameters: Any) -> Sequence[Any] | Mapping[str, Any] | None:
    if parameters is None or isinstance(parameters, Mapping):
        return parameters
    if isinstance(parameters, (str, bytes)) or not hasattr(parameters, "__iter__"):
        raise ProgrammingError(
            f"parameters must be a sequence (for ?, $1) or a mapping (for :name), got {type(parameters).__name__}; "
            "write execute(sql, (value,)) for one parameter."
        )
    return list(parameters)


_NO_ACCURACY = (
    "no accuracy requirement: say how close the answer must be, as the half-width of its interval — "
    "per statement with a hint /*+ dpgate accuracy=25 */, per session with SET dpgate.accuracy = 25, "
    "or per connection with dpgate.connect(..., accuracy=25). Nothing was read or spent."
)
