"""The cube: exact row counts per cell, computed by DuckDB from SQL that dpgate generates.

**Internal: never release.**  Everything this module returns is an *exact*
aggregate of the private data.  Only the gateway may use it, and only to add
calibrated noise; tests use it to check the compiler.  Nothing here may be
printed, logged, returned to an analyst or written to a ledger.

Data sources (``Cube(data, schema)``):

* a DuckDB database file path, opened ``read_only=True`` (the file is never modified);
* an existing ``duckdb.DuckDBPyConnection`` (the caller keeps ownership; views over
  Parquet/CSV, attached warehouses … all work);
* a pandas DataFrame (one-table schema) or a ``{table_name: DataFrame}`` dict,
  registered in a private in-memory DuckDB connection.

Every statement that touches data is built with sqlglot expression builders from
the *schema* (public) and the catalog's column types, never from analyst text, and
runs through the single private method :meth:`Cube._execute`.  Catalog lookups go
through :meth:`Cube._describe`.  Undeclared columns (e.g. an identifier ``pid``) are
never read.

Row → cell mapping (exactly :mod:`dpgate.schema`'s table), where ``v`` is the
column's value:

* NULL is the NULL cell for every kind.  A floating-point NaN counts as NULL (pandas
  does the same, and DuckDB orders NaN above every number, which would otherwise
  clamp it to ``max``).  For integer/binned columns stored as text, the text is
  ``TRY_CAST`` to DOUBLE and unparseable text counts as NULL.
* integer ``[min, max]``: cell ``clamp(floor(v), min, max) - min``.
* binned ``e0 < … < ek``: bin ``i`` holds ``e_i <= v < e_{i+1}``; ``v < e1`` is bin 0
  and ``v >= e_{k-1}`` the last bin (clamping).  A binned column's ``min``/``max``, if
  declared, play no role in the mapping.
* categorical: text columns compare their value to the declared strings exactly
  (``CAST(v AS VARCHAR)`` for non-numeric types).  Numeric columns compare *numbers*:
  a declared value matches ``v`` when it is ``v``'s canonical spelling —
  ``str(int(v))`` for integral ``v`` (so ``1`` and ``1.0`` both match ``"1"``),
  Python's ``repr(v)`` otherwise (``"2.5"``).  A declared value that is not a
  canonical number (``"01"``, ``"1.0"``, ``"a"``) matches no row of a numeric column.
  Unmatched non-NULL values are ``other``.
* boolean: cells false, true, NULL.  BOOLEAN columns map directly; numeric columns are
  true when ``v <> 0``; text is true when ``TRY_CAST(v AS BOOLEAN)`` is true or it
  parses as a non-zero number, false otherwise.

Slab predicates are generated as range predicates on the raw column
(``"age" >= 20 AND "age" < 41``) rather than on the computed cell index, so DuckDB
can push them into the scan: a counting query costs about as much as the equivalent
hand-written ``SELECT COUNT(*) … WHERE …``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.errors import (
    DPGateInternalError,
    InvalidArgument,
    InvalidArgumentType,
    OperationalError,
    SchemaError,
    UnsupportedQuery,
    map_exceptions,
)
from dpgate.query import LinearQuery
from dpgate.schema import Column, Schema, Table

__all__ = ["Cube", "MAX_HISTOGRAM_BOXES"]

#: Largest dense histogram :meth:`Cube.histogram` returns (boxes of int64).
MAX_HISTOGRAM_BOXES = 2**24
#: Columns with at most this many slabs are grouped by a CASE over raw-value ranges;
#: finer ones are grouped by cell index and reduced to slabs in numpy.
_CASE_SLABS = 32
#: A query is answered by filtered ``COUNT(*)`` aggregates when its conditions have at
#: most this many leaf predicates; otherwise by a histogram on its grid and a dot product.
_MAX_FILTER_LEAVES = 512
#: …and at most this many distinct non-baseline weights.
_MAX_FILTER_TERMS = 32
#: ``true_numerators`` switches from filtered aggregates to one union-grid histogram
#: when it would need more aggregates than this and the union grid is small enough.
_MAX_BATCH_TERMS = 64
_MAX_BATCH_GRID = 2**20

_INT_TYPES = {
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4", "INT8", "INT", "LONG", "SHORT",
}
_FLOAT_TYPES = {"FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8"}
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)\Z")


def _type_class(data_type: str) -> str:
    """'int' | 'float' | 'decimal' | 'bool' | 'other' for a DuckDB type name."""
    t = data_type.upper().strip()
    if t in _INT_TYPES:
        return "int"
    if t in _FLOAT_TYPES:
        return "float"
    if t.startswith("DECIMAL") or t.startswith("NUMERIC"):
        return "decimal"
    if t in ("BOOLEAN", "BOOL"):
        return "bool"
    return "other"


def _num(x: int | float) -> exp.Expression:
    """A numeric literal (negative numbers as unary minus, as sqlglot expects)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**63:
        x = int(x)
    lit = exp.Literal.number(str(abs(x)) if isinstance(x, int) else repr(abs(x)))
    return exp.Neg(this=lit) if x < 0 else lit


