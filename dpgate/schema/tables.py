"""Public domains: what every column may hold (``Column``), and a table of columns (``Table``).

Why one module of over 500 lines: a column's kinds and a table's keys are one declaration format.

A column's four kinds share one declaration format, validated together; a schema of
tables is :mod:`dpgate.schema.domains`, and a schema from pandas frames
:mod:`dpgate.schema._from_frame`.

A schema is a *public* declaration.  dpgate never reads a domain (cells, group
keys, bin edges) from the private data unless the caller passes
``unsafe_infer_from_data=True``, which warns.

Every row maps to exactly one *cell* per column; the cells of a column are
numbered ``0 .. n_cells-1`` in this order:

=============  ==========================================  ==========================
kind           cells                                       values outside the domain
=============  ==========================================  ==========================
integer        ``min, min+1, …, max``, then NULL           floored, then clamped to
                                                           ``[min, max]``
binned         half-open bins ``[e0,e1), …, [ek-1,ek)``,    clamped to the first / last
               then NULL                                   bin
categorical    the declared values, then ``other``, NULL   go to ``other``
boolean        ``false, true``, then NULL                  any non-zero value is true
date,          the granules ``min … max`` (day, month,      truncated to the granule,
timestamp      year; also hour, minute), then NULL          then clamped (schema._temporal)
=============  ==========================================  ==========================

NULL rows are never dropped: they land in the NULL cell, which ``COUNT(*)``
counts, ``COUNT(col)`` and ``SUM(col)`` skip, and ``col IS NULL`` selects.  The
``other`` cell holds out-of-domain categorical values; it equals no declared
value and matches no ``LIKE`` pattern.  A table is the product of its columns'
cells; the cube counts rows per cell.

Group keys are the *declared* keys (:meth:`Column.group_cells`): ``GROUP BY col``
emits the NULL group only when the column declares ``nullable: true``, and a
categorical's ``<other>`` group only when it declares ``other: true``.  The cells
exist either way: a row with an undeclared value or NULL in a column not so
declared is still counted by every ungrouped aggregate and predicate that matches
it (``COUNT(*)``, ``col IS NULL``, ``sex <> '1'``), and by ``GROUP BY`` on *other*
columns; it only falls in no group of ``GROUP BY col``.

The format, as YAML or the same structure as a dict::

    tables:
      pums:
        privacy_unit: pid              # optional: the column identifying a person
        max_rows_per_unit: 1           # with privacy_unit: rows kept per person (see README)
        rows: 1000                     # optional public row count
        columns:
          age:     {type: integer, min: 0, max: 100}
          income:  {type: integer, min: 0, max: 500000,
                    bins: [0, 10000, 25000, 50000, 100000, 500001]}
          sex:     {type: categorical, values: ["0", "1"], other: true}
          married: {type: boolean, nullable: true}

``nullable: true`` (any column) and ``other: true`` (categoricals) declare that
NULL / undeclared values may occur, so ``GROUP BY`` emits their groups.  A table
may declare ``schema: PUMS`` so that SQL may address it as ``PUMS.pums`` (the
name ``main`` is always accepted).  ``type: numeric`` (or ``float``) columns must declare ``bins``.
"""

from __future__ import annotations

import math
import reprlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from dpgate._validate import finite
from dpgate.errors import DPGateInternalError, SchemaError
from dpgate.schema import _temporal
from dpgate.schema._references import reference_keys
from dpgate.schema._unit import check_unit

__all__ = ["Column", "Table", "NULL_LABEL", "OTHER_LABEL", "MAX_COLUMN_CELLS", "MAX_DECLARED_VALUES"]

ColumnKind = Literal["integer", "binned", "categorical", "boolean", "date", "timestamp"]

#: Label of the NULL cell in group keys and cell listings.
NULL_LABEL = None
#: Label of the out-of-domain cell of a categorical column.
OTHER_LABEL = "<other>"

