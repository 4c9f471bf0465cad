"""``dpgate serve``: the gateway behind the PostgreSQL wire protocol, one thread per connection.

Why one module of about 540 lines: a connection's life — startup, TLS, authentication, the
message loop of both query protocols — is one state machine over one socket; the statements are
in :mod:`dpgate.server._session`, the wire format in :mod:`dpgate.server._protocol`.

Each connection: optional TLS (``SSLRequest``), SCRAM-SHA-256 authentication
against the users file, then statements over the simple or the extended
protocol, answered by a :class:`~dpgate.server._session.Session` on the one
:class:`~dpgate.Gateway` every connection shares.  Decisions are serialised by
the gateway's lock and its ledger (also across processes); a slow client only
holds its own thread.  SIGTERM (:meth:`Server.shutdown`): stop accepting, let
statements in flight finish (their releases commit and their answers are sent,
or they never happened), tell idle clients the server is shutting down (57P01),
close the gateway.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import secrets
import socket
import ssl
import struct
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpgate._validate import nonnegative_finite
from dpgate.compile.bounds import bounded_message, excerpt
from dpgate.errors import InvalidArgument
from dpgate.gateway import Gateway
from dpgate.ledger import _provenance
from dpgate.server import _protocol as pq
from dpgate.server._admission import Deadline, Listener, Slot, Slots
from dpgate.server._catalog import SERVER_VERSION
from dpgate.server._scram import DEFAULT_ITERATIONS, MECHANISM, Decoy, ScramError, ServerExchange
from dpgate.server._session import LOG, Outcome, Session, SqlError
from dpgate.server._values import decode_param, encode
from dpgate.server.users import Analyst

__all__ = ["Server", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only the loopback interface."""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _decoy(gateway: Gateway, users: Mapping[str, Analyst]) -> Decoy:
    """What SCRAM shows unknown names: salts from a secret derived from the ledger's key (the same
    across restarts, and on every host sharing the ledger), and the known users' most common
    iteration count."""
    secret = hmac.new(gateway.ledger.provenance_key(), b"dpgate scram decoy", hashlib.sha256).digest()
    counts = Counter(a.verifier.iterations for a in users.values())
    return Decoy(secret, counts.most_common(1)[0][0] if counts else DEFAULT_ITERATIONS)


@dataclass
class _Prepared:
    sql: str
    param_oids: tuple[int, ...]
    fields: tuple[pq.Field, ...] | None = None
    described: bool = False


@dataclass
class _Portal:
    prepared: _Prepared
    params: list[Any]
    bind: pq.Bind
    outcome: Outcome | None = None
    sent: int = 0


@dataclass
class _Shared:
    """What every connection of one server shares."""

    gateway: Gateway
    users: Mapping[str, Analyst]
    defaults: dict[str, Any]
    tls: ssl.SSLContext | None
    slots: Slots
    idle_timeout: float | None
    statement_deadline: float | None
    closing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    connections: dict[int, _Handler] = field(default_factory=dict)  # authenticated, by backend pid
    next_pid: int = 1000
    free: set[tuple[str, str, str]] = field(default_factory=set)  # statements quoted free (Session.free)
    require_tls: bool = False  # refuse clients that did not start TLS
    decoy: Decoy | None = None  # what unknown names are shown in SCRAM


