"""Joint splits: one refinement that makes each of a statement's disjoint groups constant.

A GROUP BY's groups have pairwise disjoint supports; refining the atoms by a single
query that numbers them apart (:func:`joint_split`) costs one refinement instead of
one per group.  Pure functions of the queries' public structure, memoised.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from dpgate.compile.query import LinearQuery, slab_starts
from dpgate.errors import DPGateInternalError
from dpgate.schema.domains import Table

__all__ = ["joint_split"]


def _not_refined(column: str) -> DPGateInternalError:
    return DPGateInternalError(f"query grid on column {column!r} is not part of the atom partition; refine() it first")


#: Recent joint splits (:func:`joint_split`): a statement's groups are split for planning
#: and again when its records reach the live state.
_JOINT_SPLITS: dict[tuple[object, ...], tuple[LinearQuery | None, int]] = {}
_JOINT_SPLITS_MAX = 32
_JOINT_SPLITS_LOCK = threading.Lock()


def joint_split(table: Table, held: Sequence[LinearQuery]) -> tuple[LinearQuery | None, int]:
    """``(split, k)``: the first k queries of ``held`` have pairwise disjoint supports (k is
    ``len(held)`` when all have), and refining by ``split`` makes each of them constant
    (distinct weights of disjoint supports numbered apart; ``None`` when k < 2).
    A pure function of the queries (not of any atoms), memoised on their :attr:`~dpgate.compile.query.LinearQuery.pattern`."""
    key = (table, tuple(q.pattern for q in held))
    with _JOINT_SPLITS_LOCK:
        if key in _JOINT_SPLITS:
            return _JOINT_SPLITS[key]
    split = _compute_joint_split(table, held)
    with _JOINT_SPLITS_LOCK:
        while len(_JOINT_SPLITS) >= _JOINT_SPLITS_MAX:
            del _JOINT_SPLITS[next(iter(_JOINT_SPLITS))]
        _JOINT_SPLITS[key] = split
    return split


def _known_joint_split(table: Table, queries: Sequence[LinearQuery]) -> LinearQuery | None:
    """:func:`joint_split` of ``queries`` when it is remembered and covers all of them (a
    statement's groups, split when they were held), else None; never computed here."""
    with _JOINT_SPLITS_LOCK:
        split, run = _JOINT_SPLITS.get((table, tuple(q.pattern for q in queries)), (None, 0))
    return split if run == len(queries) else None


def _compute_joint_split(table: Table, held: Sequence[LinearQuery]) -> tuple[LinearQuery | None, int]:
    names = {c.lower() for q in held for c in q.columns}
    cols = tuple(c.name for c in table.columns if c.name.lower() in names)
    bps: dict[str, set[int]] = {c.lower(): set() for c in cols}
    for q in held:
        for c, b in zip(q.columns, q.breakpoints, strict=True):
            bps[c.lower()].update(b)
    grid = tuple(tuple(sorted(bps[c.lower()])) for c in cols)
    code = np.zeros(tuple(len(b) for b in grid), dtype=np.int64)
    base, run = 0, len(held)
    for k, q in enumerate(held):
        # Each query's non-zero boxes as boxes of the joint grid (few, for a group): slices, not a
        # pass over the whole grid per query (slow for a tree's thousands of leaves; benchmarks/README.md).
        boxes = _joint_boxes(q, cols, grid)
        if boxes is None:
            e = q.expand(table, cols, grid)
            on = e != 0
            if code[on].any():
                run = k
                break
            _, rank = np.unique(e[on], return_inverse=True)
            code[on] = base + 1 + rank
        else:
            if any(code[box].any() for box, _ in boxes):
                run = k
                break
            _, rank = np.unique([v for _, v in boxes], return_inverse=True)
            for (box, _), r in zip(boxes, rank.tolist(), strict=True):
                code[box] = base + 1 + r
        base += int(rank.max(initial=0)) + 1
    return (LinearQuery.from_grid(table, cols, grid, code.astype(float)) if run >= 2 else None), run


#: Above this many non-zero boxes, :func:`_joint_boxes` leaves a query to the grid pass.
_JOINT_BOXES = 64


def _joint_boxes(
    q: LinearQuery, cols: tuple[str, ...], grid: tuple[tuple[int, ...], ...]
) -> list[tuple[tuple[slice, ...], int]] | None:
    """``q``'s non-zero boxes of its own grid as ``(slices of the joint grid, numerator)``, or
    ``None`` when it has more than :data:`_JOINT_BOXES` of them.

    Raises:
        DPGateInternalError: the joint grid does not refine the query's grid."""
    nums = np.asarray(q.numerators)
    nonzero = np.argwhere(nums != 0)
    if len(nonzero) > _JOINT_BOXES:
        return None
    axis = {c.lower(): ax for ax, c in enumerate(cols)}
    spans = []
    for c, bp in zip(q.columns, q.breakpoints, strict=True):
        ax = axis.get(c.lower())
        if ax is None:
            raise _not_refined(c)
        at = slab_starts(grid[ax], bp)
        if at is None:
            raise _not_refined(c)
        starts = at.tolist()
        spans.append((ax, starts, [*starts[1:], len(grid[ax])]))
    out = []
    for idx in nonzero.tolist():
        box = [slice(None)] * len(cols)
        for (ax, starts, ends), i in zip(spans, idx, strict=True):
            box[ax] = slice(starts[i], ends[i])
        out.append((tuple(box), int(nums[tuple(idx)])))
    return out
