"""Noise: exact discrete Laplace noise on a rational lattice.

Why one module of about 500 lines: half of it is the privacy statement each
mechanism carries in its docstring; the samplers and their checks belong together.

Every fresh measurement dpgate releases goes through :func:`release`.  The
answer of a linear counting query whose weights are rationals with common
denominator ``d`` is ``true_numerator / d`` with an exact integer numerator, so
dpgate never adds noise to a float.  Instead it picks a lattice
``γ = 1 / (d · 2^k)`` fine enough for the requested Laplace scale ``b``
(:func:`lattice_for`), adds ``Z · γ`` with ``Z`` an exact two-sided geometric
(discrete Laplace) integer of parameter ``t = b / γ``, and converts the exact
rational result to a float only at the very end.  The final conversion is
post-processing of an exactly distributed value, so the floating-point attacks
on textbook Laplace samplers (Mironov 2012) do not apply.

Privacy: under add/remove-one-row neighbours a query of L1 sensitivity ``S``
(in answer units) changes the integer ``true_numerator · 2^k`` by at most
``S / γ``; discrete Laplace noise of parameter ``t`` then gives pure
``(S/γ)/t = S/b = α``-DP (Ghosh, Roughgarden & Sundararajan 2009; Canonne,
Kamath & Steinke 2020).

Accuracy modelling: with ``Z = G1 − G2``, ``G_i = ⌊X_i⌋`` and ``X_i`` i.i.d.
exponential with mean ``t``, the continuous variable ``L = γ (X1 − X2)`` is
Laplace(``b``) and ``|Z γ − L| < γ ≤ b / 1024`` (unless ``k`` hit its cap, see
:func:`lattice_for`).  The inference uses this coupling to certify intervals
computed with the continuous Laplace law.

Sources:

* :class:`SecureNoise` (the default) calls OpenDP's vetted exact discrete
  Laplace sampler (``opendp.measurements.make_laplace`` over ``i64``), which
  draws its randomness from a CSPRNG inside OpenDP.  It never touches numpy's
  or Python's ``random`` generators.
* :class:`SeededNoise` uses a seeded numpy ``Generator``: reproducible, for
  tests and benchmarks only, insecure, and flagged ``secure=False``.

Example:
    >>> rel = release(42, 1, sensitivity=1.0, alpha=0.5, source=SeededNoise(0))
    >>> rel.scale, rel.lattice, rel.secure
    (2.0, 0.001953125, False)
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
import operator
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpgate._validate import positive_finite
from dpgate.errors import DPGateInternalError, InvalidRequirement

__all__ = [
    "LATTICE_FACTOR",
    "MAX_LATTICE_EXPONENT",
    "NoiseSource",
    "NoisyRelease",
    "SecureNoise",
    "SeededNoise",
    "lattice_for",
    "noise_source",
    "release_many",
    "release",
]

LATTICE_FACTOR = 1024
"""The lattice step is at most ``scale / LATTICE_FACTOR`` (unless capped)."""

MAX_LATTICE_EXPONENT = 60
"""Cap on ``k`` in ``γ = 1 / (d · 2^k)``.

