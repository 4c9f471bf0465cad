"""The pandas accessor ``df.dp``: differentially private SQL on a DataFrame.

Importing this module (``import dpgate`` does) registers ``df.dp``::

    >>> import pandas as pd, dpgate.accessor
    >>> import dpgate.datasets
    >>> df, _ = dpgate.datasets.load_pums()
    >>> df["sex"] = df["sex"].astype(str).astype(pd.CategoricalDtype(["0", "1"]))
    >>> df.dp.configure(bounds={"age": (0, 100), "educ": (1, 16), "race": (1, 6),
    ...                         "income": (0, 500000), "married": (0, 1)}, budget=1.0, seed=0)
    >>> out = df.dp.query("SELECT sex, COUNT(*) AS n FROM df WHERE age < 30 GROUP BY sex", accuracy=10)
    >>> list(out.columns)
    ['sex', 'n', 'n_low', 'n_high', 'n_source']
    >>> out["n_source"].tolist()
    ['fresh', 'fresh', 'fresh', 'fresh']
    >>> df.copy().dp.spent == df.dp.spent > 0      # the budget follows the data
    True

The frame is the table ``df`` (or ``name=``).  Its public schema comes from
``schema=`` or, by default, from the frame's dtypes: ``Categorical`` columns take
their categories as domain, ``bool`` columns are boolean, and numeric columns need
``bounds={col: (min, max)}`` (inclusive integers) or ``bins={col: edges}``
(:meth:`dpgate.Schema.from_dataframe`).  Values are never read to choose a domain.

The budget follows the data, not the Python object
===================================================

Every frame is identified by a **content fingerprint**: SHA-256 over a hash of
each row's declared values (``pandas.util.hash_pandas_object`` after normalising
numbers to float64 and categories to strings, summed over rows so that row order
and the index do not matter) and the schema's :meth:`~dpgate.Schema.fingerprint`.
A process-wide registry maps each fingerprint to one :class:`~dpgate.Gateway`, so a
``df.copy()``, a fresh ``pd.read_csv`` of the same file, a shuffled frame, or a new
accessor on equal content all share **one** budget and one history.  Different
content — including a frame modified in place after ``configure`` — gets its own.
The gateway works on a private snapshot of the declared columns, so later edits
of the frame never change what an existing budget protects.

``configure`` records its (public) settings in ``df.attrs["dpgate"]`` — pandas
builds a new accessor object on every ``df.dp``, and attrs travel with copies — and
in the registry under the frame's content, so an unconfigured frame with equal
content (a re-read) finds them too.

Frames *derived* from a configured one (filters, samples, new columns in the
declared set) are different data for dpgate and are charged to their own budget.
They still describe the same people, so to protect them query the configured
frame with ``WHERE`` rather than filtering in pandas first.

In-memory budgets last as long as the process.  Pass ``ledger="path.db"`` to keep
the budget and history in a durable ledger that later processes (and other
users of the same file) continue from.  Within a process, a fingerprint already
in use cannot be reconfigured with another budget, ledger or seed; the error
says what is in force.

A different schema on the same data (other bounds, bins or table name) is a
different data source for dpgate and starts its own budget, exactly like a second
``dpgate.Gateway``; keep one schema per data set, ideally with a ledger.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpgate.decide import Policy
from dpgate.errors import ProgrammingError, SchemaError
from dpgate.gateway import Gateway
from dpgate.ledger import Ledger
from dpgate.result import Result
from dpgate.schema import Schema

__all__ = ["DPAccessor", "content_fingerprint"]


# -- fingerprints ------------------------------------------------------------------------------------
def _normalised(s: pd.Series) -> pd.Series:
    """A representation that equal data share whatever the dtype they were loaded with."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype(object)
    if pd.api.types.is_bool_dtype(s.dtype) or pd.api.types.is_numeric_dtype(s.dtype):
        return pd.Series(s.to_numpy(dtype=np.float64, na_value=np.nan), copy=False)
    return pd.Series([None if v is None or (isinstance(v, float) and v != v) or v is pd.NA else str(v)
                      for v in s.to_numpy(dtype=object)], dtype=object)


