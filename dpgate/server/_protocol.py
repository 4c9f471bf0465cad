"""PostgreSQL frontend/backend protocol v3: message framing, parsing and building.

Only the subset ``dpgate serve`` speaks: startup (with SSL/GSS negotiation and
cancel requests), SASL authentication, the simple query protocol and the
extended protocol (Parse / Bind / Describe / Execute / Close / Sync / Flush).
Every message after startup is ``type (1 byte) | length (int32, counting
itself) | payload``; startup packets have no type byte.  All integers are
big-endian.  Reference: the PostgreSQL manual, "Frontend/Backend Protocol",
chapters "Message Flow" and "Message Formats".

Pure functions over bytes, plus :func:`read_startup` / :func:`read_message`
over any object with a blocking ``recv`` (a socket or an ``ssl.SSLSocket``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dpgate.errors import InterfaceError

__all__ = [
    "PROTOCOL_V3", "SSL_REQUEST", "GSSENC_REQUEST", "CANCEL_REQUEST", "MAX_MESSAGE", "MAX_STARTUP",
    "MAX_AUTH_MESSAGE",
    "ProtocolError", "Field", "Bind", "Parse",
    "read_startup", "read_message", "parse_startup", "parse_parse", "parse_bind", "parse_describe",
    "parse_execute", "parse_sasl_initial", "cstring_payload",
    "message", "authentication", "parameter_status", "backend_key_data", "ready_for_query",
    "row_description", "data_row", "command_complete", "error_response", "notice_response",
    "parameter_description", "PARSE_COMPLETE", "BIND_COMPLETE", "CLOSE_COMPLETE", "NO_DATA",
    "EMPTY_QUERY", "PORTAL_SUSPENDED",
]

PROTOCOL_V3 = 196608  # 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
#: The largest message accepted (bytes); a longer length field is a protocol error.
MAX_MESSAGE = 1 << 24
#: Before authentication, from anyone: the largest startup packet and SASL message (bytes).  libpq's are a
#: few hundred bytes; a stranger's longer length field is refused before any of the rest is read.
MAX_STARTUP = MAX_AUTH_MESSAGE = 8192


class ProtocolError(InterfaceError):
    """The peer broke the protocol (bad length, truncated or malformed message); the client sees 08P01."""


class _Recv(Protocol):
    def recv(self, n: int, /) -> bytes: ...


def _exactly(sock: _Recv, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 16))
        if not chunk:
            raise EOFError("the client closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_startup(sock: _Recv) -> tuple[int, bytes]:
    """Read one startup-phase packet: ``(request code, rest of the payload)``."""
    (length,) = struct.unpack("!i", _exactly(sock, 4))
    if not 8 <= length <= MAX_STARTUP:
        raise ProtocolError(f"invalid startup packet length {length}")
    body = _exactly(sock, length - 4)
    (code,) = struct.unpack("!i", body[:4])
    return code, body[4:]


def read_message(sock: _Recv, limit: int = MAX_MESSAGE) -> tuple[bytes, bytes]:
    """Read one typed message: ``(type byte, payload)``; a length over ``limit`` bytes is a ProtocolError."""
    head = _exactly(sock, 5)
    (length,) = struct.unpack("!i", head[1:])
    if not 4 <= length <= limit:
        raise ProtocolError(f"invalid message length {length} for message type {head[:1]!r}")
    return head[:1], _exactly(sock, length - 4)


# -- parsing -------------------------------------------------------------------------------------
class _Buffer:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError("truncated message")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(struct.unpack("!h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack("!i", self.take(4))[0])

    def cstring(self) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolError("unterminated string")
        out = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a string is not valid UTF-8") from None

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError("trailing bytes in message")


def parse_startup(payload: bytes) -> dict[str, str]:
    """The ``name=value`` parameters of a StartupMessage (user, database, options …)."""
    buf, out = _Buffer(payload), {}
    while True:
        name = buf.cstring()
        if not name:
            break
        out[name] = buf.cstring()
    buf.done()
    return out


def cstring_payload(payload: bytes) -> str:
    """A payload that is one NUL-terminated string (Query)."""
    buf = _Buffer(payload)
    text = buf.cstring()
    buf.done()
    return text


@dataclass(frozen=True)
class Parse:
    """A Parse message: statement name, SQL text, parameter type OIDs (0: unspecified)."""

    name: str
    query: str
    param_types: tuple[int, ...]


def parse_parse(payload: bytes) -> Parse:
    buf = _Buffer(payload)
    name, query = buf.cstring(), buf.cstring()
    types = tuple(buf.int32() & 0xFFFFFFFF for _ in range(buf.int16()))
    buf.done()
    return Parse(name, query, types)


@dataclass(frozen=True)
class Bind:
    """A Bind message: portal, prepared statement, parameter formats and values, result formats."""

    portal: str
    statement: str
    param_formats: tuple[int, ...]  # one per parameter (expanded from 0 or 1 codes)
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]  # as sent: 0 codes (all text), 1 (all), or one per column

    def result_format(self, column: int) -> int:
        """The format (0 text, 1 binary) the client wants for result column ``column``."""
        if not self.result_formats:
            return 0
        return self.result_formats[0] if len(self.result_formats) == 1 else self.result_formats[column]


def parse_bind(payload: bytes) -> Bind:
    buf = _Buffer(payload)
    portal, statement = buf.cstring(), buf.cstring()
    formats = tuple(buf.int16() for _ in range(buf.int16()))
    n = buf.int16()
    params: list[bytes | None] = []
    for _ in range(n):
        size = buf.int32()
        params.append(None if size == -1 else buf.take(size))
    results = tuple(buf.int16() for _ in range(buf.int16()))
    buf.done()
    if len(formats) not in (0, 1, n):
        raise ProtocolError(f"Bind has {len(formats)} parameter format codes for {n} parameters")
    expanded = formats * n if len(formats) == 1 else (formats or (0,) * n)
    if any(f not in (0, 1) for f in (*expanded, *results)):
        raise ProtocolError("format codes must be 0 (text) or 1 (binary)")
    return Bind(portal, statement, expanded, tuple(params), results)


def parse_describe(payload: bytes) -> tuple[str, str]:
    """Describe / Close: ``('S' or 'P', name)``."""
    buf = _Buffer(payload)
    kind = buf.take(1).decode("ascii", "replace")
    name = buf.cstring()
    buf.done()
    if kind not in ("S", "P"):
        raise ProtocolError(f"Describe/Close of {kind!r}, expected 'S' or 'P'")
    return kind, name


def parse_execute(payload: bytes) -> tuple[str, int]:
    buf = _Buffer(payload)
    portal, max_rows = buf.cstring(), buf.int32()
    buf.done()
    return portal, max_rows


def parse_sasl_initial(payload: bytes) -> tuple[str, bytes]:
    """SASLInitialResponse: ``(mechanism, client-first message)``."""
    buf = _Buffer(payload)
    mechanism = buf.cstring()
    size = buf.int32()
    data = b"" if size == -1 else buf.take(size)
    buf.done()
    return mechanism, data


# -- building ------------------------------------------------------------------------------------
def message(kind: bytes, payload: bytes = b"") -> bytes:
    """Frame a backend message: type byte, int32 length (including itself), payload."""
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _cstr(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def authentication(code: int, data: bytes = b"") -> bytes:
    """AuthenticationOk (0), SASL (10, data = mechanism list), SASLContinue (11), SASLFinal (12)."""
    return message(b"R", struct.pack("!i", code) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, secret))


def ready_for_query(status: str) -> bytes:
    """``status``: 'I' idle, 'T' in a transaction block, 'E' in a failed one."""
    return message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1


def row_description(fields: Sequence[Field], formats: Sequence[int] | None = None) -> bytes:
    parts = [struct.pack("!h", len(fields))]
    for i, f in enumerate(fields):
        fmt = formats[i] if formats else 0
        parts.append(_cstr(f.name) + struct.pack("!ihihih", 0, 0, f.type_oid, f.type_size, f.type_modifier, fmt))
    return message(b"T", b"".join(parts))


def data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [struct.pack("!h", len(values))]
    for v in values:
        parts.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", _cstr(tag))


def _fields(severity: str, code: str, text: str, detail: str | None, hint: str | None) -> bytes:
    parts: list[tuple[str, Any]] = [("S", severity), ("V", severity), ("C", code), ("M", text)]
    parts += [(k, v) for k, v in (("D", detail), ("H", hint)) if v]
    return b"".join(k.encode("ascii") + _cstr(str(v)) for k, v in parts) + b"\x00"


def error_response(code: str, text: str, *, severity: str = "ERROR", detail: str | None = None,
                   hint: str | None = None) -> bytes:
    """ErrorResponse with SQLSTATE ``code`` (severity ERROR or FATAL)."""
    return message(b"E", _fields(severity, code, text, detail, hint))


def notice_response(code: str, text: str, *, severity: str = "NOTICE") -> bytes:
    return message(b"N", _fields(severity, code, text, None, None))


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids))


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")
