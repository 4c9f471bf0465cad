"""Zero-concentrated differential privacy (zCDP): the gateway's second accounting, and its conversions.

A gateway opened with ``privacy="zcdp"`` keeps its budget in ρ (Bun & Steinke, "Concentrated
Differential Privacy: Simplifications, Extensions, and Lower Bounds", TCC 2016), under which
``k`` releases compose like ``√k`` in ε instead of ``k``.  This module holds the pure
functions of that accounting: which accounting a name means, ρ → (ε, δ), (ε, δ) → ρ, and
the budget argument a caller gives.  The per-cell charge itself is in
:mod:`dpgate.plan.accounting` (``CellCosts(..., zcdp=True)``).

Per-cell ρ, in one paragraph (the README's proof).  Neighbouring relation: add/remove one
row.  A release ``y = h·x + N`` whose noise ``N`` is Laplace of scale ``b = S/α`` is
``(α|h_j|/S)``-DP for a row in cell ``j``, hence ``(α|h_j|/S)²/2``-zCDP for it (Bun &
Steinke, Prop. 1.4); Gaussian noise of deviation ``σ`` costs it exactly ``h_j²/(2σ²)`` (the
Rényi divergence of two normals, ``‖Δ/σ‖²/2`` at every order).  zCDP composes by addition
(Bun & Steinke, Lemma 2.3), so a row in cell ``j`` loses ``R_j = Σ_i ρ_ij`` and the system is
``max_j R_j``-zCDP.  A unit of ``k`` rows in cells ``j_1..j_k`` moves each Gaussian release by
``Σ_r h_{j_r}`` and, by Cauchy–Schwarz, ``(Σ_r h_{j_r})² ≤ k Σ_r h_{j_r}²``; summed over
releases its loss is at most ``k Σ_r R_{j_r} ≤ k² max_j R_j``, attained when all ``k`` rows
sit in the cell of the maximum.  A Laplace release is ``Σ_r ε_{j_r}``-DP for the unit (group
privacy), so ``(Σ_r ε_{j_r})²/2 ≤ k Σ_r ε_{j_r}²/2`` and the same bound holds.  So a table
costs ``k² · max_j R_j`` (``k² · Σ_b max R_b`` over blocks, an upper bound as for ε), tables
add up.

Example:
    >>> round(epsilon_of(0.5, 1e-6), 4) <= round(0.5 + 2 * math.sqrt(0.5 * math.log(1e6)), 4)
    True
    >>> rho = rho_of(1.0, 1e-6)
    >>> epsilon_of(rho, 1e-6) <= 1.0
    True
"""

from __future__ import annotations

import math
from typing import Any, Literal

from dpgate.errors import InvalidArgument, InvalidRequirement

__all__ = ["PRIVACY_MODES", "DEFAULT_DELTA", "Privacy", "check_privacy", "epsilon_of", "rho_of",
           "rho_of_pure", "budget_in"]

Privacy = Literal["pure", "zcdp"]

#: The accountings a gateway may keep: pure ε (Laplace, Xiao & Xiong's per-cell ε) or ρ-zCDP.
PRIVACY_MODES: tuple[str, ...] = ("pure", "zcdp")

#: The δ at which EXPLAIN, ``SHOW dpgate.budget`` and ``gw.spent_as()`` state a zCDP budget as ε.
DEFAULT_DELTA = 1e-6


def check_privacy(privacy: object) -> Privacy:
    """``privacy`` if it names an accounting (``"pure"`` or ``"zcdp"``, any case), else InvalidArgument."""
    if isinstance(privacy, str) and privacy.strip().lower() in PRIVACY_MODES:
        return "zcdp" if privacy.strip().lower() == "zcdp" else "pure"
    raise InvalidArgument(f"privacy must be 'pure' (ε-DP, the default) or 'zcdp' (ρ-zCDP), got {privacy!r}.")


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < float(delta) < 1.0:
        raise InvalidRequirement(f"δ must be a number strictly between 0 and 1 (e.g. 1e-6), got {delta!r}.")
    return float(delta)


def _check_rho(rho: object, what: str = "ρ") -> float:
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not (math.isfinite(rho) and rho >= 0.0):
        raise InvalidRequirement(f"{what} must be a finite number ≥ 0, got {rho!r}.")
    return float(rho)


def _epsilon_at(rho: float, log_inv_delta: float, alpha: float) -> float:
    """The ε of Canonne, Kamath & Steinke's conversion at one Rényi order ``α > 1`` (valid at every α)."""
    return alpha * rho + (log_inv_delta + (alpha - 1.0) * math.log1p(-1.0 / alpha) - math.log(alpha)) / (alpha - 1.0)


