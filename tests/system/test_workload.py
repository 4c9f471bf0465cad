"""The demo harness: the online workload of Xiao & Xiong, "Bayesian Inference under Differential
Privacy" (2012), eq. 73–74, the metrics of its definitions 6.1–6.3, and the demo's optional
dependencies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sqlglot

from dpgate import _demo as W
from dpgate._demo import QueryRecord, WorkloadQuery
from dpgate.errors import Error, InvalidArgument, InvalidRequirement


# -- eq. 73 ---------------------------------------------------------------------------
def test_cell_probabilities_follow_eq73_normalised():
    p = W.cell_probabilities(4096)
    assert p.shape == (4096,)
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    # ten equal cells per block, each block ten times less likely than the one before
    assert np.allclose(p[:10], p[0]) and np.allclose(p[10:20], p[10])
    assert math.isclose(p[0] / p[10], 10.0) and math.isclose(p[10] / p[20], 10.0)
    assert math.isclose(p[:10].sum(), 0.9, rel_tol=1e-9)
    assert np.all(p >= 0)


def test_region_of_interest_can_move():
    p = W.cell_probabilities(100, roi_start=50)
    assert np.argmax(p) == 50 and math.isclose(p[50:60].sum(), 0.9, rel_tol=1e-9)


# -- eq. 74 ---------------------------------------------------------------------------
def test_generate_is_pure_and_seeded():
    a = W.generate(queries=50, seed=3)
    b = W.generate(queries=50, seed=3)
    c = W.generate(queries=50, seed=4)
    assert a == b
    assert a.queries != c.queries


def test_queries_are_multinomial_with_1_to_10_trials():
    w = W.generate(n=4096, queries=4000, seed=0)
    trials = np.array([q.trials for q in w.queries])
    assert trials.min() == 1 and trials.max() == 10
    # n_t uniform on 1..10: each value ≈ 400 of 4000 (5 SE ≈ 95)
    counts = np.bincount(trials, minlength=11)[1:]
    assert np.all(np.abs(counts - 400) < 100)
    for q in w.queries[:200]:
        assert q.sensitivity == max(q.weights) and sum(q.weights) == q.trials
        assert all(isinstance(x, int) and x > 0 for x in q.weights)
    # 90 % of trials land on the first ten cells (eq. 73), 9 % on the next ten
    dense = np.sum([q.dense() for q in w.queries], axis=0)
    total = dense.sum()
    assert abs(dense[:10].sum() / total - 0.9) < 0.01
    assert abs(dense[10:20].sum() / total - 0.09) < 0.01


def test_requirements_per_setting():
    b = W.generate(queries=2000, setting="bounded", seed=1)
    u = W.generate(queries=2000, setting="unbounded", seed=1)
    assert b.budget == 1.0 and math.isinf(u.budget) and b.delta == u.delta == 0.2
    two_eps_b = np.array([2 * q.accuracy for q in b.queries])
    two_eps_u = np.array([2 * q.accuracy for q in u.queries])
    assert two_eps_b.min() >= 1 and two_eps_b.max() <= 1000
    assert two_eps_u.min() >= 50 and two_eps_u.max() <= 1000
    assert abs(two_eps_b.mean() - 500.5) < 20 and abs(two_eps_u.mean() - 525) < 20
    assert all(q.confidence == pytest.approx(0.8) for q in b.queries)
    # the settings share the query vectors (they differ only where the paper says so)
    assert [q.cells for q in b.queries] == [q.cells for q in u.queries]
    assert [q.weights for q in b.queries] == [q.weights for q in u.queries]
    assert b.tree == () and len(u.tree) == 515
    assert len(W.generate(queries=1, setting="unbounded", tree_cells=None).tree) == 8191


def test_bad_arguments():
    with pytest.raises(ValueError):
        W.generate(setting="sideways")
    with pytest.raises(ValueError):
        W.tree_nodes(100, 0.3)
    with pytest.raises(ValueError):
        WorkloadQuery(0, 10, (3, 2), (1, 1), 1.0, 0.8)
    # every refusal is a dpgate error; requirement values are InvalidRequirement
    with pytest.raises(InvalidArgument):
        W.generate(queries=-1)
    with pytest.raises(InvalidArgument):
        W.cell_probabilities(0)
    with pytest.raises(InvalidRequirement):
        WorkloadQuery(0, 10, (2, 3), (1, 1), 0.0, 0.8)
    with pytest.raises(InvalidRequirement):
        WorkloadQuery(0, 10, (2, 3), (1, 1), 1.0, 1.0)
    with pytest.raises(InvalidRequirement):
        W.tree_nodes(16, math.nan)
    with pytest.raises(InvalidRequirement):
        W.generate(delta=1.5)


# -- SQL and dense vectors ----------------------------------------------------------------
def test_sql_merges_runs_and_parses():
    q = WorkloadQuery(0, 4096, (0, 1, 2, 5, 6, 9), (3, 3, 3, 1, 2, 2), 12.5, 0.8)
    case = q.sql("nettrace")
    assert case == (
        "SELECT SUM(CASE WHEN value BETWEEN 0 AND 2 THEN 3 WHEN value = 5 THEN 1 "
        "WHEN value = 6 THEN 2 WHEN value = 9 THEN 2 ELSE 0 END) FROM nettrace"
    )
    filt = q.sql("nettrace", style="filter")
    for s in (case, filt):
        tree = sqlglot.parse_one(s, read="duckdb")
        assert tree.find(sqlglot.exp.Table).name == "nettrace"
    with pytest.raises(InvalidArgument):
        q.sql("t", style="json")


def test_sql_runs_row_by_row_to_the_dense_truth():
    """Evaluate the generated SQL in DuckDB on a small table: it equals dense · x."""
    duckdb = pytest.importorskip("duckdb")
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 5, size=64)
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT unnest(?::INTEGER[]) AS value", [np.repeat(np.arange(64), hist).tolist()])
    w = W.generate(n=64, queries=40, seed=2)
    for q in w.queries:
        want = float(q.dense() @ hist)
        assert want == q.truth(hist)
        for style in ("case", "filter"):
            got = con.execute(q.sql("t", style=style)).fetchone()[0]
            assert float(got or 0) == want, (style, q)


def test_tree_costs_every_cell_its_epsilon():
    nodes = W.tree_nodes(4096, 0.3)
    assert len(nodes) == 2 * 4096 - 1
    assert {n.level for n in nodes} == set(range(13))
    per_cell = np.zeros(4096)
    for n in nodes:
        per_cell[n.lo : n.hi + 1] += n.alpha  # S = 1, |h_j| = 1
    assert np.allclose(per_cell, 0.3)
    acc, conf = nodes[0].requirement(0.2)
    # Theorem 5.3: α = S ln(1/δ)/ε gives back the node's budget
    assert math.isclose(math.log(1 / (1 - conf)) / acc, nodes[0].alpha, rel_tol=1e-12)
    assert nodes[-1].sql("t") == "SELECT COUNT(*) FILTER (WHERE value = 4095) FROM t"
    assert nodes[0].sql("t") == "SELECT COUNT(*) FILTER (WHERE value BETWEEN 0 AND 4095) FROM t"


def test_pruned_tree_keeps_cost_and_nearly_all_information():
    """The default unbounded history keeps the nodes over the first 256 cells: those cells
    still cost exactly 0.3, and workload queries' BLUE variances barely change."""
    w = W.generate(n=4096, queries=200, setting="unbounded", seed=0)
    per_cell = np.zeros(4096)
    for n in w.tree:
        per_cell[n.lo : n.hi + 1] += n.alpha
    assert np.allclose(per_cell[:256], 0.3) and per_cell.max() == pytest.approx(0.3)
    assert max(max(q.cells) for q in w.queries) < 256

    # Same construction at n = 1024 with a 64-cell block: compare variances exactly
    # (equal scales, so Var ∝ q (HᵀH)⁻¹ qᵀ; the pruned tree's ancestors add nothing).
    def inv_gram(nodes, n):
        H = np.array([nd.dense(n)[:n] for nd in nodes])
        return np.linalg.inv(H.T @ H)

    n = 1024
    full = inv_gram(W.tree_nodes(n, 0.3), n)
    inner = [nd for nd in W.tree_nodes(n, 0.3, (0, 63)) if nd.hi <= 63]
    pruned = np.linalg.inv(np.array([nd.dense(n)[:64] for nd in inner]).T @ np.array([nd.dense(n)[:64] for nd in inner]))
    qs = W.generate(n=n, queries=200, seed=1).queries
    ratios = [float(q.dense()[:64] @ pruned @ q.dense()[:64]) / float(q.dense() @ full @ q.dense()) for q in qs]
    assert min(ratios) >= 1 - 1e-9 and max(ratios) < 1.01


