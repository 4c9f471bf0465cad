"""The ledger's secret key, its chain MACs and its anchor (split from :mod:`dpgate.ledger.core`).

Why a key.  A ledger must be bound to its data source, but anything computed
from the data alone (a digest of the rows) is a function of private data: an
adversary who knows every row but one can enumerate the missing row and test
each guess against it, at no privacy cost.  So the ledger stores only
``HMAC-SHA256(key, digest)`` with a 32-byte secret key kept *outside* the ledger
file (``<ledger>.key``, owner-only, mode 0o600) or supplied by the operator.

Why a chain and an anchor.  Every record and the budget header carry a keyed
MAC that chains to the previous one, so an edited, deleted or re-ordered record
breaks the chain.  Truncating the tail, deleting the file or restoring an older
copy leaves a valid *prefix*; that is caught by the anchor ``<ledger>.anchor``,
the record count and head MAC written next to the key after every commit.  A
ledger *ahead* of its anchor (a crash between the commit and the anchor write)
is accepted when its chain verifies; one *behind* or *different* is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from dpgate.errors import InvalidArgument, InvalidArgumentType, LedgerError

__all__ = ["KEY_BYTES", "Anchor", "binding_mac", "create_key_files", "header_mac", "read_anchor", "read_key", "resolve_key",
           "record_mac", "chain_macs", "write_anchor"]

KEY_BYTES = 32
_KEY_HEADER = "dpgate-ledger-key 1"
_ANCHOR_HEADER = "dpgate-ledger-anchor 1"

Anchor = tuple[int, str]
"""``(record count, MAC of the last record)``; ``(0, "")`` before the first commit."""


def key_from_bytes(key: bytes) -> bytes:
    """Validate an operator-supplied key (at least 16 bytes)."""
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise InvalidArgument("ledger_key must be at least 16 random bytes, or the path of a key file.")
    return bytes(key)


def read_key(path: str) -> bytes:
    """The key stored at ``path``; refuse a file other users could read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise LedgerError(f"The ledger key file {path!r} does not exist.") from None
    except OSError as exc:
        raise LedgerError(f"Cannot read the ledger key file {path!r} ({exc}).") from None
    with os.fdopen(fd, "r", encoding="ascii", errors="replace") as f:
        st = os.fstat(f.fileno())
        if st.st_mode & 0o077 or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            raise LedgerError(
                f"The ledger key file {path!r} has mode {stat.filemode(st.st_mode)} or another owner: "
                "it must be readable by its owner only. Run `chmod 600` on it as its owner."
            )
        lines = f.read().split()
    if len(lines) != 3 or " ".join(lines[:2]) != _KEY_HEADER:
        raise LedgerError(f"{path!r} is not a dpgate ledger key file.")
    try:
        key = bytes.fromhex(lines[2])
    except ValueError:
        raise LedgerError(f"{path!r} is not a dpgate ledger key file.") from None
    if len(key) < 16:
        raise LedgerError(f"{path!r} is not a dpgate ledger key file.")
    return key


def resolve_key(path: str | None, key: bytes | str | os.PathLike[str] | None) -> bytes | None:
    """The ledger key: the operator's bytes or key file, else ``<path>.key`` (``None`` if missing)."""
    if isinstance(key, (bytes, bytearray)):
        return key_from_bytes(key)
    if key is not None:
        if not isinstance(key, (str, os.PathLike)):
            raise InvalidArgumentType(f"ledger_key must be bytes or a key file path, not {type(key).__name__}.")
        return read_key(os.path.abspath(os.fspath(key)))
    if path is None:
        return secrets.token_bytes(KEY_BYTES)  # in memory: a fresh key per ledger
    default = path + ".key"
    return read_key(default) if os.path.lexists(default) else None


def _write_private(path: str, text: str) -> str:
    """Write ``text`` to a fresh owner-only temporary file next to ``path``, fsync'd; return its name."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly owner read/write, whatever the umask
        os.write(fd, text.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def create_key_files(key_path: str, anchor_path: str) -> bytes:
    """Create a fresh key at ``key_path`` (and an empty anchor), or read the one a racing process made.

    The anchor is put in place first and the key last, with ``link`` (which fails
    if the key exists): a key file therefore always has its anchor next to it.
    """
    key = secrets.token_bytes(KEY_BYTES)
    write_anchor(anchor_path, (0, ""), replace=False)
    tmp = _write_private(key_path, f"{_KEY_HEADER}\n{key.hex()}\n")
    try:
        os.link(tmp, key_path)
    except FileExistsError:
        return read_key(key_path)
    except OSError as exc:
        raise LedgerError(f"Cannot create the ledger key file {key_path!r} ({exc}).") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _fsync_dir(key_path)
    return key


def read_anchor(path: str) -> Anchor | None:
    """The anchor at ``path``, or ``None`` if there is none."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            words = f.read().split()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"Cannot read the ledger anchor {path!r} ({exc}).") from None
    if len(words) not in (3, 4) or " ".join(words[:2]) != _ANCHOR_HEADER or not words[2].isdigit():
        raise LedgerError(f"The ledger anchor {path!r} is damaged; restore it from a backup.")
    return int(words[2]), words[3] if len(words) == 4 else ""


