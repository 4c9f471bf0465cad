"""``LinearQuery``: a counting query as a weight function over a table's cells.

A linear query is ``θ = Σ_cells w(cell) · count(cell) + offset``.  The weight
function is stored on a product *grid*: for each column it depends on, the cell
indices where a new slab starts (the first is 0, slabs are half-open and run to
the column's ``n_cells``), and a dense array of weights, one per grid box.
Weights are exact rationals ``numerators / denominator`` so that true answers
are exact integers after scaling (the noise lattice relies on that).

The representation is canonical: columns on which ``w`` is constant are
dropped, adjacent slabs with identical weight slices are merged, and the
fraction is reduced.  Two SQL texts that denote the same weight function and
offset therefore compile to equal ``LinearQuery`` objects with equal hashes,
which is what lets the gateway find them in history.  Labels (output name, group
key) are metadata and not part of equality.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

import numpy as np

from dpgate.compile._runs import decode_numerators, decode_runs, encode_runs, numerator_runs, runs_or
from dpgate.compile._wide import HashOnceTuple, more_distinct_than, numerators_digest, unit_breakpoints
from dpgate.compile.bounds import reserve_memory
from dpgate.errors import DPGateInternalError, UnsupportedQuery
from dpgate.schema.domains import Table

__all__ = ["LinearQuery", "MAX_DENOMINATOR", "MAX_GRID_BOXES", "breakpoint_array", "decode_runs", "encode_runs",
           "expand_grid", "slab_starts", "union_grid"]

#: Cached properties of a :class:`LinearQuery` that depend only on its grid and weights.
_WEIGHT_PROPERTIES = ("sensitivity", "weight_sign", "is_zero", "pattern", "_more_weights_than", "_digest")

#: Largest denominator of a weight (SQL constants of six decimals): true answers must be exact integers.
MAX_DENOMINATOR = 10**6
#: Largest grid one query may use (boxes); beyond it the query is refused.
MAX_GRID_BOXES = 2**23


@dataclass(frozen=True, eq=False)
class LinearQuery:
    """An immutable linear counting query over one declared table.

    Attributes:
        table: declared table name.
        columns: the columns the weight depends on, in the table's declaration order.
        breakpoints: per column, the cell indices where a slab starts (first is 0).
        numerators: read-only int64 array of shape ``(len(bp) for bp in breakpoints)``.
        denominator: positive integer; weights are ``numerators / denominator``.
        offset: exact constant added to the weighted count (does not affect sensitivity).
        label: output column name (metadata, not part of equality).
        group: GROUP BY key as ``((column, label), …)`` (metadata, not part of equality).

    Build instances with :meth:`from_grid`, which canonicalises.
    """

    table: str
    columns: tuple[str, ...]
    breakpoints: tuple[tuple[int, ...], ...]
    numerators: np.ndarray
    denominator: int = 1
    offset: Fraction = Fraction(0)
    label: str = field(default="", compare=False)
    group: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.breakpoints) or self.numerators.ndim != len(self.columns):
            raise DPGateInternalError("LinearQuery grid and weights disagree in dimension")
        if self.numerators.shape != tuple(len(b) for b in self.breakpoints):
            raise DPGateInternalError("LinearQuery weights do not match its breakpoints")
        if self.numerators.flags.writeable:
            arr = np.array(self.numerators, dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, "numerators", arr)

    # -- construction --------------------------------------------------------
    @classmethod
    def from_grid(
        cls,
        table: Table,
        columns: Sequence[str],
        breakpoints: Sequence[Sequence[int]],
        weights: np.ndarray,
        offset: Fraction | int | float = 0,
        *,
        label: str = "",
        group: tuple[tuple[str, Any], ...] = (),
    ) -> LinearQuery:
        """Canonicalise a weight function given on a product grid.

        Args:
            table: the declared table.
            columns: column names (any order; reordered to declaration order).
            breakpoints: per column, increasing slab starts beginning at 0.
            weights: float array, one weight per grid box.
            offset: constant term.

        Raises:
            UnsupportedQuery: a weight is not finite or not a rational with a
                denominator ≤ ``MAX_DENOMINATOR``.
        """
        w = np.asarray(weights)
        if w.size > 4096:  # a large grid counts against the statement's memory budget (the weights and integers)
            reserve_memory(16 * w.size, "a query's weights", transient=True)
        if w.dtype.kind not in "iu":  # integer weights (exact numerators) are finite and need no rationalising
            w = np.asarray(w, dtype=float)
        if w.dtype.kind == "f" and not np.isfinite(w).all():
            raise UnsupportedQuery(
                "the query's weights are not finite (e.g. division by zero or an overflow in SUM's "
                "expression); make every row's contribution a finite number."
            )
        # Declaration order; a name lookup per call is cheaper than Table.axis's list scans.
        position = {c.name.lower(): i for i, c in enumerate(table.columns)}
        axes = [position[c.lower()] if c.lower() in position else table.axis(c) for c in columns]
        order = sorted(range(len(axes)), key=axes.__getitem__)
        cols = [table.columns[axes[i]].name for i in order]
        bps = [int_tuple(breakpoints[i]) for i in order]
        w = np.transpose(w, order) if w.ndim else w
        num, den = rationalise(w)
        # Merge adjacent slabs with identical slices, then drop constant axes.
        nd = num.ndim
        for ax in range(nd):
            n = num.shape[ax]
            if n > 1:
                head = (slice(None),) * ax
                changed = num[head + (slice(1, None),)] != num[head + (slice(None, -1),)]
                if nd > 1:
                    changed = changed.any(axis=tuple(a for a in range(nd) if a != ax))
                if not changed.all():
                    idx = [0, *(np.flatnonzero(changed) + 1).tolist()]
                    num = num.take(idx, axis=ax)
                    bps[ax] = tuple(bps[ax][i] for i in idx)
                    continue
            if len(bps[ax]) != n:  # nothing merged: keep one breakpoint per slab
                bps[ax] = tuple(bps[ax][i] for i in range(n))
        squeeze = tuple(ax for ax in range(nd) if num.shape[ax] == 1)
        if squeeze:
            num = num.reshape([s for ax, s in enumerate(num.shape) if ax not in squeeze])
        keep_cols = [c for ax, c in enumerate(cols) if ax not in squeeze]
        keep_bps = [b for ax, b in enumerate(bps) if ax not in squeeze]
        # ``num`` is a fresh int64 array of ours: freeze it here so __post_init__ need not copy it.
        if not num.flags.c_contiguous:
            num = num.copy()
        num.setflags(write=False)
        off = as_fraction(offset)
        return cls(
            table.name, tuple(keep_cols), tuple(keep_bps), num, den, off, label=label, group=group
        )

    # -- canonical identity ----------------------------------------------------
    @functools.cached_property
    def key(self) -> tuple[Any, ...]:
        """Hashable canonical form: equal keys mean equal weight functions and offsets, computed
        once per query; the numerators' SHA-256, not a copy of their bytes (12 MB for a wide query)."""
        return (
            self.table.lower(),
            tuple(c.lower() for c in self.columns),
            self.breakpoints,
            self.numerators.shape,
            numerators_digest(self, self.numerators),
            self.denominator,
            self.offset,
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (ledger checkpoints) without the cached properties: they are derived."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinearQuery) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        """The key's hash, once per query (a statement's planning looks its queries up often)."""
        return hash(self.key)

    # -- numbers ---------------------------------------------------------------
    @property
    def weights(self) -> np.ndarray:
        """Float weights, one per grid box."""
        return self.numerators / self.denominator

    @functools.cached_property
    def sensitivity(self) -> float:
        """``S = max |w|``: how much one row can change the answer (before
        ``max_rows_per_individual`` scaling).  Computed once per query."""
        return float(np.max(np.abs(self.numerators), initial=0)) / self.denominator

    @functools.cached_property
    def linear_part(self) -> LinearQuery:
        """This query with offset 0 and no label or group (what a release measures), sharing
        the properties already computed from the weights.  Computed once per query."""
        if self.offset == 0 and not self.label and not self.group:
            return self
        out = object.__new__(LinearQuery)  # this query's fields, already checked: no __post_init__
        out.__dict__.update({f.name: getattr(self, f.name) for f in fields(self)},
                            offset=Fraction(0), label="", group=())
        out.__dict__.update((name, self.__dict__[name]) for name in _WEIGHT_PROPERTIES if name in self.__dict__)
        return out

    @functools.cached_property
    def weight_sign(self) -> int:
        """``1`` when every weight is ≥ 0 (the answer is at least the offset), ``-1`` when every
        weight is ≤ 0 and one is negative (at most the offset), else ``0``.  Computed once per
        query (every :class:`~dpgate.answer.result.Answer` of it reads it)."""
        w = self.numerators
        if not w.size:
            return 0
        # Small grids (most queries) are faster in Python than through numpy's reductions.
        lo, hi = (min(flat := w.ravel().tolist()), max(flat)) if w.size <= 64 else (w.min(), w.max())
        return 1 if lo >= 0 else -1 if hi <= 0 else 0

    @functools.cached_property
    def is_zero(self) -> bool:
        """True when every weight is zero (the answer is the public offset)."""
        return not np.any(self.numerators)

    def has_more_weights_than(self, limit: int) -> bool:
        """Whether the query has more than ``limit`` distinct weights (zero included), decided on a
        sample first (:func:`~dpgate.compile._wide.more_distinct_than`).  Memoised per ``limit``."""
        memo = self.__dict__.setdefault("_more_weights_than", {})
        found = memo.get(limit)
        if found is None:
            found = memo[limit] = more_distinct_than(self.numerators, limit)
        return found

    @functools.cached_property
    def pattern(self) -> tuple[object, ...]:
        """The query's grid and weight pattern (weights by SHA-256 digest, independent of the
        denominator): what an atom refinement by it depends on.  Computed once per query.
        Its breakpoints hash once (a :class:`HashOnceTuple`, equal to the plain tuple): planning
        looks the pattern up in several dictionaries, and a wide column has 500 000 breakpoints."""
        digest = numerators_digest(self, self.numerators)
        return (tuple(c.lower() for c in self.columns), HashOnceTuple(self.breakpoints), digest)

    def expand(self, table: Table, columns: Sequence[str], breakpoints: Sequence[Sequence[int]]) -> np.ndarray:
        """Numerators on a finer grid (which must refine this query's grid).

        ``columns`` must be in declaration order and include this query's columns.
        Returns an int64 array of shape ``(len(bp) for bp in breakpoints)``.
        """
        return expand_grid(self.numerators, self.columns, self.breakpoints, columns, breakpoints)

    def dense(self, table: Table) -> np.ndarray:
        """Weights over the table's full product domain (tests and small domains only)."""
        cols = [c.name for c in table.columns]
        bps = [tuple(range(c.n_cells)) for c in table.columns]
        if table.n_cells > MAX_GRID_BOXES:
            raise UnsupportedQuery(f"table {table.name!r} has {table.n_cells} cells; too many for a dense vector.")
        return self.expand(table, cols, bps) / self.denominator

    # -- serialisation ---------------------------------------------------------
    def to_json(self) -> str:
        """Canonical JSON (what the ledger stores)."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        """:meth:`to_json`, computed once per query (a pure function of the frozen fields)."""
        return json.dumps(
            {
                "table": self.table,
                "columns": list(self.columns),
                "breakpoints": [runs_or(breakpoint_array(b), list(b)) for b in self.breakpoints],
                "numerators": numerator_runs(self.numerators),
                "denominator": self.denominator,
                "offset": str(self.offset),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, *, label: str = "", group: tuple[tuple[str, Any], ...] = ()) -> LinearQuery:
        """Inverse of :meth:`to_json`; also reads the plain lists that ledgers written before the
        run encoding (:func:`encode_runs`) hold."""
        d = json.loads(text)
        bps = tuple(int_tuple(decode_runs(b)) for b in d["breakpoints"])
        return cls(
            d["table"],
            tuple(d["columns"]),
            bps,
            decode_numerators(d["numerators"], [len(b) for b in bps]),
            int(d["denominator"]),
            Fraction(d["offset"]),
            label=label,
            group=group,
        )

    def __repr__(self) -> str:
        grid = ", ".join(f"{c}:{len(b)} slabs" for c, b in zip(self.columns, self.breakpoints, strict=True)) or "constant"
        extra = f" + {self.offset}" if self.offset else ""
        lab = f" {self.label!r}" if self.label else ""
        grp = f" group={dict(self.group)}" if self.group else ""
        return f"<LinearQuery{lab} on {self.table} [{grid}] S={self.sensitivity:g}{extra}{grp}>"


def int_tuple(bp: Sequence[int] | np.ndarray) -> tuple[int, ...]:
    """Breakpoints as a tuple of Python ints (``tolist`` is the fast path for integer arrays, and for
    sequences of integers: a wide column has hundreds of thousands of breakpoints).  Unit slabs
    ``0, 1, …, n − 1`` (a wide column's usual grid) are one shared tuple per ``n``."""
    if isinstance(bp, tuple) and len(bp) > 32 and bp is unit_breakpoints(len(bp)):
        return bp
    arr = bp if isinstance(bp, np.ndarray) else np.asarray(bp)
    if arr.dtype.kind in "iu":
        if arr.ndim == 1 and arr.size > 32 and arr[0] == 0 and arr[-1] == arr.size - 1 \
                and bool((np.diff(arr) == 1).all()):
            return unit_breakpoints(int(arr.size))
        return tuple(arr.tolist())
    return tuple(int(b) for b in bp)


def as_fraction(x: Fraction | int | float) -> Fraction:
    if isinstance(x, Fraction):
        return x
    if isinstance(x, int):
        return Fraction(x)
    if not math.isfinite(x):
        raise UnsupportedQuery(f"the query's constant term {x!r} is not finite.")
    return Fraction(x).limit_denominator(MAX_DENOMINATOR)


def rationalise(w: np.ndarray) -> tuple[np.ndarray, int]:
    """Exact integer numerators and a common denominator for float weights.

    Weights come from SQL decimal constants, so each is close to a rational with a
    small denominator; we recover it and refuse weights that are not.
    """
    if w.dtype.kind in "iu":  # exact integers (from_grid's callers on numerators)
        if w.size and np.abs(w).max() >= 2**62:
            raise UnsupportedQuery("the query's weights are too large; scale the expression down.")
        return w.astype(np.int64, order="C"), 1
    # Fast path for integer weights (counts): the general path below would find
    # denominator 1 and the same numerators, after a costly np.unique.
    if np.abs(w).max(initial=0.0) < 2**62:
        num = w.astype(np.int64, order="C")
        if (num == w).all():
            return num, 1
    uniq, inverse = np.unique(w, return_inverse=True)
    fast = _rationalise_fast(uniq)
    if fast is not None:
        nums_arr, den = fast
        num = nums_arr[inverse].reshape(w.shape)
        g = math.gcd(den, int(np.gcd.reduce(np.abs(nums_arr)))) if nums_arr.size else den
        if g > 1:
            num //= g
            den //= g
        return num, den
    fracs = []
    for v in uniq.tolist():
        f = Fraction(v).limit_denominator(MAX_DENOMINATOR)
        if abs(float(f) - v) > 1e-9 * max(1.0, abs(v)):
            raise UnsupportedQuery(
                f"weight {v!r} is not a rational with denominator ≤ {MAX_DENOMINATOR}; "
                "use constants with at most six decimals."
            )
        fracs.append(f)
    den = math.lcm(*(f.denominator for f in fracs)) if fracs else 1
    if den > MAX_DENOMINATOR:
        raise UnsupportedQuery(
            f"the query's weights need a common denominator of {den} (> {MAX_DENOMINATOR}); "
            "use constants with fewer decimals."
        )
    nums = [f.numerator * (den // f.denominator) for f in fracs]
    if any(abs(n) >= 2**62 for n in nums):
        raise UnsupportedQuery("the query's weights are too large; scale the expression down.")
    num = np.array(nums, dtype=np.int64)[inverse].reshape(w.shape)
    g = math.gcd(den, *(abs(int(n)) for n in nums)) if nums else den
    if g > 1:
        num //= g
        den //= g
    return num, den


def _rationalise_fast(uniq: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Vectorised :func:`rationalise` for many distinct weights (e.g. ``SUM(income)``).

    Guesses the common denominator from a sample of the values (each recovered
    exactly as in the slow path) and accepts it only if every value times it is
    an integer to within float rounding; otherwise returns None (slow path).
    """
    if uniq.size <= 64 or not np.all(np.isfinite(uniq)) or np.max(np.abs(uniq)) >= 2**52:
        return None
    sample = uniq[np.unique(np.linspace(0, uniq.size - 1, 64).astype(int))]
    den = 1
    for v in sample.tolist():
        f = Fraction(v).limit_denominator(MAX_DENOMINATOR)
        den = math.lcm(den, f.denominator)
        if den > MAX_DENOMINATOR:
            return None
    scaled = uniq * den
    nums = np.round(scaled)
    if np.any(np.abs(scaled - nums) > 1e-9 * np.maximum(1.0, np.abs(scaled))) or np.any(np.abs(nums) >= 2**62):
        return None
    if den > 1 and np.any(np.abs(nums / den - uniq) > 1e-12 * np.maximum(1.0, np.abs(uniq))):
        return None
    return nums.astype(np.int64), den


def union_grid(table: Table, queries: Sequence[LinearQuery]) -> tuple[list[str], list[tuple[int, ...]]]:
    """The coarsest grid refining every query's grid: the columns they use, in declaration
    order, each with the union of their breakpoints (every query's start at 0)."""
    bps: dict[str, set[int]] = {}
    same: dict[str, tuple[int, ...] | None] = {}  # the one tuple all queries use for a column, if so
    names: dict[str, str] = {}  # as written → declared (a GROUP BY's groups repeat their columns)
    units: dict[str, int] = {}  # declared → its number of cells
    for q in queries:
        for c, bp in zip(q.columns, q.breakpoints, strict=True):
            name = names.get(c)
            if name is None:
                column = table.column(c)
                name = names[c] = column.name
                units[name] = column.n_cells
            if name not in same:
                same[name] = bp
            elif same[name] is not bp and len(same[name] or ()) != units[name]:
                if len(bp) == units[name]:  # unit slabs (every cell starts one) are every union
                    same[name] = bp
                    continue
                first = same[name]
                if first is not None:  # a second tuple: from now on a union of sets
                    bps[name] = set(first)
                    same[name] = None
                bps[name].update(bp)
    cols = [c.name for c in table.columns if c.name in same]
    # One shared tuple (a wide column's unit slabs) is its own union: no set of its 500 000 starts.
    return cols, [one if (one := same[c]) is not None else tuple(sorted(bps[c])) for c in cols]


#: Long breakpoint tuples already seen as arrays, by identity (grids keep their tuples, so a
#: fine grid's 4 096 breakpoints are converted once, not on every query expanded onto it).
_BREAKPOINT_ARRAYS: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
_BREAKPOINT_ARRAYS_MAX = 64
_BREAKPOINT_ARRAYS_LOCK = threading.Lock()


def breakpoint_array(bp: Sequence[int] | np.ndarray) -> np.ndarray:
    """``bp`` as an int64 array.  A tuple longer than 32 gets one shared read-only array,
    memoised by identity (the memo holds the tuple, so its id is not reused meanwhile)."""
    if not isinstance(bp, tuple) or len(bp) <= 32:
        return np.asarray(bp, dtype=np.int64)
    with _BREAKPOINT_ARRAYS_LOCK:
        hit = _BREAKPOINT_ARRAYS.get(id(bp))
    if hit is not None and hit[0] is bp:
        return hit[1]
    arr = np.asarray(bp, dtype=np.int64)
    arr.setflags(write=False)
    with _BREAKPOINT_ARRAYS_LOCK:
        while len(_BREAKPOINT_ARRAYS) >= _BREAKPOINT_ARRAYS_MAX:
            del _BREAKPOINT_ARRAYS[next(iter(_BREAKPOINT_ARRAYS))]
        _BREAKPOINT_ARRAYS[id(bp)] = (bp, arr)
    return arr


def slab_starts(fine: Sequence[int] | np.ndarray, coarse: Sequence[int] | np.ndarray) -> np.ndarray | None:
    """Where each of ``coarse``'s breakpoints sits among ``fine``'s (so slab i of the coarse
    grid is the fine slabs ``[at[i], at[i + 1])``), or ``None`` when ``fine`` does not refine it."""
    f, c = breakpoint_array(fine), breakpoint_array(coarse)
    at = np.searchsorted(f, c)
    if (at >= f.size).any() or (f[np.minimum(at, f.size - 1)] != c).any():
        return None
    return at


def expand_grid(
    values: np.ndarray,
    columns: Sequence[str],
    breakpoints: Sequence[Sequence[int]],
    to_columns: Sequence[str],
    to_breakpoints: Sequence[Sequence[int]],
) -> np.ndarray:
    """``values`` given per box of the grid ``(columns, breakpoints)``, on the finer grid
    ``(to_columns, to_breakpoints)`` (declaration order, a superset of ``columns``):
    a read-only broadcast view of shape ``(len(bp) for bp in to_breakpoints)``."""
    src = dict(zip((c.lower() for c in columns), breakpoints, strict=True))
    view = values
    for ax, (c, bp) in enumerate(zip(to_columns, to_breakpoints, strict=True)):
        if c.lower() in src:
            mine = src[c.lower()]
            if mine is bp or (len(mine) == len(bp) and tuple(mine) == tuple(bp)):
                continue  # the same slabs: no copy
            if slab_starts(bp, mine) is None:
                raise DPGateInternalError(f"grid for {c} does not refine the query's breakpoints")
            view = np.take(view, np.searchsorted(breakpoint_array(mine), breakpoint_array(bp), side="right") - 1,
                           axis=ax)
        else:  # a broadcast axis for a column the values do not depend on
            view = np.expand_dims(view, ax)
    return np.broadcast_to(view, tuple(len(b) for b in to_breakpoints))