class Server:
    """A running ``dpgate serve`` listener.

    Args:
        gateway: the gateway answering every connection (its ledger holds the provenance too).
        users: the analysts (``dpgate.server.users.load_users``).
        host, port: where to listen (port 0: a free port, see :attr:`port`).
        tls_cert, tls_key: PEM files; with them clients may (and with ``sslmode=require``, do) use TLS.
        allow_insecure_password: allow SCRAM without TLS on a non-loopback address (with
            ``require_tls=False``).
        require_tls: refuse clients that do not start TLS (SQLSTATE 28000, before authentication).
            Default (``None``): on when ``host`` is not a loopback address, off on loopback.
            Turning it off on a non-loopback address logs a warning.
        defaults: per-session DB-API defaults (``accuracy``, ``confidence``, ``intervals``, ``allow_partial``).
        max_connections: connections served at once, counted from accept; more get 53300 (:mod:`._admission`).
        auth_timeout: seconds from accept by which startup and authentication must be over.
        max_connections_per_analyst: one analyst's connections (default: max_connections // 4, at least 1).
        idle_timeout: seconds an authenticated connection may go without a message (then 57P05); 0: no limit.
        statement_deadline: seconds a statement may spend being compiled and planned, under the
            gateway's lock or not, before it is refused (54000; nothing read or spent); 0: no limit.

    Raises:
        InvalidArgument: TLS required without ``tls_cert``/``tls_key``, or no TLS on a non-loopback
            address without ``allow_insecure_password``.
    """

    def __init__(self, gateway: Gateway, users: Mapping[str, Analyst], *, host: str = "127.0.0.1", port: int = 5433,
                 tls_cert: str | None = None, tls_key: str | None = None, allow_insecure_password: bool = False,
                 defaults: Mapping[str, Any] | None = None, max_connections: int = 100,
                 auth_timeout: float = 60.0, max_connections_per_analyst: int | None = None,
                 idle_timeout: float | None = 3600.0, require_tls: bool | None = None,
                 statement_deadline: float | None = 10.0) -> None:
        if statement_deadline is not None:  # validated here too: the server is embeddable without the CLI
            statement_deadline = nonnegative_finite(statement_deadline, "statement_deadline")
        if require_tls is None:
            require_tls = not is_loopback(host)
        elif not require_tls and not is_loopback(host):
            LOG.warning("TLS is not required on %s (--no-require-tls): clients may send their SCRAM exchange "
                        "and receive answers in the clear", host)
        if require_tls and not (tls_cert and tls_key):
            raise InvalidArgument(
                f"refusing to serve on {host} without TLS: it is required there (--require-tls, the default off "
                "loopback) but no certificate was given, and passwords (even SCRAM exchanges) and answers would "
                "cross the network in the clear. Give --tls-cert and --tls-key, or --no-require-tls "
                "--allow-insecure-password if the network is trusted."
            )
        tls = None
        if tls_cert or tls_key:
            if not (tls_cert and tls_key):
                raise InvalidArgument("give both --tls-cert and --tls-key.")
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            tls.load_cert_chain(tls_cert, tls_key)
        elif not is_loopback(host) and not allow_insecure_password:
            raise InvalidArgument(
                f"refusing to serve on {host} without TLS: passwords (even SCRAM exchanges) and answers would cross "
                "the network in the clear. Give --tls-cert and --tls-key, or --allow-insecure-password if the "
                "network is trusted."
            )
        _provenance.ensure_table(gateway.ledger)
        per_analyst = max_connections_per_analyst or max(1, max_connections // 4)
        slots = Slots(max_connections, per_analyst, auth_timeout)
        shared = self._shared = _Shared(gateway, dict(users), dict(defaults or {}), tls, slots, idle_timeout or None,
                                        statement_deadline or None,
                                        require_tls=require_tls, decoy=_decoy(gateway, users))
        self._tcp = Listener((host, port), slots, lambda sock, slot: _Handler(shared, sock, slot).run())
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self._tcp.server_address[1])

    @property
    def open_connections(self) -> int:
        """Connections holding a slot now (authenticated or not)."""
        return len(self._shared.slots)

    @property
    def gateway(self) -> Gateway:
        """The gateway every connection shares."""
        return self._shared.gateway

    def serve_forever(self) -> None:
        """Accept connections until :meth:`shutdown`."""
        self._tcp.serve_forever(poll_interval=0.2)

    def start(self) -> Server:
        """Serve in a background thread (tests, embedding); returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="dpgate-serve", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting; finish statements in flight; disconnect idle clients; close the gateway."""
        shared = self._shared
        shared.closing.set()
        self._tcp.shutdown()
        self._tcp.server_close()
        shared.slots.drop_unauthenticated()
        with shared.lock:
            handlers = list(shared.connections.values())
        for h in handlers:
            h.interrupt_if_idle()
        for h in handlers:
            h.finished.wait(timeout)
        shared.gateway.close()


