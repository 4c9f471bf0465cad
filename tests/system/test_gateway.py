"""End-to-end tests of ``dpgate.Gateway`` on the embedded PUMS sample.

What is checked (issue 4, "Acceptance" and "Pitfalls"):

* a session of more than 50 mixed queries: repeated, rephrased and implied
  queries come from history at zero cost, and ``gw.spent`` equals the per-cell
  formula of Xiao & Xiong, "Bayesian Inference under Differential Privacy"
  (2012), Theorem 5.5, recomputed here, independently of the
  gateway's own bookkeeping, from ``gw.history`` alone;
* a GROUP BY query costs like one query (its groups are disjoint);
* a query that history does not determine is never answered from history
  (the biased pseudo-inverse pitfall);
* a ledger is bound to its data and schema, restores spent and history on
  reopening, and records whether the noise was secure.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from _gateway_worker import independent_spent

import dpgate

PAPER_EXTRA = 1.0 / 1024  # dpgate.plan.decide.paper_scale: lattice margin added to ln(1/δ)


# --------------------------------------------------------------------------- helpers


def paper_alpha(sensitivity: float, accuracy: float, confidence: float) -> float:
    """Xiao & Xiong (2012), Theorem 5.3: α = S·ln(1/δ)/ε, with dpgate's 1/1024 lattice margin."""
    return sensitivity * (math.log(1.0 / (1.0 - confidence)) + PAPER_EXTRA) / accuracy


# --------------------------------------------------------------------------- the session

# (sql, accuracy, expectation) — expectation "history" means: must be answered from
# history at zero cost; "fresh" means: history cannot answer; None: either is fine.
SESSION: list[tuple[str, float, str | None]] = [
    # Counts with predicates; repeats and rephrasings of the same count.
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 25, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 25, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age <= 29", 25, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 0 AND 29", 30, "history"),
    ("SELECT COUNT(*) FROM pums WHERE NOT (age >= 30)", 25, "history"),
    ("SELECT COUNT(*) FILTER (WHERE age < 30) FROM pums", 25, "history"),
    ("SELECT SUM(CASE WHEN age < 30 THEN 1 ELSE 0 END) FROM pums", 40, "history"),
    ("select count(*) from PUMS where 30 > age", 25, "history"),
    # Linear combinations of a released count (constants do not change sensitivity).
    ("SELECT 2 * COUNT(*) - 10 FROM pums WHERE age < 30", 50, "history"),
    # Disjoint parts of the non-NULL ages ...
    ("SELECT COUNT(*) FROM pums WHERE age >= 30 AND age < 50", 25, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE age >= 50", 25, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 49", 25, "history"),
    # ... imply their unions and their total.
    ("SELECT COUNT(*) FROM pums WHERE age >= 30", 45, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age < 30 OR age >= 50", 45, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age < 50", 45, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age IS NOT NULL", 60, "history"),
    ("SELECT COUNT(age) FROM pums", 60, "history"),
    ("SELECT COUNT(*) - COUNT(*) FILTER (WHERE age >= 50) FROM pums WHERE age IS NOT NULL", 45, "history"),
    # A GROUP BY: two disjoint groups, the declared keys '0' and '1' ...
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 30, "fresh"),
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 30, "history"),
    ("SELECT COUNT(*) FROM pums WHERE sex = '1'", 30, "history"),
    ("SELECT COUNT(*) FROM pums WHERE sex = 1", 30, "history"),
    ("SELECT COUNT(*) FROM pums WHERE sex IN ('0', '1')", 50, "history"),
    # ... rows with a NULL or undeclared sex are in no group (pums.yaml declares neither) ...
    ("SELECT COUNT(*) FROM pums WHERE sex IS NULL", 30, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE sex NOT IN ('0', '1')", 30, "fresh"),
    # ... together the four parts imply the total row count.
    ("SELECT COUNT(*) FROM pums", 75, "history"),
    ("SELECT COUNT(*) AS n FROM pums", 75, "history"),
    # A 16-group GROUP BY and sums of its groups.
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 30, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE educ BETWEEN 9 AND 12", 70, "history"),
    ("SELECT COUNT(*) FROM pums WHERE educ IN (13, 14)", 50, "history"),
    ("SELECT COUNT(*) FROM pums WHERE educ = 9 OR educ = 12", 50, "history"),
    ("SELECT COUNT(*) FROM pums WHERE educ < 5", 70, "history"),
    ("SELECT SUM(educ) FROM pums", 2500, "history"),
    ("SELECT SUM(CASE WHEN educ >= 13 THEN 1 ELSE 0 END) FROM pums", 70, "history"),
    # SUMs and multi-column outputs.
    ("SELECT SUM(educ) FROM pums WHERE age < 30", 600, "fresh"),
    ("SELECT SUM(educ) FROM pums WHERE age < 30", 600, "history"),
    ("SELECT SUM(CASE WHEN age < 30 THEN educ ELSE 0 END) FROM pums", 600, "history"),
    ("SELECT SUM(educ) FILTER (WHERE age <= 29) FROM pums", 700, "history"),
    ("SELECT COUNT(*) AS n, SUM(educ) AS s FROM pums WHERE age < 30", 600, None),
    ("SELECT SUM(married::int) FROM pums", 30, None),
    ("SELECT COUNT(*) FROM pums WHERE married", 30, "history"),
    ("SELECT COUNT(*) FROM pums WHERE married = TRUE", 30, "history"),
    # Compound predicates across columns.
    ("SELECT COUNT(*) FROM pums WHERE age < 30 AND married", 20, None),
    ("SELECT COUNT(*) FROM pums WHERE married AND age < 30", 20, "history"),
    ("SELECT COUNT(*) FROM pums WHERE race IN ('1', '2') AND sex = '0'", 25, None),
    ("SELECT COUNT(*) FROM pums WHERE sex = '0' AND race IN ('2', '1')", 25, "history"),
    ("SELECT married, COUNT(*) FROM pums WHERE age >= 50 GROUP BY married", 25, None),
    ("SELECT COUNT(*) FROM pums WHERE age >= 50 AND married", 25, "history"),
    # Income: a binned-by-predicate numeric column with 500 002 unit cells.
    ("SELECT COUNT(*) FROM pums WHERE income < 25000", 25, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE income >= 25000 AND income < 50000", 25, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE income < 50000", 45, "history"),
    ("SELECT COUNT(*) FROM pums WHERE income BETWEEN 0 AND 49999", 45, "history"),
    # Tighter requirements on released queries need (a top-up of) budget.
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 12, "fresh"),
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 12, "history"),
    ("SELECT COUNT(*) FROM pums WHERE age < 30", 25, "history"),
]