# -- metrics --------------------------------------------------------------------------
def _rec(i, truth, source, value=math.nan, low=math.nan, high=math.nan, ok=True, acc=10.0, spent=0.0, eps=0.0):
    return QueryRecord(i, truth, acc, 0.8, source, value, low, high, ok, eps, spent, 0.001 * (i + 1))


def test_metrics_by_hand():
    recs = [
        _rec(0, 100, "fresh", 104, 95, 113, spent=0.2, eps=0.2),     # covers, |err| 4
        _rec(1, 50, "history", 45, 44, 46, spent=0.2),                # misses [44,46]; paper's [44, 64] covers
        _rec(2, 10, "refused", spent=0.2),                            # not answered
        _rec(3, 7, "history", 7, 6, 8, ok=False, spent=0.2),          # partial: not answered
    ]
    assert W.answering_ratio(recs) == 0.5
    assert W.system_cost(recs) == 0.2
    assert W.coverage(recs) == 0.5
    assert W.coverage_paper(recs) == 1.0
    assert W.relative_error(recs) == pytest.approx((4 / 20 + 5 / 20) / 2)
    assert W.free_share(recs) == 0.25
    assert W.coverage_se(recs) == pytest.approx(math.sqrt(0.8 * 0.2 / 2))
    s = W.summarize(recs)
    assert s["Ra"] == 0.5 and s["median_seconds"] == pytest.approx(0.0025)
    assert math.isnan(W.answering_ratio([])) and W.system_cost([]) == 0.0 and math.isnan(W.coverage(recs[2:3]))


