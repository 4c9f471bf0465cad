"""Budget safety of the gateway (property-based) and refusal of bad input.

* Random query sequences and requirements against a small budget (hypothesis):
  ``gw.spent ≤ budget`` always; a refused query (``BudgetExhausted``) changes
  nothing — spent, history, ledger records — touches no data, and its message
  states the ε it needs and what remains; ``allow_partial=True`` returns flagged
  answers and spends nothing; answers from history read no data; ``gw.spent``
  always equals the per-cell formula recomputed from the history.
* Bad input (accuracy ≤ 0 or NaN, confidence outside (0, 1), unsupported SQL,
  undeclared tables, …) raises its specific error before any data is read
  (a spy on ``gw._cube._execute``, the cube's only data-touching method) and
  spends nothing.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from _gateway_worker import NET_EDGES, independent_spent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.plan.asks import ask_confidence


class DataSpy:
    """Wraps ``cube._execute``: counts the statements that read the data."""

    def __init__(self, gw: dpgate.Gateway) -> None:
        self.calls = 0
        self._inner = gw._cube._execute

        def spy(*args, **kwargs):
            self.calls += 1
            return self._inner(*args, **kwargs)

        gw._cube._execute = spy  # instance attribute shadows the method


def snapshot(gw: dpgate.Gateway):
    return gw.spent, gw.ledger.records(), len(gw.history)


# --------------------------------------------------------------------------- property test

E = NET_EDGES  # 0, 16, …, 128, 4096
POOL = [
    *(f"SELECT COUNT(*) FROM nettrace WHERE value < {e}" for e in E[1:5]),
    f"SELECT COUNT(*) FROM nettrace WHERE value >= {E[1]} AND value < {E[3]}",
    f"SELECT COUNT(*) FROM nettrace WHERE value BETWEEN {E[2]} AND {E[4] - 1}",
    f"SELECT COUNT(*) FILTER (WHERE value < {E[2]}) FROM nettrace",
    "SELECT value, COUNT(*) FROM nettrace GROUP BY value",
    f"SELECT SUM(CASE WHEN value < {E[1]} THEN 2 WHEN value < {E[3]} THEN 1 ELSE 0 END) FROM nettrace",
    f"SELECT COUNT(*) AS a, COUNT(*) FILTER (WHERE value >= {E[2]}) AS b FROM nettrace WHERE value < {E[4]}",
    "SELECT COUNT(*) FROM nettrace",
    "SELECT COUNT(*) - COUNT(*) FROM nettrace",  # identically zero: exact, free
]

steps = st.lists(
    st.tuples(
        st.sampled_from(range(len(POOL))),
        st.floats(min_value=2.0, max_value=300.0),
        st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]),
        st.booleans(),
        st.sampled_from([None, "minimal", "paper", "no_reuse"]),
    ),
    min_size=2,
    max_size=7,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.floats(min_value=0.05, max_value=0.8), policy=st.sampled_from(["minimal", "paper"]),
       seed=st.integers(0, 2**16), seq=steps)
def test_budget_is_never_exceeded_and_refusal_changes_nothing(net, budget, policy, seed, seq):
    df, schema = net
    with tempfile.TemporaryDirectory() as tmp:
        with dpgate.Gateway(df, schema, budget=budget, ledger=Path(tmp) / "l.db", seed=seed, policy=policy) as gw:
            spy = DataSpy(gw)
            for i, acc, conf, partial, pol in seq:
                sql = POOL[i]
                before, reads = snapshot(gw), spy.calls
                try:
                    res = gw.query(sql, accuracy=acc, confidence=conf, allow_partial=partial, policy=pol)
                except dpgate.BudgetExhausted as exc:
                    assert not partial
                    assert snapshot(gw) == before, "a refused query changed the state"
                    assert spy.calls == reads, "a refused query read the data"
                    msg = str(exc)
                    assert f"{exc.needed:.4g}" in msg and f"{exc.remaining:.4g}" in msg, msg
                    assert exc.remaining == pytest.approx(max(0.0, budget - before[0]), abs=1e-12)
                    assert before[0] + exc.needed > budget
                    continue
                spent = gw.spent
                assert spent <= budget * (1 + 1e-9) + 1e-12
                assert spent >= before[0]
                assert res.epsilon_spent == pytest.approx(spent - before[0], abs=1e-11)
                sources = {a.source for a in res.answers}
                flagged = [a for a in res.answers
                           if a.source == "unavailable" or (a.source == "history" and not a.meets_requirement)]
                if flagged:
                    assert partial, "only allow_partial may return answers short of the requirement"
                    assert "fresh" not in sources
                    assert all(a.epsilon_spent == 0 for a in res.answers)
                    assert snapshot(gw) == before and spy.calls == reads
                for a in res.answers:
                    if a.source == "unavailable":
                        assert math.isnan(a.value) and a.low == -math.inf and a.high == math.inf
                        assert not a.meets_requirement
                    elif a.source == "history" and a.meets_requirement:
                        assert a.halfwidth <= acc * (1 + 1e-9)
                if sources <= {"history", "exact", "unavailable"}:
                    assert snapshot(gw) == before, "an answer from history released something"
                    assert spy.calls == reads, "an answer from history read the data"
                assert spent == pytest.approx(independent_spent(gw.history, schema), rel=1e-9, abs=1e-12)


def test_refusal_message_and_partial_answer(net):
    """A deterministic refusal: the numbers in the message, and the partial answer."""
    df, schema = net
    sql = f"SELECT COUNT(*) FROM nettrace WHERE value < {E[2]}"
    with dpgate.Gateway(df, schema, budget=0.2, seed=3, policy="paper") as gw:
        first = gw.query(sql, accuracy=30, confidence=0.95).answer
        before = snapshot(gw)
        spy = DataSpy(gw)
        with pytest.raises(dpgate.BudgetExhausted) as info:
            gw.query(sql, accuracy=5, confidence=0.95)
        exc = info.value
        assert snapshot(gw) == before and spy.calls == 0
        # The tighter re-ask is the query's second interval: planned at 1 − δ_2 (dpgate.plan.asks).
        c2 = ask_confidence(0.95, 2)
        paper = (math.log(1 / (1 - c2)) + 1 / 1024) / 5
        assert exc.needed == pytest.approx(paper, rel=1e-6)
        assert exc.remaining == pytest.approx(0.2 - before[0])
        msg = str(exc)
        assert f"ε = {exc.needed:.4g}" in msg and f"{exc.remaining:.4g} of 0.2 remains" in msg
        assert "±5" in msg and f"at {100 * c2:.6g}%" in msg
        assert "History alone gives" in msg and "allow_partial=True" in msg
        # The estimate named in the message is history's own, with its true interval.
        est = exc.estimate
        assert est is not None and est.source == "history" and not est.meets_requirement
        lo, hi = first.posterior.interval(c2)
        assert est.value == pytest.approx(first.value) and est.halfwidth == pytest.approx((hi - lo) / 2)
        # allow_partial returns exactly that, flagged, and spends nothing.
        a = gw.query(sql, accuracy=5, confidence=0.95, allow_partial=True).answer
        assert a.source == "history" and not a.meets_requirement and a.epsilon_spent == 0
        assert (a.value, a.low, a.high) == pytest.approx((first.value, first.low, first.high))
        assert snapshot(gw) == before and spy.calls == 0
        # A GROUP BY that cannot be paid: every group flagged, nothing spent.
        res = gw.query("SELECT value, COUNT(*) FROM nettrace GROUP BY value", accuracy=1, allow_partial=True)
        assert {a.source for a in res.answers} <= {"history", "unavailable"}
        assert not any(a.meets_requirement for a in res.answers)
        assert snapshot(gw) == before and spy.calls == 0


def test_refusal_estimate_reports_no_spending(net):
    """The history estimate attached to BudgetExhausted was not paid for."""
    df, schema = net
    sql = f"SELECT COUNT(*) FROM nettrace WHERE value < {E[2]}"
    with dpgate.Gateway(df, schema, budget=0.2, seed=3, policy="paper") as gw:
        gw.query(sql, accuracy=30, confidence=0.95)
        with pytest.raises(dpgate.BudgetExhausted) as info:
            gw.query(sql, accuracy=5, confidence=0.95)
    assert info.value.estimate.epsilon_spent == 0


# --------------------------------------------------------------------------- bad input

BAD_REQUIREMENTS = [
    (dict(accuracy=0), dpgate.InvalidRequirement),
    (dict(accuracy=-3), dpgate.InvalidRequirement),
    (dict(accuracy=float("nan")), dpgate.InvalidRequirement),
    (dict(accuracy=float("inf")), dpgate.InvalidRequirement),
    (dict(accuracy="10"), dpgate.InvalidRequirement),
    (dict(accuracy=True), dpgate.InvalidRequirement),
    (dict(), dpgate.InvalidRequirement),  # no accuracy at all
    (dict(accuracy=10, confidence=0), dpgate.InvalidRequirement),
    (dict(accuracy=10, confidence=1), dpgate.InvalidRequirement),
    (dict(accuracy=10, confidence=1.5), dpgate.InvalidRequirement),
    (dict(accuracy=10, confidence=-0.2), dpgate.InvalidRequirement),
    (dict(accuracy=10, confidence=float("nan")), dpgate.InvalidRequirement),
    (dict(accuracy=10, policy="greedy"), dpgate.InvalidRequirement),
]

BAD_SQL = [
    ("SELECT * FROM pums", dpgate.UnsupportedQuery),
    ("SELECT age FROM pums", dpgate.UnsupportedQuery),
    ("SELECT AVG(age) + 1 FROM pums", dpgate.UnsupportedQuery),
    ("SELECT MIN(age) FROM pums", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM pums a JOIN pums b ON a.age = b.age", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM (SELECT * FROM pums)", dpgate.UnsupportedQuery),
    ("WITH t AS (SELECT * FROM pums) SELECT COUNT(*) FROM t", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) OVER () FROM pums", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM read_csv('/etc/passwd')", dpgate.UnsupportedQuery),
    ("DELETE FROM pums", dpgate.UnsupportedQuery),
    ("DROP TABLE pums", dpgate.UnsupportedQuery),
    ("COPY pums TO 'leak.csv'", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM pums; SELECT COUNT(*) FROM pums", dpgate.UnsupportedQuery),
    ("SELECT SUM(1 / 0) FROM pums", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM pums WHERE", dpgate.QuerySyntaxError),
    ("", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM people", dpgate.SchemaError),
    ("SELECT COUNT(*) FROM information_schema.tables", dpgate.SchemaError),
    ("SELECT COUNT(*) FROM pums WHERE salary > 3", dpgate.SchemaError),
    ("SELECT SUM(pid) FROM pums", dpgate.SchemaError),
    ("SELECT COUNT(*) FROM pums WHERE age < ?", dpgate.ProgrammingError),  # no parameters given
    ("SET dpgate.accuracy = 5", dpgate.ProgrammingError),
    ("SELECT SUM(CASE WHEN age < 30 THEN 1e400 ELSE 0 END) FROM pums", dpgate.UnsupportedQuery),
    ("SELECT COUNT(*) FROM pums WHERE age < 1e400", dpgate.UnsupportedQuery),
]


@pytest.fixture
def used_gateway(pums):
    """A gateway with some history, its data reads spied on."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=1, policy="paper")
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
    spy = DataSpy(gw)
    yield gw, spy
    gw.close()


