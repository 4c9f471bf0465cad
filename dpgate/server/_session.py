"""One analyst's session: route each statement to the catalogue, a session command or the DB-API.

Protocol-independent: :meth:`Session.execute` takes SQL text and Python
parameters and returns an :class:`Outcome` (columns, rows, command tag) or
raises :class:`SqlError` with a SQLSTATE.  Counting queries go through a
:class:`dpgate.dbapi.Connection` on the gateway every session of the server
shares, so ``SET dpgate.*``, hints and placeholders behave exactly as in the
DB-API, and decisions are serialised by the gateway and its ledger.

SQLSTATE mapping (:func:`sqlstate`):

=====================================  =======  ===================================
dpgate error                           SQLSTATE  PostgreSQL name
=====================================  =======  ===================================
QuerySyntaxError                       42601    syntax_error
SchemaError naming a column            42703    undefined_column
SchemaError (other: undeclared table)  42P01    undefined_table
QueryTooComplex                        54000    program_limit_exceeded
UnsupportedQuery (refused SQL)         0A000    feature_not_supported
BudgetExhausted (global or analyst)    53400    configuration_limit_exceeded
NotEstimable                           55000    object_not_in_prerequisite_state
InvalidRequirement, DataError          22023    invalid_parameter_value
other ProgrammingError (parameters…)   42P02    undefined_parameter
LedgerError                            58000    system_error
a data source's failure                57014, 25006, 22000, 58000, 08006 or 53000, by its class
anything else                          XX000    internal_error
=====================================  =======  ===================================

BudgetExhausted covers the analyst's cap twice: refused before the statement
runs when it needs a fresh release and nothing is left of the cap (nothing read),
and in the release's ledger transaction, where each release is charged its
increase of the analyst's own per-cell cost (the race-safe check).

Server-side conditions: wrong password 28P01, a statement in a failed
transaction block 25P02, an unknown ``SHOW`` parameter 42704, an invalid
parameter value 22P02, an unknown prepared statement or portal 26000/34000, a
cancelled statement 57014, shutdown 57P01 (idle connections) / 57P03 (new
ones), too many connections 53300, a protocol violation 08P01.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpgate import errors
from dpgate.compile import CompiledStatement
from dpgate.compile.bounds import bounded_message, check_parameter, deadline, excerpt, skip_blank
from dpgate.compile.statement import check_length
from dpgate.dbapi import Connection, connect
from dpgate.dbapi._rows import Prepared, explain_set
from dpgate.gateway import Gateway
from dpgate.ledger import _provenance
from dpgate.plan.budget import exhausted, fits, remaining
from dpgate.plan.explain import COLUMNS, strip_explain
from dpgate.plan.zcdp import DEFAULT_DELTA
from dpgate.server import _catalog, _history
from dpgate.server._parameters import KINDS_OID, infer_parameters
from dpgate.server._protocol import Field
from dpgate.server._show_all import show_all
from dpgate.server._values import FLOAT8, TEXT, TYPE_SIZES, oid_of_dbapi
from dpgate.server.users import Analyst

__all__ = ["Outcome", "SqlError", "Session", "sqlstate", "LOG"]

LOG = logging.getLogger("dpgate.server")


class SqlError(errors.Error):
    """An error to send to the client: SQLSTATE, message, optional hint.

    A :class:`dpgate.Error` like every dpgate exception; the server sends its own ``code``
    (:func:`sqlstate` maps the other dpgate errors, so handlers catch this one first)."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint


@dataclass(frozen=True)
class Outcome:
    """What one statement returns: columns (None: no result set), rows, tag, status changes."""

    fields: tuple[Field, ...] | None
    rows: tuple[tuple[Any, ...], ...] = ()
    tag: str = ""
    status: tuple[tuple[str, str], ...] = ()
    empty: bool = False
    notices: tuple[str, ...] = ()  # NoticeResponses (psql prints them): what a counting statement charged


