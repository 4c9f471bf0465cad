"""Cell-level building blocks of the compiler: values, constants, bins, candidate cells.

Used by :mod:`dpgate.compile.evaluate`.  A :class:`Val` is a row-level value over a
grid (numpy arrays that broadcast) or a constant (scalars), with SQL's NULL as a
separate mask.  Comparisons of categorical and binned columns with constants
(:func:`categorical_compare`, :func:`binned_compare`) live here too: they need
the column's declaration, not the evaluator.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlglot import exp

from dpgate._validate import FALSE_WORDS, TRUE_WORDS
from dpgate.compile.bounds import LARGEST_EXPONENT, excerpt, number_order, refuse_out_of_range
from dpgate.errors import DPGateInternalError, UnsupportedQuery
from dpgate.schema._temporal import TEMPORAL_KINDS
from dpgate.schema.domains import Column

__all__ = [
    "NUM", "BOOL", "CAT", "BIN", "STR", "NULL", "TIME", "CMP", "FLIP", "OPS", "Val",
    "children", "walk", "column_of", "boolean", "parse_number", "constant", "like_regex", "fmt_number", "base_value",
    "candidate_cells", "change_points", "bin_truth", "categorical_compare", "binned_compare", "coerce_literal",
]

NUM, BOOL, CAT, BIN, STR, NULL = "number", "boolean", "categorical", "binned", "string", "null"
#: A date/timestamp value: seconds since 1970-01-01 of a granule's start (:mod:`dpgate.compile._dates`).
TIME = "time"

CMP: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    exp.EQ: ("=", operator.eq),
    exp.NEQ: ("<>", operator.ne),
    exp.LT: ("<", operator.lt),
    exp.LTE: ("<=", operator.le),
    exp.GT: (">", operator.gt),
    exp.GTE: (">=", operator.ge),
}
FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
OPS = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass
class Val:
    """A value of a row-level expression on a grid (arrays broadcast) or a constant (scalars).

    ``kind`` is one of number, boolean, categorical, binned, string, null.  For
    categorical and binned values ``v`` holds cell indices of ``col``.  Where
    ``null`` is true ``v`` is meaningless (for booleans it is kept false).
    """

    kind: str
    v: Any
    null: Any
    col: Column | None = None
    text: str | None = None  # SQL text of a literal (categorical comparisons)


#: Base class of sqlglot nodes (``Expr`` in recent sqlglot, ``Expression`` in older releases).
if TYPE_CHECKING:
    _NODE = exp.Expr
else:
    _NODE = getattr(exp, "Expr", exp.Expression)


def children(node: exp.Expr) -> list[exp.Expr]:
    """The child nodes of ``node``, in ``node.iter_expressions()`` order (without its generator overhead)."""
    out: list[exp.Expr] = []
    for v in node.args.values():
        if isinstance(v, list):
            out.extend(x for x in v if isinstance(x, _NODE))
        elif isinstance(v, _NODE):
            out.append(v)
    return out


def walk(node: exp.Expr) -> list[exp.Expr]:
    """``node`` and all its descendants in breadth-first order, like ``list(node.walk())`` but faster."""
    out = [node]
    i = 0
    while i < len(out):
        for v in out[i].args.values():
            if isinstance(v, list):
                out.extend(x for x in v if isinstance(x, _NODE))
            elif isinstance(v, _NODE):
                out.append(v)
        i += 1
    return out


def column_of(a: Val) -> Column:
    """The declared column of a categorical or binned value (such values always carry it)."""
    if a.col is None:
        raise DPGateInternalError(f"a {a.kind} value lost its column")
    return a.col


def boolean(v: Any, null: Any) -> Val:
    """A condition's value: true only where ``v`` holds and the value is known (SQL's three-valued logic)."""
    return Val(BOOL, np.logical_and(v, np.logical_not(null)), null)


@functools.lru_cache(maxsize=4096)
def parse_number(text: str) -> Fraction:
    """Exact value of a SQL numeric literal (cached: a pure function of the text; Fractions are immutable).

    Its digits, exponent and order of magnitude are checked on the text first
    (:func:`~dpgate.compile.bounds.check_number_text`): ``Fraction("1e10000000")`` would
    compute ``10**10000000`` before any range check could refuse it.
    """
    order = number_order(text)
    if order is not None and order > LARGEST_EXPONENT:
        raise refuse_out_of_range(text)
    try:
        value = Fraction(text.replace("_", ""))
    except (ValueError, ZeroDivisionError):
        try:
            f = float(text)
        except ValueError:
            raise UnsupportedQuery(f"cannot read the number {excerpt(text)}; write it as a decimal constant.") from None
        if not math.isfinite(f):
            raise UnsupportedQuery(f"the constant {excerpt(text)} is not finite.") from None
        return Fraction(f)
    if abs(value) > _LARGEST_CONSTANT:
        raise refuse_out_of_range(text)
    return value


_LARGEST_CONSTANT = Fraction(10) ** 300


def constant(node: exp.Expr) -> Fraction | None:
    """Exact value of a constant numeric expression (literals, + − × ÷, parentheses), else None."""
    if isinstance(node, exp.Paren):
        return constant(node.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        return parse_number(node.this)
    if isinstance(node, exp.Neg):
        c = constant(node.this)
        return None if c is None else -c
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a, b = constant(node.this), constant(node.expression)
        if a is None or b is None:
            return None
        if isinstance(node, exp.Add):
            return a + b
        if isinstance(node, exp.Sub):
            return a - b
        if isinstance(node, exp.Mul):
            return a * b
        if b == 0:
            raise UnsupportedQuery(f"division by zero in {excerpt(node.sql())}.")
        return a / b
    return None


def like_regex(pattern: str, escape: str | None, ci: bool) -> re.Pattern[str]:
    """The regular expression of a LIKE (``ci``: ILIKE) pattern; ``%`` and ``_`` are its only wildcards.

    Use it with ``fullmatch``.  It cannot backtrack: ``%a%a…%b`` as ``.*a.*a….*b`` takes time
    exponential in the number of ``%`` on a label it does not match, so each part between
    two ``%`` is an atomic group that takes the part's leftmost occurrence (a later one only
    leaves less text for the rest, so the leftmost is never worse) and only the ``%`` before
    the last part scans back: time O(len(pattern) × len(value)).
    """
    parts: list[list[str]] = [[]]  # the pattern's fixed-length parts between % wildcards, as regex pieces
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape and ch == escape and i + 1 < len(pattern):
            parts[-1].append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if ch == "%":
            parts.append([])
        else:
            parts[-1].append("." if ch == "_" else re.escape(ch))
        i += 1
    text = "".join(parts[0])
    if len(parts) > 1:
        text += "".join(f"(?>.*?{''.join(p)})" for p in parts[1:-1]) + ".*" + "".join(parts[-1])
    return re.compile(text, re.DOTALL | (re.IGNORECASE if ci else 0))


def fmt_number(x: float) -> str:
    """``x`` as SQL would print a constant: integers without a decimal point."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def base_value(col: Column, cells: np.ndarray | None = None) -> Val:
    """The 1-D value of a bare column reference: one entry per cell (or per listed cell)."""
    return _all_cells(col) if cells is None else _cells_value(col, cells)


