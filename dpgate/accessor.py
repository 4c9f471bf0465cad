"""The pandas accessor ``df.dp``: differentially private SQL on a DataFrame.

Importing this module (``import dpgate`` does) registers ``df.dp``::

    >>> import pandas as pd, dpgate.accessor
    >>> import dpgate.datasets
    >>> df, _ = dpgate.datasets.load_pums()
    >>> df.dp.configure(categories={"sex": ["0", "1"]}, bounds={"age": (0, 100)}, budget=1.0)
    >>> out = df.dp.query("SELECT sex, COUNT(*) AS n FROM df WHERE age < 30 GROUP BY sex", accuracy=10)
    >>> list(out.columns)
    ['sex', 'n', 'n_low', 'n_high', 'n_secure', 'n_source']
    >>> out["n_source"].tolist(), bool(out["n_secure"].all())
    (['fresh', 'fresh'], True)
    >>> df.copy().dp.spent == df.dp.spent > 0      # the budget follows the people
    True

The frame is the table ``df`` (or ``name=``).  Its public schema comes from
``schema=`` or from declarations, and then holds only the columns they name:
``categories={col: [values]}``, ``bounds={col: (min, max)}`` (inclusive integers, or
dates) or ``bins={col: edges}`` — plus ``bool`` columns, boolean by type.  Other columns
are not part of it: a query using one is refused, naming it and what to declare, and
only the declared columns reach the gateway (and a ledger's data fingerprint); they
still take part in recognising the same rows (below).  Every problem with the
declarations is reported in one error.  Values are never read to choose a domain, and a
``Categorical`` dtype is not a declaration (``read_csv(dtype="category")`` builds its
categories from the data): declare its values, or opt in to reading undeclared domains
with ``unsafe_infer_from_data=True``.  :meth:`DPAccessor.explain` prices a query for free.

The budget follows people, not frames
=====================================

dpgate cannot see people, only rows, so it identifies them by their rows.  Each
configured frame keeps a private copy of its rows — *every* column it had, in a
canonical encoding (numbers as float64, labels as strings; dtype, index and row
order do not matter) — and compares rows by **keyed row hashes**
(``dpgate._rowhash``: a 64-bit hash run through SipHash under a secret key drawn
once per process), which reveal nothing without the key and never leave the
process: they are not written, printed, or put in ``df.attrs``.

Whenever a frame is configured or queried, its rows are compared with each
configured frame's rows on the columns the two have in common (by name):

* **the same rows** (equal as multisets on those columns: a copy, a re-read of the
  file, a shuffle, an added column, a projection such as ``df[["age"]]``) — it
  shares that frame's :class:`~dpgate.Gateway`: one budget, one history (configuring
  it under another schema is refused);
* **any other overlap** — even one shared row (a filter, ``df.sample``, a dropped or
  duplicated row, an in-place edit of a compared column, a concatenation) — it is
  **refused** with a ``ProgrammingError``: the shared rows are the same people,
  and a second budget on them would multiply their privacy loss.  Query the
  configured frame with ``WHERE`` instead;
* **no shared row, or no common column** — it is other people: ``configure`` gives it
  its own budget; unconfigured, it is refused until ``df.dp.configure(...)`` is
  called (no frame gets a budget silently).

There is deliberately no threshold: any overlap could be the one person a pair of
answers isolates.  Rows are equal when their compared values are equal, so data
with few, coarse columns may share rows with unrelated data and be refused: use
one frame (and ``WHERE``), or another process.  Configuring the same rows again
with another budget, ledger, seed or schema is refused too, so spent budget never
resets.  Frames with no column in common cannot be linked: renaming every column
escapes the rule, as does anything done in another process.

The rule holds within one process.  Pass ``ledger="path.db"`` to keep the budget
and history in a durable ledger that later processes continue from; a ledger is
bound to its exact data, and a process that configures *derived* data with a new
ledger (or none) is not stopped by it.

Seeds (``configure(seed=0)``) make noise reproducible and **insecure**; they are
for tests.  A seed belongs to the one gateway it configured: nothing is written to
``df.attrs``, so frames derived from a configured one inherit neither seed nor
budget, and answers from seeded noise carry ``secure=False``.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpgate._rowhash import Encoding, content_fingerprint, encode_all, encodings_of, hashed
from dpgate.answer.result import Result
from dpgate.compile.statement import dialect_of
from dpgate.errors import InvalidArgumentType, ProgrammingError, SchemaError
from dpgate.gateway import Gateway
from dpgate.ledger.core import Ledger
from dpgate.plan.decide import Policy
from dpgate.schema._from_frame import table_from_dataframe, undeclared_columns_error
from dpgate.schema.domains import Schema

__all__ = ["DPAccessor", "content_fingerprint"]

_T = TypeVar("_T")


# -- the registry --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Config:
    """What ``configure`` was asked for (``declared``: the schema is from categories= / bounds= / bins=)."""

    schema: Schema
    budget: Any
    ledger: str | None
    policy: Policy
    seed: int | None
    declared: bool = False
    privacy: str = "pure"


Relation = Literal["same", "overlap"]


@dataclass
class _Entry:
    """One configured set of rows: its gateway, and how to recognise its rows.

    ``encoded`` holds *every* column of the frame as configured (not only the declared
    ones), in canonical encoding, so that a projection onto other columns
    (``df[["sex"]]`` after ``df[["age"]]`` was configured) is still recognised.
    """

    gateway: Gateway
    config: _Config
    schema: Schema
    encodings: dict[str, Encoding]
    encoded: dict[str, np.ndarray] = field(repr=False)
    _hashes: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict, repr=False)

    def hashes(self, columns: tuple[str, ...]) -> np.ndarray:
        """Sorted keyed row hashes on ``columns`` (cached)."""
        if columns not in self._hashes:
            self._hashes[columns] = hashed({c: self.encoded[c] for c in columns})
        return self._hashes[columns]

    def relation(self, df: pd.DataFrame) -> Relation | None:
        """How ``df``'s rows, on the columns both have, relate to this entry's rows."""
        theirs_cols = encode_all(df, {c: how for c, how in self.encodings.items() if c in self.encoded})
        common = tuple(c for c in self.encoded if c in theirs_cols)
        if not common:
            return None
        mine, theirs = self.hashes(common), hashed({c: theirs_cols[c] for c in common})
        if np.array_equal(mine, theirs):
            return "same"
        if not len(mine):
            return None
        at = np.minimum(np.searchsorted(mine, theirs), len(mine) - 1)
        return "overlap" if bool(np.any(mine[at] == theirs)) else None


_LOCK = threading.RLock()
_ENTRIES: list[_Entry] = []  # every configured set of rows in this process


def _related(df: pd.DataFrame) -> list[tuple[_Entry, Relation]]:
    out = []
    for entry in _ENTRIES:
        rel = entry.relation(df)
        if rel is not None:
            out.append((entry, rel))
    return out


def _describe(entry: _Entry) -> str:
    (table,) = entry.schema.tables
    return (
        f"a frame configured earlier in this process as table {table.name!r} "
        f"(budget {entry.gateway.budget:g}, spent {entry.gateway.spent:.4g})"
    )


def _refuse_overlap(entry: _Entry) -> ProgrammingError:
    return ProgrammingError(
        f"this DataFrame shares rows with {_describe(entry)} but is not the same rows (a filter, sample, "
        "dropped or duplicated row, edit or concatenation). dpgate's budget follows people: the shared "
        "rows are the same people, so this frame cannot get a budget of its own. Query the configured "
        "frame with WHERE instead of filtering in pandas first."
    )


def _one_table(schema: Schema) -> None:
    if len(schema.tables) != 1:
        raise SchemaError(
            f"a DataFrame is one table, but the schema declares {[t.name for t in schema.tables]}; "
            "pass a one-table schema."
        )


def _configured(df: pd.DataFrame, config: _Config) -> Gateway:
    """The gateway for ``df`` under ``config``: the one of the same rows, or a new one (see module docs)."""
    schema = config.schema
    _one_table(schema)
    (table,) = schema.tables
    names = {str(c): c for c in df.columns}
    declared = [c.name for c in table.columns if c.name in names]
    with _LOCK:
        related = _same_rows(df)
        if related:
            (entry, _), = related
            if entry.schema.fingerprint() != schema.fingerprint():
                raise ProgrammingError(
                    f"these rows are already configured: they are {_describe(entry)}, with another schema. "
                    "One set of people has one budget: configure them with the same schema (bounds, bins, "
                    "categories, name), or query the frame configured first."
                )
            old = entry.config
            clash = [
                f"{k}={getattr(old, k)!r} (asked {getattr(config, k)!r})"
                for k in ("budget", "ledger", "seed", "privacy")
                if getattr(old, k) != getattr(config, k)
            ]
            if clash:
                raise ProgrammingError(
                    "this data already has a dpgate budget in this process with "
                    + ", ".join(clash)
                    + "; the budget follows the people, so it cannot be reconfigured. Configure with those "
                    "values, or restart Python (an in-memory budget lasts one process; use a ledger path to "
                    "keep it across processes)."
                )
            return entry.gateway
        encodings = encodings_of(df, names)
        encodings.update({c.name: "label" if c.kind == "categorical" else "number"
                          for c in table.columns if c.name in names})
        encoded = encode_all(df, encodings)
        snapshot = pd.DataFrame({c: df[names[c]].copy() for c in declared})
        gw = Gateway(snapshot, schema, budget=config.budget, ledger=config.ledger, policy=config.policy,
                     seed=config.seed, privacy=config.privacy)
        _ENTRIES.append(_Entry(gw, config, schema, encodings, encoded))
        return gw


def _same_rows(df: pd.DataFrame) -> list[tuple[_Entry, Relation]]:
    """The configured entry holding exactly ``df``'s rows (or none); any partial overlap is refused."""
    related = _related(df)
    for entry, rel in related:
        if rel == "overlap":
            raise _refuse_overlap(entry)
    if len(related) > 1:
        raise ProgrammingError(
            "this DataFrame holds the rows of several frames configured earlier in this process; "
            "query each of them instead."
        )
    return related


