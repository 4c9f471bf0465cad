"""A long mixed history (issue 28): a gateway re-opened from the checkpoint (covering a prefix of
the ledger, the rest replayed) answers as one that replays the whole ledger — every later
decision exactly, ε, values and intervals up to rounding."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

import dpgate
from dpgate.datasets import load_pums

#: Statements of the history: counts, ranges, GROUP BYs (filtered too), sums, and repeats.
_SHAPES = (
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN {a} AND {b}",
    "SELECT sex, COUNT(*) FROM pums WHERE age BETWEEN {a} AND {b} GROUP BY sex",
    "SELECT race, COUNT(*) FROM pums GROUP BY race",
    "SELECT educ, COUNT(*) FROM pums WHERE married GROUP BY educ",
    "SELECT COUNT(*) FROM pums WHERE sex = '1' AND age < {b}",
    "SELECT SUM(age) FROM pums WHERE educ >= {e}",
    "SELECT married, COUNT(*) FROM pums WHERE educ = {e} GROUP BY married",
)


def _history(n: int, seed: int) -> list[tuple[str, float]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[str, float]] = []
    for _ in range(n):
        if out and rng.random() < 0.2:  # a repeat of an earlier statement, at another accuracy
            sql, acc = out[int(rng.integers(len(out)))]
            out.append((sql, acc * float(rng.choice([0.5, 1.0, 2.0]))))
            continue
        a, b = sorted(int(v) for v in rng.integers(0, 100, 2))
        shape = _SHAPES[int(rng.integers(len(_SHAPES)))]
        acc = 1500.0 if shape.startswith("SELECT SUM") else float(rng.choice([8.0, 15.0, 40.0]))
        out.append((shape.format(a=a, b=b, e=int(rng.integers(1, 16))), acc))
    return out


def _answers(gw: dpgate.Gateway, statements: list[tuple[str, float]]) -> list[object]:
    out: list[object] = []
    for sql, acc in statements:
        try:
            result = gw.query(sql, accuracy=acc, confidence=0.95)
        except dpgate.Error as e:
            out.append(type(e).__name__)
            continue
        out.append([(a.value, a.low, a.high, a.source) for a in result.answers])
        out.append(gw.spent)
    return out


def _open(df, schema, path, key):  # type: ignore[no-untyped-def]
    # Each ask at the stated confidence: with δ-spending (the default) this history's re-asks release more,
    # and the reopening gateway would checkpoint the crash's records itself (CHECKPOINT_AFTER).
    return dpgate.Gateway(df, schema, budget=1e6, ledger=str(path), ledger_key=key, seed=11, reasks="independent")


def test_a_long_mixed_history_reopens_to_the_same_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    df, schema = load_pums()
    path, key = tmp_path / "l.db", os.urandom(32)
    statements = _history(200, seed=28)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = _open(df, schema, path, key)
        _answers(gw, statements[:150])
        gw.close()  # the checkpoint covers 150 statements ...
        gw = _open(df, schema, path, key)
        assert gw._history.checkpointed > 0
        _answers(gw, statements[150:])
        gw._ledger.close()  # ... and a crash leaves the last 50 to replay
        probes = _history(40, seed=29)
        twin = tmp_path / "twin"  # the same files, for the replay (the probes add records)
        shutil.copytree(tmp_path, twin, ignore=shutil.ignore_patterns("twin", "*.state"))
        from_checkpoint = _open(df, schema, path, key)
        assert 0 < from_checkpoint._history.checkpointed < from_checkpoint._history.last_id
        first = _answers(from_checkpoint, probes)
        from_checkpoint._ledger.close()
        replayed = _open(df, schema, twin / "l.db", key)
        assert replayed._history.checkpointed in (0, replayed._history.last_id)  # nothing loaded
        second = _answers(replayed, probes)
        replayed._ledger.close()
    # Decisions exactly; ε, values and intervals up to rounding: the live state (planning copies
    # installed as planned) and a replay (records applied statement by statement) reach the same
    # BLUE by different sequences of floating-point operations.
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        if isinstance(a, list):
            assert [x[3] for x in a] == [x[3] for x in b]  # fresh or from history
            assert np.allclose([x[:3] for x in a], [x[:3] for x in b], rtol=1e-9, atol=1e-9)
        elif isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-12)  # ε spent (its sum is rounded in another order too)
        else:
            assert a == b  # the error raised