# First match wins: subclasses before their bases.
_SQLSTATES: tuple[tuple[type[BaseException], str], ...] = (
    (errors.QuerySyntaxError, "42601"), (errors.QueryTooComplex, "54000"), (errors.UnsupportedQuery, "0A000"),
    (errors.BudgetExhausted, "53400"), (errors.NotEstimable, "55000"), (errors.DataError, "22023"),
    (errors.LedgerError, "58000"), (errors.ProgrammingError, "42P02"),
)


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of a dpgate error (see the module docstring)."""
    if isinstance(exc, errors.SchemaError):
        return "42703" if "column" in str(exc).lower() else "42P01"
    if isinstance(exc, errors.OperationalError) and exc.sqlstate is not None:
        return exc.sqlstate  # a data source's failure, by its class (dpgate.backends)
    return next((code for cls, code in _SQLSTATES if isinstance(exc, cls)), "XX000")


def _sql_error(exc: errors.Error) -> SqlError:
    """The SqlError of a dpgate error, its message cut to a bounded length."""
    return SqlError(sqlstate(exc), bounded_message(str(exc)))


def _bounded(sql: str, params: Sequence[Any]) -> None:
    """Refuse a statement or parameter beyond the size limits: first of all, on every path."""
    check_length(sql)
    for value in params:
        check_parameter(value)


_SETTINGS_REPORTED = ("application_name", "client_encoding", "DateStyle", "TimeZone", "IntervalStyle")
_UTF8 = {"utf8", "utf-8", "unicode"}
_TAGS = {"begin": "BEGIN", "start": "BEGIN", "commit": "COMMIT", "end": "COMMIT", "rollback": "ROLLBACK",
         "abort": "ROLLBACK", "savepoint": "SAVEPOINT", "release": "RELEASE", "discard": "DISCARD ALL",
         "deallocate": "DEALLOCATE", "reset": "RESET", "unlisten": "UNLISTEN", "close": "CLOSE CURSOR"}
_FREE_MEMO = 4096  # statements a server remembers as free


def _field(name: str, oid: int) -> Field:
    return Field(name, oid, TYPE_SIZES.get(oid, -1))


def _word_end(text: str, pos: int, dots: bool = False) -> int:
    """The end of the run of word characters (and, with ``dots``, dots) from ``pos``."""
    while pos < len(text) and (text[pos].isalnum() or text[pos] == "_" or (dots and text[pos] == ".")):
        pos += 1
    return pos


def _parse_set(sql: str) -> tuple[str, str] | None:
    """``(name, value)`` of ``SET [SESSION | LOCAL] name {= | TO} value[;]``, or None.

    A scan: the regular expression it replaces (``…\\s*(.+?)\\s*;?$``) took time quadratic in a
    run of blanks (30 000 spaces: 22 s)."""
    text = sql.strip()
    if text[:3].lower() != "set" or not text[3:4].isspace():
        return None
    pos = len(text) - len(text[3:].lstrip())
    for modifier in ("session", "local"):  # optional: SET local = … names "local"
        after = pos + len(modifier)
        if text[pos:after].lower() == modifier and text[after:after + 1].isspace():
            found = _set_assignment(text, len(text) - len(text[after:].lstrip()))
            if found is not None:
                return found
    return _set_assignment(text, pos)


def _set_assignment(text: str, pos: int) -> tuple[str, str] | None:
    """``(name, value)`` of the ``name {= | TO} value[;]`` at ``pos`` of a SET statement, or None."""
    if not (pos < len(text) and text[pos].isascii() and (text[pos].isalpha() or text[pos] == "_")):
        return None
    end = _word_end(text, pos, dots=True)
    # (name end, value start): the longest name first, then shorter ones ending in "." before a "to"
    # (what the regular expression's backtracking found); the first with a value wins.
    after = len(text) - len(text[end:].lstrip())
    splits = [(end, after + 1)] if text[after:after + 1] == "=" else \
        [(end, after + 2)] if text[after:after + 2].lower() == "to" and _word_end(text, after) == after + 2 else []
    splits += [(k, k + 2) for k in range(end - 2, pos, -1)
               if text[k - 1] == "." and text[k:k + 2].lower() == "to" and (k + 2 == end or text[k + 2] == ".")]
    for name_end, start in splits:
        value = text[start:].strip()
        if value.endswith(";") and len(value) > 1:
            value = value[:-1].rstrip()
        if value:
            return text[pos:name_end], value
    return None


def _first_word(sql: str) -> str:
    """The statement's first word, lower-case, after blanks and ``/* … */`` comments ("" if none).

    A scan: the regular expression ``\\s*(?:/\\*.*?\\*/\\s*)*(\\w+)`` backtracked exponentially on a
    run of comments (26 ``/**/`` held the session for 28 s), and this runs before any limit."""
    start = end = skip_blank(sql, line_comments=False)
    while end < len(sql) and (sql[end].isalnum() or sql[end] == "_"):
        end += 1
    return sql[start:end].lower()


@dataclass
class Session:
    """The state of one analyst's connection."""

    gateway: Gateway
    analyst: Analyst
    database: str
    defaults: dict[str, Any]
    parameters: dict[str, str] = field(default_factory=dict)
    status: str = "I"  # ReadyForQuery: I idle, T in a transaction block, E failed block
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Statements quoted free (see ``_check_cap``), shared by the server's sessions: free is free for everyone.
    free: set[tuple[str, str, str]] = field(default_factory=set)
    #: This session's statement texts by hash, for ``SHOW dpgate.history`` (bounded).
    texts: dict[str, str] = field(default_factory=dict)
    #: Seconds a statement may spend being compiled and planned before it is refused (None: no limit).
    statement_deadline: float | None = None
    _conn: Connection | None = None

    @property
    def conn(self) -> Connection:
        """This session's DB-API connection on the shared gateway (its SET dpgate.* settings)."""
        if self._conn is None:
            self._conn = connect(self.gateway, **self.defaults)
        return self._conn

    def close(self) -> None:
        """Close the DB-API connection (never the shared gateway)."""
        if self._conn is not None:
            self._conn.close()

    # -- statements --------------------------------------------------------------------------
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Outcome:
        """Run one statement and log it (one line, no values).  Raises SqlError.

        Compiling and planning it must end within :attr:`statement_deadline` (then 54000)."""
        with deadline(self.statement_deadline):
            return self._execute(sql, params)

    def _execute(self, sql: str, params: Sequence[Any]) -> Outcome:
        kind = "session"
        try:
            _bounded(sql, params)
            word = _first_word(sql)
            if not sql.strip().rstrip(";").strip():
                return Outcome(None, empty=True)
            if word in _TAGS:
                out = self._transaction(word, sql)
            elif self.status == "E":
                raise SqlError("25P02", "current transaction is aborted, commands ignored until end of transaction "
                                        "block")
            elif word in ("set", "show"):
                out = self._set(sql) if word == "set" else self._show(sql)
            else:
                found = _catalog.answer(sql, params, self.gateway.schema, user=self.analyst.name,
                                        database=self.database, budget_note=self._budget_note)
                if found is None:
                    return self._query(sql, params)  # logs its own line, with source and ε
                out, kind = Outcome(found.fields, found.rows, found.tag), "catalog"
        except SqlError as exc:  # before dpgate.Error, its base: it carries its own SQLSTATE
            self._log(sql, params, "refused", exc.code, 0.0)
            raise
        except errors.Error as exc:
            self._log(sql, params, "refused", type(exc).__name__, 0.0)
            raise _sql_error(exc) from exc
        self._log(sql, params, kind, "-", 0.0)
        return out

    def fail(self) -> None:
        """An error happened: a transaction block becomes failed."""
        if self.status == "T":
            self.status = "E"

    def _transaction(self, word: str, sql: str) -> Outcome:
        tag = _TAGS[word]
        low = sql.lower()
        if word in ("begin", "start"):
            self.status = "T" if self.status == "I" else self.status
        elif word in ("commit", "end"):
            tag = "ROLLBACK" if self.status == "E" else "COMMIT"
            self.status = "I"
        elif word in ("rollback", "abort"):
            self.status = "T" if " to " in f" {low} " and self.status != "I" else "I"
        return Outcome(None, tag=tag)

    def _set(self, sql: str) -> Outcome:
        parsed = _parse_set(sql)
        if parsed is None:
            if re.match(r"^\s*set\s+(session\s+)?(time\s+zone|transaction|session\s+characteristics)", sql, re.I):
                return Outcome(None, tag="SET")
            raise SqlError("42601", f"cannot parse this SET statement: {sql.strip()[:80]!r}.")
        name, value = parsed[0], parsed[1].strip("'\"")
        if name.lower().startswith("dpgate."):
            try:
                self.conn.cursor().execute(sql)
            except errors.Error as exc:
                raise _sql_error(exc) from exc
            return Outcome(None, tag="SET")
        if name.lower() == "client_encoding" and value.lower() not in _UTF8:
            raise SqlError("22023", f"dpgate serve speaks UTF8 only; client_encoding {excerpt(value)} is not supported.")
        key = next((k for k in _SETTINGS_REPORTED if k.lower() == name.lower()), name.lower())
        # Reported back in a ParameterStatus: cut as PostgreSQL cuts application_name (NAMEDATALEN − 1), as
        # libpq drops the connection on a status message over 30 000 bytes.
        self.parameters[key] = "UTF8" if key == "client_encoding" else value[:63] if key in _SETTINGS_REPORTED else value
        status = ((key, self.parameters[key]),) if key in _SETTINGS_REPORTED else ()
        return Outcome(None, tag="SET", status=status)

    def _show(self, sql: str) -> Outcome:
        name = " ".join(sql.strip().rstrip(";").split()[1:]).lower()
        if name == "dpgate.budget":
            return self._show_budget()
        if name == "all":
            return Outcome(*(found := show_all(self.conn.settings, self.parameters)), f"SHOW {len(found[1])}")
        if name == "dpgate.history":
            rows = _provenance.analyst_history(self.gateway.ledger, self.analyst.name)
            wanted = {r[6] for r in rows if r[6] is not None}
            texts = {rec.id: rec.sql for rec in self.gateway.ledger.records() if rec.id in wanted} if wanted else {}
            return Outcome(_history.FIELDS, _history.with_statements(rows, texts, self.texts), f"SHOW {len(rows)}")
        if name.startswith("dpgate."):
            key = name.split(".", 1)[1]
            settings = self.conn.settings
            if key not in settings:
                raise SqlError("42704", f"unrecognized configuration parameter {excerpt(name)}; dpgate has "
                               f"{', '.join('dpgate.' + k for k in settings)}, dpgate.budget, dpgate.history.")
            value = settings[key]
            text = "" if value is None else ("on" if value is True else "off" if value is False else str(value))
            return Outcome((_field(name, TEXT),), ((text,),), "SHOW")
        if name in ("transaction isolation level", "transaction_isolation"):
            return Outcome((_field("transaction_isolation", TEXT),), (("read committed",),), "SHOW")
        # PostgreSQL's default search_path, unless the client SET one (DBeaver reads it on connect)
        known = {"search_path": '"$user", public', **{k.lower(): v for k, v in self.parameters.items()}}
        if name in known:
            return Outcome((_field(name, TEXT),), ((known[name],),), "SHOW")
        raise SqlError("42704", f"unrecognized configuration parameter {excerpt(name)}.")

    def _budget_note(self) -> str:
        """The budget state in words (``\\dt+``'s table description): global, and this analyst's cap."""
        gw, a = self.gateway, self.analyst
        mine = _provenance.analyst_spent(gw.ledger, a.name, gw.schema)
        unit = "ρ" if gw.privacy == "zcdp" else "ε"
        return (f"budget {unit} {gw.spent:.4g} of {gw.budget:g} spent; {a.name}: {mine:.4g} of their cap {a.budget:g} "
                "(SHOW dpgate.budget)")

    def _show_budget(self) -> Outcome:
        gw, a = self.gateway, self.analyst
        mine = _provenance.analyst_spent(gw.ledger, a.name, gw.schema)
        names: tuple[str, ...] = ("analyst", "analyst_budget", "analyst_spent", "analyst_remaining", "budget", "spent",
                                  "remaining")
        row: tuple[Any, ...] = (a.name, a.budget, mine, remaining(mine, a.budget), gw.budget, gw.spent, gw.remaining)
        if gw.privacy == "zcdp":  # the figures above are ρ; beside them, the spend as ε at δ
            names += ("privacy", "delta", "epsilon_spent", "epsilon_budget")
            row += ("zcdp", DEFAULT_DELTA, gw.spent_as(DEFAULT_DELTA), gw.budget_as(DEFAULT_DELTA))
        kinds = [TEXT if n in ("analyst", "privacy") else FLOAT8 for n in names]
        return Outcome(tuple(_field(n, k) for n, k in zip(names, kinds, strict=True)), (row,), "SHOW")

    def _query(self, sql: str, params: Sequence[Any]) -> Outcome:
        digest = _provenance.statement_hash(sql, params)
        # Compiled once: the cap check quotes the very statement that then runs.
        statement = self.conn.prepare(sql, list(params) if params else None)
        if not statement.explain:
            self._check_cap(sql, params, statement)
        elif self.analyst.budget < self.gateway.budget:
            return self._explain_capped(sql, params, digest, statement)
        ledger = self.gateway.ledger
        with _provenance.charging(ledger, self.analyst.name, self.analyst.budget, digest, self.gateway.schema) as mine:
            rs = self.conn.run(statement)
        if self.cancelled.is_set():
            raise SqlError("57014", "canceling statement due to user request (anything it released was recorded).")
        if rs.description is None:  # SET dpgate.* through the DB-API
            return Outcome(None, tag="SET")
        result = rs.result
        eps, source = 0.0, "-"
        if result is not None:
            if len(self.texts) >= _history.MEMO_SIZE:
                self.texts.clear()
            self.texts[digest] = sql
            sources = {a.source for a in result.answers}
            eps = float(sum(mine))  # what this analyst was charged for it (their own per-cell increase)
            source = next(iter(sources)) if len(sources) == 1 else "mixed" if sources else "-"
            # Durable before the answer leaves: who received what.
            _provenance.record_delivery(ledger, self.analyst.name, digest, source, eps)
        self._log(sql, params, "explain" if statement.explain else "query", source, eps, digest)
        fields = tuple(_field(d[0], oid_of_dbapi(d[1])) for d in rs.description)
        rows = rs.rows
        notices = (self._charge_note(source, eps),) if result is not None else ()
        return Outcome(fields, rows, f"SELECT {len(rows)}", notices=notices)

    def _charge_note(self, source: str, eps: float) -> str:
        """What a counting statement charged this analyst and what is left (sent as a NOTICE)."""
        gw, a = self.gateway, self.analyst
        left = f"{gw.remaining:.4g} of the global budget {gw.budget:g}"
        if a.budget < gw.budget:  # their cap binds first: say what is left of it
            mine = _provenance.analyst_spent(gw.ledger, a.name, gw.schema)
            left = f"{remaining(mine, a.budget):.4g} of {a.name}'s cap {a.budget:g}, {left}"
        return f"dpgate: source {source}; ε charged to {a.name}: {eps:.4g}; left: {left}."

    def _explain_capped(self, sql: str, params: Sequence[Any], digest: str, statement: Prepared) -> Outcome:
        """``EXPLAIN`` for an analyst with a cap: ``remaining`` is what would be left of their cap after the
        statement — their own per-cell charge (:func:`_provenance.analyst_quote`) — or of the global budget if less."""
        gw, a = self.gateway, self.analyst
        quote = self.conn.quote(statement)
        spent, needed = _provenance.analyst_quote(gw.ledger, a.name, gw.schema, quote.statement.table, quote.releases)
        left = max(remaining(spent + needed, a.budget), 0.0)
        rows = tuple(r[:6] + (min(r[6], left),) + r[7:] for r in explain_set(quote).rows)
        self._log(sql, params, "explain", "-", 0.0, digest)
        return Outcome(EXPLAIN_FIELDS, rows, f"SELECT {len(rows)}")

    def _check_cap(self, sql: str, params: Sequence[Any], statement: Prepared) -> None:
        """Refuse, before any data is read, a statement whose fresh releases would take the analyst's
        charge above their cap (a cap of 0: any fresh release).

        The quote is :meth:`dpgate.dbapi.Connection.quote` of the compiled ``statement`` (of
        ``sql`` and ``params``) — :meth:`Gateway.quote` under the session's ``SET dpgate.*``
        and the statement's hints, as the query will run.  Its fresh releases are priced as the
        analyst's own per-cell increase (:func:`_provenance.analyst_quote`), which is what the
        query then charges them unless another release for them happens in between; the
        record-time hook of :func:`_provenance.charging` stays the race-safe check.  A
        statement the global budget cannot pay is left to the gateway, which refuses it
        before reading data (or answers it from history under ``allow_partial``).  An analyst
        whose cap is at least the global budget is never quoted: their charge never exceeds
        the global cost.  Nor is a statement this session or another session of the server
        already found to need no fresh release under the same settings: history only grows,
        and what it answers it keeps answering, for every analyst (a repeated dashboard query
        costs no quote).
        """
        a, gw = self.analyst, self.gateway
        key = (sql, repr(tuple(params)), repr(sorted(self.conn.settings.items())))
        if key in self.free or a.budget >= gw.budget:  # checked first: they cost no ledger read
            return
        quote = self.conn.quote(statement)
        if not quote.releases:
            if len(self.free) >= _FREE_MEMO:
                self.free.clear()
            self.free.add(key)
            return
        if not quote.affordable:
            return
        spent, needed = _provenance.analyst_quote(gw.ledger, a.name, gw.schema, quote.statement.table, quote.releases)
        if a.budget <= 0.0 or not fits(spent, needed, a.budget):
            raise exhausted(needed, spent, a.budget, what="This statement", purpose=" of their cap",
                            analyst=a.name, hint=" Nothing was spent and nothing was read.", unit=gw.unit)

    def _log(self, sql: str, params: Any, kind: str, source: str, eps: float, digest: str | None = None) -> None:
        LOG.info("analyst=%s statement=%s kind=%s source=%s epsilon=%.6g", self.analyst.name,
                 digest or _provenance.statement_hash(sql, params), kind, source, eps)

    # -- describing without running ------------------------------------------------------------
    def describe(self, sql: str, param_oids: Sequence[int]) -> tuple[tuple[int, ...], tuple[Field, ...] | None]:
        """Parameter types and result columns of a prepared statement, without running a query.

        Parameters the client left untyped get the type of the column they are compared
        with (``int8``, ``text``, ``bool``), else ``text``.
        """
        try:
            _bounded(sql, ())
            inner = strip_explain(sql)  # EXPLAIN SELECT …: the parameters of the SELECT, the columns of the quote
            target = sql if inner is None else inner
            inferred = infer_parameters(target, self.gateway.schema, self.gateway.dialect)
        except errors.Error as exc:
            raise _sql_error(exc) from exc
        n = max(len(param_oids), len(inferred))
        oids = tuple((param_oids[i] if i < len(param_oids) and param_oids[i] not in (0, 705) else
                      inferred[i][0] if i < len(inferred) else TEXT) for i in range(n))
        dummies = [inferred[i][1] if i < len(inferred) else "" for i in range(n)]
        word = _first_word(sql)
        if word in _TAGS or word == "set" or not sql.strip().rstrip(";").strip():
            return oids, None
        if word == "show":
            return oids, self.execute(sql).fields
        try:
            found = _catalog.answer(sql, dummies, self.gateway.schema, user=self.analyst.name,
                                    database=self.database)
            if found is not None:
                return oids, found.fields
            # Through the gateway's compile cache: without parameters, the run compiles nothing again.
            stmt = self.gateway.compile_any(target, dummies or None, max_outputs=self.conn.output_limit)
        except errors.Error as exc:
            raise _sql_error(exc) from exc
        if not isinstance(stmt, CompiledStatement):
            return oids, None
        if inner is not None:
            return oids, EXPLAIN_FIELDS
        return oids, statement_fields(stmt, self.gateway, bool(self.conn.settings["intervals"]))


#: The columns of ``EXPLAIN SELECT …`` (:data:`dpgate.plan.explain.COLUMNS`): the quote's numbers are float8.
EXPLAIN_FIELDS = tuple(_field(n, FLOAT8 if n in ("epsilon", "halfwidth", "confidence", "remaining") else TEXT)
                       for n in COLUMNS)


def statement_fields(stmt: CompiledStatement, gateway: Gateway, intervals: bool) -> tuple[Field, ...]:
    """The result columns of a compiled SELECT, as ``dpgate.dbapi`` will return them."""
    table = gateway.schema.table(stmt.table)
    out: list[Field] = []
    for o in stmt.outputs:
        if o.kind == "group":
            out.append(_field(o.name, KINDS_OID[table.column(stmt.group_columns[o.index]).kind]))
        else:
            out.append(_field(o.name, FLOAT8))
            if intervals:
                out += [_field(f"{o.name}_low", FLOAT8), _field(f"{o.name}_high", FLOAT8),
                        _field(f"{o.name}_source", TEXT)]
    return tuple(out)
