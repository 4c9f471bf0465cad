"""The ledger's writer locks: threads of a process, then processes, per ledger file.

The guarantees are stated in :mod:`dpgate.ledger.core`.
SQLite's ``BEGIN IMMEDIATE`` (PostgreSQL's advisory lock) is the correctness
guarantee; these locks only make waiting prompt and fair.  After ``fork`` the
child starts with fresh locks.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar, cast

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["MemoryLock", "PathLock", "lock_for", "thread_lock_for"]


class PathLock:
    """Serialises the writers of one ledger file: threads, then processes.

    Threads of this process queue on a ``threading.Lock``; processes on an
    ``flock`` of the sidecar file ``<path>-lock`` (released by the kernel if the
    holder dies).  SQLite's ``BEGIN IMMEDIATE`` still serialises writers on its
    own and remains the correctness guarantee; this lock only makes waiting
    cheap and prompt: SQLite's busy handler sleeps up to 100 ms between
    attempts, which lets one busy process starve the others, while this lock is
    retried at least every 2 ms.  Where ``fcntl`` or the sidecar file is
    unavailable the process level is skipped.
    """

    def __init__(self, path: str) -> None:
        self.sidecar = path + "-lock"
        self.threads = threading.Lock()
        self.fd: int | None = None

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self.threads.acquire(timeout=timeout):
            return False
        if fcntl is None:
            return True
        try:
            if self.fd is None:
                self.fd = os.open(self.sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            delay = 0.0001
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        self.threads.release()
                        return False
                    time.sleep(delay)
                    delay = min(2 * delay, 0.002)
        except OSError:  # no sidecar (read-only directory, odd file system): SQLite alone
            return True

    def release(self) -> None:
        try:
            if fcntl is not None and self.fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()


class MemoryLock:
    """The lock of an in-memory ledger: one re-entrant thread lock."""

    def __init__(self) -> None:
        self.threads = threading.RLock()

    def acquire(self, timeout: float) -> bool:
        return self.threads.acquire(timeout=timeout)

    def release(self) -> None:
        self.threads.release()


_L = TypeVar("_L", PathLock, MemoryLock)

#: The one lock per ledger in this process: ``("file", path)`` → :class:`PathLock`, and for
#: stores that serialise writers themselves (PostgreSQL) ``("url", url)`` → :class:`MemoryLock`.
_locks: dict[tuple[str, str], PathLock | MemoryLock] = {}
_locks_guard = threading.Lock()


def lock_for(path: str) -> PathLock:
    """The one writer lock of the ledger file ``path`` in this process."""
    return _registered(("file", path), lambda: PathLock(path))


def thread_lock_for(url: str) -> MemoryLock:
    """The one writer lock of the threads of this process on the ledger at ``url`` (its store
    serialises processes on its own, e.g. PostgreSQL's advisory lock)."""
    return _registered(("url", url), MemoryLock)


def _registered(key: tuple[str, str], make: Callable[[], _L]) -> _L:
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = make()
        return cast(_L, lock)  # the key's kind fixes the lock's class


def _reset_locks_after_fork() -> None:
    # A lock held by another thread at fork time would stay held in the child, and
    # an inherited flock descriptor is shared with the parent: start afresh.
    global _locks, _locks_guard
    _locks = {}
    _locks_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)
