"""Stage "decide" (:mod:`dpgate.plan.decide`): answer from history or plan the cheapest fresh measurement.

The method is Xiao & Xiong, "Bayesian Inference under Differential Privacy"
(2012): a query whose BLUE from history already meets the requirement is free
(§5.2); otherwise the paper's rule measures it at α = S·ln(1/δ)/ε (Theorem 5.3),
and the ``minimal`` policy looks for a cheaper measurement under the per-cell
system cost ``k·max_j B_j`` (Theorem 5.5).  The properties tested here:

* ``minimal`` never charges more than the paper's rule on the same history;
* a plan that says it meets the requirement does, when re-checked with the
  inference (and the answers built from it carry certified intervals within ±ε);
* decisions read queries, scales and requirements — never released values or data —
  and leave the table's state untouched;
* history answers cost nothing; disjoint groups are charged once (parallel composition).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from dpgate.compile import compile_sql
from dpgate.compile.query import LinearQuery
from dpgate.errors import InvalidRequirement
from dpgate.plan import decide
from dpgate.plan.plan import Plan
from dpgate.plan.state import RecordedRelease, TableState
from dpgate.release.noise import lattice_for
from dpgate.schema.domains import Schema


def schema(rows_per_individual: int = 1) -> Schema:
    return Schema.load({"tables": {"t": {"max_rows_per_individual": rows_per_individual, "columns": {
        "age": {"type": "integer", "min": 0, "max": 9},
        "sex": {"type": "categorical", "values": ["0", "1"], "other": True, "nullable": True},  # 4 groups
    }}}})


SCHEMA = schema()
T = SCHEMA.table("t")

#: Queries over overlapping and disjoint ranges, weighted sums and groups: a workload that gives
#: the minimal policy's candidates (restrictions, atom counts) something to work with.
WORKLOAD = [
    "SELECT COUNT(*) FROM t WHERE age < 5",
    "SELECT COUNT(*) FROM t WHERE age >= 5",
    "SELECT COUNT(*) FROM t",
    "SELECT COUNT(*) FROM t WHERE age BETWEEN 3 AND 7",
    "SELECT sex, COUNT(*) FROM t WHERE age < 5 GROUP BY sex",
    "SELECT SUM(age) FROM t WHERE sex = '1'",
    "SELECT COUNT(*) FROM t WHERE age < 3",
    "SELECT 2*COUNT(*) FILTER (WHERE age < 5) - COUNT(*) + 4 FROM t",
    "SELECT COUNT(*) FROM t WHERE age < 5 AND sex <> '0'",
    "SELECT COUNT(*) FROM t WHERE age = 4",
]


def queries(sql: str, s: Schema = SCHEMA) -> tuple[LinearQuery, ...]:
    return compile_sql(sql, s)


def prepared(state: TableState, sql: str, s: Schema = SCHEMA) -> tuple[LinearQuery, ...]:
    """The statement's queries, with the state's atoms refined for them (as the gateway does before planning)."""
    qs = queries(sql, s)
    for q in qs:
        state.refine(q)
    return qs


def release(state: TableState, steps: tuple[decide.Step, ...], rng: np.random.Generator) -> list[decide.Step]:
    """Record every planned measurement with an arbitrary value; the steps with their values."""
    out = []
    for s in steps:
        values = tuple(float(rng.normal(0.0, 100.0)) for _ in s.measurements)
        state.record_many([RecordedRelease(len(state.record_ids) + k, m.query, m.scale, v, m.lattice, m.alpha,
                                           m.sensitivity)
                           for k, (m, v) in enumerate(zip(s.measurements, values, strict=True))])
        out.append(replace(s, values=values))
    return out


def paper_alpha(q: LinearQuery, accuracy: float, confidence: float) -> float:
    """The paper's α = S·ln(1/δ)/ε with dpgate's lattice margin (:func:`decide.paper_scale`)."""
    return q.sensitivity * (math.log(1.0 / (1.0 - confidence)) + 1.0 / 1024) / accuracy


# -- small pieces ---------------------------------------------------------------------------------------
def test_check_policy_names_the_policies() -> None:
    assert decide.POLICIES == ("minimal", "paper", "no_reuse")
    for p in decide.POLICIES:
        assert decide.check_policy(p) == p
    for bad in ("cheap", "MINIMAL", None, 1):
        with pytest.raises(InvalidRequirement, match="policy must be one of"):
            decide.check_policy(bad)


def test_meets_allows_floating_point_slack_only() -> None:
    assert decide.meets(10.0, 10.0) and decide.meets(9.0, 10.0)
    assert decide.meets(10.0 * (1 + 0.5 * decide.ACCURACY_RTOL), 10.0)
    assert not decide.meets(10.0 * (1 + 1e-6), 10.0)
    assert not decide.meets(math.inf, 10.0)  # not estimable never meets


def test_paper_scale_is_the_theorem_with_a_lattice_margin() -> None:
    for accuracy, confidence in [(10.0, 0.95), (2.5, 0.9), (100.0, 0.99)]:
        b = decide.paper_scale(accuracy, confidence)
        assert b == pytest.approx(accuracy / (math.log(1 / (1 - confidence)) + 1 / 1024), rel=1e-15)
        # 0.1 % below the paper's ε/ln(1/δ) at δ = 0.05, never above it.
        assert b < accuracy / math.log(1 / (1 - confidence))
    assert decide.paper_scale(10.0, 0.95) / (10.0 / math.log(20)) == pytest.approx(1 - 3.26e-4, abs=1e-5)


def test_measurement_is_the_linear_part_at_the_given_scale() -> None:
    state = TableState.new(T)
    (q,) = prepared(state, "SELECT 3*SUM(age) FILTER (WHERE sex = '1') + 7 AS x FROM t")
    m = decide.measurement(state, q, 4.0)
    assert (m.query.offset, m.query.label, m.query.group) == (Fraction(0), "", ())
    assert m.query.numerators.tolist() == q.numerators.tolist()
    assert m.sensitivity == q.sensitivity == 27.0
    assert m.alpha == 27.0 / 4.0 and m.scale == 4.0
    assert m.lattice == lattice_for(4.0, q.denominator)[0]
    np.testing.assert_array_equal(m.h, state.atoms.vector(q))


# -- fresh measurements ----------------------------------------------------------------------------------
def test_a_first_count_costs_the_papers_alpha() -> None:
    state = TableState.new(T)
    qs = prepared(state, "SELECT COUNT(*) FROM t WHERE age < 5")
    (paper,) = decide.plan(state, qs, 10.0, 0.95, "paper").steps
    assert paper.kind == "fresh" and len(paper.measurements) == 1
    (m,) = paper.measurements
    assert m.scale == decide.paper_scale(10.0, 0.95)
    assert paper.increase == pytest.approx(m.alpha, rel=1e-12) == pytest.approx(paper_alpha(qs[0], 10.0, 0.95))
    (minimal,) = decide.plan(state, qs, 10.0, 0.95, "minimal").steps
    # One release alone: the minimal scale is the exact Laplace quantile, i.e. the paper's own α = ln(1/δ)/ε.
    assert minimal.increase == pytest.approx(math.log(20) / 10.0, rel=1e-6)
    assert minimal.increase <= paper.increase


def test_disjoint_groups_are_charged_once_and_k_rows_k_times() -> None:
    for k in (1, 2):
        s = schema(k)
        state = TableState.new(s.table("t"))
        qs = prepared(state, "SELECT sex, SUM(age) FROM t WHERE age < 5 GROUP BY sex", s)
        steps = decide.plan(state, qs, 10.0, 0.95, "paper").steps
        assert [st.kind for st in steps] == ["fresh"] * 4
        # Groups touch disjoint cells, so only the first raises max_j B_j (Theorem 5.5).
        increases = [st.increase for st in steps]
        assert increases[0] == pytest.approx(k * paper_alpha(qs[0], 10.0, 0.95), rel=1e-12)
        assert increases[1:] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)


def test_zero_queries_are_exact_and_free() -> None:
    state = TableState.new(T)
    qs = prepared(state, "SELECT COUNT(*) FILTER (WHERE age < 0) + 7 AS n FROM t")
    (step,) = decide.plan(state, qs, 1.0, 0.95, "minimal").steps
    assert (step.kind, step.increase, step.measurements) == ("exact", 0.0, ())
    (answer,) = decide.answers(state.blue, [step], 1.0, 0.95, "minimal", secure=False)
    assert (answer.value, answer.low, answer.high, answer.source, answer.epsilon_spent) == (7.0, 7.0, 7.0, "exact", 0.0)


# -- history ---------------------------------------------------------------------------------------------------
def test_history_that_meets_the_requirement_is_free() -> None:
    state = TableState.new(T)
    rng = np.random.default_rng(1)
    qs = prepared(state, "SELECT COUNT(*) FROM t WHERE age < 5")
    release(state, decide.plan(state, qs, 5.0, 0.95, "minimal").steps, rng)
    qs += prepared(state, "SELECT COUNT(*) FROM t WHERE age >= 5")
    release(state, decide.plan(state, qs[1:], 5.0, 0.95, "minimal").steps, rng)
    # COUNT(age) (NULL ages excluded) is the sum of the two released counts: its BLUE's half-width is
    # below 2·5.
    total = prepared(state, "SELECT COUNT(age) FROM t")
    (step,) = decide.plan(state, total, 10.0, 0.95, "minimal").steps
    assert (step.kind, step.increase, step.measurements) == ("history", 0.0, ())
    assert decide.meets(state.blue.estimate(step.h).halfwidth(0.95), 10.0)
    assert decide.plan(state, total, 10.0, 0.95, "paper").steps[0].kind == "history"
    # The baseline ignores history; a tighter requirement needs a fresh measurement.
    assert decide.plan(state, total, 10.0, 0.95, "no_reuse").steps[0].kind == "fresh"
    assert decide.plan(state, total, 2.0, 0.95, "minimal").steps[0].kind == "fresh"
    (answer,) = decide.answers(state.blue, [step], 10.0, 0.95, "minimal", secure=False)
    assert answer.source == "history" and answer.epsilon_spent == 0.0 and answer.meets_requirement


def test_unpaid_steps_answer_from_history_or_not_at_all() -> None:
    state = TableState.new(T)
    qs = prepared(state, "SELECT COUNT(*) FROM t WHERE age < 5")
    (step,) = decide.plan(state, qs, 10.0, 0.95, "minimal").steps
    unpaid = replace(step, kind="unavailable", increase=0.0)
    (answer,) = decide.answers(state.blue, [unpaid], 10.0, 0.95, "minimal", secure=False)
    assert answer.source == "unavailable" and math.isnan(answer.value) and not answer.meets_requirement
    assert (answer.low, answer.high, answer.epsilon_spent) == (-math.inf, math.inf, 0.0)


# -- properties over a workload ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("accuracy", "confidence"), [(10.0, 0.95), (4.0, 0.9), (25.0, 0.99)])
def test_minimal_never_charges_more_than_the_paper_rule(accuracy: float, confidence: float) -> None:
    """On the same history, query by query: minimal ≤ paper policy ≤ the paper's α.

    Within a statement each query is planned on the costs its predecessors left, which differ between
    the policies, so the comparison is made for each query alone on the same history; the bound by
    the paper's α holds for every step of a statement.
    """
    state = TableState.new(T)
    rng = np.random.default_rng(7)
    for sql in WORKLOAD * 2:
        qs = prepared(state, sql)
        for q in qs:
            (a,) = decide.plan(state, [q], accuracy, confidence, "minimal").steps
            (b,) = decide.plan(state, [q], accuracy, confidence, "paper").steps
            assert a.increase <= b.increase + 1e-12, sql
            assert b.increase <= paper_alpha(q, accuracy, confidence) * (1 + 1e-12), sql
        minimal = decide.plan(state, qs, accuracy, confidence, "minimal").steps
        for s, q in zip(minimal, qs, strict=True):
            assert s.increase <= paper_alpha(q, accuracy, confidence) * (1 + 1e-12), sql
        release(state, minimal, rng)
    # By the second pass the workload's first query is answered from history.
    (again,) = decide.plan(state, prepared(state, WORKLOAD[0]), accuracy, confidence, "minimal").steps
    assert again.kind == "history" and again.increase == 0.0


@pytest.mark.parametrize("policy", decide.POLICIES)
def test_plans_meet_the_requirement_when_rechecked(policy: str) -> None:
    """Replaying a statement's measurements, each query's BLUE meets ±ε; so do the answers built from them."""
    accuracy, confidence = 6.0, 0.95
    state = TableState.new(T)
    rng = np.random.default_rng(11)
    for sql in WORKLOAD:
        qs = prepared(state, sql)
        steps = decide.plan(state, qs, accuracy, confidence, policy).steps
        check = state.blue.copy()
        for s in steps:
            for m in s.measurements:
                check.append(m.h, m.scale, 0.0, lattice=m.lattice)
            if s.kind == "exact" or (policy == "no_reuse" and s.kind == "fresh"):
                continue  # the baseline answers from its own release alone (checked through answers below)
            assert decide.meets(check.estimate(s.h).halfwidth(confidence), accuracy), (sql, s.kind)
        before = state.blue.copy()
        for answer in decide.answers(before, release(state, steps, rng), accuracy, confidence, policy, secure=False):
            assert answer.meets_requirement and answer.source in ("fresh", "history", "exact")
            assert (answer.high - answer.low) / 2 <= accuracy * (1 + decide.ACCURACY_RTOL)
            # A count's interval is intersected with [0, ∞); its unbiased value may lie below it.
            assert answer.low <= answer.value <= answer.high or answer.value < answer.low == 0.0


def test_decisions_ignore_released_values_and_leave_the_state_alone() -> None:
    """Two histories with the same design but different released values get the same plans."""
    states = [TableState.new(T), TableState.new(T)]
    rngs = [np.random.default_rng(3), np.random.default_rng(4)]  # different "released" values
    for sql in WORKLOAD:
        plans = []
        for state, rng in zip(states, rngs, strict=True):
            qs = prepared(state, sql)
            costs, rows = state.costs.per_atom.copy(), len(state.blue.values)
            steps = decide.plan(state, qs, 8.0, 0.95, "minimal").steps
            np.testing.assert_array_equal(state.costs.per_atom, costs)  # planning spends nothing
            assert len(state.blue.values) == rows
            plans.append(steps)
            release(state, steps, rng)
        a, b = plans
        assert [s.kind for s in a] == [s.kind for s in b]
        assert [s.increase for s in a] == [s.increase for s in b]
        for sa, sb in zip(a, b, strict=True):
            assert [(m.query, m.alpha, m.scale, m.lattice) for m in sa.measurements] == [
                (m.query, m.alpha, m.scale, m.lattice) for m in sb.measurements
            ]
    assert not np.array_equal(states[0].blue.values, states[1].blue.values)


def test_a_measured_step_is_the_step_with_its_values() -> None:
    """``Step.measured`` (a GROUP BY's fast copy) keeps every other field, whatever fields Step has."""
    import dataclasses

    q = LinearQuery.from_grid(T, ["age"], [[0, 3]], np.array([1.0, 0.0]))
    others = {f.name: object() for f in dataclasses.fields(decide.Step) if f.name not in ("query", "values")}
    step = decide.Step(q, **others)  # type: ignore[arg-type]
    got = step.measured((1.5, 2.5))
    assert got.values == (1.5, 2.5)
    assert all(getattr(got, f.name) is getattr(step, f.name) for f in dataclasses.fields(decide.Step) if f.name != "values")


# -- the plan as a value: planning changes nothing, recording consumes it -------------------------------------
#: A GROUP BY whose first group history touches and the others not (those, "alone", are charged
#: before it: recorded in output order, the plan's releases are priced again), then the workload.
PLANNED = ["SELECT COUNT(*) FROM t WHERE sex = '0' AND age < 5", "SELECT sex, COUNT(*) FROM t GROUP BY sex", *WORKLOAD,
           "SELECT COUNT(*) FROM t WHERE age > 2"]


def _contents(state: TableState) -> list[object]:
    """What a state's mutable parts hold (compared before and after planning on it)."""
    return [state.costs.units.copy(), state.costs.charge_units, state.blue.values.copy(), state.blue.scales.copy(),
            state.atoms.labels.copy(), state.atoms.breakpoints, state.cost_atoms.breakpoints, list(state.queries),
            list(state.record_ids), list(state.alphas), list(state.sensitivities), dict(state.isolated),
            dict(state._known or {}), dict(state._cost_kind), dict(state._row_of), state.outside, state.refined_for]


def _same_contents(a: list[object], b: list[object]) -> None:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


def _released(state: TableState, plan: Plan, rng: np.random.Generator) -> list[RecordedRelease]:
    """Records of ``plan``'s measurements, in order, after the state's, with arbitrary values."""
    return [RecordedRelease(len(state.record_ids) + len(state.isolated) + k, m.query, m.scale,
                            float(rng.normal(0.0, 100.0)), m.lattice, m.alpha, m.sensitivity)
            for k, m in enumerate(plan.measurements)]


@pytest.mark.parametrize("max_atoms", [20_000, 6])  # 6: some statements stay outside the atoms
def test_planning_leaves_the_state_it_was_given_unchanged(max_atoms: int) -> None:
    """``plan`` reads its planning copy and returns a frozen value: every field of the copy is the
    same object afterwards, holding the same contents (the map of cost atoms onto atoms, a
    derived cache, aside)."""
    import dataclasses

    live, rng = TableState.new(T, max_atoms=max_atoms), np.random.default_rng(5)
    for sql in PLANNED:
        qs = queries(sql)
        state = live.refined(qs, isolate=True)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "_members"}
        contents = _contents(state)
        plan = decide.plan(state, qs, 8.0, 0.95, "minimal")
        assert all(getattr(state, name) is value for name, value in fields.items())
        _same_contents(_contents(state), contents)
        assert plan.refined is state and plan.measurements == tuple(m for s in plan.steps for m in s.measurements)
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.steps = ()  # type: ignore[misc]
        live.record_many(_released(live, plan, rng))


