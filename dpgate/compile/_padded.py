"""A query whose weights are zero outside one box of its grid, built from that box alone.

A GROUP BY group's query of a wide column (``SUM(income) … GROUP BY sex, race``) is zero outside
its group's cell: on its grid (each group column cut at ``{0, k, k + 1}``) the weights are one
block of the other columns' slabs, padded with zero slabs on every group axis — 2 × 3 × 500 002
numerators of which 500 002 are not padding.  :func:`padded_query` builds the same canonical
:class:`~dpgate.compile.query.LinearQuery` as :meth:`LinearQuery.from_grid` on the padded array
(equal key, breakpoints, numerators and denominator), but rationalises and merges only the
block and writes it into a ``np.zeros`` array: a large one is fresh zero pages from the
operating system, of which only the block's are ever written, so a group's query holds memory
for its block, not for its padding.  What it holds is returned beside it (``held``): the
compiler bounds those (:data:`~dpgate.compile.aggregates.MAX_WIDE_BOXES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpgate.compile.bounds import reserve_memory
from dpgate.compile.query import LinearQuery, as_fraction, int_tuple, rationalise
from dpgate.errors import UnsupportedQuery
from dpgate.schema.domains import Table

__all__ = ["HELD_WEIGHTS", "divided", "nonzero_box", "padded_query", "support_query"]

#: Key, in a padded query's ``__dict__``, of the numerators it holds in memory (its block's).
HELD_WEIGHTS = "_held_weights"


def padded_query(
    table: Table, columns: Sequence[str], breakpoints: Sequence[Sequence[int]], block: np.ndarray,
    origin: Sequence[int], offset: Fraction | int | float = 0, *, label: str = "",
    group: tuple[tuple[str, Any], ...] = (),
) -> tuple[LinearQuery, int]:
    """``LinearQuery.from_grid(table, columns, breakpoints, W, offset, …)`` where ``W`` is zero
    on the grid except ``W[origin + i] = block[i]`` (``origin``: per axis, the box's first slab;
    ``block``: no larger than the grid beyond it), and how many numerators the query holds in
    memory (its block's, after merging).  ``W`` is never built."""
    w = np.asarray(block)
    if w.dtype.kind not in "iu":
        w = np.asarray(w, dtype=float)
        if not np.isfinite(w).all():
            raise UnsupportedQuery(
                "the query's weights are not finite (e.g. division by zero or an overflow in SUM's "
                "expression); make every row's contribution a finite number."
            )
    shape = [len(b) for b in breakpoints]
    position = {c.name.lower(): i for i, c in enumerate(table.columns)}
    axes = [position[c.lower()] if c.lower() in position else table.axis(c) for c in columns]
    order = sorted(range(len(axes)), key=axes.__getitem__)
    cols = [table.column(columns[i]).name for i in order]
    bps = [int_tuple(breakpoints[i]) for i in order]
    shape = [shape[i] for i in order]
    start = [int(origin[i]) for i in order]
    w = np.transpose(w, order) if w.ndim else w
    # The tightest box holding every non-zero weight (its edge slabs are not zero: they stay slabs).
    box = _tightest_box(w != 0)
    if box is None:  # no weight: the zero query, as from_grid makes it
        return LinearQuery.from_grid(table, [], [], np.zeros(()), offset, label=label, group=group), 0
    w = w[box]
    first = [s + b.start for s, b in zip(start, box, strict=True)]
    last = [s + b.stop for s, b in zip(start, box, strict=True)]
    if all(f == 0 for f in first) and last == shape:  # no padding: the plain construction
        return LinearQuery.from_grid(table, cols, bps, w, offset, label=label, group=group), w.size
    if w.size > 4096:
        reserve_memory(16 * w.size, "a query's weights", transient=True)
    # The padded array's distinct values are the block's and 0: rationalise exactly those (from_grid's
    # denominator is found on its distinct values).
    flat, den = rationalise(np.append(w.ravel(), np.zeros(1, dtype=w.dtype)))
    num = flat[:-1].reshape(w.shape)
    new_bps: list[tuple[int, ...]] = []
    for ax in range(num.ndim):
        whole = first[ax] == 0 and last[ax] == shape[ax]
        inner = bps[ax] if whole else bps[ax][first[ax]:last[ax]]
        if num.shape[ax] > 1:  # merge adjacent equal slices (padding slices are zero on both sides: the block's decide)
            head = (slice(None),) * ax
            changed = num[head + (slice(1, None),)] != num[head + (slice(None, -1),)]
            if num.ndim > 1:
                changed = changed.any(axis=tuple(a for a in range(num.ndim) if a != ax))
            if not changed.all():
                idx = [0, *(np.flatnonzero(changed) + 1).tolist()]
                num = num.take(idx, axis=ax)
                inner = tuple(inner[i] for i in idx)
        # A whole axis unmerged keeps its tuple (a wide column's shared unit slabs).
        new_bps.append(inner if whole else int_tuple(((bps[ax][0],) if first[ax] > 0 else ()) + tuple(inner)
                                                      + ((bps[ax][last[ax]],) if last[ax] < shape[ax] else ())))
    keep = [ax for ax in range(num.ndim) if len(new_bps[ax]) > 1]
    out = np.zeros([len(new_bps[ax]) for ax in keep], dtype=np.int64)
    out[tuple(slice(int(first[ax] > 0), int(first[ax] > 0) + num.shape[ax]) for ax in keep)] = \
        num.reshape([num.shape[ax] for ax in keep])
    out.setflags(write=False)
    query = LinearQuery(table.name, tuple(cols[ax] for ax in keep), tuple(new_bps[ax] for ax in keep),
                        out, den, as_fraction(offset), label=label, group=group)
    query.__dict__[HELD_WEIGHTS] = int(num.size)  # what the compiled-statement cache counts
    return query, int(num.size)


def nonzero_box(arrays: Sequence[np.ndarray]) -> tuple[slice, ...] | None:
    """The smallest box (a slice per axis) holding every non-zero value of ``arrays`` (one shape),
    or None when it is the whole grid or there is none (nothing to crop)."""
    if not arrays or not arrays[0].ndim:
        return None
    nonzero = np.zeros(arrays[0].shape, dtype=bool)
    for a in arrays:
        nonzero |= a != 0
    box = _tightest_box(nonzero)
    if box is None:
        return None
    sizes: tuple[int, ...] = nonzero.shape
    whole = all(s.stop - s.start == n for s, n in zip(box, sizes, strict=True))
    return None if whole else box


def _tightest_box(nonzero: np.ndarray) -> tuple[slice, ...] | None:
    """Per axis, the slice from the first to the last index where ``nonzero`` holds; None when it
    holds nowhere."""
    box: list[slice] = []
    for ax in range(nonzero.ndim):
        along = nonzero.any(axis=tuple(a for a in range(nonzero.ndim) if a != ax)) if nonzero.ndim > 1 else nonzero
        hit = np.flatnonzero(along)
        if not hit.size:
            return None
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
    return tuple(box)


def support_query(table: Table, query: LinearQuery) -> LinearQuery:
    """The 0/1 query of ``query``'s support (``from_grid`` of ``numerators != 0``), built from the
    box of its non-zero weights alone when that box is not the whole grid (a wide group's query)."""
    nonzero = np.asarray(query.numerators) != 0
    box = nonzero_box([nonzero]) if nonzero.size > 4096 else None
    if box is None:
        return LinearQuery.from_grid(table, query.columns, query.breakpoints, nonzero.astype(float))
    return padded_query(table, query.columns, query.breakpoints, nonzero[box].astype(np.int64),
                        [s.start for s in box])[0]


def divided(query: LinearQuery, divisor: int, denominator: int) -> LinearQuery:
    """``query`` with numerators ``numerators // divisor`` over ``denominator`` (offset, label and
    group kept); a large query's new numerators are written on its non-zero box alone (the rest
    stays fresh zero pages), and a divisor of 1 shares the read-only numerators."""
    num = query.numerators
    box = nonzero_box([num]) if divisor != 1 and num.size > 4096 else None
    if divisor == 1:
        out = num
    elif box is None:
        out = num // divisor
    else:
        out = np.zeros(num.shape, dtype=np.int64)
        out[box] = num[box] // divisor
    out.setflags(write=False)
    found = LinearQuery(query.table, query.columns, query.breakpoints, out, denominator, query.offset,
                        label=query.label, group=query.group)
    if divisor == 1 and "_digest" in query.__dict__:  # the same numerators: the same digest
        found.__dict__["_digest"] = query.__dict__["_digest"]
    return found
