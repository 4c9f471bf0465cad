"""Honest re-asking: the confidence the k-th ask of one query is answered at (δ-spending).

An analyst who re-asks a query — tighter each time, say — and stops as soon as an answer
looks decisive picks, among several intervals, the first that misses: each interval at
``1 − δ`` on its own gives the one stopped on a coverage well below ``1 − δ`` (0.83 at a
nominal 0.95 for the stop-when-excluded analyst of ``tests/plan/test_reasks.py``).

Under ``reasks="simultaneous"`` (the default, :data:`REASK_MODES`) the ``k``-th distinct
interval of one query (``k = 1, 2, …``) is computed at confidence ``1 − δ_k`` with
``Σ_k δ_k ≤ δ`` (:func:`ask_delta`).  By the union bound, the probability that *any* of
the query's intervals misses is at most δ, so whatever rule decides when to stop, the
interval stopped on covers with probability ≥ ``1 − δ``.  Proved for asks whose
accuracies are fixed before looking (when to stop may depend on anything seen); each
interval is still at least as narrow as asked (the planner plans at ``1 − δ_k``).

**The schedule.**  ``δ_1 = 0.9·δ`` and ``δ_k = 0.1·δ·(6/π²)/(k−1)²`` for ``k ≥ 2``
(``Σ_{k≥2} 1/(k−1)² = π²/6``, so the sum is exactly δ).  Why these shares:

* Most queries are asked once, so the first ask gets most of δ: with Laplace-like noise
  the ε of an interval grows like ``ln(1/δ)``, and ``ln(1/0.045)/ln(1/0.05) ≈ 1.035``:
  a first ask at 95 % costs about 3.5 % more ε than without the split (measured on the
  PUMS session and the paper workload in ``benchmarks/bench_reask.py``).
* The rest is spread as ``1/(k−1)²``: a re-ask is expensive anyway (it asks more), the
  second ask gets 6 % of δ (``ln(1/0.003) ≈ 5.8`` against 3.0 at 95 %), and the tail
  decays slowly enough that the 10th ask still costs only ``ln`` of a polynomial.
  A first share of 0.5 would make every query 23 % dearer at 95 % to make the second
  ask about 28 % cheaper; a share of 0.99 would make the second ask cost ``ln(1/0.0003) ≈ 8.1``.
* Repeats cost nothing: an unchanged estimate keeps its level, and an earlier interval that
  still meets the request is given again (:mod:`dpgate.gateway._asks`), so only re-asks that
  need a release climb the schedule.
* Measured (``benchmarks/bench_reask.py --shares``): the first share against the ε of the
  PUMS session, of the paper's workload and of the stop-when-excluded analyst
  (``benchmarks/README.md``, "Honest re-asking").

>>> round(ask_confidence(0.95, 1), 6), round(ask_confidence(0.95, 2), 6)
(0.955, 0.99696)
"""

from __future__ import annotations

import math
from typing import Literal, cast

from dpgate.errors import InvalidArgument, InvalidRequirement

__all__ = ["FIRST_ASK_SHARE", "REASK_MODES", "ReaskMode", "ask_confidence", "ask_delta", "check_reasks"]

#: ``Gateway(reasks=...)``: ``"simultaneous"`` (default) answers the k-th distinct interval of a
#: query at ``1 − δ_k`` (all its intervals hold together at ``1 − δ``); ``"independent"`` answers
#: every ask at ``1 − δ`` (each interval holds on its own; stopping on what you see under-covers).
REASK_MODES = ("simultaneous", "independent")
ReaskMode = Literal["simultaneous", "independent"]

#: The share of δ the first ask of a query is answered at (read at each call: the benchmark varies it).
FIRST_ASK_SHARE = 0.9


def check_reasks(mode: object) -> ReaskMode:
    """``mode`` if it names a re-ask mode.

    Raises:
        InvalidRequirement: it does not (the message lists the accepted values).
    """
    if not isinstance(mode, str) or mode not in REASK_MODES:
        raise InvalidRequirement(
            f"reasks must be one of {list(REASK_MODES)}, got {mode!r}: 'simultaneous' (default) keeps every "
            "interval of a re-asked query valid together, 'independent' states each at the confidence alone."
        )
    return cast(ReaskMode, mode)


def ask_delta(delta: float, k: int) -> float:
    """``δ_k``: the miss probability the ``k``-th distinct interval of a query is computed at.

    ``Σ_{k≥1} δ_k = δ`` and ``δ_k`` decreases with ``k`` (module docstring).

    >>> round(ask_delta(0.05, 1), 12), round(ask_delta(0.05, 3), 8)
    (0.045, 0.00075991)
    """
    if k < 1:
        raise InvalidArgument(f"asks are numbered from 1, got {k}; pass k ≥ 1.")
    if k == 1:
        return FIRST_ASK_SHARE * delta
    return (1.0 - FIRST_ASK_SHARE) * 6.0 / math.pi**2 * delta / (k - 1) ** 2


def ask_confidence(confidence: float, k: int) -> float:
    """``1 − δ_k`` for a stated ``confidence = 1 − δ`` (:func:`ask_delta`).

    Raises:
        InvalidRequirement: ``1 − δ_k`` rounds to 1 (a query re-asked so often, at so high a
            confidence, that no finite interval could be stated).
    """
    out = 1.0 - ask_delta(1.0 - confidence, k)
    if out >= 1.0:
        raise InvalidRequirement(
            f"this query's {k}-th distinct interval at confidence {confidence} would need a confidence that "
            "rounds to 1; ask it at a lower confidence, or open the gateway with reasks='independent'."
        )
    return out