@pytest.mark.parametrize("max_atoms", [20_000, 6])
def test_recording_a_plan_gives_the_state_recording_its_records_gives(max_atoms: int) -> None:
    """Installing a plan's copy with its priced charges (what the gateway does when the copy was
    refined for exactly the measured queries) gives the state that recording the same records
    on the live state gives; and the charges a plan hands to recording are the recorded ones."""
    installed, replayed = TableState.new(T, max_atoms=max_atoms), TableState.new(T, max_atoms=max_atoms)
    rng, fast, repriced = np.random.default_rng(6), 0, 0
    for sql in PLANNED:
        qs = queries(sql)
        plan = decide.plan(installed.refined(qs, isolate=True), qs, 8.0, 0.95, "minimal")
        charges = plan.recorded_charges()
        priced = plan.refined.recorded_charges([(m.c, m.alpha, m.sensitivity) for m in plan.measurements])
        assert (charges.before, charges.after) == (priced.before, priced.after)
        np.testing.assert_array_equal(charges.costs.units, priced.costs.units)
        repriced += charges is not plan.charges
        records = _released(installed, plan, rng)
        if plan.installable:
            fast += 1
            plan.refined.record_as_planned(records, charges.costs, [m.h for m in plan.measurements])
            installed = plan.refined
        else:
            installed.record_many(records)
        replayed.record_many(records)
        _same_contents(_contents(installed)[4:], _contents(replayed)[4:])
        np.testing.assert_array_equal(installed.costs.units, replayed.costs.units)
        assert installed.costs.charge_units == replayed.costs.charge_units
        for q in installed.queries:
            a = installed.blue.estimate(installed.atoms.vector(q))
            b = replayed.blue.estimate(replayed.atoms.vector(q))
            assert (a.value, a.variance) == pytest.approx((b.value, b.variance), rel=1e-9, abs=1e-9)
    assert fast > 0 and repriced > 0  # both ways of recording, both ways of pricing