Only reached when ``scale · d < 1024 / 2^60 ≈ 9e-16``, i.e. when the noise is
negligible next to the answer's own granularity ``1/d``.  Privacy is still exact
(the discrete Laplace parameter ``t = scale/γ`` is simply below 1024); only the
coupling bound ``|Zγ − L| < γ`` is then larger relative to ``scale``.
"""

# OpenDP samples into i64 and *saturates* silently at ±(2^63 − 1).  For
# t ≤ 2^56, P(|Z| ≥ 2^63) = exp(−2^63/t)·(…) ≤ e^−128: never in practice.
# Larger t is decomposed exactly (see SecureNoise._draw_large).
_OPENDP_MAX_T = 2.0**56


# ----------------------------------------------------------------------------- sources


class NoiseSource(abc.ABC):
    """A source of two-sided geometric (discrete Laplace) integers.

    Attributes:
        secure: whether the randomness is cryptographically secure.  Insecure
            sources must be recorded as such in the ledger.
    """

    secure: bool

    @abc.abstractmethod
    def discrete_laplace(self, t: float) -> int:
        """Draw one integer ``Z`` with ``P(Z = z) ∝ exp(−|z| / t)``.

        Args:
            t: the parameter (scale) of the law, finite and > 0.

        Returns:
            A Python ``int`` (unbounded).
        """

    def discrete_laplace_many(self, t: float, n: int) -> list[int]:
        """Draw ``n`` i.i.d. integers with the law of :meth:`discrete_laplace`.

        Args:
            t: the parameter of the law, finite and > 0.
            n: how many draws, ≥ 0.

        Returns:
            A list of ``n`` Python ints.
        """
        _check_t(t)
        return [self.discrete_laplace(t) for _ in range(_check_count(n))]


class SecureNoise(NoiseSource):
    """Exact discrete Laplace noise from OpenDP's sampler and CSPRNG (the default).

    Uses ``opendp.measurements.make_laplace(atom_domain(T="i64"),
    absolute_distance(T="i64"), scale=t)`` applied to 0, which samples the
    discrete Laplace law exactly (Canonne, Kamath & Steinke 2020, Algorithm 2,
    with the float ``t`` converted exactly to a rational) from OpenDP's
    cryptographically secure generator.  Measurements are built once per
    ``t`` and cached.

    For ``t > 2^56`` (where OpenDP's ``i64`` output could saturate) the draw is
    decomposed exactly as ``Z = m·W + R1 − R2`` with ``m = 2^j``: ``W`` is
    OpenDP's discrete Laplace of parameter ``t/m`` and ``R_i`` are independent
    geometrics truncated to ``{0, …, m−1}``, sampled exactly by rejection with
    rational Bernoulli(exp(−x)) trials driven by :mod:`secrets`.  This is the
    identity ``G = m·⌊G/m⌋ + (G mod m)`` for a geometric ``G``, whose two parts
    are independent.

    Importing OpenDP (slow: benchmarks/README.md) is deferred to the first draw and calls
    ``opendp.prelude.enable_features("contrib")``, which is process-global.
    """

    secure = True

    def discrete_laplace(self, t: float) -> int:
        """Draw one exact discrete Laplace integer of parameter ``t``.

        Args:
            t: the parameter, finite and > 0.

        Returns:
            ``Z`` with ``P(Z = z) ∝ exp(−|z| / t)``.
        """
        t = _check_t(t)
        if t > _OPENDP_MAX_T:
            return self._draw_large(t)
        return int(_opendp_scalar(t)(0))

    def discrete_laplace_many(self, t: float, n: int) -> list[int]:
        """Draw ``n`` i.i.d. exact discrete Laplace integers with one OpenDP call.

        Args:
            t: the parameter, finite and > 0.
            n: how many draws, ≥ 0.

        Returns:
            A list of ``n`` Python ints.
        """
        t = _check_t(t)
        n = _check_count(n)
        if n == 0:
            return []
        if t > _OPENDP_MAX_T:
            return [self._draw_large(t) for _ in range(n)]
        return [int(z) for z in _opendp_vector(t)([0] * n)]

    def _draw_large(self, t: float) -> int:
        m = 1
        while t / m > _OPENDP_MAX_T:
            m *= 2
        # t / m is exact: m is a power of two and t/m stays far from subnormal.
        w = self.discrete_laplace(t / m)
        tau = Fraction(t)
        return m * w + _truncated_geometric(m, tau) - _truncated_geometric(m, tau)


class SeededNoise(NoiseSource):
    """Reproducible discrete Laplace noise from a seeded numpy Generator.

    FOR TESTS AND BENCHMARKS ONLY — INSECURE.  numpy's PCG64 is not a
    cryptographic generator and the draw goes through floating point:
    ``Z = ⌊X1⌋ − ⌊X2⌋`` with ``X_i`` exponential of mean ``t`` (a difference
    of two geometrics).  Anyone who knows the seed knows the noise.  Releases
    made with it carry ``secure=False`` and the ledger records them as insecure.

    Args:
        seed: the seed of ``numpy.random.default_rng``.
    """

    secure = False

    def __init__(self, seed: int) -> None:
        self.seed = operator.index(seed)
        self._rng = np.random.default_rng(self.seed)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SeededNoise(seed={self.seed})"

    def discrete_laplace(self, t: float) -> int:
        """Draw one two-sided geometric integer of parameter ``t`` (insecure).

        Args:
            t: the parameter, finite and > 0.

        Returns:
            ``Z = ⌊X1⌋ − ⌊X2⌋``, ``X_i`` exponential with mean ``t``.
        """
        t = _check_t(t)
        with self._lock:
            x1, x2 = self._rng.exponential(t, size=2)
        return math.floor(x1) - math.floor(x2)

    def discrete_laplace_many(self, t: float, n: int) -> list[int]:
        """Draw ``n`` two-sided geometric integers of parameter ``t`` (insecure).

        Args:
            t: the parameter, finite and > 0.
            n: how many draws, ≥ 0.

        Returns:
            A list of ``n`` Python ints.
        """
        t = _check_t(t)
        n = _check_count(n)
        with self._lock:  # pairs in draw order: the same integers as n calls of discrete_laplace
            x = np.floor(self._rng.exponential(t, size=(n, 2))).T
        if t < 2.0**50:
            return (x[0].astype(np.int64) - x[1].astype(np.int64)).tolist()
        return [int(a) - int(b) for a, b in zip(x[0].tolist(), x[1].tolist(), strict=True)]


def noise_source(seed: int | None) -> NoiseSource:
    """The noise source for a gateway: secure by default, seeded only on request.

    Args:
        seed: ``None`` for :class:`SecureNoise`; an int for :class:`SeededNoise`
            (insecure, tests and benchmarks only).

    Returns:
        The noise source.

    Example:
        >>> noise_source(None).secure, noise_source(7).secure
        (True, False)
    """
    if seed is None:
        return SecureNoise()
    if isinstance(seed, bool):
        raise InvalidRequirement(f"seed must be an int or None, not {seed!r}.")
    try:
        return SeededNoise(operator.index(seed))
    except TypeError:
        raise InvalidRequirement(f"seed must be an int or None, not {seed!r}.") from None


# ----------------------------------------------------------------------------- lattice


def lattice_for(scale: float, denominator: int) -> tuple[float, int]:
    """The noise lattice for a Laplace scale and an answer denominator.

    Returns ``γ = 1 / (denominator · 2^k)`` for the smallest ``k ≥ 0`` with
    ``γ ≤ scale / 1024``, with ``k`` capped at :data:`MAX_LATTICE_EXPONENT`
    (60).  The comparison is exact (integer arithmetic on the float's dyadic
    value), and O(1).  Every answer
    ``n / denominator`` lies on the lattice, so its lattice sensitivity is
    exactly ``S / γ``.

    Args:
        scale: the Laplace scale ``b = S / α``, finite and > 0.
        denominator: the common denominator of the query weights, an int ≥ 1.

    Returns:
        ``(γ, 2^k)``: the lattice step as a float (rounded if ``denominator``
        is not a power of two; use ``1 / (denominator · 2^k)`` for the exact
        value) and the exact multiplier ``2^k``.

    Raises:
        InvalidRequirement: if ``scale`` or ``denominator`` is out of range.

    Example:
        >>> lattice_for(2048.0, 1)
        (1.0, 1)
        >>> lattice_for(1.0, 1)
        (0.0009765625, 1024)
        >>> lattice_for(1.0, 3)
        (0.0006510416666666666, 512)
    """
    scale = positive_finite(scale, "scale", error=InvalidRequirement)
    denominator = _check_denominator(denominator)
    mult = 1 << _lattice_exponent(scale, denominator)
    return 1 / (denominator * mult), mult


def _lattice_exponent(scale: float, denominator: int) -> int:
    """The smallest ``k`` in ``[0, MAX_LATTICE_EXPONENT]`` with ``denominator · 2^k · scale ≥ 1024``.

    ``scale = p / q`` exactly, q a power of two, so the test is ``N 2^k ≥ M`` for the
    integers ``N = p · denominator`` and ``M = 1024 q``; their bit lengths give k
    up to one, and one shifted comparison settles it.
    """
    p, q = scale.as_integer_ratio()
    n, m = p * denominator, LATTICE_FACTOR * q
    k = m.bit_length() - n.bit_length()  # n·2^k and m have equal bit lengths
    if k >= 0:
        if (n << k) < m:
            k += 1
    elif n < (m << -k):
        k += 1
    return min(max(k, 0), MAX_LATTICE_EXPONENT)


# ----------------------------------------------------------------------------- release


@dataclass(frozen=True)
class NoisyRelease:
    """One noisy answer, as released.

    Attributes:
        value: the noisy answer (float conversion of an exact rational).
        scale: the Laplace scale ``b = S / α`` of the noise.
        lattice: the lattice step ``γ``; the noise is ``Z · γ``, ``Z`` discrete
            Laplace of parameter ``b / γ``, and ``|Zγ − L| < γ`` for a coupled
            Laplace(``b``) variable ``L``.
        secure: whether the noise came from a cryptographically secure source.
    """

    value: float
    scale: float
    lattice: float
    secure: bool

    def __post_init__(self) -> None:
        if math.isfinite(self.value) and math.isfinite(self.scale) and math.isfinite(self.lattice):
            return
        for name in ("value", "scale", "lattice"):
            if not math.isfinite(getattr(self, name)):
                raise DPGateInternalError(f"NoisyRelease.{name} is {getattr(self, name)!r}")


def release(
    true_numerator: int,
    denominator: int,
    sensitivity: float,
    alpha: float,
    source: NoiseSource,
) -> NoisyRelease:
    """Release ``true_numerator / denominator`` with exact discrete Laplace noise.

    Privacy guarantee (the caller charges it):

    * Neighbouring relation: datasets differing by adding or removing one row
      (unbounded DP, one row per individual).
    * Sensitivity: ``sensitivity`` = ``S``, the largest change of the true
      answer (in answer units) when one row is added or removed; on the lattice
      the integer ``true_numerator · 2^k`` moves by at most ``S / γ``.
    * Noise law and scale: ``Z · γ`` with ``γ, 2^k = lattice_for(b, denominator)``,
      ``b = S / α`` and ``Z`` discrete Laplace of parameter ``t = b / γ``
      (``t`` is ``S·d·2^k/α`` rounded *up* to a float, so the realised privacy
      loss never exceeds ``α``, even by one ulp).
    * Cost: the release is ``α = S / b``-DP.  This function charges nothing
      itself: the gateway must commit ``α`` to the ledger before the value
      leaves it.

    Args:
        true_numerator: the exact integer numerator of the true answer.
        denominator: the common denominator of the query weights, int ≥ 1.
        sensitivity: ``S`` > 0, finite.
        alpha: the privacy parameter ``α`` > 0, finite.
        source: where the integer noise comes from.

    Returns:
        The :class:`NoisyRelease`; ``value`` is the exact rational
        ``(true_numerator · 2^k + Z) / (denominator · 2^k)`` rounded to the
        nearest float.

    Raises:
        InvalidRequirement: if an argument is out of range.

    Example:
        >>> r = release(7, 2, sensitivity=0.5, alpha=1.0, source=SeededNoise(1))
        >>> r.scale, r.lattice
        (0.5, 0.00048828125)
    """
    ((true_numerator, denominator, mult, t, scale, gamma),) = _release_params(
        [(true_numerator, denominator, sensitivity, alpha)], source
    )
    z = source.discrete_laplace(t)
    return _released(true_numerator, denominator, mult, z, scale, gamma, source)


def release_many(
    items: Sequence[tuple[int, int, float, float]],
    source: NoiseSource,
) -> list[NoisyRelease]:
    """:func:`release` for many ``(true_numerator, denominator, sensitivity, alpha)`` at once.

    Each item gets exactly the noise law, lattice and value :func:`release` gives it (same
    guarantee, same checks); consecutive items sharing the discrete Laplace parameter ``t`` (a
    GROUP BY's groups) draw their integers in one :meth:`NoiseSource.discrete_laplace_many`
    call, which samples the same law i.i.d. from the same source — one OpenDP call instead of
    one per item.  A :class:`SeededNoise` gives the very values of one :func:`release` per item.

    Args:
        items: the releases' arguments, as for :func:`release`.
        source: where the integer noise comes from.

    Returns:
        The releases, in the order of ``items``.

    Raises:
        InvalidRequirement: if an argument is out of range (before any draw).
    """
    params = _release_params(items, source)
    zs: list[int] = []
    for t, run in itertools.groupby(p[3] for p in params):  # runs in order: a seeded source draws as release() would
        zs += source.discrete_laplace_many(t, len(list(run)))
    return [_released(num, den, mult, z, scale, gamma, source)
            for (num, den, mult, _, scale, gamma), z in zip(params, zs, strict=True)]


def _release_params(
    items: Sequence[tuple[int, int, float, float]], source: NoiseSource
) -> list[tuple[int, int, int, float, float, float]]:
    """Check :func:`release`'s arguments; ``(numerator, denominator, 2^k, t, b, γ)`` per item."""
    if not isinstance(source, NoiseSource):
        raise InvalidRequirement(f"source must be a NoiseSource, not {source!r}.")
    # Items with the same denominator, sensitivity and α (of the same types: True is refused
    # where 1 is not) share the checks and the law; only arguments that passed them are kept.
    laws: dict[tuple[Any, ...], tuple[int, int, float, float, float]] = {}
    out = []
    for true_numerator, denominator, sensitivity, alpha in items:
        if type(true_numerator) is not int:
            true_numerator = _check_numerator(true_numerator)
        key = (type(denominator), denominator, type(sensitivity), sensitivity, type(alpha), alpha)
        law = laws.get(key)
        if law is None:
            law = laws[key] = _one_release_law(denominator, sensitivity, alpha)
        out.append((true_numerator, *law))
    return out


def _check_numerator(true_numerator: int) -> int:
    if isinstance(true_numerator, bool):
        raise InvalidRequirement("true_numerator must be an int, not a bool.")
    try:
        return operator.index(true_numerator)
    except TypeError:
        raise InvalidRequirement(
            f"true_numerator must be an exact integer, not {true_numerator!r}."
        ) from None


def _one_release_law(denominator: int, sensitivity: float, alpha: float) -> tuple[int, int, float, float, float]:
    """Check :func:`release`'s other arguments: ``(denominator, 2^k, t, b, γ)``."""
    denominator = _check_denominator(denominator)
    sensitivity = positive_finite(sensitivity, "sensitivity", error=InvalidRequirement)
    alpha = positive_finite(alpha, "alpha", error=InvalidRequirement)
    return (denominator, *_release_law(denominator, sensitivity, alpha))


@functools.lru_cache(maxsize=1024)
def _release_law(denominator: int, sensitivity: float, alpha: float) -> tuple[int, float, float, float]:
    """``(2^k, t, b, γ)`` for checked arguments: a pure function, memoised (a GROUP BY's
    groups share it)."""
    scale = sensitivity / alpha
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidRequirement(
            f"The noise scale sensitivity/alpha = {sensitivity!r}/{alpha!r} is not a "
            "positive finite float; use a less extreme alpha."
        )
    gamma, mult = lattice_for(scale, denominator)
    # One row moves the integer numerator by a whole number ≤ S·d.  A gateway's S is
    # max|num|/d rounded to a float, possibly just below it: an S·d within 2^-50 below an
    # integer n is taken as n.  t from the exact value over α (not the rounded b): the
    # realised ε = (S·d)·2^k / t ≤ α exactly.
    steps = Fraction(sensitivity) * denominator
    nearest = math.ceil(steps)
    if nearest - steps <= steps / 2**50:
        steps = Fraction(nearest)
    t = _ceil_to_float(steps * mult / Fraction(alpha))
    return mult, t, scale, gamma


def _released(
    true_numerator: int, denominator: int, mult: int, z: int, scale: float, gamma: float, source: NoiseSource
) -> NoisyRelease:
    if not isinstance(z, int):
        raise DPGateInternalError(f"noise source {source!r} returned {z!r}, not an int")
    value = (true_numerator * mult + z) / (denominator * mult)  # int/int: correctly rounded
    return NoisyRelease(value=value, scale=scale, lattice=gamma, secure=bool(source.secure))


# ----------------------------------------------------------------------------- helpers


_opendp_lock = threading.Lock()
_opendp_module: Any = None


def _opendp() -> Any:
    """Import ``opendp.prelude`` once and enable its ``contrib`` features."""
    global _opendp_module
    with _opendp_lock:
        if _opendp_module is None:
            import opendp.prelude as dp

            dp.enable_features("contrib")
            _opendp_module = dp
        return _opendp_module


@functools.lru_cache(maxsize=1024)
def _opendp_scalar(t: float) -> Any:
    dp = _opendp()
    return dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=t)


@functools.lru_cache(maxsize=64)
def _opendp_vector(t: float) -> Any:
    dp = _opendp()
    return dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"), scale=t
    )


