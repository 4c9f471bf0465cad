"""Exact discrete Gaussian noise on the Laplace releases' lattice: a zCDP gateway's release step.

A gateway opened with ``privacy="zcdp"`` releases every measurement through
:func:`release_gaussian_many` (the ledger records ``noise = "discrete_gaussian"``,
:data:`GAUSSIAN_NOISE`); its inference models the noise as normal of deviation ``σ``
(``dpgate.inference.ErrorLaw(..., gaussian=...)``), widened by the coupling below.

Release.  The answer ``n / d`` of a linear counting query lies on the lattice ``γ = 1/(d·2^k)`` of
:func:`dpgate.release.noise.lattice_for` (now for the deviation ``σ = S/α``); the release adds
``Z·γ`` with ``Z`` the discrete Gaussian ``P(Z = z) ∝ exp(−z²/(2s²))`` of parameter
``s = σ/γ`` (rounded *up* to a float, exactly as the Laplace parameter ``t`` is), and converts the
exact rational to a float only at the end.

Privacy.  On the lattice the query moves by at most ``Δ = S/γ``; the discrete Gaussian is then
``Δ²/(2s²) ≤ S²/(2σ²) = α²/2``-zCDP (Canonne, Kamath & Steinke, "The Discrete Gaussian for
Differential Privacy", 2020, Theorem 4), and a row in cell ``j`` moves it by ``|h_j|/γ``, costing
``(α|h_j|/S)²/2`` — the per-cell ρ of :mod:`dpgate.plan.accounting` (``zcdp=True``).

Coupling.  With ``X ~ N(0, s²)`` and ``Z = F⁻¹(Φ(X/s))`` (``F`` the discrete Gaussian's CDF), ``Z``
has the discrete law and ``|Z − X| < 1`` (one lattice step ``γ`` after scaling) whenever
``Φ(z/s) ≤ F(z) < Φ((z+1)/s)`` for every integer ``z`` (:func:`quantile_coupling_holds` checks
it numerically; the tests run it for the parameters ``s ∈ [1024, 2048)`` the lattice rule gives and
beyond).  Intervals computed with the continuous normal law and widened by ``Σ|c_k|γ_k`` then keep
their coverage, as for Laplace.

Sources: :class:`~dpgate.release.noise.SecureNoise` calls OpenDP's exact sampler
(``opendp.measurements.make_gaussian`` over ``i64``, CSPRNG inside OpenDP);
:class:`~dpgate.release.noise.SeededNoise` runs Canonne, Kamath & Steinke's Algorithm 3 with its
numpy generator and floating point — reproducible, for tests only, **insecure**, ``secure=False``.

Example:
    >>> from dpgate.release.noise import SeededNoise
    >>> rel = release_gaussian_many([(42, 1, 1.0, 0.5)], SeededNoise(0))[0]
    >>> rel.scale, rel.lattice, rel.secure
    (2.0, 0.001953125, False)
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgate.errors import InvalidRequirement
from dpgate.release.noise import (
    _OPENDP_MAX_T,
    NoiseSource,
    NoisyRelease,
    SecureNoise,
    SeededNoise,
    _opendp,
    _release_params,
    _released,
)

__all__ = ["GAUSSIAN_NOISE", "discrete_gaussian_many", "release_gaussian_many", "quantile_coupling_holds"]

GAUSSIAN_NOISE = "discrete_gaussian"
"""The ledger's ``noise`` of a Gaussian release (a Laplace one's is ``"discrete_laplace"``)."""


def discrete_gaussian_many(source: NoiseSource, s: float, n: int) -> list[int]:
    """``n`` i.i.d. integers ``Z`` with ``P(Z = z) ∝ exp(−z²/(2s²))`` from ``source``.

    Raises:
        InvalidRequirement: ``s`` is not positive and finite (or too large for OpenDP's i64), ``n < 0``,
            or ``source`` is neither dpgate's secure nor its seeded source.
    """
    if not (isinstance(s, float) and math.isfinite(s) and s > 0.0):
        raise InvalidRequirement(f"the discrete Gaussian parameter must be a finite float > 0, got {s!r}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidRequirement(f"the number of draws must be an int ≥ 0, got {n!r}.")
    if n == 0:
        return []
    if isinstance(source, SecureNoise):
        if s > _OPENDP_MAX_T / 64:  # |Z| ≥ 2^63 has probability < exp(−2^11): i64 never saturates
            raise InvalidRequirement(f"the discrete Gaussian parameter {s!r} is too large for exact i64 sampling.")
        return [int(z) for z in _opendp_gaussian(s)([0] * n)]
    if isinstance(source, SeededNoise):
        with source._lock:
            return [_seeded_one(source._rng, s) for _ in range(n)]
    raise InvalidRequirement(f"source must be dpgate's SecureNoise or SeededNoise, not {source!r}.")


@functools.lru_cache(maxsize=64)
def _opendp_gaussian(s: float) -> Any:
    dp = _opendp()
    return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=s)


def _seeded_one(rng: np.random.Generator, s: float) -> int:
    """Canonne, Kamath & Steinke (2020), Algorithm 3, in floating point (insecure): a discrete Laplace
    proposal of parameter ``t = ⌊s⌋ + 1`` accepted with probability ``exp(−(|Y| − s²/t)²/(2s²))``."""
    t = math.floor(s) + 1
    while True:
        x1, x2 = rng.exponential(t, size=2)
        y = math.floor(x1) - math.floor(x2)
        if rng.random() < math.exp(-((abs(y) - s * s / t) ** 2) / (2 * s * s)):
            return y


def release_gaussian_many(items: Sequence[tuple[int, int, float, float]], source: NoiseSource) -> list[NoisyRelease]:
    """Gaussian releases of ``(true_numerator, denominator, sensitivity, α)``: ``σ = S/α`` (``scale``),
    the lattice of :func:`~dpgate.release.noise.lattice_for` for ``σ``, ``Z`` discrete Gaussian of
    parameter ``s = σ/γ`` (rounded up), so each is ``α²/2``-zCDP for its query (module docstring).
    Charges nothing itself: the ρ must be committed to the ledger before a value leaves.

    Raises:
        InvalidRequirement: an argument is out of range (before any draw).
    """
    params = _release_params(items, source)  # the same checks, lattice and parameter as the Laplace releases
    zs: list[int] = []
    for s, run in itertools.groupby(p[3] for p in params):  # a GROUP BY's groups: one call per parameter
        zs += discrete_gaussian_many(source, s, len(list(run)))
    return [_released(num, den, mult, z, scale, gamma, source)
            for (num, den, mult, _, scale, gamma), z in zip(params, zs, strict=True)]


def quantile_coupling_holds(s: float, *, span: float = 30.0) -> bool:
    """Whether ``Φ(z/s) ≤ F(z) < Φ((z+1)/s)`` for every integer ``|z| ≤ span·s`` (beyond, both
    tails hold less than ``10⁻¹⁹⁰``), ``F`` the CDF of the discrete Gaussian of parameter ``s``:
    then the quantile coupling moves no draw by a whole lattice step (module docstring).

    Computed in the lower half (``z ≤ −1``, cumulated from the far tail, accurate relatively);
    the upper half follows by symmetry (``F(z) = 1 − F(−z−1)``), and ``z = 0`` is checked directly.
    """
    from scipy.stats import norm

    # Cumulated from 2s further out, so that the mass left out (< e^-60 of the tail checked) is negligible.
    z = np.arange(-math.ceil((span + 2) * s), 0, dtype=float)
    log_p = -(z**2) / (2 * s * s)
    total = 2 * np.exp(log_p).sum() + 1.0  # the mass of z ≤ −1, z ≥ 1 and z = 0 (unnormalised)
    cdf = np.cumsum(np.exp(log_p)) / total
    lower, upper = norm.cdf(z / s), norm.cdf((z + 1) / s)
    checked = z >= -span * s
    low_half = bool(np.all(((lower < cdf) & (cdf < upper))[checked]))
    at_zero = 0.5 <= (cdf[-1] + 1.0 / total) < norm.cdf(1 / s)
    return low_half and at_zero
