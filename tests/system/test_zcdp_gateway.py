"""A gateway in zCDP mode (``privacy="zcdp"``, issue 31): ρ budget, ε at δ, ledgers, front ends, coverage."""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import warnings

import numpy as np
import pandas as pd
import pytest
from _coverage import assert_covers

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.errors import BudgetExhausted, InvalidArgument, InvalidRequirement, LedgerError
from dpgate.plan.zcdp import epsilon_of, rho_of

SCHEMA = {"tables": {"t": {"columns": {"x": {"type": "integer", "min": 0, "max": 3},
                                       "g": {"type": "categorical", "values": ["a", "b"]}}}}}


def _frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"x": rng.integers(0, 4, n), "g": rng.choice(["a", "b"], n)})


def _gw(**kw) -> dpgate.Gateway:
    kw.setdefault("budget", 0.5)
    kw.setdefault("privacy", "zcdp")
    kw.setdefault("seed", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dpgate.Gateway(_frame(), SCHEMA, **kw)


def _ask(gw: dpgate.Gateway, sql: str, accuracy: float) -> dpgate.Result:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gw.query(sql, accuracy=accuracy)


def test_spent_is_rho_and_states_epsilon_at_delta() -> None:
    gw = _gw()
    assert gw.privacy == "zcdp" and gw.unit == "ρ" and gw.budget == 0.5
    r1 = _ask(gw, "SELECT COUNT(*) FROM t WHERE x < 2", 20)
    r2 = _ask(gw, "SELECT COUNT(*) FROM t WHERE x >= 2", 20)
    a = r1.answer
    assert a.rho_spent is not None and a.rho_spent > 0
    # one Laplace release of scale b on a count: ρ = (1/b)²/2
    rec = gw.ledger.records()[0]
    assert rec.cost_after == pytest.approx((rec.alpha**2) / 2, rel=1e-12)
    assert r1.rho_spent == pytest.approx(rec.alpha**2 / 2, rel=1e-12)
    # disjoint: the second adds nothing to the max over cells
    assert r2.rho_spent == pytest.approx(0.0, abs=1e-12) and gw.spent == pytest.approx(r1.rho_spent)
    assert gw.remaining == pytest.approx(0.5 - gw.spent)
    assert gw.spent_as(1e-6) == pytest.approx(epsilon_of(gw.spent, 1e-6))
    assert r1.epsilon_spent == pytest.approx(epsilon_of(r1.rho_spent, 1e-6))
    assert "privacy=zcdp" in repr(gw) and "budget ρ" in gw._repr_html_()


def test_pure_mode_is_unchanged() -> None:
    gw = _gw(privacy="pure", budget=1.0)
    r = _ask(gw, "SELECT COUNT(*) FROM t WHERE x < 2", 20)
    assert gw.privacy == "pure" and r.rho_spent is None and r.answer.rho_spent is None
    assert gw.spent_as(1e-6) == gw.spent == pytest.approx(r.epsilon_spent)
    assert "privacy" not in repr(gw)


def test_zcdp_releases_gaussian_noise_with_normal_intervals() -> None:
    gw = _gw(budget=5.0)
    r = _ask(gw, "SELECT COUNT(*) FROM t WHERE x < 2", 20)
    g = _ask(gw, "SELECT g, COUNT(*) FROM t GROUP BY g", 15)
    recs = gw.ledger.records()
    assert {rec.noise for rec in recs} == {"discrete_gaussian"}
    rec = recs[0]
    assert rec.scale == pytest.approx(rec.sensitivity / rec.alpha, rel=1e-12)  # σ = S/α
    # one fresh release alone: normal of deviation σ, widened by the lattice step
    a = r.answer
    z = 1.959963984540054
    assert a.posterior.law.halfwidth(0.95) == pytest.approx(z * rec.scale + rec.lattice, rel=1e-9)
    assert a.high - a.value <= 20 * (1 + 1e-9)
    assert all(x.high - x.value <= 15 * (1 + 1e-9) for x in g.answers)
    # the same accuracy costs less ρ than pure mode's ε²/2 would (Gaussian: σ = 20/1.96 vs b = 20/ln 20)
    pure = _gw(privacy="pure", budget=5.0)
    p = _ask(pure, "SELECT COUNT(*) FROM t WHERE x < 2", 20)
    assert r.rho_spent < p.epsilon_spent**2 / 2


def test_budget_as_epsilon_delta_pair_is_converted() -> None:
    gw = _gw(budget=(1.0, 1e-6))
    assert gw.budget == rho_of(1.0, 1e-6) and gw.budget_as(1e-6) <= 1.0


@pytest.mark.parametrize("budget", [0, -0.5, math.inf, math.nan, (1.0,), (1.0, 0.0), (1.0, 1.5), (0.0, 1e-6),
                                    (1.0, 1e-6, 2), "0.5"])
def test_bad_zcdp_budgets_are_refused(budget: object) -> None:
    with pytest.raises(InvalidRequirement):
        _gw(budget=budget)


def test_bad_privacy_and_pair_to_pure_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="privacy"):
        _gw(privacy="renyi")
    with pytest.raises(InvalidRequirement, match="zcdp"):
        _gw(privacy="pure", budget=(1.0, 1e-6))
    with pytest.raises(InvalidRequirement, match="δ"):
        _gw().spent_as(0.0)


