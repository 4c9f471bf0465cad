"""Who gets a connection slot of ``dpgate serve``, and for how long a stranger may hold one.

Every accepted socket takes a slot at once, before a byte is read, and keeps it
until it closes; authenticated or not, at most ``max_connections`` sockets are
served, each by one thread.  When every slot is taken, a new socket takes the
slot of the oldest connection that has been authenticating for at least
:data:`EVICT_AFTER` seconds (that one is closed): strangers that connect and say
nothing cannot lock analysts out for the whole authentication timeout.  When no
slot can be freed so, the new socket is told ``53300`` without a read and
closed, from the accepting thread (no thread is started for it).

Until authentication is over every read and write of a connection is bounded by
one absolute deadline, ``auth_timeout`` seconds from accept (:class:`Deadline`):
a client dripping one byte at a time does not restart the clock.  After it, an
analyst may hold at most ``max_per_analyst`` slots.
"""

from __future__ import annotations

import queue
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpgate.server import _protocol as pq

__all__ = ["EVICT_AFTER", "Slot", "Slots", "Deadline", "Listener"]

#: A connection still authenticating after this many seconds may lose its slot to a new one when all are taken
#: (a real client authenticates in milliseconds; younger ones are spared so that a burst cannot evict them).
EVICT_AFTER = 1.0


@dataclass(eq=False)
class Slot:
    """One accepted socket's place among the served connections."""

    fd: int
    accepted: float  # time.monotonic() at accept
    deadline: float  # authentication must be over by then
    analyst: str | None = None  # set once authenticated
    evicted: bool = False


class Slots:
    """The served connections, counted from accept (see the module docstring)."""

    def __init__(self, max_connections: int, max_per_analyst: int, auth_timeout: float) -> None:
        self.max_connections, self.max_per_analyst, self.auth_timeout = max_connections, max_per_analyst, auth_timeout
        self._lock = threading.Lock()
        self._open: list[Slot] = []  # in accept order

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def admit(self, fd: int) -> Slot | None:
        """A slot for the socket just accepted, or None (refuse it): evicts the oldest stale stranger if full."""
        now = time.monotonic()
        with self._lock:
            if len(self._open) >= self.max_connections:
                stale = next((s for s in self._open if s.analyst is None and now - s.accepted >= EVICT_AFTER), None)
                if stale is None:
                    return None
                self._drop(stale)
            slot = Slot(fd, now, now + self.auth_timeout)
            self._open.append(slot)
            return slot

    def authenticated(self, slot: Slot, analyst: str) -> str | None:
        """Record that ``slot`` is ``analyst``'s; a refusal message (SQLSTATE 53300) if they hold too many."""
        with self._lock:
            if slot.evicted:
                return f"sorry, too many clients already (max_connections = {self.max_connections})"
            held = sum(1 for s in self._open if s.analyst == analyst)
            if held >= self.max_per_analyst:
                return (f'too many connections for analyst "{analyst}" (max_connections_per_analyst = '
                        f"{self.max_per_analyst}); close one of theirs first")
            slot.analyst = analyst
            return None

    def release(self, slot: Slot) -> None:
        """The slot's socket is about to be closed (call before closing it: its fd number may then be reused)."""
        with self._lock:
            if slot in self._open:
                self._open.remove(slot)

    def drop_unauthenticated(self) -> None:
        """On shutdown: close every connection still authenticating (nothing of theirs is in flight)."""
        with self._lock:
            for s in [s for s in self._open if s.analyst is None]:
                self._drop(s)

    def _drop(self, slot: Slot) -> None:
        # Shut the descriptor down (not close: its thread owns the socket object, maybe wrapped in TLS by now);
        # the thread's blocked read returns at once and it releases the slot, already gone from the count.
        self._open.remove(slot)
        slot.evicted = True
        try:
            s = socket.socket(fileno=slot.fd)
            try:
                s.shutdown(socket.SHUT_RDWR)
            finally:
                s.detach()
        except (OSError, ValueError):  # already closed by its thread
            pass


class Deadline:
    """``recv`` / ``sendall`` on a connection's current socket, all bounded by one absolute deadline."""

    def __init__(self, current: Callable[[], Any], deadline: float) -> None:
        self.current, self.deadline = current, deadline

    def arm(self) -> None:
        """Set the socket's timeout to the time left; TimeoutError when none is."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("authentication timeout")
        self.current().settimeout(left)

    def recv(self, n: int, /) -> bytes:
        self.arm()
        return bytes(self.current().recv(n))

    def sendall(self, data: bytes) -> None:
        self.arm()
        self.current().sendall(data)


class Listener(socketserver.TCPServer):
    """Accepts sockets; admits each to a slot (one thread for it) or refuses it with 53300 without reading.

    The threads are kept and reused (never more than the most connections ever served at once, at most
    ``max_connections`` idle): what a thread keeps for itself, like the SQLite ledger's per-thread
    connection, is then bounded by the slots rather than growing with every connection ever served.
    """

    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 would drop SYNs in a burst of connections)

    def __init__(self, address: tuple[str, int], slots: Slots, serve: Callable[[socket.socket, Slot], None]) -> None:
        self.slots, self._serve_one = slots, serve
        self._jobs: queue.SimpleQueue[tuple[socket.socket, Slot] | None] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a job that no job put in the queue is meant for yet
        self._idle_lock = threading.Lock()
        self._closed = False
        super().__init__(address, socketserver.BaseRequestHandler, bind_and_activate=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        slot = self.slots.admit(request.fileno())
        if slot is None:
            refusal = pq.error_response(
                "53300", f"sorry, too many clients already (max_connections = {self.slots.max_connections})",
                severity="FATAL")
            try:
                request.setblocking(False)  # never wait on a stranger from the accepting thread
                request.send(refusal)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._idle_lock:
            spawn = self._idle == 0
            self._idle -= 0 if spawn else 1
        self._jobs.put((request, slot))
        if spawn:
            threading.Thread(target=self._work, name="dpgate-connection", daemon=True).start()

    def server_close(self) -> None:
        """Stop listening; the idle threads end (busy ones when their connection does)."""
        super().server_close()
        with self._idle_lock:
            self._closed, idle, self._idle = True, self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            request, slot = job
            try:
                self._serve_one(request, slot)  # releases the slot, then closes the socket
            finally:
                self.slots.release(slot)
            with self._idle_lock:
                if self._closed or self._idle >= self.slots.max_connections:
                    return
                self._idle += 1