@pytest.fixture(scope="module")
def session(pums):
    """Run SESSION once on a fresh gateway and keep everything observed."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=20.0, seed=20240)
    steps = []
    for sql, acc, expect in SESSION:
        spent0, n0 = gw.spent, len(gw.history)
        res = gw.query(sql, accuracy=acc, confidence=0.95)
        steps.append(dict(sql=sql, acc=acc, expect=expect, res=res, spent0=spent0, spent1=gw.spent,
                          n0=n0, n1=len(gw.history)))
    # Parameterised queries (PEP 249 placeholders) go through the same pipeline.
    for cut, expect in ((30, "history"), (50, "history"), (40, "fresh"), (40, "history")):
        spent0, n0 = gw.spent, len(gw.history)
        res = gw.query("SELECT COUNT(*) FROM pums WHERE age < ?", accuracy=45 if cut != 40 else 25,
                       params=[cut])
        steps.append(dict(sql=f"age < ? [{cut}]", acc=None, expect=expect, res=res, spent0=spent0,
                          spent1=gw.spent, n0=n0, n1=len(gw.history)))
    yield gw, steps
    gw.close()


def test_session_is_long_and_mixed(session):
    gw, steps = session
    assert len(steps) >= 50
    sources = [a.source for s in steps for a in s["res"].answers]
    assert sources.count("history") >= 25 and sources.count("fresh") >= 10


@pytest.mark.parametrize("i", range(len(SESSION) + 4))
def test_session_step(session, i):
    gw, steps = session
    s = steps[i]
    res = s["res"]
    for a in res.answers:
        assert a.source in ("history", "fresh")
        assert a.meets_requirement
        # A count's interval is clipped at 0; its (unbiased) value may be below it.
        assert a.low <= a.value <= a.high or a.value < a.low == 0.0
        if s["acc"] is not None:
            assert a.high - a.value <= s["acc"] * (1 + 1e-9)
            assert a.value - a.low <= s["acc"] * (1 + 1e-9)
        assert a.posterior is not None and a.posterior.mean() == pytest.approx(a.unbiased)
        assert a.value == pytest.approx(a.posterior.support.clip(a.unbiased))
    if s["expect"] == "history":
        assert {a.source for a in res.answers} == {"history"}, s["sql"]
        assert all(a.epsilon_spent == 0 for a in res.answers)
        assert res.epsilon_spent == 0
        assert s["spent1"] == s["spent0"]
        assert s["n1"] == s["n0"], "an answer from history must not release anything"
    elif s["expect"] == "fresh":
        assert any(a.source == "fresh" for a in res.answers), s["sql"]
        assert s["n1"] > s["n0"]
    # Whatever the source: the statement's cost is the increase of the system cost.
    # (The gateway rounds reported increases to multiples of 1e-12 to break ties.)
    assert res.epsilon_spent == pytest.approx(s["spent1"] - s["spent0"], abs=1e-11)
    assert res.epsilon_spent == pytest.approx(sum(a.epsilon_spent for a in res.answers), abs=1e-11)


def test_repeated_answers_are_identical(session):
    """Asking again returns the same released estimate (post-processing, no new noise)."""
    gw, steps = session
    first = steps[0]["res"].answer
    for s in steps[1:6]:
        assert s["res"].answer.value == pytest.approx(first.value, abs=1e-9)
    g1, g2 = steps[18]["res"].answers, steps[19]["res"].answers
    assert [a.group for a in g1] == [a.group for a in g2]
    assert [a.value for a in g1] == pytest.approx([a.value for a in g2], abs=1e-9)
    # 2·COUNT − 10 is the same affine function of the released count.
    assert steps[8]["res"].answer.value == pytest.approx(2 * first.value - 10, abs=1e-9)


def test_spent_matches_independent_per_cell_formula(session, pums):
    gw, steps = session
    _, schema = pums
    h = gw.history
    assert len(h) > 0
    assert gw.spent == pytest.approx(independent_spent(h, schema), rel=1e-12, abs=1e-12)
    # The ledger's running cost is the same formula after each record.
    for n in range(1, len(h) + 1):
        assert h["cost_after"].iloc[n - 1] == pytest.approx(independent_spent(h.iloc[:n], schema), rel=1e-9, abs=1e-12)
    # The total charged equals the sum of what each answer reported.
    charged = sum(s["res"].epsilon_spent for s in steps)
    assert charged == pytest.approx(gw.spent, rel=1e-9, abs=1e-10)
    assert gw.remaining == pytest.approx(gw.budget - gw.spent)
    # Per-cell accounting is far below the sum of all α (sequential composition).
    assert gw.spent < h["alpha"].sum()


def test_no_measurement_above_papers_alpha(session):
    """The minimal policy never charges a statement more than Theorem 5.3's α for it."""
    gw, steps = session
    for s in steps:
        if s["acc"] is None:
            continue
        for a in s["res"].answers:
            if a.source == "fresh":
                # At the confidence the interval is planned at (above 0.95 by δ-spending, dpgate.plan.asks).
                assert a.epsilon_spent <= paper_alpha(a.query.sensitivity, s["acc"], a.interval_confidence) * (1 + 1e-9)


