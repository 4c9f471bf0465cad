"""Stage "decide": answer from history, or pick the cheapest fresh measurement.

Why one module of about 640 lines: the three policies' candidate measurements and their
pricing share the per-output bookkeeping below; the values they produce (:class:`Plan`,
:class:`Step`, :class:`Measurement`) are in :mod:`dpgate.plan.plan`, answering a plan in
:mod:`dpgate.plan._replay`.

Pure planning on copies of a table's state — no data, no I/O.  The method is
Xiao & Xiong, "Bayesian Inference under Differential Privacy" (2012).  For each
compiled query ``Q`` (a vector ``h`` over atoms), given the analyst's
requirement (resolved once, by :func:`dpgate.plan.requirement.resolve_requirement`):

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
   then restrictions).  A candidate is taken only if, verified, it charges no cell
   more than measuring ``Q`` at the paper's α; else that release is, answered alone
   (:mod:`dpgate.plan._guard`): so ``minimal`` and ``paper`` never spend more than
   ``no_reuse`` on the same session.

Why coverage still holds: which candidate is chosen, and at which scale,
depends only on the query vectors, scales and requirements — never on released
values or data — so given the design the BLUE's error is exactly a weighted sum
of the independent noises, whose law the interval is computed from.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast

import numpy as np
from scipy.special import ndtri

from dpgate.compile.bounds import check_deadline
from dpgate.compile.query import LinearQuery
from dpgate.errors import DPGateInternalError, InvalidRequirement
from dpgate.inference import ErrorLaw, Estimate, IncrementalBLUE, minimal_scale, single_release_scale
from dpgate.inference._blue import ESTIMABLE_RTOL
from dpgate.plan import _guard
from dpgate.plan._atom_scale import common_scale
from dpgate.plan._moments import moment_history
from dpgate.plan._replay import answers
from dpgate.plan.accounting import CellCosts, to_epsilon
from dpgate.plan.plan import ACCURACY_RTOL, Measurement, Plan, Step, meets
from dpgate.plan.state import RecordedCharges, TableState, _wide, isolation_key
from dpgate.release.noise import lattice_for

__all__ = [
    "ACCURACY_RTOL",
    "Measurement",
    "Plan",
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
# Tie ranks of the candidates (lower wins a tie): separate atom counts, Q itself, restrictions.
_ATOMS, _SELF, _RESTRICTED = 0, 1, 2
#: Smallest noise scale a release is planned at (a finer accuracy costs ≥ ``S·2^40``: refused by any budget).
MIN_SCALE = 2.0**-40
#: Largest noise scale a release is planned at (beyond, the lattice ratio ``exp(−γ/b)`` rounds to 1).
MAX_SCALE = 2.0**40


def paper_scale(accuracy: float, confidence: float, gaussian: bool = False) -> float:
    """Xiao & Xiong (2012)'s Theorem 5.3 scale ``ε/ln(1/δ)`` for dpgate's discrete noise.

    One Laplace release of scale ``b`` is within ``b·ln(1/δ)`` of the truth with
    probability ``1−δ``; the lattice noise adds at most ``γ ≤ b/1024`` (the
    coupling in ``dpgate.release.noise``), so ``b = ε/(ln(1/δ) + 1/1024)`` makes one fresh
    answer alone certifiably meet ``±ε`` (α is 0.1 % above the paper's at δ = 0.05).
    ``gaussian`` (zCDP): the deviation ``σ = ε/(z + 1/1024)`` with ``z = Φ⁻¹(1 − δ/2)``, the
    normal quantile, by the same argument (the discrete Gaussian's coupling, ``release._gaussian``).
    """
    if gaussian:
        return accuracy / (-float(ndtri((1.0 - confidence) / 2.0)) + 1.0 / 1024)
    return accuracy / (math.log(1.0 / (1.0 - confidence)) + 1.0 / 1024)


def plan(
    state: TableState, queries: Sequence[LinearQuery], accuracy: float, confidence: float, policy: str
) -> Plan:
    """Decide every query of a statement; ``state`` (its planning copy,
    :meth:`TableState.refined` for ``queries``) is not modified.

    The outputs are planned one aggregate column at a time (a column's outputs are
    the groups of a GROUP BY: disjoint queries).  Within a column:

    * an output that history already pins down is answered from it (free);
    * an output history says nothing about — not estimable, and no part of it that
      a cheaper measurement could leave out is pinned down either — is measured
      whole ("alone") at the one scale a single release needs: the best estimator
      of such a query from history plus its own measurement *is* that measurement
      (history gets zero weight), so its answer is the release itself.  All such
      groups share one scale, found once;
    * every other output gets the full candidate search, in order, seeing every
      measurement planned before it (the column's alone measurements included).

    A column of one output (no GROUP BY) always gets the full search.  Everything
    here depends only on the queries, the scales and the requirement, never on
    released values or data, so the plan is exact before any value exists.

    Returns the steps (one per query, in order) with what recording their releases
    charges, as a :class:`Plan` on ``state``.
    """
    held = [i for i, q in enumerate(queries) if not q.is_zero and i not in state.outside]
    hs: list[np.ndarray | None] = [None] * len(queries)
    for i, vec in zip(held, state.atoms.vectors([queries[i] for i in held]), strict=True):
        hs[i] = vec
    costs = state.costs.copy()
    start = costs.charge_units
    priced: list[Measurement] = []  # in the order charged, with the charge after each
    after: list[int] = []

    def add(m: Measurement) -> None:
        _add(costs, m)
        priced.append(m)
        after.append(costs.charge_units)

    blue, own_blue = state.blue, False  # plan copies the state's BLUE only when it appends to it
    replayed: IncrementalBLUE | None = None  # Plan.replayed
    steps: list[Step | None] = [None] * len(queries)
    order = 0

    def place(i: int, step: Step) -> None:
        nonlocal order
        steps[i] = replace(step, order=order)
        order += 1

    # A block's alone outputs, placed after its history steps, which were decided without them.
    alone: list[tuple[int, Measurement, float]] = []
    pending: list[int] = []  # alone outputs not charged yet: charged together, in order

    def flush() -> None:
        for release in _charge_alone(state, costs, [(i, queries[i], hs[i]) for i in pending],
                                     accuracy, confidence, policy):
            alone.append((release.index, release.measurement, release.increase))
            priced.append(release.measurement)
            after.append(release.after)
        pending.clear()

    columns = _columns(queries)
    planned: dict[LinearQuery, int] = {}  # queries of earlier columns (equality ignores label and group)
    for n_block, block in enumerate(columns):
        repeats = [i for i in block if queries[i] in planned]
        for i in repeats:
            first = steps[planned[queries[i]]]
            assert first is not None
            place(i, Step(queries[i], first.kind, first.h, same_as=planned[queries[i]]))
        block = [i for i in block if queries[i] not in planned]
        batch = len(block) > 1 and _disjoint([hs[i] for i in block])
        later: list[int] = []
        alone.clear()
        # ``blue`` does not change before the block's later steps: estimate every output first.
        live = {i: h for i in block if (h := hs[i]) is not None and not queries[i].is_zero}
        charged = state.atom_costs(costs) if batch and live and policy != "no_reuse" else None
        # A group no release ever touched is neither estimable nor restrictable: no row meets
        # its support (every release is charged where it touches, so uncharged atoms are untouched).
        touched = list(live) if charged is None else _touching(live, charged)
        ests = {} if policy == "no_reuse" or not touched else dict(zip(touched, blue.estimate_many(
            np.array([live[i] for i in touched]), [state.released_row(queries[i]) for i in touched]), strict=True))
        asks = [i for i, est in ests.items() if batch and not est.estimable]
        # Decided here, on the costs before the block: its outputs are disjoint, so adding one's
        # charge leaves every other's cells (hence its restrictions) as they were.  Asked only of
        # outputs history does not determine (a repeat asks none).
        restrictable = dict(zip(asks, _restrictable_many(blue, charged if charged is not None else np.zeros(0),
                                                         [live[i] for i in asks]), strict=True))
        for i in block:
            check_deadline()
            q, h = queries[i], hs[i]
            if q.is_zero:
                place(i, Step(q, "exact"))
                continue
            if h is None:  # outside the atoms
                step = _isolated(state, q, accuracy, confidence, policy)
                if step.measurements:  # never more per cell than no reuse (_guard)
                    step = _guard.isolated(step, measurement(state, q, _paper(accuracy, confidence, state.costs.zcdp),
                                                             h=step.h))
                    flush()  # charged in the order of the outputs
                    (m,) = step.measurements
                    before = costs.charge
                    add(m)
                    step = replace(step, increase=costs.charge - before)
                place(i, step)
                continue
            est = ests.get(i)
            if est is not None and meets(est.halfwidth(confidence), accuracy):  # inf when not estimable
                # Reusable by answers() only while no planned release (valued 0 here) is in ``blue``.
                place(i, Step(q, "history", h, estimate=None if own_blue else est))
            elif est is None or (batch and not est.estimable and not restrictable[i]):  # None: untouched, or no_reuse
                pending.append(i)
            else:
                later.append(i)
        flush()
        for i, m, increase in alone:
            steps[i] = Step(queries[i], "fresh", m.h, (m,), increase, order=order, alone=True)
            order += 1
        if alone and (later or n_block < len(columns) - 1):
            # Everything planned after them sees them (answers() replays the same order).
            if not own_blue:
                blue, own_blue = blue.copy(), True
            ms = [m for _, m, _ in alone]  # weights do not depend on the values (0 here)
            blue.extend(np.array([m.h for m in ms]), [m.scale for m in ms], np.zeros(len(ms)), [m.lattice for m in ms],
                        [m.gaussian for m in ms] if state.costs.zcdp else None)
        for i in later:
            q, h = queries[i], hs[i]
            assert h is not None
            if not own_blue:
                blue, own_blue = blue.copy(), True
            # The cheapest candidate that, verified on the estimator that answers it (the replayed
            # BLUE), charges no cell more than no reuse would; else no reuse's release, alone (_guard).
            blue, parts, alone_ = _guard.choose(
                _candidates(state, blue, costs, q, h, accuracy, confidence, policy),
                measurement(state, q, _paper(accuracy, confidence, state.costs.zcdp), h=h),
                functools.partial(_verified, state, blue, h, accuracy=accuracy, confidence=confidence, policy=policy),
                functools.partial(_verified, state, blue, h, accuracy=accuracy, confidence=confidence, policy=policy,
                                  alone=True))
            if len(queries) == 1:  # the statement's one step, verified on its replay
                replayed = blue
            before = costs.charge
            for m in parts:
                add(m)
            place(i, Step(q, "fresh", h, tuple(parts), costs.charge - before, alone=alone_))
        for i in block:
            planned.setdefault(queries[i], i)
    return Plan.of([s for s in steps if s is not None], state, priced, RecordedCharges(start, tuple(after), costs),
                   replayed)


@dataclass(frozen=True, slots=True)
class _AloneRelease:
    """An alone output's measurement (:func:`_charge_alone`): the output's index, the charge
    increase (ε) it causes and the table's charge after it (units)."""

    index: int
    measurement: Measurement
    increase: float
    after: int


def _charge_alone(
    state: TableState, costs: CellCosts, outputs: Sequence[tuple[int, LinearQuery, np.ndarray | None]],
    accuracy: float, confidence: float, policy: str,
) -> list[_AloneRelease]:
    """Measure each of ``outputs`` ``(index, query, vector)`` (disjoint outputs whose own release
    is their answer: :func:`plan`'s "alone") at the single-release scale and charge them, in
    order, to ``costs``.  Returns each one's release, in that order.  Outputs of one ``(α, S)``
    are charged in one pass (:meth:`CellCosts.add_disjoint`): a GROUP BY's groups are."""
    scales: dict[int, tuple[float, float]] = {}  # by denominator: the scale and its lattice
    ms = []
    linear = [q.linear_part for _, q, _ in outputs]
    vectors = cast(list[np.ndarray], [h for _, _, h in outputs])  # alone outputs are held by the atoms
    for q, h, c in zip(linear, vectors, state.charge_many(linear, vectors), strict=True):
        if q.denominator not in scales:
            scale = _alone_scale(q, accuracy, confidence, policy, state.costs.zcdp)
            scales[q.denominator] = scale, lattice_for(scale, q.denominator)[0]
        scale, lattice = scales[q.denominator]
        ms.append(Measurement(q, h, q.sensitivity / scale, scale, lattice, c, state.costs.zcdp))
    out: list[_AloneRelease] = []
    budgets = [(m.alpha, m.query.sensitivity) for m in ms]
    start = 0
    while start < len(ms):  # runs of one (α, S)
        end = start + 1
        while end < len(ms) and budgets[end] == budgets[start]:
            end += 1
        run = ms[start:end]
        before = to_epsilon(costs.charge_units)
        units = costs.add_disjoint([m.c for m in run], *budgets[start])
        if units is None:
            units = []
            for m in run:
                _add(costs, m)
                units.append(costs.charge_units)
        for (i, _, _), m, unit in zip(outputs[start:end], run, units, strict=True):
            charge = to_epsilon(unit)
            out.append(_AloneRelease(i, m, charge - before, unit))
            before = charge
        start = end
    return out


def _isolated(state: TableState, q: LinearQuery, accuracy: float, confidence: float, policy: str) -> Step:
    """The plan for a query the atoms do not hold: from its moment history when it is linear
    on slabs of one column (:meth:`TableState.moment_history`: every wide release over that
    column), else from its exact repeats; else measured on its own at the smallest budget
    that, with that history, meets the requirement."""
    key, factor = isolation_key(q)
    repeats = state.isolated.get(key)
    moments = moment_history(state.table, state.moments, state.isolated, q, key) \
        if policy != "no_reuse" and _wide(q) else None
    h = np.array([factor])
    est: Estimate | None = None
    history: IncrementalBLUE | None = None
    if moments is not None:
        h = moments[1]
        est = moments[0].estimate(h)
        history = moments[0].blue if est.estimable else None
    elif repeats is not None:
        est = repeats.estimate(factor) if policy != "no_reuse" else None
        history = repeats.blue()
    modelled = moments is not None
    # What a step answered without appending reads (a refusal's "history alone gives …").
    empty = _EMPTY_HISTORY if moments is None else moments[0].blue
    if history is None:  # never released, nor determined in part: its own release is its answer
        scale = _alone_scale(q, accuracy, confidence, "minimal" if policy == "minimal" else "paper", state.costs.zcdp)
        m = measurement(state, q, scale, h=h)
        return Step(q, "fresh", m.h, (m,), alone=True, isolated=empty, modelled=modelled)
    if est is not None and meets(est.halfwidth(confidence), accuracy):  # answered by ``est``
        return Step(q, "history", h, isolated=empty, estimate=est, modelled=modelled)
    iso = history.copy()
    scale = _alone_scale(q, accuracy, confidence, "paper", state.costs.zcdp)
    if policy == "minimal":
        if est is not None and est.estimable:
            found = minimal_scale(iso, h, h, accuracy, confidence, lattice=_lattice_step(q.denominator),
                                  max_scale=MAX_SCALE, gaussian=state.costs.zcdp)
            scale = max(scale, found if found is not None else scale)
        else:
            scale = _alone_scale(q, accuracy, confidence, policy, state.costs.zcdp)
    alone = est is None or not est.estimable  # its own release is the answer
    # Combined with its repeats, a release can have a wider certified half-width than alone
    # (at low confidence): checked, as every fresh step is.
    _, (m,) = _verified(state, iso, h, [measurement(state, q, scale, h=h)], accuracy, confidence, policy,
                        alone=alone, followed=False)
    return Step(q, "fresh", h, (m,), alone=alone, isolated=iso, modelled=modelled)


def _columns(queries: Sequence[LinearQuery]) -> list[list[int]]:
    """Indices of the statement's queries, one list per aggregate column (by label), in order."""
    by_label: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        by_label.setdefault(q.label, []).append(i)
    return list(by_label.values())


def _disjoint(hs: Sequence[np.ndarray | None]) -> bool:
    """Whether the vectors have pairwise disjoint supports over the atoms."""
    live = [h for h in hs if h is not None]
    if not live:
        return True
    if len(live) * live[0].size <= _BATCH_CELLS:
        return bool((np.count_nonzero(np.array(live), axis=0) <= 1).all())
    touched = np.zeros(live[0].size, dtype=np.int64)
    for h in live:
        touched += h != 0
    return bool(touched.max() <= 1)


def _touching(live: dict[int, np.ndarray], charged: np.ndarray) -> list[int]:
    """The outputs (by index) whose vector meets an atom some release was charged on."""
    if len(live) * charged.size <= _BATCH_CELLS:
        hit = (np.array(list(live.values())) != 0) @ (charged != 0)
        return [i for i, yes in zip(live, hit.tolist(), strict=True) if yes]
    return [i for i, h in live.items() if charged[h != 0].any()]


def _restrictable_many(blue: IncrementalBLUE, charged: np.ndarray, hs: Sequence[np.ndarray]) -> list[bool]:
    """Whether a restriction candidate of :func:`_candidates` exists for each ``h``: leaving
    out its ``t`` most-charged atoms (strictly more charged than the rest; ``charged``:
    :meth:`TableState.atom_costs`) while history plus the kept part still determines the
    query.  Structure only: no scale is searched.  Every (h, t) pair is tested in one
    :meth:`IncrementalBLUE.estimable_with_many` call; when there are many (a GROUP BY's
    groups), those that twin atoms rule out (:func:`_clash`) are not asked."""
    candidates: list[tuple[int, np.ndarray]] = []  # (output, the atoms left out)
    for k, h in enumerate(hs):
        support = np.flatnonzero(h)
        order = support[np.argsort(-charged[support], kind="stable")]
        candidates += [(k, order[:t]) for t in range(1, min(MAX_RESTRICTION, support.size - 1) + 1)
                       if charged[order[t - 1]] > charged[order[t]]]
    twins = blue.twin_classes() if len(candidates) >= _TWIN_PAIRS else None
    clashes: dict[int, np.ndarray] = {}
    owner: list[int] = []
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    for k, left_out in candidates:
        h = hs[k]
        if twins is not None:
            clash = clashes.get(k)
            if clash is None:
                clash = clashes[k] = _clash(blue, twins, h)
            if clash[left_out].any():
                continue  # not estimable so (see _clash): no projection needed
        h_keep = h.copy()
        h_keep[left_out] = 0.0
        owner.append(k)
        pairs.append((h, h_keep))
    out = [False] * len(hs)
    if not pairs:
        return out
    if len(pairs) * blue.n_atoms <= _BATCH_CELLS:
        found = blue.estimable_with_many(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    else:
        found = [blue.estimable_with(h, h_keep) for h, h_keep in pairs]
    for k, ok in zip(owner, found, strict=True):
        out[k] = out[k] or ok
    return out


def _clash(blue: IncrementalBLUE, twins: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Which atoms of ``h``'s support a restriction of ``h`` may not leave out, by structure.

    Every vector of the history's row space takes one value on twin atoms
    (:meth:`IncrementalBLUE.twin_classes`).  Leave out atom i of the support, whose twin j
    lies outside it: history plus the kept part ``h'`` spans only vectors ``u + c·h'`` with
    ``h'_i = h'_j = 0``, equal on i and j, while ``h_i ≠ h_j = 0``; so h is not estimable,
    its distance to that span being at least ``|h_i|·√(d_i d_j / (d_i + d_j)) ≥
    |h_i|·√(min d / 2)`` (``d``: cells per atom).  Atoms where that bound is over 100 times
    the estimability threshold — where :meth:`IncrementalBLUE.estimable_with` cannot but
    agree — are marked.  (A GROUP BY over a column history never split: every group's atoms
    have twins in the other groups.)"""
    d = blue.cell_sizes
    outside = np.zeros(int(twins.max(initial=0)) + 1, dtype=bool)
    outside[twins[h == 0]] = True
    bound = np.abs(h) * math.sqrt(float(d.min()) / 2)
    return outside[twins] & (h != 0) & (bound > 100 * ESTIMABLE_RTOL * math.sqrt(float(np.dot(d * h, h))))


#: From this many restriction candidates on, :func:`_restrictable_many` rules out by twin atoms
#: first (finding the twins costs about as much as testing a dozen candidates).
_TWIN_PAIRS = 32

#: Largest (pairs × atoms) matrix :func:`_restrictable_many` builds at once.
_BATCH_CELLS = 1 << 21


def _paper(accuracy: float, confidence: float, gaussian: bool = False) -> float:
    """:func:`paper_scale` within [:data:`MIN_SCALE`, :data:`MAX_SCALE`]: what ``no_reuse`` measures at."""
    return min(max(paper_scale(accuracy, confidence, gaussian), MIN_SCALE), MAX_SCALE)


def _alone_scale(q: LinearQuery, accuracy: float, confidence: float, policy: str, gaussian: bool = False) -> float:
    """The scale of a measurement that is its own answer: the paper's, or for ``minimal``
    the largest at which one release on ``q``'s lattice certifies the requirement."""
    paper = _paper(accuracy, confidence, gaussian)
    found = _single_release_scale(accuracy, confidence, q.denominator, gaussian) if policy == "minimal" else None
    return paper if found is None else max(paper, found)


@functools.lru_cache(maxsize=256)
def _single_release_scale(accuracy: float, confidence: float, denominator: int,
                          gaussian: bool = False) -> float | None:
    """Largest scale at which one discrete-Laplace (``gaussian``: discrete Gaussian) release alone
    meets ±accuracy at confidence (``None`` for an accuracy so fine that no usable scale does: the
    paper's, floored at :data:`MIN_SCALE`, is then charged — and refused by any real budget)."""
    return single_release_scale(accuracy, confidence, lattice=_lattice_step(denominator), max_scale=MAX_SCALE,
                                gaussian=gaussian)


_ONE = np.ones(1)
#: The history of an isolated query never released: read only (answers copy before appending).
_EMPTY_HISTORY = IncrementalBLUE(_ONE)


def measurement(state: TableState, query: LinearQuery, scale: float, *, h: np.ndarray | None = None) -> Measurement:
    """The measurement of ``query``'s linear part (offset 0) at noise scale ``scale`` on its lattice.

    ``h``: its inference vector when known (over the atoms, or its factor when they do
    not hold it); else its vector over the atoms, which must hold it.  Its cost vector
    comes from the cost atoms (a statement's queries are refined into them; a query made
    from the atoms, e.g. a restriction, is constant on them since they refine the atoms).
    """
    query = query.linear_part
    if h is None:
        h = state.atoms.vector(query)
    c = state.charge(query, h)
    return Measurement(query, h, query.sensitivity / scale, scale, lattice_for(scale, query.denominator)[0], c,
                       state.costs.zcdp)


def _verified(
    state: TableState,
    blue: IncrementalBLUE,
    h: np.ndarray,
    parts: list[Measurement],
    accuracy: float,
    confidence: float,
    policy: str,
    *,
    alone: bool = False,
    followed: bool = True,
) -> tuple[IncrementalBLUE, list[Measurement]]:
    """Append ``parts`` to a copy of ``blue`` and check the exact estimator that will be
    reported; if its certified half-width misses the target (the scale searches use
    the same law, but a term can change between the continuous and the exact discrete
    treatment), shrink the scales slightly until it does.  Returns the new state.

    ``alone``: the estimator is the one release in ``parts`` by itself, whose law is known
    without the state; ``blue`` is then appended to only when a later step of the plan
    (``followed``) reads it.

    Raises:
        DPGateInternalError: no scale was found that meets the requirement (never silently
            wider than asked)."""
    shrink = 2.0**-9
    for _ in range(64):  # the shrink doubles from 2⁻⁹ to ½: far below any usable scale
        if alone:
            (m,) = parts
            halfwidth = ErrorLaw([1.0], [m.scale], lattice=[m.lattice], gaussian=[m.gaussian]).halfwidth(confidence)
        else:
            trial = blue.copy()
            for m in parts:
                trial.append(m.h, m.scale, 0.0, lattice=m.lattice, gaussian=m.gaussian)  # weights ignore the value
            halfwidth = trial.estimate(h).halfwidth(confidence)
        if policy == "no_reuse" or meets(halfwidth, accuracy):
            break
        parts = [measurement(state, m.query, m.scale * (1 - shrink), h=m.h) for m in parts]
        shrink = min(0.5, 2 * shrink)  # slightly first; a far miss shrinks fast
    else:
        raise DPGateInternalError(
            f"no release scale meets ±{accuracy:g} at {confidence:g} (certified half-width {halfwidth:g}); "
            "nothing was spent.")
    if alone:
        trial = blue
        if followed:
            (m,) = parts
            trial.append(m.h, m.scale, 0.0, lattice=m.lattice, gaussian=m.gaussian)
    return trial, parts


def _add(costs: CellCosts, m: Measurement) -> None:
    """Charge ``m`` to the planner's own copy of the costs."""
    costs.add_sparse(*m.c, m.alpha, m.sensitivity, in_place=True)


def _price(costs: CellCosts, parts: Sequence[Measurement]) -> float:
    """The charge increase ``parts`` would cause (the costs are unchanged)."""
    return costs.charge_with([(*m.c, m.alpha, m.sensitivity) for m in parts]) - costs.charge


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
    gaussian = state.costs.zcdp
    paper = scale = _paper(accuracy, confidence, gaussian)
    if policy == "minimal":
        if blue.estimate(h).estimable:
            found = minimal_scale(blue, h, h, accuracy, confidence, lattice=_lattice_step(q.denominator),
                                  max_scale=MAX_SCALE, gaussian=gaussian)
        else:  # next to a measurement of Q itself, history gets zero weight: one release's scale
            found = _single_release_scale(accuracy, confidence, q.denominator, gaussian)
        if found is not None:
            scale = max(scale, found)
    parts = [measurement(state, q, scale)]
    out = [(_price(costs, parts), _SELF, parts)]
    if policy != "minimal":
        return out
    support = np.flatnonzero(h)
    # Restrictions: leave out the most-charged atoms when history pins them down.
    charged = state.atom_costs(costs)
    order = support[np.argsort(-charged[support], kind="stable")]
    ts = [t for t in range(1, min(MAX_RESTRICTION, support.size - 1) + 1)
          if charged[order[t - 1]] > charged[order[t]]]  # leaving out an atom no more charged cannot help
    # Restrictions history certainly cannot complete at any scale have no scale (minimal_scale
    # would find that after projecting each): ruled out from Q's residual alone.
    possible = blue.restrictions_possible(h, [order[:t] for t in ts])
    for t, ok in zip(ts, possible, strict=True):
        if not ok:
            continue
        keep = np.zeros(h.size, dtype=bool)
        keep[order[t:]] = True
        h_keep = np.where(keep, h, 0.0)
        part_q = state.atom_query(q, keep)
        b = minimal_scale(blue, h, h_keep, accuracy, confidence,
                          lattice=_lattice_step(part_q.denominator), max_scale=MAX_SCALE, gaussian=gaussian)
        if b is not None and math.isfinite(b):
            parts = [measurement(state, part_q, b)]
            out.append((_price(costs, parts), _RESTRICTED, parts))
    # Separate atom counts: disjoint, so every cell pays once.
    if 2 <= support.size <= MAX_ATOM_CANDIDATE:
        atom_qs = []
        for j in support:
            keep = np.zeros(h.size, dtype=bool)
            keep[j] = True
            atom_qs.append(state.atom_query(_unit(state, q), keep))
        b = common_scale(state, blue, h, atom_qs, accuracy, confidence, paper, MAX_SCALE)
        if b is not None:
            parts = [measurement(state, aq, b) for aq in atom_qs]
            out.append((_price(costs, parts), _ATOMS, parts))
    # Round increases so that ties are ties.
    return [(round(c / _TIE) * _TIE, r, p) for c, r, p in out]


def _lattice_step(denominator: int) -> Callable[[float], float]:
    """The lattice step γ of a release at scale ``b`` of a query with this denominator."""
    return lambda b: lattice_for(b, denominator)[0]


def _unit(state: TableState, q: LinearQuery) -> LinearQuery:
    """A query of weight 1 on every box of the atom grid (so restrictions give atom indicators)."""
    shape = tuple(len(b) for b in state.atoms.breakpoints)
    return LinearQuery.from_grid(state.table, state.atoms.columns, state.atoms.breakpoints, np.ones(shape))
