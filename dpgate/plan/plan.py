"""The values a plan is made of: measurements, steps, and the :class:`Plan` itself.

:func:`dpgate.plan.decide.plan` decides a statement on a refined copy of its table's
state (:meth:`~dpgate.plan.state.TableState.refined`) and returns a :class:`Plan`:
what to answer from history, what to measure, and what recording those measurements
charges.  Recording consumes the plan (``Gateway`` and
:meth:`dpgate.ledger._history.LedgerHistory.applied`): nothing passes between planning
and recording except this value, and planning changes no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.inference import Estimate, IncrementalBLUE
from dpgate.plan.state import Charge, RecordedCharges, TableState, held_keys

__all__ = ["ACCURACY_RTOL", "Measurement", "Plan", "Step", "meets"]

#: Relative slack when comparing a certified half-width with the requested accuracy
#: (floating-point noise in the quantile search, never more).
ACCURACY_RTOL = 1e-9


def meets(halfwidth: float, accuracy: float) -> bool:
    """Whether a certified half-width satisfies the requested accuracy."""
    return halfwidth <= accuracy * (1.0 + ACCURACY_RTOL)


@dataclass(frozen=True)
class Measurement:
    """One noisy count to take: ``query`` (linear part, offset 0) at ``alpha``.

    ``h`` is its vector for the inference (over the atoms, or its factor over its exact
    repeats' one-atom history when the atoms do not hold it); ``c`` is what it is charged
    as: the cost atoms it touches and its weight on each (:meth:`TableState.charge`).
    ``gaussian``: its noise is (discrete) Gaussian of deviation ``scale`` (a zCDP gateway's),
    else discrete Laplace of scale ``scale``; ``α = S/scale`` either way.
    """

    query: LinearQuery
    h: np.ndarray = field(repr=False)
    alpha: float
    scale: float
    lattice: float
    c: Charge = field(repr=False)
    gaussian: bool = False

    @property
    def sensitivity(self) -> float:
        """``S = max|q|`` of the measured query."""
        return self.query.sensitivity


@dataclass(frozen=True)
class Step:
    """The plan for one compiled query.

    ``order`` is the step's place in the plan (the statement's outputs are planned
    aggregate column by aggregate column); ``alone`` marks a fresh step whose answer is
    its own measurement only (see :func:`plan`); ``isolated`` is, for a query the atoms
    could not hold, the history of its exact repeats it is estimated from (``h`` is then
    its factor over that one-atom history).  ``same_as`` marks a query equal to an earlier
    one of the statement (e.g. the SUM that AVG and STDDEV of one column share): it is
    answered by that query's answer and measures nothing.
    """

    query: LinearQuery
    kind: Literal["exact", "history", "fresh", "unavailable"]
    h: np.ndarray | None = field(default=None, repr=False)
    measurements: tuple[Measurement, ...] = ()
    increase: float = 0.0
    values: tuple[float, ...] = ()  # the fresh releases, once measured
    order: int = 0
    alone: bool = False
    #: Set for a query outside the atoms: the history of its exact repeats that a fresh release
    #: is appended to (empty when it is alone, or answered from ``estimate``).
    isolated: IncrementalBLUE | None = field(default=None, repr=False)
    estimate: Estimate | None = field(default=None, repr=False)  # a history step's, from released values only
    same_as: int | None = None  # index of an equal query planned earlier in the statement

    def measured(self, values: tuple[float, ...]) -> Step:
        """This step with its fresh releases' values (``dataclasses.replace``, without its
        per-call field inspection: a GROUP BY has a step per group)."""
        return Step(self.query, self.kind, self.h, self.measurements, self.increase, values, self.order, self.alone,
                    self.isolated, self.estimate, self.same_as)


@dataclass(frozen=True)
class Plan:
    """What :func:`dpgate.plan.decide.plan` decided for one statement, and what recording it takes.

    ``steps``: one per compiled query, in the statement's order.  ``measurements``: the
    fresh releases, in the order they are recorded (the steps', step by step).
    ``refined``: the planning copy of the table's state the steps were decided on (not
    modified by planning); when ``installable`` — it was refined (with isolation) for
    exactly the measured queries, so recording them refines the live state as it was
    refined — it *is* the table's state once they are recorded
    (:meth:`~dpgate.plan.state.TableState.record_as_planned`), and recording consumes it.
    ``charged`` and ``charges``: the releases in the order the planner charged them, with
    the exact charge before them, after each and the costs after all
    (:meth:`recorded_charges` hands them to recording when that order is the recorded one).
    """

    steps: tuple[Step, ...]
    refined: TableState = field(repr=False)
    measurements: tuple[Measurement, ...] = field(repr=False)
    charged: tuple[Measurement, ...] = field(repr=False)
    charges: RecordedCharges = field(repr=False)
    installable: bool = False
    #: The planner's BLUE holding exactly :attr:`refined`'s history and then :attr:`measurements`,
    #: appended one by one as placeholders valued 0 — the very state :func:`~dpgate.plan.decide.answers`
    #: replays — when planning built it (a statement of one output measured with history), else
    #: None.  Once the values exist it is that state (:meth:`IncrementalBLUE.revalue`), so the
    #: answer takes no second append, projection or solve; answering consumes it.
    replayed: IncrementalBLUE | None = field(default=None, repr=False)

    @classmethod
    def of(cls, steps: Sequence[Step], refined: TableState, charged: Sequence[Measurement],
           charges: RecordedCharges, replayed: IncrementalBLUE | None = None) -> Plan:
        """The plan of ``steps`` decided on ``refined``; ``charged``, ``charges``: as priced then;
        ``replayed``: see :attr:`replayed`."""
        measurements = tuple(m for s in steps for m in s.measurements)
        return cls(tuple(steps), refined, measurements, tuple(charged), charges, _installable(refined, measurements),
                   replayed)

    @classmethod
    def of_releases(cls, refined: TableState, releases: Sequence[Measurement], charges: RecordedCharges) -> Plan:
        """A plan of no steps that records ``releases`` in order (``charges``: priced so on ``refined``)."""
        releases = tuple(releases)
        return cls((), refined, releases, releases, charges, _installable(refined, releases))

    def recorded_charges(self) -> RecordedCharges:
        """What recording :attr:`measurements` in order charges (the charge after each goes
        into its ledger record): the planner's when it charged them in that order, else
        priced on :attr:`refined` (:meth:`~dpgate.plan.state.TableState.recorded_charges`)."""
        if _same_charges(self.charged, self.measurements):
            return self.charges
        return self.refined.recorded_charges([(m.c, m.alpha, m.sensitivity) for m in self.measurements])


def _installable(refined: TableState, releases: Sequence[Measurement]) -> bool:
    """Whether ``refined`` was refined (with isolation) for exactly the queries of ``releases``."""
    return refined.refined_for is not None and refined.refined_for == held_keys([m.query for m in releases])


def _same_charges(a: Sequence[Measurement], b: Sequence[Measurement]) -> bool:
    """Whether two sequences of releases are charged alike, in the same order (charges
    compared as the memoised objects they are, so equal objects mean equal charges)."""
    return len(a) == len(b) and all(
        x.c is y.c and x.alpha == y.alpha and x.sensitivity == y.sensitivity for x, y in zip(a, b, strict=True))
