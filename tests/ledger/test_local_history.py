"""Local histories (dpgate.ledger._history): a statement the table's atoms cannot hold is
planned on the releases of the statements over its own columns, instead of on its exact
repeats alone.

Checked: reuse that isolation lost is found again (a GROUP BY and a range over it, past
the atoms' limit); answers and charges are the same whether the history was built live or
replayed from the ledger (local plans are applied as records, so a re-opened gateway has
the same state); the per-cell charge stays the definition's; and intervals from local
histories cover at their stated confidence over independent gateways.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest

import dpgate

VALUES = [f"v{i}" for i in range(12)]
SCHEMA = {"tables": {"t": {"columns": {
    "a": {"type": "categorical", "values": VALUES},
    "b": {"type": "categorical", "values": VALUES},
    "c": {"type": "integer", "min": 0, "max": 29},
}}}}
#: With at most 40 atoms, GROUP BY a (12 keys) then GROUP BY b multiplies past the limit.
MAX_ATOMS = 40


def frame(seed: int, n: int = 3000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.choice(VALUES, n), "b": rng.choice(VALUES, n), "c": rng.integers(0, 30, n)})


SESSION = [
    ("SELECT a, COUNT(*) FROM t GROUP BY a", 40.0),
    ("SELECT b, COUNT(*) FROM t GROUP BY b", 40.0),
    ("SELECT COUNT(*) FROM t WHERE b IN ('v1', 'v2', 'v3')", 90.0),
    ("SELECT c, COUNT(*) FROM t GROUP BY c", 30.0),
    ("SELECT b, COUNT(*) FROM t WHERE c < 10 GROUP BY b", 30.0),
    ("SELECT COUNT(*) FROM t WHERE c BETWEEN 5 AND 19", 60.0),
    ("SELECT COUNT(*) FROM t WHERE b = 'v4' AND c < 10", 40.0),
    ("SELECT b, COUNT(*) FROM t GROUP BY b", 60.0),
]


def test_reuse_past_the_atoms_limit_comes_from_the_statements_own_columns() -> None:
    df = frame(0)
    gw = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=1, max_atoms=MAX_ATOMS)
    gw.query(*SESSION[0][:1], accuracy=SESSION[0][1])
    groups = gw.query(SESSION[1][0], accuracy=SESSION[1][1])
    assert {a.source for a in groups.answers} == {"fresh"}
    assert not any(a.isolated for a in groups.answers)  # planned on the history over b alone
    spent = gw.spent
    # The sum of three released groups, at an accuracy their combined error meets: free.
    union = gw.query(SESSION[2][0], accuracy=SESSION[2][1]).answer
    assert (union.source, union.isolated, gw.spent) == ("history", False, spent)
    assert union.high - union.value <= SESSION[2][1] + 1e-9  # (coverage: test_local_intervals_cover)
    assert union.value == pytest.approx(sum(a.value for a in groups.answers if a.group[0][1] in ("v1", "v2", "v3")))
    # The same without local histories (the table's atoms only): b's groups stay outside,
    # and the union, no exact repeat of them, is measured afresh.
    bare = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=1, max_atoms=MAX_ATOMS)
    bare._history.planning_state = lambda table, qs: bare._history.state(table).refined(qs, isolate=True)  # type: ignore[method-assign]
    for sql, acc in SESSION[:2]:
        bare.query(sql, accuracy=acc)
    assert bare.query(SESSION[2][0], accuracy=SESSION[2][1]).answer.source == "fresh"


def answers(gw: dpgate.Gateway, statements: list[tuple[str, float]]) -> list[tuple[object, ...]]:
    out = []
    for sql, acc in statements:
        r = gw.query(sql, accuracy=acc)
        out.append((round(r.epsilon_spent, 12), tuple((a.source, a.isolated) for a in r.answers),
                    tuple((a.value, a.low, a.high) for a in r.answers if a.source == "history")))
    return out


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_reopened_gateway_has_the_live_ones_state(tmp_path, checkpoint: bool) -> None:
    """Local plans are never installed: both gateways apply their records the same way, so the
    next statements are decided alike and answered alike from history."""
    df = frame(1)
    (tmp_path / "live").mkdir()
    # Each ask at the stated confidence: a reopened gateway counts a query's asks afresh (dpgate.gateway._asks),
    # so under the default δ-spending its re-asks would be planned at other levels than the live one's.
    live = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=2, max_atoms=MAX_ATOMS, ledger=str(tmp_path / "live" / "l.db"),
                          reasks="independent")
    answers(live, SESSION[:5])
    if checkpoint:
        live._history.save_checkpoint(live._ledger.records())
    # A copy of the ledger (and its key, checkpoint): the two gateways must not see each other's releases.
    shutil.copytree(tmp_path / "live", tmp_path / "copy")
    reopened = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=3, max_atoms=MAX_ATOMS, ledger=str(tmp_path / "copy" / "l.db"),
                              reasks="independent")
    assert reopened.spent == live.spent
    rest = SESSION[5:] + SESSION[2:3] + [("SELECT COUNT(*) FROM t WHERE a = 'v0'", 80.0)]
    assert answers(reopened, rest) == answers(live, rest)
    assert reopened.spent == pytest.approx(live.spent, rel=1e-12)
    live.close()
    reopened.close()


def test_the_charge_is_the_per_cell_definition() -> None:
    df = frame(2)
    gw = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=4, max_atoms=MAX_ATOMS)
    for sql, acc in SESSION:
        gw.query(sql, accuracy=acc)
    table = gw.schema.table("t")
    total = np.zeros(table.n_cells)
    from dpgate.compile.query import LinearQuery
    for row in gw.history.itertuples():
        q = LinearQuery.from_json(row.query)
        total += row.alpha / row.sensitivity * np.abs(q.dense(table)).ravel()
    assert gw.spent == pytest.approx(float(total.max()), rel=1e-9)


def test_local_intervals_cover() -> None:
    """Answers planned on local histories (isolated in the table's atoms) cover at their
    confidence: over 150 independent gateways, the share of intervals holding the truth is at
    least 0.9 − 3 standard errors."""
    hits, n = 0, 0
    for seed in range(150):
        df = frame(100 + seed, n=800)
        gw = dpgate.Gateway(df, SCHEMA, budget=100.0, seed=1000 + seed, max_atoms=MAX_ATOMS)
        for sql, acc in SESSION[:3] + SESSION[4:5] + SESSION[7:]:
            r = gw.query(sql, accuracy=acc, confidence=0.9)
            truth = _truths(df, sql)
            for a in r.answers:
                key = a.group[0][1] if a.group else None
                hits += a.low <= truth.get(key, 0) <= a.high
                n += 1
    se = math.sqrt(0.9 * 0.1 / n)
    assert hits / n >= 0.9 - 3 * se, (hits, n)


def _truths(df: pd.DataFrame, sql: str) -> dict[object, int]:
    import duckdb
    con = duckdb.connect()
    con.register("t", df)
    rows = con.execute(sql).fetchall()
    return {(r[0] if len(r) > 1 else None): int(r[-1]) for r in rows}


def test_a_local_history_holds_wide_sums() -> None:
    """A SUM over a column of more than 32 values stays outside the table's atoms (it would
    multiply every later GROUP BY's atoms), but a local history over its column holds it: the
    sum over the rest of the domain is the difference of two released sums, free."""
    schema = {"tables": {"w": {"columns": {"v": {"type": "integer", "min": 0, "max": 63},
                                           "g": {"type": "categorical", "values": ["a", "b"]}}}}}
    rng = np.random.default_rng(4)
    df = pd.DataFrame({"v": rng.integers(0, 64, 2000), "g": rng.choice(["a", "b"], 2000)})
    gw = dpgate.Gateway(df, schema, budget=100.0, seed=5)
    gw.query("SELECT g, COUNT(*) FROM w GROUP BY g", accuracy=30)
    whole = gw.query("SELECT SUM(v) FROM w", accuracy=2000).answer
    assert not whole.isolated  # outside the table's atoms, planned on the local history over v
    assert gw._history.state("w").left_outside(whole.query.linear_part)
    low = gw.query("SELECT SUM(v) FROM w WHERE v < 32", accuracy=2000).answer
    assert (low.source, low.isolated) == ("fresh", False)  # planned on the local history over v
    spent = gw.spent
    high = gw.query("SELECT SUM(v) FROM w WHERE v >= 32", accuracy=5000).answer
    assert (high.source, high.isolated, gw.spent) == ("history", False, spent)
    assert high.value == pytest.approx(whole.value - low.value)


def test_a_local_history_leaves_out_what_its_atoms_could_never_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """SUM(income) has 500 001 weights, more than any atoms limit: a local history over income
    keeps it outside at once, without trying to split its atoms by them (which took seconds a
    statement and built grids until the memory budget refused unrelated statements)."""
    import dpgate.datasets
    from dpgate.plan.atoms import AtomPartition

    tried: list[int] = []
    refine = AtomPartition.refine

    def counting(self: AtomPartition, query):  # type: ignore[no-untyped-def]
        tried.append(query.numerators.size)
        return refine(self, query)

    monkeypatch.setattr(AtomPartition, "refine", counting)
    df, schema = dpgate.datasets.load_pums()
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=6)
    for sql, acc in [("SELECT sex, SUM(income) FROM pums GROUP BY sex", 2e6),
                     ("SELECT educ, SUM(income) FROM pums GROUP BY educ", 2e6),
                     ("SELECT race, sex, COUNT(*) FROM pums WHERE income > 30000 GROUP BY race, sex", 20.0),
                     ("SELECT AVG(income) FROM pums WHERE educ BETWEEN 1 AND 8", 30.0)]:
        assert gw.query(sql, accuracy=acc).answers
    assert tried and max(tried) < gw.max_atoms
