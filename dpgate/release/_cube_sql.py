"""The SQL of the cube: sqlglot expressions mapping a row to its cell, and predicates on cells.

Why one module of about 620 lines: every SQL expression dpgate generates against the data is
built here, in one place, so that a reviewer of invariant 1 (only generated SQL reaches the
engine) reads one file.

**Internal.**  :mod:`dpgate.release.cube` holds the data source, runs
the statements and does the arithmetic on counts; this module only builds
expressions (from the public schema and the catalog's column types) and never
reads data.

Row → cell mapping (exactly :mod:`dpgate.schema.domains`'s table), where ``v`` is the
column's value:

* NULL is the NULL cell for every kind.  A floating-point NaN counts as NULL (pandas
  does the same, and DuckDB orders NaN above every number, which would otherwise
  clamp it to ``max``).  For integer/binned columns stored as text, the text is
  ``TRY_CAST`` to DOUBLE and unparseable text counts as NULL.  A number too large for a
  double (``'1e400'``) reads as ±infinity, so it is clamped like any value beyond the
  domain (``max`` / the last bin; ``min`` / the first bin if negative), and one too small
  (``'1e-400'``) as 0 — DuckDB's and Spark's reading, which PostgreSQL's generated SQL
  reproduces (:func:`_pg_double`).  No generated expression fails on any stored value:
  an engine error would tell whether the row meets the query's other conditions.
* integer ``[min, max]``: cell ``clamp(floor(v), min, max) - min``; date / timestamp: the same on
  the granule ordinal of ``v`` (:mod:`dpgate.release._dates`; non-ISO text is NULL).
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

Engines: expressions are written for the backend's sqlglot dialect
(``BoundColumn.dialect``).  In DuckDB a GROUP BY keys text categories by the text itself and maps the few
distinct values to cells in numpy (``BoundColumn.cells_of_text``); other engines join
them on a ``VALUES`` list or get a portable ``CASE``.  PostgreSQL has no ``TRY_CAST``:
text is cast only where it matches a number (or boolean) spelling its ``CAST`` accepts
and lies in a double's range (else ±infinity or 0, as above), else it counts as NULL.  Text that engines parse differently (hex, ``'1_000'``) may land
in different cells on different engines; typed columns map identically everywhere
(NaN included: PostgreSQL and Spark, like DuckDB, treat ``NaN = NaN`` as true).

Slab predicates are generated as range predicates on the raw column
(``"age" >= 20 AND "age" < 41``) rather than on the computed cell index, so DuckDB
can push them into the scan: a counting query costs about as much as the equivalent
hand-written ``SELECT COUNT(*) … WHERE …``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.compile.query import breakpoint_array
from dpgate.errors import DPGateInternalError
from dpgate.release._dates import granule_ordinal
from dpgate.schema.domains import Column

__all__ = [
    "BoundColumn",
    "conjunction",
    "disjunction",
    "grouped_counts",
    "leaf_count",
    "number",
    "numeric_category",
    "set_condition",
    "sql_type",
    "type_class",
]

_INT_TYPES = {
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4", "INT8", "INT", "LONG", "SHORT",
}
_FLOAT_TYPES = {"FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8", "DOUBLE PRECISION"}
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)\Z")
#: See BoundColumn.few_values.
_FEW_VALUES = 2**16


#: Dialects without a ``TRY_CAST`` (sqlglot would write a plain ``CAST``, which fails on bad text).
_NO_TRY_CAST = {"postgres", "redshift"}
# Text PostgreSQL's ``CAST(… AS DOUBLE PRECISION)`` accepts (DuckDB's TRY_CAST accepts the same numbers).
# ASCII classes spelt out, case-sensitive ``~``: ``\s``, ranges and ``~*`` follow the database's locale.
_WS = r"[ \t\n\r\f\v]"
_PLAIN_RE = rf"^{_WS}*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?{_WS}*$"
#: A plain number whose exponent has at most two significant digits.
_SHORT_RE = rf"^{_WS}*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?0*[0-9]{{1,2}})?{_WS}*$"
_SPECIAL_RE = rf"^{_WS}*[-+]?([iI][nN][fF]([iI][nN][iI][tT][yY])?|[nN][aA][nN]){_WS}*$"
#: A plain number's parts: \2 integer digits (leading zeros dropped), \4 fraction digits, \6\7 exponent.
_PARTS_RE = rf"^{_WS}*([-+]?)0*([0-9]*)(\.([0-9]*))?([eE]([-+]?)0*([0-9]+))?{_WS}*$"
#: Leading 20 digits of 2**1024 - 2**970 (rounded down) and of 2**-1075 (rounded up): text at or above the
#: first (x 10**309) is out of range for a double, at or below the second (x 10**-323) rounds to zero.
_OVERFLOW_DIGITS, _UNDERFLOW_DIGITS = 17976931348623158079, 24703282292062327209
_BOOL_TEXTS = ("t", "true", "f", "false", "y", "yes", "n", "no", "on", "off", "1", "0")


def type_class(data_type: str) -> str:
    """'int' | 'float' | 'decimal' | 'bool' | 'other' for an engine's type name
    (DuckDB, PostgreSQL's ``information_schema`` and Spark's ``simpleString`` names)."""
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


def number(x: int | float) -> exp.Expression:
    """A numeric literal (negative numbers as unary minus, as sqlglot expects)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**63:
        x = int(x)
    lit = exp.Literal.number(str(abs(x)) if isinstance(x, int) else repr(abs(x)))
    return exp.Neg(this=lit) if x < 0 else lit


