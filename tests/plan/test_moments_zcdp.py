"""Moment histories of a zCDP gateway (``dpgate.plan._moments`` with Gaussian releases, issue 31).

* a zCDP gateway answers a wide SUM from every earlier wide release over its column (the union
  of two groups of a GROUP BY, free), not only from its exact repeats, and that answer is the
  BLUE of the Gaussian releases (here the sum of the two groups' values);
* those intervals cover: over 200 seeded zCDP gateways, the groups, the union of two (from
  history) and of three groups (history topped up by a fresh release) each hold the pandas truth
  at least ``confidence − 3·SE`` of the time; and so do they over 200 gateways whose moment history
  mixes discrete Laplace releases (a pure ledger converted with ``convert_ledger=True``) and
  Gaussian ones, answered with the mixed (Gil-Pelaez) law.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _coverage import assert_covers

import dpgate


def _truth(df, where=None, column="income"):  # type: ignore[no-untyped-def]
    values = df[column].clip(0, 500_000)
    return float(values[where].sum() if where is not None else values.sum())


def test_zcdp_history_answers_a_wide_query_from_other_wide_releases(pums) -> None:  # type: ignore[no-untyped-def]
    df, schema = pums
    warnings.simplefilter("ignore")
    gw = dpgate.Gateway(df, schema, budget=1e6, seed=3, privacy="zcdp")
    groups = gw.query("SELECT race, SUM(income) FROM pums GROUP BY race", accuracy=2e6, confidence=0.95)
    assert not any(a.isolated for a in groups.answers)
    by_race = {str(dict(a.group)["race"]): a for a in groups.answers}
    spent = gw.spent
    (u,) = gw.query("SELECT SUM(income) FROM pums WHERE race IN ('1', '2')", accuracy=4e6, confidence=0.95).answers
    assert u.source == "history" and not u.isolated and gw.spent == spent
    assert u.value == pytest.approx(by_race["1"].value + by_race["2"].value, rel=1e-9)
    law = u.posterior.law
    assert law.gaussian[np.abs(law.coefficients) > 0].all()
    sd = math.sqrt(law.variance)
    assert abs(u.value - _truth(df, df["race"].astype(str).isin(["1", "2"]))) <= 5 * sd
    avg = gw.query("SELECT race, AVG(income) FROM pums GROUP BY race", accuracy=20, confidence=0.95)
    assert not any(x.isolated for x in avg.answers)
    gw.close()


def test_coverage_of_zcdp_wide_answers_from_history(pums) -> None:  # type: ignore[no-untyped-def]
    """200 zCDP sessions: a GROUP BY race of SUM(income), the union of two groups (from history)
    and of three (history plus a fresh release)."""
    df, schema = pums
    warnings.simplefilter("ignore")
    conf = 0.8
    union_where = df["race"].astype(str).isin(["1", "2"])
    three_where = df["race"].astype(str).isin(["1", "2", "3"])
    hits: dict[str, list[bool]] = {"group": [], "union": [], "three": []}
    sources: dict[str, set[str]] = {k: set() for k in hits}
    races = sorted(df["race"].astype(str).unique())
    for seed in range(200):
        gw = dpgate.Gateway(df, schema, budget=1e9, seed=seed, privacy="zcdp")
        groups = gw.query("SELECT race, SUM(income) FROM pums GROUP BY race", accuracy=3e6, confidence=conf)
        for ans in groups.answers:
            key = str(dict(ans.group)["race"])
            if key in races:
                hits["group"].append(ans.low <= _truth(df, df["race"].astype(str) == key) <= ans.high)
        (u,) = gw.query("SELECT SUM(income) FROM pums WHERE race IN ('1', '2')", accuracy=6e6,
                        confidence=conf).answers
        hits["union"].append(u.low <= _truth(df, union_where) <= u.high)
        sources["union"].add(u.source)
        (t,) = gw.query("SELECT SUM(income) FROM pums WHERE race IN ('1', '2', '3')", accuracy=3e6,
                        confidence=conf).answers
        hits["three"].append(t.low <= _truth(df, three_where) <= t.high)
        sources["three"].add(t.source)
        assert np.count_nonzero(t.posterior.law.coefficients) > 1  # the groups' releases count too
        gw.close()
    assert sources["union"] == {"history"} and sources["three"] == {"fresh"}
    assert_covers(hits, conf)


def test_coverage_of_wide_answers_from_a_mixed_moment_history(pums, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """200 sessions: a pure gateway releases SUM(age) by race (discrete Laplace; age's 76 weights are
    wide too, and 4× quicker per session than income's 500 002); a zCDP gateway
    on its converted ledger then answers the union of two groups (history: Laplace only) and the
    union of three, which tops the Laplace groups up with a Gaussian release (a mixed law)."""
    df, schema = pums
    warnings.simplefilter("ignore")
    conf = 0.8
    union_where = df["race"].astype(str).isin(["1", "2"])
    three_where = df["race"].astype(str).isin(["1", "2", "3"])
    hits: dict[str, list[bool]] = {"union": [], "three": []}
    mixed = 0
    for seed in range(200):
        path = str(tmp_path / f"l{seed}.db")
        pure = dpgate.Gateway(df, schema, budget=1e9, seed=4000 + seed, ledger=path)
        pure.query("SELECT race, SUM(age) FROM pums GROUP BY race", accuracy=300, confidence=conf)
        pure.close()
        gw = dpgate.Gateway(df, schema, budget=1e9, seed=8000 + seed, privacy="zcdp", convert_ledger=True,
                            ledger=path)
        (u,) = gw.query("SELECT SUM(age) FROM pums WHERE race IN ('1', '2')", accuracy=600,
                        confidence=conf).answers
        assert u.source == "history" and not u.isolated
        hits["union"].append(u.low <= _truth(df, union_where, "age") <= u.high)
        (t,) = gw.query("SELECT SUM(age) FROM pums WHERE race IN ('1', '2', '3')", accuracy=300,
                        confidence=conf).answers
        hits["three"].append(t.low <= _truth(df, three_where, "age") <= t.high)
        live = t.posterior.law.gaussian[np.abs(t.posterior.law.coefficients) > 0]
        mixed += bool(live.any() and not live.all())
        gw.close()
    assert mixed == 200
    assert_covers(hits, conf)
