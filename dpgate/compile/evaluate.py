"""Cell functions: evaluate a row-level SQL expression on every cell of a grid.

The compiler (:mod:`dpgate.compile`) turns each aggregate into a weight function of
a row's cell.  This module evaluates the row-level parts (WHERE / FILTER
conditions, SUM and COUNT arguments) with numpy, in two phases:

1. **1-D phase.**  Every maximal sub-expression that reads exactly one column
   is evaluated on *all* cells of that column (a vector of length ``n_cells``).
   The cell indices where its value or NULL-ness changes become breakpoints of
   that column.
2. **Grid phase.**  The whole expression is evaluated on the product grid of
   slabs between those breakpoints; single-column sub-expressions are read off
   their 1-D vectors at the slab starts (they are constant on every slab by
   construction).

So ``income < 25000`` on a 500 001-cell column costs one vectorised comparison
and contributes two slabs, while ``SUM(age * educ)`` needs unit slabs on both.

Values carry SQL's NULL as a separate mask; booleans use three-valued logic
(``v`` is true only where the value is known to be true).

How each node type is evaluated is looked up in one table
(:func:`dpgate.compile.nodes.handler_for`), not an isinstance chain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.compile._dates import time_operands
from dpgate.compile.cells import (
    BIN,
    BOOL,
    CAT,
    FLIP,
    NULL,
    NUM,
    OPS,
    STR,
    TIME,
    Val,
    base_value,
    binned_compare,
    boolean,
    candidate_cells,
    categorical_compare,
    change_points,
    children,
    coerce_literal,
    column_of,
)
from dpgate.compile.nodes import handler_for
from dpgate.compile.query import MAX_GRID_BOXES
from dpgate.errors import DPGateInternalError, SchemaError, UnsupportedQuery
from dpgate.schema.domains import Column, Table

__all__ = ["Evaluator"]


#: Every column's first breakpoint.
_ZERO = np.zeros(1, dtype=np.int64)


def _bool_arrays(*xs: Any) -> bool:
    """Whether every argument is a boolean numpy array (where ``~`` is logical NOT, unlike on Python bools)."""
    return all(isinstance(x, np.ndarray) and x.dtype == bool for x in xs)


def _as_vector(x: Any, n: int, dtype: type | None = None) -> np.ndarray:
    """``x`` as an array of shape ``(n,)``: itself when it already is one, else a broadcast view."""
    if isinstance(x, np.ndarray) and x.shape == (n,) and (dtype is None or x.dtype == dtype):
        return x
    return np.broadcast_to(np.asarray(x, dtype=dtype), (n,))


class Evaluator:
    """Evaluates row-level expressions of one query over one declared table."""

    def __init__(self, table: Table, qualifiers: Iterable[str]):
        self.table = table
        self.qualifiers = {q.lower() for q in qualifiers}
        # Case-insensitive name → column (names are unique case-insensitively): one dict lookup
        # instead of Table.has_column / Table.column scans per reference.
        self._by_name: dict[str, Column] = {c.name.lower(): c for c in table.columns}
        # Declared column name → arrays of breakpoints, united when a grid is set (a wide column's
        # 500 000 change points stay one array, never a set of Python ints).
        self._cuts: dict[str, list[np.ndarray]] = {}
        self._memo1d: dict[int, tuple[str, np.ndarray | None, Val]] = {}
        self._cols: dict[int, frozenset[str]] = {}
        self._env: dict[str, Val] | None = None
        self._grid: dict[str, tuple[int, int, np.ndarray]] = {}
        self._sampled: dict[int, Val] = {}
        self._sorted: dict[str, tuple[int, np.ndarray]] = {}
        self.wide_boxes = 0  # weights of the per-group queries built so far (aggregates._weights_by_group)

    # -- columns ---------------------------------------------------------------
    def column(self, node: exp.Column) -> Column:
        """The declared column a column reference names (checks the qualifier)."""
        if isinstance(node.this, exp.Star):
            raise UnsupportedQuery(
                f"{node.sql()} would release raw rows; ask for aggregates such as COUNT(*) or SUM(col)."
            )
        qual = node.table
        if qual and qual.lower() not in self.qualifiers:
            raise SchemaError(
                f"column {node.sql()!r} is qualified by {qual!r}, which is not the queried table "
                f"{self.table.name!r}; drop the qualifier or use the table's name or alias."
            )
        col = self._by_name.get(node.name.lower())
        if col is None:
            hint = ""
            if node.this.args.get("quoted"):
                hint = " (double quotes name a column; write string constants in single quotes)"
            if node.name.lower() in getattr(self.table, "ambiguous", ()):  # a join's (dpgate.schema._joins)
                which = [c.name for c in self.table.columns if c.name.lower().endswith("." + node.name.lower())]
                hint = f" (several joined tables declare it: write {' or '.join(which)})"
            elif self.table.privacy_unit is not None and node.name.lower() == self.table.privacy_unit.lower():
                hint = (" (it is the table's privacy unit, which identifies people: it is never grouped on, "
                        "filtered on or returned)")
            raise SchemaError(
                f"column {node.name!r} is not declared in table {self.table.name!r}{hint}; declared columns: "
                f"{[c.name for c in self.table.columns]}."
            )
        return col

    def columns_in(self, node: exp.Expr) -> frozenset[str]:
        """Declared names of the columns an expression reads (one bottom-up pass, cached per node).

        Iterative (an explicit post-order stack), so a deep tree cannot exhaust
        Python's recursion limit here.
        """
        got = self._cols.get(id(node))
        if got is not None:
            return got
        stack: list[tuple[exp.Expr, bool]] = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            if id(current) in self._cols:
                continue
            if isinstance(current, exp.Column):
                self._cols[id(current)] = frozenset((self.column(current).name,))
            elif not expanded:
                stack.append((current, True))
                stack.extend((child, False) for child in children(current) if id(child) not in self._cols)
            else:
                out: frozenset[str] = frozenset()
                for child in children(current):
                    sub = self._cols[id(child)]
                    if sub:
                        out = out | sub if out else sub
                self._cols[id(current)] = out
        return self._cols[id(node)]

    # -- phase 1 -------------------------------------------------------------------
    def prepare(self, node: exp.Expr) -> None:
        """Evaluate the single-column sub-expressions of ``node`` on all cells; record breakpoints."""
        cols = self.columns_in(node)
        if not cols:
            return
        branch = isinstance(node, exp.If) and isinstance(node.parent, exp.Case)
        if len(cols) == 1 and not branch:
            (name,) = cols
            col = self._by_name[name.lower()]
            cells = candidate_cells(node, col)
            self._env = {name: base_value(col, cells)}
            try:
                val = self.ev(node)
            finally:
                self._env = None
            n = col.n_cells if cells is None else len(cells)
            val = Val(val.kind, _as_vector(val.v, n), _as_vector(val.null, n, bool), val.col, val.text)
            self._memo1d[id(node)] = (name, cells, val)
            changes = change_points(val)
            self._cuts.setdefault(name, [_ZERO]).append(changes if cells is None else np.asarray(cells)[changes])
            return
        for child in children(node):
            self.prepare(child)

    def need_unit(self, col: Column) -> None:
        """Make every cell of ``col`` its own slab (GROUP BY columns)."""
        self._cuts.setdefault(col.name, [_ZERO]).append(np.arange(col.n_cells, dtype=np.int64))

    @property
    def cuts(self) -> dict[str, set[int]]:
        """Declared column name → its breakpoints (a copy, for inspection)."""
        return {name: set(self._sorted_cuts(name).tolist()) for name in self._cuts}

    # -- phase 2 -------------------------------------------------------------------
    def grid_boxes(self, columns: Iterable[str]) -> int:
        """How many boxes :meth:`set_grid` of ``columns`` would have."""
        return math.prod(len(self._sorted_cuts(c)) for c in set(columns))

    def set_grid(self, columns: list[str], fixed: Mapping[str, int] | None = None) -> tuple[list[str], list[np.ndarray]]:
        """Fix the grid for the columns (declaration order); returns (columns, breakpoints).

        ``fixed``: columns held at one cell each (one slab, sampled at that cell): a GROUP BY's
        group at a time, on a grid whose other columns are wide."""
        cols = [c.name for c in self.table.columns if c.name in set(columns)]
        bps = [np.array([fixed[c]], dtype=np.int64) if fixed and c in fixed else self._sorted_cuts(c) for c in cols]
        boxes = math.prod(len(b) for b in bps)
        if boxes > MAX_GRID_BOXES:
            sizes = ", ".join(f"{c}: {len(b)} slabs" for c, b in zip(cols, bps, strict=True))
            raise UnsupportedQuery(
                f"this query needs a grid of {boxes} boxes ({sizes}), more than the limit of {MAX_GRID_BOXES}; "
                "use fewer columns inside arithmetic or comparisons between columns, or coarser predicates."
            )
        self._grid = {c: (ax, len(cols), b) for ax, (c, b) in enumerate(zip(cols, bps, strict=True))}
        self._sampled = {}
        return cols, bps

    def grid_breakpoints(self, column: str) -> np.ndarray:
        """All breakpoints of ``column`` (as :meth:`set_grid` without ``fixed`` would use)."""
        return self._sorted_cuts(column)

    def _sorted_cuts(self, column: str) -> np.ndarray:
        """The breakpoints of ``column``, united and sorted once per list of cuts (it only grows,
        so its length tells whether it changed): a wide column's are sorted once, not per group."""
        cuts = self._cuts.get(column, [_ZERO])
        hit = self._sorted.get(column)
        if hit is None or hit[0] != len(cuts):
            arr = np.sort(np.concatenate(cuts).astype(np.int64, copy=False))  # a sort: np.unique hashes, slower here
            arr = arr[np.concatenate(([True], arr[1:] != arr[:-1]))]
            arr.setflags(write=False)
            hit = self._sorted[column] = (len(cuts), arr)
        return hit[1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(b) for _, _, b in sorted(self._grid.values(), key=lambda t: t[0]))

    def _sample(self, key: int) -> Val:
        if key not in self._sampled:
            name, cells, val = self._memo1d[key]
            ax, nd, bps = self._grid[name]
            shape = [1] * nd
            shape[ax] = len(bps)
            idx = bps if cells is None else np.searchsorted(cells, bps, side="right") - 1
            self._sampled[key] = Val(
                val.kind, val.v[idx].reshape(shape), val.null[idx].reshape(shape), val.col, val.text
            )
        return self._sampled[key]

    # -- evaluation ------------------------------------------------------------------
    def ev(self, node: exp.Expr) -> Val:
        """Evaluate a row-level expression (in the 1-D phase or on the current grid)."""
        if self._env is None and id(node) in self._memo1d:
            return self._sample(id(node))
        val = handler_for(type(node))(self, node)
        if node.args.get("negate") and not isinstance(node, (exp.Like, exp.ILike)):
            if val.kind != BOOL:
                raise UnsupportedQuery(f"{node.sql()!r}: NOT applies to conditions only.")
            val = boolean(np.logical_not(val.v), val.null)
        return val

    def column_value(self, node: exp.Column) -> Val:
        """The value of a column reference in the 1-D phase (a column is never read on the grid)."""
        (name,) = self.columns_in(node)
        if self._env is None or name not in self._env:
            raise DPGateInternalError(f"column {name} evaluated outside its 1-D phase")
        return self._env[name]

    # -- typed helpers -----------------------------------------------------------------
    def num(self, node: exp.Expr, ctx: exp.Expr) -> Val:
        """Evaluate ``node`` as a number (booleans count as 0/1)."""
        return self.as_num(self.ev(node), node, ctx)

    def as_num(self, a: Val, node: exp.Expr, ctx: exp.Expr) -> Val:
        """``a`` as a number (booleans count 0/1); categories, bins and strings are refused."""
        if a.kind in (NUM, NULL):
            return a
        if a.kind == BOOL:
            return Val(NUM, np.asarray(a.v, dtype=float), a.null)
        raise UnsupportedQuery(self._not_a_number(a, node, ctx))

    def _not_a_number(self, a: Val, node: exp.Expr, ctx: exp.Expr) -> str:
        where = f"{node.sql()!r} in {ctx.sql()!r}"
        if a.kind == CAT:
            name = column_of(a).name
            return (
                f"{where}: column {name!r} is categorical and carries no number; "
                f"use CASE WHEN {name} = '...' THEN 1 ELSE 0 END to give categories numbers."
            )
        if a.kind == BIN:
            return (
                f"{where}: column {column_of(a).name!r} is binned and its cells carry no single number; "
                "use CASE WHEN on the bin edges to give bins numbers, or declare an integer range."
            )
        if a.kind == TIME:
            return (f"{where}: a date or timestamp is not a number; use EXTRACT(year FROM …) (or month, day, dow, "
                    "hour, …) for numbers, and compare dates with dates.")
        return f"{where}: a string is not a number; weights must be numeric."

    def cond(self, node: exp.Expr) -> Val:
        """Evaluate ``node`` as a condition (a boolean in three-valued logic)."""
        a = self.ev(node)
        if a.kind == BOOL:
            return a
        if a.kind == NULL:
            return boolean(False, True)
        raise UnsupportedQuery(
            f"{node.sql()!r} is a {a.kind}, not a condition; write a comparison such as {node.sql()} <> 0."
        )

    def truth(self, node: exp.Expr | None) -> Any:
        """Where the condition is TRUE (UNKNOWN and FALSE both exclude the row)."""
        if node is None:
            return True
        return np.asarray(self.cond(node).v, dtype=bool)

    @staticmethod
    def finite(a: Val, node: exp.Expr) -> None:
        """Refuse values that are not finite numbers on a non-NULL cell (e.g. division by zero)."""
        if a.kind != NUM:
            return
        if not isinstance(a.v, np.ndarray) or a.v.ndim == 0:  # a scalar: cheaper than np.ndim
            if a.null is True or math.isfinite(a.v):
                return
        finite = np.isfinite(a.v)
        if finite.all():  # the common case; the NULL mask matters only where a value is not finite
            return
        bad = np.logical_and(~finite, np.logical_not(a.null))
        if np.any(bad):
            raise UnsupportedQuery(
                f"{node.sql()!r} is not a finite number for some cells (division by a value that can be 0, "
                "or an overflow); guard it, e.g. CASE WHEN x <> 0 THEN … / x ELSE 0 END."
            )

    def and_(self, a: Val, b: Val) -> Val:
        """``a AND b`` in three-valued logic."""
        v = a.v & b.v
        if _bool_arrays(a.v, a.null, b.v, b.null):
            # Same as the general formula below (De Morgan), in 4 array operations instead of 9:
            # unknown = not true, and neither side known false.
            null = (a.v | a.null) & (b.v | b.null) & ~v
            if null.shape == v.shape:  # then v & ~null == v: boolean would only copy v
                return Val(BOOL, v, null)
            return boolean(v, null)
        false = (~a.v & ~a.null) | (~b.v & ~b.null)
        return boolean(v, ~v & ~false)

    def or_(self, a: Val, b: Val) -> Val:
        """``a OR b`` in three-valued logic."""
        v = a.v | b.v
        return boolean(v, ~v & (a.null | b.null))

    # -- comparisons ------------------------------------------------------------------------
    def compare(self, sym: str, a: Val, b: Val, node: exp.Expr) -> Val:
        """``a sym b`` in three-valued logic, with the rules for categorical and binned columns."""
        if a.kind == TIME or b.kind == TIME:  # dates: numbers of seconds, constants checked against the column
            a, b = time_operands(a, b, node)
        if a.kind in (CAT, BIN) or b.kind in (CAT, BIN):
            if b.kind in (CAT, BIN) and a.kind not in (CAT, BIN):
                a, b, sym = b, a, FLIP[sym]
            if b.kind in (CAT, BIN):
                raise UnsupportedQuery(
                    f"{node.sql()!r} compares two columns of kind {a.kind}/{b.kind}; compare "
                    f"{column_of(a).name!r} with constants instead."
                )
            if b.kind == NULL:
                return boolean(np.zeros_like(a.v, dtype=bool), np.ones_like(a.v, dtype=bool))
            if a.kind == BIN and b.kind == STR:  # income < '25000' works as income < 25000
                b = coerce_literal(b, Val(NUM, 0.0, False, a.col), node)
            return categorical_compare(sym, a, b, node) if a.kind == CAT else binned_compare(sym, a, b, node)
        if a.kind == STR or b.kind == STR:
            if a.kind == STR and b.kind == STR:
                return Val(BOOL, bool(OPS[sym](a.v, b.v)), False)
            other = b if a.kind == STR else a
            if other.kind == NULL:
                return boolean(False, True)
            # A string constant takes the other side's type, as SQL casts a literal to the
            # column's type: educ = '8' works as educ = 8 (and sex = 1 as sex = '1').
            if a.kind == STR:
                a = coerce_literal(a, b, node)
            else:
                b = coerce_literal(b, a, node)
        a, b = self.as_num(a, node, node), self.as_num(b, node, node)
        self.finite(a, node)
        self.finite(b, node)
        v = OPS[sym](np.asarray(a.v), np.asarray(b.v))
        return boolean(v, np.logical_or(a.null, b.null))