def sql_type(name: str) -> exp.DataType:
    return exp.DataType(this=exp.DataType.Type[name], nested=False)


def conjunction(parts: list[exp.Expression]) -> exp.Expression:
    if not parts:
        return exp.true()
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def disjunction(parts: list[exp.Expression]) -> exp.Expression:
    if not parts:
        return exp.false()
    if len(parts) == 1:
        return parts[0]
    out: exp.Expression = exp.Paren(this=parts[0])
    for p in parts[1:]:
        out = exp.Or(this=out, expression=exp.Paren(this=p))
    return exp.Paren(this=out)


def numeric_category(value: str) -> int | float | None:
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


def _pg_double(x: exp.Expression) -> exp.Expression:
    """PostgreSQL's ``TRY_CAST(x AS DOUBLE PRECISION)`` of text ``x``, which fails on no row.

    ``CAST`` raises on text that is not a number and on a number out of a double's range
    (``'1e400'``, ``'1e-400'``), so an error would tell whether some row meets a query's
    conditions.  Text is cast only where it is a number within range; a number beyond the
    largest double is ±infinity and one that rounds to zero is 0, as DuckDB and Spark read
    them (the decision looks at 20 digits, so text less than 1e-19 (relative) above 2**-1075
    reads as 0 here and as the smallest subnormal there); anything else is NULL.
    """

    def lit(v: str | int) -> exp.Expression:
        return exp.Literal.string(v) if isinstance(v, str) else number(v)

    def part(groups: str) -> exp.Expression:
        return exp.Anonymous(this="REGEXP_REPLACE", expressions=[x.copy(), lit(_PARTS_RE), lit(groups)])

    def like(pattern: str) -> exp.Expression:
        return exp.RegexpLike(this=x.copy(), expression=lit(pattern))

    def double(v: exp.Expression) -> exp.Expression:
        return exp.Cast(this=v, to=exp.DataType.build("DOUBLE PRECISION", dialect="postgres"))

    # |x| = 0.d × 10**e with d its significant digits; key = e·10**20 + d's first 20 digits orders
    # magnitudes exactly (NUMERIC), and is compared with those of the underflow and overflow thresholds.
    digits = exp.func("ltrim", part(r"\2\4"), lit("0"))
    e = exp.Sub(this=exp.Add(this=exp.Cast(this=part(r"\60\7"), to=sql_type("BIGINT")),
                             expression=exp.Length(this=digits.copy())),
                expression=exp.Length(this=part(r"\4")))
    key = exp.Add(this=exp.Mul(this=exp.Paren(this=e), expression=lit(10**20)),
                  expression=exp.Cast(this=exp.func("rpad", digits, lit(20), lit("0")), to=sql_type("DECIMAL")))
    inf = exp.Case(ifs=[exp.If(this=like(f"^{_WS}*-"), true=double(lit("-Infinity")))], default=double(lit("Infinity")))
    zero = double(lit(0))
    extreme = exp.Case(ifs=[
        exp.If(this=exp.Not(this=like("^[^eE]*[1-9]")), true=zero.copy()),
        exp.If(this=like("[eE]-0*[1-9][0-9]{12}"), true=zero.copy()),  # exponents beyond 12 digits
        exp.If(this=like("[eE][+]?0*[1-9][0-9]{12}"), true=inf.copy()),
        exp.If(this=exp.LT(this=key.copy(), expression=lit(-323 * 10**20 + _UNDERFLOW_DIGITS)), true=zero),
        exp.If(this=exp.GTE(this=key, expression=lit(309 * 10**20 + _OVERFLOW_DIGITS)), true=inf),
    ], default=double(x.copy()))
    # Short text with an exponent below 100 lies within 1e-299 .. 1e299 (or is 0): cast at once.
    short = exp.And(this=like(_SHORT_RE), expression=exp.LTE(this=exp.Length(this=x.copy()), expression=lit(200)))
    return exp.Case(ifs=[exp.If(this=short, true=double(x.copy())), exp.If(this=like(_SPECIAL_RE), true=double(x.copy())),
                         exp.If(this=like(_PLAIN_RE), true=extreme)])


