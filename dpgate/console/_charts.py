"""The console's charts: Vega-Lite specifications built with Altair (rendered in the browser by the
vega, vega-lite and vega-embed builds shipped in ``dpgate/console/static``).

Each function takes the numbers a page shows and returns the specification as a dict; the charts
name their data (``alt.NamedData``) and the rows go in the specification's ``datasets`` as they
are, so a page is one self-contained document, and Altair validates the chart's few objects,
not every row (its validation of 10 000 inline rows took seconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt

__all__ = ["analysts_chart", "budget_chart", "cells_bar", "cells_heatmap", "sources_chart"]

_WIDTH = 720


def _spec(chart: Any, **datasets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The chart's specification with the rows of each data set it names."""
    spec: dict[str, Any] = chart.to_dict()
    spec["datasets"] = {name: [dict(row) for row in rows] for name, rows in datasets.items()}
    return spec


def budget_chart(points: Sequence[Mapping[str, Any]], caps: Sequence[Mapping[str, Any]], unit: str = "ε") -> dict[str, Any]:
    """Budget over time: per ``who`` (``global`` or an analyst), ``spent`` after each ``release``
    (a line through the releases, drawn as points), with each cap as a dashed rule; ``unit``:
    the ledger's (``ρ`` for a zCDP ledger)."""
    base = alt.Chart().encode(
        x=alt.X("release:Q", title="release (ledger record id)", axis=alt.Axis(format="d", tickMinStep=1)),
        y=alt.Y("spent:Q", title=f"{unit} spent"),
        color=alt.Color("who:N", title="who"),
    )
    line = base.mark_line(interpolate="step-after")
    dots = base.mark_point(filled=True, size=30).encode(
        tooltip=[alt.Tooltip("who:N"), alt.Tooltip("release:Q"), alt.Tooltip("spent:Q", format=".6g")])
    rules = alt.Chart(alt.NamedData("caps")).mark_rule(strokeDash=[6, 4]).encode(
        y="cap:Q", color=alt.Color("who:N"), tooltip=[alt.Tooltip("who:N"), alt.Tooltip("cap:Q", format=".6g")])
    # The releases once, at the top (both layers read them); the caps in their own layer.
    chart = alt.layer(line, dots, rules, data=alt.NamedData("points"))
    return _spec(chart.properties(width=_WIDTH, height=320, title="Budget over time"), points=points, caps=caps)


def sources_chart(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Statements received per analyst, stacked by where their answers came from (``history`` is free)."""
    chart = alt.Chart(alt.NamedData("sources")).mark_bar().encode(
        y=alt.Y("analyst:N", title="analyst"),
        x=alt.X("statements:Q", title="statements answered"),
        color=alt.Color("source:N", title="answered from",
                        scale=alt.Scale(domain=["history", "mixed", "fresh"], range=["#4c9a2a", "#e0a030", "#c0392b"])),
        tooltip=["analyst:N", "source:N", "statements:Q"],
    )
    return _spec(chart.properties(width=_WIDTH, title="Free from history against paid"), sources=rows)


def analysts_chart(rows: Sequence[Mapping[str, Any]], unit: str = "ε") -> dict[str, Any]:
    """Per analyst, the budget ``spent`` (in ``unit``) as a bar and the ``cap`` as a tick."""
    bars = alt.Chart().mark_bar().encode(
        y=alt.Y("analyst:N", title="analyst"), x=alt.X("spent:Q", title=unit),
        tooltip=["analyst:N", alt.Tooltip("spent:Q", format=".6g"), alt.Tooltip("cap:Q", format=".6g")])
    caps = alt.Chart().mark_tick(color="black", thickness=3, size=24).encode(y="analyst:N", x="cap:Q")
    chart = alt.layer(bars, caps, data=alt.NamedData("analysts"))
    return _spec(chart.properties(width=_WIDTH, title="Spent against cap, per analyst"), analysts=rows)


def cells_bar(rows: Sequence[Mapping[str, Any]], column: str, unit: str = "ε") -> dict[str, Any]:
    """Spent budget (in ``unit``) per value (or range of cells) of ``column``."""
    chart = alt.Chart(alt.NamedData("cells")).mark_bar().encode(
        x=alt.X(f"{_field(column)}:N", sort=alt.EncodingSortField(field="order"), title=column),
        y=alt.Y("epsilon:Q", title=f"{unit} spent by a row here (most over the other columns)"),
        tooltip=[alt.Tooltip(f"{_field(column)}:N", title=column), alt.Tooltip("epsilon:Q", format=".6g")],
    )
    return _spec(chart.properties(width=_WIDTH, height=300, title=f"Where the budget went: {column}"), cells=rows)


def cells_heatmap(rows: Sequence[Mapping[str, Any]], first: str, second: str, unit: str = "ε") -> dict[str, Any]:
    """Spent budget (in ``unit``) per pair of values (or ranges of cells) of ``first`` and ``second``."""
    chart = alt.Chart(alt.NamedData("cells")).mark_rect().encode(
        x=alt.X(f"{_field(first)}:N", sort=None, title=first),
        y=alt.Y(f"{_field(second)}:N", sort=None, title=second),
        color=alt.Color("epsilon:Q", title=unit, scale=alt.Scale(scheme="orangered")),
        tooltip=[alt.Tooltip(f"{_field(first)}:N", title=first), alt.Tooltip(f"{_field(second)}:N", title=second),
                 alt.Tooltip("epsilon:Q", format=".6g")],
    )
    return _spec(chart.properties(width=_WIDTH, height=360, title=f"Where the budget went: {first} × {second}"),
                 cells=rows)


def _field(name: str) -> str:
    """A column name as a Vega-Lite field (dots and brackets would be read as nesting)."""
    return name.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[").replace("]", "\\]")
