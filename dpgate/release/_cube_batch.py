"""Bulk arithmetic of the cube's query batches on a union-grid histogram.

**Internal** (used by :mod:`dpgate.release.cube`, which runs the statements): pure
numpy on public query grids and on exact counts the cube has already read, so
nothing here touches the data source.  Every result is an exact integer.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpgate.compile.query import LinearQuery, slab_starts
from dpgate.errors import DPGateInternalError

__all__ = ["OneColumnBatch", "box_sums", "slab_bounds", "weighed_boxes"]


@dataclass(frozen=True)
class OneColumnBatch:
    """One-column queries on the same union axis, flattened: slab ``j`` of all of them
    spans union slabs ``[lo[j], hi[j])`` with numerator ``num[j]``; query ``q``'s slabs
    start at ``offsets[q]``."""

    lo: np.ndarray
    hi: np.ndarray
    num: np.ndarray
    offsets: np.ndarray
    n: int  # union slabs on this axis

    @classmethod
    def of(cls, queries: list[LinearQuery], ubp: np.ndarray) -> OneColumnBatch:
        bps = [np.asarray(q.breakpoints[0], dtype=np.int64) for q in queries]
        sizes = np.array([len(b) for b in bps], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        flat = np.concatenate(bps)
        lo = np.searchsorted(ubp, flat)
        if lo.max(initial=0) >= len(ubp) or not np.array_equal(ubp[lo], flat):
            raise DPGateInternalError("the union grid does not refine a query's breakpoints")
        hi = np.append(lo[1:], len(ubp))
        hi[offsets + sizes - 1] = len(ubp)  # each query's last slab runs to the end
        num = np.concatenate([np.asarray(q.numerators, dtype=np.int64).ravel() for q in queries])
        return cls(lo, hi, num, offsets, len(ubp))

    def weighed(self) -> np.ndarray:
        """Union slabs some query weighs (a difference array over the slab ranges)."""
        nz = self.num != 0
        diff = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(diff, self.lo[nz], 1)
        np.add.at(diff, self.hi[nz], -1)
        return np.cumsum(diff)[: self.n] > 0

    def values(self, per_slab: np.ndarray, total: int) -> list[int] | None:
        """Each query's exact ``Σ numerators·counts``; None when int64 could overflow."""
        if int(np.max(np.abs(self.num), initial=0)) * total >= 2**62:
            return None
        prefix = np.concatenate([[0], np.cumsum(per_slab, dtype=np.int64)])
        terms = self.num * (prefix[self.hi] - prefix[self.lo])
        return [int(v) for v in np.add.reduceat(terms, self.offsets)]


def slab_bounds(q: LinearQuery, axis_of: dict[str, int], ubps: list[np.ndarray]) -> list[np.ndarray]:
    """Per union axis, the query's slab boundaries as union-grid indices: slab ``i`` of
    the query spans union slabs ``[b[i], b[i+1])``; ``[0, n]`` where the query ignores
    the column.  (The union grid refines every query's grid.)"""
    out = [np.array([0, len(u)], dtype=np.int64) for u in ubps]
    for c, bp in zip(q.columns, q.breakpoints, strict=True):
        u = axis_of[c.lower()]
        starts = slab_starts(ubps[u], bp)
        if starts is None:
            raise DPGateInternalError(f"the union grid for {c} does not refine a query's breakpoints")
        out[u] = np.append(starts, len(ubps[u]))
    return out


def weighed_boxes(queries: Sequence[LinearQuery], bounds: Mapping[int, list[np.ndarray]],
                  shape: tuple[int, ...]) -> np.ndarray:
    """The union-grid boxes some query ``i`` of ``bounds`` weighs, as a boolean mask: ±1 at
    each weighed box's corners of a difference array, then prefix sums along every axis."""
    corners = list(itertools.product((0, 1), repeat=len(shape)))
    cover = np.zeros(tuple(n + 1 for n in shape), dtype=np.int64)
    for i, bnd in bounds.items():
        num = np.asarray(queries[i].numerators)
        nz = np.nonzero(num.reshape(tuple(len(x) - 1 for x in bnd)))
        if not len(nz[0]):
            continue
        for corner in corners:
            idx = tuple(x[j + k] for x, j, k in zip(bnd, nz, corner, strict=True))
            np.add.at(cover, idx, -1 if sum(corner) % 2 else 1)
    for ax in range(len(shape)):
        cover = np.cumsum(cover, axis=ax)
    return cover[tuple(slice(0, n) for n in shape)] > 0


def box_sums(hist: np.ndarray, queries: Sequence[LinearQuery], bounds: Mapping[int, list[np.ndarray]],
             total: int) -> dict[int, int]:
    """Each query ``i`` of ``bounds``: its exact ``Σ numerators·counts``, each of its boxes' count
    read from the histogram's prefix sums (inclusion–exclusion over the corners); ``total``
    is the histogram's sum (beyond int64's reach, Python integers)."""
    shape = hist.shape
    prefix = np.zeros(tuple(n + 1 for n in shape), dtype=np.int64)
    prefix[tuple(slice(1, None) for _ in shape)] = hist
    for ax in range(len(shape)):
        prefix = np.cumsum(prefix, axis=ax)
    out: dict[int, int] = {}
    for i, bnd in bounds.items():
        counts = prefix[np.ix_(*bnd)] if bnd else prefix
        for ax in range(len(bnd)):
            counts = np.diff(counts, axis=ax)
        num = np.asarray(queries[i].numerators).ravel()
        counts = counts.ravel()
        hit = np.flatnonzero(num)
        if int(np.max(np.abs(num), initial=0)) * total < 2**62:
            out[i] = int(np.dot(num[hit], counts[hit]))
        else:
            out[i] = sum(int(a) * int(b) for a, b in zip(num[hit].tolist(), counts[hit].tolist(), strict=True))
    return out
