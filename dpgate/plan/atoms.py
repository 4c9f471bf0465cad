"""Atoms: the coarsest partition of a table's domain on which every query seen is constant.

Why one module of about 600 lines: its two partitions — :class:`AtomPartition` (the
inference atoms) and :class:`BoxGrid` (the cost grid) — share the grid base, the
refinement memo and the bitmap grouping below, and change together.

The gateway writes every query as a vector over *atoms* instead of over cells, so
a ``0..500000`` unit-cell income column or a 4096-cell histogram never needs a
dense vector: ``n`` queries with few predicates produce few atoms, however large
the domain.

Representation.  A product *grid* over the columns some query used (per column,
the union of the queries' slab breakpoints, in cell-index space) and an ``int32``
label per grid box: its atom.  Every query is constant on each box (its
breakpoints are among the grid's), so an atom — a set of boxes with equal label —
is a union of boxes on which all queries seen so far are constant.  Refining with
a new query splits each atom by the query's weight (new atom = distinct pair
``(old atom, weight)``), which keeps the partition the *coarsest* one: two boxes
share an atom iff every query so far gives them the same weight.  Atoms need not be
contiguous.

Refinement reads only the query's public structure (grid and weights), never data.

Limits: the grid may hold at most ``max_grid`` boxes (default 2²⁴, 64 MiB of
labels) and the partition at most ``max_atoms`` atoms (default 200 000); beyond
either :meth:`AtomPartition.refine` raises :class:`~dpgate.errors.UnsupportedQuery`
and leaves the partition unchanged.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from dpgate.compile.bounds import reserve_memory
from dpgate.compile.query import LinearQuery, breakpoint_array, expand_grid
from dpgate.errors import InvalidArgument, SchemaError, UnsupportedQuery
from dpgate.plan._joint import _joint_boxes, _known_joint_split, _not_refined, joint_split
from dpgate.schema.domains import Table

__all__ = ["AtomPartition", "BoxGrid", "joint_split"]


class _Grid:
    """What both partitions share: a product grid over the columns some query used (per
    column, the union of the queries' slab breakpoints, in cell-index space)."""

    def __init__(self, table: Table, max_grid: int) -> None:
        if max_grid < 1:
            raise InvalidArgument(f"max_grid must be ≥ 1, got {max_grid}.")
        self.table = table
        self.max_grid = int(max_grid)
        self._columns: tuple[str, ...] = ()
        self._bps: tuple[tuple[int, ...], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Columns of the grid (those some query used), in declaration order."""
        return self._columns

    @property
    def breakpoints(self) -> tuple[tuple[int, ...], ...]:
        """Per grid column, the cell indices where a slab starts (first is 0)."""
        return self._bps

    def _check_table(self, query: LinearQuery) -> None:
        if query.table.lower() != self.table.name.lower():
            raise SchemaError(
                f"query on table {query.table!r} given to a partition of table {self.table.name!r}."
            )

    def holds(self, query: LinearQuery) -> bool:
        """Whether every breakpoint of ``query`` is already one of the grid's."""
        sets = self.__dict__.get("_sets")
        if sets is None or sets[0] is not self._bps:
            sets = self._sets = (self._bps, {c.lower(): frozenset(b) for c, b in zip(self._columns, self._bps, strict=True)})
        found = sets[1]
        return all(c.lower() in found and found[c.lower()].issuperset(b)
                   for c, b in zip(query.columns, query.breakpoints, strict=True))

    def _merged_grid(self, query: LinearQuery) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
        """The grid with ``query``'s breakpoints added.

        Raises:
            UnsupportedQuery: it would have more than ``max_grid`` boxes.
        """
        merged = {c.lower(): set(b) for c, b in zip(self._columns, self._bps, strict=True)}
        for c, b in zip(query.columns, query.breakpoints, strict=True):
            merged.setdefault(c.lower(), set()).update(b)
        cols = tuple(c.name for c in self.table.columns if c.name.lower() in merged)
        bps = tuple(tuple(sorted(merged[c.lower()])) for c in cols)
        size = math.prod(len(b) for b in bps)
        if size > self.max_grid:
            shape = {c: len(b) for c, b in zip(cols, bps, strict=True)}
            raise UnsupportedQuery(
                f"table {self.table.name!r}: the queries so far cut the domain into a grid of {size} "
                f"boxes ({shape}), more than the limit of {self.max_grid}; use fewer distinct "
                "range boundaries or coarser bins."
            )
        return cols, bps

    def __getstate__(self) -> dict[str, object]:
        """Pickled without derived caches."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_sets", "_slab_cache", "_version")}


class AtomPartition(_Grid):
    """The coarsest partition of ``table``'s domain on which all refined queries are constant.

    Args:
        table: the declared table.
        max_atoms: refuse refinements that would make more atoms than this.
        max_grid: refuse refinements whose grid would have more boxes than this.

    Example:
        >>> from dpgate.schema.domains import Schema
        >>> t = Schema.from_dict({"tables": {"t": {"columns": {
        ...     "income": {"type": "integer", "min": 0, "max": 500000}}}}}).table("t")
        >>> p = AtomPartition(t)
        >>> q = LinearQuery.from_grid(t, ["income"], [[0, 30000, 500001]], np.array([0.0, 1.0, 0.0]))
        >>> p.refine(q).tolist()        # the one atom splits in two (NULL cell joins the zeros)
        [0, 0]
        >>> p.n_atoms, p.vector(q).tolist(), p.cell_sizes.tolist()
        (2, [0.0, 1.0], [30001.0, 470001.0])
    """

    def __init__(self, table: Table, max_atoms: int = 200_000, max_grid: int = 2**24) -> None:
        if max_atoms < 1 or max_grid < 1:
            raise InvalidArgument(f"max_atoms and max_grid must be ≥ 1, got {max_atoms} and {max_grid}.")
        super().__init__(table, max_grid)
        self.max_atoms = int(max_atoms)
        self._labels = np.zeros((), dtype=np.int32)
        self._rep = np.zeros(1, dtype=np.int64)
        self._n = 1

    # -- read-only views -------------------------------------------------------
    @property
    def n_atoms(self) -> int:
        """Number of atoms."""
        return self._n

    @property
    def labels(self) -> np.ndarray:
        """Read-only int32 array, one atom id per grid box (shape ``len(bp)`` per column)."""
        v = self._labels.view()
        v.setflags(write=False)
        return v

    @property
    def cell_sizes(self) -> np.ndarray:
        """Per atom, the number of *domain* cells it covers (float64).

        A grid box covers the product of its slab widths times the ``n_cells`` of every
        column not in the grid; the values sum to ``table.n_cells`` (up to float64
        rounding for astronomically large domains).
        """
        box = np.ones((), dtype=np.float64)
        for c, bp in zip(self._columns, self._bps, strict=True):
            w = np.diff(np.append(bp, self.table.column(c).n_cells)).astype(np.float64)
            box = np.multiply.outer(box, w)
        unused = math.prod(
            float(c.n_cells) for c in self.table.columns if c.name not in self._columns
        )
        return np.bincount(self._labels.ravel(), weights=np.ravel(box), minlength=self._n) * unused

    # -- refinement --------------------------------------------------------------
    def refine(self, query: LinearQuery) -> np.ndarray | None:
        """Make the partition fine enough that ``query`` is constant on every atom.

        Returns:
            ``parent`` (int64, length = new ``n_atoms``): new atom ``i`` is a part of old
            atom ``parent[i]`` (non-decreasing; ids of unsplit atoms may shift), or
            ``None`` when the atoms did not change.

        Raises:
            UnsupportedQuery: the grid would exceed ``max_grid`` boxes or the partition
                ``max_atoms`` atoms; the partition is then left unchanged.
        """
        self._check_table(query)
        if self._n == self._labels.size and self.holds(query):
            return None  # every grid box is an atom: a query on the grid is constant on each
        before = self._labels
        key = (id(before), self._bps, self.max_atoms, self.max_grid, _query_key(query))
        with _MEMO_LOCK:
            found = _MEMO.get(key)
        if found is not None and found[0] is before:  # the same split of the same partition (planned, then recorded)
            if isinstance(found[1], str):
                raise UnsupportedQuery(found[1])
            parent, after = found[1]
            self._commit(*after)
            return parent
        try:
            parent = self._refine(query)
        except UnsupportedQuery as e:
            _remember(key, before, str(e))
            raise
        _remember(key, before, (parent, (self._columns, self._bps, self._labels, self._rep, self._n)))
        return parent

    def _refine(self, query: LinearQuery) -> np.ndarray | None:
        cols, bps = self._merged_grid(query)
        # Labels and the (atom, weight) keys over the merged grid, and their ranks.
        reserve_memory(24 * math.prod(len(b) for b in bps), "the inference atoms' grid")
        # Each atom splits into at most the query's number of weights: only then can it refuse.
        if self._n * np.size(query.numerators) > self.max_atoms:
            bound = self._atoms_at_least(query, cols, bps)
            if bound > self.max_atoms:  # refused from the old grid, before expanding onto the new one
                raise self._over_limit(f"at least {bound}")
        labels = self._expanded_labels(cols, bps) if cols != self._columns or bps != self._bps else self._labels
        # Each box's new atom is the pair (old atom, rank of the query's weight there); the
        # weights are ranked on the query's own (small) grid, then expanded.
        values, qrank = np.unique(np.asarray(query.numerators), return_inverse=True)
        ranks = expand_grid(qrank.reshape(np.shape(query.numerators)), query.columns, query.breakpoints, cols, bps)
        flat = labels.ravel()
        key = flat.astype(np.int64) * values.size + np.ascontiguousarray(ranks).ravel()
        first, inverse = _first_and_inverse(key, self._n * values.size)
        n_new = first.size
        if n_new == self._n:  # constant on every atom: only the grid (maybe) changed
            self._commit(cols, bps, labels, self._rep_on(labels), self._n)
            return None
        if n_new > self.max_atoms:
            raise self._over_limit(str(n_new))
        parent = flat[first].astype(np.int64)
        new_labels = inverse.reshape(labels.shape)
        self._commit(cols, bps, new_labels, first.astype(np.int64), n_new)
        return parent

    def _over_limit(self, n_new: str) -> UnsupportedQuery:
        return UnsupportedQuery(
            f"table {self.table.name!r}: this query would split the domain into {n_new} atoms "
            f"(from {self._n}), more than the limit of {self.max_atoms}; ask fewer distinct "
            "pieces of the domain, or raise max_atoms."
        )

    def _atoms_at_least(self, query: LinearQuery, cols: tuple[str, ...], bps: tuple[tuple[int, ...], ...]) -> int:
        """A lower bound on the atoms after refining by ``query``, from the old grid alone: an
        atom meeting an old region ``R`` of the query's columns is split at least into the
        distinct weights ``query`` takes inside ``R``.  O(old grid + query's grid), where the
        exact count expands the labels onto the merged grid (a GROUP BY over a column cut
        finely only now multiplies it)."""
        if not query.columns:
            return self._n
        old = {c.lower(): (ax, bp) for ax, (c, bp) in enumerate(zip(self._columns, self._bps, strict=True))}
        qcols = tuple(c for c in cols if c.lower() in {q.lower() for q in query.columns})
        qbps = tuple(bps[cols.index(c)] for c in qcols)
        # The query's weight ranks on the merged grid of its own columns (small), and each of
        # those boxes' old region (its slab per column on the old grid; 0 where none).
        _, qrank = np.unique(np.asarray(query.numerators), return_inverse=True)
        ranks = np.asarray(expand_grid(qrank.reshape(np.shape(query.numerators)), query.columns,
                                       query.breakpoints, qcols, qbps)).ravel()
        region_shape = tuple(len(old[c.lower()][1]) if c.lower() in old else 1 for c in qcols)
        coords = np.meshgrid(*[
            np.searchsorted(breakpoint_array(old[c.lower()][1]), breakpoint_array(bp), side="right") - 1 if c.lower() in old
            else np.zeros(len(bp), dtype=np.int64) for c, bp in zip(qcols, qbps, strict=True)
        ], indexing="ij")
        region = np.ravel_multi_index([x.ravel() for x in coords], region_shape) if qcols else np.zeros(1, np.int64)
        # distinct weights per old region
        pairs = np.unique(region.astype(np.int64) * (int(ranks.max(initial=0)) + 1) + ranks)
        per_region = np.bincount(pairs // (int(ranks.max(initial=0)) + 1), minlength=math.prod(region_shape))
        # each old box's region: its slabs on the query's columns that the old grid has
        axes = [old[c.lower()][0] for c in qcols if c.lower() in old]
        labels: np.ndarray = self._labels
        if axes:
            moved = np.moveaxis(labels, axes, list(range(len(axes))))
            n_regions = math.prod(moved.shape[: len(axes)])
            box_region = np.repeat(np.arange(n_regions, dtype=np.int64), labels.size // n_regions)
            flat = moved.reshape(-1)
        else:
            box_region, flat = np.zeros(labels.size, dtype=np.int64), labels.ravel()
        # (a column the old grid lacks is one slab there: its axis has length 1 in the regions)
        best = np.zeros(self._n, dtype=np.int64)
        np.maximum.at(best, flat, per_region[box_region])
        return int(best.sum())

    def _commit(
        self,
        cols: tuple[str, ...],
        bps: tuple[tuple[int, ...], ...],
        labels: np.ndarray,
        rep: np.ndarray,
        n: int,
    ) -> None:
        self._columns, self._bps, self._labels, self._rep, self._n = cols, bps, labels, rep, n

    def _rep_on(self, labels: np.ndarray) -> np.ndarray:
        """Representative boxes re-expressed on an expanded grid (any box of each atom)."""
        if labels is self._labels:
            return self._rep
        flat = labels.ravel()
        rep = np.empty(self._n, dtype=np.int64)
        rep[flat[::-1]] = np.arange(flat.size - 1, -1, -1, dtype=np.int64)  # first occurrence wins
        return rep

    def _expanded_labels(self, cols: tuple[str, ...], bps: tuple[tuple[int, ...], ...]) -> np.ndarray:
        old = dict(zip(self._columns, self._bps, strict=True))
        view = self._labels
        for ax, (c, bp) in enumerate(zip(cols, bps, strict=True)):
            if c in old:
                if old[c] == bp:
                    continue  # the same slabs: no copy
                idx = np.searchsorted(breakpoint_array(old[c]), breakpoint_array(bp), side="right") - 1
                view = np.take(view, idx, axis=ax)
            else:
                view = np.repeat(np.expand_dims(view, ax), len(bp), axis=ax)
        return np.ascontiguousarray(view, dtype=np.int32)

    # -- query vectors -------------------------------------------------------------
    def atom_numerators(self, query: LinearQuery) -> np.ndarray:
        """The query's integer numerator on each atom (int64, length ``n_atoms``).

        ``query`` must have been refined into the partition (its grid is contained in
        the partition's grid and it is constant on atoms).
        """
        self._check_table(query)
        if not query.columns:
            return np.full(self._n, int(query.numerators), dtype=np.int64)
        mine, grids, starts = self._slabs()
        idx = []
        for c, qbp in zip(query.columns, query.breakpoints, strict=True):
            ax = mine.get(c.lower())
            if ax is None or not grids[ax].issuperset(qbp):
                raise _not_refined(c)
            idx.append(np.searchsorted(np.asarray(qbp), starts[ax], side="right") - 1)
        return np.asarray(query.numerators)[tuple(idx)].astype(np.int64)

    def _slabs(self) -> tuple[dict[str, int], list[frozenset[int]], list[np.ndarray]]:
        """Per column of the grid: its axis, its breakpoints as a set, and each atom's slab
        start — fixed until :meth:`refine` replaces the grid, so kept for the current one."""
        cached = self.__dict__.get("_slab_cache")
        if cached is not None and cached[0] is self._rep:
            return cached[1]
        shape = tuple(len(b) for b in self._bps)
        coords = np.unravel_index(self._rep, shape) if shape else ()
        slabs = ({c.lower(): ax for ax, c in enumerate(self._columns)}, [frozenset(b) for b in self._bps],
                 [breakpoint_array(b)[coords[ax]] for ax, b in enumerate(self._bps)])  # fmt: skip
        self._slab_cache = (self._rep, slabs)
        return slabs

    def vector(self, query: LinearQuery) -> np.ndarray:
        """The query's weight on each atom (float64, ``atom_numerators / denominator``)."""
        return self.atom_numerators(query) / query.denominator

    def vectors(self, queries: Sequence[LinearQuery]) -> list[np.ndarray]:
        """:meth:`vector` of each query (a GROUP BY's groups): queries over the same columns
        are located on the atoms together, one search per column for all of them."""
        split = _known_joint_split(self.table, queries) if len(queries) > 1 else None
        if split is not None:
            return list(self._by_split(queries, split))
        out: list[np.ndarray | None] = [None] * len(queries)
        by_columns: dict[tuple[str, ...], list[int]] = {}
        for i, q in enumerate(queries):
            by_columns.setdefault(tuple(c.lower() for c in q.columns), []).append(i)
        for cols, idxs in by_columns.items():
            if not cols or len(idxs) < 2 or len(idxs) * self._n > _BATCH_VECTORS:
                for i in idxs:
                    out[i] = self.vector(queries[i])
                continue
            for i, v in zip(idxs, self._located([queries[i] for i in idxs], cols), strict=True):
                out[i] = v
        return cast(list[np.ndarray], out)

    def _by_split(self, queries: Sequence[LinearQuery], split: LinearQuery) -> np.ndarray:
        """The vectors of disjoint ``queries``, as rows, from their joint split's code on each
        atom (:func:`joint_split`: code ``base + 1 + rank`` for each query's distinct non-zero
        numerators, in order): one location for all of them.  Each query being constant on
        the atoms, so is the split; the same numbers as :meth:`vector`."""
        weights = []
        for q in queries:
            nums = np.asarray(q.numerators, dtype=np.int64).ravel()
            weights.append(np.unique(nums[nums != 0]) / q.denominator)
        # Code c > 0 is query owner[c]'s weight value[c]: written atom by atom into C-ordered rows
        # (gathering columns of a k × codes table gave Fortran-ordered rows, so every later pass
        # over one vector strode across all of them, and the table was k × n too).
        owner = np.concatenate([[-1], np.repeat(np.arange(len(queries)), [w.size for w in weights])])
        value = np.concatenate([[0.0], *weights])
        codes = np.asarray(self.atom_numerators(split))
        out = np.zeros((len(queries), codes.size))
        hit = np.flatnonzero(codes)
        out[owner[codes[hit]], hit] = value[codes[hit]]
        return out

    def _located(self, queries: Sequence[LinearQuery], cols: tuple[str, ...]) -> np.ndarray:
        """The vectors of queries over the columns ``cols``, as rows: each query's slab index on
        each column for every atom, by one search over all their breakpoints (offset per query)."""
        for q in queries:
            self._check_table(q)
        mine, grids, starts = self._slabs()
        k = len(queries)
        flat = np.zeros((k, self._n), dtype=np.int64)  # each atom's box index in each query's grid
        for axis, c in enumerate(cols):
            ax = mine.get(c)
            bps = [q.breakpoints[axis] for q in queries]
            if ax is None or not all(grids[ax].issuperset(bp) for bp in bps):
                raise _not_refined(c)
            span = int(max(starts[ax].max(initial=0), max(bp[-1] for bp in bps))) + 1
            sizes = np.array([len(bp) for bp in bps])
            first = np.cumsum(sizes) - sizes
            keys = np.concatenate([np.asarray(bp, dtype=np.int64) for bp in bps]) + np.repeat(np.arange(k) * span, sizes)
            at = np.searchsorted(keys, np.arange(k)[:, None] * span + starts[ax][None, :], side="right") - 1
            # row-major strides of each query's grid, this axis's
            stride = np.array([math.prod(len(b) for b in q.breakpoints[axis + 1:]) for q in queries])
            flat += (at - first[:, None]) * stride[:, None]
        nums = [np.asarray(q.numerators, dtype=np.int64).ravel() for q in queries]
        sizes = np.array([n.size for n in nums])
        offsets = np.cumsum(sizes) - sizes
        weights = np.concatenate(nums)[flat + offsets[:, None]]
        return weights / np.array([q.denominator for q in queries], dtype=np.float64)[:, None]

    def __repr__(self) -> str:
        grid = ", ".join(f"{c}:{len(b)}" for c, b in zip(self._columns, self._bps, strict=True)) or "none"
        return f"<AtomPartition {self.table.name} atoms={self._n} grid=[{grid}]>"


#: Largest (queries × atoms) array :meth:`AtomPartition.vectors` builds at once.
_BATCH_VECTORS = 1 << 22


class GridVersion:
    """A grid's ``(table, columns, breakpoints)`` as a dictionary key whose hash is computed
    once: hashing a large grid's breakpoints on every memo lookup adds up (benchmarks/README.md)."""

    __slots__ = ("_hash", "key")

    def __init__(self, key: tuple[str, tuple[str, ...], tuple[tuple[int, ...], ...]]) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, GridVersion) and self._hash == other._hash and self.key == other.key)


class BoxGrid(_Grid):
    """The product grid of every refined query's breakpoints, each box an atom.

    A finer partition than :class:`AtomPartition`'s (which merges boxes every query
    weighs alike) that costs nothing to refine beyond re-indexing the grid: the
    per-cell accounting's (``dpgate.plan.state``), where an atom is a sum and a max.  The
    same reading interface as :class:`AtomPartition`.

    Args:
        table: the declared table.
        max_grid: refuse refinements whose grid would have more boxes than this.
    """

    def __init__(self, table: Table, max_grid: int = 2**24) -> None:
        super().__init__(table, max_grid)
        self._labels: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(b) for b in self._bps)

    @property
    def n_atoms(self) -> int:
        """Number of boxes."""
        return math.prod(self.shape)

    @property
    def version(self) -> GridVersion:
        """Equal for equal grids (what anything computed on the boxes depends on)."""
        found = self.__dict__.get("_version")
        if found is None or found.key[2] is not self._bps:
            found = self._version = GridVersion((self.table.name.lower(), self._columns, self._bps))
        return found

    def nonzero_weights(self, query: LinearQuery) -> tuple[np.ndarray, np.ndarray] | None:
        """``(boxes, weights)``: the boxes where :meth:`vector` is non-zero, increasing, and
        its values there, found from the query's own non-zero boxes (:func:`_joint_boxes`) in
        O(their size), not O(the grid) — a tree node over a 4 096-box grid.  ``None`` when the
        query has more than :data:`_JOINT_BOXES` non-zero boxes (or none of its columns)."""
        self._check_table(query)
        found = _joint_boxes(query, self._columns, self._bps) if query.columns else None
        if found is None:
            return None
        shape = self.shape
        strides = [math.prod(shape[ax + 1:]) for ax in range(len(shape))]
        boxes, numerators = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        for box, num in found:
            flat = np.zeros(1, dtype=np.int64)
            for ax, (cut, n) in enumerate(zip(box, shape, strict=True)):  # row-major: increasing
                r = range(n)[cut]
                flat = (flat[:, None] + np.arange(r.start, r.stop, dtype=np.int64)[None, :] * strides[ax]).ravel()
            boxes.append(flat)
            numerators.append(np.full(flat.size, num, dtype=np.int64))
        at = np.concatenate(boxes)
        order = np.argsort(at, kind="stable")
        return at[order], np.concatenate(numerators)[order] / query.denominator  # as vector() divides

    @property
    def labels(self) -> np.ndarray:
        """Each box's atom: its flat index (read-only, shape ``len(bp)`` per column)."""
        if self._labels is None:
            self._labels = np.arange(self.n_atoms, dtype=np.int64).reshape(self.shape)
            self._labels.setflags(write=False)
        return self._labels

    def refine(self, query: LinearQuery) -> np.ndarray | None:
        """Add ``query``'s breakpoints to the grid.

        Returns:
            ``parent`` (int64, one per new box): the old box containing it, or ``None``
            when the grid did not change.

        Raises:
            UnsupportedQuery: the grid would exceed ``max_grid`` boxes (it is then unchanged).
        """
        old = self.labels
        expand = self.regrid(query)
        return None if expand is None else expand(old)

    def regrid(self, query: LinearQuery) -> Callable[[np.ndarray], np.ndarray] | None:
        """:meth:`refine`, returning instead of ``parent`` the map of per-box values on the old
        grid onto the new one (``values[parent]``, by slabs: no index array as large as the grid).

        Raises:
            UnsupportedQuery: as :meth:`refine`.
        """
        self._check_table(query)
        if self.holds(query):
            return None
        cols, bps = self._merged_grid(query)
        reserve_memory(16 * math.prod(len(b) for b in bps), "a grid of per-cell costs")  # the costs, and their expansion
        old_cols, old_bps, old_shape = self._columns, self._bps, self.shape
        self._columns, self._bps, self._labels = cols, bps, None

        def expand(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(expand_grid(values.reshape(old_shape), old_cols, old_bps, cols, bps)).ravel()

        return expand

    def atom_numerators(self, query: LinearQuery) -> np.ndarray:
        """The query's integer numerator on each box (its grid must be part of this one)."""
        return np.ascontiguousarray(
            expand_grid(np.asarray(query.numerators), query.columns, query.breakpoints, self._columns, self._bps),
            dtype=np.int64,
        ).ravel()

    def boxes_by_cell(self, query: LinearQuery) -> tuple[np.ndarray, np.ndarray]:
        """``(numerators, boxes)``: ``query``'s integer numerator on each cell of this grid's
        slabs of the query's own columns (flat), and the boxes inside each such cell (one row
        per cell).  A query depends on its columns only, so this locates its boxes without
        expanding it onto the whole grid (its grid must be part of this one)."""
        self._check_table(query)
        names = [c.lower() for c in self._columns]
        axes = [names.index(c.lower()) for c in query.columns]
        nums = np.asarray(expand_grid(np.asarray(query.numerators), query.columns, query.breakpoints,
                                      [self._columns[a] for a in axes], [self._bps[a] for a in axes])).ravel()
        boxes = np.arange(self.n_atoms, dtype=np.int64).reshape(self.shape)
        boxes = np.moveaxis(boxes, axes, list(range(len(axes)))).reshape(nums.size, -1)
        return nums.astype(np.int64), boxes

    def vector(self, query: LinearQuery) -> np.ndarray:
        """The query's weight on each box."""
        return self.atom_numerators(query) / query.denominator

    def atom_of(self, coarser: AtomPartition) -> np.ndarray:
        """For each box, the atom of ``coarser`` containing it (its grid must be part of this one)."""
        return np.ascontiguousarray(
            expand_grid(np.asarray(coarser.labels), coarser.columns, coarser.breakpoints, self._columns, self._bps),
            dtype=np.int64,
        ).ravel()

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the labels (derived) either."""
        return {**super().__getstate__(), "_labels": None}

    def __repr__(self) -> str:
        grid = ", ".join(f"{c}:{len(b)}" for c, b in zip(self._columns, self._bps, strict=True)) or "none"
        return f"<BoxGrid {self.table.name} boxes={self.n_atoms} grid=[{grid}]>"


#: Recent refinements, by (partition's label array, limits, query): a statement's queries refine
#: its planning copy and then, identically, the live state.  Entries hold the label array they
#: started from (so its id cannot be reused while they live); label arrays are never written.
_Refined = tuple[np.ndarray | None, tuple[tuple[str, ...], tuple[tuple[int, ...], ...], np.ndarray, np.ndarray, int]]
_MEMO: dict[tuple[object, ...], tuple[np.ndarray, _Refined | str]] = {}
_MEMO_SIZE = 16
_MEMO_LOCK = threading.Lock()


def _remember(key: tuple[object, ...], before: np.ndarray, result: _Refined | str) -> None:
    with _MEMO_LOCK:
        while len(_MEMO) >= _MEMO_SIZE:
            del _MEMO[next(iter(_MEMO))]
        _MEMO[key] = (before, result)


def _query_key(query: LinearQuery) -> tuple[object, ...]:
    return (query.table.lower(), *query.pattern)


#: Below this many possible (atom, weight) keys, distinct keys are found with a bitmap
#: (linear time) instead of a sort.
_BITMAP_KEYS = 1 << 26


def _first_and_inverse(key: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_index=True, return_inverse=True)[1:]`` for keys in
    ``[0, n_keys)``: each distinct key's first position (in key order) and every
    position's rank among the distinct keys (int32)."""
    if n_keys > min(_BITMAP_KEYS, 8 * key.size):
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first.astype(np.int64), inverse.astype(np.int32)
    present = np.zeros(n_keys, dtype=bool)
    present[key] = True
    rank = np.cumsum(present, dtype=np.int32) - 1
    inverse = rank[key]
    first = np.empty(int(rank[-1]) + 1, dtype=np.int64)
    first[inverse[::-1]] = np.arange(key.size - 1, -1, -1, dtype=np.int64)  # the first occurrence wins
    return first, inverse
