"""A released query in words, for ``Gateway.history``: what it counted, on which cells.

Built from the public query weights and the schema only (no data).  A GROUP BY
release reads like its group, e.g. ``COUNT where sex = 1, age 0–29``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgate.compile.query import LinearQuery, breakpoint_array
from dpgate.ledger._records import LedgerRecord
from dpgate.schema._temporal import granule_start, iso
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
    # The least and greatest nonzero weight (one weight when they agree): no sort of a wide query's weights.
    lo, hi = (float(x) / query.denominator for x in (query.numerators[nz].min(), query.numerators[nz].max()))
    if lo == hi:
        what = "COUNT" if lo == 1 else f"{lo:g} × COUNT"
    else:
        what = f"SUM of weights {lo:g}…{hi:g}"
    parts = []
    covered = 1
    for axis, (name, bps) in enumerate(zip(query.columns, query.breakpoints, strict=True)):
        col = table.column(name)
        other = tuple(a for a in range(nz.ndim) if a != axis)
        touched = nz.any(axis=other) if other else nz
        # Slab k covers the cells edges[k] … edges[k + 1] − 1: a cell mask without a Python loop per cell.
        edges = np.append(breakpoint_array(bps), col.n_cells)
        cells = np.flatnonzero(np.repeat(touched, np.diff(edges)))
        covered *= int(np.count_nonzero(touched))
        if cells.size < col.n_cells:
            parts.append(_cells(col, cells))
    text = what + (" where " + ", ".join(parts) if parts else " of every row")
    if covered > int(nz.sum()):  # the support is not a product of per-column sets
        text += " (on part of these cells)"
    return text


def _cells(col: Column, cells: np.ndarray) -> str:
    """The cells ``cells`` (increasing indices) of ``col`` in words; reads the labels of the cells shown only."""
    n = int(cells.size)
    first, last = int(cells[0]), int(cells[-1])
    if col.kind in _RANGED and n > 2 and last - first == n - 1 and last < col.null_cell:
        return f"{col.name} {_label(col, first)}–{_label(col, last)}"
    shown_cells = cells.tolist() if n <= 8 else [*cells[:4].tolist(), last]
    if col.kind in _RANGED:  # a cell's label from its index (no list of a wide column's labels)
        labels: Any = {c: None if c >= col.null_cell else _label(col, c) for c in shown_cells}
    else:
        labels = col.labels()
    shown = ["NULL" if labels[c] is None else str(labels[c]) for c in shown_cells]
    if n == 1:
        return f"{col.name} = {shown[0]}" if shown[0] != "NULL" else f"{col.name} IS NULL"
    if n > 8:
        return f"{col.name} ∈ {{{', '.join(shown[:4])}, … {shown[-1]}}} ({n} values)"
    return f"{col.name} ∈ {{{', '.join(shown)}}}"


def history_frame(records: Sequence[LedgerRecord], schema: Schema) -> pd.DataFrame:
    """``Gateway.history``: one row per release, with ``measured`` (what it counted, in words) after
    ``sql`` and the exact weight vector as JSON (``query``) last."""
    import pandas as pd

    cols = ["id", "kind", "table", "sql", "alpha", "sensitivity", "scale", "lattice",
            "noise", "value", "cost_after", "secure", "created_at", "session", "query"]
    rows = [{"measured": _described(r.query, schema.table(r.table)), **{c: getattr(r, c) for c in cols}}
            for r in records]
    return pd.DataFrame(rows, columns=[*cols[:4], "measured", *cols[4:]])


def _described(text: str, table: Table) -> str:
    """:func:`describe` of the query whose ledger JSON is ``text``, once per text and table
    (a repeated statement's releases share their text, and ``history`` is read again and again:
    a wide query's weights are decoded once, not on every read)."""
    # A long text (an older ledger's plain list of 500 000 weights) is kept by its digest only.
    key = (id(table), text if len(text) <= 4096 else hashlib.sha256(text.encode()).hexdigest())
    hit = _DESCRIBED.get(key)
    if hit is None or hit[0] is not table:
        if len(_DESCRIBED) >= _DESCRIBED_MAX:
            _DESCRIBED.clear()
        hit = _DESCRIBED[key] = (table, describe(LinearQuery.from_json(text), table))
    return hit[1]


#: Descriptions by (table identity, query JSON or its digest); the entry holds the table, so its id is not
#: reused meanwhile.
_DESCRIBED: dict[tuple[int, str], tuple[Table, str]] = {}
_DESCRIBED_MAX = 4096


#: Kinds whose cells are consecutive values of a range (a date's cells are its granules).
_RANGED = ("integer", "date", "timestamp")


def _label(col: Column, cell: int) -> Any:
    """The label of a non-NULL cell of a :data:`_RANGED` column: the integer, or the granule's ISO start."""
    lo, _ = col.int_range()
    if col.kind == "integer":
        return lo + cell
    return iso(granule_start(lo + cell, col.granularity or "day"), col.kind)
