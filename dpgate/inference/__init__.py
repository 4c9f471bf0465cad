"""Stage "infer": what the released history says about a new linear query.

Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012),
§3–§5: the best linear unbiased estimator (BLUE) of ``θ = Q·x`` from
noisy answers ``y = Hx + N``, the exact law of its error ``E = Σ A_k N_k``
(Gil-Pelaez inversion; the paper's Monte Carlo and discrete convolution as
cross-checks), the posterior of θ with certified credible intervals, the
per-cell privacy cost, and an incremental state for the gateway that also
prices a fresh measurement before it is taken.

Bad arguments raise :class:`~dpgate.errors.InvalidArgument`, which is also a
``ValueError`` (scipy.stats' convention for distribution methods).

Example:
    >>> from dpgate.inference import estimate
    >>> est = estimate([[1, 1], [1, -1]], [30.0, 10.0], [1.0, 1.0], [1, 0])
    >>> round(est.value, 6), est.estimable
    (20.0, True)
    >>> lo, hi = est.posterior.interval(0.95)
    >>> bool(lo < 20.0 < hi)
    True
"""

from __future__ import annotations

from dpgate.inference._blue import Estimate, SystemCost, estimate, system_cost
from dpgate.inference._incremental import IncrementalBLUE
from dpgate.inference._law import ErrorLaw, halfwidths
from dpgate.inference._posterior import Posterior
from dpgate.inference._scale import minimal_scale, single_release_scale
from dpgate.inference._support import Support, support_of

__all__ = [
    "estimate",
    "system_cost",
    "Estimate",
    "SystemCost",
    "Posterior",
    "Support",
    "support_of",
    "ErrorLaw",
    "IncrementalBLUE",
    "minimal_scale",
    "single_release_scale",
    "halfwidths",
]