#: Largest number of cells one column may declare (keeps cell indices in int64
#: arithmetic and group-by outputs sane).
MAX_COLUMN_CELLS = 10_000_000
#: Most values one categorical column may declare, and most bin edges of a binned one
#: (a declaration is written by hand or generated from a code list; a YAML alias bomb is not).
MAX_DECLARED_VALUES = 100_000
#: Longest rendering of a declared value echoed in an error message.
_ECHO_CHARS = 200
_ECHO = reprlib.Repr()
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxtuple, _ECHO.maxdict, _ECHO.maxstring, _ECHO.maxother = 2, 10, 10, 5, 60, 60


@dataclass(frozen=True)
class Column:
    """One column's public domain.

    Attributes:
        name: column name as it appears in SQL (case preserved).
        kind: ``"integer"``, ``"binned"``, ``"categorical"``, ``"boolean"``, ``"date"`` or ``"timestamp"``
            (``min``/``max``: granule ordinals of ``granularity``, :mod:`dpgate.schema._temporal`).
        min, max: inclusive integer range (integer kind; binned kind when declared).
        edges: bin edges ``e0 < e1 < … < ek`` of half-open bins ``[e_i, e_{i+1})`` (binned kind).
        values: declared category values, as strings (categorical kind).
        nullable: the column may hold NULL: ``GROUP BY`` emits a NULL group (declared key ``None``).
        other: a categorical may hold undeclared values: ``GROUP BY`` emits an ``"<other>"`` group.
    """

    name: str
    kind: ColumnKind
    min: int | None = None
    max: int | None = None
    edges: tuple[float, ...] = ()
    values: tuple[str, ...] = ()
    nullable: bool = False
    other: bool = False
    granularity: str | None = None  # date / timestamp kinds: min, max are granule ordinals (schema._temporal)

    def __post_init__(self) -> None:
        where = f"column {_brief(self.name)}"
        for key in ("nullable", "other"):
            if not isinstance(getattr(self, key), bool):
                raise SchemaError(f"{where}: {key!r} must be true or false, got {_brief(getattr(self, key))}.")
        if self.other and self.kind != "categorical":
            raise SchemaError(
                f"{where}: 'other: true' applies to categorical columns only (values outside an integer range "
                "are clamped, outside bins go to the first / last bin, and booleans have no other values)."
            )
        for key, bound in (("min", self.min), ("max", self.max)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
                raise SchemaError(f"{where}: {key!r} must be an integer, got {_brief(bound)}.")
        if self.kind in _temporal.TEMPORAL_KINDS:
            if self.granularity not in _temporal.GROUPING_UNITS or self.min is None or self.max is None:
                raise SchemaError(f"{where}: a {self.kind} column needs min, max and a granularity.")
        elif self.kind == "integer":
            if self.min is None or self.max is None:
                raise SchemaError(f"{where}: an integer column needs both 'min' and 'max'.")
            if self.max < self.min:
                raise SchemaError(f"{where}: max ({self.max}) is below min ({self.min}).")
            if self.max - self.min + 2 > MAX_COLUMN_CELLS:
                raise SchemaError(
                    f"{where}: range {self.min}..{self.max} has more than {MAX_COLUMN_CELLS} cells; "
                    "declare 'bins' to coarsen it."
                )
        elif self.kind == "binned":
            if len(self.edges) > MAX_DECLARED_VALUES:
                raise SchemaError(
                    f"{where}: {len(self.edges)} bin edges, more than the limit of {MAX_DECLARED_VALUES}."
                )
            if len(self.edges) < 2:
                raise SchemaError(f"{where}: 'bins' needs at least two edges, got {list(self.edges)}.")
            if not all(math.isfinite(e) for e in self.edges):
                raise SchemaError(f"{where}: bin edges must be finite numbers, got {list(self.edges)}.")
            if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
                raise SchemaError(f"{where}: bin edges must increase strictly, got {list(self.edges)}.")
        elif self.kind == "categorical":
            if not self.values:
                raise SchemaError(f"{where}: a categorical column needs a non-empty 'values' list.")
            if len(self.values) > MAX_DECLARED_VALUES:
                raise SchemaError(
                    f"{where}: {len(self.values)} declared values, more than the limit of {MAX_DECLARED_VALUES}; "
                    "declare the frequent values and let the rest fall into the other cell."
                )
            bad = next((v for v in self.values if not isinstance(v, str) or not _encodable(v)), None)
            if bad is not None:
                raise SchemaError(f"{where}: every declared value must be a valid Unicode string, got {_brief(bad)}.")
            if OTHER_LABEL in self.values:
                raise SchemaError(
                    f"{where}: the declared value {OTHER_LABEL!r} is the label of the cell of undeclared values; "
                    "a declared category with that name would be indistinguishable from it — rename it."
                )
            if len(set(self.values)) != len(self.values):
                dup = sorted({v for v, n in Counter(self.values).items() if n > 1})
                raise SchemaError(f"{where}: 'values' has duplicates: {_brief(dup)}.")
        elif self.kind != "boolean":
            raise SchemaError(
                f"{where}: unknown type {self.kind!r}; use integer, numeric (with bins), categorical, boolean, date or "
                "timestamp."
            )

    def int_range(self) -> tuple[int, int]:
        """``(min, max)`` of an integer column; ``__post_init__`` guarantees both are set."""
        if self.min is None or self.max is None:
            raise DPGateInternalError(f"column {self.name!r} of kind {self.kind!r} has no integer range")
        return self.min, self.max

    # -- cells -------------------------------------------------------------
    @property
    def n_cells(self) -> int:
        """Number of cells, including the NULL cell (and ``other`` for categoricals)."""
        if self.kind in ("integer", *_temporal.TEMPORAL_KINDS):
            lo, hi = self.int_range()
            return hi - lo + 2
        if self.kind == "binned":
            return len(self.edges)  # k bins + NULL
        if self.kind == "categorical":
            return len(self.values) + 2
        return 3

    @property
    def null_cell(self) -> int:
        """Index of the NULL cell (always the last)."""
        return self.n_cells - 1

    @property
    def other_cell(self) -> int | None:
        """Index of the out-of-domain cell of a categorical column, else ``None``."""
        return len(self.values) if self.kind == "categorical" else None

    @property
    def ordered(self) -> bool:
        """Whether ``<``, ``BETWEEN`` and ranges make sense on this column."""
        return self.kind in ("integer", "binned", *_temporal.TEMPORAL_KINDS)

    def labels(self) -> list[Any]:
        """Public label of every cell, in cell order (used as GROUP BY keys)."""
        if self.kind == "integer":
            lo, hi = self.int_range()
            return [*range(lo, hi + 1), NULL_LABEL]
        if self.kind in _temporal.TEMPORAL_KINDS:  # a granule's first instant: a date, or a datetime
            lo, hi = self.int_range()
            starts = [_temporal.granule_start(k, self.granularity or "") for k in range(lo, hi + 1)]
            return [*(s.date() if self.kind == "date" else s for s in starts), NULL_LABEL]
        if self.kind == "binned":
            return [*(f"[{_num(a)}, {_num(b)})" for a, b in zip(self.edges, self.edges[1:], strict=False)), NULL_LABEL]
        if self.kind == "categorical":
            return [*self.values, OTHER_LABEL, NULL_LABEL]
        return [False, True, NULL_LABEL]

    def group_cells(self) -> list[int]:
        """The cells ``GROUP BY`` emits as groups, in declared order: the declared values
        (integers, bins, categories, ``false``/``true``), then ``other`` when declared
        ``other: true``, then NULL when declared ``nullable: true``."""
        declared = self.null_cell - (1 if self.kind == "categorical" else 0)
        cells = list(range(declared))
        if self.other:
            cells.append(declared)
        if self.nullable:
            cells.append(self.null_cell)
        return cells

    def declared_cells(self) -> np.ndarray:
        """Boolean mask over the cells: True on the cells a declared value (or a declared
        NULL / ``other``) maps to, i.e. on :meth:`group_cells`."""
        mask = np.zeros(self.n_cells, dtype=bool)
        mask[self.group_cells()] = True
        return mask

    def cell_values(self) -> np.ndarray | None:
        """Numeric value of each cell (NaN for NULL), or ``None`` when cells carry no single number.

        Integer cells carry their integer, boolean cells 0/1.  Bins and categories
        carry no single number, so ``SUM(col)`` over them is refused.
        """
        if self.kind == "integer":
            lo, hi = self.int_range()
            return np.append(np.arange(lo, hi + 1).astype(np.float64), np.nan)
        if self.kind == "boolean":
            return np.array([0.0, 1.0, np.nan])
        return None

    def to_dict(self) -> dict[str, Any]:
        """The declaration in the schema file format."""
        out: dict[str, Any]
        if self.kind == "integer":
            out = {"type": "integer", "min": self.min, "max": self.max}
        elif self.kind == "binned":
            out = {"type": "numeric", "bins": list(self.edges)}
            if self.min is not None:
                out.update(type="integer", min=self.min, max=self.max)
        elif self.kind == "categorical":
            out = {"type": "categorical", "values": list(self.values)}
        elif self.kind in _temporal.TEMPORAL_KINDS:
            lo, hi = self.int_range()
            gran = self.granularity or ""
            out = {"type": self.kind, "granularity": gran, "min": _temporal.iso(_temporal.granule_start(lo, gran), self.kind),
                   "max": _temporal.iso(_temporal.granule_start(hi, gran), self.kind)}
        else:
            out = {"type": "boolean"}
        # Only when set, so that a schema declaring neither keeps its fingerprint (and its ledgers).
        if self.nullable:
            out["nullable"] = True
        if self.other:
            out["other"] = True
        return out

    @classmethod
    def from_dict(cls, name: str, spec: Mapping[str, Any], table: str = "?") -> Column:
        """Build a column from its declaration (see the module docstring)."""
        where = f"table {table!r}, column {name!r}"
        if not isinstance(spec, Mapping):
            raise SchemaError(
                f"{where}: expected a mapping like {{type: integer, min: 0, max: 100}}, got {_brief(spec)}."
            )
        known = {"type", "min", "max", "bins", "values", "nullable", "other", "description", "granularity"}
        unknown = set(spec) - known
        if unknown:
            raise SchemaError(f"{where}: unknown keys {sorted(unknown)}; allowed keys are {sorted(known)}.")
        kind = str(spec.get("type", "")).lower()
        if "granularity" in spec and kind not in _temporal.TEMPORAL_KINDS:
            raise SchemaError(f"{where}: 'granularity' applies to date and timestamp columns only.")
        flags = {k: spec[k] for k in ("nullable", "other") if k in spec}
        try:
            return replace(cls._from_spec(name, spec, kind, where), **flags)
        except SchemaError as exc:
            if str(exc).startswith(where):
                raise
            raise SchemaError(f"table {table!r}, {exc}") from None

    @classmethod
    def _from_spec(cls, name: str, spec: Mapping[str, Any], kind: str, where: str) -> Column:
        """The column of a declaration without its ``nullable`` / ``other`` flags."""
        if kind in ("integer", "int", "bigint"):
            lo, hi = spec.get("min"), spec.get("max")
            if lo is None or hi is None:
                raise SchemaError(f"{where}: an integer column needs both 'min' and 'max'.")
            lo_i, hi_i = _as_int(lo, where, "min"), _as_int(hi, where, "max")
            if "bins" in spec:
                edges = _edges(spec["bins"], where)
                return cls(name, "binned", min=lo_i, max=hi_i, edges=edges)
            return cls(name, "integer", min=lo_i, max=hi_i)
        if kind in ("numeric", "float", "double", "decimal", "real"):
            if "bins" not in spec:
                raise SchemaError(f"{where}: a numeric column needs 'bins' (half-open bin edges).")
            return cls(name, "binned", edges=_edges(spec["bins"], where))
        if kind in ("categorical", "category", "string", "varchar", "text"):
            values = spec.get("values")
            if not isinstance(values, (list, tuple)) or not values:
                raise SchemaError(f"{where}: a categorical column needs a non-empty 'values' list.")
            if len(values) > MAX_DECLARED_VALUES:
                raise SchemaError(
                    f"{where}: {len(values)} declared values, more than the limit of {MAX_DECLARED_VALUES}."
                )
            nested = next((v for v in values if isinstance(v, (list, tuple, dict, set))), None)
            if nested is not None:
                raise SchemaError(
                    f"{where}: 'values' must list scalar values (strings or numbers), got a "
                    f"{type(nested).__name__}: {_brief(nested)}."
                )
            return cls(name, "categorical", values=tuple(str(v) for v in values))
        if kind in ("boolean", "bool"):
            return cls(name, "boolean")
        if kind in _temporal.TEMPORAL_KINDS:
            lo_t, hi_t, gran = _temporal.declared_range(spec, kind, where, MAX_COLUMN_CELLS)
            return cls(name, "date" if kind == "date" else "timestamp", min=lo_t, max=hi_t, granularity=gran)
        raise SchemaError(
            f"{where}: unknown type {spec.get('type')!r}; use integer, numeric (with bins), categorical, boolean, "
            "date or timestamp."
        )


@dataclass(frozen=True)
class Table:
    """A declared table: its columns in declaration order, and its public facts.

    Attributes:
        name: table name as used in SQL.
        columns: the columns, in declaration order (this order is the cube's axis order).
        rows: optional public row count.
        max_rows_per_unit: ``k``, how many rows one person may contribute; every charge is
            multiplied by it (see README, "Privacy model").  With a ``privacy_unit`` the bound is
            enforced (rows beyond ``k`` per unit are dropped, :mod:`dpgate.release._bounding`);
            without one it is the deprecated, unchecked ``max_rows_per_individual``.  ``None``:
            a unit declared without its bound; every query on the table is refused (:meth:`bound`).
        schema: an SQL schema name the table may be addressed with (``FROM schema.name``), as
            declared by ``schema: PUMS``; ``main`` is always accepted.
        privacy_unit: the physical column identifying a person (``privacy_unit: user_id``), or
            ``None`` for a row-level table (one row per person).  It is never among ``columns``
            (a declaration file listing it there has it removed, :mod:`dpgate.schema._unit`): it is
            never grouped on, filtered on or returned, only used to bound contributions.
        references, public, key: declared join paths (``(column, "table.column")`` pairs), a public
            dimension, the column identifying its rows (:mod:`dpgate.schema._references`).
    """

    name: str
    columns: tuple[Column, ...]
    rows: int | None = None
    max_rows_per_unit: int | None = 1
    schema: str | None = None
    privacy_unit: str | None = None
    references: tuple[tuple[str, str], ...] = ()
    public: bool = False
    key: str | None = None

    def __post_init__(self) -> None:
        if not self.columns:
            raise SchemaError(f"table {self.name!r}: declares no columns.")
        names = [c.name.lower() for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"table {self.name!r}: columns declared twice (names are case-insensitive): {dup}.")
        check_unit(self.name, self.privacy_unit, self.max_rows_per_unit, [c.name for c in self.columns])
        if self.rows is not None and (isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0):
            raise SchemaError(f"table {self.name!r}: rows must be a non-negative integer, got {_brief(self.rows)}.")
        if self.schema is not None and (not isinstance(self.schema, str) or not self.schema.strip()):
            raise SchemaError(
                f"table {self.name!r}: schema must be a non-empty name such as PUMS, got {_brief(self.schema)}."
            )

    def addressable_as(self, qualifier: str) -> bool:
        """Whether ``FROM qualifier.<table>`` names it: ``main``, ``public`` (serve's catalogue) or its schema."""
        q = qualifier.lower()
        return q in ("main", "public") or (self.schema is not None and q == self.schema.lower())

    def column(self, name: str) -> Column:
        """The column called ``name`` (case-insensitive); SchemaError names the declared ones."""
        for c in self.columns:
            if c.name.lower() == name.lower():
                return c
        raise SchemaError(
            f"column {name!r} is not declared in table {self.name!r}; declared columns: "
            f"{[c.name for c in self.columns]}."
        )

    def has_column(self, name: str) -> bool:
        """Whether ``name`` (case-insensitive) is declared."""
        return any(c.name.lower() == name.lower() for c in self.columns)

    def axis(self, name: str) -> int:
        """Position of column ``name`` in the declaration order."""
        return [c.name.lower() for c in self.columns].index(self.column(name).name.lower())

    @property
    def n_cells(self) -> int:
        """Size of the full product domain (cells of all columns multiplied)."""
        return math.prod(c.n_cells for c in self.columns)

    @property
    def max_rows_per_individual(self) -> int:
        """``k``, the factor of every charge (:meth:`bound`)."""
        return self.bound()

    def bound(self) -> int:
        """``k``, the factor of every charge: :attr:`max_rows_per_unit` (enforced with a
        ``privacy_unit``, the deprecated unchecked declaration without one).

        Raises:
            SchemaError: the table declares a privacy unit but no bound (before anything is read).
        """
        if self.max_rows_per_unit is None:
            raise SchemaError(
                f"table {self.name!r} declares privacy_unit {self.privacy_unit!r} but no max_rows_per_unit, so "
                "it cannot be queried; declare how many rows of one person may count, e.g. 'max_rows_per_unit: 5' "
                "(rows beyond it are dropped; see the README, \"Privacy units\")."
            )
        return self.max_rows_per_unit

    def to_dict(self) -> dict[str, Any]:
        """The declaration in the schema file format."""
        out: dict[str, Any] = {"columns": {c.name: c.to_dict() for c in self.columns}}
        if self.rows is not None:
            out["rows"] = self.rows
        if self.privacy_unit is not None:
            out["privacy_unit"] = self.privacy_unit
            if self.max_rows_per_unit is not None:
                out["max_rows_per_unit"] = self.max_rows_per_unit
        elif self.max_rows_per_unit != 1:  # the deprecated unchecked bound, written as it was (same fingerprint)
            out["max_rows_per_individual"] = self.max_rows_per_unit
        if self.schema is not None:
            out["schema"] = self.schema
        return out | reference_keys(self)


def _brief(v: Any) -> str:
    """A bounded ``repr(v)`` (:data:`_ECHO_CHARS` characters at most, nesting and lists cut
    short), so a huge or self-referencing declaration cannot flood an error message."""
    text = _ECHO.repr(v)
    return text if len(text) <= _ECHO_CHARS else text[: _ECHO_CHARS - 1] + "…"


def _encodable(text: str) -> bool:
    """Whether ``text`` has no lone surrogate (it must be stored as UTF-8 in the ledger)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _as_int(v: Any, where: str, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
        raise SchemaError(f"{where}: {key!r} must be an integer, got {_brief(v)}.")
    return int(v)


def _edges(v: Any, where: str) -> tuple[float, ...]:
    if not isinstance(v, (list, tuple)) or len(v) < 2:
        raise SchemaError(f"{where}: 'bins' must be a list of at least two increasing edges, got {_brief(v)}.")
    if len(v) > MAX_DECLARED_VALUES:
        raise SchemaError(f"{where}: {len(v)} bin edges, more than the limit of {MAX_DECLARED_VALUES}.")
    nested = next((e for e in v if isinstance(e, (list, tuple, dict, set))), None)
    if nested is not None:
        raise SchemaError(f"{where}: every bin edge must be a number, got {_brief(nested)}.")
    out = [finite(e, f"{where}: every bin edge", error=SchemaError) for e in v]
    if any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise SchemaError(f"{where}: bin edges must increase strictly, got {_brief(v)}.")
    return tuple(out)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)
