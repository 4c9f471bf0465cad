"""Cell functions: evaluate a row-level SQL expression on every cell of a grid (private).

The compiler (``dpgate.compile``) turns each aggregate into a weight function of
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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate._compile_cells import (
    _CMP,
    _FLIP,
    _OPS,
    BIN,
    BOOL,
    CAT,
    NULL,
    NUM,
    STR,
    Val,
    _base,
    _bin_truth,
    _bool,
    _candidate_cells,
    _changes,
    _fmt,
    _like_regex,
    children,
    constant,
    parse_number,
)
from dpgate.errors import DPGateInternalError, SchemaError, UnsupportedQuery
from dpgate.query import MAX_GRID_BOXES
from dpgate.schema import Column, Table

__all__ = ["Evaluator", "Val", "NUM", "BOOL", "CAT", "BIN", "STR", "NULL", "constant", "parse_number"]



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
        self.cuts: dict[str, set[int]] = {}  # declared column name → breakpoints
        self._memo1d: dict[int, tuple[str, np.ndarray | None, Val]] = {}
        self._cols: dict[int, frozenset[str]] = {}
        self._env: dict[str, Val] | None = None
        self._grid: dict[str, tuple[int, int, np.ndarray]] = {}
        self._sampled: dict[int, Val] = {}

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
            raise SchemaError(
                f"column {node.name!r} is not declared in table {self.table.name!r}{hint}; declared columns: "
                f"{[c.name for c in self.table.columns]}."
            )
        return col

    def columns_in(self, node: exp.Expression) -> frozenset[str]:
        """Declared names of the columns an expression reads (one bottom-up pass, cached per node)."""
        got = self._cols.get(id(node))
        if got is not None:
            return got
        if isinstance(node, exp.Column):
            out = frozenset((self.column(node).name,))
        else:
            out = frozenset()
            for child in children(node):
                sub = self.columns_in(child)
                if sub:
                    out = out | sub if out else sub
        self._cols[id(node)] = out
        return out

    # -- phase 1 -------------------------------------------------------------------
    def prepare(self, node: exp.Expression) -> None:
        """Evaluate the single-column sub-expressions of ``node`` on all cells; record breakpoints."""
        cols = self.columns_in(node)
        if not cols:
            return
        branch = isinstance(node, exp.If) and isinstance(node.parent, exp.Case)
        if len(cols) == 1 and not branch:
            (name,) = cols
            col = self._by_name[name.lower()]
            cells = _candidate_cells(node, col)
            self._env = {name: _base(col, cells)}
            try:
                val = self.ev(node)
            finally:
                self._env = None
            n = col.n_cells if cells is None else len(cells)
            val = Val(val.kind, _as_vector(val.v, n), _as_vector(val.null, n, bool), val.col, val.text)
            self._memo1d[id(node)] = (name, cells, val)
            changes = _changes(val)
            self.cuts.setdefault(name, {0}).update((changes if cells is None else cells[changes]).tolist())
            return
        for child in children(node):
            self.prepare(child)

    def need_unit(self, col: Column) -> None:
        """Make every cell of ``col`` its own slab (GROUP BY columns)."""
        self.cuts.setdefault(col.name, {0}).update(range(col.n_cells))

    # -- phase 2 -------------------------------------------------------------------
    def set_grid(self, columns: list[str]) -> tuple[list[str], list[np.ndarray]]:
        """Fix the grid for the columns (declaration order); returns (columns, breakpoints)."""
        cols = [c.name for c in self.table.columns if c.name in set(columns)]
        bps = [np.array(sorted(self.cuts.get(c, {0})), dtype=np.int64) for c in cols]
        boxes = math.prod(len(b) for b in bps)
        if boxes > MAX_GRID_BOXES:
            sizes = ", ".join(f"{c}: {len(b)} slabs" for c, b in zip(cols, bps))
            raise UnsupportedQuery(
                f"this query needs a grid of {boxes} boxes ({sizes}), more than the limit of {MAX_GRID_BOXES}; "
                "use fewer columns inside arithmetic or comparisons between columns, or coarser predicates."
            )
        self._grid = {c: (ax, len(cols), b) for ax, (c, b) in enumerate(zip(cols, bps))}
        self._sampled = {}
        return cols, bps

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
    def ev(self, node: exp.Expression) -> Val:
        """Evaluate a row-level expression (in the 1-D phase or on the current grid)."""
        if self._env is None and id(node) in self._memo1d:
            return self._sample(id(node))
        val = self._dispatch(node)
        if node.args.get("negate") and not isinstance(node, (exp.Like, exp.ILike)):
            if val.kind != BOOL:
                raise UnsupportedQuery(f"{node.sql()!r}: NOT applies to conditions only.")
            val = _bool(np.logical_not(val.v), val.null)
        return val

    def _dispatch(self, node: exp.Expression) -> Val:  # noqa: C901 - a dispatch table
        if isinstance(node, exp.Paren):
            return self.ev(node.this)
        if isinstance(node, exp.Column):
            (name,) = self.columns_in(node)
            if self._env is None or name not in self._env:
                raise DPGateInternalError(f"column {name} evaluated outside its 1-D phase")
            return self._env[name]
        if isinstance(node, exp.Literal):
            if node.is_string:
                return Val(STR, node.this, False)
            return Val(NUM, float(parse_number(node.this)), False, text=node.this)
        if isinstance(node, exp.Null):
            return Val(NULL, 0.0, True)
        if isinstance(node, exp.Boolean):
            return Val(BOOL, bool(node.this), False)
        if isinstance(node, exp.Neg):
            a = self.num(node.this, node)
            return Val(NUM, -a.v, a.null)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            return self._arith(node)
        if type(node) in _CMP:
            sym, _ = _CMP[type(node)]
            return self.compare(sym, self.ev(node.this), self.ev(node.expression), node)
        if isinstance(node, (exp.And, exp.Or)):
            a, b = self.cond(node.this), self.cond(node.expression)
            return self._and(a, b) if isinstance(node, exp.And) else self._or(a, b)
        if isinstance(node, exp.Not):
            a = self.cond(node.this)
            return _bool(~a.v, a.null)
        if isinstance(node, exp.Is):
            return self._is(node)
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                raise UnsupportedQuery("BETWEEN SYMMETRIC is not supported; order the bounds and use BETWEEN.")
            x = self.ev(node.this)
            lo = self.compare(">=", x, self.ev(node.args["low"]), node)
            hi = self.compare("<=", x, self.ev(node.args["high"]), node)
            return self._and(lo, hi)
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, (exp.Like, exp.ILike)):
            return self._like(node, None)
        if isinstance(node, exp.Escape):
            if not isinstance(node.this, (exp.Like, exp.ILike)):
                raise UnsupportedQuery(f"ESCAPE is only supported with LIKE / ILIKE, not in {node.sql()!r}.")
            esc = self.ev(node.expression)
            if esc.kind != STR or len(esc.v) != 1:
                raise UnsupportedQuery("ESCAPE needs a one-character string constant.")
            return self._like(node.this, esc.v)
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.If):
            return self._branches([(node.this, node.args.get("true"))], node.args.get("false"), node)
        if isinstance(node, exp.Coalesce):
            vals = [self.num(e, node) for e in [node.this, *node.expressions]]
            acc = vals[-1]
            for a in reversed(vals[:-1]):
                acc = Val(NUM, np.where(a.null, acc.v, a.v), a.null & acc.null)
            return self._keep_bool(acc, vals)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self._cast(node)
        if isinstance(node, exp.Abs):
            a = self.num(node.this, node)
            return Val(NUM, np.abs(a.v), a.null)
        return self._refuse(node)

    def _refuse(self, node: exp.Expression) -> Val:
        sql = node.sql()
        if isinstance(node, exp.Placeholder):
            raise UnsupportedQuery(f"the parameter {sql} has no value; pass params= to bind it.")
        if isinstance(node, (exp.Subquery, exp.Select, exp.Exists, exp.SetOperation)):
            raise UnsupportedQuery(f"subqueries are not supported ({sql!r}); write one SELECT over one table.")
        if isinstance(node, exp.Window):
            raise UnsupportedQuery(f"window functions (OVER) are not supported ({sql!r}).")
        if isinstance(node, (exp.AggFunc, exp.Filter)):
            raise UnsupportedQuery(
                f"the aggregate {sql!r} is used inside a row-level expression (WHERE, FILTER, or another "
                "aggregate); aggregates may only appear at the top of SELECT items (use HAVING to filter groups)."
            )
        if isinstance(node, (exp.Func, exp.Anonymous)):
            name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
            raise UnsupportedQuery(
                f"function {name.upper()} is not supported in {sql!r}; row-level expressions may use "
                "CASE WHEN, IF, COALESCE, ABS, CAST, arithmetic, comparisons, BETWEEN, IN, LIKE and IS NULL."
            )
        raise UnsupportedQuery(f"the expression {sql!r} ({type(node).__name__}) is not supported by dpgate.")

    # -- typed helpers -----------------------------------------------------------------
    def num(self, node: exp.Expression, ctx: exp.Expression) -> Val:
        """Evaluate ``node`` as a number (booleans count as 0/1)."""
        return self.as_num(self.ev(node), node, ctx)

    def as_num(self, a: Val, node: exp.Expression, ctx: exp.Expression) -> Val:
        if a.kind in (NUM, NULL):
            return a
        if a.kind == BOOL:
            return Val(NUM, np.asarray(a.v, dtype=float), a.null)
        raise UnsupportedQuery(self._not_a_number(a, node, ctx))

    def _not_a_number(self, a: Val, node: exp.Expression, ctx: exp.Expression) -> str:
        where = f"{node.sql()!r} in {ctx.sql()!r}"
        if a.kind == CAT:
            return (
                f"{where}: column {a.col.name!r} is categorical and carries no number; "  # type: ignore[union-attr]
                f"use CASE WHEN {a.col.name} = '...' THEN 1 ELSE 0 END to give categories numbers."  # type: ignore[union-attr]
            )
        if a.kind == BIN:
            return (
                f"{where}: column {a.col.name!r} is binned and its cells carry no single number; "  # type: ignore[union-attr]
                "use CASE WHEN on the bin edges to give bins numbers, or declare an integer range."
            )
        return f"{where}: a string is not a number; weights must be numeric."

    def cond(self, node: exp.Expression) -> Val:
        """Evaluate ``node`` as a condition (a boolean in three-valued logic)."""
        a = self.ev(node)
        if a.kind == BOOL:
            return a
        if a.kind == NULL:
            return _bool(False, True)
        raise UnsupportedQuery(
            f"{node.sql()!r} is a {a.kind}, not a condition; write a comparison such as {node.sql()} <> 0."
        )

    def truth(self, node: exp.Expression | None) -> Any:
        """Where the condition is TRUE (UNKNOWN and FALSE both exclude the row)."""
        if node is None:
            return True
        return np.asarray(self.cond(node).v, dtype=bool)

    @staticmethod
    def finite(a: Val, node: exp.Expression) -> None:
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

    def _and(self, a: Val, b: Val) -> Val:
        v = a.v & b.v
        if _bool_arrays(a.v, a.null, b.v, b.null):
            # Same as the general formula below (De Morgan), in 4 array operations instead of 9:
            # unknown = not true, and neither side known false.
            null = (a.v | a.null) & (b.v | b.null) & ~v
            if null.shape == v.shape:  # then v & ~null == v: _bool would only copy v
                return Val(BOOL, v, null)
            return _bool(v, null)
        false = (~a.v & ~a.null) | (~b.v & ~b.null)
        return _bool(v, ~v & ~false)

    def _or(self, a: Val, b: Val) -> Val:
        v = a.v | b.v
        return _bool(v, ~v & (a.null | b.null))

    @staticmethod
    def _keep_bool(out: Val, parts: list[Val]) -> Val:
        if all(p.kind in (BOOL, NULL) for p in parts):
            return _bool(np.asarray(out.v) != 0, out.null)
        return out

    # -- arithmetic -----------------------------------------------------------------------
    def _arith(self, node: exp.Expression) -> Val:
        a, b = self.num(node.this, node), self.num(node.expression, node)
        with np.errstate(all="ignore"):
            if isinstance(node, exp.Add):
                v = np.add(a.v, b.v)
            elif isinstance(node, exp.Sub):
                v = np.subtract(a.v, b.v)
            elif isinstance(node, exp.Mul):
                v = np.multiply(a.v, b.v)
            elif isinstance(node, exp.Div):
                v = np.divide(a.v, b.v)
            else:  # Mod: SQL's remainder takes the sign of the dividend, like C's fmod
                v = np.fmod(a.v, b.v)
                v = np.where(np.asarray(b.v) == 0, np.nan, v)
        return Val(NUM, v, np.logical_or(a.null, b.null))

    # -- comparisons ------------------------------------------------------------------------
    def compare(self, sym: str, a: Val, b: Val, node: exp.Expression) -> Val:
        """``a sym b`` in three-valued logic, with the rules for categorical and binned columns."""
        if a.kind in (CAT, BIN) or b.kind in (CAT, BIN):
            if b.kind in (CAT, BIN) and a.kind not in (CAT, BIN):
                a, b, sym = b, a, _FLIP[sym]
            if b.kind in (CAT, BIN):
                raise UnsupportedQuery(
                    f"{node.sql()!r} compares two columns of kind {a.kind}/{b.kind}; compare "
                    f"{a.col.name!r} with constants instead."  # type: ignore[union-attr]
                )
            if b.kind == NULL:
                return _bool(np.zeros_like(a.v, dtype=bool), np.ones_like(a.v, dtype=bool))
            return self._cat_cmp(sym, a, b, node) if a.kind == CAT else self._bin_cmp(sym, a, b, node)
        if a.kind == STR or b.kind == STR:
            if a.kind == STR and b.kind == STR:
                return Val(BOOL, bool(_OPS[sym](a.v, b.v)), False)
            other = b if a.kind == STR else a
            if other.kind == NULL:
                return _bool(False, True)
            raise UnsupportedQuery(
                f"{node.sql()!r} compares a number with a string; compare numeric and boolean columns "
                "with numbers (no quotes), and categorical columns with their declared values."
            )
        a, b = self.as_num(a, node, node), self.as_num(b, node, node)
        self.finite(a, node)
        self.finite(b, node)
        v = _OPS[sym](np.asarray(a.v), np.asarray(b.v))
        return _bool(v, np.logical_or(a.null, b.null))

    def _literal_of(self, b: Val, a: Val, node: exp.Expression) -> str:
        col = a.col
        assert col is not None
        if b.kind == STR:
            text = str(b.v)
        elif b.kind == NUM and np.ndim(b.v) == 0:
            text = b.text if b.text is not None else _fmt(b.v)
            if text not in col.values and float(b.v).is_integer():
                text = _fmt(b.v)
        else:
            raise UnsupportedQuery(
                f"{node.sql()!r}: categorical column {col.name!r} can only be compared with constants "
                f"(one of {list(col.values)})."
            )
        if text not in col.values:
            raise UnsupportedQuery(
                f"{text!r} is not a declared value of categorical column {col.name!r} (in {node.sql()!r}); "
                f"declared values: {list(col.values)}. Rows with undeclared values are counted in the "
                f"column's 'other' cell, which no comparison selects."
            )
        return text

    def _cat_cmp(self, sym: str, a: Val, b: Val, node: exp.Expression) -> Val:
        col = a.col
        assert col is not None
        if sym not in ("=", "<>"):
            raise UnsupportedQuery(
                f"{node.sql()!r}: categorical column {col.name!r} supports =, <>, IN, LIKE and IS NULL, "
                f"not {sym}; list the wanted values with IN (...)."
            )
        idx = col.values.index(self._literal_of(b, a, node))
        hit = np.asarray(a.v) == idx
        return _bool(hit if sym == "=" else ~hit, a.null)

    def _bin_cmp(self, sym: str, a: Val, b: Val, node: exp.Expression) -> Val:
        col = a.col
        assert col is not None
        if b.kind != NUM or np.ndim(b.v) != 0:
            raise UnsupportedQuery(
                f"{node.sql()!r}: binned column {col.name!r} can only be compared with numeric constants "
                f"on its bin edges {[_fmt(e) for e in col.edges]}."
            )
        c = float(b.v)
        table = np.zeros(col.n_cells, dtype=bool)
        for i, (lo, hi) in enumerate(zip(col.edges, col.edges[1:])):
            table[i] = _bin_truth(col, sym, lo, hi, c, node)
        return _bool(table[np.asarray(a.v)], a.null)

    def _in(self, node: exp.In) -> Val:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise UnsupportedQuery(f"IN with a subquery is not supported ({node.sql()!r}); list constants: IN (1, 2).")
        if not node.expressions:
            raise UnsupportedQuery(f"{node.sql()!r}: IN needs a list of constants.")
        x = self.ev(node.this)
        acc: Val | None = None
        for e in node.expressions:
            eq = self.compare("=", x, self.ev(e), node)
            acc = eq if acc is None else self._or(acc, eq)
        assert acc is not None
        return acc

    def _like(self, node: exp.Expression, escape: str | None) -> Val:
        x, p = self.ev(node.this), self.ev(node.expression)
        if x.kind != CAT:
            raise UnsupportedQuery(
                f"{node.sql()!r}: LIKE / ILIKE apply to categorical columns only (matched against their "
                "declared values)."
            )
        col = x.col
        assert col is not None
        if p.kind == NULL:
            return _bool(np.zeros_like(x.v, dtype=bool), np.ones_like(x.v, dtype=bool))
        if p.kind != STR:
            raise UnsupportedQuery(f"{node.sql()!r}: the LIKE pattern must be a string constant.")
        rx = _like_regex(str(p.v), escape, isinstance(node, exp.ILike))
        table = np.zeros(col.n_cells, dtype=bool)
        for i, value in enumerate(col.values):
            table[i] = rx.fullmatch(value) is not None
        if node.args.get("negate"):  # NOT LIKE: ``other`` matches no pattern, so NOT LIKE selects it
            table[: col.null_cell] = ~table[: col.null_cell]
        return _bool(table[np.asarray(x.v)], x.null)

    def _is(self, node: exp.Is) -> Val:
        a, rhs = self.ev(node.this), node.expression
        if isinstance(rhs, exp.Null):
            self.finite(a, node)
            null = np.asarray(a.null, dtype=bool)
            return Val(BOOL, null.copy() if null.ndim else bool(null), False)
        if isinstance(rhs, exp.Boolean):
            if a.kind not in (BOOL, NULL):
                raise UnsupportedQuery(f"{node.sql()!r}: IS TRUE / IS FALSE need a condition.")
            v = a.v if rhs.this else np.logical_and(np.logical_not(a.v), np.logical_not(a.null))
            return Val(BOOL, v, False)
        raise UnsupportedQuery(f"{node.sql()!r}: IS supports NULL, TRUE and FALSE only.")

    # -- CASE / IF / CAST -----------------------------------------------------------------------
    def _case(self, node: exp.Case) -> Val:
        operand = node.this
        pairs = []
        for branch in node.args.get("ifs") or []:
            pairs.append((branch.this, branch.args.get("true"), operand))
        return self._branches(pairs, node.args.get("default"), node)

    def _branches(self, pairs: list[tuple], default: exp.Expression | None, node: exp.Expression) -> Val:
        acc = self.ev(default) if default is not None else Val(NULL, 0.0, True)
        vals = [acc]
        results = []
        for pair in pairs:
            when, then = pair[0], pair[1]
            if len(pair) > 2 and pair[2] is not None:
                c = self.compare("=", self.ev(pair[2]), self.ev(when), node)
            else:
                c = self.cond(when)
            results.append((c, self.ev(then) if then is not None else Val(NULL, 0.0, True)))
        vals += [r for _, r in results]
        all_bool = all(v.kind in (BOOL, NULL) for v in vals)
        for v, src in zip(vals, [default, *[p[1] for p in pairs]]):
            if v.kind not in (NUM, BOOL, NULL):
                raise UnsupportedQuery(
                    f"{node.sql()!r}: CASE / IF branches must be numbers or conditions, but "
                    f"{(src.sql() if src is not None else 'NULL')!r} is a {v.kind}; give each branch a number."
                )
        acc = self.as_num(acc, node, node)
        for c, r in reversed(results):
            r = self.as_num(r, node, node)
            acc = Val(NUM, np.where(c.v, r.v, acc.v), np.where(c.v, r.null, acc.null))
        if all_bool:
            return _bool(np.asarray(acc.v) != 0, acc.null)
        return acc

    def _cast(self, node: exp.Cast) -> Val:
        to: exp.DataType = node.args["to"]
        a = self.ev(node.this)
        if to.is_type(exp.DataType.Type.BOOLEAN):
            if a.kind in (BOOL, NULL):
                return a
            a = self.as_num(a, node.this, node)
            self.finite(a, node)
            return _bool(np.asarray(a.v) != 0, a.null)
        if to.is_type(*exp.DataType.INTEGER_TYPES):
            a = self.as_num(a, node.this, node)
            self.finite(a, node)
            v = np.asarray(a.v, dtype=float)
            if np.any(np.logical_and(v != np.round(v), np.logical_not(a.null))):
                raise UnsupportedQuery(
                    f"{node.sql()!r} casts a non-integer value to an integer type (SQL would round it); "
                    "only integer and boolean values may be cast to INT."
                )
            return a
        if to.is_type(*exp.DataType.REAL_TYPES):
            return self.as_num(a, node.this, node)
        raise UnsupportedQuery(
            f"{node.sql()!r}: CAST to {to.sql()} is not supported; cast to INTEGER, DOUBLE or BOOLEAN."
        )
