"""AVG, VAR and STDDEV: compiled into linear components, answered with honest Bonferroni intervals."""

from __future__ import annotations

import math
import warnings

import duckdb
import numpy as np
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.answer.combine import mean_range, variance_range
from dpgate.compile.derived import has_derived


@pytest.fixture(scope="module")
def pums():
    df, schema = dpgate.datasets.load_pums()
    con = duckdb.connect()
    con.register("pums", df)
    yield df, schema, con
    con.close()


def _gateway(con, schema, seed, budget=1e6):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        return dpgate.Gateway(con, schema, budget=budget, seed=seed)


def test_avg_and_stddev_cover_the_truth_over_independent_repetitions(pums):
    """200 fresh gateways (independent seeds): the stated 95 % intervals must cover the truth at
    least 95 % − 3 SE of the time (the Bonferroni box is conservative, so usually far more)."""
    df, schema, con = pums
    truth = {"a": df.age.mean(), "s": df.age.std()}  # a STDDEV interval is the root of VAR's
    reps, hits = 200, dict.fromkeys(truth, 0)
    for seed in range(reps):
        gw = _gateway(con, schema, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dpgate.Warning)
            res = gw.query("SELECT AVG(age) AS a, STDDEV(age) AS s FROM pums",
                           accuracy=10, confidence=0.95)
        for ans in res.answers:
            hits[ans.label] += ans.low <= truth[ans.label] <= ans.high
            assert ans.low <= ans.value <= ans.high and ans.confidence == 0.95
    se = math.sqrt(0.95 * 0.05 / reps)
    for name, h in hits.items():
        assert h / reps >= 0.95 - 3 * se, (name, h)


def test_avg_income_group_by_sex(pums):
    df, schema, con = pums
    gw = _gateway(con, schema, seed=3)
    res = gw.query("SELECT sex, AVG(income) AS m, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY m DESC",
                   accuracy=5)
    out = res.to_pandas()
    assert list(out.columns[:2]) == ["sex", "m"] and "n" in out.columns
    by_sex = {a.group[0][1]: a for a in res.answers if a.label == "m"}
    for key, mean in df.groupby("sex").income.mean().items():
        a = by_sex[str(key)]
        assert a.low <= mean <= a.high and 0 <= a.low <= a.high <= 500_000
        assert [c.query.label for c in a.components] == ["__dpgate_part1_n", "__dpgate_part1_s"]
        assert a.posterior is None and a.query is None
    assert out["m"].is_monotonic_decreasing  # ORDER BY the derived output
    assert res.epsilon_spent == pytest.approx(sum(a.epsilon_spent for a in res.answers))


def test_filter_position_and_repeat_is_free(pums):
    df, schema, con = pums
    gw = _gateway(con, schema, seed=4)
    sql = "SELECT sex, AVG(age) FILTER (WHERE married) FROM pums GROUP BY 1"
    first = gw.query(sql, accuracy=5)
    spent = gw.spent
    again = gw.query(sql, accuracy=5)
    assert gw.spent == spent and again.epsilon_spent == 0
    assert {a.source for a in again.answers} == {"history"}
    truth = df[df.married == 1].groupby("sex").age.mean()
    by_sex = {a.group[0][1]: a for a in first.answers}
    for key, mean in truth.items():
        assert by_sex[str(key)].low <= mean <= by_sex[str(key)].high


def test_components_are_reused_from_history(pums):
    """AVG after its components were released at the same requirement costs nothing: COUNT(age)
    and the sum centred on the middle of age's declared range, SUM(age − 50), in rows (÷ 50)."""
    _, schema, con = pums
    gw = _gateway(con, schema, seed=5)
    # In one statement: AVG re-asks both components, and a component released before the other would
    # have a newer estimate since, a second interval at a higher level (dpgate.plan.asks).
    gw.query("SELECT COUNT(age), SUM(age - 50) / 50 FROM pums", accuracy=5, confidence=0.975)
    spent = gw.spent
    res = gw.query("SELECT AVG(age) FROM pums", accuracy=5, confidence=0.95)
    assert res.answer.source == "history" and gw.spent == spent