class _Handler:
    """One connection, served by its own thread from accept to close."""

    def __init__(self, state: _Shared, sock: socket.socket, slot: Slot) -> None:
        self.state, self.slot = state, slot
        self.sock: Any = sock
        self.io = Deadline(lambda: self.sock, slot.deadline)  # every read and write until authenticated
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # replies are whole; never wait to batch
        self.busy = threading.Lock()  # held while a message is being processed
        self.finished = threading.Event()
        self.session: Session | None = None
        self.out: list[bytes] = []
        self.pid, self.secret = 0, secrets.randbits(31)

    def run(self) -> None:
        try:
            self._serve()
        except (EOFError, ConnectionError, OSError, ssl.SSLError):  # TimeoutError (a deadline) is an OSError
            pass
        except pq.ProtocolError as exc:
            self._fatal("08P01", f"protocol violation: {exc}")
        finally:
            with self.state.lock:
                self.state.connections.pop(self.pid, None)
            if self.session is not None:
                self.session.close()
            self.state.slots.release(self.slot)  # before the close: the descriptor's number may be reused
            with contextlib.suppress(OSError):
                self.sock.close()
            self.finished.set()

    def interrupt_if_idle(self) -> None:
        """On shutdown: a connection not processing a message is told so and closed."""
        if self.busy.acquire(blocking=False):
            try:
                self._fatal("57P01", "terminating connection due to administrator command (dpgate is shutting down)")
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                self.busy.release()

    # -- I/O ----------------------------------------------------------------------------------
    def _send(self, *chunks: bytes) -> None:
        self.out.extend(chunks)

    def _flush(self) -> None:
        if self.out:
            data, self.out = b"".join(self.out), []
            self.sock.sendall(data)

    def _fatal(self, code: str, text: str) -> None:
        try:
            self.sock.sendall(b"".join(self.out) + pq.error_response(code, text, severity="FATAL"))
        except OSError:
            pass
        self.out = []

    # -- startup and authentication ------------------------------------------------------------
    def _serve(self) -> None:
        params = self._startup()
        if params is None:
            return
        if self.state.require_tls and not isinstance(self.sock, ssl.SSLSocket):
            self._fatal("28000", "this dpgate server requires TLS: connect with sslmode=require (or verify-ca / "
                                 "verify-full); passwords and answers are never sent in the clear")
            return
        analyst = self._authenticate(params.get("user", ""))
        if analyst is None:
            return
        if (refused := self.state.slots.authenticated(self.slot, analyst.name)) is not None:
            self._fatal("53300", refused)
            return
        with self.busy:  # not interrupted by a shutdown before the session is ready (the loop checks it then)
            self._open_session(params, analyst)
        self._loop()

    def _open_session(self, params: dict[str, str], analyst: Analyst) -> None:
        with self.state.lock:
            self.state.next_pid += 1
            self.pid = self.state.next_pid
            self.state.connections[self.pid] = self
        self.sock.settimeout(self.state.idle_timeout)
        self.session = Session(self.state.gateway, analyst, params.get("database", analyst.name),
                               self.state.defaults, free=self.state.free,
                               statement_deadline=self.state.statement_deadline)
        reported = {"server_version": SERVER_VERSION, "server_encoding": "UTF8", "client_encoding": "UTF8",
                    "DateStyle": "ISO, MDY", "TimeZone": "UTC", "IntervalStyle": "postgres",
                    "integer_datetimes": "on", "standard_conforming_strings": "on", "is_superuser": "off",
                    "session_authorization": analyst.name, "default_transaction_read_only": "on",
                    "application_name": params.get("application_name", "")}
        self.session.parameters.update(reported)
        self._send(pq.authentication(0), *(pq.parameter_status(k, v) for k, v in reported.items()),
                   pq.backend_key_data(self.pid, self.secret), pq.ready_for_query("I"))
        self._flush()

    def _startup(self) -> dict[str, str] | None:
        encrypted = False
        while True:
            code, payload = pq.read_startup(self.io)
            if code in (pq.SSL_REQUEST, pq.GSSENC_REQUEST) and (payload or encrypted):
                return None  # malformed, or a second one inside TLS: PostgreSQL closes too, without a word
            if code == pq.SSL_REQUEST:
                if self.state.tls is None:
                    self.io.sendall(b"N")
                    continue
                self.io.sendall(b"S")
                self.io.arm()  # the handshake too ends by the deadline
                self.sock = self.state.tls.wrap_socket(self.sock, server_side=True)
                encrypted = True
                continue
            if code == pq.GSSENC_REQUEST:
                self.io.sendall(b"N")
                continue
            if code == pq.CANCEL_REQUEST:
                if len(payload) == 8:  # anything else is not a cancel request: ignored, like PostgreSQL does
                    self._cancel(*struct.unpack("!ii", payload))
                return None
            if code >> 16 != 3:
                self._fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: dpgate speaks 3.0")
                return None
            if self.state.closing.is_set():
                self._fatal("57P03", "the dpgate server is shutting down")
                return None
            return pq.parse_startup(payload)

    def _cancel(self, pid: int, secret: int) -> None:
        with self.state.lock:
            target = self.state.connections.get(pid)
        if target is not None and target.secret == secret and target.session is not None \
                and target.busy.locked():
            target.session.cancelled.set()

    def _authenticate(self, user: str) -> Analyst | None:
        analyst = self.state.users.get(user)
        exchange = ServerExchange(analyst.verifier if analyst else None, name=user, decoy=self.state.decoy)
        self.io.sendall(pq.authentication(10, MECHANISM.encode() + b"\x00\x00"))
        try:
            kind, payload = pq.read_message(self.io, pq.MAX_AUTH_MESSAGE)
            if kind != b"p":
                raise ScramError("expected a SASLInitialResponse")
            mechanism, first = pq.parse_sasl_initial(payload)
            if mechanism != MECHANISM:
                raise ScramError(f"unsupported SASL mechanism {mechanism!r}")
            self.io.sendall(pq.authentication(11, exchange.server_first(first)))
            kind, payload = pq.read_message(self.io, pq.MAX_AUTH_MESSAGE)
            if kind != b"p":
                raise ScramError("expected a SASLResponse")
            final = exchange.server_final(payload)
        except (ScramError, UnicodeDecodeError):
            LOG.warning("authentication failed for user %r", user)
            self._fatal("28P01", f'password authentication failed for user "{user}"')
            return None
        self._send(pq.authentication(12, final))
        assert analyst is not None  # an unknown user never passes server_final
        return analyst

    # -- the message loop --------------------------------------------------------------------
    def _loop(self) -> None:
        session = self.session
        assert session is not None
        prepared: dict[str, _Prepared] = {}
        portals: dict[str, _Portal] = {}
        skipping = False  # after an error in the extended protocol, discard until Sync
        while not self.state.closing.is_set():
            try:
                kind, payload = pq.read_message(self.sock)
            except TimeoutError:
                self._fatal("57P05", f"terminating connection due to idle-session timeout ({self.state.idle_timeout:g} s)")
                return
            with self.busy:
                if kind == b"X":
                    return
                if kind == b"S":
                    skipping = False
                    if session.status == "I":  # portals live until the end of the transaction
                        portals.clear()
                    self._send(pq.ready_for_query(session.status))
                    self._flush()
                    continue
                if kind == b"H":
                    self._flush()
                    continue
                if skipping:
                    continue
                session.cancelled.clear()
                try:
                    if kind == b"Q":
                        self._simple(pq.cstring_payload(payload))
                        self._send(pq.ready_for_query(session.status))
                        self._flush()
                    elif kind == b"P":
                        msg = pq.parse_parse(payload)
                        prepared[msg.name] = _Prepared(msg.query, msg.param_types)
                        self._send(pq.PARSE_COMPLETE)
                    elif kind == b"B":
                        self._bind(pq.parse_bind(payload), prepared, portals)
                    elif kind == b"D":
                        self._describe(*pq.parse_describe(payload), prepared, portals)
                    elif kind == b"E":
                        self._execute(*pq.parse_execute(payload), portals)
                    elif kind == b"C":
                        which, name = pq.parse_describe(payload)
                        (prepared if which == "S" else portals).pop(name, None)
                        self._send(pq.CLOSE_COMPLETE)
                    else:
                        raise SqlError("08P01", f"unsupported message type {kind!r}")
                except SqlError as exc:
                    session.fail()
                    self._send(pq.error_response(exc.code, exc.message, hint=exc.hint))
                    if kind == b"Q":
                        self._send(pq.ready_for_query(session.status))
                        self._flush()
                    else:
                        skipping = True
                except pq.ProtocolError:
                    raise
                except Exception as exc:  # never leak a traceback; the client gets XX000
                    LOG.exception("internal error")
                    session.fail()
                    self._send(pq.error_response("XX000", f"internal error in dpgate: {type(exc).__name__}"))
                    if kind == b"Q":
                        self._send(pq.ready_for_query(session.status))
                        self._flush()
                    else:
                        skipping = True
        self._fatal("57P01", "terminating connection due to administrator command (dpgate is shutting down)")

    def _simple(self, text: str) -> None:
        session = self.session
        assert session is not None
        for sql in _split(text) or [""]:
            out = session.execute(sql)
            if out.empty:
                self._send(pq.EMPTY_QUERY)
                continue
            self._send(*(pq.parameter_status(k, v) for k, v in out.status),
                       *(pq.notice_response("00000", n) for n in out.notices))
            if out.fields is not None:
                self._send(pq.row_description(out.fields))
                self._send(*(pq.data_row([encode(v, f.type_oid, 0) for v, f in zip(row, out.fields, strict=True)])
                             for row in out.rows))
            self._send(pq.command_complete(out.tag))

    def _bind(self, msg: pq.Bind, prepared: dict[str, _Prepared], portals: dict[str, _Portal]) -> None:
        session = self.session
        assert session is not None
        stmt = prepared.get(msg.statement)
        if stmt is None:
            raise SqlError("26000", f"prepared statement {excerpt(msg.statement)} does not exist")
        oids, _ = self._described(stmt)
        if len(msg.params) != len(oids):
            raise SqlError("08P01", f"bind message supplies {len(msg.params)} parameters, but the prepared "
                                    f"statement requires {len(oids)}")
        try:
            values = [None if raw is None else decode_param(raw, oid, fmt)
                      for raw, oid, fmt in zip(msg.params, oids, msg.param_formats, strict=True)]
        except Exception as exc:
            raise SqlError("22P02", bounded_message(str(exc))) from None
        portals[msg.portal] = _Portal(stmt, values, msg)
        self._send(pq.BIND_COMPLETE)

    def _described(self, stmt: _Prepared) -> tuple[tuple[int, ...], tuple[pq.Field, ...] | None]:
        assert self.session is not None
        if not stmt.described:
            stmt.param_oids, stmt.fields = self.session.describe(stmt.sql, stmt.param_oids)
            stmt.described = True
        return stmt.param_oids, stmt.fields

    def _describe(self, which: str, name: str, prepared: dict[str, _Prepared], portals: dict[str, _Portal]) -> None:
        if which == "S":
            stmt = prepared.get(name)
            if stmt is None:
                raise SqlError("26000", f"prepared statement {excerpt(name)} does not exist")
            oids, fields = self._described(stmt)
            self._send(pq.parameter_description(oids), pq.row_description(fields) if fields else pq.NO_DATA)
            return
        portal = portals.get(name)
        if portal is None:
            raise SqlError("34000", f"portal {excerpt(name)} does not exist")
        out = self._run(portal)
        formats = [portal.bind.result_format(i) for i in range(len(out.fields or ()))]
        self._send(pq.row_description(out.fields, formats) if out.fields else pq.NO_DATA)

    def _run(self, portal: _Portal) -> Outcome:
        if portal.outcome is None:
            assert self.session is not None
            portal.outcome = self.session.execute(portal.prepared.sql, portal.params)
            self._send(*(pq.parameter_status(k, v) for k, v in portal.outcome.status),
                       *(pq.notice_response("00000", n) for n in portal.outcome.notices))
        return portal.outcome

    def _execute(self, name: str, max_rows: int, portals: dict[str, _Portal]) -> None:
        portal = portals.get(name)
        if portal is None:
            raise SqlError("34000", f"portal {excerpt(name)} does not exist")
        out = self._run(portal)
        if out.empty:
            self._send(pq.EMPTY_QUERY)
            return
        if out.fields is not None:
            end = len(out.rows) if max_rows <= 0 else min(len(out.rows), portal.sent + max_rows)
            formats = [portal.bind.result_format(i) for i in range(len(out.fields))]
            for row in out.rows[portal.sent:end]:
                self._send(pq.data_row([encode(v, f.type_oid, fmt)
                                        for v, f, fmt in zip(row, out.fields, formats, strict=True)]))
            portal.sent = end
            if end < len(out.rows):
                self._send(pq.PORTAL_SUSPENDED)
                return
        self._send(pq.command_complete(out.tag))


def _split(text: str) -> list[str]:
    """Split a simple-protocol query string into statements at top-level semicolons."""
    out, start, i, n = [], 0, 0, len(text)
    quote: str | None = None
    while i < n:
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c in ("'", '"'):
            quote = c
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        elif c == ";":
            out.append(text[start:i])
            start = i + 1
        i += 1
    out.append(text[start:])
    return [s for s in out if s.strip()]