def test_probability_is_free(session):
    gw, _ = session
    spent, n = gw.spent, len(gw.history)
    p = gw.probability("SELECT COUNT(*) FROM pums WHERE age < 30", low=0, high=1000)
    assert 0.99 < p <= 1.0
    p_half = gw.probability("SELECT COUNT(*) FROM pums WHERE age < 30", high=gw.query(
        "SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25).answer.value)
    assert p_half == pytest.approx(0.5, abs=0.02)
    with pytest.raises(dpgate.NotEstimable):
        gw.probability("SELECT COUNT(*) FROM pums WHERE age < 35", low=0)
    assert gw.spent == spent and len(gw.history) == n


@pytest.mark.parametrize("policy", ["minimal", "paper"])
def test_repeat_is_free_after_unrelated_releases(pums, policy):
    """A fresh answer meets its requirement, so asking it again is free — also after
    releases on other cells refine the atoms (history rows orthogonal to the query)."""
    df, schema = pums
    with dpgate.Gateway(df, schema, budget=5.0, seed=1, policy=policy) as gw:
        first = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25).answer
        assert first.meets_requirement and first.halfwidth <= 25 * (1 + 1e-9)
        groups = gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=30).answers
        for a in groups:
            assert a.source == "fresh"
            assert a.meets_requirement, f"fresh answer {a.group} has half-width {a.halfwidth!r} > 30"
        spent, n = gw.spent, len(gw.history)
        for sql, acc in (("SELECT COUNT(*) FROM pums WHERE sex = '1'", 30),
                         ("SELECT COUNT(*) FROM pums WHERE sex = '0'", 30),
                         ("SELECT COUNT(*) FROM pums WHERE age < 30", 25)):
            a = gw.query(sql, accuracy=acc).answer
            assert a.source == "history", f"{sql} at ±{acc} was charged again"
        assert gw.spent == spent and len(gw.history) == n


