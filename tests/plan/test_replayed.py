"""A fresh single-output statement is answered from its plan's own verified BLUE (``Plan.replayed``,
revalued): bit for bit what replaying its release on the state before it gives."""

from __future__ import annotations

import warnings

import numpy as np

import dpgate
from dpgate.datasets import load_pums
from dpgate.plan._replay import answers


def _spied(gw: dpgate.Gateway) -> list[tuple[object, ...]]:
    """Record, per statement that reads data, the BLUE before it (a copy taken after planning) and
    what ``_measure`` returned."""
    seen: list[tuple[object, ...]] = []
    plan, measure = gw._plan, gw._measure

    def planned(*a, **k):  # type: ignore[no-untyped-def]
        p = plan(*a, **k)
        seen.append((p.refined.blue.copy(),))
        return p

    def measured(*a, **k):  # type: ignore[no-untyped-def]
        out = measure(*a, **k)
        seen[-1] = (*seen[-1], *out)
        return out

    gw._plan, gw._measure = planned, measured  # type: ignore[method-assign]
    return seen


def _fields(result: tuple[dpgate.Answer, ...]) -> list[tuple[object, ...]]:
    return [(a.value, a.low, a.high, a.source, a.epsilon_spent) for a in result]


def test_the_plans_blue_answers_as_the_replay_does() -> None:
    df, schema = load_pums()
    rng = np.random.default_rng(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1e6, seed=4)
        seen = _spied(gw)
        reused = 0
        for _ in range(60):
            a, b = sorted(int(v) for v in rng.choice(np.arange(10, 100, 10), 2))  # shared endpoints
            sql = f"SELECT COUNT(*) FROM pums WHERE age BETWEEN {a} AND {b}"
            if rng.random() < 0.3:
                sql = f"SELECT sex, COUNT(*) FROM pums WHERE age BETWEEN {a} AND {b} GROUP BY sex"
            gw.query(sql, accuracy=float(rng.choice([2.0, 5.0, 40.0])))
            if len(seen[-1]) < 4:
                continue  # answered from history: nothing measured
            before, steps, blue, replayed = seen[-1]
            if not replayed:
                continue
            reused += 1
            for confidence in (0.9, 0.95):
                got = answers(blue, steps, 10.0, confidence, "minimal", secure=False, replayed=True)  # type: ignore[arg-type]
                want = answers(before, steps, 10.0, confidence, "minimal", secure=False)  # type: ignore[arg-type]
                assert _fields(got) == _fields(want)
        assert reused >= 10