def _type(name: str) -> exp.DataType:
    return exp.DataType(this=exp.DataType.Type[name], nested=False)


def _and(parts: list[exp.Expression]) -> exp.Expression:
    if not parts:
        return exp.true()
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def _or(parts: list[exp.Expression]) -> exp.Expression:
    if not parts:
        return exp.false()
    if len(parts) == 1:
        return parts[0]
    out: exp.Expression = exp.Paren(this=parts[0])
    for p in parts[1:]:
        out = exp.Or(this=out, expression=exp.Paren(this=p))
    return exp.Paren(this=out)


def _numeric_category(value: str) -> int | float | None:
    """The number a declared category string canonically spells, or None."""
    if _INT_RE.match(value):
        return int(value)
    try:
        f = float(value)
    except ValueError:
        return None
    if math.isfinite(f) and not f.is_integer() and repr(f) == value:
        return f
    return None


@dataclass(frozen=True)
class _Col:
    """A declared column bound to its physical column in the source."""

    decl: Column
    name: str  # physical name as in the catalog
    tclass: str  # see _type_class

    def raw(self) -> exp.Expression:
        return exp.column(self.name, quoted=True)

    def value(self) -> exp.Expression:
        """The value the mapping reads: NaN and unparseable text become NULL."""
        x = self.raw()
        kind, tc = self.decl.kind, self.tclass
        nan = exp.Cast(this=exp.Literal.string("NaN"), to=_type("DOUBLE"))
        if kind in ("integer", "binned"):
            if tc in ("int", "decimal"):
                return x
            if tc == "bool":
                return exp.Cast(this=x, to=_type("INTEGER"))
            if tc == "float":
                return exp.Nullif(this=x, expression=nan)
            return exp.Nullif(this=exp.TryCast(this=x, to=_type("DOUBLE")), expression=nan)
        if kind == "categorical":
            if tc == "float":
                return exp.Nullif(this=x, expression=nan)
            if tc in ("int", "decimal"):
                return x
            return exp.Cast(this=x, to=_type("VARCHAR"))
        # boolean
        if tc == "float":
            return exp.Nullif(this=x, expression=nan)
        return x

    def truth(self) -> exp.Expression:
        """Boolean kind: an expression that is TRUE/FALSE for non-NULL values."""
        v, tc = self.value(), self.tclass
        if tc == "bool":
            return v
        if tc in ("int", "float", "decimal"):
            return exp.NEQ(this=v, expression=_num(0))
        as_bool = exp.TryCast(this=v.copy(), to=_type("BOOLEAN"))
        as_num = exp.NEQ(this=exp.TryCast(this=v, to=_type("DOUBLE")), expression=_num(0))
        return exp.Coalesce(this=as_bool, expressions=[as_num, exp.false()])

    # -- thresholds and categories ----------------------------------------
    def threshold(self, cell: int) -> int | float:
        """Ordered kinds: the value where cell ``cell`` starts."""
        if self.decl.kind == "integer":
            return self.decl.int_range()[0] + cell
        return self.decl.edges[cell]

    def matchers(self) -> list[Any]:
        """Categorical: per declared value, the literal it is compared with (None: never matches)."""
        out: list[Any] = []
        for v in self.decl.values:
            if self.tclass in ("int", "float", "decimal"):
                n = _numeric_category(v)
                if self.tclass == "int" and isinstance(n, float):
                    n = None
                out.append(n)
            else:
                out.append(v)
        return out

    def _lit(self, m: Any) -> exp.Expression:
        return _num(m) if isinstance(m, (int, float)) else exp.Literal.string(m)

    def _in(self, ms: list[Any]) -> exp.Expression:
        if len(ms) == 1:
            return exp.EQ(this=self.value(), expression=self._lit(ms[0]))
        return exp.In(this=self.value(), expressions=[self._lit(m) for m in ms])

    # -- predicates --------------------------------------------------------
    def ranges_condition(self, ranges: list[tuple[int, int]]) -> exp.Expression | None:
        """Predicate selecting the rows whose cell lies in one of the sorted, disjoint,
        non-adjacent half-open cell ranges ``[a, b)``; None when that is every cell."""
        n = self.decl.n_cells
        if not ranges:
            return exp.false()
        if ranges == [(0, n)]:
            return None
        null = self.decl.null_cell
        has_null = ranges[-1][1] == n
        parts: list[exp.Expression] = []
        kind = self.decl.kind
        if kind in ("integer", "binned"):
            for a, b in ranges:
                b = min(b, null)
                if a >= b:
                    continue
                conds: list[exp.Expression] = []
                if a > 0:
                    conds.append(exp.GTE(this=self.value(), expression=_num(self.threshold(a))))
                if b < null:
                    conds.append(exp.LT(this=self.value(), expression=_num(self.threshold(b))))
                if not conds:
                    conds.append(exp.Not(this=exp.Is(this=self.value(), expression=exp.Null())))
                parts.append(_and(conds))
        else:
            cells = np.zeros(n, dtype=bool)
            for a, b in ranges:
                cells[a:b] = True
            if kind == "categorical":
                other = self.decl.other_cell
                assert other is not None
                ms = self.matchers()
                if cells[other]:
                    excluded = [m for m, c in zip(ms, cells[:other], strict=False) if not c and m is not None]
                    if excluded:
                        parts.append(exp.Not(this=self._in(excluded)))
                    else:
                        parts.append(exp.Not(this=exp.Is(this=self.value(), expression=exp.Null())))
                else:
                    chosen = [m for m, c in zip(ms, cells[:other], strict=False) if c and m is not None]
                    if chosen:
                        parts.append(self._in(chosen))
            else:  # boolean: cells false, true, NULL
                if cells[0] and cells[1]:
                    parts.append(exp.Not(this=exp.Is(this=self.value(), expression=exp.Null())))
                elif cells[1]:
                    parts.append(self.truth())
                elif cells[0]:
                    parts.append(exp.Not(this=exp.Paren(this=self.truth())))
        if has_null:
            parts.append(exp.Is(this=self.value(), expression=exp.Null()))
        if not parts:
            return exp.false()
        return _or(parts)

    def cell_index(self) -> exp.Expression:
        """The row's cell index as a BIGINT expression (full resolution)."""
        d = self.decl
        null_if = exp.If(this=exp.Is(this=self.value(), expression=exp.Null()), true=_num(d.null_cell))
        ifs = [null_if]
        if d.kind == "integer":
            lo, hi = d.int_range()
            if hi > lo:
                ifs.append(exp.If(this=exp.LT(this=self.value(), expression=_num(lo + 1)), true=_num(0)))
                ifs.append(exp.If(this=exp.GTE(this=self.value(), expression=_num(hi)), true=_num(hi - lo)))
                v = self.value() if self.tclass in ("int", "bool") else exp.Floor(this=self.value())
                default: exp.Expression = exp.Cast(this=exp.Sub(this=v, expression=_num(lo)), to=_type("BIGINT"))
            else:
                default = _num(0)
        elif d.kind == "binned":
            k = len(d.edges) - 1
            for i in range(1, k):
                ifs.append(exp.If(this=exp.LT(this=self.value(), expression=_num(d.edges[i])), true=_num(i - 1)))
            default = _num(k - 1)
        elif d.kind == "categorical":
            for i, m in enumerate(self.matchers()):
                if m is not None:
                    ifs.append(exp.If(this=exp.EQ(this=self.value(), expression=self._lit(m)), true=_num(i)))
            default = _num(len(d.values))  # the out-of-domain cell, Column.other_cell
        else:
            ifs.append(exp.If(this=self.truth(), true=_num(1)))
            default = _num(0)
        return exp.Case(ifs=ifs, default=default)

    def slab_index(self, bps: Sequence[int]) -> exp.Expression:
        """The row's slab index for slabs starting at cells ``bps`` (CASE over ranges)."""
        n = self.decl.n_cells
        ends = list(bps[1:]) + [n]
        ifs = []
        for i, (a, b) in enumerate(zip(bps[:-1], ends[:-1], strict=False)):
            cond = self.ranges_condition([(a, b)])
            ifs.append(exp.If(this=cond if cond is not None else exp.true(), true=_num(i)))
        return exp.Case(ifs=ifs, default=_num(len(bps) - 1))