def _bernoulli(p: Fraction) -> bool:
    """Exact Bernoulli(p) for a rational p in [0, 1], from :mod:`secrets`."""
    return secrets.randbelow(p.denominator) < p.numerator


def _bernoulli_exp(x: Fraction) -> bool:
    """Exact Bernoulli(exp(−x)) for rational x ≥ 0 (Canonne, Kamath & Steinke 2020, Alg. 1)."""
    while x > 1:
        if not _bernoulli_exp(Fraction(1)):
            return False
        x -= 1
    k = 1
    while _bernoulli(x / k):
        k += 1
    return k % 2 == 1


def _truncated_geometric(m: int, tau: Fraction) -> int:
    """Exact draw of R on {0, …, m−1} with P(R = r) ∝ exp(−r/τ), by rejection."""
    while True:
        r = secrets.randbelow(m)
        if _bernoulli_exp(Fraction(r) / tau):
            return r


def _ceil_to_float(x: Fraction) -> float:
    """The smallest float ≥ x (x positive and below the float range)."""
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _check_t(t: float) -> float:
    return positive_finite(t, "The noise parameter t", error=InvalidRequirement)


def _check_count(n: int) -> int:
    n = operator.index(n)
    if n < 0:
        raise InvalidRequirement(f"The number of draws must be ≥ 0, not {n}.")
    return n


def _check_denominator(denominator: int) -> int:
    if isinstance(denominator, bool):
        raise InvalidRequirement("denominator must be an int ≥ 1, not a bool.")
    try:
        d = operator.index(denominator)
    except TypeError:
        raise InvalidRequirement(f"denominator must be an int ≥ 1, not {denominator!r}.") from None
    if d < 1:
        raise InvalidRequirement(f"denominator must be an int ≥ 1, but it is {d}.")
    return d