@pytest.mark.parametrize("kwargs, error", BAD_REQUIREMENTS)
def test_bad_requirement_is_refused_before_any_data_is_read(used_gateway, kwargs, error):
    gw, spy = used_gateway
    before = snapshot(gw)
    with pytest.raises(error):
        gw.query("SELECT COUNT(*) FROM pums WHERE age >= 30", **kwargs)
    assert spy.calls == 0 and snapshot(gw) == before


@pytest.mark.parametrize("sql, error", BAD_SQL)
def test_bad_sql_is_refused_before_any_data_is_read(used_gateway, sql, error):
    gw, spy = used_gateway
    before = snapshot(gw)
    with pytest.raises(error) as info:
        gw.query(sql, accuracy=10)
    assert isinstance(info.value, dpgate.Error)
    assert str(info.value)  # a message, not a bare class
    assert spy.calls == 0 and snapshot(gw) == before
    with pytest.raises(dpgate.Error):
        gw.probability(sql, low=0)
    assert spy.calls == 0 and snapshot(gw) == before


def test_bin_splitting_predicate_is_refused_with_the_edges(net):
    df, schema = net
    with dpgate.Gateway(df, schema, budget=1.0, seed=1) as gw:
        spy = DataSpy(gw)
        with pytest.raises(dpgate.UnsupportedQuery, match=r"\[16, 32\)") as info:
            gw.query("SELECT COUNT(*) FROM nettrace WHERE value < 20", accuracy=10)
        assert "16" in str(info.value) and "32" in str(info.value)
        assert spy.calls == 0 and gw.spent == 0 and len(gw.history) == 0


def test_bad_budget_and_policy_at_construction(pums):
    df, schema = pums
    for budget in (0, -1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(dpgate.InvalidRequirement):
            dpgate.Gateway(df, schema, budget=budget)
    with pytest.raises(dpgate.InvalidRequirement):
        dpgate.Gateway(df, schema, budget=1.0, policy="greedy")
