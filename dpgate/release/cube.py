"""The cube: exact row counts per cell, computed by the data engine from SQL that dpgate generates.

Why one module of about 630 lines: the data sources, the locking and the
exact-count cache sit behind one privacy boundary ("never release"), which is
easier to audit in one file; SQL generation lives in ``_cube_sql.py`` and the
bulk arithmetic of query batches in ``_cube_batch.py``.

**Internal: never release.**  Everything this module returns is an *exact*
aggregate of the private data.  Only the gateway may use it, and only to add
calibrated noise; tests use it to check the compiler.  Nothing here may be
printed, logged, returned to an analyst or written to a ledger.

Data sources (``Cube(data, schema)``):

* a DuckDB database file path, opened ``read_only=True`` (the file is never modified);
* an existing ``duckdb.DuckDBPyConnection`` (the caller keeps ownership; views over
  Parquet/CSV, attached warehouses … all work);
* a pandas DataFrame (one-table schema) or a ``{table_name: DataFrame}`` dict,
  registered in a private in-memory DuckDB connection;
* PostgreSQL (a ``postgresql://`` URL, SQLAlchemy engine or DB-API connection) and
  Spark (a DataFrame or ``(SparkSession, table)``): see :mod:`dpgate.backends`.

Every statement that touches data is built with sqlglot expression builders from
the *schema* (public) and the catalog's column types, never from analyst text,
written in the backend's sqlglot dialect, and runs through the single private
method :meth:`Cube._execute` (the backend refuses anything but a ``SELECT``).
Catalog lookups go through the backend's ``catalog``.  Undeclared columns (e.g. an
identifier ``pid``) are never read, except a table's declared ``privacy_unit``, which only
partitions its rows to keep at most ``k`` per person (:mod:`dpgate.release._bounding`).

The row → cell mapping and the SQL that computes it live in :mod:`dpgate.release._cube_sql`.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.backends import engine_failure, open_backend
from dpgate.compile.query import LinearQuery, breakpoint_array, union_grid
from dpgate.errors import (
    DPGateInternalError,
    Error,
    InvalidArgument,
    OperationalError,
    SchemaError,
    UnsupportedQuery,
)
from dpgate.release._bounding import bounded_table, row_order_key, unit_column
from dpgate.release._cube_batch import OneColumnBatch, box_sums, slab_bounds, weighed_boxes
from dpgate.release._cube_sql import BoundColumn, disjunction, grouped_counts, leaf_count, set_condition, type_class
from dpgate.release._dates import temporal_class
from dpgate.release._join_sql import duplicate_keys, joined_relation, public_keys
from dpgate.schema._frame_check import check_frame_values
from dpgate.schema._joins import JoinedTable
from dpgate.schema.domains import Schema, Table

__all__ = ["Cube", "MAX_HISTOGRAM_BOXES"]

#: Largest dense histogram :meth:`Cube.histogram` returns (boxes of int64).
MAX_HISTOGRAM_BOXES = 2**24
#: Columns with at most this many slabs are grouped by a CASE over raw-value ranges;
#: finer ones are grouped by cell index and reduced to slabs in numpy.
_CASE_SLABS = 32
#: A query is answered by filtered ``COUNT(*)`` aggregates when its conditions have at
#: most this many leaf predicates; otherwise by a histogram on its grid and a dot product.
_MAX_FILTER_LEAVES = 512
#: The masked histogram filters rows in SQL only when the mask keeps at most this share of the boxes.
_FILTER_SHARE = 0.75
#: …and at most this many distinct non-baseline weights.
_MAX_FILTER_TERMS = 32
#: ``true_numerators`` switches from filtered aggregates to one union-grid histogram
#: when it would need more aggregates than this and the union grid is small enough.
_MAX_BATCH_TERMS = 64
_MAX_BATCH_GRID = 2**20


class Cube:
    """Exact counts of a table's rows per cell, from a DuckDB, PostgreSQL or Spark source.

    Internal: never release anything a Cube returns.

    Args:
        data: DuckDB file path (opened read-only), ``duckdb`` connection, pandas
            DataFrame (one-table schema) or ``{table_name: DataFrame}``; a PostgreSQL
            URL, SQLAlchemy engine or DB-API connection; a Spark DataFrame or
            ``(SparkSession, table)``; or a :class:`dpgate.backends.Backend`.
        schema: a :class:`~dpgate.schema.domains.Schema`, dict or YAML path.

    Raises:
        SchemaError: a declared table or column is missing from the source.
        OperationalError: the database file cannot be opened.

    Example:
        >>> import pandas as pd
        >>> from dpgate.schema.domains import Schema
        >>> s = Schema.from_dict({"tables": {"t": {"columns": {"x": {"type": "integer", "min": 0, "max": 2}}}}})
        >>> with Cube(pd.DataFrame({"x": [0, 1, 1, 7, None]}), s) as cube:
        ...     cube.histogram("t").tolist()       # cells 0, 1, 2 (7 clamped), NULL
        [1, 2, 1, 1]
    """

    def __init__(self, data: Any, schema: Any, *, row_order: bytes | None = None) -> None:
        self.schema = Schema.load(schema)
        self._lock = threading.RLock()
        self._closed = False
        self.order_rows(secrets.token_bytes(32) if row_order is None else row_order)
        self._backend = open_backend(data, [t.name for t in self.schema.tables])
        self.dialect: str = self._backend.dialect
        try:
            frames = getattr(self._backend, "frames", None) or {}
            for name, df in frames.items():
                table = next((t for t in self.schema.tables if t.name.lower() == name), None)
                if table is not None:
                    check_frame_values(df, table)
            self._bind()
        except BaseException:
            self.close()
            raise

    # -- binding to the catalog (metadata only) ------------------------------
    def _bind(self) -> None:
        with self._lock:
            self._check_open()
            try:
                found = self._backend.catalog([t.name for t in self.schema.tables])
            except Error:
                raise
            except Exception as exc:
                raise engine_failure(self.dialect, exc) from None
        self._tables: dict[str, tuple[exp.Table, dict[str, BoundColumn]]] = {}
        self._units: dict[str, str] = {}  # table → physical privacy-unit column (unit tables only)
        self._found: dict[str, dict[str, tuple[str, str]]] = {}  # table → its catalog columns (joins' keys)
        self._joins: dict[str, tuple[exp.Expression, dict[str, BoundColumn]]] = {}  # join → relation, columns
        missing_tables, missing_cols = [], []
        for t in self.schema.tables:
            binding = found.get(t.name.lower())
            if binding is None:
                missing_tables.append(t.name)
                continue
            bound: dict[str, BoundColumn] = {}
            for c in t.columns:
                if c.name.lower() not in binding.columns:
                    missing_cols.append(f"{t.name}.{c.name}")
                    continue
                phys, typ = binding.columns[c.name.lower()]
                tclass = temporal_class(typ) if c.kind in ("date", "timestamp") else type_class(typ)
                bound[c.name.lower()] = BoundColumn(c, phys, tclass, self.dialect)
            self._tables[t.name.lower()] = (binding.ref, bound)
            self._found[t.name.lower()] = binding.columns
            if t.privacy_unit is not None:
                self._units[t.name.lower()] = unit_column(t, binding.columns)
        if missing_tables or missing_cols:
            parts = []
            if missing_tables:
                parts.append(f"tables {missing_tables}")
            if missing_cols:
                parts.append(f"columns {missing_cols}")
            raise SchemaError(f"the data source lacks declared {' and '.join(parts)}; fix the schema or the source.")

    # -- execution -------------------------------------------------------------
    def _execute(self, expression: exp.Select, *, numpy: bool = False) -> Any:
        """Run one generated statement against the data (the only path that reads rows)."""
        with self._lock:
            self._check_open()
            try:
                return self._backend.run(expression, numpy=numpy)
            except Error:
                raise
            except Exception as exc:  # a backend that let an engine error through: never its message
                raise engine_failure(self.dialect, exc) from None

    def _check_open(self) -> None:
        if self._closed:
            raise OperationalError("this Cube is closed.")

    def order_rows(self, secret: bytes) -> None:
        """Key the order in which a privacy unit's rows are kept (:mod:`dpgate.release._bounding`):
        the gateway passes a secret derived from its ledger's key, so that every answer of a ledger
        is about the same bounded table.  Default: a random secret, fixed for this cube's life."""
        self._row_order = row_order_key(secret)
        self._joins = {}  # relations written with the old key

    def _table(self, name: str) -> tuple[Table, exp.Expression, dict[str, BoundColumn]]:
        """The table, the relation the generated SQL reads (at most ``k`` rows per privacy unit),
        and its bound columns."""
        t = self.schema.table(name)
        if isinstance(t, JoinedTable):
            return t, *self._joined(t)
        ref, cols = self._tables[t.name.lower()]
        unit = self._units.get(t.name.lower())
        if unit is None:
            return t, ref, cols
        bounded = bounded_table(ref, t.name, unit, [cols[c.name.lower()] for c in t.columns], t.bound(),
                                self._row_order, self.dialect)
        return t, bounded, cols

    def _joined(self, t: JoinedTable) -> tuple[exp.Expression, dict[str, BoundColumn]]:
        """A declared join's relation (:mod:`dpgate.release._join_sql`); first, its public tables' keys
        are checked unique (public rows: reading them reveals no one)."""
        with self._lock:
            found = self._joins.get(t.name.lower())
            if found is None:
                for name, key in public_keys(t, self.schema, self._found):
                    res = self._execute(duplicate_keys(self._tables[name.lower()][0], key), numpy=True)
                    if int(np.asarray(res["n"]).sum()):
                        raise SchemaError(
                            f"public table {name!r} declares key {key!r}, but {int(np.asarray(res['n']).sum())} of its "
                            "values occur on several rows, so a join would count a row once per copy; make the key "
                            "unique in the source (one row per key), or declare the column that is."
                        )
                found = self._joins[t.name.lower()] = joined_relation(
                    t, self.schema, self._tables, self._units, self._found, self._row_order, self.dialect)
            return found

    # -- histograms ------------------------------------------------------------
    def histogram(
        self,
        table: str,
        columns: Sequence[str] | None = None,
        breakpoints: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray:
        """Exact row counts on a product grid (internal: never release).

        Args:
            table: declared table.
            columns: columns of the grid, in the order of the output axes (default: all
                declared columns).
            breakpoints: per column, increasing slab starts beginning at 0 (default: every
                cell, i.e. full resolution).

        Returns:
            int64 array of shape ``(len(bp) for bp in breakpoints)``.

        Raises:
            SchemaError: an undeclared column.
            UnsupportedQuery: the grid has more than ``MAX_HISTOGRAM_BOXES`` boxes.
        """
        t, ref, cols = self._table(table)
        names = [c.name for c in t.columns] if columns is None else list(columns)
        decl = [t.column(c) for c in names]
        if breakpoints is None:
            bps = [tuple(range(c.n_cells)) for c in decl]
        else:
            if len(breakpoints) != len(names):
                raise InvalidArgument(f"{len(names)} columns but {len(breakpoints)} breakpoint lists.")
            bps = [tuple(int(b) for b in bp) for bp in breakpoints]
        for c, bp in zip(decl, bps, strict=True):
            if not bp or bp[0] != 0 or any(b <= a for a, b in zip(bp, bp[1:], strict=False)) or bp[-1] >= c.n_cells:
                raise InvalidArgument(
                    f"breakpoints of column {c.name!r} must increase strictly from 0 and stay below "
                    f"its {c.n_cells} cells."
                )
        shape = tuple(len(b) for b in bps)
        size = math.prod(shape)
        if size > MAX_HISTOGRAM_BOXES:
            raise UnsupportedQuery(
                f"a histogram of table {t.name!r} on {dict(zip(names, shape, strict=True))} would have {size} boxes, "
                f"more than the limit of {MAX_HISTOGRAM_BOXES}; use fewer columns or coarser slabs."
            )
        return self._histogram(ref, [cols[c.name.lower()] for c in decl], bps)

    def _histogram(
        self, ref: exp.Expression, cols: list[BoundColumn], bps: list[tuple[int, ...]], mask: np.ndarray | None = None
    ) -> np.ndarray:
        """Counts on the grid; with ``mask``, only boxes where it is True are counted
        (others are returned as 0) and the rest of the table is filtered out in SQL."""
        shape = tuple(len(b) for b in bps)
        if mask is not None and not mask.any():
            return np.zeros(shape, dtype=np.int64)
        idx, counts = self._occupied(ref, cols, bps, mask)
        out = np.zeros(math.prod(shape), dtype=np.int64)
        if counts.size and shape:
            np.add.at(out, np.ravel_multi_index(tuple(idx), shape), counts)
        elif counts.size:
            out[0] = int(counts.sum())
        out = out.reshape(shape)
        if mask is not None:
            out = np.where(mask, out, 0)
        return out

    def _occupied(
        self, ref: exp.Expression, cols: list[BoundColumn], bps: list[tuple[int, ...]], mask: np.ndarray | None = None
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """The grid's counts as the engine returns them: per axis, the box index of each
        returned group, and its row count (boxes without rows are absent; a box may appear
        more than once).  ``mask``: as in :meth:`_histogram` (rows of boxes outside it may
        still be returned)."""
        shape = tuple(len(b) for b in bps)
        where = None
        fixed: dict[int, int] = {}
        if mask is not None:
            # A filter that keeps most boxes (a GROUP BY's declared values, leaving out NULL and
            # undeclared ones) costs more to evaluate than the rows it saves: count them, drop them here.
            cond = set_condition(cols, bps, mask) if mask.mean() <= _FILTER_SHARE else exp.true()
            if leaf_count(cond) <= _MAX_FILTER_LEAVES and not (isinstance(cond, exp.Boolean) and cond.this is True):
                where = cond
                # Axes on which every selected box lies in one slab need no GROUP BY key.
                for ax in range(len(shape)):
                    used = np.flatnonzero(mask.any(axis=tuple(i for i in range(len(shape)) if i != ax)))
                    if len(used) == 1:
                        fixed[ax] = int(used[0])
        keys: list[tuple[int, exp.Expression | None]] = []
        by_cell, bin_keys, text_keys = [], [], []
        for ax, (c, bp) in enumerate(zip(cols, bps, strict=False)):
            if ax in fixed:
                continue
            full = len(bp) == c.decl.n_cells
            text = c.text_keyed()
            if full or len(bp) > _CASE_SLABS:
                # Many bins of a few-valued integer column: a clamped value, binned in numpy,
                # rather than a CASE search tree as large as the bins.
                binned_int = c.decl.kind == "binned" and c.few_values() and len(c.decl.edges) > _CASE_SLABS
                key = c.bin_key() if binned_int else c.value() if text else None if c.looked_up() else c.cell_index()
                keys.append((ax, key))
                bin_keys.append(binned_int)
                text_keys.append(text)
                by_cell.append(not full)
            else:
                keys.append((ax, c.slab_index(bp)))
                bin_keys.append(False)
                text_keys.append(False)
                by_cell.append(False)
        res = self._execute(grouped_counts(ref, [cols[ax] for ax, _ in keys], [k for _, k in keys], where,
                                           direct=text_keys), numpy=True)
        counts = np.asarray(res["n"], dtype=np.int64)
        idx: list[Any] = [None] * len(shape)
        for ax, v in fixed.items():
            idx[ax] = np.full(counts.shape, v, dtype=np.int64)
        for i, ((ax, _), cell) in enumerate(zip(keys, by_cell, strict=False)):
            if text_keys[i]:
                k = cols[ax].cells_of_text(res[f"k{i}"])
            else:
                k = np.asarray(res[f"k{i}"], dtype=np.int64)
            if bin_keys[i]:
                k = cols[ax].bins_of_key(k)
            if cell:
                k = np.searchsorted(np.asarray(bps[ax]), k, side="right") - 1
            idx[ax] = k
        return idx, counts

    # -- true answers ----------------------------------------------------------
    def _terms(self, query: LinearQuery, cols: dict[str, BoundColumn]) -> tuple[int, list[tuple[int, exp.Expression]]] | None:
        """``Σ numerators·count`` as ``base·rows + Σ coef·COUNT(*) FILTER (cond)``, or None if too big."""
        num = np.asarray(query.numerators)
        if num.ndim == 0:
            return int(num), []
        if query.has_more_weights_than(_MAX_FILTER_TERMS + 1):  # too many terms, known without a sort
            return None
        vals, counts = np.unique(num, return_counts=True)
        # baseline: the most common weight (0 on ties), so negations stay small.
        best = int(np.argmax(counts))
        base = int(vals[best])
        if 0 in vals.tolist() and counts[vals.tolist().index(0)] == counts[best]:
            base = 0
        others = [int(v) for v in vals.tolist() if v != base]
        if len(others) > _MAX_FILTER_TERMS:
            return None
        bound = [cols[c.lower()] for c in query.columns]
        terms, leaves = [], 0
        for v in others:
            cond = set_condition(bound, query.breakpoints, num == v)
            leaves += leaf_count(cond)
            if leaves > _MAX_FILTER_LEAVES:
                return None
            terms.append((v - base, cond))
        return base, terms

    def true_numerator(self, query: LinearQuery) -> int:
        """Exact ``Σ_box numerators[box]·count[box]`` (internal: never release).

        The true answer is ``true_numerator(q) / q.denominator + q.offset``.  Small
        conditions run as one ``SELECT COUNT(*) … WHERE …`` (or filtered counts); large
        ones as a histogram on the query's grid and an exact dot product.
        """
        return self.true_numerators([query])[0]

    def true_numerators(self, queries: Sequence[LinearQuery]) -> list[int]:
        """``true_numerator`` of several queries, one scan per table (internal: never release)."""
        out: list[int | None] = [None] * len(queries)
        by_table: dict[str, list[int]] = {}
        names: dict[str, str] = {}  # as written → declared, lower-cased
        for i, q in enumerate(queries):
            name = names.get(q.table)
            if name is None:
                name = names[q.table] = self.schema.table(q.table).name.lower()
            by_table.setdefault(name, []).append(i)
        for tname, idxs in by_table.items():
            for i, v in zip(idxs, self._numerators_one_table(tname, [queries[i] for i in idxs]), strict=True):
                out[i] = v
        return [int(v) for v in out]  # type: ignore[arg-type]

    def _numerators_one_table(self, table: str, queries: list[LinearQuery]) -> list[int]:
        t, ref, cols = self._table(table)
        union_cols, union_bps = union_grid(t, queries)
        union_size = math.prod(len(b) for b in union_bps)
        n_terms, zero_based = 0, True
        for q in queries:
            if q.has_more_weights_than(_MAX_BATCH_TERMS + 1):  # a wide query: its weights alone decide
                # SUM(income): a dense grid of 500 002 boxes per group costs more than the rows.
                return self._numerators_on_rows(ref, cols, queries, union_cols, union_bps)
            u = set(np.asarray(q.numerators).ravel().tolist())  # a few small weights: no sort
            n_terms += len(u) - 1
            zero_based = zero_based and 0 in u
            if n_terms > _MAX_BATCH_TERMS:  # decides hist_first on its own
                break
        plans = None
        # Several weights or queries, all zero outside their regions: grouping the
        # weighed region by slab beats one FILTER per term.  A single condition, or a
        # query that weighs most of the table (negations), runs as filtered counts.
        hist_first = n_terms > _MAX_BATCH_TERMS or (n_terms > 1 and zero_based)
        if not hist_first or union_size > _MAX_BATCH_GRID:
            plans = [self._terms(q, cols) for q in queries]
        big = [i for i, p in enumerate(plans or []) if p is None]
        if (plans is None or big) and union_size <= _MAX_BATCH_GRID:
            return self._numerators_on_union_grid(ref, cols, queries, union_cols, union_bps)
        out: dict[int, int] = {}
        for i in big:  # union grid too large: each big query on its own grid
            q = queries[i]
            bound = [cols[c.lower()] for c in q.columns]
            num = np.asarray(q.numerators)
            h = self._histogram(ref, bound, [tuple(b) for b in q.breakpoints], num != 0)
            out[i] = _dot(num, h)
        assert plans is not None
        small = [(i, p) for i, p in enumerate(plans) if p is not None]
        conds = [cond for _, p in small for _, cond in p[1]]
        need_rows = any(p[0] != 0 for _, p in small)
        nrows, counts = 0, []
        if len(conds) == 1 and not need_rows:
            # One condition: a plain filtered COUNT(*), which DuckDB pushes into the scan.
            sel = exp.select(exp.Count(this=exp.Star()), copy=False).from_(ref.copy(), copy=False).where(conds[0], copy=False)
            counts = [int(self._execute(sel)[0][0])]
        elif conds or need_rows:
            aggs: list[exp.Expression] = [exp.Count(this=exp.Star())]
            aggs += [exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=c)) for c in conds]
            sel = exp.select(*aggs, copy=False).from_(ref.copy(), copy=False)
            if not need_rows:
                # Scan only rows some term counts (the union of the terms' regions).
                where = self._union_condition([queries[i] for i, _ in small], cols)
                if where is not None:
                    sel = sel.where(where, copy=False)
            row = self._execute(sel)[0]
            nrows, counts = int(row[0]), [int(c) for c in row[1:]]
        pos = 0
        for i, p in small:
            base, terms = p
            total = base * nrows if base else 0
            for coef, _ in terms:
                total += coef * counts[pos]
                pos += 1
            out[i] = total
        return [out[i] for i in range(len(queries))]

    def _numerators_on_union_grid(
        self, ref: exp.Expression, cols: dict[str, BoundColumn], queries: list[LinearQuery],
        union_cols: list[str], union_bps: list[tuple[int, ...]],
    ) -> list[int]:
        """One scan: a histogram on the union grid, restricted to boxes some query weighs,
        then each query's exact ``Σ numerators·counts`` on its own grid.

        Each query box is a product of index ranges of the union grid, so the mask is
        built from a difference array (±1 at each weighed box's corners, then prefix
        sums) and each box's count is read from the histogram's prefix sums
        (inclusion-exclusion over the corners).  A batch of G queries (the groups of a
        GROUP BY) thus costs O(union grid + Σ own grid sizes), not O(G · union grid).
        """
        shape = tuple(len(b) for b in union_bps)
        ubps = [np.asarray(b, dtype=np.int64) for b in union_bps]
        axis_of = {c.lower(): u for u, c in enumerate(union_cols)}
        # One-column queries (the groups of a one-column GROUP BY) are handled in bulk per
        # column; the others one by one on their own grids.
        one_d: dict[int, list[int]] = {}
        for i, q in enumerate(queries):
            if len(q.columns) == 1:
                one_d.setdefault(axis_of[q.columns[0].lower()], []).append(i)
        bulk = {u: OneColumnBatch.of([queries[i] for i in idxs], ubps[u]) for u, idxs in one_d.items()}
        rest = sorted(set(range(len(queries))) - {i for idxs in one_d.values() for i in idxs})
        bounds = {i: slab_bounds(queries[i], axis_of, ubps) for i in rest}
        mask = weighed_boxes(queries, bounds, shape)
        for u, batch in bulk.items():
            mask |= np.expand_dims(batch.weighed(), tuple(ax for ax in range(len(shape)) if ax != u))
        hist = self._histogram(ref, [cols[c.lower()] for c in union_cols], union_bps, mask)
        total = int(hist.sum())
        out: list[int] = [0] * len(queries)
        for u, batch in bulk.items():
            per_slab = hist.sum(axis=tuple(ax for ax in range(len(shape)) if ax != u), dtype=np.int64)
            values = batch.values(per_slab, total)
            if values is None:  # int64 could overflow: exactly, one by one
                bounds.update({i: slab_bounds(queries[i], axis_of, ubps) for i in one_d[u]})
            else:
                for i, v in zip(one_d[u], values, strict=True):
                    out[i] = v
        if not bounds:
            return out
        for i, value in box_sums(hist, queries, bounds, total).items():
            out[i] = value
        return out

    def _numerators_on_rows(
        self, ref: exp.Expression, cols: dict[str, BoundColumn], queries: list[LinearQuery],
        union_cols: list[str], union_bps: list[tuple[int, ...]],
    ) -> list[int]:
        """One scan: the union grid's occupied boxes as the engine groups them
        (:meth:`_occupied`, never densified), then each query's exact ``Σ numerators·counts``
        over those boxes — O(occupied boxes) per query, whatever the grid's size.

        The same counts per box as :meth:`_numerators_on_union_grid`'s histogram (the same
        row → box mapping), so the same integers; it is the path of wide queries (``SUM(income)``:
        500 002 weights per group), whose dense grids cost more than the rows they count."""
        idx, counts = self._occupied(ref, [cols[c.lower()] for c in union_cols], union_bps)
        axis_of = {c.lower(): u for u, c in enumerate(union_cols)}
        starts: dict[int, np.ndarray] = {}  # per union axis: each returned box's first cell
        total = int(counts.sum())
        out = []
        for q in queries:
            num = np.asarray(q.numerators)
            flat = np.zeros(counts.size, dtype=np.int64)
            for c, bp in zip(q.columns, q.breakpoints, strict=True):
                u = axis_of[c.lower()]
                if u not in starts:
                    starts[u] = breakpoint_array(union_bps[u])[idx[u]]
                own = breakpoint_array(bp)
                # The union grid refines the query's: each union box lies in the query slab where it starts.
                flat = flat * own.size + (np.searchsorted(own, starts[u], side="right") - 1)
            weights = num.reshape(-1)[flat] if num.ndim else np.full(counts.size, int(num), dtype=np.int64)
            if int(np.max(np.abs(weights), initial=0)) * total < 2**62:  # the weights of occupied boxes only
                out.append(int(np.dot(weights, counts)))
            else:
                out.append(sum(int(a) * int(b) for a, b in zip(weights.tolist(), counts.tolist(), strict=True)))
        return out

    def _union_condition(self, queries: list[LinearQuery], cols: dict[str, BoundColumn]) -> exp.Expression | None:
        """Rows where some query has a non-zero weight, or None if that condition is too large."""
        parts = []
        leaves = 0
        for q in queries:
            num = np.asarray(q.numerators)
            if num.ndim == 0:
                if num != 0:
                    return None
                continue
            c = set_condition([cols[c.lower()] for c in q.columns], q.breakpoints, num != 0)
            leaves += leaf_count(c)
            if leaves > _MAX_FILTER_LEAVES:
                return None
            parts.append(c)
        return disjunction(parts) if parts else None

    # -- fingerprint -----------------------------------------------------------
    def fingerprint(self) -> str:
        """SHA-256 identifying the source's content on the declared columns (internal).

        DataFrames: ``pandas.util.hash_pandas_object`` of the declared columns (rows
        summed modulo 2⁶⁴, so row order does not matter), plus shape and column names.
        SQL sources: per table, the row count and the sum of the engine's 64-bit hash of
        each row's declared columns (DuckDB ``hash``, PostgreSQL ``hashtextextended`` of
        the row's text, Spark ``xxhash64``; see :meth:`Backend.row_hash
        <dpgate.backends.Backend.row_hash>`), computed on the engine by generated SQL, plus
        column names and types (and the engine, except for DuckDB, whose fingerprints
        predate backends).  Equal content gives equal fingerprints; any changed value
        changes it (up to hash collisions).  Engines' hashes may change across releases.
        Never release the value: it is a function of the private data (a guessable one:
        knowing all rows but one, the last can be enumerated against it).  The ledger
        stores only a keyed MAC of it (``dpgate.ledger.core``), and no error message prints it.
        """
        h = hashlib.sha256()
        if self.dialect != "duckdb":
            h.update(f"engine={self.dialect}|".encode())
        frames = getattr(self._backend, "frames", None)
        for t in self.schema.tables:
            ref, cols = self._tables[t.name.lower()]
            phys = [cols[c.name.lower()] for c in t.columns]
            h.update(repr((t.name.lower(), [(c.name, c.tclass) for c in phys])).encode())
            unit = [self._units[t.name.lower()]] if t.privacy_unit is not None else []  # it decides the rows kept
            if unit:
                h.update(repr(("privacy_unit", unit[0], t.max_rows_per_unit)).encode())
            if frames is not None:
                import pandas as pd

                df = frames[t.name.lower()][[c.name for c in phys] + unit]
                rows = pd.util.hash_pandas_object(df, index=False).to_numpy(dtype=np.uint64)
                h.update(repr((df.shape, [str(c) for c in df.columns], int(rows.sum(dtype=np.uint64)))).encode())
            else:
                wide = "HUGEINT" if self.dialect == "duckdb" else "DECIMAL(38, 0)"
                q = exp.select(
                    exp.Count(this=exp.Star()),
                    exp.Sum(this=exp.cast(self._backend.row_hash([c.raw() for c in phys]
                                                                  + [exp.column(u, quoted=True) for u in unit]), wide)),
                ).from_(ref.copy())
                n, s = self._execute(q)[0]
                h.update(repr((int(n), int(s or 0))).encode())
        return h.hexdigest()

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        """Release the connection (a caller-owned connection is left open)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._backend.close()

    def __enter__(self) -> Cube:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<dpgate.Cube {state} tables={[t.name for t in self.schema.tables]}>"


def _dot(num: np.ndarray, counts: np.ndarray) -> int:
    """Exact Σ num·counts (int64 when it cannot overflow, Python ints otherwise)."""
    num = np.asarray(num, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if num.shape != counts.shape:
        raise DPGateInternalError("query grid and histogram disagree")
    bound = int(np.max(np.abs(num), initial=0)) * int(counts.sum())
    if bound < 2**62:
        return int(np.sum(num * counts, dtype=np.int64))
    nz = np.flatnonzero(counts)
    return sum(int(a) * int(b) for a, b in zip(num.ravel()[nz].tolist(), counts.ravel()[nz].tolist(), strict=True))