# --------------------------------------------------------------------------- GROUP BY cost


@pytest.mark.parametrize("policy", ["paper", "minimal"])
@pytest.mark.parametrize(
    "group_sql, one_sql",
    [
        ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", "SELECT COUNT(*) FROM pums WHERE educ = 5"),
        ("SELECT sex, married, COUNT(*) FROM pums GROUP BY sex, married",
         "SELECT COUNT(*) FROM pums WHERE sex = '1' AND married"),
        ("SELECT race, SUM(educ) FROM pums GROUP BY race", "SELECT SUM(educ) FROM pums WHERE race = '3'"),
    ],
)
def test_group_by_costs_like_one_query(pums, policy, group_sql, one_sql):
    df, schema = pums
    acc = 30.0 if "COUNT" in one_sql else 400.0
    with dpgate.Gateway(df, schema, budget=1.0, seed=1, policy=policy) as g1:
        one = g1.query(one_sql, accuracy=acc).answer.epsilon_spent
    with dpgate.Gateway(df, schema, budget=1.0, seed=1, policy=policy) as g2:
        res = g2.query(group_sql, accuracy=acc)
        spent = g2.spent
        n_groups = len(res.answers)
        h = g2.history
    assert n_groups >= 4
    assert {a.source for a in res.answers} == {"fresh"}
    assert res.epsilon_spent == pytest.approx(spent, abs=1e-11)
    # One query's cost (the max over disjoint groups), not the sum over groups.
    assert spent == pytest.approx(one, rel=1e-9)
    assert spent <= 1.001 * paper_alpha(res.answers[0].query.sensitivity, acc, res.answers[0].interval_confidence)
    assert h["alpha"].sum() > 0.9 * n_groups * one  # each group was measured ...
    assert spent < h["alpha"].sum() / 3  # ... but charged once
    assert spent == pytest.approx(independent_spent(h, schema), rel=1e-12)


