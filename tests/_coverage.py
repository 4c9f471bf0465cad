"""The coverage check the statistical tests share: intervals hold the truth at least as often as
stated, up to three standard errors of the measured share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["assert_covers"]


def assert_covers(hits: Mapping[str, Sequence[bool]], confidence: float, *, at_least: int = 1) -> None:
    """For each kind of answer (``hits[kind]``: whether each interval held the truth), the share
    covered is ≥ ``confidence − 3·SE`` with ``SE = √(confidence·(1 − confidence)/n)``; kinds with
    fewer than ``at_least`` answers are not checked (too few to say anything)."""
    for kind, got in hits.items():
        n = len(got)
        if n < at_least:
            continue
        se = math.sqrt(confidence * (1 - confidence) / n)
        assert sum(got) / n >= confidence - 3 * se, (kind, sum(got) / n, n)
