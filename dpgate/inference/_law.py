"""The law of the estimation error ``E = Σ_k c_k N_k`` of a linear estimator.

Why one module of about 540 lines: one law object whose three methods (exact, Monte Carlo,
convolution) and two noise families answer the same questions (half-width, cdf, ppf, pdf).

Noise model of one released answer ``y_k = h_k·x + N_k`` with Laplace scale
``b_k = S_k/α_k``:

* continuous: ``N_k ~ Laplace(b_k)``;
* discrete (the gateway's secure sampler): ``N_k = γ_k Z_k`` with ``Z_k`` two-sided
  geometric, ``P(z) ∝ exp(−|z| γ_k / b_k)``, on the lattice ``γ_k ℤ`` (``γ_k > 0``).

Writing ``Z = G₁ − G₂`` with ``G_i = ⌊X_i⌋`` and ``X_i`` exponential couples
``N_k`` with a continuous ``L_k ~ Laplace(b_k)`` so that ``|N_k − L_k| < γ_k``
always.  Hence ``|E − Σ c_k L_k| < w = Σ |c_k| γ_k`` and
``P(|E| ≤ q + w) ≥ P(|Σ c_k L_k| ≤ q)``: intervals computed from the
continuous law and widened by ``w`` (:attr:`ErrorLaw.lattice_width`) never
lose coverage.  A single discrete term is treated exactly instead:
``P(|Z| ≤ k) = 1 − 2p^{k+1}/(1 + p)`` with ``p = exp(−γ/b)``.

Guarantees by method (``two_sided_tail``, ``halfwidth`` and ``abs_cdf_bounds``):

Gaussian terms (zCDP releases, ``gaussian=True``): ``scales`` holds their standard
deviation ``σ_k = S_k/α_k``; continuous ``N(0, σ_k²)``, or discrete Gaussian on ``γ_k ℤ``,
which the quantile coupling of :mod:`dpgate.release._gaussian` keeps within ``γ_k`` of
a continuous normal — so the same widening ``w`` covers them.  All Gaussian terms add
up to one normal of variance ``Σ (c_k σ_k)²``: closed form when there is no Laplace
term, otherwise its factor ``exp(−v t²/2)`` enters the Gil-Pelaez inversion.

``"exact"``
    Gil-Pelaez inversion (:mod:`._gilpelaez`), absolute error ≤ 1e-9 on the
    CDF (rigorous truncation bound, quadrature verified against closed forms);
    the error budget and the lattice widening are added, so ``halfwidth`` is a
    certified upper bound on the true quantile of ``|E|``.  Closed forms for
    zero or one term.  Laws with several terms share their inversion through a
    memo (:mod:`._quantile`: negligible terms bounded, scales rounded up to 36
    bits — both rigorous, at most about 1e-10 relative wider), and every law
    keeps its half-widths: it is immutable.  :func:`halfwidths` serves many laws.
``"convolution"``
    Algorithm 2 of Xiao & Xiong (2012) with rigorous bounds (:mod:`._convolution`); its
    ``halfwidth`` is certified but wider by the rounding width.
``"montecarlo"``
    Algorithm 1 of Xiao & Xiong (2012) (samples the true noise, discrete included):
    statistical only; ``abs_cdf_bounds`` is a 99.9 % DKW band.

``cdf``, ``sf``, ``pdf`` and ``ppf`` are central estimates.  For discrete noise
with several terms they describe the continuous law ``Σ c_k L_k``, which is
within ``lattice_width`` of ``E`` on every draw.

Reference: Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import erf, erfinv

from dpgate._validate import finite_array, points, probability, readonly
from dpgate.errors import InvalidArgument
from dpgate.inference._convolution import ConvolutionLaw
from dpgate.inference._gilpelaez import ABS_CDF_ERROR, LaplaceSum, chernoff_halfwidth
from dpgate.inference._quantile import sum_quantile

__all__ = ["ErrorLaw", "Method", "halfwidths"]

Method = Literal["exact", "montecarlo", "convolution"]
METHODS: tuple[str, ...] = ("exact", "montecarlo", "convolution")
_DKW_LEVEL = 1e-3
_CLOSED_FORM_ERROR = 1e-14


class ErrorLaw:
    """Law of ``E = Σ_k c_k N_k`` for independent Laplace or Gaussian (continuous or discrete) noise.

    Args:
        coefficients: The estimator weights ``c_k`` (the vector A), length m.
        scales: Laplace scales ``b_k = S_k/α_k ≥ 0`` (0 only where ``c_k = 0``); for a
            Gaussian term its standard deviation ``σ_k = S_k/α_k``.
        lattice: Lattice steps ``γ_k ≥ 0`` of discrete noise (0 = continuous);
            ``None`` means all continuous.
        method: ``"exact"`` (default), ``"montecarlo"`` or ``"convolution"``.
        samples: Monte Carlo sample size (Xiao & Xiong (2012), Algorithm 1's m_s).
        rng: Seed or ``numpy.random.Generator`` for Monte Carlo.
        gamma: Probability mass Algorithm 2 may lose to truncation.
        step: Grid step of Algorithm 2 (``None``: automatic).
        gaussian: Which terms are Gaussian (``None``: none); Algorithm 2 takes none.

    Raises:
        InvalidArgument: On mismatched lengths, non-finite values, negative scales,
            an unknown method, or Gaussian terms with ``"convolution"``.

    Example:
        >>> law = ErrorLaw([1.0], [2.0])
        >>> round(law.halfwidth(0.95), 6)  # Laplace(2): 2·ln 20
        5.991465
    """

    def __init__(
        self,
        coefficients: ArrayLike,
        scales: ArrayLike,
        lattice: ArrayLike | None = None,
        method: Method = "exact",
        *,
        samples: int = 1_000_000,
        rng: int | np.random.Generator | None = None,
        gamma: float = 0.01,
        step: float | None = None,
        gaussian: ArrayLike | None = None,
    ) -> None:
        c = np.atleast_1d(finite_array(coefficients, "coefficients")).ravel()
        b = np.atleast_1d(finite_array(scales, "scales")).ravel()
        g = np.zeros_like(c) if lattice is None else np.atleast_1d(finite_array(lattice, "lattice")).ravel()
        n = np.zeros(c.size, dtype=bool) if gaussian is None else np.atleast_1d(np.asarray(gaussian, dtype=bool)).ravel()
        if not (c.size == b.size == g.size == n.size):
            raise InvalidArgument(
                f"coefficients, scales, lattice and gaussian must have one entry per term; got lengths "
                f"{c.size}, {b.size}, {g.size} and {n.size}."
            )
        if (b < 0).any() or (g < 0).any():
            raise InvalidArgument("scales and lattice steps must be non-negative.")
        if method not in METHODS:
            raise InvalidArgument(f"method must be one of {METHODS}; got {method!r}.")
        if ((b == 0) & (c != 0)).any():
            raise InvalidArgument("a term with a non-zero coefficient needs a positive scale.")
        self.coefficients = readonly(c)
        self.scales = readonly(b)
        self.lattice = readonly(g)
        self.gaussian = readonly(n)
        self.method: str = method
        a = np.abs(c) * b
        live = np.flatnonzero(a > 0)
        self._live = live[~n[live]]  # the Laplace terms
        self._glive = live[n[live]]  # the Gaussian terms: one normal of variance Σ (c_k σ_k)²
        self._a = a[self._live]
        ga = a[self._glive]
        self._normal_var = float(np.dot(ga, ga))
        if self._glive.size and method == "convolution":
            raise InvalidArgument("method 'convolution' takes Laplace terms only; use 'exact' for Gaussian terms.")
        self.variance: float = 2.0 * float(np.dot(self._a, self._a)) + self._normal_var
        """Variance of the continuous law, ``Σ 2(c_k b_k)² + Σ (c_k σ_k)²`` (lattice-free)."""
        self.lattice_width: float = float(np.dot(np.abs(c), g))
        """Certified bound ``Σ |c_k| γ_k`` on ``|E − Σ c_k L_k|``."""
        self._single_discrete: tuple[float, float] | None = None
        self._sum: LaplaceSum | None = None
        self._conv: ConvolutionLaw | None = None
        self._mc: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
        self._mc_args = (int(samples), rng)
        self._halfwidths: dict[float, float] = {}  # the law is immutable: one search per level
        if method == "exact" and self._glive.size:
            if self._a.size:
                self._sum = LaplaceSum(self._a, self._normal_var)
        elif method == "exact":
            if self._a.size == 1 and g[self._live[0]] > 0:
                k = self._live[0]
                # (lattice step of E, ratio p of the two-sided geometric)
                self._single_discrete = (abs(c[k]) * g[k], math.exp(-g[k] / b[k]))
            elif self._a.size >= 2:
                self._sum = LaplaceSum(self._a)
        elif method == "convolution" and self._a.size:
            probability(gamma, "gamma")
            self._conv = ConvolutionLaw(self._a, gamma, step)
        if method == "montecarlo" and int(samples) < 1:
            raise InvalidArgument(f"samples must be a positive integer; got {samples!r}.")

    # ------------------------------------------------------------------ properties
    @property
    def std(self) -> float:
        """Standard deviation of the continuous law."""
        return math.sqrt(self.variance)

    @property
    def n_terms(self) -> int:
        """Number of terms with a non-zero contribution."""
        return int(self._a.size + self._glive.size)

    @property
    def _normal_only(self) -> bool:
        """Only Gaussian terms: the continuous law is ``N(0, variance)``."""
        return self._a.size == 0 and self._glive.size > 0

    @property
    def error_bound(self) -> float:
        """Absolute error bound of the central ``P(|E| ≤ q)`` (ignoring the lattice)."""
        if self.method == "exact":
            return ABS_CDF_ERROR if self._sum is not None else _CLOSED_FORM_ERROR
        if self.method == "montecarlo":
            return math.sqrt(math.log(2.0 / _DKW_LEVEL) / (2.0 * self._mc_args[0]))
        if self._conv is None:
            return 0.0
        return self._conv.gamma

    def point_mass(self, e: float) -> float:
        """``P(E = e)``: non-zero only for an exact estimate or one exact discrete term."""
        if self.n_terms == 0:
            return 1.0 if e == 0.0 else 0.0
        if self._single_discrete is not None:
            s, p = self._single_discrete
            k = e / s
            if abs(k - round(k)) < 1e-9:
                return (1.0 - p) / (1.0 + p) * p ** abs(round(k))
        return 0.0

    # ------------------------------------------------------------------ engines
    def _samples(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Xiao & Xiong (2012), Algorithm 1: draw the noise of every term and add it up (sorted)."""
        if self._mc is None:
            n, rng = self._mc_args
            gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
            total = np.zeros(n)
            for k in self._live:
                c, b, g = self.coefficients[k], self.scales[k], self.lattice[k]
                if g > 0:  # the true discrete noise γ(G₁ − G₂), G geometric on {0, 1, ...}
                    q = -math.expm1(-g / b)
                    noise = g * (gen.geometric(q, n) - gen.geometric(q, n)).astype(np.float64)
                else:
                    noise = gen.laplace(0.0, b, n)
                total += c * noise
            for k in self._glive:  # the continuous normal: within γ_k of the discrete one (coupling)
                total += self.coefficients[k] * gen.normal(0.0, self.scales[k], n)
            self._mc = (np.sort(total), np.sort(np.abs(total)))
        return self._mc

    def _abs_cdf(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        """Central estimate of ``P(|E| ≤ q)`` (continuous law unless exact-discrete)."""
        q = np.asarray(q, dtype=np.float64)
        if self.method == "montecarlo":
            _, s = self._samples()
            return np.searchsorted(s, q, side="right") / s.size
        if self.n_terms == 0:
            return np.where(q >= 0, 1.0, 0.0)
        if self._normal_only:
            return np.where(q > 0, erf(np.maximum(q, 0.0) / math.sqrt(2.0 * self.variance)), 0.0)
        if self.method == "convolution":
            assert self._conv is not None
            return np.maximum(self._conv.cdf(q) - self._conv.cdf(-q), 0.0)
        if self._single_discrete is not None:
            lat, p = self._single_discrete
            k = np.floor(q / lat + 1e-9)
            with np.errstate(over="ignore"):
                return np.where(k < 0, 0.0, 1.0 - 2.0 * p ** (k + 1.0) / (1.0 + p))
        if self._sum is None:
            return np.where(q > 0, -np.expm1(-np.maximum(q, 0.0) / self._a[0]), 0.0)
        out = np.zeros_like(q)
        pos = q > 0
        out[pos] = self._sum.abs_cdf(q[pos])
        return out

    # ------------------------------------------------------------------ certified
    def abs_cdf_bounds(self, q: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Lower and upper bounds on the true ``P(|E| ≤ q)``, lattice noise included.

        Rigorous for ``"exact"`` and ``"convolution"``; a 99.9 % DKW band for
        ``"montecarlo"``.
        """
        qq, _ = points(q, "q")
        if self.method == "montecarlo":
            eps = self.error_bound
            f = self._abs_cdf(qq)
            return np.clip(f - eps, 0, 1), np.clip(f + eps, 0, 1)
        w = 0.0 if self._single_discrete is not None else self.lattice_width
        if self.method == "convolution" and self._conv is not None:
            lo, _ = self._conv.abs_cdf_bounds(qq - w)
            _, hi = self._conv.abs_cdf_bounds(qq + w)
            return lo, hi
        err = self.error_bound
        lo = np.clip(self._abs_cdf(qq - w) - err, 0.0, 1.0)
        hi = np.clip(self._abs_cdf(qq + w) + err, 0.0, 1.0)
        return lo, hi

    def two_sided_tail(self, q: float) -> float:
        """Upper bound on ``P(|E| > q)`` (certified for exact and convolution).

        Raises:
            InvalidArgument: If q is NaN.
        """
        lo, _ = self.abs_cdf_bounds(q)
        return float(1.0 - lo[0])

    def halfwidth(self, confidence: float) -> float:
        """Smallest q with ``P(|E| ≤ q) ≥ confidence``, certified (see the module docs).

        Args:
            confidence: 1 − δ, in (0, 1).

        Returns:
            The half-width q (0 for an exact estimate, ``inf`` if the method
            cannot certify the level, e.g. convolution with γ ≥ δ).

        Raises:
            InvalidArgument: If confidence is not in (0, 1).
        """
        conf = probability(confidence, "confidence")
        if self.method == "montecarlo":
            _, s = self._samples()
            return float(s[max(math.ceil(conf * s.size) - 1, 0)])
        if self.n_terms == 0:
            return 0.0
        w = self.lattice_width
        if self._normal_only:  # N(0, v): P(|E| ≤ q) = erf(q/√(2v)); nudged up for rounding
            return math.sqrt(2.0 * self.variance) * float(erfinv(conf)) * (1.0 + 1e-12) + w
        if self.method == "convolution":
            assert self._conv is not None
            return float(self._conv.halfwidth(conf) + w)
        if self._single_discrete is not None:
            return self._discrete_quantile(conf)
        a = self._a
        if self._sum is None:
            # Laplace(a): P(|E| > q) = exp(−q/a); nudge up one part in 1e12 for rounding.
            return float(a[0]) * -math.log1p(-conf) * (1.0 + 1e-12) + w
        hw = self._halfwidths.get(conf)
        if hw is None:
            hw = self._halfwidths[conf] = self._sum_halfwidth(conf)
        return hw

    def _sum_halfwidth(self, conf: float) -> float:
        """Certified half-width of two or more terms (Gil-Pelaez, memoised by law)."""
        a, w, v = self._a, self.lattice_width, self._normal_var
        if 1.0 - conf <= 100.0 * ABS_CDF_ERROR:
            return float(chernoff_halfwidth(a, 1.0 - conf, v) + w)  # rigorous; wins only for extreme levels
        if v:  # sum_quantile bounds the negligible Laplace terms itself
            return float(min(sum_quantile(a, conf, v), chernoff_halfwidth(a, 1.0 - conf, v)) + w)
        dominant = self._dominant_halfwidth(conf)
        if math.isfinite(dominant):
            return dominant
        return float(min(sum_quantile(a, conf), chernoff_halfwidth(a, 1.0 - conf)) + w)

    def _dominant_halfwidth(self, conf: float) -> float:
        """Certified half-width when one term carries (almost) all the error.

        Floating-point solves leave weights like 1e-17 on other releases; the
        general inversion then needs a huge grid (slow) and, for discrete noise,
        pays a whole lattice step.  Instead:
        ``P(|E| > q₁ + r) ≤ P(|E_dom| > q₁) + Σ_k P(|c_k L_k| > r_k)`` with q₁ the
        exact quantile of the dominant term (discrete or Laplace) at level
        ``conf + η`` and ``r_k = a_k·ln(n/η)`` (Laplace tails ``η/n`` each), plus
        the rest's lattice widening.  ``inf`` when no term dominates.
        """
        live = self._live
        k = int(np.argmax(self._a))
        idx = live[k]
        rest = float(self._a.sum() - self._a[k])
        if rest > 1e-9 * self._a[k]:
            return math.inf
        eta = 1e-6 * (1.0 - conf)
        if self.lattice[idx] > 0:
            step = abs(self.coefficients[idx]) * self.lattice[idx]
            q1 = _discrete_quantile(step, math.exp(-self.lattice[idx] / self.scales[idx]), conf + eta)
        else:
            q1 = float(self._a[k]) * -math.log((1.0 - conf) - eta) * (1.0 + 1e-12)
        others = np.delete(live, k)
        r = rest * math.log(max(len(others), 1) / eta) + float(np.dot(np.abs(self.coefficients[others]), self.lattice[others]))
        return q1 + r

    def _discrete_quantile(self, conf: float) -> float:
        """Exact quantile of ``|γ c Z|`` for one discrete term."""
        assert self._single_discrete is not None
        s, p = self._single_discrete
        return _discrete_quantile(s, p, conf)

    # ------------------------------------------------------------------ central
    def cdf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """``P(E ≤ x)`` (central estimate).

        Raises:
            InvalidArgument: If x contains NaN.
        """
        xx, scalar = points(x)
        if self._single_discrete is not None:
            s, p = self._single_discrete
            k = np.floor(xx / s + 1e-9)
            with np.errstate(over="ignore"):
                out = np.where(k >= 0, 1.0 - p ** (k + 1.0) / (1.0 + p), p ** (-k) / (1.0 + p))
        elif self.method == "montecarlo":
            srt, _ = self._samples()
            out = np.searchsorted(srt, xx, side="right") / srt.size
        elif self.method == "convolution" and self._conv is not None:
            out = self._conv.cdf(xx)
        else:
            # Symmetry: P(E ≤ x) = 1/2 + sign(x) P(|E| ≤ |x|)/2.
            out = 0.5 + 0.5 * np.sign(xx) * self._abs_cdf(np.abs(xx))
            if self.n_terms == 0:
                out = np.where(xx >= 0, 1.0, 0.0)
        out = np.clip(out, 0.0, 1.0)
        return float(out[0]) if scalar else out

    def sf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """``P(E > x)`` (central estimate)."""
        xx, scalar = points(x)
        if self.method == "exact" and self._single_discrete is None and self.n_terms:
            out = np.asarray(self.cdf(-xx))  # symmetric and continuous: no cancellation in the tail
        else:
            out = 1.0 - np.asarray(self.cdf(xx))
        return float(out[0]) if scalar else out

    def pdf(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """Density of the continuous law ``Σ c_k L_k`` at x (central estimate).

        Raises:
            InvalidArgument: If x contains NaN or the law is a point mass.
        """
        xx, scalar = points(x)
        if self.n_terms == 0:
            raise InvalidArgument(
                "The error is exactly 0: a point mass has no density; use cdf or ppf instead."
            )
        if self.method == "exact":
            if self._sum is not None:
                out = self._sum.pdf(xx)
            elif self._normal_only:
                out = np.exp(-0.5 * xx * xx / self.variance) / math.sqrt(2.0 * math.pi * self.variance)
            else:
                a = self._a[0]
                out = np.exp(-np.abs(xx) / a) / (2.0 * a)
        else:
            # Central difference of the estimated CDF over a small window.
            if self.method == "convolution":
                assert self._conv is not None
                h = self._conv.step
            else:
                h = self.std * self._mc_args[0] ** -0.2
            out = (np.asarray(self.cdf(xx + h)) - np.asarray(self.cdf(xx - h))) / (2.0 * h)
        return float(out[0]) if scalar else out

    def ppf(self, p: ArrayLike) -> float | NDArray[np.float64]:
        """Quantile function of E (central estimate); ``ppf(0) = −inf``, ``ppf(1) = inf``.

        Raises:
            InvalidArgument: If p is outside [0, 1] or NaN.
        """
        pp, scalar = points(p, "p")
        if ((pp < 0) | (pp > 1)).any():
            raise InvalidArgument(f"p must lie in [0, 1]; got {float(pp[(pp < 0) | (pp > 1)][0])!r}.")
        out = np.array([self._ppf_one(float(v)) for v in pp])
        return float(out[0]) if scalar else out

    def _ppf_one(self, p: float) -> float:
        if p <= 0.0:
            return -math.inf
        if p >= 1.0:
            return math.inf
        if self.n_terms == 0:
            return 0.0
        if self.method == "montecarlo":
            srt, _ = self._samples()
            return float(srt[min(max(math.ceil(p * srt.size) - 1, 0), srt.size - 1)])
        if self._single_discrete is not None:
            s, q = self._single_discrete
            # Start from the continuous quantile, then walk to the smallest lattice
            # point k·s with P(Z ≤ k) ≥ p (a few steps at most).
            r = abs(2.0 * p - 1.0)
            k = round(math.copysign(-self._a[0] * math.log1p(-r), p - 0.5) / s)
            while float(self.cdf((k - 1) * s)) >= p:
                k -= 1
            while float(self.cdf(k * s)) < p:
                k += 1
            return k * s
        if p == 0.5:
            return 0.0
        r = abs(2.0 * p - 1.0)  # P(|E| ≤ x) = |2p − 1|
        if self.method == "convolution":
            assert self._conv is not None
            grid = np.arange(0.0, self._conv.pmf.size) * self._conv.step
            x = float(np.interp(r, self._abs_cdf(grid), grid))
        elif self._sum is not None:
            x = self._sum.abs_quantile(r)
        elif self._normal_only:
            x = math.sqrt(2.0 * self.variance) * float(erfinv(r))
        else:
            x = -self._a[0] * math.log1p(-r)
        return math.copysign(x, p - 0.5)


def _discrete_quantile(s: float, p: float, conf: float) -> float:
    """Smallest ``k·s`` with ``P(|Z| ≤ k) ≥ conf`` for a two-sided geometric Z of ratio p."""
    # P(|Z| ≤ k) = 1 − 2 p^{k+1}/(1+p) ≥ conf  ⇔  p^{k+1} ≤ (1 − conf)(1 + p)/2.
    if p <= 0.0:  # exp(−γ/b) underflowed: the scale is negligible next to the step, Z = 0 surely
        return 0.0
    if p >= 1.0:  # exp(−γ/b) rounded to 1: the quantile cannot be computed, so none is certified
        return math.inf
    k = max(0, math.ceil(math.log((1.0 - conf) * (1.0 + p) / 2.0) / math.log(p) - 1.0))

    def ok(j: int) -> bool:
        return 1.0 - 2.0 * p ** (j + 1) / (1.0 + p) >= conf

    while k > 0 and ok(k - 1):  # guard against rounding in the logarithms
        k -= 1
    while not ok(k):
        k += 1
    return float(k * s)


def halfwidths(laws: Sequence[ErrorLaw], confidence: float) -> NDArray[np.float64]:
    """``[law.halfwidth(confidence) for law in laws]``, each distinct law computed once.

    The groups of a GROUP BY priced at one scale give equal laws; exact laws are
    equal when their non-zero terms carry the same ``|c_k|``, ``b_k`` and ``γ_k``
    in the same order (the half-width ignores signs and zero terms), and then
    share one result, bit for bit what each would give alone.  Laws equal only
    up to rounding still share the Gil-Pelaez inversion (:mod:`._quantile`).

    Args:
        laws: The error laws.
        confidence: 1 − δ, in (0, 1).

    Returns:
        The certified half-widths, in the order of ``laws``.

    Raises:
        InvalidArgument: If confidence is not in (0, 1).

    Example:
        >>> laws = [ErrorLaw([1.0, 1.0], [2.0, 2.0]), ErrorLaw([-1.0, 0.0, 1.0], [2.0, 5.0, 2.0])]
        >>> w = halfwidths(laws, 0.95)
        >>> bool(w[0] == w[1] == laws[0].halfwidth(0.95))
        True
    """
    conf = probability(confidence, "confidence")
    out = np.empty(len(laws))
    seen: dict[tuple[bytes, ...], float] = {}
    for i, law in enumerate(laws):
        if law.method != "exact":
            out[i] = law.halfwidth(conf)
            continue
        live = law._live
        key: tuple[bytes, ...] = (np.abs(law.coefficients[live]).tobytes(), law.scales[live].tobytes(),
                                  law.lattice[live].tobytes())
        if law._glive.size:
            glive = law._glive
            key += (np.abs(law.coefficients[glive]).tobytes(), law.scales[glive].tobytes(),
                    law.lattice[glive].tobytes())
        hw = seen.get(key)
        if hw is None:
            hw = seen[key] = law.halfwidth(conf)
        out[i] = hw
    return out
