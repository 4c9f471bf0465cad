"""A released query in words, for ``Gateway.history``: what it counted, on which cells.

Built from the public query weights and the schema only (no data).  A GROUP BY
release reads like its group, e.g. ``COUNT where sex = 1, age 0–29``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.ledger._records import LedgerRecord
from dpgate.schema.domains import Column, Schema, Table

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["describe", "history_frame"]


def describe(query: LinearQuery, table: Table) -> str:
    """``query`` in words: its weight (``COUNT``, ``2 × COUNT``, ``SUM of weights a…b``) and,
    per column it restricts, the cells it touches.

    >>> from dpgate.schema.domains import Schema
    >>> t = Schema.load({"tables": {"t": {"columns": {
    ...     "age": {"type": "integer", "min": 0, "max": 9},
    ...     "sex": {"type": "categorical", "values": ["0", "1"]}}}}}).table("t")
    >>> w = np.zeros((11, 4)); w[0:3, 1] = 1
    >>> describe(LinearQuery.from_grid(t, ["age", "sex"], [range(11), range(4)], w), t)
    'COUNT where age 0–2, sex = 1'
    """
    nz = query.numerators != 0
    if not nz.any():
        return "constant"
    weights = np.unique(query.numerators[nz]) / query.denominator
    if weights.size == 1:
        w = float(weights[0])
        what = "COUNT" if w == 1 else f"{w:g} × COUNT"
    else:
        what = f"SUM of weights {float(weights.min()):g}…{float(weights.max()):g}"
    parts = []
    covered = 1
    for axis, (name, bps) in enumerate(zip(query.columns, query.breakpoints, strict=True)):
        col = table.column(name)
        other = tuple(a for a in range(nz.ndim) if a != axis)
        slabs = np.flatnonzero(nz.any(axis=other) if other else nz)
        edges = [*bps, col.n_cells]
        cells = [c for k in slabs for c in range(edges[k], edges[k + 1])]
        covered *= len(slabs)
        if len(cells) < col.n_cells:
            parts.append(_cells(col, cells))
    text = what + (" where " + ", ".join(parts) if parts else " of every row")
    if covered > int(nz.sum()):  # the support is not a product of per-column sets
        text += " (on part of these cells)"
    return text


def _cells(col: Column, cells: list[int]) -> str:
    labels = col.labels()
    shown = ["NULL" if labels[c] is None else str(labels[c]) for c in cells]
    if col.kind == "integer" and len(cells) > 2 and cells == list(range(cells[0], cells[-1] + 1)) \
            and cells[-1] < col.null_cell:
        return f"{col.name} {shown[0]}–{shown[-1]}"
    if len(shown) == 1:
        return f"{col.name} = {shown[0]}" if shown[0] != "NULL" else f"{col.name} IS NULL"
    if len(shown) > 8:
        return f"{col.name} ∈ {{{', '.join(shown[:4])}, … {shown[-1]}}} ({len(shown)} values)"
    return f"{col.name} ∈ {{{', '.join(shown)}}}"


def history_frame(records: Sequence[LedgerRecord], schema: Schema) -> pd.DataFrame:
    """``Gateway.history``: one row per release, with ``measured`` (what it counted, in words) after
    ``sql`` and the exact weight vector as JSON (``query``) last."""
    import pandas as pd

    cols = ["id", "kind", "table", "sql", "alpha", "sensitivity", "scale", "lattice",
            "noise", "value", "cost_after", "secure", "created_at", "session", "query"]
    rows = [{"measured": describe(LinearQuery.from_json(r.query), schema.table(r.table)),
             **{c: getattr(r, c) for c in cols}} for r in records]
    return pd.DataFrame(rows, columns=[*cols[:4], "measured", *cols[4:]])
