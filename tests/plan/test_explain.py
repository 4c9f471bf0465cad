"""Gateway.explain / EXPLAIN SELECT: the quote is free and equals what the next identical query charges."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
import dpgate.datasets

QUERIES = [
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 10),
    ("SELECT sex, COUNT(*), SUM(educ) FROM pums GROUP BY sex", 20),
    ("SELECT COUNT(*) FROM pums WHERE age < 30 AND sex = '1'", 10),
    ("SELECT married, AVG(age) AS a FROM pums GROUP BY married", 5),
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 10),  # a repeat: free
    ("SELECT STDDEV(age) FROM pums", 5),
    ("SELECT AVG(educ), STDDEV(educ) FROM pums", 5),  # equal components (COUNT, SUM) measured once
    # Outside the atoms (wide weights): disjoint groups are charged on disjoint cells.
    ("SELECT sex, SUM(age) FROM pums GROUP BY sex", 200),
    ("SELECT married, SUM(age) FROM pums WHERE sex = 1 GROUP BY married", 150),
    ("SELECT race, SUM(age), COUNT(*) FROM pums GROUP BY race", 300),
    ("SELECT sex, SUM(age) FROM pums GROUP BY sex", 100),  # a top-up of its repeats
]


_PUMS = dpgate.datasets.load_pums()


@pytest.fixture
def gw():
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        g = dpgate.Gateway(df, schema, budget=50.0, seed=11)
        yield g


def test_quote_equals_the_charge_and_costs_nothing(gw):
    for sql, acc in QUERIES:
        spent, n_hist = gw.spent, len(gw.history)
        quote = gw.explain(sql, accuracy=acc, confidence=0.9)
        again = gw.explain(sql, accuracy=acc, confidence=0.9)
        assert gw.spent == spent and len(gw.history) == n_hist  # explain is free and leaves no trace
        assert again.quotes == quote.quotes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dpgate.Warning)
            res = gw.query(sql, accuracy=acc, confidence=0.9)
        assert res.epsilon_spent == pytest.approx(quote.epsilon, abs=1e-12, rel=0)
        # The ledger's cost rises by exactly the charge, for queries outside the atoms too.
        assert gw.spent - spent == pytest.approx(quote.epsilon, abs=1e-12, rel=0)
        assert gw.history["cost_after"].max() == pytest.approx(gw.spent, abs=1e-12, rel=0)
        assert len(quote.quotes) == len(res.answers)
        for q, a in zip(quote.quotes, res.answers, strict=True):
            assert (q.output, q.group) == (a.label, a.group)
            assert q.increase == pytest.approx(a.epsilon_spent, abs=1e-12, rel=0)
            assert q.epsilon >= q.increase - 1e-12 and q.remaining >= 0.0  # its own charge; never negative
            assert q.source == a.source
            if a.components:  # a derived output: its interval depends on the released values
                assert math.isnan(q.halfwidth) and "SUM(x − " in q.note
            else:  # the certified half-width, before the answer's interval is cut at 0 (dpgate.answer.result)
                lo, hi = a.posterior.certified_interval(a.interval_confidence)
                assert q.halfwidth == pytest.approx((hi - lo) / 2, rel=1e-9)
        assert quote.remaining <= gw.remaining + 1e-12
    assert gw.explain(*QUERIES[0][:1], accuracy=10, confidence=0.9).free


def test_quote_over_budget_and_refusals(gw):
    e = gw.explain("SELECT COUNT(*) FROM pums", accuracy=1e-4)
    assert not e.affordable and e.remaining < 0 and "over budget" in repr(e)
    assert e.quotes[0].remaining == 0.0 and "over budget" in e.quotes[0].note  # shown as 0, never negative
    grouped = gw.explain("SELECT race, COUNT(*) FROM pums GROUP BY race", accuracy=1e-3)
    assert all(r[6] == 0.0 for r in grouped.rows()) and "would be refused" in grouped.rows()[-1][7]
    with pytest.raises(dpgate.BudgetExhausted):
        gw.query("SELECT COUNT(*) FROM pums", accuracy=1e-4)
    with pytest.raises(dpgate.UnsupportedQuery):
        gw.explain("SELECT MIN(age) FROM pums", accuracy=5)
    with pytest.raises(dpgate.InvalidRequirement):
        gw.explain("SELECT COUNT(*) FROM pums")
    model = gw.explain("/*+ dpgate method=pca */ SELECT COUNT(*) FROM pums")
    assert model.free and model.quotes[0].source == "model"
    assert gw.spent == 0 and gw.history.empty
    df = e.to_pandas()
    assert list(df.columns) == list(dpgate.plan.explain.COLUMNS) and "<table" in e._repr_html_()


def test_explain_select_on_the_dbapi():
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        conn = dpgate.connect(df, schema=schema, budget=5.0, accuracy=10, seed=2)
        cur = conn.cursor()
        cur.execute("/*+ dpgate accuracy=20 */ EXPLAIN SELECT sex, COUNT(*) FROM pums GROUP BY sex")
        assert [d[0] for d in cur.description] == list(dpgate.plan.explain.COLUMNS)
        rows = cur.fetchall()
        assert conn.spent == 0 and conn.history.empty
        total = rows.pop()  # the statement's total, after the groups
        assert total[:3] == ("(statement)", "", "fresh") and "total" in total[7]
        quoted = total[3]
        assert {r[2] for r in rows} == {"fresh"} and all(r[4] == pytest.approx(20) or r[4] < 20 for r in rows)
        # Each group shows what its own cells are charged; disjoint groups share it: the total is one charge.
        assert [r[3] for r in rows] == pytest.approx([quoted, quoted]) and rows[1][6] == total[6]
        cur.execute("/*+ dpgate accuracy=20 */ SELECT sex, COUNT(*) FROM pums GROUP BY sex")
        assert conn.spent == pytest.approx(quoted, abs=1e-12)
        cur.execute("explain  SELECT COUNT(*) FROM pums")
        assert cur.fetchone()[2] == "fresh"
        with pytest.raises(dpgate.UnsupportedQuery, match="EXPLAIN ANALYZE"):
            cur.execute("EXPLAIN ANALYZE SELECT COUNT(*) FROM pums")


# (statement, a typical accuracy): counts, held sums, and sums outside the atoms, with and without GROUP BY.
_STATEMENTS = [
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 10),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 60", 10),
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 10),
    ("SELECT race, COUNT(*) FROM pums WHERE age >= 40 GROUP BY race", 10),
    ("SELECT SUM(educ) FROM pums", 50),
    ("SELECT SUM(age) FROM pums", 300),
    ("SELECT sex, SUM(age) FROM pums GROUP BY sex", 200),
    ("SELECT race, SUM(age), COUNT(*) FROM pums GROUP BY race", 300),
    ("SELECT married, SUM(age) FROM pums WHERE age < 50 GROUP BY married", 150),
    ("SELECT educ, SUM(age) FROM pums WHERE educ < 5 GROUP BY educ", 200),
]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(_STATEMENTS), st.sampled_from([0.5, 1.0, 2.0, 4.0]),
                          st.sampled_from(["minimal", "paper"])), min_size=2, max_size=5))
def test_budget_invariant_charge_equals_quote_equals_ledger(statements):
    """For any sequence of statements: Result.epsilon_spent == the quote == the rise of gw.spent."""
    df, schema = _PUMS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1e6, seed=5)
        for (sql, acc), factor, policy in statements:
            spent = gw.spent
            quote = gw.explain(sql, accuracy=acc * factor, confidence=0.9, policy=policy)
            res = gw.query(sql, accuracy=acc * factor, confidence=0.9, policy=policy)
            assert res.epsilon_spent == pytest.approx(quote.epsilon, abs=1e-12, rel=0)
            assert gw.spent - spent == pytest.approx(res.epsilon_spent, abs=1e-12, rel=0)