def write_anchor(path: str, anchor: Anchor, *, replace: bool = True, durable: bool = False) -> None:
    """Atomically write ``anchor`` (rename over the old one; with ``replace=False`` keep an existing one).

    ``durable`` also fsyncs the directory (always done when not replacing).
    """
    count, mac = anchor
    tmp = _write_private(path, f"{_ANCHOR_HEADER}\n{count} {mac}\n")
    try:
        if replace:
            # No directory fsync after a commit: an anchor update lost in a power cut
            # leaves the ledger ahead of its anchor, which is accepted.
            os.replace(tmp, path)
            if not durable:
                return
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))  # what the MACs cover, built once


def _mac(key: bytes, label: str, payload: object) -> str:
    text = _JSON.encode([label, payload])
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def binding_mac(key: bytes, fingerprint: str) -> str:
    """The stored binding: a keyed MAC of the data + schema digest (reveals nothing without the key)."""
    return _mac(key, "binding", fingerprint)


def header_mac(key: bytes, meta: dict[str, str]) -> str:
    """The MAC of the budget header: the start of the chain.  A zCDP ledger's header names its
    accounting (``privacy``), covered too; a pure-ε ledger's has none (ledgers made before zCDP)."""
    own = "privacy" in meta and "converted_budget" not in meta  # a converted ledger's is in conversion_mac
    fields = ("format_version", "binding", "budget", "created_at", *(("privacy",) if own else ()))
    return _mac(key, "header", [meta.get(k) for k in fields])


def conversion_mac(key: bytes, meta: dict[str, str]) -> str:
    """The MAC of a pure-ε ledger's conversion to zCDP (``Gateway(..., convert_ledger=True)``): its
    original header's MAC, the new accounting and ρ budget, and how many records it held then."""
    return _mac(key, "conversion", [meta.get(k) for k in ("header_mac", "privacy", "converted_budget", "converted_at")])


def record_mac(key: bytes, previous: str, row: Sequence[object]) -> str:
    """The MAC of one record row (``_COLUMNS`` order, id first), chained to ``previous``."""
    return chain_macs(key, previous, [row])[0]


def _generic_record_text(previous: str, row: Sequence[object]) -> str:
    """What a record's MAC covers: ``_mac``'s text of ``["record", [previous, fields]]``, each float
    field as its ``float.hex`` (``+ 0.0``: SQLite stores -0.0 as 0.0)."""
    fields = [(v + 0.0).hex() if isinstance(v, float) else v for v in row]
    return _JSON.encode(["record", [previous, fields]])


#: The column types of a stored record row (STRICT SQLite columns, and PostgreSQL's).
_ROW_TYPES = (int, str, str, str, str, float, float, float, float, str, float, float, int, str, str)


def chain_macs(key: bytes, previous: str, rows: Sequence[Sequence[Any]]) -> list[str]:
    """The MACs of consecutive record rows, each chained to the one before (the first to ``previous``).

    The same MACs as :func:`record_mac` one row at a time, computed faster: a row of the stored
    column types is written straight into ``_mac``'s JSON text (the same text, byte for byte, as
    the tests check), reusing the runs of fields a statement's records share.
    """
    if not rows:
        return []
    keyed = hmac.new(key, digestmod=hashlib.sha256)  # the keyed state, copied per row
    q = encode_basestring_ascii
    # The JSON of runs of fields, by their values (the types are fixed: no 1 == 1.0 clash; equal
    # floats have equal ``(v + 0.0).hex()``, −0.0 and 0.0 included).
    heads: dict[tuple[Any, ...], str] = {}
    mids: dict[tuple[Any, ...], str] = {}
    tails: dict[tuple[Any, ...], str] = {}
    out = []
    for row in rows:
        if tuple(map(type, row)) == _ROW_TYPES:
            rid, kind, table, query, sql, alpha, sens, scale, lattice, noise, value, cost, secure, created, session = row
            head = heads.get(k1 := (kind, table))
            if head is None:
                head = heads[k1] = f"{q(kind)},{q(table)}"
            mid = mids.get(k2 := (sql, alpha, sens, scale, lattice, noise))
            if mid is None:
                mid = mids[k2] = (f'{q(sql)},"{(alpha + 0.0).hex()}","{(sens + 0.0).hex()}","{(scale + 0.0).hex()}",'
                                 f'"{(lattice + 0.0).hex()}",{q(noise)}')
            tail = tails.get(k3 := (cost, secure, created, session))
            if tail is None:
                tail = tails[k3] = f'"{(cost + 0.0).hex()}",{secure},{q(created)},{q(session)}'
            text = f'["record",[{q(previous)},[{rid},{head},{q(query)},{mid},"{(value + 0.0).hex()}",{tail}]]]'
        else:  # any other row (e.g. a bool flag): the general encoder
            text = _generic_record_text(previous, row)
        h = keyed.copy()
        h.update(text.encode("ascii"))
        previous = h.hexdigest()
        out.append(previous)
    return out