def content_fingerprint(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """SHA-256 identifying a frame's content on ``columns`` (default all), independent of row order,
    index and dtype width.  Internal: a function of private data — never publish it."""
    cols = [str(c) for c in df.columns] if columns is None else list(columns)
    by_name = {str(c): c for c in df.columns}
    h = hashlib.sha256(repr((len(df), cols)).encode())
    if cols and len(df):
        frame = pd.DataFrame({c: _normalised(df[by_name[c]]).to_numpy() for c in cols})
        rows = pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
        h.update(int(rows.sum(dtype=np.uint64)).to_bytes(8, "little"))
    return h.hexdigest()


# -- the registry --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Config:
    """What ``configure`` was asked for (enough to rebuild the schema for another frame)."""

    schema: Schema | None
    name: str | None
    bounds: tuple[tuple[str, tuple[int, int]], ...]
    bins: tuple[tuple[str, tuple[float, ...]], ...]
    budget: float
    ledger: str | None
    policy: Policy
    seed: int | None

    def schema_for(self, df: pd.DataFrame) -> Schema:
        if self.schema is not None:
            return self.schema
        return Schema.from_dataframe(
            df, self.name or "df", bounds=dict(self.bounds) or None, bins=dict(self.bins) or None
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, so ``df.attrs`` stays serialisable (``to_parquet`` writes attrs)."""
        return {
            "schema": None if self.schema is None else self.schema.to_dict(),
            "name": self.name,
            "bounds": [[k, list(v)] for k, v in self.bounds],
            "bins": [[k, list(v)] for k, v in self.bins],
            "budget": self.budget,
            "ledger": self.ledger,
            "policy": self.policy,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> _Config:
        try:
            return cls(
                schema=None if raw["schema"] is None else Schema.from_dict(raw["schema"]),
                name=raw["name"],
                bounds=tuple((str(k), (int(v[0]), int(v[1]))) for k, v in raw["bounds"]),
                bins=tuple((str(k), tuple(float(e) for e in v)) for k, v in raw["bins"]),
                budget=raw["budget"],
                ledger=raw["ledger"],
                policy=raw["policy"],
                seed=raw["seed"],
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ProgrammingError(
                f"df.attrs[{_ATTR!r}] is not a dpgate configuration ({exc}); call df.dp.configure(...) again."
            ) from None


_ATTR = "dpgate"
_DEFAULT = _Config(None, None, (), (), 1.0, None, "minimal", None)


@dataclass
class _Entry:
    gateway: Gateway
    config: _Config


_LOCK = threading.RLock()
_GATEWAYS: dict[str, _Entry] = {}  # content+schema fingerprint → gateway
_BY_CONTENT: dict[str, _Config] = {}  # whole-frame content fingerprint → last configuration


def _key(df: pd.DataFrame, schema: Schema) -> str:
    (table,) = schema.tables
    declared = [c.name for c in table.columns]
    return hashlib.sha256(f"{content_fingerprint(df, declared)}|{schema.fingerprint()}".encode()).hexdigest()


def _gateway(df: pd.DataFrame, config: _Config) -> tuple[str, Gateway]:
    """The process-wide gateway for this content and schema, created on first use."""
    schema = config.schema_for(df)
    if len(schema.tables) != 1:
        raise SchemaError(
            f"a DataFrame is one table, but the schema declares {[t.name for t in schema.tables]}; "
            "pass a one-table schema."
        )
    key = _key(df, schema)
    with _LOCK:
        entry = _GATEWAYS.get(key)
        if entry is not None:
            old = entry.config
            clash = [
                f"{k}={getattr(old, k)!r} (asked {getattr(config, k)!r})"
                for k in ("budget", "ledger", "seed")
                if getattr(old, k) != getattr(config, k)
            ]
            if clash:
                raise ProgrammingError(
                    "this data already has a dpgate budget in this process with "
                    + ", ".join(clash)
                    + "; the budget follows the data, so it cannot be reconfigured. Configure with those "
                    "values, or restart Python (an in-memory budget lasts one process; use a ledger path to "
                    "keep it across processes)."
                )
            return key, entry.gateway
        (table,) = schema.tables
        names = {str(c): c for c in df.columns}
        snapshot = pd.DataFrame({c.name: df[names[c.name]].copy() for c in table.columns if c.name in names})
        gw = Gateway(snapshot, schema, budget=config.budget, ledger=config.ledger, policy=config.policy,
                     seed=config.seed)
        _GATEWAYS[key] = _Entry(gw, config)
        return key, gw


def _forget_all() -> None:
    """Close and forget every in-process gateway (tests only: it discards in-memory budgets)."""
    with _LOCK:
        for entry in _GATEWAYS.values():
            entry.gateway.close()
        _GATEWAYS.clear()
        _BY_CONTENT.clear()


# Close the registry's DuckDB connections before interpreter shutdown (else duckdb reports leaks).
atexit.register(_forget_all)


# -- the accessor ------------------------------------------------------------------------------------
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
        bounds: Mapping[str, tuple[int, int]] | None = None,
        bins: Mapping[str, Iterable[float]] | None = None,
        policy: Policy = "minimal",
        seed: int | None = None,
    ) -> None:
        """Declare the frame's public schema and its privacy budget.

        Args:
            schema: a one-table ``dpgate.Schema``, dict or YAML path; default: from the
                dtypes plus ``bounds`` / ``bins`` (:meth:`dpgate.Schema.from_dataframe`).
            budget: total privacy budget ε of this data (default 1.0).
            ledger: a path for a durable ledger (the budget then survives the process).
            name: the table name used in SQL (default ``df``, or the schema's table).
            bounds: inclusive integer ``(min, max)`` per numeric column.
            bins: bin edges per numeric column.
            policy: ``"minimal"`` (default), ``"paper"`` or ``"no_reuse"``.
            seed: reproducible, **insecure** noise for tests.

        Raises:
            SchemaError: the schema is invalid, or a column has no public domain.
            ProgrammingError: this data already has a budget with another budget, ledger or seed.
            LedgerError: the ledger belongs to other data, another schema or budget.
        """
        if isinstance(schema, Ledger) or isinstance(ledger, Ledger):
            raise ProgrammingError("df.dp.configure takes a ledger *path*, not an open Ledger.")
        sch = None if schema is None else Schema.load(schema)
        if sch is not None:
            if len(sch.tables) != 1:
                raise SchemaError(
                    f"a DataFrame is one table, but the schema declares {[t.name for t in sch.tables]}; "
                    "pass a one-table schema."
                )
            if name is not None and name.lower() != sch.tables[0].name.lower():
                raise SchemaError(f"name={name!r} differs from the schema's table {sch.tables[0].name!r}.")
            if bounds or bins:
                raise SchemaError("bounds= and bins= describe a schema built from dtypes; with schema= declare them there.")
        config = _Config(
            schema=sch,
            name=name,
            bounds=tuple(sorted((str(k), (int(v[0]), int(v[1]))) for k, v in (bounds or {}).items())),
            bins=tuple(sorted((str(k), tuple(float(e) for e in v)) for k, v in (bins or {}).items())),
            budget=budget,
            ledger=None if ledger is None else os.path.realpath(os.fspath(ledger)),
            policy=policy,
            seed=seed,
        )
        _gateway(self._df, config)  # validate now: schema against data, ledger binding, clashes
        # pandas builds a new accessor on every ``df.dp``: the configuration lives in ``df.attrs``
        # (kept by copies and in-place edits) and in a registry keyed by content (re-reads).
        self._df.attrs[_ATTR] = config.to_json()
        with _LOCK:
            _BY_CONTENT[content_fingerprint(self._df)] = config

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
    ) -> pd.DataFrame:
        """Answer a counting query on this frame within ±``accuracy`` at ``confidence``.

        Returns one row per group (domain keys, empty groups included; HAVING /
        ORDER BY / LIMIT applied): the group columns, then for each aggregate ``c``
        its value and, with ``intervals``, ``c_low``, ``c_high`` and ``c_source``
        (``"history"`` = free, ``"fresh"`` = paid for).

        Privacy: as :meth:`dpgate.Gateway.query` — add/remove-one-row DP; each fresh
        measurement of a linear query with sensitivity ``S`` gets discrete Laplace
        noise of scale ``S/α`` at the smallest α meeting the requirement; answers from
        history cost nothing.  ``confidence`` defaults to 0.95 (or a SQL hint).
        """
        return self.result(sql, accuracy, confidence, params=params, allow_partial=allow_partial).to_pandas(
            intervals=intervals
        )

    def result(
        self,
        sql: str,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        params: Any = None,
        allow_partial: bool = False,
    ) -> Result:
        """Like :meth:`query` but returns the :class:`~dpgate.Result` (its ``answers`` carry posteriors)."""
        return self.gateway.query(sql, accuracy, confidence, params=params, allow_partial=allow_partial)

    def probability(self, sql: str, low: float | None = None, high: float | None = None, *, params: Any = None) -> float:
        """P(low ≤ answer ≤ high | everything released so far); free."""
        return self.gateway.probability(sql, low, high, params=params)

    # -- budget ----------------------------------------------------------------------------------------
    @property
    def gateway(self) -> Gateway:
        """The :class:`~dpgate.Gateway` this data's budget lives in (shared by equal content)."""
        raw = self._df.attrs.get(_ATTR)
        config = None if raw is None else _Config.from_json(raw)
        if config is None:
            with _LOCK:
                config = _BY_CONTENT.get(content_fingerprint(self._df))
        if config is None:
            config = _DEFAULT
            try:
                config.schema_for(self._df)
            except SchemaError as exc:
                raise SchemaError(
                    f"{exc} Call df.dp.configure(bounds=..., budget=...) (or schema=...) first."
                ) from None
        return _gateway(self._df, config)[1]

    @property
    def budget(self) -> float:
        """Total privacy budget ε of this data."""
        return self.gateway.budget

    @property
    def spent(self) -> float:
        """Privacy budget spent on this data so far (by every frame with equal content)."""
        return self.gateway.spent

    @property
    def remaining(self) -> float:
        """``budget − spent``."""
        return self.gateway.remaining

    @property
    def history(self) -> pd.DataFrame:
        """Every release on this data so far (one row per noisy measurement)."""
        return self.gateway.history