@functools.lru_cache(maxsize=1024)
def _all_cells(col: Column) -> Val:
    """:func:`base_value` over every cell, cached per declared column (read-only arrays: a pure function of it)."""
    val = _cells_value(col, np.arange(col.n_cells))
    for arr in (val.v, val.null):
        arr.setflags(write=False)
    return val


def _cells_value(col: Column, idx: np.ndarray) -> Val:
    null = idx == col.null_cell
    if col.kind == "integer":
        return Val(NUM, np.where(null, 0.0, (col.min + idx).astype(float)), null, col)
    if col.kind == "boolean":
        return Val(BOOL, idx == 1, null, col)
    if col.kind in TEMPORAL_KINDS:
        return _time_cells(col, idx, null)
    return Val(CAT if col.kind == "categorical" else BIN, idx, null, col)


def _time_cells(col: Column, idx: np.ndarray, null: np.ndarray) -> Val:
    """The TIME value of a date/timestamp column on cells ``idx`` (granule starts, in seconds)."""
    lo, _ = col.int_range()
    k = np.where(null, lo, lo + idx).astype(np.int64)
    gran = col.granularity
    if gran == "year":
        secs = (k - 1970).astype("datetime64[Y]").astype("datetime64[s]").astype(np.int64)
    elif gran in ("month", "quarter"):  # a quarter's start is its first month's
        months = k - 12 * 1970 if gran == "month" else 3 * k - 12 * 1970
        secs = months.astype("datetime64[M]").astype("datetime64[s]").astype(np.int64)
    elif gran == "week":
        secs = (7 * k - 3) * 86400
    else:
        secs = k * {"day": 86400, "hour": 3600, "minute": 60}[gran or "day"]
    return Val(TIME, np.where(null, 0.0, secs.astype(float)), null, col)