def _leaves(e: exp.Expression) -> int:
    return sum(1 for _ in e.find_all(exp.Predicate))


class Cube:
    """Exact counts of a table's rows per cell, from a DuckDB-backed source.

    Internal: never release anything a Cube returns.

    Args:
        data: DuckDB file path (opened read-only), ``duckdb`` connection, pandas
            DataFrame (one-table schema) or ``{table_name: DataFrame}``.
        schema: a :class:`~dpgate.schema.Schema`, dict or YAML path.

    Raises:
        SchemaError: a declared table or column is missing from the source.
        OperationalError: the database file cannot be opened.

    Example:
        >>> import pandas as pd
        >>> from dpgate.schema import Schema
        >>> s = Schema.from_dict({"tables": {"t": {"columns": {"x": {"type": "integer", "min": 0, "max": 2}}}}})
        >>> with Cube(pd.DataFrame({"x": [0, 1, 1, 7, None]}), s) as cube:
        ...     cube.histogram("t").tolist()       # cells 0, 1, 2 (7 clamped), NULL
        [1, 2, 1, 1]
    """

    def __init__(self, data: Any, schema: Any) -> None:
        import duckdb

        self.schema = Schema.load(schema)
        self._lock = threading.RLock()
        self._owns = True
        self._frames: dict[str, Any] | None = None
        self._closed = False
        if isinstance(data, (str, os.PathLike)):
            path = os.fspath(data)
            if not os.path.isfile(path):
                raise OperationalError(f"DuckDB database file {path!r} does not exist.")
            with map_exceptions(
                {duckdb.Error: OperationalError},
                f"Cannot open the DuckDB database {path!r} read-only: {{exc}}; check that the file "
                "is a DuckDB database and that no other process writes to it.",
            ):
                self._con = duckdb.connect(path, read_only=True)
        elif isinstance(data, duckdb.DuckDBPyConnection):
            self._con = data
            self._owns = False
        else:
            import pandas as pd

            if isinstance(data, pd.DataFrame):
                if len(self.schema.tables) != 1:
                    raise SchemaError(
                        f"a single DataFrame needs a one-table schema, but the schema declares "
                        f"{len(self.schema.tables)} tables {[t.name for t in self.schema.tables]}; "
                        "pass a dict {table_name: DataFrame}."
                    )
                frames = {self.schema.tables[0].name: data}
            elif isinstance(data, Mapping):
                frames = dict(data)
                bad = [k for k, v in frames.items() if not isinstance(v, pd.DataFrame)]
                if bad:
                    raise InvalidArgumentType(f"dict values must be pandas DataFrames; not so for {bad}.")
            else:
                raise InvalidArgumentType(
                    "data must be a DuckDB file path, a duckdb connection, a pandas DataFrame or a "
                    f"dict of DataFrames, got {type(data).__name__}."
                )
            self._con = duckdb.connect(":memory:")
            for name, df in frames.items():
                self._con.register(str(name), df)
            self._frames = {str(k).lower(): v for k, v in frames.items()}
        try:
            self._bind()
        except BaseException:
            self.close()
            raise

    # -- binding to the catalog (metadata only) ------------------------------
    def _describe(self, expression: exp.Expression) -> list[tuple[Any, ...]]:
        """Run a catalog (metadata) query; never touches table data."""
        with self._lock:
            self._check_open()
            return self._con.execute(expression.sql(dialect="duckdb")).fetchall()

    def _bind(self) -> None:
        names = [t.name.lower() for t in self.schema.tables]
        cur = self._describe(exp.select(exp.func("current_database"), exp.func("current_schema")))[0]
        q = (
            exp.select("table_catalog", "table_schema", "table_name", "column_name", "data_type")
            .from_(exp.Table(this=exp.to_identifier("columns"), db=exp.to_identifier("information_schema")))
            .where(exp.In(this=exp.func("lower", exp.column("table_name")), expressions=[exp.Literal.string(n) for n in names]))
        )
        rows = self._describe(q)
        found: dict[str, dict[tuple[str, str, str], dict[str, tuple[str, str]]]] = {}
        for cat, sch, tab, col, typ in rows:
            found.setdefault(tab.lower(), {}).setdefault((cat, sch, tab), {})[col.lower()] = (col, typ)
        self._tables: dict[str, tuple[exp.Table, dict[str, _Col]]] = {}
        missing_tables, missing_cols = [], []
        for t in self.schema.tables:
            cands = found.get(t.name.lower(), {})
            if not cands:
                missing_tables.append(t.name)
                continue
            if len(cands) > 1:
                pref = [k for k in cands if (k[0], k[1]) == tuple(cur)] or [k for k in cands if k[0] == "temp"]
                if len(pref) != 1:
                    raise SchemaError(
                        f"table {t.name!r} is ambiguous in the data source: found "
                        f"{['.'.join(k) for k in sorted(cands)]}; keep one or rename."
                    )
                key = pref[0]
            else:
                key = next(iter(cands))
            cols = cands[key]
            bound: dict[str, _Col] = {}
            for c in t.columns:
                if c.name.lower() not in cols:
                    missing_cols.append(f"{t.name}.{c.name}")
                    continue
                phys, typ = cols[c.name.lower()]
                bound[c.name.lower()] = _Col(c, phys, _type_class(typ))
            ref = exp.Table(
                this=exp.to_identifier(key[2], quoted=True),
                db=exp.to_identifier(key[1], quoted=True),
                catalog=exp.to_identifier(key[0], quoted=True),
            )
            self._tables[t.name.lower()] = (ref, bound)
        if missing_tables or missing_cols:
            parts = []
            if missing_tables:
                parts.append(f"tables {missing_tables}")
            if missing_cols:
                parts.append(f"columns {missing_cols}")
            raise SchemaError(f"the data source lacks declared {' and '.join(parts)}; fix the schema or the source.")

    # -- execution -------------------------------------------------------------
    def _execute(self, expression: exp.Expression, *, numpy: bool = False) -> Any:
        """Run one generated statement against the data (the only path that reads rows)."""
        sql = expression.sql(dialect="duckdb")
        with self._lock:
            self._check_open()
            res = self._con.execute(sql)
            return res.fetchnumpy() if numpy else res.fetchall()

    def _check_open(self) -> None:
        if self._closed:
            raise OperationalError("this Cube is closed.")

    def _table(self, name: str) -> tuple[Table, exp.Table, dict[str, _Col]]:
        t = self.schema.table(name)
        ref, cols = self._tables[t.name.lower()]
        return t, ref, cols

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
        self, ref: exp.Table, cols: list[_Col], bps: list[tuple[int, ...]], mask: np.ndarray | None = None
    ) -> np.ndarray:
        """Counts on the grid; with ``mask``, only boxes where it is True are counted
        (others are returned as 0) and the rest of the table is filtered out in SQL."""
        shape = tuple(len(b) for b in bps)
        where = None
        fixed: dict[int, int] = {}
        if mask is not None:
            if not mask.any():
                return np.zeros(shape, dtype=np.int64)
            cond = _set_condition(cols, bps, mask)
            if _leaves(cond) <= _MAX_FILTER_LEAVES and not (isinstance(cond, exp.Boolean) and cond.this is True):
                where = cond
                # Axes on which every selected box lies in one slab need no GROUP BY key.
                for ax in range(len(shape)):
                    used = np.flatnonzero(mask.any(axis=tuple(i for i in range(len(shape)) if i != ax)))
                    if len(used) == 1:
                        fixed[ax] = int(used[0])
        keys, by_cell = [], []
        for ax, (c, bp) in enumerate(zip(cols, bps, strict=False)):
            if ax in fixed:
                continue
            full = len(bp) == c.decl.n_cells
            if full or len(bp) > _CASE_SLABS:
                keys.append((ax, c.cell_index()))
                by_cell.append(not full)
            else:
                keys.append((ax, c.slab_index(bp)))
                by_cell.append(False)
        sel = [k.as_(f"k{i}") for i, (_, k) in enumerate(keys)] + [exp.Count(this=exp.Star()).as_("n")]
        q = exp.select(*sel).from_(ref.copy())
        if where is not None:
            q = q.where(where)
        if keys:
            q = q.group_by(*[exp.Literal.number(i + 1) for i in range(len(keys))])
        res = self._execute(q, numpy=True)
        counts = np.asarray(res["n"], dtype=np.int64)
        idx: list[Any] = [None] * len(shape)
        for ax, v in fixed.items():
            idx[ax] = np.full(counts.shape, v, dtype=np.int64)
        for i, ((ax, _), cell) in enumerate(zip(keys, by_cell, strict=False)):
            k = np.asarray(res[f"k{i}"], dtype=np.int64)
            if cell:
                k = np.searchsorted(np.asarray(bps[ax]), k, side="right") - 1
            idx[ax] = k
        out = np.zeros(math.prod(shape), dtype=np.int64)
        if counts.size and shape:
            np.add.at(out, np.ravel_multi_index(tuple(idx), shape), counts)
        elif counts.size:
            out[0] = int(counts.sum())
        out = out.reshape(shape)
        if mask is not None:
            out = np.where(mask, out, 0)
        return out

    # -- true answers ----------------------------------------------------------
    def _terms(self, query: LinearQuery, cols: dict[str, _Col]) -> tuple[int, list[tuple[int, exp.Expression]]] | None:
        """``Σ numerators·count`` as ``base·rows + Σ coef·COUNT(*) FILTER (cond)``, or None if too big."""
        num = np.asarray(query.numerators)
        if num.ndim == 0:
            return int(num), []
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
            cond = _set_condition(bound, query.breakpoints, num == v)
            leaves += _leaves(cond)
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
        for i, q in enumerate(queries):
            by_table.setdefault(self.schema.table(q.table).name.lower(), []).append(i)
        for tname, idxs in by_table.items():
            for i, v in zip(idxs, self._numerators_one_table(tname, [queries[i] for i in idxs]), strict=True):
                out[i] = v
        return [int(v) for v in out]  # type: ignore[arg-type]

    def _numerators_one_table(self, table: str, queries: list[LinearQuery]) -> list[int]:
        t, ref, cols = self._table(table)
        union_cols, union_bps = _union_grid(t, queries)
        union_size = math.prod(len(b) for b in union_bps)
        uniq = [np.unique(np.asarray(q.numerators)) for q in queries]
        n_terms = sum(len(u) - 1 for u in uniq)
        zero_based = all(0 in u.tolist() for u in uniq)
        plans = None
        # Several weights or queries, all zero outside their regions: grouping the
        # weighed region by slab beats one FILTER per term.  A single condition, or a
        # query that weighs most of the table (negations), runs as filtered counts.
        hist_first = n_terms > _MAX_BATCH_TERMS or (n_terms > 1 and zero_based)
        if not hist_first or union_size > _MAX_BATCH_GRID:
            plans = [self._terms(q, cols) for q in queries]
        big = [i for i, p in enumerate(plans or []) if p is None]
        if (plans is None or big) and union_size <= _MAX_BATCH_GRID:
            # One scan: a histogram on the union grid, restricted to boxes some query weighs.
            nums = [np.asarray(q.expand(t, union_cols, union_bps)) for q in queries]
            mask = np.zeros(tuple(len(b) for b in union_bps), dtype=bool)
            for n in nums:
                mask |= n != 0
            hist = self._histogram(ref, [cols[c.lower()] for c in union_cols], union_bps, mask)
            mat = np.stack([n.ravel() for n in nums]) if nums else np.zeros((0, 1), dtype=np.int64)
            flat = hist.ravel()
            if int(np.max(np.abs(mat), initial=0)) * int(flat.sum()) < 2**62:
                return [int(v) for v in mat.astype(np.int64) @ flat]
            return [_dot(n, hist) for n in nums]
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
            sel = exp.select(exp.Count(this=exp.Star())).from_(ref.copy()).where(conds[0])
            counts = [int(self._execute(sel)[0][0])]
        elif conds or need_rows:
            aggs: list[exp.Expression] = [exp.Count(this=exp.Star())]
            aggs += [exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=c)) for c in conds]
            sel = exp.select(*aggs).from_(ref.copy())
            if not need_rows:
                # Scan only rows some term counts (the union of the terms' regions).
                where = self._union_condition([queries[i] for i, _ in small], cols)
                if where is not None:
                    sel = sel.where(where)
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

    def _union_condition(self, queries: list[LinearQuery], cols: dict[str, _Col]) -> exp.Expression | None:
        """Rows where some query has a non-zero weight, or None if that condition is too large."""
        parts = []
        leaves = 0
        for q in queries:
            num = np.asarray(q.numerators)
            if num.ndim == 0:
                if num != 0:
                    return None
                continue
            c = _set_condition([cols[c.lower()] for c in q.columns], q.breakpoints, num != 0)
            leaves += _leaves(c)
            if leaves > _MAX_FILTER_LEAVES:
                return None
            parts.append(c)
        return _or(parts) if parts else None

    # -- fingerprint -----------------------------------------------------------
    def fingerprint(self) -> str:
        """SHA-256 identifying the source's content on the declared columns (internal).

        DataFrames: ``pandas.util.hash_pandas_object`` of the declared columns (rows
        summed modulo 2⁶⁴, so row order does not matter), plus shape and column names.
        DuckDB sources: per table, the row count and ``SUM(hash(declared columns…))``
        computed by generated SQL, plus column names and types.  Equal content gives equal
        fingerprints; any changed value changes it (up to hash collisions).  DuckDB's
        ``hash`` may change across DuckDB releases.  Never release the value: it is a
        function of the private data.
        """
        h = hashlib.sha256()
        for t in self.schema.tables:
            ref, cols = self._tables[t.name.lower()]
            phys = [cols[c.name.lower()] for c in t.columns]
            h.update(repr((t.name.lower(), [(c.name, c.tclass) for c in phys])).encode())
            if self._frames is not None:
                import pandas as pd

                df = self._frames[t.name.lower()][[c.name for c in phys]]
                rows = pd.util.hash_pandas_object(df, index=False).to_numpy(dtype=np.uint64)
                h.update(repr((df.shape, [str(c) for c in df.columns], int(rows.sum(dtype=np.uint64)))).encode())
            else:
                q = exp.select(
                    exp.Count(this=exp.Star()),
                    exp.Sum(this=exp.cast(exp.func("hash", *[c.raw() for c in phys]), "HUGEINT")),
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
                if self._owns:
                    self._con.close()

    def __enter__(self) -> Cube:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<dpgate.Cube {state} tables={[t.name for t in self.schema.tables]}>"


def _set_condition(cols: list[_Col], bps: Sequence[Sequence[int]], mask: np.ndarray) -> exp.Expression:
    """Predicate selecting rows whose grid box is in ``mask`` (factorised axis by axis)."""
    if mask.ndim == 0:
        return exp.true() if bool(mask) else exp.false()
    if mask.all():
        return exp.true()
    if not mask.any():
        return exp.false()
    col, bp = cols[0], list(bps[0])
    n = col.decl.n_cells
    ends = bp[1:] + [n]
    groups: dict[bytes, list[int]] = {}
    subs: dict[bytes, np.ndarray] = {}
    for i in range(mask.shape[0]):
        sub = mask[i]
        if not sub.any():
            continue
        key = np.packbits(sub.ravel()).tobytes() + bytes(str(sub.shape), "ascii")
        groups.setdefault(key, []).append(i)
        subs[key] = sub
    parts = []
    for key, slabs in groups.items():
        ranges: list[tuple[int, int]] = []
        for i in slabs:
            if ranges and ranges[-1][1] == bp[i]:
                ranges[-1] = (ranges[-1][0], ends[i])
            else:
                ranges.append((bp[i], ends[i]))
        here = col.ranges_condition(ranges)
        rest = _set_condition(cols[1:], bps[1:], subs[key])
        conj = [e for e in (here, rest) if e is not None and not (isinstance(e, exp.Boolean) and e.this is True)]
        parts.append(_and(conj))
    return _or(parts)


def _union_grid(t: Table, queries: Sequence[LinearQuery]) -> tuple[list[str], list[tuple[int, ...]]]:
    bps: dict[str, set[int]] = {}
    for q in queries:
        for c, bp in zip(q.columns, q.breakpoints, strict=True):
            bps.setdefault(t.column(c).name, set()).update(bp)
    cols = [c.name for c in t.columns if c.name in bps]
    return cols, [tuple(sorted(bps[c])) for c in cols]


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