def epsilon_of(rho: float, delta: float = DEFAULT_DELTA) -> float:
    """The ε such that a ρ-zCDP mechanism is (ε, δ)-DP: the tight conversion of Canonne, Kamath &
    Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020), Corollary 13.

    ρ-zCDP means Rényi-DP of order α with ``τ = αρ`` for every ``α > 1``; their Proposition 12
    turns (α, τ)-RDP into (ε, δ)-DP with ``δ = exp((α−1)(τ−ε)) (1−1/α)^α / (α−1)``, i.e.

        ``ε(α) = αρ + (ln(1/δ) + (α−1) ln(1−1/α) − ln α) / (α−1)``,

    and the conversion is ``inf_{α>1} ε(α)``.  Since ``(α−1) ln(1−1/α) − ln α < 0``, each ε(α)
    is below ``αρ + ln(1/δ)/(α−1)``, whose infimum is Bun & Steinke's ``ρ + 2√(ρ ln(1/δ))``:
    the tight conversion is never larger (tests check it).  Every α gives a *valid* ε, so the
    numerical minimisation below can only err upwards (never claims more privacy than holds);
    the result is also capped by Bun & Steinke's closed form.  ``ρ = 0`` gives 0.

    Raises:
        InvalidRequirement: ρ is negative or not finite, or δ is not in (0, 1).
    """
    rho, delta = _check_rho(rho), _check_delta(delta)
    if rho == 0.0:
        return 0.0
    log_inv = math.log(1.0 / delta)
    bun_steinke = rho + 2.0 * math.sqrt(rho * log_inv)
    # ε(α) is convex-like in log(α - 1): golden-section search on u = log(α - 1) over a wide bracket,
    # started around Bun & Steinke's optimum α* = 1 + √(ln(1/δ)/ρ).
    centre = math.log(math.sqrt(log_inv / rho))
    lo, hi = centre - 8.0, centre + 8.0

    def f(u: float) -> float:
        return _epsilon_at(rho, log_inv, 1.0 + math.exp(u))

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(200):
        if hi - lo < 1e-12:
            break
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = f(b)
    best = min(fa, fb, f(centre))
    return max(0.0, min(best, bun_steinke))


def rho_of(epsilon: float, delta: float = DEFAULT_DELTA) -> float:
    """The largest ρ whose (ε, δ) conversion (:func:`epsilon_of`) is at most ``epsilon``: the ρ
    budget that guarantees a target (ε, δ)-DP.

    ``epsilon_of`` is increasing in ρ, so a bisection finds it; it is guarded: the ρ returned
    always satisfies ``epsilon_of(ρ, δ) ≤ ε`` (it keeps the lower end of the bracket).

    Raises:
        InvalidRequirement: ε is not positive and finite, or δ is not in (0, 1), or no ρ > 0 fits.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (
            math.isfinite(epsilon) and epsilon > 0.0):
        raise InvalidRequirement(f"ε must be a finite number > 0, got {epsilon!r}.")
    epsilon, delta = float(epsilon), _check_delta(delta)
    lo, hi = 0.0, max(1.0, epsilon)
    for _ in range(200):  # bracket: epsilon_of(hi) > ε
        if epsilon_of(hi, delta) > epsilon:
            break
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if epsilon_of(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    if not lo > 0.0 or epsilon_of(lo, delta) > epsilon:
        raise InvalidRequirement(f"no ρ > 0 guarantees (ε={epsilon:g}, δ={delta:g})-DP; ask for a larger ε or δ.")
    return lo


def rho_of_pure(epsilon: float) -> float:
    """The ρ an ε-DP mechanism satisfies: ``ε²/2`` (Bun & Steinke 2016, Proposition 1.4)."""
    return float(epsilon) ** 2 / 2.0


def budget_in(privacy: Privacy, budget: Any) -> float:
    """A gateway's ``budget`` argument in its unit: ε for ``"pure"``; for ``"zcdp"``, ρ > 0 as
    given, or a target ``(ε, δ)`` pair converted by :func:`rho_of`.

    Raises:
        InvalidRequirement: a number ≤ 0 or not finite, a pair that is not (ε > 0, 0 < δ < 1),
            or a pair given to a pure-ε gateway.
    """
    if isinstance(budget, (tuple, list)):
        if privacy != "zcdp":
            raise InvalidRequirement(
                f"budget={tuple(budget)!r} is an (ε, δ) pair, which only a zCDP gateway converts; pass one "
                "ε for privacy='pure', or privacy='zcdp'.")
        if len(budget) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in budget):
            raise InvalidRequirement(
                f"budget must be ρ > 0 or a pair (ε, δ) such as (1.0, 1e-6), got {tuple(budget)!r}.")
        return rho_of(float(budget[0]), _check_delta(budget[1]))
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (
            math.isfinite(budget) and budget > 0.0):
        unit = "ρ (or a pair (ε, δ))" if privacy == "zcdp" else "ε"
        raise InvalidRequirement(f"budget must be a finite {unit} > 0, got {budget!r}.")
    return float(budget)