def test_rows_per_individual_scales_every_charge(pums):
    """With ``max_rows_per_individual = k`` one person's rows may sit in k cells: k·max B."""
    df, schema = pums
    spec = schema.to_dict()
    spec["tables"]["pums"]["max_rows_per_individual"] = 3
    schema3 = dpgate.Schema.from_dict(spec)
    sqls = [("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 30), ("SELECT COUNT(*) FROM pums WHERE age < 30", 25)]
    spent = []
    for sch in (schema, schema3):
        with dpgate.Gateway(df, sch, budget=5.0, seed=4, policy="paper") as gw:
            for sql, acc in sqls:
                gw.query(sql, accuracy=acc)
            spent.append(gw.spent)
            assert gw.spent == pytest.approx(independent_spent(gw.history, sch), rel=1e-12)
    assert spent[1] == pytest.approx(3 * spent[0], rel=1e-12)


def test_spent_sums_over_tables(pums, nettrace):
    """Tables are charged independently and summed (a person may be in every table)."""
    pdf, pschema = pums
    ndf, nschema = nettrace
    schema = dpgate.Schema.from_dict({"tables": {**pschema.to_dict()["tables"], **nschema.to_dict()["tables"]}})
    with dpgate.Gateway({"pums": pdf, "nettrace": ndf}, schema, budget=2.0, seed=3, policy="paper") as gw:
        a = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
        b = gw.query("SELECT COUNT(*) FROM nettrace WHERE value < 10", accuracy=25)
        c = gw.query("SELECT COUNT(*) FROM nettrace WHERE value >= 10", accuracy=25)  # disjoint cells: free
        assert a.epsilon_spent > 0 and b.epsilon_spent > 0 and c.epsilon_spent == pytest.approx(0, abs=1e-12)
        assert gw.spent == pytest.approx(a.epsilon_spent + b.epsilon_spent, rel=1e-9)
        assert gw.spent == pytest.approx(independent_spent(gw.history, schema), rel=1e-12)
        assert set(gw.history["table"]) == {"pums", "nettrace"}


# --------------------------------------------------------------------------- pitfall: estimability


@pytest.mark.parametrize("policy", ["minimal", "paper"])
def test_non_estimable_query_is_never_answered_from_history(pums, policy):
    """History of age<30 and age<40 says nothing unbiased about age<35."""
    df, schema = pums
    q30 = "SELECT COUNT(*) FROM pums WHERE age < 30"
    q40 = "SELECT COUNT(*) FROM pums WHERE age < 40"
    q35 = "SELECT COUNT(*) FROM pums WHERE age < 35"
    with dpgate.Gateway(df, schema, budget=10.0, seed=7, policy=policy) as gw:
        gw.query(q30, accuracy=10)
        gw.query(q40, accuracy=10)
        # Any finite interval is a claim; even a very loose one must not come from history.
        with pytest.raises(dpgate.NotEstimable):
            gw.probability(q35, low=0, high=1000)
        n = len(gw.history)
        a = gw.query(q35, accuracy=1e6).answer
        assert a.source == "fresh"
        assert len(gw.history) > n  # something new was measured
        # And with a usable requirement the answer is near the truth, not a biased blend.
        b = gw.query(q35, accuracy=10).answer
        truth = int((df["age"] < 35).sum())
        assert abs(b.value - truth) < 60


def test_non_estimable_without_budget_is_unavailable(pums):
    """With allow_partial and no budget left, a non-estimable query is "unavailable"
    (value NaN, infinite interval), never a biased number from history."""
    df, schema = pums
    q30 = "SELECT COUNT(*) FROM pums WHERE age < 30"
    q40 = "SELECT COUNT(*) FROM pums WHERE age < 40"
    q35 = "SELECT COUNT(*) FROM pums WHERE age < 35"
    with dpgate.Gateway(df, schema, budget=10.0, seed=7, policy="paper") as probe:
        probe.query(q30, accuracy=10)
        probe.query(q40, accuracy=10)
        exact_budget = probe.spent
    with dpgate.Gateway(df, schema, budget=exact_budget, seed=7, policy="paper") as gw:
        gw.query(q30, accuracy=10)
        gw.query(q40, accuracy=10)
        assert gw.remaining <= 1e-12
        n = len(gw.history)
        a = gw.query(q35, accuracy=1e6, allow_partial=True).answer
        assert a.source == "unavailable"
        assert math.isnan(a.value) and a.low == -math.inf and a.high == math.inf
        assert not a.meets_requirement and a.epsilon_spent == 0
        with pytest.raises(dpgate.BudgetExhausted, match="does not determine"):
            gw.query(q35, accuracy=1e6)
        assert len(gw.history) == n


@pytest.mark.parametrize("policy", ["minimal", "paper"])
def test_non_estimable_on_nonzero_histogram_cells(nettrace, policy):
    """NETTRACE's queried cells hold many units, so a biased answer would show."""
    df, schema = nettrace
    v = df["value"]
    with dpgate.Gateway(df, schema, budget=10.0, seed=11, policy=policy) as gw:
        gw.query("SELECT COUNT(*) FROM nettrace WHERE value < 1000", accuracy=50)
        gw.query("SELECT COUNT(*) FROM nettrace WHERE value < 3000", accuracy=50)
        gw.query("SELECT COUNT(*) FROM nettrace WHERE value >= 500 AND value < 2000", accuracy=50)
        # Atoms A1=[0,500) A2=[500,1000) A3=[1000,2000) A4=[2000,3000): history is
        # A1+A2, A1+A2+A3+A4 and A2+A3; none of these lies in its span.
        for sql in ("SELECT COUNT(*) FROM nettrace WHERE value < 2000",
                    "SELECT COUNT(*) FROM nettrace WHERE value >= 1000 AND value < 2000",
                    "SELECT COUNT(*) FROM nettrace WHERE value < 500",
                    "SELECT COUNT(*) FROM nettrace WHERE value >= 500 AND value < 3000"):
            with pytest.raises(dpgate.NotEstimable):
                gw.probability(sql, low=0)
        a = gw.query("SELECT COUNT(*) FROM nettrace WHERE value < 2000", accuracy=1e7).answer
        assert a.source == "fresh"
        # Determined: 1000..2999 = (<3000) − (<1000).
        a = gw.query("SELECT COUNT(*) FROM nettrace WHERE value BETWEEN 1000 AND 2999", accuracy=200).answer
        assert a.source == "history"
        truth = int(((v >= 1000) & (v < 3000)).sum())
        assert abs(a.value - truth) < 1000


# --------------------------------------------------------------------------- ledger binding


def _session(gw):
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
    gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=30)
    gw.query("SELECT SUM(educ) FROM pums WHERE age < 30", accuracy=500)


def test_ledger_rejects_changed_data_or_schema(pums, tmp_path):
    df, schema = pums
    path = tmp_path / "l.db"
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path, seed=1, policy="paper") as gw:
        _session(gw)
        n = len(gw.history)
    changed = df.copy()
    changed.loc[17, "age"] = int(changed.loc[17, "age"]) + 1
    with pytest.raises(dpgate.LedgerError):
        dpgate.Gateway(changed, schema, budget=1.0, ledger=path)
    dropped = df.drop(index=3)
    with pytest.raises(dpgate.LedgerError):
        dpgate.Gateway(dropped, schema, budget=1.0, ledger=path)
    spec = schema.to_dict()
    spec["tables"]["pums"]["columns"]["age"]["max"] = 99
    with pytest.raises(dpgate.LedgerError):
        dpgate.Gateway(df, dpgate.Schema.from_dict(spec), budget=1.0, ledger=path)
    with pytest.raises(dpgate.LedgerError):
        dpgate.Gateway(df, schema, budget=2.0, ledger=path)
    # The failed opens changed nothing.
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path) as gw:
        assert len(gw.history) == n


