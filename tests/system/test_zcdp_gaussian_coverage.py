"""Coverage of a zCDP gateway's Gaussian intervals (issue 31) from a mixed history: a pure-ε ledger
(discrete Laplace releases) converted with ``convert_ledger=True``, then Gaussian releases; fresh
answers and answers that combine both families, at 0.8/0.95/0.99 over 200 seeded gateways each."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from _coverage import assert_covers

import dpgate

SCHEMA = {"tables": {"t": {"columns": {"x": {"type": "integer", "min": 0, "max": 3},
                                       "g": {"type": "categorical", "values": ["a", "b"]}}}}}


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(9)
    return pd.DataFrame({"x": rng.integers(0, 4, 600), "g": rng.choice(["a", "b"], 600)})


@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_coverage_with_mixed_laplace_and_gaussian_history(confidence: float, tmp_path) -> None:
    df = _frame()
    truth = {"lo": int((df.x < 2).sum()), "all": len(df), "x0": int((df.x == 0).sum()),
             "a": int((df.g == "a").sum())}
    hits: dict[str, list[bool]] = {"fresh": [], "history": []}
    mixed = 0
    for seed in range(200):
        path = str(tmp_path / f"l{seed}.db")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pure = dpgate.Gateway(df, SCHEMA, budget=50.0, seed=5000 + seed, ledger=path)
            pure.query("SELECT COUNT(*) FROM t WHERE x < 2", accuracy=25, confidence=confidence)
            pure.query("SELECT COUNT(*) FROM t WHERE x = 0", accuracy=25, confidence=confidence)
            pure.close()
            gw = dpgate.Gateway(df, SCHEMA, budget=50.0, privacy="zcdp", convert_ledger=True,
                                seed=9000 + seed, ledger=path)
            asked = [
                (gw.query("SELECT COUNT(*) FROM t", accuracy=30, confidence=confidence).answer, "all"),
                (gw.query("SELECT COUNT(*) FROM t WHERE x < 2", accuracy=15, confidence=confidence).answer, "lo"),
                (gw.query("SELECT COUNT(*) FROM t WHERE x = 0", accuracy=40, confidence=confidence).answer, "x0"),
                (gw.query("SELECT COUNT(*) FROM t WHERE g = 'a'", accuracy=20, confidence=confidence).answer, "a"),
            ]
            noises = {r.noise for r in gw.ledger.records() if r.kind == "query"}
            gw.close()
        assert noises == {"discrete_laplace", "discrete_gaussian"}
        for ans, key in asked:
            assert ans.meets_requirement
            law = ans.posterior.law
            if law.gaussian.any() and not law.gaussian[np.abs(law.coefficients) > 0].all():
                mixed += 1
            hits[ans.source].append(ans.low <= truth[key] <= ans.high)
    assert mixed >= 200  # the tighter re-ask of x < 2 combines a Laplace and a Gaussian release
    assert_covers(hits, confidence, at_least=50)