def _lookup(df: pd.DataFrame) -> _Entry:
    """The configured entry of a set of rows equal to ``df``'s (see module docs)."""
    with _LOCK:
        related = _same_rows(df)
        if related:
            return related[0][0]
    raise ProgrammingError(
        "this DataFrame has no dpgate budget: declare its public domains and budget first, e.g. "
        "df.dp.configure(categories={'col': [...]}, bounds={'age': (0, 100)}, budget=1.0) "
        "(or df.dp.configure(schema=...))."
    )


def _undeclared_in(sql: str, entry: _Entry, df: pd.DataFrame) -> SchemaError | None:
    """The refusal of a query using columns of ``df`` its declarations left out, else None: asked once the
    gateway refused it with a SchemaError (before reading or spending); reads the SQL, not the data."""
    (table,) = entry.schema.tables
    frame = {str(c).lower() for c in df.columns}
    try:
        trees = dialect_of(entry.gateway.dialect).parse(sql)
    except (SqlglotError, RecursionError):
        return None  # the gateway's own message stands
    used = dict.fromkeys(node.name for tree in trees if tree is not None for node in tree.find_all(exp.Column))
    missing = [n for n in used if n and n.lower() in frame and not table.has_column(n)]
    return undeclared_columns_error(df, table, missing) if missing else None


