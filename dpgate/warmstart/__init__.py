"""Warm starts: spend ε once, up front, on a designed release that later queries reuse.

- :mod:`~dpgate.warmstart.design` — the identity, hierarchical and ISPE designs, and MMSE estimates;
- :mod:`~dpgate.warmstart._ispe` — ISPE's smoothing, region growing and neighbourhood reference.
"""

from dpgate.warmstart.design import (
    MAX_IDENTITY_CELLS,
    STRATEGIES,
    WarmStart,
    mmse_estimate,
    mmse_values,
    warm_start,
)

__all__ = ["STRATEGIES", "MAX_IDENTITY_CELLS", "WarmStart", "warm_start", "mmse_estimate", "mmse_values"]
