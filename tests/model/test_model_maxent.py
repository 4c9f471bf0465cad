"""Seed 002 §4: maximum-entropy model and synthetic data (Gateway.estimate(method="maxent"), Gateway.synthesize).

Acceptance: the synthetic table's answers to the released queries match the
released answers within their noise (|synthetic − released| ≤ 3·√(2b² + count) —
release noise plus multinomial sampling — on ≥ 95 % of them), the frame respects
the schema exactly (domains, dtypes, NULL cells; read back through the same
schema it lands in the same cells), and nothing is spent.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dpgate
import dpgate.datasets
from dpgate.model import gibbs
from dpgate.model import maxent as ME
from dpgate.release.cube import Cube
from dpgate.schema.domains import OTHER_LABEL

SCALE = 10.0


@pytest.fixture(scope="module")
def pums_history():  # type: ignore[no-untyped-def]
    df, schema = dpgate.datasets.load_pums()
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=11)
    rng = np.random.default_rng(11)
    qs = []
    for _ in range(60):
        a1, a2 = sorted(int(v) for v in rng.integers(0, 101, 2))
        e1, e2 = sorted(int(v) for v in rng.integers(1, 17, 2))
        sql = f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {a1} AND {a2} AND educ BETWEEN {e1} AND {e2}"
        qs.append(dpgate.compile_sql(sql, schema)[0])
    qs += list(dpgate.compile_sql("SELECT sex, COUNT(*) FROM pums GROUP BY sex", schema))
    values = gw.release_measurements("pums", [(q, q.sensitivity / SCALE) for q in qs])
    return gw, df, schema, qs, np.array(values)


def test_synthetic_answers_match_released_answers_within_noise(pums_history) -> None:  # type: ignore[no-untyped-def]
    gw, _, schema, qs, values = pums_history
    before, spent = len(gw.ledger.records()), gw.spent
    syn = gw.synthesize(seed=0)
    assert len(gw.ledger.records()) == before and gw.spent == spent
    assert len(syn) == 1000 and syn.attrs["dpgate"]["rows_source"].startswith("public")
    assert syn.attrs["dpgate"]["source"] == "model" and syn.attrs["dpgate"]["epsilon_spent"] == 0.0
    with Cube(syn, schema) as cube:
        got = np.array(cube.true_numerators(qs), dtype=float)
    z = np.abs(got - values) / np.sqrt(2 * SCALE**2 + np.maximum(got, 1.0))
    assert np.mean(z <= 3) >= 0.95, sorted(z)[-5:]
    # the model itself (before sampling) fits them closer than the noise
    r = gw.estimate("SELECT " + ", ".join(f"COUNT(*) FILTER (WHERE age BETWEEN {i} AND {i + 9}) AS a{i}"
                                         for i in range(0, 100, 10)) + " FROM pums", method="maxent")
    assert {a.source for a in r.answers} == {"model"} and all(a.epsilon_spent == 0 for a in r.answers)
    assert r.model["converged"] and r.model["alpha"] in ME.ALPHA_GRID
    assert sum(a.value for a in r.answers) == pytest.approx(1000 * 100 / 102, rel=0.2)


def test_synthetic_frame_respects_the_schema(pums_history) -> None:  # type: ignore[no-untyped-def]
    gw, _, schema, _, _ = pums_history
    syn = gw.synthesize(rows=3000, seed=1)
    assert list(syn.columns) == [c.name for c in schema.table("pums").columns]
    assert len(syn) == 3000 and syn.attrs["dpgate"]["rows_source"] == "argument"
    age = syn["age"].dropna()
    assert str(syn["age"].dtype) == "Int64" and age.between(0, 100).all()
    assert syn["income"].dropna().between(0, 500000).all()
    assert str(syn["married"].dtype) == "boolean"
    # pums.yaml declares no nullable column and no other: only declared values are emitted
    assert not syn.isna().any().any()
    assert set(syn["sex"]) <= {"0", "1"} and set(syn["race"]) <= {"1", "2", "3", "4", "5", "6"}
    # race was never asked about: uniform over its six declared values
    assert all(0.12 < (syn["race"] == r).mean() < 0.22 for r in "123456")
    assert gw.synthesize(rows=50, seed=1).equals(gw.synthesize(rows=50, seed=1))


def test_null_and_binned_cells_round_trip() -> None:
    schema = {"tables": {"t": {"columns": {
        "x": {"type": "numeric", "bins": [0.0, 0.5, 2.0, 10.0], "nullable": True},
        "k": {"type": "integer", "min": 0, "max": 99, "bins": [0, 10, 50, 100], "nullable": True},
        "c": {"type": "categorical", "values": ["a", "b"], "nullable": True, "other": True},
        "f": {"type": "boolean", "nullable": True},
    }}}}
    rng = np.random.default_rng(0)
    n = 400
    df = pd.DataFrame({
        "x": np.where(rng.random(n) < 0.3, np.nan, rng.uniform(0, 10, n)),
        "k": pd.array(np.where(rng.random(n) < 0.2, None, rng.integers(0, 100, n)), dtype="Int64"),
        "c": np.where(rng.random(n) < 0.25, None, rng.choice(["a", "b", "zzz"], n)),
        "f": pd.array(np.where(rng.random(n) < 0.1, None, rng.random(n) < 0.5), dtype="boolean"),
    })
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=2)
    s = dpgate.Schema.load(schema)
    qs = [*dpgate.compile_sql("SELECT x, COUNT(*) FROM t GROUP BY x", s),
          *dpgate.compile_sql("SELECT c, k, COUNT(*) FROM t GROUP BY c, k", s),
          *dpgate.compile_sql("SELECT f, COUNT(*) FROM t GROUP BY f", s)]
    vals = np.array(gw.release_measurements("t", [(q, 2.0) for q in qs]))
    syn = gw.synthesize(seed=3, alpha=1.0)
    assert syn.attrs["dpgate"]["rows_source"].startswith("estimated")
    assert abs(len(syn) - n) < 10
    x = syn["x"].dropna()
    assert ((x >= 0) & (x < 10)).all() and str(syn["k"].dtype) == "Int64"
    assert syn["k"].dropna().between(0, 99).all()
    assert set(syn["c"].dropna()) <= {"a", "b", OTHER_LABEL}
    with Cube(syn, s) as cube:
        got = np.array(cube.true_numerators(qs), dtype=float)
    # cells, NULL and <other> included, come back where the model put them (within noise)
    assert np.mean(np.abs(got - vals) <= 3 * np.sqrt(2 * 0.5**2 + np.maximum(got, 1))) >= 0.95


def test_synthesize_emits_only_declared_values() -> None:
    """Data with NULLs and undeclared categories, a schema declaring neither: the released
    answers see those rows (COUNT(*) counts them), the synthetic rows never hold them."""
    rng = np.random.default_rng(4)
    n = 300
    df = pd.DataFrame({
        "c": np.where(rng.random(n) < 0.3, None, rng.choice(["a", "b", "zzz"], n)),
        "k": pd.array(np.where(rng.random(n) < 0.3, None, rng.integers(0, 5, n)), dtype="Int64"),
    })
    schema = {"tables": {"t": {"columns": {
        "c": {"type": "categorical", "values": ["a", "b"]}, "k": {"type": "integer", "min": 0, "max": 4}}}}}
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=5)
    s = dpgate.Schema.load(schema)
    qs = [*dpgate.compile_sql("SELECT COUNT(*) FROM t", s),
          *dpgate.compile_sql("SELECT COUNT(*) FROM t WHERE c IS NULL OR k IS NULL", s),
          *dpgate.compile_sql("SELECT c, k, COUNT(*) FROM t GROUP BY c, k", s)]
    gw.release_measurements("t", [(q, 2.0) for q in qs])
    for method in ({}, {"solver": "sgd"}):
        syn = gw.synthesize(rows=400, seed=6, **method)
        assert len(syn) == 400 and not syn.isna().any().any()
        assert (syn.attrs["dpgate"].get("sampler") == "gibbs") == bool(method)
        assert set(syn["c"]) <= {"a", "b"} and syn["k"].between(0, 4).all()


def test_maxent_dual_is_exact_when_constraints_are_inactive() -> None:
    # Two overlapping queries over 3 atoms; large β: the Gibbs fit reproduces the answers.
    H = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    mass = np.array([0.2, 0.3, 0.5])
    fr = ME.fit(H, np.array([60.0, 70.0]), np.array([1.0, 1.0]), np.ones(2), mass, 100.0, alpha=10.0)
    assert fr.info["converged"] and fr.info["at_bound"] == 0
    assert np.allclose(fr.predict(H, mass, H), [60.0, 70.0], atol=1e-4)
    p = fr.probabilities(H, mass)
    # Gibbs form: p ∝ mass · exp(w·f)
    assert np.allclose(p / mass / (p / mass)[0], np.exp(H.T @ fr.w - (H.T @ fr.w)[0]))
    # tiny α: β → 0 and the model falls back to the prior
    flat = ME.fit(H, np.array([60.0, 70.0]), np.array([1.0, 1.0]), np.ones(2), mass, 100.0, alpha=1e-9)
    assert np.allclose(flat.probabilities(H, mass), mass, atol=1e-6)


def test_model_needs_a_row_count(pums_history) -> None:  # type: ignore[no-untyped-def]
    gw, _, _, _, _ = pums_history
    with pytest.raises(dpgate.NotEstimable, match="row count"):
        df, schema = dpgate.datasets.load_histogram("nettrace")
        g2 = dpgate.Gateway(df, schema, budget=1.0, seed=0)
        g2.release_measurements("nettrace", [(dpgate.compile_sql(
            "SELECT COUNT(*) FROM nettrace WHERE value < 100", schema)[0], 0.5)])
        g2.estimate("SELECT COUNT(*) FROM nettrace WHERE value < 50", method="maxent")
    assert math.isfinite(gw.estimate("SELECT COUNT(*) FROM pums WHERE age < 30", method="pca").answer.value)
    with pytest.raises(dpgate.InvalidRequirement, match="solver"):
        gw.estimate("SELECT COUNT(*) FROM pums WHERE age < 30", method="maxent", solver="newton")


# ----------------------------------------------------------------- stochastic fit (seed 002 §4.2)

MIXED = {"tables": {"t": {"columns": {  # NULLs and undeclared categories are declared possible
    "x": {"type": "numeric", "bins": [0.0, 0.5, 2.0, 10.0], "nullable": True},
    "k": {"type": "integer", "min": 0, "max": 99, "bins": [0, 10, 50, 100], "nullable": True},
    "c": {"type": "categorical", "values": ["a", "b"], "nullable": True, "other": True},
    "f": {"type": "boolean", "nullable": True},
}}}}
#: Laplace scale of every release in the stochastic-fit tests (answer noise sd = 4·√2).
B = 4.0
RELEASED = ["SELECT x, COUNT(*) FROM t GROUP BY x", "SELECT c, k, COUNT(*) FROM t GROUP BY c, k",
            "SELECT f, COUNT(*) FROM t GROUP BY f", "SELECT COUNT(*) FROM t WHERE k < 50 AND f",
            "SELECT COUNT(*) FROM t WHERE x < 2 AND k >= 10"]
UNSEEN = ("SELECT COUNT(*) FILTER (WHERE x < 0.5 AND c = 'a') AS p, COUNT(*) FILTER (WHERE f AND c = 'b') AS q, "
          "COUNT(*) FILTER (WHERE k >= 50 AND NOT f) AS r, COUNT(*) FILTER (WHERE x >= 2 OR x IS NULL) AS u FROM t")


@pytest.fixture(scope="module")
def mixed():  # type: ignore[no-untyped-def]
    """800 correlated rows with NULLs, binned and out-of-domain values; GROUP BYs (so, inconsistent
    partitions) and two 2-D counts released at scale B.  192 cells, 192 atoms: the exact fit is cheap."""
    rng = np.random.default_rng(0)
    n = 800
    k = rng.integers(0, 100, n)
    df = pd.DataFrame({
        "x": np.where(rng.random(n) < 0.3, np.nan, np.where(k < 50, rng.uniform(0, 2, n), rng.uniform(0, 10, n))),
        "k": pd.array(np.where(rng.random(n) < 0.2, None, k), dtype="Int64"),
        "c": np.where(rng.random(n) < 0.25, None, np.where(k < 30, "a", rng.choice(["a", "b", "zzz"], n))),
        "f": pd.array(np.where(rng.random(n) < 0.1, None, rng.random(n) < np.where(k < 50, 0.3, 0.7)),
                      dtype="boolean"),
    })
    gw = dpgate.Gateway(df, MIXED, budget=1e6, seed=2)
    schema = dpgate.Schema.load(MIXED)
    qs = [q for sql in RELEASED for q in dpgate.compile_sql(sql, schema)]
    values = np.array(gw.release_measurements("t", [(q, q.sensitivity / B) for q in qs]))
    return gw, schema, qs, values


@pytest.mark.parametrize("prior", ["auto", "uniform"])
def test_sgd_fit_agrees_with_the_exact_fit(mixed, prior) -> None:  # type: ignore[no-untyped-def]
    # Same objective (Theorem 6's dual), same α, prior and row count: the stochastic fit's
    # Monte Carlo answers must match the exact fit's to within
    #   3 · (their own Monte Carlo standard error, batch means over 1024 chains)
    #   + SGD_TOL · b (its convergence test: every released answer within half a Laplace
    #     scale of the KKT conditions; the exact fit is at 1e-7).
    # The bound on released answers follows from KKT (free answers: |p[f] − π| ≤ tol for
    # both fits); unreleased ones (UNSEEN) have no such bound and are held to it empirically.
    # Measured (cv_seed=0): max |Δ| = 3.6 (auto) / 2.3 (uniform) counts for MC se ≤ 1.3,
    # rms 1.6 / 1.0 — against a tolerance of ≈ 5.9 and answers whose noise sd is 5.7;
    # over cv_seed 0–7 the largest |Δ| was 3.9 and the smallest margin 1.45.
    gw, _, _, _ = mixed
    opts = dict(method="maxent", alpha=1.0, folds=2, prior=prior)
    exact = [gw.estimate(sql, solver="exact", **opts) for sql in [*RELEASED, UNSEEN]]
    sgd = [gw.estimate(sql, solver="sgd", **opts) for sql in [*RELEASED, UNSEEN]]
    assert exact[0].model["solver"] == "exact" and sgd[0].model["solver"] == "sgd"
    assert sgd[0].model["converged"] and sgd[0].model["chains"] == gibbs.SGD_CHAINS
    ex = np.array([a.value for r in exact for a in r.answers])
    sg = np.array([a.value for r in sgd for a in r.answers])
    se = np.array([s for r in sgd for s in r.model["mc_stderr"]])
    assert len(ex) == len(sg) == len(se) == 29 and np.all((se >= 0) & (se < 2))  # 0: a NULL group the model empties
    assert np.all(np.abs(sg - ex) <= 3 * se + gibbs.SGD_TOL * B), np.round(np.abs(sg - ex) - 3 * se, 2)
    assert np.sqrt(np.mean((sg - ex) ** 2)) <= B / 2
    # the Monte Carlo error widens the heuristic band
    a, s = sgd[-1].answers[0], sgd[-1].model["mc_stderr"][0]
    rmse = sgd[-1].model["cv_rmse"]
    assert a.high - a.value == pytest.approx(1.959964 * math.hypot(rmse, s), rel=1e-5)


def test_beyond_max_atoms_the_fit_is_stochastic_and_free(mixed) -> None:  # type: ignore[no-untyped-def]
    gw, _, _, _ = mixed
    spent, released = gw.spent, len(gw.history)
    r = gw.estimate(UNSEEN, method="maxent", max_atoms=5, alpha=1.0, folds=2)  # 192 atoms > 5: no refusal
    assert r.model["solver"] == "sgd" and r.model["atoms"] == 192 and r.model["mc_samples"] > 0
    assert {a.source for a in r.answers} == {"model"} and r.epsilon_spent == 0
    assert all(a.epsilon_spent == 0 and not a.meets_requirement and a.posterior is None for a in r.answers)
    assert all(math.isfinite(a.value) and a.low < a.value < a.high for a in r.answers)
    syn = gw.synthesize(seed=3, max_atoms=5, alpha=1.0, folds=2)
    meta = syn.attrs["dpgate"]
    assert meta["source"] == "model" and meta["epsilon_spent"] == 0.0 and meta["sampler"] == "gibbs"
    assert meta["solver"] == "sgd" and meta["rows_source"].startswith("estimated") and abs(len(syn) - 800) < 30
    assert gw.spent == spent and len(gw.history) == released
    again = dict(rows=50, seed=1, max_atoms=5, alpha=1.0, folds=2)
    assert gw.synthesize(**again).equals(gw.synthesize(**again))


def test_gibbs_rows_respect_the_schema(mixed) -> None:  # type: ignore[no-untyped-def]
    gw, schema, qs, values = mixed
    syn = gw.synthesize(rows=2000, seed=4, max_atoms=5, alpha=1.0, folds=2)
    assert list(syn.columns) == ["x", "k", "c", "f"] and len(syn) == 2000
    x = syn["x"].dropna()
    assert str(syn["x"].dtype) == "float64" and ((x >= 0) & (x < 10)).all()
    assert str(syn["k"].dtype) == "Int64" and syn["k"].dropna().between(0, 99).all()
    assert set(syn["c"].dropna()) <= {"a", "b", OTHER_LABEL} and str(syn["f"].dtype) == "boolean"
    assert 0.1 < syn["x"].isna().mean() < 0.5 and 0.05 < syn["k"].isna().mean() < 0.4
    assert 0.05 < (syn["c"] == OTHER_LABEL).mean() < 0.3
    with Cube(syn, schema) as cube:  # read back through the schema: cells, NULL and <other> included
        got = np.array(cube.true_numerators(qs), dtype=float) * 800 / 2000
    assert np.mean(np.abs(got - values) <= 3 * np.sqrt(2 * B**2 + np.maximum(got, 1))) >= 0.95
