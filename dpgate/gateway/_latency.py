"""A response time fixed from the statement, not from the data (``Gateway(fixed_latency=S)``).

Why: the noise hides a row's effect on a released *value*, not on how long the release
took.  The engine's time to read the data depends on it — on 4 M rows a fresh count took
463 ms when every row matched and 205 ms when none did — so an analyst who times answers
learns about rows the noise was meant to hide.  Haeberlen, Pierce & Narayan, *Differential
Privacy Under Fire* (USENIX Security 2011), close this timing channel by making each query's
response time a function of the query alone: the answer is held back until a deadline
fixed before any data is read.

Here, with ``fixed_latency = S``, a statement that reads data (one with a fresh release) is
answered at ``start + S``, ``start`` being when :meth:`Gateway.query` / :meth:`Gateway.run`
began it; if its work overruns S, at ``start + n·S`` for the smallest whole ``n`` that has
passed — never at a time set by the work itself.  The same holds when such a statement
fails (a refusal, an error) after it was planned.  Statements answered wholly from history
(free repeats, statements of declared keys only) read no data and are not delayed: whether a
statement reads data is decided by its plan, from the queries and the design of history
(public), never from rows.

The residual channel, stated plainly:

* an overrun is visible as the multiple ``n``: a statement whose work crosses a multiple
  of S on some data and not on other data answers a whole period later.  Choose S above
  the slowest fresh statement you expect (the period count is a coarse, rare signal, not
  a per-row one);
* ``start`` is taken before the gateway's lock is acquired, so waiting for another
  statement's work (which depends on its data) counts against this statement's S; a
  statement's own answer time leaks another's work only through an overrun;
* the sleep is a thread sleep: scheduling jitter (tens to hundreds of µs, more on a
  loaded host) remains, and is independent of the data;
* whatever runs outside the gateway (network, the server's encoding of the result) is
  not covered; it does not read the data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dpgate.errors import InvalidArgument

__all__ = ["MAX_SECONDS", "Latency", "Timer"]

#: Longest fixed latency (a day, as ``dpgate serve --fixed-latency`` allows).
MAX_SECONDS = 86_400


class Timer:
    """One statement's clock: started on entry, marked once the statement will read data."""

    __slots__ = ("reads_data", "start")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.reads_data = False


@dataclass(frozen=True)
class Latency:
    """The gateway's response-time rule: ``seconds`` (S > 0) or None (answer as soon as ready)."""

    seconds: float | None = None

    def __post_init__(self) -> None:
        s = self.seconds
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s)
                              or not 0 < s <= MAX_SECONDS):
            raise InvalidArgument(f"fixed_latency must be a positive number of seconds up to {MAX_SECONDS} (a day) "
                                  f"or None, got {s!r}.")

    def deadline(self, start: float, now: float) -> float:
        """When a statement begun at ``start`` may answer, ``now`` being when its work ended: the
        first ``start + n·S`` (n ≥ 1) not before ``now`` — a function of the statement's start and S only,
        except for the whole number of periods an overrun takes."""
        assert self.seconds is not None
        periods = max(1, math.ceil((now - start) / self.seconds))
        return start + periods * self.seconds

    @contextmanager
    def timed(self) -> Iterator[Timer]:
        """Time one statement; on leaving (answer or exception), if it was marked ``reads_data``,
        sleep until :meth:`deadline`.  Leave the gateway's lock before this block ends: the
        sleep must not hold other statements back."""
        timer = Timer()
        try:
            yield timer
        finally:
            if self.seconds is not None and timer.reads_data:
                _sleep_until(self.deadline(timer.start, time.monotonic()))


#: The last stretch before a deadline is waited for by polling the clock: a thread's sleep
#: overshoots by the scheduler's wake-up delay, this keeps the answer time to the clock's.
_SPIN = 0.002


def _sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (``time.monotonic()``), not before, sleeping all but the last few ms."""
    wait = deadline - time.monotonic()
    if wait > _SPIN:
        time.sleep(wait - _SPIN)
    while time.monotonic() < deadline:
        pass
