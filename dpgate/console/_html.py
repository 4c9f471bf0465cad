"""The console's HTML: one layout, tables, and the charts' specifications embedded as JSON.

Everything from the ledger is escaped (:func:`html.escape`); a chart's specification sits in a
``<script type="application/json">`` element with ``<``, ``>`` and ``&`` written as JSON escapes,
so no text of a statement can close it.  The page renders each chart with ``vegaEmbed`` from
the scripts under ``/static/`` (shipped in the package; ``static/console.js``) and marks
``<body data-rendered>`` with the number of charts drawn, which the browser tests wait for.  No
script is inline, so the pages' Content-Security-Policy allows scripts from the console only.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SVG_MARKS", "chart", "escape", "layout", "table"]

#: Charts with more marks than this are drawn on a canvas rather than as SVG.
SVG_MARKS = 2000

_NAV = (("/", "Budget"), ("/cells", "Where it went"), ("/releases", "Releases"), ("/analysts", "Analysts"))

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 2em 2em; color: #222; }
nav { padding: 1em 0; border-bottom: 1px solid #ccc; margin-bottom: 1em; }
nav a { margin-right: 1.5em; text-decoration: none; color: #1f5fa8; }
nav a.here { font-weight: bold; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.summary span { margin-right: 2em; }
.note { color: #666; font-size: 0.9em; }
form input, form select { margin-right: 1em; }
"""



def escape(value: object) -> str:
    """``value`` as HTML text."""
    return html.escape(str(value), quote=True)


def chart(name: str, spec: Mapping[str, Any], *, marks: int = 0) -> str:
    """A chart's place and its specification (``name``: letters, digits and ``-`` only); drawn as SVG,
    or on a canvas when it has more than :data:`SVG_MARKS` ``marks`` (thousands of SVG nodes are slow)."""
    text = json.dumps(spec).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    renderer = "canvas" if marks > SVG_MARKS else "svg"
    return (f'<div id="chart-{name}" class="chart"></div>\n<script type="application/json" id="spec-{name}" '
            f'data-chart="{name}" data-renderer="{renderer}">{text}</script>')


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: Sequence[int] = (),
          table_id: str = "") -> str:
    """An HTML table; the columns at ``numeric`` are right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{escape(v)}</td>'
                                      for i, v in enumerate(row)) + "</tr>" for row in rows)
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def layout(title: str, here: str, body: str, *, charts: bool = True) -> str:
    """A whole page: the navigation, ``body``, and the chart scripts when it has charts."""
    nav = "".join(f'<a href="{href}"{" class=here" if href == here else ""}>{escape(text)}</a>'
                  for href, text in _NAV)
    scripts = ("<script src=\"/static/vega.min.js\"></script><script src=\"/static/vega-lite.min.js\"></script>"
               "<script src=\"/static/vega-embed.min.js\"></script>" if charts else "")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><link rel=icon href='data:,'>"
            f"<title>{escape(title)} · dpgate console</title>"
            f"<style>{_STYLE}</style>{scripts}</head><body><nav>{nav}</nav><h1>{escape(title)}</h1>\n{body}\n"
            "<script src=\"/static/console.js\"></script></body></html>")