def test_exhausted_rho_spends_nothing() -> None:
    gw = _gw(budget=1e-4)
    with pytest.raises(BudgetExhausted):
        _ask(gw, "SELECT COUNT(*) FROM t", 5)
    assert gw.spent == 0.0 and not gw.ledger.records()


def test_explain_quotes_rho_and_epsilon_beside_it() -> None:
    gw = _gw()
    q = gw.explain("SELECT COUNT(*) FROM t WHERE x = 1", accuracy=20)
    rows = q.to_pandas()
    assert rows["output"].iloc[-1].startswith("(as ε at δ=1e-06)")
    assert q.epsilon_at_delta == pytest.approx(epsilon_of(q.epsilon))
    assert "ρ =" in repr(q)
    r = _ask(gw, "SELECT COUNT(*) FROM t WHERE x = 1", 20)
    assert r.rho_spent == pytest.approx(q.epsilon)


def test_ledger_keeps_its_accounting(tmp_path) -> None:
    path = str(tmp_path / "z.db")
    gw = _gw(ledger=path)
    _ask(gw, "SELECT COUNT(*) FROM t", 30)
    spent = gw.spent
    gw.close()
    again = _gw(ledger=path)
    assert again.spent == pytest.approx(spent) and again.privacy == "zcdp"
    again.close()
    with pytest.raises(LedgerError, match="privacy='zcdp'"):
        _gw(ledger=path, privacy="pure")
    assert dpgate.ledger.Ledger.open_existing(path).privacy == "zcdp"
    pure_path = str(tmp_path / "p.db")
    _gw(ledger=pure_path, privacy="pure", budget=0.5).close()
    with pytest.raises(LedgerError, match="ε²/2-zCDP"):
        _gw(ledger=pure_path)


def test_a_zcdp_header_cannot_be_edited_into_pure(tmp_path) -> None:
    path = str(tmp_path / "z.db")
    _gw(ledger=path).close()
    con = sqlite3.connect(path)
    con.execute("DROP TRIGGER IF EXISTS dpgate_meta_no_delete")
    con.execute("DELETE FROM dpgate_meta WHERE key = 'privacy'")
    con.commit()
    con.close()
    with pytest.raises(LedgerError):
        _gw(ledger=path, privacy="pure")


def test_dbapi_and_accessor_take_privacy() -> None:
    with dpgate.connect(_frame(), schema=SCHEMA, budget=0.5, privacy="zcdp", seed=2, accuracy=30) as conn:
        assert conn.gateway.privacy == "zcdp"
        cur = conn.cursor()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cur.execute("SELECT COUNT(*) FROM t")
        assert cur.fetchone()[0] > 0 and 0 < conn.spent < 0.5
    df = _frame(seed=5)
    df.dp.configure(schema=SCHEMA, budget=0.25, privacy="zcdp", seed=3)
    assert df.dp.gateway.privacy == "zcdp" and df.dp.budget == 0.25


