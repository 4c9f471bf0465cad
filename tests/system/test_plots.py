"""Plots in a notebook: ``gw.plot_budget()``, ``gw.plot_cells(column)``, ``Result.plot()`` and the
interval bars of ``Result._repr_html_`` — the numbers drawn are the released ones and the accounting's."""

from __future__ import annotations

import io
import re
import sys
import warnings
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import dpgate
from dpgate.answer._plot import PlottingUnavailable
from dpgate.ledger._cell_spend import cell_spend

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def gw(pums: Any) -> Any:
    df, schema = pums
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=2.0, seed=3)
        gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25)
        gw.query("SELECT sex, COUNT(*) AS n FROM pums WHERE age >= 60 GROUP BY sex", accuracy=20)
        gw.query("SELECT race, COUNT(*) AS n FROM pums WHERE age BETWEEN 30 AND 59 GROUP BY race", accuracy=30)
    return gw


def test_plot_budget_draws_the_history_costs_and_the_budget_line(gw: Any) -> None:
    fig = gw.plot_budget()
    assert isinstance(fig, Figure)
    hist = gw.history
    spent, points, budget = fig.axes[0].get_lines()
    np.testing.assert_array_equal(spent.get_xdata(), hist["id"].to_numpy(dtype=float))
    np.testing.assert_array_equal(spent.get_ydata(), hist["cost_after"].to_numpy(dtype=float))
    np.testing.assert_array_equal(points.get_ydata(), hist["cost_after"].to_numpy(dtype=float))
    assert len(points.get_xdata()) == len(hist) > 3
    assert set(budget.get_ydata()) == {gw.budget}
    assert spent.get_ydata()[-1] == pytest.approx(gw.spent, rel=1e-9)


def test_result_plot_draws_each_interval_as_an_error_bar(gw: Any) -> None:
    res = gw.query("SELECT sex, COUNT(*) AS n, COUNT(*) FILTER (WHERE age < 40) AS young FROM pums GROUP BY sex",
                   accuracy=30)
    fig = res.plot()
    assert isinstance(fig, Figure) and [ax.get_title() for ax in fig.axes] == ["n (95% intervals)",
                                                                               "young (95% intervals)"]
    for k, ax in enumerate(fig.axes):
        answers = res.answers[k::2]
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(a.group[0][1]) for a in answers]
        (container,) = ax.containers
        data_line, _, (bars,) = container.lines
        np.testing.assert_allclose(np.asarray(data_line.get_ydata(), dtype=float), [a.value for a in answers])
        segments = bars.get_segments()
        np.testing.assert_allclose([s[0][1] for s in segments], [a.low for a in answers])
        np.testing.assert_allclose([s[1][1] for s in segments], [a.high for a in answers])


def test_plot_cells_bars_are_the_per_cell_spend_and_the_tallest_is_spent(gw: Any) -> None:
    fig = gw.plot_cells("age")
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    rows = cell_spend(gw.ledger.records(), gw.schema.table("pums")).over(["age"])
    assert heights == [r["epsilon"] for r in rows]
    assert [t.get_text() for t in ax.get_xticklabels()] == [r["age"] for r in rows]
    assert "0–29" in [r["age"] for r in rows] and rows[-1]["age"].endswith("–100")
    assert max(heights) == pytest.approx(gw.spent, rel=1e-12)  # one table, k = 1
    sex = [p.get_height() for p in gw.plot_cells("SEX", table="PUMS").axes[0].patches]
    assert len(sex) == 2 and max(sex) == pytest.approx(gw.spent, rel=1e-12)


def test_plot_cells_refuses_bad_arguments_by_name(gw: Any) -> None:
    spent = gw.spent
    with pytest.raises(dpgate.InvalidArgument, match="no column 'agee'.*pums.age"):
        gw.plot_cells("agee")
    with pytest.raises(dpgate.InvalidArgument, match="no table 'people'"):
        gw.plot_cells("age", table="people")
    with pytest.raises(dpgate.InvalidArgument, match="column name"):
        gw.plot_cells(["age"])
    two = {"a": pd.DataFrame({"x": [1, 2]}), "b": pd.DataFrame({"x": [1]})}
    schema = {"tables": {t: {"columns": {"x": {"type": "integer", "min": 0, "max": 3}}} for t in two}}
    with pytest.raises(dpgate.InvalidArgument, match="'x' is a column of a, b; name one with table="):
        dpgate.Gateway(two, schema).plot_cells("x")
    assert gw.spent == spent


def test_repr_html_has_one_bar_per_answer_and_escapes_hostile_labels() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    df = pd.DataFrame({"g": ["a", hostile, "a", hostile, "b"]})
    schema = {"tables": {"t": {"columns": {"g": {"type": "categorical", "values": ["a", "b", hostile]}}}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
        res = gw.query('SELECT g, COUNT(*) AS "<b>n</b>", COUNT(*) AS m FROM t GROUP BY g', accuracy=5)
    page = res._repr_html_()
    assert page.count("class='dpgate-interval'") == len(res.answers) == 6
    assert hostile not in page and "<b>" not in page and html_escaped(hostile) in page
    assert "&lt;b&gt;n&lt;/b&gt; interval" in page and "<script" not in page
    for a in res.answers:  # each bar's title states its interval
        assert f"title='[{a.low:.6g}, {a.high:.6g}]'" in page
    widths = [float(w) for w in re.findall(r"left:[0-9.]+%;width:([0-9.]+)%", page)]
    assert len(widths) == 6 and all(0 < w <= 100 for w in widths)


def test_labels_that_look_like_tex_are_drawn_as_text() -> None:
    tex = r"$\notacommand{$"
    df = pd.DataFrame({"g": ["a", tex, "a"]})
    schema = {"tables": {"t": {"columns": {"g": {"type": "categorical", "values": ["a", tex]}}}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
        res = gw.query('SELECT g, COUNT(*) AS "$\\x$" FROM t GROUP BY g', accuracy=5)
    for fig in (res.plot(), gw.plot_cells("g"), gw.plot_budget()):
        fig.savefig(io.BytesIO(), format="png")  # draws every text: no mathtext error
    assert [t.get_text() for t in res.plot().axes[0].get_xticklabels()] == ["a", tex]


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)


def test_a_missing_matplotlib_is_a_dpgate_error(gw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PlottingUnavailable, match=r"pip install 'dpgate\[demo\]'") as caught:
        gw.plot_budget()
    assert isinstance(caught.value, dpgate.NotSupportedError) and isinstance(caught.value, ImportError)
    with pytest.raises(PlottingUnavailable):
        gw.plot_cells("age")


def test_import_dpgate_does_not_import_matplotlib() -> None:
    import subprocess

    code = "import sys, dpgate; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