#: Integer columns with more cells than this are evaluated only at candidate cells
#: (around the constants they are compared with) when comparisons are all they appear in.
_SPARSE_MIN_CELLS = 256


def candidate_cells(node: exp.Expr, col: Column) -> np.ndarray | None:
    """Cells where a single-column expression on a large integer column can change, or None.

    ``v op c`` on integers changes only between ``floor(c)``, ``ceil(c)`` and the next
    integer, so when the column appears only as an operand of comparisons, BETWEEN and
    IN against constants (and IS NULL), evaluating at those cells (plus 0 and NULL) is
    exact, and a 500 001-cell income column costs a handful of evaluations.
    """
    low = col.min
    if col.kind != "integer" or low is None or col.n_cells <= _SPARSE_MIN_CELLS:
        return None
    consts: list[Fraction] = []
    for ref in walk(node):
        if not isinstance(ref, exp.Column):
            continue
        child: exp.Expr = ref
        parent = ref.parent
        while isinstance(parent, exp.Paren):
            child, parent = parent, parent.parent
        if parent is None:  # a bare column: its value, not a comparison, is what is evaluated
            return None
        try:
            if type(parent) in CMP:
                other = parent.expression if parent.this is child else parent.this
                found = [constant(other)]
            elif isinstance(parent, exp.Between) and parent.this is child:
                found = [constant(parent.args["low"]), constant(parent.args["high"])]
            elif isinstance(parent, exp.In) and parent.this is child and not parent.args.get("query"):
                found = [constant(e) for e in parent.expressions]
            elif isinstance(parent, exp.Is) and parent.this is child:
                found = []
            else:
                return None
        except UnsupportedQuery:
            return None
        if any(c is None for c in found):
            return None
        consts.extend(c for c in found if c is not None)
    cand = {0, col.null_cell}
    for c in consts:
        for v in (math.floor(c), math.ceil(c), math.floor(c) + 1, math.ceil(c) + 1):
            cell = v - low
            if 0 <= cell < col.null_cell:
                cand.add(cell)
    return np.array(sorted(cand), dtype=np.int64)


def change_points(val: Val) -> np.ndarray:
    """Cell indices where a 1-D value (or its NULL-ness) changes."""
    v, null = val.v, val.null
    if val.kind in (CAT, BIN, STR):
        return np.arange(1, len(v))
    # A condition is already False on NULL cells (``boolean``); other values are masked so that
    # what a NULL cell holds never adds a breakpoint.
    vv = v if val.kind == BOOL else np.where(null, 0, v)
    diff = (vv[1:] != vv[:-1]) | (null[1:] != null[:-1])
    return np.flatnonzero(diff) + 1


def bin_truth(col: Column, sym: str, lo: float, hi: float, c: float, node: exp.Expr) -> bool:
    """Truth of ``value sym c`` for every value of the bin [lo, hi), or refuse when it splits the bin.

    Integer-valued binned columns (declared with ``min``/``max``) hold integers, so
    the bin is the integers ``ceil(lo) .. ceil(hi) - 1``; other bins are real intervals.
    """
    op = OPS[sym]
    if col.min is not None:  # integer bins
        a, b = math.ceil(lo), math.ceil(hi) - 1
        if a > b:
            return False
        if sym in ("=", "<>"):
            if not (a <= c <= b and float(c).is_integer()):
                return sym == "<>"
            if a == b:
                return sym == "="
        else:
            at_a, at_b = bool(op(a, c)), bool(op(b, c))
            if at_a == at_b:
                return at_a
    else:
        if sym in ("=", "<>"):
            if not (lo <= c < hi):
                return sym == "<>"
        else:
            at_a = bool(op(lo, c))
            # value just below hi: x < c ⟺ hi <= c ... evaluated on the open end
            at_b = {"<": hi <= c, "<=": hi <= c, ">": hi > c, ">=": hi > c}[sym]
            if at_a == at_b:
                return at_a
    raise UnsupportedQuery(
        f"{excerpt(node.sql())} splits bin [{fmt_number(lo)}, {fmt_number(hi)}) of column {col.name!r} "
        f"(declared edges: {', '.join(fmt_number(e) for e in col.edges)}); compare against a bin edge instead, "
        f"e.g. {col.name} < {fmt_number(lo)} or {col.name} < {fmt_number(hi)}."
    )