@dataclass(frozen=True)
class BoundColumn:
    """A declared column bound to its physical column in the source."""

    decl: Column
    name: str  # physical name as in the catalog
    tclass: str  # see type_class
    dialect: str = "duckdb"  # sqlglot dialect of the engine

    def _try_cast(self, x: exp.Expression, to: str) -> exp.Expression:
        """``TRY_CAST(x AS to)`` (NULL for unparseable text), portable to dialects without one."""
        if self.dialect == "duckdb":
            return exp.TryCast(this=x, to=sql_type(to))
        if self.dialect not in _NO_TRY_CAST:
            return exp.TryCast(this=x, to=sql_type(to), safe=True)
        x = exp.Cast(this=x, to=sql_type("TEXT"))  # any stored type: its text, cast only where it converts
        if to == "BOOLEAN":
            text = exp.Lower(this=exp.Trim(this=x.copy()))
            ok = exp.In(this=text, expressions=[exp.Literal.string(t) for t in _BOOL_TEXTS])
            return exp.Case(ifs=[exp.If(this=ok, true=exp.Cast(this=x, to=sql_type(to)))])
        return _pg_double(x)

    def raw(self) -> exp.Expression:
        return exp.column(self.name, quoted=True)

    def value(self) -> exp.Expression:
        """The value the mapping reads: NaN and unparseable text become NULL."""
        x = self.raw()
        kind, tc = self.decl.kind, self.tclass
        nan = exp.Cast(this=exp.Literal.string("NaN"), to=sql_type("DOUBLE"))
        if kind in ("date", "timestamp"):  # its granule's ordinal, then mapped as an integer
            return granule_ordinal(x, self.decl.granularity or "day", tc, self.dialect)
        if kind in ("integer", "binned"):
            if tc in ("int", "decimal"):
                return x
            if tc == "bool":
                return exp.Cast(this=x, to=sql_type("INTEGER"))
            if tc == "float":
                return exp.Nullif(this=x, expression=nan)
            return exp.Nullif(this=self._try_cast(x, "DOUBLE"), expression=nan)
        if kind == "categorical":
            if tc == "float":
                return exp.Nullif(this=x, expression=nan)
            if tc in ("int", "decimal"):
                return x
            return exp.Cast(this=x, to=sql_type("VARCHAR"))
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
            return exp.NEQ(this=v, expression=number(0))
        as_bool = self._try_cast(v.copy(), "BOOLEAN")
        as_num = exp.NEQ(this=self._try_cast(v, "DOUBLE"), expression=number(0))
        return exp.Coalesce(this=as_bool, expressions=[as_num, exp.false()])

    # -- thresholds and categories ----------------------------------------
    def threshold(self, cell: int) -> int | float:
        """Ordered kinds: the value where cell ``cell`` starts."""
        if self.decl.kind in ("integer", "date", "timestamp"):
            return self.decl.int_range()[0] + cell
        return self.decl.edges[cell]

    def matchers(self) -> list[Any]:
        """Categorical: per declared value, the literal it is compared with (None: never matches)."""
        out: list[Any] = []
        for v in self.decl.values:
            if self.tclass in ("int", "float", "decimal"):
                n = numeric_category(v)
                if self.tclass == "int" and isinstance(n, float):
                    n = None
                out.append(n)
            else:
                out.append(v)
        return out

    def _lit(self, m: Any) -> exp.Expression:
        return number(m) if isinstance(m, (int, float)) else exp.Literal.string(m)

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
        if kind in ("integer", "binned", "date", "timestamp"):
            # Interior single cells of an integer-typed column hold one value each: one
            # ``IN`` list, which DuckDB evaluates faster than an OR of ranges.
            exact = kind == "integer" and self.tclass in ("int", "bool")
            singles = [a for a, b in ranges if exact and b == a + 1 and 0 < a < null - 1]
            if len(singles) > 1:
                lo = self.decl.int_range()[0]
                parts.append(exp.In(this=self.value(), expressions=[number(lo + a) for a in singles]))
                ranges = [(a, b) for a, b in ranges if a not in singles or b != a + 1]
            for a, b in ranges:
                b = min(b, null)
                if a >= b:
                    continue
                conds: list[exp.Expression] = []
                if a > 0:
                    conds.append(exp.GTE(this=self.value(), expression=number(self.threshold(a))))
                if b < null:
                    conds.append(exp.LT(this=self.value(), expression=number(self.threshold(b))))
                if not conds:
                    conds.append(exp.Not(this=exp.Is(this=self.value(), expression=exp.Null())))
                parts.append(conjunction(conds))
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
        return disjunction(parts)

    def cell_index(self) -> exp.Expression:
        """The row's cell index as a BIGINT expression (full resolution)."""
        d = self.decl
        null_if = exp.If(this=exp.Is(this=self.value(), expression=exp.Null()), true=number(d.null_cell))
        ifs = [null_if]
        if d.kind in ("integer", "date", "timestamp"):
            lo, hi = d.int_range()
            if hi > lo:
                ifs.append(exp.If(this=exp.LT(this=self.value(), expression=number(lo + 1)), true=number(0)))
                ifs.append(exp.If(this=exp.GTE(this=self.value(), expression=number(hi)), true=number(hi - lo)))
                v = self.value() if self.tclass in ("int", "bool") else exp.Floor(this=self.value())
                default: exp.Expression = exp.Cast(this=exp.Sub(this=v, expression=number(lo)), to=sql_type("BIGINT"))
            else:
                default = number(0)
        elif d.kind == "binned":
            # Bin i holds e_i <= v < e_(i+1), clamped: a binary search over the inner edges,
            # nested CASEs of depth log2(k) instead of a chain of k branches.
            return exp.Case(ifs=ifs, default=self._bin_search(0, len(d.edges) - 2))
        elif d.kind == "categorical":
            other = number(len(d.values))  # the out-of-domain cell, Column.other_cell
            # ``=`` against typed literals, first match wins (text in DuckDB is keyed by its value
            # instead: BoundColumn.text_keyed).
            for i, m in enumerate(self.matchers()):
                if m is not None:
                    ifs.append(exp.If(this=exp.EQ(this=self.value(), expression=self._lit(m)), true=number(i)))
            default = other
        else:
            ifs.append(exp.If(this=self.truth(), true=number(1)))
            default = number(0)
        return exp.Case(ifs=ifs, default=default)

    def text_keyed(self) -> bool:
        """Whether :func:`grouped_counts` keys this column by its value as text, mapped to cells
        in numpy (:meth:`cells_of_text`): text categoricals in DuckDB.  Grouping by the text is the
        analyst's own ``GROUP BY col``; mapping the few distinct values to cells in the engine
        cost DuckDB another operator (benchmarks/README.md, "Timings behind the code")."""
        return self.decl.kind == "categorical" and self.tclass == "other" and self.dialect == "duckdb"

    def cells_of_text(self, keys: np.ndarray) -> np.ndarray:
        """The cells of :meth:`text_keyed` keys (the rows' :meth:`value`, NULL as None or masked):
        a declared value's cell (exact string equality, as the CASE of :meth:`cell_index`), the other
        cell for any other text, the NULL cell for NULL."""
        other, null_cell = self.decl.other_cell, self.decl.null_cell
        assert other is not None
        values, masked = np.ma.getdata(keys), np.ma.getmaskarray(keys)
        if values.size > _TEXT_LOOKUP_LOOP:  # many distinct undeclared texts: pandas' hash table
            import pandas as pd

            found = pd.Index(list(self.decl.values), dtype=object).get_indexer(values)
            null = masked | pd.isna(values)
            return np.where(null, null_cell, np.where(found < 0, other, found)).astype(np.int64)
        cell = {v: i for i, v in enumerate(self.decl.values)}
        return np.array([null_cell if m or v is None else cell.get(v, other)
                         for v, m in zip(values.tolist(), masked.tolist(), strict=True)], dtype=np.int64)

    def looked_up(self) -> bool:
        """Whether :func:`grouped_counts` maps this column's values to cells with a join on a
        ``VALUES`` list of the declared values rather than with :meth:`cell_index`'s CASE:
        text categoricals outside DuckDB.  (Spark folds the two-step aggregation back into
        one and would evaluate a CASE with a branch per value on every row; a join on the
        pre-aggregated values is as fast as the raw ``GROUP BY``.  DuckDB: :meth:`text_keyed`.)"""
        return self.decl.kind == "categorical" and self.tclass == "other" and self.dialect != "duckdb"

    def lookup_join(self, table: str, value: str, cell: str) -> tuple[exp.Expression, exp.Expression, exp.Expression]:
        """For :meth:`looked_up` columns: the ``VALUES`` table ``table(value, cell)`` of the
        declared values, the join condition, and the key (NULL cell, declared cell, or other)."""
        rows = [exp.Tuple(expressions=[exp.Literal.string(v), number(i)]) for i, v in enumerate(self.decl.values)]
        alias = exp.TableAlias(this=exp.to_identifier(table, quoted=True),
                               columns=[exp.to_identifier(value, quoted=True), exp.to_identifier(cell, quoted=True)])
        on = exp.EQ(this=self.value(), expression=exp.column(value, table=table, quoted=True))
        other = self.decl.other_cell
        assert other is not None
        key = exp.Case(
            ifs=[exp.If(this=exp.Is(this=self.value(), expression=exp.Null()), true=number(self.decl.null_cell))],
            default=exp.Coalesce(this=exp.column(cell, table=table, quoted=True), expressions=[number(other)]),
        )
        return exp.Values(expressions=rows, alias=alias), on, key

    def _bin_search(self, lo: int, hi: int) -> exp.Expression:
        """Binned kind, non-NULL value known to lie in bins ``lo..hi``: its bin."""
        if lo == hi:
            return number(lo)
        mid = (lo + hi + 1) // 2  # bins >= mid start at edge e_mid
        below = exp.LT(this=self.value(), expression=number(self.decl.edges[mid]))
        return exp.Case(ifs=[exp.If(this=below, true=self._bin_search(lo, mid - 1))], default=self._bin_search(mid, hi))

    def _key_range(self) -> tuple[int, int]:
        """Binned kind: integers ``lo < e_1`` and ``hi >= e_(k-1)`` (the last inner edge)."""
        e = self.decl.edges
        return math.floor(e[0]) - 1, math.ceil(e[-2])

    def bin_key(self) -> exp.Expression:
        """Binned kind over integer values (``few_values``): the value clamped to a small
        integer range that keeps its bin, and ``hi + 1`` for NULL (see :meth:`bins_of_key`).

        Values below ``lo`` all lie in bin 0 and values above ``hi`` in the last bin, so
        clamping keeps every bin; the keys are small integers, exact in float64.
        """
        lo, hi = self._key_range()
        ifs = [
            exp.If(this=exp.Is(this=self.value(), expression=exp.Null()), true=number(hi + 1)),
            exp.If(this=exp.LT(this=self.value(), expression=number(lo)), true=number(lo)),
            exp.If(this=exp.GT(this=self.value(), expression=number(hi)), true=number(hi)),
        ]
        return exp.Case(ifs=ifs, default=exp.Cast(this=self.value(), to=sql_type("BIGINT")))

    def bins_of_key(self, keys: np.ndarray) -> np.ndarray:
        """The cells of :meth:`bin_key` values: bin ``i`` holds ``e_i <= v < e_(i+1)``,
        clamped, as :meth:`cell_index` maps them; ``hi + 1`` is the NULL cell."""
        _, hi = self._key_range()
        inner = np.asarray(self.decl.edges[1:-1], dtype=np.float64)
        cells = np.searchsorted(inner, keys.astype(np.float64), side="right")
        return np.where(keys == hi + 1, self.decl.null_cell, cells).astype(np.int64)

    def few_values(self) -> bool:
        """Whether the raw column takes few distinct values, so that counting rows per raw
        value first and mapping those values to cells afterwards is cheaper than mapping
        every row (see ``Cube._histogram``).

        True for integer, boolean and text columns whose in-domain values are at most
        ``2**16`` (values outside the domain are rare in practice and still counted
        exactly); never for floating-point or decimal columns, whose values are continuous.
        """
        kind, tc = self.decl.kind, self.tclass
        if tc in ("int", "bool"):
            if kind == "integer":
                return self.decl.n_cells <= _FEW_VALUES
            if kind == "binned":
                return self.decl.edges[-1] - self.decl.edges[0] <= _FEW_VALUES
            return True
        return tc == "other" and kind in ("categorical", "boolean")

    def slab_index(self, bps: Sequence[int]) -> exp.Expression:
        """The row's slab index for slabs starting at cells ``bps`` (CASE over ranges)."""
        n = self.decl.n_cells
        ends = list(bps[1:]) + [n]
        ifs = []
        for i, (a, b) in enumerate(zip(bps[:-1], ends[:-1], strict=False)):
            cond = self.ranges_condition([(a, b)])
            ifs.append(exp.If(this=cond if cond is not None else exp.true(), true=number(i)))
        return exp.Case(ifs=ifs, default=number(len(bps) - 1))


