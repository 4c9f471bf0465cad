"""Reuse that never costs more than no reuse: the planner's per-cell guard.

The system cost of a table is ``k · max_j B_j`` with ``B_j`` the sum, over the
releases, of what each charges cell ``j`` (Xiao & Xiong, "Bayesian Inference under
Differential Privacy" (2012), Theorem 5.5; :mod:`dpgate.plan.accounting`).  Policy
``no_reuse`` measures every (distinct, non-zero) query ``Q`` of every statement at
the paper's α = S·ln(1/δ)/ε; call that release ``P(Q)``.

**The rule.**  A fresh step of ``minimal`` or ``paper`` releases only measurements
whose per-cell charge, summed, is at most ``P(Q)``'s on *every* cell (exactly, in
the integer units the costs are kept in).  The candidate search (``_candidates``)
still ranks candidates by the increase of the system charge; :func:`choose` takes
the cheapest one that passes this test *after* verification (verification may
lower a scale, raising its charge).  When none does, the step falls back to
``P(Q)`` itself, answered alone — its own release is the answer: one release at the
paper's scale certifies ``±ε`` at ``1−δ`` by construction (:func:`paper_scale`),
so the fallback always meets the requirement.  Answers from history charge nothing.

Isolated queries (not held by the atoms) follow the same rule: their release is
kept only when it is at most ``P(Q)``'s, else ``P(Q)`` alone is taken.  A GROUP BY's
"alone" groups are measured at a scale at least the paper's, so within it already.

**What this proves.**  Run the same statements (same requirements) through a
``minimal`` (or ``paper``) gateway and a ``no_reuse`` one (which releases exactly
``P(Q)`` per query: it never verifies against history).  Every step of the former
charges each cell at most what the latter's release of the same query charges it,
and the steps the latter does not charge (repeats within a statement, exact
answers) charge nothing in either; so per cell ``B_j(minimal) ≤ B_j(no_reuse)``
after every statement, hence ``k · max_j B_j(minimal) ≤ k · max_j B_j(no_reuse)``:
**``minimal`` never spends more than ``no_reuse`` on the same session, nor does
``paper``**, after every statement (``gw.spent`` too: it sums the tables).  The
comparison is exact (integer units, each release rounded up alike in both).
Assumption: both gateways charge each query on the same block of cost atoms — always
so while a table's costs live on one grid; once a main cost grid is full, further
queries are charged on side grids (:mod:`dpgate.plan.cost_grid`, an upper bound per
block), and two gateways whose grids were refined by different releases may place a
query differently: there the order is not proved.  Releases made outside the planner
(``release_measurements``, warm starts) are outside the comparison.

**What is only empirical.**  ``minimal ≤ paper`` (per session): ``paper`` may answer
from a history ``minimal`` does not have (``minimal`` measures at the largest scale
that meets the requirement, so its releases are less precise and later queries
reuse them less), so no per-statement rule can guarantee it;
``benchmarks/bench_policy_order.py`` measures it (1 session of 200 over 0.5 %).

**What it costs.**  Restrictions and separate atom counts need a finer scale than
``P(Q)``; they were cheaper only because the cells they load sit below the maximum
(an increase of 0 — where most of the random sessions' losses came from, since ties
went to atom counts).  The rule forgoes them unless they fit under ``P(Q)``: on the
paper's workload ``minimal`` keeps less of its lead over ``paper`` (measured in
``benchmarks/README.md``, "Policy order"; :data:`RELAXED` keeps more, unproved).

Why coverage still holds: the test reads only the measurements' vectors, scales
and charges (the design), never a released value, so the decision stays
independent of the data (see :mod:`dpgate.plan.decide`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np

from dpgate.errors import DPGateInternalError
from dpgate.plan.accounting import summed_units
from dpgate.plan.plan import Measurement, Step

__all__ = ["choose", "dominated", "isolated"]

_State = TypeVar("_State")

#: Off (the default): the rule above, with its proof.  On: a candidate that charges some cell
#: more than ``P(Q)`` is still taken when it raises the system charge *strictly* less than
#: every candidate that does not (dominated ones win ties) — it keeps more of ``minimal``'s
#: savings on workloads built for restrictions (benchmarks/README.md, "Policy order"), but
#: ``minimal ≤ no_reuse`` is then only empirical (``paper ≤ no_reuse`` stays proved).
RELAXED = False


def dominated(parts: Sequence[Measurement], bound: Measurement) -> bool:
    """Whether ``parts``, released together, charge every cell at most what ``bound`` charges it
    (exactly, in units: a cell ``bound`` does not touch must not be touched)."""
    if len(parts) == 1 and _same_charge(parts[0], bound):  # units grow with α: compare α alone
        return parts[0].alpha <= bound.alpha
    cells, units = summed_units([(*m.c, m.alpha, m.sensitivity) for m in parts])
    if not cells.size:
        return True
    limit_cells, limit = summed_units([(*bound.c, bound.alpha, bound.sensitivity)])
    where = np.searchsorted(limit_cells, cells)
    if (where >= limit_cells.size).any():
        return False
    if not np.array_equal(limit_cells[where], cells):
        return False
    return bool((units <= limit[where]).all())


def _same_charge(m: Measurement, bound: Measurement) -> bool:
    """Whether ``m`` charges the same cells with the same weights and sensitivity as ``bound``."""
    if m.sensitivity != bound.sensitivity:
        return False
    return m.c is bound.c or all(np.array_equal(a, b) for a, b in zip(m.c, bound.c, strict=True))


def choose(
    candidates: Sequence[tuple[float, int, list[Measurement]]],
    bound: Measurement,
    verify: Callable[[list[Measurement]], tuple[_State, list[Measurement]]],
    fallback: Callable[[list[Measurement]], tuple[_State, list[Measurement]]],
) -> tuple[_State, list[Measurement], bool]:
    """The cheapest of ``candidates`` (``(charge increase, tie rank, measurements)``, ordered by
    both) that, once verified (``verify``: the planner's check, which may lower scales),
    is :func:`dominated` by ``bound`` (the no-reuse release ``P(Q)``); else ``bound``
    itself, answered alone (``fallback``, given ``[bound]``).  With :data:`RELAXED`, a
    candidate over the bound is taken too when its increase is strictly the least.  Returns
    what ``verify`` or ``fallback`` returns (the estimator state after the step, the
    measurements) and whether the step is alone."""
    # (increase, over the bound, rank): a dominated candidate wins a tie in the increase.
    marked = [(c[0], not dominated(c[2], bound), c[1], c[2]) for c in candidates]
    for _, over, _, parts in sorted(marked, key=lambda c: c[:3]):
        if over and not RELAXED:  # scales only shrink in verification: no cheaper after
            continue
        try:
            state, verified = verify(parts)
        except DPGateInternalError:  # no scale of this candidate certifies: the next one may
            continue
        if over or verified is parts or dominated(verified, bound):
            return state, verified, False
    state, parts = fallback([bound])
    return state, parts, True


def isolated(step: Step, bound: Measurement) -> Step:
    """``step`` (an isolated query's fresh step), or ``bound`` — the no-reuse release of its
    query — answered alone when ``step``'s release would charge more than ``bound``'s
    (its verification lowered the scale below the paper's)."""
    if dominated(step.measurements, bound):
        return step
    return replace(step, measurements=(bound,), alone=True)