# -- categorical and binned columns against constants ---------------------------------------------
def _literal_of(b: Val, a: Val, node: exp.Expr) -> str:
    """The declared value of categorical column ``a.col`` that the constant ``b`` names, or refuse."""
    col = column_of(a)
    if b.kind == STR:
        text = str(b.v)
    elif b.kind == NUM and np.ndim(b.v) == 0:
        text = b.text if b.text is not None else fmt_number(b.v)
        if text not in col.values and float(b.v).is_integer():
            text = fmt_number(b.v)
    else:
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: categorical column {col.name!r} can only be compared with constants "
            f"(one of {list(col.values)})."
        )
    if text not in col.values:
        raise UnsupportedQuery(
            f"{excerpt(text)} is not a declared value of categorical column {col.name!r} (in {excerpt(node.sql())}); "
            f"declared values: {list(col.values)}. Rows with undeclared values are counted in the "
            f"column's 'other' cell, which no comparison selects."
        )
    return text


def categorical_compare(sym: str, a: Val, b: Val, node: exp.Expr) -> Val:
    """``a sym b`` for a categorical column ``a`` and a constant ``b`` (only ``=`` and ``<>``)."""
    col = column_of(a)
    if sym not in ("=", "<>"):
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: categorical column {col.name!r} supports =, <>, IN, LIKE and IS NULL, "
            f"not {sym}; list the wanted values with IN (...)."
        )
    idx = col.values.index(_literal_of(b, a, node))
    hit = np.asarray(a.v) == idx
    return boolean(hit if sym == "=" else ~hit, a.null)


def binned_compare(sym: str, a: Val, b: Val, node: exp.Expr) -> Val:
    """``a sym b`` for a binned column ``a`` and a numeric constant ``b`` that keeps every bin whole."""
    col = column_of(a)
    if b.kind != NUM or np.ndim(b.v) != 0:
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: binned column {col.name!r} can only be compared with numeric constants "
            f"on its bin edges {[fmt_number(e) for e in col.edges]}."
        )
    c = float(b.v)
    table = np.zeros(col.n_cells, dtype=bool)
    for i, (lo, hi) in enumerate(zip(col.edges, col.edges[1:], strict=False)):
        table[i] = bin_truth(col, sym, lo, hi, c, node)
    return boolean(table[np.asarray(a.v)], a.null)


_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def coerce_literal(text: Val, other: Val, node: exp.Expr) -> Val:
    """The string constant ``text`` as a value of ``other``'s type (a number or a boolean), or refuse.

    SQL casts a literal compared with a column to the column's type; so does dpgate, on
    every kind symmetrically: ``educ = '8'`` is ``educ = 8``, ``married = 'true'`` is
    ``married = true`` (and, in :func:`categorical_compare`, ``sex = 1`` is ``sex = '1'``).
    """
    raw = str(text.v).strip()
    col = other.col
    if other.kind == BOOL:
        word = raw.lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return Val(BOOL, word in TRUE_WORDS, False)
        what = f"boolean column {col.name!r}" if col is not None else "a condition"
        raise UnsupportedQuery(
            f"{excerpt(node.sql())}: the string {excerpt(raw)} is not a boolean, so it cannot be compared with {what}; "
            f"write true or false (or one of {sorted(TRUE_WORDS | FALSE_WORDS)})."
        )
    if other.kind == NUM and _DECIMAL.fullmatch(raw):
        return Val(NUM, float(parse_number(raw)), False, text=raw)
    if col is not None and col.kind == "integer":
        what = f"integer column {col.name!r} ({col.min}..{col.max})"
    elif col is not None and col.kind == "binned":
        what = f"binned numeric column {col.name!r} (edges {', '.join(fmt_number(e) for e in col.edges)})"
    else:
        what = "a numeric expression"
    raise UnsupportedQuery(
        f"{excerpt(node.sql())}: the string {excerpt(raw)} is not a number, so it cannot be compared with {what}; "
        "write a number, e.g. 8 or '8'."
    )