def leaf_count(e: exp.Expression) -> int:
    return sum(1 for _ in e.find_all(exp.Predicate))


def set_condition(cols: list[BoundColumn], bps: Sequence[Sequence[int]], mask: np.ndarray) -> exp.Expression:
    """Predicate selecting rows whose grid box is in ``mask`` (factorised axis by axis)."""
    if mask.ndim == 0:
        return exp.true() if bool(mask) else exp.false()
    if mask.all():
        return exp.true()
    if not mask.any():
        return exp.false()
    col = cols[0]
    n = col.decl.n_cells
    # As arrays (one shared array per long breakpoint tuple): a wide column has 500 002 slabs.
    bp = breakpoint_array(bps[0])

    def ends(slabs: np.ndarray) -> np.ndarray:  # where each of ``slabs`` ends (no copy of all the ends)
        return np.where(slabs + 1 < bp.size, bp[np.minimum(slabs + 1, bp.size - 1)], n)
    if mask.ndim == 1:  # runs of selected slabs, found in numpy (a 500 001-cell column is one pass)
        on = np.flatnonzero(mask)
        cut = np.flatnonzero(np.diff(on) > 1)
        firsts, lasts = on[np.r_[0, cut + 1]], on[np.r_[cut, on.size - 1]]
        here = col.ranges_condition(list(zip(bp[firsts].tolist(), ends(lasts).tolist(), strict=True)))
        return here if here is not None else exp.true()
    rows = mask.reshape(mask.shape[0], -1)
    keys = np.packbits(rows, axis=1)
    # The slabs of this axis by the pattern of the rest (in order of first appearance, each
    # group's slabs increasing), grouped in numpy: a wide first axis has 500 000 slabs.
    on = np.flatnonzero(rows.any(axis=1))
    patterns = np.ascontiguousarray(keys[on]).view(np.dtype((np.void, keys.shape[1]))).ravel()  # one value per row
    _, first, inverse = np.unique(patterns, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    by_group = np.argsort(inverse, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(inverse))))
    parts = []
    for g in np.argsort(first, kind="stable").tolist():
        slabs = on[by_group[bounds[g]:bounds[g + 1]]]
        # Runs of adjacent slabs are one range each.
        cut = np.flatnonzero(np.diff(slabs) > 1)
        firsts, lasts = slabs[np.r_[0, cut + 1]], slabs[np.r_[cut, slabs.size - 1]]
        ranges = list(zip(bp[firsts].tolist(), ends(lasts).tolist(), strict=True))
        here = col.ranges_condition(ranges)
        rest = set_condition(cols[1:], bps[1:], mask[int(slabs[0])])
        conj = [e for e in (here, rest) if e is not None and not (isinstance(e, exp.Boolean) and e.this is True)]
        parts.append(conjunction(conj))
    return disjunction(parts)


