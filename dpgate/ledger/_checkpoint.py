"""A checkpoint of the gateway's inference state next to a file ledger, for fast re-opening.

Re-opening a ledger replays every record into the atoms, the incremental BLUE and
the per-cell costs; at thousands of releases that replay dominates start-up.  The
gateway therefore saves its state to ``<ledger>.state`` and, on the next start,
loads it instead of replaying the records it covers — but only after checking it
against the ledger, which stays the only source of truth:

* the file carries a keyed MAC (HMAC-SHA256 with the ledger's key, domain-separated
  from the ledger's own MACs) over everything in it, checked *before* anything is
  unpickled, so only a process holding the key can have written it.  It is a two-level
  HMAC: one per 32 MiB chunk (its position and the total length bound in), computed in
  parallel threads, and one over those — a 475 MB file is MAC'd on every core;
* it names the number of records it covers and the chained MAC of the last of them,
  which must equal the MAC this process verified for that record in the ledger's
  chain check (a MAC that commits to every field of every record up to it), so it
  can only stand for this ledger's history;
* format, dpgate version, the schema's tables and ``max_atoms`` must match
  (the replay depends on them).

Any mismatch, a missing or unreadable file: the records are replayed as before and
the file is rewritten.

Layout (format 4): magic, MAC, the lengths of the pickle and of its out-of-band buffers,
the pickle (protocol 5), then each buffer (the large arrays: the inference state's basis,
coefficients and square root) raw, 64-byte aligned.  Loading maps the file copy-on-write,
MACs it (chunks in parallel) and unpickles with the buffers as views of the mapping: hundreds of
megabytes are neither copied nor parsed, and pages the gateway later writes to are
copied privately (the file never changes).  In-memory ledgers and ledgers opened without their key get
no checkpoint.  The file holds only public structure (query vectors, atoms) and
released values — what the ledger itself holds — never data.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import mmap
import os
import pickle
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dpgate.ledger.core import Ledger, LedgerRecord

__all__ = ["load", "path_for", "save"]

#: Bumped whenever the pickled inference state changes shape (an older file is then replayed).
_MAGIC = b"dpgate-checkpoint 4\n"
_DOMAIN = b"dpgate inference checkpoint v1"


def path_for(ledger: Ledger) -> str | None:
    """Where ``ledger``'s checkpoint lives, or ``None`` when it gets none (in memory, no key, or a
    ledger in a database server, whose ``path`` is a URL)."""
    if ledger.path is None or "://" in ledger.path or _key(ledger) is None:
        return None
    return ledger.path + ".state"


def _key(ledger: Ledger) -> bytes | None:
    key = getattr(ledger, "_key", None)  # the ledger's secret: the checkpoint is keyed like its records
    return key if isinstance(key, bytes) else None


def _mac_key(key: bytes) -> bytes:
    return hmac.new(key, _DOMAIN, hashlib.sha256).digest()


#: The MAC'd region is hashed in chunks of this many bytes, in parallel (hashlib releases the GIL).
_MAC_CHUNK = 32 << 20


def _region_mac(mac_key: bytes, region: memoryview) -> bytes:
    """The file's MAC over ``region``: HMAC-SHA256 under ``mac_key`` of the region's length and
    the inner MACs of its chunks, each HMAC-SHA256 under a key derived from ``mac_key`` of the
    chunk's offset, the region's length and the chunk — on every core for a large region."""
    inner_key = hmac.new(mac_key, b"chunk", hashlib.sha256).digest()
    size = len(region)

    def inner(at: int) -> bytes:
        h = hmac.new(inner_key, struct.pack("<QQ", at, size), hashlib.sha256)
        h.update(region[at: at + _MAC_CHUNK])
        return h.digest()

    starts = range(0, size, _MAC_CHUNK)
    if len(starts) > 1:
        with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
            inners = list(pool.map(inner, starts))
    else:
        inners = [inner(at) for at in starts]
    return hmac.new(mac_key, struct.pack("<Q", size) + b"".join(inners), hashlib.sha256).digest()


#: Buffers start at multiples of this (aligned arrays).
_ALIGN = 64
_COUNT = struct.Struct("<QQ")  # pickle length, number of buffers


def _pad(offset: int) -> bytes:
    return b"\0" * (-offset % _ALIGN)


def save(ledger: Ledger, header: dict[str, Any], records: Sequence[LedgerRecord], state: Any) -> None:
    """Write ``state`` as the checkpoint of ``ledger``'s first ``len(records)`` records (best effort, atomic)."""
    path, key, head = path_for(ledger), _key(ledger), ledger.chain_mac(len(records))
    if path is None or key is None or head is None:
        return
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(({**header, "count": len(records), "head": head}, state),
                        protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    pieces: list[bytes | memoryview] = [_COUNT.pack(len(body), len(raws)),
                                        struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)), body]
    offset = len(_MAGIC) + 32 + sum(len(p) for p in pieces)
    for r in raws:
        pieces.append(_pad(offset))
        offset += len(pieces[-1])
        pieces.append(r)
        offset += r.nbytes
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):  # a checkpoint is an optimisation: failing to write it costs a replay
        # Owner-only whatever the umask: it holds the history's design (os.open's mode, then fchmod).
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w+b") as f:
            f.writelines((_MAGIC, bytes(32), *pieces))  # no concatenated copy of a large body; MAC below
            f.flush()
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as written:
                mac = _region_mac(_mac_key(key), memoryview(written)[len(_MAGIC) + 32:])
            f.seek(len(_MAGIC))
            f.write(mac)
        os.replace(tmp, path)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def load(ledger: Ledger, header: dict[str, Any], records: Sequence[LedgerRecord]) -> tuple[int, Any] | None:
    """``(count, state)`` from ``ledger``'s checkpoint if it verifies against ``records``, else ``None``.

    ``records``: the ledger's records, already verified by its chain check.
    """
    path, key = path_for(ledger), _key(ledger)
    if path is None or key is None:
        return None
    try:
        with open(path, "rb") as f:
            raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: writes never reach the file
    except (OSError, ValueError):  # missing, unreadable or empty
        return None
    view = memoryview(raw)
    n = len(_MAGIC) + 32
    if view[: len(_MAGIC)] != _MAGIC or len(view) < n + _COUNT.size:
        return None
    if not hmac.compare_digest(bytes(view[len(_MAGIC):n]), _region_mac(_mac_key(key), view[n:])):
        return None  # not written with this ledger's key: never unpickled
    try:
        size, count_buffers = _COUNT.unpack_from(view, n)
        at = n + _COUNT.size
        lengths = struct.unpack_from(f"<{count_buffers}Q", view, at)
        at += 8 * count_buffers
        body = view[at: at + size]
        at += size
        buffers = []
        for length in lengths:
            at += -at % _ALIGN
            buffers.append(view[at: at + length])
            at += length
        if at != len(view):
            return None
        stored, state = pickle.loads(body, buffers=buffers)  # noqa: S301 - authenticated above
    except Exception:  # noqa: BLE001 - a checkpoint from another dpgate build: replay instead
        return None
    count, head = stored.get("count"), stored.get("head")
    if (not isinstance(count, int) or not 0 < count <= len(records)
            or any(stored.get(k) != v for k, v in header.items())
            or head is None or head != ledger.chain_mac(count)):
        return None
    return count, state
