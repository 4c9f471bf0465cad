"""Memory of a long session (issue 28): what a gateway keeps per release is bounded and compact.

* the history's runs (for local histories) keep a wide release by its ledger JSON
  (``dpgate.ledger._runs``), and a local history replayed from them decides and answers as one
  replayed from the queries themselves;
* the re-ask counter keeps a previous answer without its query (a wide one's weights).
"""

from __future__ import annotations

import pickle
import shutil
import warnings

import pytest

import dpgate
import dpgate.datasets
import dpgate.ledger._runs as runs_module
from dpgate.ledger._runs import KeptRelease, kept, released

#: Wide sums and averages of income (500 001 weights each) between counts over their columns: the
#: later statements are planned on local histories that replay the wide releases.
SESSION = [
    ("SELECT sex, SUM(income) FROM pums GROUP BY sex", 2e6),
    ("SELECT AVG(income) FROM pums WHERE educ BETWEEN 1 AND 8", 30.0),
    ("SELECT sex, COUNT(*) FROM pums WHERE income > 30000 GROUP BY sex", 20.0),
    ("SELECT SUM(income) FROM pums WHERE sex = '1'", 2e6),
    ("SELECT SUM(income) FROM pums WHERE sex = '0'", 2e6),
    ("SELECT sex, SUM(income) FROM pums GROUP BY sex", 3e6),
    ("SELECT AVG(income) FROM pums WHERE educ BETWEEN 1 AND 8", 30.0),
]


def _session(compact: int, monkeypatch: pytest.MonkeyPatch) -> tuple[dpgate.Gateway, list[tuple[object, ...]]]:
    monkeypatch.setattr(runs_module, "COMPACT_WEIGHTS", compact)
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1e6, seed=8)
        out = []
        for sql, accuracy in SESSION:
            gw._history._local.clear()  # every local history made afresh: replayed from the runs
            res = gw.query(sql, accuracy=accuracy)
            out.append((gw.spent, *((a.value, a.low, a.high, a.source) for a in res.answers)))
    return gw, out


def test_wide_runs_are_kept_by_json_and_replay_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    release = KeptRelease.release
    monkeypatch.setattr(KeptRelease, "release", lambda self: decoded.append(1) or release(self))
    gw, compact = _session(runs_module.COMPACT_WEIGHTS, monkeypatch)
    assert len(decoded) >= 3  # local histories replayed wide releases from their JSON
    items = [it for _, run in gw._history.runs["pums"] for it in run]
    wide = [it for it in items if isinstance(it, KeptRelease)]
    assert wide and all(len(it.query_json) < 4096 for it in wide)
    # Decoded: the query as released (its key), its memoised values carried over.
    for it, again in zip(wide, released(wide), strict=True):
        assert again.query.to_json() == it.query_json and "pattern" in again.query.__dict__
        restored = pickle.loads(pickle.dumps(it))  # checkpointed without them
        assert restored.derived == {} and restored.release().query.key == again.query.key
        assert kept(again).query_json == it.query_json  # type: ignore[union-attr]
    _, full = _session(10**12, monkeypatch)  # nothing compacted: the queries themselves
    assert compact == full


def test_reasks_keep_answers_without_their_query() -> None:
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1e6, seed=9)
        first = gw.query("SELECT SUM(income) FROM pums WHERE age > 40", accuracy=2e6).answer
        seen = [s for s in gw._asks._seen.values() if s.answer is not None]
        assert seen and all(s.answer.query is None for s in seen)  # type: ignore[union-attr]
        again = gw.query("SELECT SUM(income) FROM pums WHERE age > 40", accuracy=3e6).answer
    assert (again.source, again.value, again.low, again.high) == ("history", first.value, first.low, first.high)
    assert again.query is not None and again.query.key == first.query.key  # type: ignore[union-attr]


def test_a_checkpoint_keeps_wide_runs_by_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Re-opened from its checkpoint (which holds the runs), a gateway plans the next statements —
    on local histories replaying the wide releases — as the live one does."""
    df, schema = dpgate.datasets.load_pums()
    (tmp_path / "live").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        live = dpgate.Gateway(df, schema, budget=1e6, seed=2, ledger=str(tmp_path / "live" / "l.db"),
                              reasks="independent")
        for sql, accuracy in SESSION[:4]:
            live.query(sql, accuracy=accuracy)
        live._history.save_checkpoint(live._ledger.records())
        shutil.copytree(tmp_path / "live", tmp_path / "copy")
        reopened = dpgate.Gateway(df, schema, budget=1e6, seed=3, ledger=str(tmp_path / "copy" / "l.db"),
                                  reasks="independent")
        assert reopened._history.checkpointed and reopened.spent == live.spent
        assert any(isinstance(it, KeptRelease) for _, run in reopened._history.runs["pums"] for it in run)
        for gw in (live, reopened):
            gw._history._local.clear()
        for sql, accuracy in SESSION[4:]:
            a, b = (gw.query(sql, accuracy=accuracy).answers for gw in (live, reopened))
            assert [(x.source, x.epsilon_spent) for x in a] == [(x.source, x.epsilon_spent) for x in b]
        assert reopened.spent == pytest.approx(live.spent, rel=1e-12)
        live.close()
        reopened.close()
