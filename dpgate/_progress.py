"""Progress bars for long work: tqdm on stderr, only on a terminal, off on request.

tqdm is optional (it comes with the ``demo`` extra): without it, or when stderr is
not a terminal, or after :func:`set_enabled(False) <set_enabled>` (the CLI's
``--quiet``), every helper here is a no-op.  A bar appears only once the work has
taken :data:`DELAY` seconds, so quick calls never flicker.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["DELAY", "set_enabled", "enabled", "track", "working"]

_T = TypeVar("_T")
#: Seconds of work before a bar is drawn.
DELAY = 2.0
_enabled: bool | None = None  # None: whenever stderr is a terminal


def set_enabled(flag: bool | None) -> None:
    """``False``: never draw bars; ``True``: always (if tqdm is installed); ``None``: on a terminal."""
    global _enabled
    _enabled = flag


def enabled() -> bool:
    """Whether bars are drawn now."""
    if _enabled is False or not _have_tqdm():
        return False
    return bool(_enabled) or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


@functools.cache
def _have_tqdm() -> bool:
    """Whether tqdm is installed (looked up once: a lookup stats the file system)."""
    return importlib.util.find_spec("tqdm") is not None


def track(items: Iterable[_T], total: int, desc: str) -> Iterator[_T]:
    """``items``, advancing a bar of ``total`` steps as they are consumed (drawn after :data:`DELAY` s)."""
    if not enabled():
        yield from items
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, file=sys.stderr, leave=False, delay=DELAY) as bar:
        for item in items:
            yield item
            bar.update(1)


@contextmanager
def working(desc: str) -> Iterator[None]:
    """An elapsed-time bar for one long step that has no count (a model fit, planning)."""
    if not enabled():
        yield
        return
    from tqdm import tqdm

    stop = threading.Event()
    bar = tqdm(total=None, desc=desc, file=sys.stderr, leave=False, bar_format="{desc}: {elapsed}", delay=1e9)
    start = time.monotonic()
    shown = threading.Event()

    def refresh() -> None:
        while not stop.wait(0.5):
            if time.monotonic() - start >= DELAY:
                bar.refresh()
                shown.set()

    thread = threading.Thread(target=refresh, name="dpgate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if shown.is_set():
            bar.clear()
        bar.close()
