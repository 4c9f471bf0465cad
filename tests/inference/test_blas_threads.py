"""When large products may use every BLAS thread: only while other processes leave a core idle."""

from __future__ import annotations

import os
import time

import pytest

from dpgate import _blas


@pytest.mark.parametrize(("others", "idle"), [(0.0, True), (0.4, True), (0.8, False), (2.0, False)])
def test_other_processes_decide(monkeypatch: pytest.MonkeyPatch, others: float, idle: bool) -> None:
    """On 2 cores, the last reading's CPU use by other processes (machine busy time minus
    this process's own) decides: at most half a core busy elsewhere."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    own = sum(os.times()[:2])
    seconds = 2.0
    monkeypatch.setattr(_blas, "_sample", (time.monotonic() - seconds, 100.0, own, not idle))
    # The machine was busy for this process's own CPU time (≈ 0 here) plus the others'.
    monkeypatch.setattr(_blas, "_busy_seconds", lambda: 100.0 + others * seconds)
    assert _blas._idle_cores() is idle
    assert _blas._sample is not None and _blas._sample[3] is idle  # kept for the next second
    monkeypatch.setattr(_blas, "_busy_seconds", lambda: 1e9)
    assert _blas._idle_cores() is idle


def test_others_busy_subtracts_this_process() -> None:
    assert _blas.others_busy(3.0, 1.0, 2.0) == 1.0
    assert _blas.others_busy(1.0, 1.5, 2.0) == 0.0  # counters read at slightly different times
    assert _blas.others_busy(1.0, 0.0, 0.0) == 0.0


def test_one_core_never_spreads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert _blas._idle_cores() is False
