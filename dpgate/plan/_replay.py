"""Answering a plan's steps, by replaying its measurements in plan order (:func:`answers`).

Re-exported by :mod:`dpgate.plan.decide`, whose plans these answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from dpgate.answer.result import Answer
from dpgate.errors import BudgetExhausted
from dpgate.inference import ErrorLaw, Estimate, IncrementalBLUE, Posterior, support_of
from dpgate.plan.budget import exhausted
from dpgate.plan.plan import Step, meets

__all__ = ["answers", "refusal"]


def answers(
    blue: IncrementalBLUE, steps: Sequence[Step], accuracy: float, confidence: float, policy: str,
    *, secure: bool, replayed: bool = False, rows: int | None = None,
) -> tuple[Answer, ...]:
    """Answer each step with the estimator its decision was verified on.

    ``secure`` is every answer's ``Answer.secure``: whether all releases of the
    table so far (this statement's included) used secure noise.

    ``blue`` is the state before this statement's releases; replaying the
    measurements in plan order (``Step.order``) means each query is estimated from
    exactly the history its plan saw (earlier releases plus its own), so a fresh
    answer's certified half-width is the one the plan checked.  (Adding the
    statement's later releases would lower the variance but can widen the certified
    interval by a lattice step.)  An ``alone`` step is its own release.  Which
    estimator is used depends only on the design, so coverage is unaffected.

    ``rows``: the table's declared row count (bounds each answer's support,
    :func:`~dpgate.inference._support.support_of`), if any.

    ``replayed``: ``blue`` already holds the steps' measurements with their values, appended
    so (its plan's :attr:`~dpgate.plan.plan.Plan.replayed`, revalued): nothing is replayed.
    """
    ordered = sorted(range(len(steps)), key=lambda i: steps[i].order)
    # The last step that reads the replayed history: nothing after it needs appending.
    readers = [k for k, i in enumerate(ordered)
               if not steps[i].alone and steps[i].kind != "exact" and steps[i].isolated is None
               and steps[i].same_as is None]
    last_reader = readers[-1] if readers else -1
    if replayed:
        last_reader = -1  # nothing to append
    replay = blue.copy() if any(steps[i].measurements for i in ordered[:last_reader + 1]) else blue
    out: list[Answer | None] = [None] * len(steps)
    laws: dict[tuple[float, float, bool], tuple[ErrorLaw, float]] = {}  # a GROUP BY's alone groups share one law
    for k, i in enumerate(ordered):
        s = steps[i]
        if k <= last_reader and s.isolated is None:
            # An unpaid ("unavailable") step keeps its planned measurements but has no values.
            for m, v in zip(s.measurements, s.values, strict=False):
                replay.append(m.h, m.scale, v, lattice=m.lattice, gaussian=m.gaussian)
        if s.same_as is not None:  # planned earlier in the statement, so answered already
            first = out[s.same_as]
            assert first is not None
            out[i] = replace(first, label=s.query.label, group=s.query.group, query=s.query, epsilon_spent=0.0)
            continue
        out[i] = _answer(replay, s, accuracy, confidence, policy, secure, laws, rows)
    return tuple(a for a in out if a is not None)


def _answer(
    blue: IncrementalBLUE, step: Step, accuracy: float, confidence: float, policy: str, secure: bool,
    laws: dict[tuple[float, float, bool], tuple[ErrorLaw, float]], rows: int | None = None,
) -> Answer:
    """``step``'s answer; ``laws``: the error laws (and half-widths at ``confidence``) of the alone
    releases answered so far, by scale and lattice (a GROUP BY's groups share one)."""
    q = step.query
    off = float(q.offset) if q.offset else 0.0
    if step.kind == "exact":
        return Answer._of(off, off, off, confidence, accuracy, "exact", 0.0, None, True, q.label, q.group, q, secure,
                          step.isolated is not None)
    if step.alone and step.kind == "fresh":
        # Its own release is the answer (the baseline's, or a query history says nothing about).
        (m,) = step.measurements
        known = laws.get((m.scale, m.lattice, m.gaussian))
        if known is None:
            law = ErrorLaw([1.0], [m.scale], lattice=[m.lattice], gaussian=[m.gaussian])
            known = laws[m.scale, m.lattice, m.gaussian] = (law, law.halfwidth(confidence))
        law, width = known
        centre = step.values[0]
    else:
        if step.kind == "history" and step.estimate is not None:
            est: Estimate | None = step.estimate  # planned on exactly this history (same order)
        else:
            if step.isolated is not None and step.h is not None:  # from its exact repeats and its own release
                blue = step.isolated.copy()
                for m, v in zip(step.measurements, step.values, strict=False):
                    blue.append(step.h, m.scale, v, lattice=m.lattice, gaussian=m.gaussian)
            est = blue.estimate(step.h) if step.h is not None else None
        if est is None or est.posterior is None:
            return Answer._of(math.nan, -math.inf, math.inf, confidence, accuracy, "unavailable", 0.0, None, False,
                              q.label, q.group, q, secure, step.isolated is not None)
        law, centre = est.posterior.law, est.posterior.mean()
        width = law.halfwidth(confidence)
    post = Posterior(centre + off, law, support_of(q, rows))
    low, high = post.center - width, post.center + width  # Posterior.interval(confidence), cut by Answer._of
    return Answer._of(
        float(post.center), float(low), float(high), confidence, accuracy,
        "history" if step.kind in ("history", "unavailable") else "fresh", step.increase, post,
        meets((high - low) / 2, accuracy), q.label, q.group, q, secure, step.isolated is not None,
    )


def refusal(
    blue: IncrementalBLUE, steps: Sequence[Step], needed: float, spent: float, budget: float, accuracy: float,
    confidence: float, *, secure: bool, rows: int | None = None, unit: str = "ε",
) -> BudgetExhausted:
    """The refusal of a statement that needs ``needed`` more than ``budget − spent`` allows, with what
    history alone would give a single-output statement (its steps replayed with nothing paid).
    ``confidence``: the one the statement is planned at (above the stated one for a re-asked query,
    ``dpgate.plan.asks``), written with the digits it has."""
    unpaid = [replace(s, kind="unavailable", increase=0.0) if s.kind == "fresh" else s for s in steps]
    best = answers(blue, unpaid, accuracy, confidence, "minimal", secure=secure, rows=rows)
    single = best[0] if len(best) == 1 else None
    hint = ""
    if single is not None and math.isfinite(single.value):
        hint = (
            f" History alone gives {single.value:.6g} ± {single.halfwidth:.6g} at {100 * confidence:.6g}%;"
            " pass allow_partial=True to receive it."
        )
    elif single is not None:
        hint = " History alone does not determine this query."
    return exhausted(needed, spent, budget, what="This query",
                     purpose=f" to reach ±{accuracy:g} at {100 * confidence:.6g}%", hint=hint, estimate=single,
                     unit=unit)