#: Largest number of distinct texts :meth:`BoundColumn.cells_of_text` maps in a Python loop.
_TEXT_LOOKUP_LOOP = 4096


def grouped_counts(
    ref: exp.Expression, cols: list[BoundColumn], keys: list[exp.Expression | None], where: exp.Expression | None,
    direct: Sequence[bool] | None = None,
) -> exp.Select:
    """``SELECT k0, …, n``: row counts by the key expressions ``keys[i]`` (each a function of
    column ``cols[i]``'s raw value), over rows meeting ``where``; several rows may carry the
    same keys (sum them).  ``None`` is the cell index of a :meth:`BoundColumn.looked_up`
    column, by a join.  ``direct[i]``: group by ``keys[i]`` itself, never in two steps.

    Keys on columns with few distinct raw values (``BoundColumn.few_values``) are
    computed in two steps: an inner query counts rows per raw value — the same work as
    the analyst's hand-written ``GROUP BY col`` — and the outer one maps those few
    values to cells and sums.  The cell of a row is a function of its raw value, so the
    counts are exactly those of mapping every row, at a fraction of the cost (a
    50-value categorical: ~1x a raw GROUP BY instead of ~4-20x).  The mapped rows are not
    aggregated again: values outside the declared domain share a cell, so their rows
    repeat its key.
    """
    # Builders with copy=False: the key expressions can be large (a binned column's
    # search tree) and are built for this statement only.
    count = exp.Count(this=exp.Star())
    pre = [i for i, c in enumerate(cols) if c.few_values() and not (direct and direct[i])]
    if any(k is None and i not in pre for i, k in enumerate(keys)):
        raise DPGateInternalError("a looked-up key needs a few-valued column")
    if not pre:
        sel = [k.as_(f"k{i}", copy=False) for i, k in enumerate(keys) if k is not None] + [count.as_("n", copy=False)]
        q = exp.select(*sel, copy=False).from_(ref.copy(), copy=False)
        if where is not None:
            q = q.where(where, copy=False)
        return q.group_by(*[exp.Literal.number(i + 1) for i in range(len(keys))], copy=False) if keys else q
    # Inner names: raw columns keep their physical names (the key expressions refer to them);
    # every other name avoids them, so no reference can resolve to the wrong column.
    taken = {c.name.lower() for c in cols}
    fresh = _fresh_names(taken, 4 * len(keys) + 1)
    raw = {cols[i].name.lower(): cols[i].raw() for i in pre}
    inner_sel: list[exp.Expression] = list(raw.values())
    outer_keys: list[exp.Expression] = []
    joins: list[tuple[exp.Expression, exp.Expression]] = []
    for i, k in enumerate(keys):
        if k is None:
            table, on, key = cols[i].lookup_join(*fresh[len(keys) + 1 + 3 * i: len(keys) + 4 + 3 * i])
            joins.append((table, on))
            outer_keys.append(key)
        elif i in pre:
            outer_keys.append(k)
        else:
            inner_sel.append(exp.Alias(this=k, alias=exp.to_identifier(fresh[i])))
            outer_keys.append(exp.Column(this=exp.to_identifier(fresh[i], quoted=True)))
    n_inner = fresh[len(keys)]  # fresh[:len(keys)]: inner keys; after it, the lookup tables
    inner = exp.select(*inner_sel, count.as_(n_inner, copy=False), copy=False).from_(ref.copy(), copy=False)
    if where is not None:
        inner = inner.where(where, copy=False)
    inner = inner.group_by(*[exp.Literal.number(j + 1) for j in range(len(inner_sel))], copy=False)
    # No outer GROUP BY: the caller sums rows of equal keys (``Cube._histogram``); a second
    # aggregation over the few raw values costs the engine more than that sum (benchmarks/README.md).
    sel = [k.as_(f"k{i}", copy=False) for i, k in enumerate(outer_keys)]
    sel.append(exp.column(n_inner, quoted=True).as_("n", copy=False))
    outer = exp.select(*sel, copy=False).from_(inner.subquery("cells", copy=False), copy=False)
    for table, on in joins:
        outer = outer.join(table, on=on, join_type="left", copy=False)
    return outer


def _fresh_names(taken: set[str], n: int) -> list[str]:
    """``n`` column names ``dpgate_0``, … that differ (case-insensitively) from ``taken``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"dpgate_{i}"
        if name not in taken:
            out.append(name)
        i += 1
    return out
