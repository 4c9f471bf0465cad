"""Small things users see: reprs, a readable history, progress bars."""

from __future__ import annotations

import warnings

import pytest

import dpgate
from dpgate import _progress


@pytest.fixture
def gw():
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        yield dpgate.Gateway(df, schema, budget=5.0, seed=1)


def test_reprs_show_budget_tables_and_answers(gw):
    assert "budget=5" in repr(gw) and "spent=0" in repr(gw) and "tables=[pums]" in repr(gw)
    res = gw.query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", accuracy=20)
    text = repr(gw)
    assert f"spent={gw.spent:.6g}" in text and "releases=" in text and "<table>" in gw._repr_html_()
    shown = repr(res)
    assert shown.startswith("<dpgate.Result") and "n_low" in shown and len(shown.splitlines()) == 2 + len(res.answers)
    assert "<table" in res._repr_html_() and "n_high" in res._repr_html_()
    a = res.answers[0]
    assert repr(a).startswith("<Answer n sex=0: ") and f"{a.value:.6g} in [" in repr(a) and "95%" in repr(a)
    assert "fresh" in repr(a) and "<code>" in a._repr_html_()


def test_history_says_what_each_release_measured(gw):
    gw.query("SELECT sex, COUNT(*) FROM pums WHERE age BETWEEN 20 AND 29 GROUP BY sex", accuracy=20)
    hist = gw.history
    assert list(hist.columns[:5]) == ["id", "kind", "table", "sql", "measured"] and hist.columns[-1] == "query"
    assert hist["measured"].iloc[0] == "COUNT where age 20–29, sex = 0"
    assert hist["measured"].iloc[-1] == "COUNT where age 20–29, sex = 1"  # only declared keys are groups


def test_progress_bars_only_when_enabled(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    assert list(_progress.track(range(3), 3, "x")) == [0, 1, 2]
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.setattr(_progress, "_enabled", True)
    assert list(_progress.track(range(3), 3, "counting")) == [0, 1, 2]
    assert "counting" in capsys.readouterr().err
    df, schema = dpgate.datasets.load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        g = dpgate.Gateway(df, schema, budget=5.0, seed=1)
        g.query("SELECT educ, COUNT(*) FROM pums GROUP BY educ", accuracy=20)
    assert "releasing" in capsys.readouterr().err
    _progress.set_enabled(False)
    assert list(_progress.track(range(2), 2, "quiet")) == [0, 1] and capsys.readouterr().err == ""