class _FakeGateway:
    """Answers fresh at the paper's α until the budget is gone (no dpgate internals)."""

    def __init__(self, hist, budget):
        from types import SimpleNamespace

        self.hist, self.budget, self.spent, self.ns = hist, budget, 0.0, SimpleNamespace

    def query(self, sql, accuracy, confidence):
        from dpgate.errors import BudgetExhausted

        alpha = math.log(1 / (1 - confidence)) / accuracy
        if self.spent + alpha > self.budget:
            raise BudgetExhausted("out of budget", needed=alpha, remaining=self.budget - self.spent)
        self.spent += alpha
        a = self.ns(value=1.0, low=1.0 - accuracy, high=1.0 + accuracy, source="fresh",
                    meets_requirement=True, epsilon_spent=alpha)
        return self.ns(answer=a)


def test_run_records_refusals():
    w = W.generate(n=64, queries=30, seed=5)
    hist = np.ones(64, dtype=int)
    seen = []
    recs = W.run(_FakeGateway(hist, 0.05), w.queries, hist, "t", on_record=seen.append)
    assert len(recs) == 30 and seen == recs
    assert {r.source for r in recs} <= {"fresh", "refused"} and any(r.source == "refused" for r in recs)
    assert all(r.truth == q.trials for r, q in zip(recs, w.queries, strict=True))
    assert recs[-1].spent <= 0.05


# -- optional dependencies (the demo extra) -----------------------------------------------
def test_core_imports_neither_matplotlib_nor_tqdm():
    """``pip install dpgate`` has no plotting: importing the package and the CLI loads neither."""
    import subprocess
    import sys

    code = "import sys, dpgate, dpgate.cli, dpgate._demo; print(sorted({'matplotlib', 'tqdm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plot_without_matplotlib_says_what_to_install(monkeypatch, tmp_path):
    import sys

    from dpgate._demo.report import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes ``import matplotlib`` fail
    with pytest.raises(W.MissingDependency, match=r"pip install 'dpgate\[demo\]'") as info:
        plot([], str(tmp_path / "x.png"))
    assert isinstance(info.value, Error) and isinstance(info.value, ImportError)