def test_ledger_reopens_on_same_data_from_csv(pums, tmp_path):
    df, schema = pums
    path = tmp_path / "l.db"
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path, seed=1, policy="paper") as gw:
        _session(gw)
        a = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25).answer
        spent, hist = gw.spent, gw.history
    csv = tmp_path / "pums.csv"
    df.sample(frac=1.0, random_state=0).to_csv(csv, index=False)  # shuffled rows, plain int64 dtypes
    again = pd.read_csv(csv)
    with dpgate.Gateway(again, schema, budget=1.0, ledger=path, seed=2, policy="paper") as gw2:
        assert gw2.spent == spent
        pd.testing.assert_frame_equal(gw2.history, hist)
        b = gw2.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25).answer
        # The same estimator from the same records; rebuilt in one pass (a GROUP BY's releases
        # split the atoms at once), so equal up to floating-point rounding.
        assert b.source == "history"
        assert (b.value, b.low, b.high) == pytest.approx((a.value, a.low, a.high), rel=1e-12)
        assert gw2.spent == spent and len(gw2.history) == len(hist)


def test_secure_by_default_and_seed_marked_insecure(pums, tmp_path):
    df, schema = pums
    with dpgate.Gateway(df, schema, budget=1.0, ledger=tmp_path / "secure.db", policy="paper") as gw:
        _session(gw)
        assert gw.history["secure"].tolist() == [True] * len(gw.history)
    with dpgate.Gateway(df, schema, budget=1.0, ledger=tmp_path / "seeded.db", seed=5, policy="paper") as gw:
        _session(gw)
        n = len(gw.history)
        assert gw.history["secure"].tolist() == [False] * n
    # A secure-source gateway reopening a seeded ledger keeps the old records marked.
    with dpgate.Gateway(df, schema, budget=1.0, ledger=tmp_path / "seeded.db", policy="paper") as gw:
        gw.query("SELECT COUNT(*) FROM pums WHERE age >= 60", accuracy=25)
        assert gw.history["secure"].tolist() == [False] * n + [True]


def test_seeded_sessions_are_reproducible(pums):
    df, schema = pums
    vals = []
    for _ in range(2):
        with dpgate.Gateway(df, schema, budget=1.0, seed=99, policy="paper") as gw:
            _session(gw)
            vals.append(gw.history["value"].tolist())
    assert vals[0] == vals[1]
    with dpgate.Gateway(df, schema, budget=1.0, seed=100, policy="paper") as gw:
        _session(gw)
        assert gw.history["value"].tolist() != vals[0]


def test_compiled_statements_are_reused_per_text_and_parameters(pums):
    """A repeat reuses its compilation; other parameters, or values equal but of another type, do not."""
    df, schema = pums
    gw = dpgate.Gateway(df, schema, budget=1.0, seed=1)
    sql = "SELECT COUNT(*) FROM pums WHERE age < ?"
    a = gw.compile(sql, [30])
    assert gw.compile(sql, [30]) is a
    for other in ([31], [30.5]):
        assert gw.compile(sql, other).queries != a.queries
    assert gw.compile(sql, [30.0]) is not a  # same value, another type: compiled on its own
    assert gw.compile(sql, [30.0]).queries == a.queries
    with pytest.raises(dpgate.ProgrammingError):
        gw.compile("SET dpgate.accuracy = 5")
    gw.close()