def test_derived_outputs_have_no_posterior_and_refuse_probability(pums):
    _, schema, con = pums
    gw = _gateway(con, schema, seed=6)
    with pytest.raises(dpgate.UnsupportedQuery, match="no posterior"):
        gw.probability("SELECT AVG(age) FROM pums", 40, 50)
    with pytest.raises(dpgate.UnsupportedQuery, match="SUM\\(x\\) and COUNT\\(x\\)"):
        gw.estimate("SELECT VAR(age) FROM pums")
    with pytest.raises(dpgate.UnsupportedQuery, match="whole output columns"):
        gw.query("SELECT AVG(age) * 2 FROM pums", accuracy=5)
    assert gw.spent == 0 and gw.history.empty


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 100), min_size=2, max_size=40),
    st.floats(0, 50), st.floats(0, 50), st.floats(0, 5000), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1),
)
def test_box_ranges_contain_the_truth(xs, ws, wn, wq, fs, fn, fq):
    """Whenever every component's truth lies in its box, the derived truth lies in the range."""
    x = np.array(xs, dtype=float)
    n, s, q = len(x), float(x.sum()), float((x * x).sum())

    def box(v, w, f):  # any interval containing v
        return v - w * f, v + w * (1 - f)

    bn, bs, bq = box(n, wn, fn), box(s, ws, fs), box(q, wq, fq)
    lo, hi = mean_range(bs, bn, (0.0, 100.0))
    assert lo - 1e-9 <= x.mean() <= hi + 1e-9
    for sample, truth in ((False, x.var()), (True, x.var(ddof=1))):
        lo, hi = variance_range(bq, bs, bn, (0.0, 100.0), sample=sample)
        assert lo - 1e-6 * (1 + truth) <= truth <= hi + 1e-6 * (1 + truth)


def test_compile_splits_derived_outputs_into_components(pums):
    _, schema, _ = pums
    stmt = dpgate.compile.compile_statement(
        "SELECT sex, COUNT(*) AS n, VAR_POP(age) FILTER (WHERE married) AS v FROM pums GROUP BY 1 ORDER BY v",
        schema)
    assert [o.name for o in stmt.outputs] == ["sex", "n", "v"]
    assert [(d.kind, d.parts) for d in stmt.derived] == [("linear", (0,)), ("var_pop", (1, 2, 3))]
    n_groups = len(stmt.group_keys)
    assert len(stmt.queries) == 4 * n_groups and stmt.postprocess.order_by[0].startswith('"v"')
    count, total, squares = stmt.queries[1:4]
    # centred on the middle of age's range, 0..100: SUM(age − 50) and SUM((age − 50)²)
    assert (count.sensitivity, total.sensitivity, squares.sensitivity) == (1.0, 50.0, 2500.0)
    assert stmt.derived[1].centre == 50 and stmt.derived[1].ranges[0] == (-50.0, 50.0)
    plain = dpgate.compile_sql("SELECT SUM((age - 50) * (age - 50)) FILTER (WHERE married) FROM pums "
                               "WHERE sex = '0'", schema)[0]
    assert squares == plain
    assert has_derived(sqlglot.parse_one("SELECT MEAN(x) FROM t")) and not has_derived(sqlglot.parse_one("SELECT 1"))
    with pytest.raises(dpgate.UnsupportedQuery, match="refers to an aggregate"):
        dpgate.compile_sql("SELECT AVG(age), sex FROM pums GROUP BY 1", schema)
    with pytest.raises(dpgate.UnsupportedQuery, match="exactly one argument"):
        dpgate.compile_sql("SELECT AVG(*) FROM pums", schema)


def test_equal_components_of_one_statement_are_measured_once() -> None:
    """AVG and STDDEV of one column share COUNT and SUM: together they cost what STDDEV costs alone,
    record its three releases, and AVG is read from the same components."""
    import warnings

    from dpgate.datasets import load_pums

    df, schema = load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        alone = dpgate.Gateway(df, schema, budget=50.0, seed=4)
        both = dpgate.Gateway(df, schema, budget=50.0, seed=4)
        sd = alone.query("SELECT STDDEV(age) FROM pums", accuracy=10)
        res = both.query("SELECT AVG(age) AS m, STDDEV(age) AS s FROM pums", accuracy=10)
    assert res.epsilon_spent == pytest.approx(sd.epsilon_spent, abs=1e-12)
    assert both.spent == pytest.approx(alone.spent, abs=1e-12) and len(both.history) == len(alone.history) == 3
    m, s = res.answers
    assert (s.value, s.low, s.high) == (sd.answer.value, sd.answer.low, sd.answer.high)
    assert [c.value for c in m.components] == [c.value for c in s.components[:2]]
    # Each release is charged once, to the output planned first (AVG): the charges add up to the total.
    charged = [c.epsilon_spent for c in (*m.components, *s.components)]
    assert sum(charged) == pytest.approx(res.epsilon_spent, abs=1e-12) and charged[2:4] == [0.0, 0.0]
