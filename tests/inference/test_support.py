"""Posteriors, intervals and values on the values a truth can take (``dpgate.inference._support``):
brute force over every table of a tiny domain, exact 0 for impossible events, and — over many
independent gateways on sparse data — coverage, calibration of ``probability`` and values inside
their own intervals (statistical honesty II, items 2 and 3)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.inference import ErrorLaw, Posterior, Support, support_of


def _query(weights: list[int], denominator: int, offset: Fraction) -> LinearQuery:
    """A query of these weights (one per cell) over a one-column table, not canonicalised."""
    return LinearQuery("t", ("v",), (tuple(range(len(weights))),), np.array(weights, dtype=np.int64), denominator,
                       offset)


@settings(max_examples=80, deadline=None)
@given(weights=st.lists(st.integers(-6, 6), min_size=1, max_size=3), denominator=st.sampled_from([1, 2, 4]),
       offset=st.integers(-3, 3), rows=st.one_of(st.none(), st.integers(0, 4)))
def test_support_holds_every_truth_of_every_table(weights: list[int], denominator: int, offset: int,
                                                  rows: int | None) -> None:
    """Brute force: every table of at most ``rows`` rows (4 when undeclared) over a ≤ 3-cell domain
    has its truth inside the support; a declared ``rows`` makes both bounds attained."""
    s = support_of(_query(weights, denominator, Fraction(offset)), rows)
    n_max = 4 if rows is None else rows
    truths = [offset + Fraction(sum(w * c for w, c in zip(weights, counts, strict=True)), denominator)
              for counts in itertools.product(range(n_max + 1), repeat=len(weights)) if sum(counts) <= n_max]
    assert all(s.low <= float(t) <= s.high for t in truths)
    if rows is not None:
        assert float(min(truths)) == s.low and float(max(truths)) == s.high
    elif any(weights):
        assert (s.low > -math.inf) == (min(weights) >= 0) and (s.high < math.inf) == (max(weights) <= 0)


@settings(max_examples=150, deadline=None)
@given(center=st.floats(-50, 50), scale=st.floats(0.3, 20), low=st.floats(-60, 60), width=st.floats(0, 30),
       bounded=st.booleans())
def test_impossible_events_have_probability_zero(center: float, scale: float, low: float, width: float,
                                                 bounded: bool) -> None:
    """An event outside the support (below 0, above the declared bound) has probability exactly 0,
    the support has 1, and inside it the censored law agrees with the unrestricted one."""
    sup = Support(0.0, 40.0 if bounded else math.inf)
    post = Posterior(center, ErrorLaw([1.0], [scale]), sup)
    free = Posterior(center, ErrorLaw([1.0], [scale]))
    high = low + width
    p = post.probability(low, high)
    if high < sup.low or low > sup.high:
        assert p == 0.0
    elif sup.low < low and high < sup.high:
        assert p == pytest.approx(free.probability(low, high), abs=1e-12)
    assert post.probability(None, None) == 1.0
    assert post.probability(sup.low, sup.high) == pytest.approx(1.0, abs=1e-12)
    assert post.cdf(-0.5) == 0.0 and post.sf(-0.5) == 1.0
    assert post.cdf(max(low, 0.0)) == pytest.approx(free.cdf(max(low, 0.0)), abs=1e-12) or post.cdf(low) == 1.0
    lo, hi = post.interval(0.9)
    assert sup.low <= lo < hi <= sup.high
    assert sup.low <= post.ppf(0.3) <= sup.high and sup.low <= post.median() <= sup.high
    assert post.mean() == center  # the unbiased estimate stays available


@settings(max_examples=200, deadline=None)
@given(center=st.floats(-100, 100), q=st.floats(0.01, 40), low=st.floats(-20, 20), span=st.floats(0, 80))
def test_interval_on_the_support(center: float, q: float, low: float, span: float) -> None:
    """The cut interval keeps every support point of ``θ̂ ± q`` (coverage cannot drop), is never
    wider than ``2q`` and never a single point while the support has room."""
    sup = Support(low, low + span)
    lo, hi = sup.interval(center, q)
    assert low <= lo <= hi <= low + span
    assert hi - lo <= 2 * q + 1e-9
    keep_lo, keep_hi = max(center - q, low), min(center + q, low + span)
    if keep_lo <= keep_hi:
        assert lo <= keep_lo + 1e-9 and keep_hi <= hi + 1e-9
    assert hi - lo >= min(q, span) - 1e-9


SCHEMA = {"tables": {"t": {"columns": {"v": {"type": "integer", "min": 0, "max": 99}}, "rows": 400}}}
FRAME = pd.DataFrame({"v": np.random.default_rng(3).integers(0, 100, 400)})  # sparse: ~4 rows a value


def test_sparse_counts_cover_calibrate_and_stay_in_their_intervals() -> None:
    """Over 300 independent gateways on sparse data (truths 2–12, noise std ≈ 2–4): coverage of
    fresh and history answers ≥ 1−δ − 3 SE; every value inside its interval, on ``[0, rows]``; no
    interval a point; events below 0 or above ``rows`` at exactly 0 (the unrestricted posterior gave
    them up to a third of its mass here); and ``P(θ ≤ truth)`` uniform over the gateways (10 bins,
    |z| < 3) — the calibration the cut to the support must keep."""
    conf, n_gw = 0.9, 300
    covered = total = 0
    at_truth: list[float] = []
    for seed in range(n_gw):
        gw = dpgate.Gateway(FRAME, SCHEMA, budget=1e9, seed=seed)
        for lo in (0, 30, 60):
            sql = f"SELECT COUNT(*) FROM t WHERE v BETWEEN {lo} AND {lo + 1}"
            t = int(FRAME.v.between(lo, lo + 1).sum())
            for acc in (6.0, 4.0):  # fresh, then fresh combined with history
                a = gw.query(sql, accuracy=acc, confidence=conf).answer
                total += 1
                covered += a.low <= t <= a.high
                assert 0 <= a.low <= a.value <= a.high <= 400 and a.low < a.high
                assert a.unbiased == a.posterior.mean()
            assert gw.probability(sql, high=-0.5) == 0.0 and gw.probability(sql, low=400.5) == 0.0
            assert gw.probability(sql, low=0, high=400) == pytest.approx(1.0, abs=1e-9)
            at_truth.append(gw.probability(sql, high=t))
    se = math.sqrt(conf * (1 - conf) / total)
    assert covered / total >= conf - 3 * se, covered / total
    counts = np.histogram(at_truth, bins=10, range=(0.0, 1.0))[0]
    n = len(at_truth)
    z = (counts - n / 10) / math.sqrt(n * 0.1 * 0.9)
    assert np.all(np.abs(z) < 3), z
