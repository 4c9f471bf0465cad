"""Stage "decide": answer from history, or pick the cheapest fresh measurement.

Pure planning on copies of a table's state — no data, no I/O.  The method is
Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012).  For each
compiled query ``Q`` (a vector ``h`` over atoms), given the analyst's
requirement (resolved once, by :func:`dpgate.requirement.resolve_requirement`):

1. if the BLUE of ``Q`` from history has a certified (1−δ) half-width ≤ ε,
   answer from history (cost 0);
2. otherwise choose a fresh measurement.  Policy ``"paper"`` measures ``Q``
   itself at α = S·ln(1/δ)/ε (Xiao & Xiong (2012), Theorem 5.3).  Policy ``"minimal"``
   prices several *candidate* measurements, each at the largest noise scale for
   which the BLUE of ``Q`` over history plus that measurement meets the
   requirement, and takes the one that raises the system cost
   ``k·max_j B_j`` (Xiao & Xiong (2012), Theorem 5.5) least:

   * ``Q`` itself (never at more than the paper's α);
   * ``Q`` restricted to its atoms minus the ``t`` most-charged ones
     (t = 1, 2, 3), when history already determines the part left out — the
     "only measure what history does not pin down" move, which spares the cells
     that bound the system cost;
   * the atoms of ``Q``'s support measured separately (disjoint counts, so each
     cell pays once), when ``Q`` touches few atoms; these make every later query
     on the same atoms estimable.

   Ties in the increase go to the more reusable candidate (atoms, then ``Q``,
   then restrictions).

Why coverage still holds: which candidate is chosen, and at which scale,
depends only on the query vectors, scales and requirements — never on released
values or data — so given the design the BLUE's error is exactly a weighted sum
of the independent noises, whose law the interval is computed from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Literal, cast

import numpy as np

from dpgate.accounting import CellCosts
from dpgate.errors import InvalidRequirement
from dpgate.inference import ErrorLaw, IncrementalBLUE, Posterior, minimal_scale
from dpgate.noise import lattice_for
from dpgate.query import LinearQuery
from dpgate.result import Answer, Source
from dpgate.state import TableState

__all__ = [
    "Measurement",
    "Step",
    "plan",
    "answers",
    "measurement",
    "meets",
    "paper_scale",
    "POLICIES",
    "Policy",
    "check_policy",
]

#: ``minimal``: cheapest candidate measurement meeting the requirement (default);
#: ``paper``: Xiao & Xiong (2012)'s α = S·ln(1/δ)/ε whenever history falls short;
#: ``no_reuse``: baseline that ignores history and answers every query fresh at the paper's α.
POLICIES: tuple[str, ...] = ("minimal", "paper", "no_reuse")
#: The policy names as a type.
Policy = Literal["minimal", "paper", "no_reuse"]


def check_policy(policy: object) -> Policy:
    """``policy`` if it names a policy.

    Raises:
        InvalidRequirement: it does not.
    """
    if policy not in POLICIES:
        raise InvalidRequirement(f"policy must be one of {list(POLICIES)}, got {policy!r}.")
    return cast(Policy, policy)

#: Support sizes (in atoms) up to which separate atom counts are a candidate.
MAX_ATOM_CANDIDATE = 16
#: How many of the most-charged atoms a restricted candidate may leave out.
MAX_RESTRICTION = 3
# Two cost increases closer than this are a tie.
_TIE = 1e-12
#: Relative slack when comparing a certified half-width with the requested accuracy
#: (floating-point noise in the quantile search, never more).
ACCURACY_RTOL = 1e-9


def meets(halfwidth: float, accuracy: float) -> bool:
    """Whether a certified half-width satisfies the requested accuracy."""
    return halfwidth <= accuracy * (1.0 + ACCURACY_RTOL)


#: Smallest noise scale a release is planned at.  An accuracy so fine that it needs a
#: smaller scale (e.g. 1e-300) costs at least ``S·2^40 ≈ 1.1e12·S`` here, which any real
#: budget refuses with ``BudgetExhausted``; without the floor the scale rounds to 0.
MIN_SCALE = 2.0**-40
#: Largest noise scale a release is planned at.  A coarser accuracy (e.g. 1e17) is met
#: by this scale for ``S·2^-40`` of budget; beyond it the lattice ratio ``exp(−γ/b)``
#: rounds to 1 and no interval could be certified.
MAX_SCALE = 2.0**40


def paper_scale(accuracy: float, confidence: float) -> float:
    """Xiao & Xiong (2012)'s Theorem 5.3 scale ``ε/ln(1/δ)`` for dpgate's discrete noise.

    One Laplace release of scale ``b`` is within ``b·ln(1/δ)`` of the truth with
    probability ``1−δ``; the lattice noise adds at most ``γ ≤ b/1024`` (the
    coupling in ``dpgate.noise``), so ``b = ε/(ln(1/δ) + 1/1024)`` makes one fresh
    answer alone certifiably meet ``±ε`` (α is 0.1 % above the paper's at δ = 0.05).
    """
    return accuracy / (math.log(1.0 / (1.0 - confidence)) + 1.0 / 1024)


@dataclass(frozen=True)
class Measurement:
    """One noisy count to take: ``query`` (linear part, offset 0) at ``alpha``."""

    query: LinearQuery
    h: np.ndarray = field(repr=False)
    alpha: float
    scale: float
    lattice: float

    @property
    def sensitivity(self) -> float:
        """``S = max|q|`` of the measured query."""
        return self.query.sensitivity


@dataclass(frozen=True)
class Step:
    """The plan for one compiled query."""

    query: LinearQuery
    kind: Literal["exact", "history", "fresh", "unavailable"]
    h: np.ndarray | None = field(default=None, repr=False)
    measurements: tuple[Measurement, ...] = ()
    increase: float = 0.0
    values: tuple[float, ...] = ()  # the fresh releases, once measured


def plan(
    state: TableState, queries: Sequence[LinearQuery], accuracy: float, confidence: float, policy: str
) -> list[Step]:
    """Decide every query of a statement; ``state`` is not modified.

    Queries are planned in order, each seeing the measurements planned before it
    (their weights do not depend on the values, so the plan is exact).
    """
    blue, costs = state.blue.copy(), state.costs.copy()
    steps: list[Step] = []
    for q in queries:
        if q.is_zero:
            steps.append(Step(q, "exact"))
            continue
        h = state.atoms.vector(q)
        if policy != "no_reuse":
            est = blue.estimate(h)
            if meets(est.halfwidth(confidence), accuracy):  # inf when not estimable
                steps.append(Step(q, "history", h))
                continue
        candidates = _candidates(state, blue, costs, q, h, accuracy, confidence, policy)
        _, _, parts = min(candidates, key=lambda c: (c[0], c[1]))
        blue, parts = _verified(state, blue, h, parts, accuracy, confidence, policy)
        increase = _price(costs, parts)
        for m in parts:
            costs.add(m.h, m.alpha, m.sensitivity)
        steps.append(Step(q, "fresh", h, tuple(parts), increase))
    return steps


def answers(
    blue: IncrementalBLUE, steps: Sequence[Step], accuracy: float, confidence: float, policy: str,
    *, secure: bool,
) -> tuple[Answer, ...]:
    """Answer each step with the estimator its decision was verified on.

    ``secure`` is every answer's ``Answer.secure``: whether all releases of the
    table so far (this statement's included) used secure noise.

    ``blue`` is the state before this statement's releases; replaying the
    measurements in plan order means each query is estimated from exactly the
    history its plan saw (earlier releases plus its own), so a fresh answer's
    certified half-width is the one the plan checked.  (Adding the statement's
    later releases would lower the variance but can widen the certified interval
    by a lattice step.)  Which estimator is used depends only on the design, so
    coverage is unaffected.
    """
    replay = blue.copy() if any(s.measurements for s in steps) else blue
    out = []
    for s in steps:
        # An unpaid ("unavailable") step keeps its planned measurements but has no values.
        for m, v in zip(s.measurements, s.values, strict=False):
            replay.append(m.h, m.scale, v, lattice=m.lattice)
        out.append(_answer(replay, s, accuracy, confidence, policy, secure))
    return tuple(out)


def _answer(
    blue: IncrementalBLUE, step: Step, accuracy: float, confidence: float, policy: str, secure: bool
) -> Answer:
    q = step.query
    off = float(q.offset)

    def answer(value: float, low: float, high: float, source: Source, epsilon_spent: float,
               posterior: Posterior | None = None, meets_requirement: bool = True) -> Answer:
        return Answer(value, low, high, confidence, accuracy, source, epsilon_spent, posterior, meets_requirement,
                      label=q.label, group=q.group, query=q, secure=secure)

    if step.kind == "exact":
        return answer(off, off, off, source="exact", epsilon_spent=0.0)
    if policy == "no_reuse" and step.kind == "fresh":
        # The baseline answers from its own fresh release only (one measurement of Q).
        (m,) = step.measurements
        post = Posterior(step.values[0], ErrorLaw([1.0], [m.scale], lattice=[m.lattice]))
    else:
        est = blue.estimate(step.h) if step.h is not None else None
        if est is None or est.posterior is None:
            return answer(math.nan, -math.inf, math.inf, source="unavailable", epsilon_spent=0.0,
                          meets_requirement=False)
        post = est.posterior
    post = Posterior(post.mean() + off, post.law)
    low, high = post.interval(confidence)
    return answer(
        float(post.mean()), float(low), float(high),
        source="history" if step.kind in ("history", "unavailable") else "fresh",
        epsilon_spent=step.increase, posterior=post, meets_requirement=meets((high - low) / 2, accuracy),
    )


def measurement(state: TableState, query: LinearQuery, scale: float) -> Measurement:
    """The measurement of ``query``'s linear part (offset 0) at noise scale ``scale`` on its lattice."""
    query = replace(query, offset=Fraction(0), label="", group=())
    h = state.atoms.vector(query)
    return Measurement(query, h, query.sensitivity / scale, scale, lattice_for(scale, query.denominator)[0])


def _verified(
    state: TableState,
    blue: IncrementalBLUE,
    h: np.ndarray,
    parts: list[Measurement],
    accuracy: float,
    confidence: float,
    policy: str,
) -> tuple[IncrementalBLUE, list[Measurement]]:
    """Append ``parts`` to a copy of ``blue`` and check the exact estimator that will be
    reported; if its certified half-width misses the target (the scale searches use
    the same law, but a term can change between the continuous and the exact discrete
    treatment), shrink the scales slightly until it does.  Returns the new state."""
    for _ in range(16):
        trial = blue.copy()
        for m in parts:
            trial.append(m.h, m.scale, 0.0, lattice=m.lattice)  # weights do not depend on the value
        est = trial.estimate(h)
        if policy == "no_reuse" or meets(est.halfwidth(confidence), accuracy):
            break
        parts = [measurement(state, m.query, m.scale * (1 - 2.0**-9)) for m in parts]
    return trial, parts


def _price(costs: CellCosts, parts: Sequence[Measurement]) -> float:
    trial = costs.copy()
    for m in parts:
        trial.add(m.h, m.alpha, m.sensitivity)
    return trial.charge - costs.charge


def _candidates(
    state: TableState,
    blue: IncrementalBLUE,
    costs: CellCosts,
    q: LinearQuery,
    h: np.ndarray,
    accuracy: float,
    confidence: float,
    policy: str,
) -> list[tuple[float, int, list[Measurement]]]:
    """``(cost increase, tie rank, measurements)`` for every viable candidate."""
    paper = min(max(paper_scale(accuracy, confidence), MIN_SCALE), MAX_SCALE)
    scale = paper
    if policy == "minimal":
        found = minimal_scale(blue, h, h, accuracy, confidence, lattice=_lattice_step(q.denominator),
                              max_scale=MAX_SCALE)
        if found is not None:
            scale = max(scale, found)
    parts = [measurement(state, q, scale)]
    out = [(_price(costs, parts), 1, parts)]
    if policy != "minimal":
        return out
    support = np.flatnonzero(h)
    # Restrictions: leave out the most-charged atoms when history pins them down.
    order = support[np.argsort(-costs.per_atom[support], kind="stable")]
    for t in range(1, min(MAX_RESTRICTION, support.size - 1) + 1):
        keep = np.zeros(h.size, dtype=bool)
        keep[order[t:]] = True
        if costs.per_atom[order[t - 1]] <= costs.per_atom[order[t]]:
            continue  # leaving out an atom no more charged than the rest cannot help
        h_keep = np.where(keep, h, 0.0)
        part_q = state.atom_query(q, keep)
        b = minimal_scale(blue, h, h_keep, accuracy, confidence,
                          lattice=_lattice_step(part_q.denominator), max_scale=MAX_SCALE)
        if b is not None and math.isfinite(b):
            parts = [measurement(state, part_q, b)]
            out.append((_price(costs, parts), 2, parts))
    # Separate atom counts: disjoint, so every cell pays once.
    if 2 <= support.size <= MAX_ATOM_CANDIDATE:
        atom_qs = []
        for j in support:
            keep = np.zeros(h.size, dtype=bool)
            keep[j] = True
            atom_qs.append(state.atom_query(_unit(state, q), keep))
        b = _common_scale(state, blue, h, atom_qs, accuracy, confidence, paper)
        if b is not None:
            parts = [measurement(state, aq, b) for aq in atom_qs]
            out.append((_price(costs, parts), 0, parts))
    # Round increases so that ties are ties.
    return [(round(c / _TIE) * _TIE, r, p) for c, r, p in out]


def _lattice_step(denominator: int) -> Callable[[float], float]:
    """The lattice step γ of a release at scale ``b`` of a query with this denominator."""
    return lambda b: lattice_for(b, denominator)[0]


def _unit(state: TableState, q: LinearQuery) -> LinearQuery:
    """A query of weight 1 on every box of the atom grid (so restrictions give atom indicators)."""
    shape = tuple(len(b) for b in state.atoms.breakpoints)
    return LinearQuery.from_grid(state.table, state.atoms.columns, state.atoms.breakpoints, np.ones(shape))


def _common_scale(
    state: TableState,
    blue: IncrementalBLUE,
    h: np.ndarray,
    atom_qs: Sequence[LinearQuery],
    accuracy: float,
    confidence: float,
    start: float,
) -> float | None:
    """Largest common scale b at which separate atom counts let the BLUE of ``h`` meet the target."""
    rows = [state.atoms.vector(aq) for aq in atom_qs]

    def enough(b: float) -> bool:
        trial = blue.copy()
        for r in rows:
            trial.append(r, b, 0.0, lattice=lattice_for(b, 1)[0])
        est = trial.estimate(h)
        return meets(est.halfwidth(confidence), accuracy)

    lo = hi = start
    if enough(start):
        for _ in range(30):
            if hi >= MAX_SCALE:
                return MAX_SCALE
            hi = min(hi * 2.0, MAX_SCALE)
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