def test_cli_query_privacy_zcdp(tmp_path) -> None:
    from click.testing import CliRunner

    from dpgate.cli import cli

    data = tmp_path / "t.csv"
    _frame().to_csv(data, index=False)
    schema = tmp_path / "s.yaml"
    schema.write_text(json.dumps(SCHEMA))
    out = CliRunner().invoke(cli, ["query", "--data", str(data), "--schema", str(schema), "--budget", "0.5",
                                   "--privacy", "zcdp", "--accuracy", "30", "--json", "SELECT COUNT(*) FROM t"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output[out.output.index("{"):])
    assert doc["privacy"] == "zcdp" and doc["rho_charged"] > 0 and doc["spent"] == pytest.approx(doc["rho_charged"])


# --------------------------------------------------------------------------- brute force on a small domain

def _cells_of(query: LinearQuery, gw: dpgate.Gateway) -> np.ndarray:
    """The query's weight on each of the 8 cells (x, g), evaluated on a one-row-per-cell frame."""
    from dpgate.release.cube import Cube

    cells = list(itertools.product(range(4), ["a", "b"]))
    out = []
    for x, g in cells:
        cube = Cube(pd.DataFrame({"x": [x], "g": [g]}), gw.schema)
        (num,) = cube.true_numerators([query])
        out.append(num / query.denominator - query.offset if hasattr(query, "offset") else num / query.denominator)
    return np.array(out, dtype=float)


def test_recorded_rho_is_the_brute_force_privacy_loss() -> None:
    """Enumerate every neighbour (one row added in one of the 8 cells): the exact zCDP loss of the
    releases (``Σ (α h·Δx / S)²/2``: the Gaussian's Rényi divergence at every order, the ρ of each
    Laplace release's ε-DP) is at most the recorded charge, which it attains."""
    gw = _gw(budget=10.0)
    for sql, acc in [("SELECT COUNT(*) FROM t WHERE x < 2", 20), ("SELECT g, COUNT(*) FROM t GROUP BY g", 15),
                     ("SELECT COUNT(*) FROM t WHERE x = 1 AND g = 'a'", 10), ("SELECT SUM(x) FROM t", 40),
                     ("SELECT COUNT(*) FROM t WHERE x >= 1", 12)]:
        _ask(gw, sql, acc)
    records = gw.ledger.records()
    losses = np.zeros(8)
    for r in records:
        h = _cells_of(LinearQuery.from_json(r.query), gw)
        losses += (r.alpha * np.abs(h) / r.sensitivity) ** 2 / 2
    assert gw.spent >= losses.max() * (1 - 1e-12)
    assert gw.spent == pytest.approx(losses.max(), rel=1e-9)


# --------------------------------------------------------------------------- coverage

@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_coverage_of_fresh_and_history_intervals_over_200_gateways(confidence: float) -> None:
    df = _frame(600, seed=9)
    truth = {"lo": int((df.x < 2).sum()), "hi": int((df.x >= 2).sum()), "all": len(df)}
    hits: dict[str, list[bool]] = {"fresh": [], "history": []}
    for seed in range(200):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gw = dpgate.Gateway(df, SCHEMA, budget=5.0, privacy="zcdp", seed=1000 + seed)
            a = gw.query("SELECT COUNT(*) FROM t WHERE x < 2", accuracy=20, confidence=confidence).answer
            b = gw.query("SELECT COUNT(*) FROM t WHERE x >= 2", accuracy=20, confidence=confidence).answer
            c = gw.query("SELECT COUNT(*) FROM t", accuracy=40, confidence=confidence).answer
            d = gw.query("SELECT COUNT(*) FROM t WHERE x < 2", accuracy=30, confidence=confidence).answer
            e = gw.query("SELECT COUNT(*) FROM t", accuracy=60, confidence=confidence).answer
        for ans, key in ((a, "lo"), (b, "hi"), (c, "all"), (d, "lo"), (e, "all")):
            hits[ans.source].append(ans.low <= truth[key] <= ans.high)
    assert_covers(hits, confidence, at_least=50)
    assert len(hits["history"]) >= 200  # the re-asks came from history


def test_convert_ledger_charges_pure_releases_as_rho(tmp_path) -> None:
    path = str(tmp_path / "p.db")
    pure = _gw(ledger=path, privacy="pure", budget=2.0)
    _ask(pure, "SELECT COUNT(*) FROM t WHERE x < 2", 20)
    _ask(pure, "SELECT COUNT(*) FROM t WHERE x < 3", 20)
    alphas = [r.alpha for r in pure.ledger.records()]
    pure.close()
    with pytest.raises(LedgerError, match="convert_ledger=True"):
        _gw(ledger=path)
    with pytest.raises(InvalidArgument):
        _gw(ledger=path, convert_ledger="yes")
    gw = _gw(ledger=path, convert_ledger=True, budget=0.3)
    assert gw.privacy == "zcdp" and gw.budget == 0.3
    assert gw.spent == pytest.approx(sum(a**2 / 2 for a in alphas), rel=1e-9)  # cells x < 2 hold both
    before = gw.spent
    r = _ask(gw, "SELECT COUNT(*) FROM t WHERE x = 3", 20)
    assert gw.spent >= before and gw.ledger.records()[-1].cost_after == pytest.approx(gw.spent)
    assert r.rho_spent is not None
    after = gw.spent
    gw.close()
    again = _gw(ledger=path, budget=0.3)  # now a zCDP ledger: no switch needed, ρ budget kept
    assert again.spent == pytest.approx(after)
    again.close()
    with pytest.raises(LedgerError, match="budget"):
        _gw(ledger=path, budget=0.4)
    with pytest.raises(LedgerError, match="'zcdp'"):
        _gw(ledger=path, privacy="pure", budget=2.0)
    assert dpgate.ledger.Ledger.open_existing(path).budget == 0.3


def test_a_conversion_cannot_be_edited(tmp_path) -> None:
    path = str(tmp_path / "p.db")
    _gw(ledger=path, privacy="pure", budget=2.0).close()
    _gw(ledger=path, convert_ledger=True, budget=0.3).close()
    con = sqlite3.connect(path)
    con.execute("DROP TRIGGER IF EXISTS dpgate_meta_no_update")
    con.execute("UPDATE dpgate_meta SET value = '3.0' WHERE key = 'converted_budget'")
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="conversion"):
        _gw(ledger=path, budget=3.0)


