"""The scale of the planner's "separate atom counts" candidate (:func:`dpgate.plan.decide.plan`).

Moved out of :mod:`dpgate.plan.decide` (at its size limit) unchanged.  Pure planning: it reads
the history's design (vectors and scales), never a released value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.inference import IncrementalBLUE
from dpgate.plan.plan import meets
from dpgate.plan.state import TableState
from dpgate.release.noise import lattice_for

__all__ = ["common_scale"]


def common_scale(
    state: TableState,
    blue: IncrementalBLUE,
    h: np.ndarray,
    atom_qs: Sequence[LinearQuery],
    accuracy: float,
    confidence: float,
    start: float,
    max_scale: float,
) -> float | None:
    """Largest common scale b (at most ``max_scale``) at which separate atom counts let the BLUE
    of ``h`` meet the target."""
    rows = [state.atoms.vector(aq) for aq in atom_qs]
    gaussian = state.costs.zcdp  # a zCDP gateway releases Gaussian noise

    def enough(b: float) -> bool:
        trial = blue.copy()
        for r in rows:
            trial.append(r, b, 0.0, lattice=lattice_for(b, 1)[0], gaussian=gaussian)
        est = trial.estimate(h)
        return meets(est.halfwidth(confidence), accuracy)

    lo = hi = start
    if enough(start):
        for _ in range(30):
            if hi >= max_scale:
                return max_scale
            hi = min(hi * 2.0, max_scale)
            if not enough(hi):
                break
            lo = hi
        else:
            return hi
    else:
        for _ in range(60):
            lo /= 2.0
            if enough(lo):
                break
        else:
            return None
    for _ in range(12):  # ~1.7e-4 relative precision in log space
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if enough(mid) else (lo, mid)
    return lo