def _forget_all() -> None:
    """Close and forget every in-process gateway (tests only: it discards in-memory budgets)."""
    with _LOCK:
        for entry in _ENTRIES:
            entry.gateway.close()
        _ENTRIES.clear()


# Close the registry's DuckDB connections before interpreter shutdown (else duckdb reports leaks).
atexit.register(_forget_all)


# -- the accessor ------------------------------------------------------------------------------------
if getattr(getattr(vars(pd.DataFrame).get("dp"), "_accessor", None), "__module__", None) == "dpgate":
    delattr(pd.DataFrame, "dp")  # the deferred accessor ``import dpgate`` registered: replaced, without a warning


@pd.api.extensions.register_dataframe_accessor("dp")
class DPAccessor:
    """``df.dp``: differentially private counting queries over this frame (see module docs)."""

    def __init__(self, pandas_obj: pd.DataFrame) -> None:
        self._df = pandas_obj

    def configure(
        self,
        schema: Schema | Mapping[str, Any] | str | None = None,
        budget: float = 1.0,
        ledger: str | os.PathLike[str] | None = None,
        name: str | None = None,
        bounds: Mapping[str, tuple[Any, ...]] | None = None,
        bins: Mapping[str, Iterable[float]] | None = None,
        policy: Policy = "minimal",
        seed: int | None = None,
        categories: Mapping[str, Iterable[Any]] | None = None,
        *,
        unsafe_infer_from_data: bool = False,
        nullable: Iterable[str] = (),
        other: Iterable[str] = (),
        privacy: str = "pure",
    ) -> None:
        """Declare the frame's public schema and its privacy budget.

        Args:
            schema: a one-table ``dpgate.Schema``, dict or YAML path; default: built from
                ``categories`` / ``bounds`` / ``bins``, which name the only columns queries may
                use (with the bool columns, boolean by type).
            budget: total privacy budget ε of these rows (default 1.0); ρ (or ``(ε, δ)``) for zCDP.
            ledger: a path for a durable ledger (the budget then survives the process).
            name: the table name used in SQL (default ``df``, or the schema's table).
            bounds: inclusive integer ``(min, max)`` per numeric column.
            bins: bin edges per numeric column.
            policy: ``"minimal"`` (default), ``"paper"`` or ``"no_reuse"``.
            seed: reproducible, **insecure** noise for tests: answers carry ``secure=False``,
                the first seeded release warns, and no other frame inherits it.
            categories: the possible values of each categorical column (compared as
                strings).  A ``Categorical`` dtype's categories are not used unless
                ``unsafe_infer_from_data=True``.
            unsafe_infer_from_data: read undeclared domains from the data, with a warning;
                this leaks information and voids the guarantee for those columns.
            nullable: columns that may hold NULL (``GROUP BY`` then emits a NULL group).
            other: categorical columns that may hold undeclared values (an ``<other>`` group).
            privacy: ``"pure"`` (default, ε-DP) or ``"zcdp"`` (ρ; :class:`~dpgate.Gateway`).

        Raises:
            SchemaError: the schema or the declarations are invalid (every problem in one error).
            ProgrammingError: these rows already have a budget with another budget, ledger,
                seed or schema, or they overlap rows configured earlier (see module docs).
            LedgerError: the ledger belongs to other data, another schema or budget.
        """
        if isinstance(schema, Ledger) or isinstance(ledger, Ledger):
            raise ProgrammingError("df.dp.configure takes a ledger *path*, not an open Ledger.")
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentType(f"name= is the table's name in SQL, a string; got {type(name).__name__}.")
        if schema is not None:
            sch = Schema.load(schema)
            _one_table(sch)
            if name is not None and name.lower() != sch.tables[0].name.lower():
                raise SchemaError(f"name={name!r} differs from the schema's table {sch.tables[0].name!r}.")
            if bounds or bins or categories or nullable or other:
                raise SchemaError(
                    "categories=, bounds=, bins=, nullable= and other= build a schema from the frame; with schema= "
                    "declare them there."
                )
        else:  # only the named columns (and bool ones): the others are not part of the schema
            table = table_from_dataframe(
                self._df, name or "df", categories=categories, bounds=bounds, bins=bins,
                unsafe_infer_from_data=unsafe_infer_from_data, nullable=nullable, other=other, declared_only=True,
            )
            sch = Schema((table,))
        config = _Config(
            schema=sch,
            budget=budget,
            ledger=None if ledger is None else os.path.realpath(os.fspath(ledger)),
            policy=policy,
            seed=seed,
            declared=schema is None, privacy=privacy,
        )
        # Validates now (schema against data, overlap with configured rows, ledger binding, clashes).
        # Nothing is written to df.attrs: pandas copies attrs into derived frames, and neither a
        # budget nor a seed may travel with them; the registry finds these rows by content.
        _configured(self._df, config)

    # -- queries ---------------------------------------------------------------------------------------
    def query(
        self,
        sql: str,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        params: Any = None,
        allow_partial: bool = False,
        intervals: bool = True,
        round: bool = False,  # noqa: A002 - the name Gateway.query uses
    ) -> pd.DataFrame:
        """Answer a counting query on this frame within ±``accuracy`` at ``confidence``.

        Returns one row per group (the declared keys, typed as their columns, empty groups
        included; HAVING / ORDER BY / LIMIT applied): the group columns, then for each
        aggregate ``c`` its value and, with ``intervals``, ``c_low``, ``c_high`` and
        ``c_source`` (``"history"`` = free, ``"fresh"`` = paid for).  ``round=True`` returns
        integers for counts (free post-processing, see :meth:`dpgate.Result.rounded`).

        Privacy: as :meth:`dpgate.Gateway.query` — add/remove-one-row DP; each fresh
        measurement of a linear query with sensitivity ``S`` gets discrete Laplace (zCDP: Gaussian)
        noise of scale ``S/α`` at the smallest α meeting the requirement; answers from
        history cost nothing.  ``confidence`` defaults to 0.95 (or a SQL hint).
        """
        return self.result(
            sql, accuracy, confidence, params=params, allow_partial=allow_partial, round=round
        ).to_pandas(intervals=intervals)

    def result(
        self,
        sql: str,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        params: Any = None,
        allow_partial: bool = False,
        round: bool = False,  # noqa: A002 - the name Gateway.query uses
    ) -> Result:
        """Like :meth:`query` but returns the :class:`~dpgate.Result` (its ``answers`` carry posteriors)."""
        return self._ask(sql, lambda gw: gw.query(sql, accuracy, confidence, params=params,
                                                  allow_partial=allow_partial, round=round))

    def explain(
        self, sql: str, accuracy: float | None = None, confidence: float | None = None, *, params: Any = None
    ) -> pd.DataFrame:
        """What :meth:`query` would do and cost, as a DataFrame — free: nothing is read, spent or recorded.

        :meth:`dpgate.Gateway.explain`'s quote, one row per output: ``output``, ``group``, ``source``
        (``"history"`` = free, ``"fresh"`` = paid for), ``epsilon`` (what its own releases charge),
        ``halfwidth`` (of its interval at ``confidence``), ``confidence``, ``remaining`` and ``note``;
        after several outputs a ``(statement)`` row gives the total.  The next identical
        :meth:`query` charges exactly the quoted ε, unless another release happens in between.

        Example:
            >>> import pandas as pd, dpgate.accessor
            >>> staff = pd.DataFrame({"dept": ["a", "b", "c", "a"] * 50, "tenure": list(range(40)) * 5})
            >>> staff.dp.configure(categories={"dept": ["a", "b", "c"]}, bounds={"tenure": (0, 40)})
            >>> sql = "SELECT COUNT(*) AS n FROM df WHERE tenure < 10"
            >>> quote = staff.dp.explain(sql, accuracy=20)
            >>> quote[["output", "source"]].values.tolist(), staff.dp.spent      # a price, nothing spent
            ([['n', 'fresh']], 0.0)
            >>> charged = staff.dp.result(sql, accuracy=20).answer.epsilon_spent
            >>> bool(charged == quote["epsilon"].iloc[0] == staff.dp.spent)
            True

        Raises:
            SchemaError, UnsupportedQuery, InvalidRequirement: as :meth:`query` (nothing spent).
        """
        return self._ask(sql, lambda gw: gw.explain(sql, accuracy, confidence, params=params).to_pandas())

    def probability(self, sql: str, low: float | None = None, high: float | None = None, *, params: Any = None) -> float:
        """P(low ≤ answer ≤ high | everything released so far); free."""
        return self._ask(sql, lambda gw: gw.probability(sql, low, high, params=params))

    def _ask(self, sql: str, call: Callable[[Gateway], _T]) -> _T:
        """``call`` on these rows' gateway; a query using a column the declarations left out is
        refused naming it and how to declare it."""
        entry = _lookup(self._df)
        try:
            return call(entry.gateway)
        except SchemaError:
            refusal = _undeclared_in(sql, entry, self._df) if entry.config.declared and isinstance(sql, str) else None
            if refusal is None:
                raise
            raise refusal from None

    # -- budget ----------------------------------------------------------------------------------------
    @property
    def gateway(self) -> Gateway:
        """The :class:`~dpgate.Gateway` these rows' budget lives in (shared by the same rows).

        Raises:
            ProgrammingError: no configured frame holds these rows (call ``df.dp.configure``),
                or they overlap a configured frame's rows without being the same rows.
        """
        return _lookup(self._df).gateway

    @property
    def budget(self) -> float:
        """Total privacy budget ε of this data (ρ for ``privacy="zcdp"``)."""
        return self.gateway.budget

    @property
    def spent(self) -> float:
        """Privacy budget spent on these rows so far (by every frame holding the same rows)."""
        return self.gateway.spent

    @property
    def remaining(self) -> float:
        """``budget − spent``."""
        return self.gateway.remaining

    @property
    def history(self) -> pd.DataFrame:
        """Every release on this data so far (one row per noisy measurement)."""
        return self.gateway.history