def test_cli_budget_of_a_zcdp_ledger_states_rho_and_epsilon(tmp_path) -> None:
    from click.testing import CliRunner

    from dpgate.cli import cli

    path = str(tmp_path / "z.db")
    gw = _gw(ledger=path)
    _ask(gw, "SELECT COUNT(*) FROM t", 30)
    spent = gw.spent
    gw.close()
    out = CliRunner().invoke(cli, ["budget", "--ledger", path, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["privacy"] == "zcdp" and doc["spent"] == pytest.approx(spent)
    assert doc["epsilon_spent"] == pytest.approx(epsilon_of(spent))
    text = CliRunner().invoke(cli, ["budget", "--ledger", path]).output
    assert "zCDP" in text


def test_sqlalchemy_url_takes_privacy(tmp_path) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    data = tmp_path / "t.csv"
    _frame().to_csv(data, index=False)
    schema = tmp_path / "s.yaml"
    schema.write_text(json.dumps(SCHEMA))
    engine = sqlalchemy.create_engine(f"dpgate:///{data}?schema={schema}&budget=0.5&privacy=zcdp&accuracy=30&seed=1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with engine.connect() as con:
            assert con.exec_driver_sql("SELECT COUNT(*) FROM t").scalar() > 0
            assert con.connection.dbapi_connection.gateway.privacy == "zcdp"
    engine.dispose()


def test_refusals_state_rho() -> None:
    gw = _gw(budget=1e-4)
    with pytest.raises(BudgetExhausted, match="needs ρ = "):
        _ask(gw, "SELECT COUNT(*) FROM t", 5)
