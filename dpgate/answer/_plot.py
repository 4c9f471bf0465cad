"""Results in a notebook: :meth:`Result.plot <dpgate.answer.result.Result.plot>` (matplotlib, the ``demo``
extra, imported on use) and the intervals drawn as small HTML bars in ``Result._repr_html_``.

Every figure is a bare :class:`matplotlib.figure.Figure` (no pyplot): no global figure state, no
backend chosen for the user, and a notebook shows the returned figure once.  Everything drawn is
what the result already released (values and their intervals); nothing is read, nothing is spent.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpgate.errors import NotSupportedError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["PlottingUnavailable", "intervals_html", "new_figure", "result_figure"]

#: The most rows ``Result._repr_html_`` shows (as pandas' ``max_rows`` did).
HTML_ROWS = 60
#: ``Result.plot``: the widest figure (inches) and the most group labels on an axis.
MAX_WIDTH, MAX_TICKS = 16.0, 40


class PlottingUnavailable(NotSupportedError, ImportError):
    """matplotlib is not installed; the message says what to install (also an ``ImportError``)."""


def new_figure(**kwargs: Any) -> Figure:
    """A new matplotlib Figure, or :class:`PlottingUnavailable` naming the ``demo`` extra."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlottingUnavailable("plotting needs matplotlib, which is not installed; install dpgate with its "
                                  "demo extra: pip install 'dpgate[demo]'.") from exc
    return Figure(**kwargs)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.nan


def result_figure(answers: Sequence[Any], n_aggregates: int, group_columns: Sequence[Any]) -> Figure:
    """A result's ``answers`` (``Answer`` values, group by group, ``n_aggregates`` per group) as
    points with their intervals as error bars: the groups side by side (in domain order, every
    group released), one panel per aggregate output column.  An unavailable answer (NaN) leaves
    its place empty.  (Typed loosely: this module does not import :mod:`dpgate.answer.result`.)"""
    n_aggs = max(1, n_aggregates)
    width = min(MAX_WIDTH, max(4.0, 0.5 * len(answers) / n_aggs + 2))
    fig = new_figure(figsize=(width, 2.8 * n_aggs), layout="constrained")
    axes = fig.subplots(n_aggs, 1, squeeze=False)[:, 0]
    for k, ax in enumerate(axes):
        chunk = answers[k::n_aggs]
        values = [_finite(a.value) for a in chunk]
        below = [v - _finite(a.low) for v, a in zip(values, chunk, strict=True)]
        above = [_finite(a.high) - v for v, a in zip(values, chunk, strict=True)]
        x = list(range(len(chunk)))
        ax.errorbar(x, values, yerr=[below, above], fmt="o", capsize=3)
        step = math.ceil(len(chunk) / MAX_TICKS) if chunk else 1  # many groups: every step-th one labelled
        ax.set_xticks(x[::step], [", ".join(str(key) for _, key in a.group) for a in chunk[::step]],
                      rotation=45 if len(chunk) > 6 else 0, ha="right" if len(chunk) > 6 else "center", parse_math=False)
        if group_columns:
            ax.set_xlabel(", ".join(str(c) for c in group_columns), parse_math=False)
        conf = f" ({chunk[0].confidence:.0%} intervals)" if chunk else ""
        ax.set_title(f"{chunk[0].label if chunk else ''}{conf}", parse_math=False)  # a label is text, never TeX
    return fig


def _bar(low: float, high: float, value: float, lo: float, hi: float) -> str:
    """One interval as a 120-pixel bar on the scale ``lo``…``hi`` (its column's), its value a tick."""
    if not (math.isfinite(low) and math.isfinite(high)) or not hi > lo:
        inner = ""
    else:
        left, width = 100 * (low - lo) / (hi - lo), max(0.5, 100 * (high - low) / (hi - lo))
        tick = (f"<span style='position:absolute;left:{100 * (value - lo) / (hi - lo):.2f}%;top:0;bottom:0;"
                "width:2px;background:#1f3b73'></span>" if math.isfinite(value) else "")
        inner = (f"<span style='position:absolute;left:{left:.2f}%;width:{width:.2f}%;top:3px;bottom:3px;"
                 f"background:#8fb0e0'></span>{tick}")
    return (f"<span class='dpgate-interval' title='{html.escape(f'[{low:.6g}, {high:.6g}]', quote=True)}' "
            "style='display:inline-block;position:relative;width:120px;height:12px;background:#eee'>"
            f"{inner}</span>")


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return html.escape(f"{x:.6g}")
    return html.escape(str(x))


def intervals_html(df: pd.DataFrame, aggregates: list[str]) -> str:
    """``df`` (``Result.to_pandas()``) as an HTML table, every cell escaped, with an ``<col> interval``
    bar column after each aggregate's ``<col>_high``; at most :data:`HTML_ROWS` rows."""
    scales = {}
    for name in aggregates:
        ends = [float(v) for v in (*df[f"{name}_low"], *df[f"{name}_high"]) if math.isfinite(float(v))]
        scales[name] = (min(ends), max(ends)) if ends else (0.0, 0.0)
    head = "".join(f"<th>{html.escape(str(c))}</th>" + (f"<th>{html.escape(str(c)[:-5])} interval</th>"
                                                        if str(c)[:-5] in scales and str(c).endswith("_high") else "")
                   for c in df.columns)
    rows = []
    for _, row in df.head(HTML_ROWS).iterrows():
        cells = []
        for c in df.columns:
            cells.append(f"<td>{_cell(row[c])}</td>")
            name = str(c)[:-5]
            if str(c).endswith("_high") and name in scales:
                cells.append(f"<td>{_bar(float(row[f'{name}_low']), float(row[c]), float(row[name]), *scales[name])}"
                             "</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p>… {len(df) - HTML_ROWS} more rows</p>" if len(df) > HTML_ROWS else ""
    return f"<table class='dataframe'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"
