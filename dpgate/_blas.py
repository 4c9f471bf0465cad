"""One BLAS thread for dpgate's small dense algebra.

The inference state is many small matrix-vector products; on a 2-core machine
numpy's default BLAS thread pool made whole sessions about 6× slower than one
thread (threads contend and spin for microsecond kernels).  The gateway runs its
work inside :func:`one_blas_thread` (``threadpoolctl``, the maintained way to limit
the BLAS pools numpy and scipy load); the caller's own setting is restored after.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from threadpoolctl import ThreadpoolController

__all__ = ["LARGE_PRODUCT_BYTES", "every_blas_thread", "one_blas_thread", "single_threaded", "threads_for"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_lock = threading.Lock()
_controller: ThreadpoolController | None = None


def _blas_controller() -> ThreadpoolController:
    global _controller
    with _lock:
        if _controller is None:  # found once, after numpy and scipy have loaded their BLAS
            _controller = ThreadpoolController()
        return _controller


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit the BLAS thread pools to one thread for the block (restored after)."""
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


@contextmanager
def every_blas_thread() -> Iterator[None]:
    """Lift the limit for one large factorisation inside the gateway's work (the dense
    inverse of a 4 096-atom information matrix, faster on two threads than on one; measured:
    benchmarks/README.md, "Timings behind the code")."""
    with _blas_controller().limit(limits=os.cpu_count() or 1, user_api="blas"):
        yield


#: A matrix product reading more than this many bytes runs on every BLAS thread (:func:`threads_for`).
LARGE_PRODUCT_BYTES = 1 << 24


@contextmanager
def threads_for(nbytes: int) -> Iterator[None]:
    """:func:`every_blas_thread` for products reading more than :data:`LARGE_PRODUCT_BYTES`
    while the other cores are idle (two cores fetch memory faster than one, and switching
    costs far less than a large pass saves; benchmarks/README.md, "Timings behind the code"),
    else the limit as it is.  On busy cores BLAS threads wait for each other (3× slower
    measured beside two other processes on 2 cores), so their CPU use decides
    (:func:`_idle_cores`).  Two threads may sum in another order than one: such products
    agree to ~1e-13 relative, not bit for bit (far inside every tolerance the planner
    applies, ``decide.ACCURACY_RTOL``)."""
    if nbytes > LARGE_PRODUCT_BYTES and _idle_cores():
        with every_blas_thread():
            yield
    else:
        yield


#: How long one reading of the machine's CPU use decides :func:`_idle_cores` (seconds).
_SAMPLE_SECONDS = 1.0
_sample: tuple[float, float, float, bool] | None = None  # (time, busy core-seconds, own CPU seconds, idle)


def _idle_cores() -> bool:
    """Whether the other processes leave the cores beside this one mostly idle: over the
    last second or so, at most ``cores − 1.5`` cores busy with anything but this process.

    Measured from the kernel's CPU counters (``/proc/stat``) minus this process's own CPU
    time: the load average also counts tasks that use no CPU (a VM's kernel threads kept it
    at 1.0 on an idle 2-core machine), and this process's own work.  Elsewhere, the
    one-minute load average decides (this process included)."""
    global _sample
    cores = os.cpu_count() or 1
    if cores < 2:
        return False
    now = time.monotonic()
    last = _sample
    if last is not None and now - last[0] < _SAMPLE_SECONDS:
        return last[3]
    busy, own = _busy_seconds(), sum(os.times()[:2])
    if busy is not None and last is not None:
        idle = others_busy(busy - last[1], own - last[2], now - last[0]) <= cores - 1.5
    else:
        try:
            idle = os.getloadavg()[0] <= cores - 0.5
        except OSError:  # neither counters nor a load average: stay on one thread
            idle = False
    _sample = (now, busy if busy is not None else 0.0, own, idle)
    return idle


def others_busy(busy: float, own: float, seconds: float) -> float:
    """Cores kept busy on average by other processes: ``busy`` core-seconds of the whole
    machine, ``own`` of this process, over ``seconds``."""
    return max(0.0, busy - own) / seconds if seconds > 0 else 0.0


def _busy_seconds() -> float | None:
    """Core-seconds the machine has spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != b"cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def single_threaded(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``method`` inside :func:`one_blas_thread`."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with one_blas_thread():
            return method(*args, **kwargs)

    return wrapper
