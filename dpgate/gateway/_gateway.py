"""The :class:`Gateway`: one call runs the pipeline's stages, under one lock (see :mod:`dpgate.gateway`).

Why one module of about 600 lines: it is one class, the public API, and a third of it
is docstrings — each method that releases states its privacy guarantee.  Planning and
answering live in :mod:`dpgate.plan`, a table's history in :mod:`dpgate.plan.state`, keeping it
in step with the ledger in :mod:`dpgate.ledger._history`, the model-based methods in
:mod:`dpgate.gateway._extensions`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from dpgate import _progress
from dpgate._blas import one_blas_thread, single_threaded
from dpgate._validate import positive_finite
from dpgate.answer.combine import assemble, measured_queries, output_parts, plan_confidence
from dpgate.answer.result import Result
from dpgate.compile import CompiledStatement, SetOption
from dpgate.compile import cache as compile_cache
from dpgate.compile.bounds import DEFAULT_MAX_MEMORY, memory_budget, too_many_outputs
from dpgate.compile.derived import refuse_derived
from dpgate.compile.query import LinearQuery
from dpgate.errors import Error, InvalidArgument, InvalidRequirement, NotEstimable, ProgrammingError
from dpgate.errors import Warning as DPGateWarning
from dpgate.gateway._asks import Asks, ReaskMode, check_reasks
from dpgate.gateway._extensions import Extensions, Plots
from dpgate.gateway._latency import Latency
from dpgate.gateway._ledger_open import ledger_for
from dpgate.gateway._privacy import Accounting, privacy_budget
from dpgate.inference import IncrementalBLUE, Posterior, support_of
from dpgate.ledger._describe import history_frame
from dpgate.ledger._history import LedgerHistory, collector_paused
from dpgate.ledger.core import Ledger, LedgerRecord, LedgerTransaction
from dpgate.plan._replay import refusal
from dpgate.plan.accounting import to_epsilon
from dpgate.plan.budget import exhausted, fits
from dpgate.plan.decide import POLICIES, Measurement, Plan, Policy, Step, answers, check_policy, measurement, plan
from dpgate.plan.explain import Explanation, Quote, quote, zero_valued
from dpgate.plan.requirement import hinted, of_call, resolve_confidence
from dpgate.plan.state import DEFAULT_MAX_ATOMS, RecordedCharges, TableState, TableView, isolation_key
from dpgate.release._gaussian import GAUSSIAN_NOISE, release_gaussian_many
from dpgate.release.cube import Cube
from dpgate.release.noise import noise_source, release_many
from dpgate.schema.domains import Schema
from dpgate.warmstart import design as warmstart

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_MAX_OUTPUTS", "Gateway", "POLICIES"]

_R = TypeVar("_R", bound=Result)

#: Default ``Gateway(max_outputs=...)``: a two-column GROUP BY of a few thousand keys.
DEFAULT_MAX_OUTPUTS = 4096


def _outside_dpgate() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside dpgate."""
    frame, level = sys._getframe(1), 1  # level 1: the function calling warnings.warn
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("dpgate"):
        frame, level = frame.f_back, level + 1
    return level


class Gateway(Accounting, Extensions, Plots):
    """A differentially private gateway in front of one data source.

    Args:
        data: a DuckDB database path (opened read-only), a duckdb connection, a pandas
            DataFrame (one-table schema) or ``{table_name: DataFrame}``; a PostgreSQL
            ``postgresql://`` URL, SQLAlchemy engine or DB-API connection; a Spark DataFrame
            or ``(SparkSession, table)``; or a ``dpgate.backends.Backend`` (see that module).
        schema: a ``dpgate.Schema``, a dict in the schema format or a YAML path.
        budget: total privacy budget ε of the system (per-cell accounting); ρ when ``privacy="zcdp"``,
            which also takes a target ``(ε, δ)`` and converts it (``dpgate.plan.zcdp.rho_of``).
        ledger: ``None`` (history in memory), a path (durable SQLite ledger shared by
            processes), a ``postgresql://`` URL (a ledger shared by gateways on several
            hosts; needs ``ledger_key``, see ``dpgate.ledger._postgres``) or an open
            ``dpgate.ledger.core.Ledger``.
        policy: ``"minimal"`` (default), ``"paper"`` or ``"no_reuse"`` (see ``POLICIES``).
        seed: reproducible, **insecure** noise for tests and benchmarks; recorded as such
            in the ledger, flagged ``Answer.secure=False`` on every answer of a table with a
            seeded release, and announced by a ``dpgate.Warning`` on the gateway's first
            seeded release.  ``None`` (default) uses OpenDP's secure sampler.
        dialect: sqlglot dialect of incoming SQL.
        ledger_key: the ledger's secret key (bytes, or a key file path); default
            ``<ledger>.key``, created with the ledger, owner-only.  The ledger stores
            only a keyed MAC binding it to the data (``dpgate.ledger.core``).
        new_ledger: start a new ledger at ``ledger`` although its anchor shows that a
            previous one there was deleted (a fresh budget on the same data: only
            when you mean it).
        max_atoms: the most inference atoms a table's history may split its domain into
            (default 20 000; every decision's time grows with them).  A statement that
            would exceed it is still answered, on its own: from its exact repeats and
            rescalings only (``Answer.isolated``), each fresh release charged its exact
            per-cell cost (the cost atoms are separate and much larger).
        max_outputs: the most outputs (groups × aggregates) one statement may have;
            larger statements are refused with ``QueryTooComplex`` before any data is
            read (planning and recording cost grow with the outputs; benchmarks/README.md
            gives the time per thousand groups).
        fixed_latency: seconds S: a statement that reads data answers S after it began (or at the next
            multiple of S if its work overruns), so its timing does not reveal the data (``gateway._latency``).
        max_memory: bytes of arrays one statement may build (default 1 GiB; ``compile.bounds.reserve_memory``).
        reasks: ``"simultaneous"`` (default: all intervals of a query hold together, ``plan.asks``) or ``"independent"``.
        privacy: ``"pure"`` (default: ε-DP) or ``"zcdp"`` (ρ-zCDP, composing like √k; ``gateway._privacy``).
        convert_ledger: with ``privacy="zcdp"``, convert a pure-ε ``ledger`` to zCDP (for good; its releases are
            then charged ε²/2-zCDP each); without it such a ledger is refused with an error naming this switch.

    Example:
        >>> import dpgate, dpgate.datasets
        >>> df, schema = dpgate.datasets.load_pums()
        >>> gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
        >>> a = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=25).answer
        >>> a.source, a.high - a.value <= 25
        ('fresh', True)
    """

    # Whether this gateway already warned that its noise is seeded.
    _warned_seeded: bool = False

    def __init__(
        self,
        data: Any,
        schema: Schema | Mapping[str, Any] | str,
        budget: float = 1.0,
        ledger: str | Ledger | None = None,
        policy: Policy = "minimal",
        seed: int | None = None,
        *,
        dialect: str = "duckdb",
        ledger_key: bytes | str | None = None,
        new_ledger: bool = False,
        max_atoms: int = DEFAULT_MAX_ATOMS,
        max_outputs: int = DEFAULT_MAX_OUTPUTS,
        fixed_latency: float | None = None,
        max_memory: int = DEFAULT_MAX_MEMORY,
        reasks: ReaskMode = "simultaneous",
        privacy: str = "pure",
        convert_ledger: bool = False,
    ):
        self.privacy, budget = privacy_budget(privacy, budget)
        self.policy, reasks = check_policy(policy), check_reasks(reasks)
        self.schema = Schema.load(schema)
        self.dialect = dialect
        for name, limit in (("max_atoms", max_atoms), ("max_outputs", max_outputs), ("max_memory", max_memory)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidArgument(f"{name} must be an integer ≥ 1, got {limit!r}.")
        self.max_atoms, self.max_outputs, self.max_memory = max_atoms, max_outputs, max_memory
        self._latency = Latency(fixed_latency)
        self._cube = Cube(data, self.schema)
        # A digest of the private data: the ledger stores only a keyed MAC of it, never the value.
        self._fingerprinted: tuple[Schema, str] | None = (self.schema, self.schema.fingerprint())
        fingerprint = hashlib.sha256(f"{self._cube.fingerprint()}|{self._fingerprinted[1]}".encode()).hexdigest()
        with collector_paused():
            self._ledger = ledger_for(self._cube, ledger, fingerprint=fingerprint, budget=float(budget),
                                      key=ledger_key, new=new_ledger, privacy=self.privacy, convert=convert_ledger)
            self._owns_ledger = not isinstance(ledger, Ledger)
            self._noise = noise_source(seed)
            self._history = LedgerHistory(self.schema, self._ledger, max_atoms, zcdp=self.privacy == "zcdp")
            self._asks = Asks(reasks, self._history)  # per query, which of its intervals this is
            self._ispe_releases: list[warmstart.WarmStart] = []  # this object's ISPE warm starts, for method="mmse"
            self._lock = threading.RLock()
            with one_blas_thread():
                self._history.open()

    # -- public properties -------------------------------------------------------
    @property
    def budget(self) -> float:
        """The total privacy budget ε (ρ for ``privacy="zcdp"``)."""
        return float(self._ledger.budget)

    @property
    def spent(self) -> float:
        """System privacy cost so far: Σ over tables of ``k · max_j B_j`` (Xiao & Xiong (2012), Theorem 5.5; ρ: ``k² · max_j R_j``)."""
        with self._lock:
            self._history.sync()
            return self._history.spent()

    @property
    def remaining(self) -> float:
        """``budget − spent`` (never negative)."""
        return max(0.0, self.budget - self.spent)

    @property
    def history(self) -> pd.DataFrame:
        """Every release so far as a pandas DataFrame (one row per noisy measurement).

        ``measured`` says in words what each release counted and on which cells — for a
        GROUP BY, its group (e.g. ``COUNT where sex = 1``); ``query`` (last) is the exact
        weight vector as JSON."""
        return history_frame(self._ledger.records(), self.schema)

    @property
    def ledger(self) -> Ledger:
        """The ledger recording every release."""
        return self._ledger

    # -- queries -------------------------------------------------------------------
    @single_threaded
    def query(
        self,
        sql: str,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        allow_partial: bool = False,
        policy: Policy | None = None,
        round: bool = False,  # noqa: A002 - the pinned public name
    ) -> Result:
        """Answer a counting query within ±``accuracy`` at ``confidence``.

        Each output (group × aggregate column) is answered from history when the
        BLUE over past releases already meets the requirement (free); otherwise
        dpgate measures it afresh at the smallest budget that does (``policy``),
        after checking the budget and recording the release durably.

        Args:
            sql: one SELECT of linear aggregates (see ``dpgate.compile``). A hint
                ``/*+ dpgate accuracy=25 confidence=0.95 */`` supplies defaults;
                ``/*+ dpgate method=pca|maxent|mmse */`` returns :meth:`estimate`'s free,
                model-based answers instead (no accuracy needed, nothing spent).
            accuracy: half-width of the requested interval (> 0), in the answer's units (not
                ε, which is the budget); for AVG / VAR / STDDEV, of each component in rows
                (``dpgate.answer.combine``).
            confidence: 1−δ, in (0, 1); default 0.95.
            params: PEP 249 parameters bound into placeholders.
            allow_partial: when the budget cannot pay, return history's best estimates
                (with their true, wider intervals, ``meets_requirement=False``) instead
                of raising ``BudgetExhausted``.
            policy: override the gateway's policy for this call.
            round: return integers for integer-valued outputs (counts): ``Result.rounded``,
                free post-processing with unchanged coverage.

        A statement without aggregates (``SELECT k FROM t GROUP BY k``) returns the declared
        keys: it needs no accuracy, reads no data, spends nothing and is not recorded.

        Raises:
            UnsupportedQuery, SchemaError: the SQL is refused (nothing read, nothing spent).
            InvalidRequirement: accuracy/confidence out of range.
            BudgetExhausted: the answer would overspend (nothing read, nothing spent).
        """
        stmt = self._checked(self.compile(sql, params, max_outputs=self.max_outputs))
        method = stmt.hints.get("method", "exact")  # validated and lower-cased by the compiler
        if stmt.queries and method != "exact":  # a hint asked for a free, model-based estimate instead
            confidence = resolve_confidence({"confidence": confidence}, hinted(stmt.hints))
            return self.estimate(sql, method, confidence=confidence, params=params)
        return self._run(stmt, accuracy, confidence, allow_partial, policy, round)

    @single_threaded
    def run(
        self,
        statement: CompiledStatement,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        allow_partial: bool = False,
        policy: Policy | None = None,
        round: bool = False,  # noqa: A002 - as query's
    ) -> Result:
        """:meth:`query` of a statement compiled already (by :meth:`compile`): exact answers only.

        For the package's SQL front ends (``dpgate.dbapi``, hence ``dpgate serve``), which
        compile each statement once to read its hints and route it, then hand the compiled
        value here instead of its text.  The privacy guarantee, requirement rules and
        errors are :meth:`query`'s; the statement's ``method`` hint is not read here (the
        caller routes model-based statements to :meth:`estimate`, as :meth:`query` does).
        """
        return self._run(statement, accuracy, confidence, allow_partial, policy, round)

    def _run(self, statement: CompiledStatement, accuracy: float | None, confidence: float | None,
             allow_partial: bool, policy: Policy | None, round: bool) -> Result:  # noqa: A002 - as run's
        """:meth:`run`, inside its caller's BLAS limit (the public entry points are ``single_threaded``)."""
        stmt = self._checked(statement)
        if not stmt.queries:  # only declared group keys: public, so free
            return Result((), stmt, 0.0)
        sql = stmt.sql  # recorded with each release: the text as given, placeholders unbound
        req = of_call(stmt.hints, accuracy, confidence, allow_partial)
        accuracy, confidence, allow_partial = req.accuracy, req.confidence, req.allow_partial
        policy = check_policy(policy or self.policy)
        with self._latency.timed() as clock, self._lock, _progress.working(f"planning {len(stmt.queries)} outputs"):
            self._history.sync()
            planned, asked = self._asks.planned(stmt, req, policy, lambda c: self._plan(stmt, accuracy, c, policy))
            steps: Sequence[Step] = planned.steps
            clock.reads_data = any(s.kind == "fresh" for s in steps)  # decided by the plan: public
            steps, blue, replayed = (self._measure(stmt, sql, planned, accuracy, asked.confidence, policy, allow_partial)
                                     if clock.reads_data else (steps, planned.refined.blue, False))
            secure, rows = self._history.secure(stmt.table), planned.refined.table.rows
            out = self._asks.served(asked, lambda at: assemble(stmt, lambda c: answers(
                blue, steps, accuracy, c, policy, secure=secure, replayed=replayed, rows=rows), at))
            result = self._in_unit(Result(out, stmt, float(sum(s.increase for s in steps))), self._history.spent())
        return result.rounded() if round else result

    @single_threaded
    def explain(
        self,
        sql: str,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        policy: Policy | None = None,
        method: str | None = None,
    ) -> Explanation:
        """The quote of :meth:`query` for the same arguments, without reading data or spending.

        Per output: whether it would be answered from history (free) or fresh, the ε it
        would charge, the half-width its interval would carry and the budget left after
        it (``Explanation.to_pandas()``; ``EXPLAIN SELECT …`` on the DB-API gives the same
        rows).  The next identical :meth:`query` charges exactly the quoted ε, unless
        another release happens in between.

        It is free — it spends nothing, reads no data, records nothing (``spent`` and
        ``history`` are unchanged) — because the plan depends only on the queries, the
        requirement and the *design* of history (which queries were released at which
        noise scales), all public or post-processing of released answers: the half-width
        of an estimator is a quantile of its error law, which depends on the design
        alone, never on a noise value or a row (see ``dpgate.plan.explain``).

        ``method`` (default: the statement's ``/*+ dpgate method=… */`` hint, else
        ``"exact"``): a model-based method quotes its free estimates (``source="model"``).

        Raises:
            UnsupportedQuery, SchemaError, InvalidRequirement: as :meth:`query` (nothing spent).
        """
        stmt = self._checked(self.compile(sql, params, max_outputs=self.max_outputs))
        return self._stated(self._quote(stmt, accuracy, confidence, policy, method))

    @single_threaded
    def quote(
        self,
        statement: CompiledStatement,
        accuracy: float | None = None,
        confidence: float | None = None,
        *,
        policy: Policy | None = None,
        method: str | None = None,
    ) -> Explanation:
        """:meth:`explain` of a statement compiled already (by :meth:`compile`): free, as :meth:`explain`.

        For the package's SQL front ends, which quote the very statement they then hand to
        :meth:`run` (the server's per-analyst cap check), compiling it once.
        """
        return self._stated(self._quote(statement, accuracy, confidence, policy, method))

    def _quote(self, statement: CompiledStatement, accuracy: float | None, confidence: float | None,
               policy: Policy | None, method: str | None) -> Explanation:
        """:meth:`quote`, inside its caller's BLAS limit."""
        stmt = self._checked(statement)
        method = method or stmt.hints.get("method", "exact")
        with self._lock:
            self._history.sync()
            spent = self._history.spent()
            if not stmt.queries:  # only declared group keys: public, nothing to charge
                return Explanation((), 0.0, spent, self.budget, stmt)
            if method != "exact":  # model-based estimates are free and have no certified interval
                c = resolve_confidence({"confidence": confidence}, hinted(stmt.hints))
                left = self.budget - spent
                quotes = tuple(Quote(name, stmt.queries[idx[0]].group, "model", 0.0, math.nan, c, left)
                               for name, _, _, idx in output_parts(stmt))
                return Explanation(quotes, 0.0, spent, self.budget, stmt)
            req = of_call(stmt.hints, accuracy, confidence, None)
            pol = check_policy(policy or self.policy)
            planned, asked = self._asks.planned(stmt, req, pol, lambda c: self._plan(stmt, req.accuracy, c, pol))
            if asked.again is not None:  # earlier intervals given again: free
                return self._asks.quoted(asked, spent, self.budget, stmt)
            blue, zero = planned.refined.blue, zero_valued(planned.steps)
            return quote(stmt, planned.steps, lambda c: answers(blue, zero, req.accuracy, c, pol, secure=True,
                                                                rows=planned.refined.table.rows),
                         asked.confidence, spent, self.budget, planned.refined.costs)

    @single_threaded
    def probability(self, sql: str, low: float | None = None, high: float | None = None, *, params: Any = None) -> float:
        """P(low ≤ θ ≤ high | history) for a single-output query; free (Xiao & Xiong (2012), §5.2).

        Raises:
            NotEstimable: history does not determine this query.
        """
        stmt = self.compile(sql, params)
        refuse_derived(stmt, "probability()")
        if len(stmt.queries) != 1:
            raise ProgrammingError(
                f"probability() needs a query with one output, this one has {len(stmt.queries)}."
            )
        (q,) = stmt.queries
        with self._lock:
            self._history.sync()
            state = self._history.state(stmt.table).refined([q], isolate=True)
            if q.is_zero:
                v = float(q.offset)
                return float((low is None or low <= v) and (high is None or v <= high))
            if state.outside:  # too fine for the atoms: only its exact repeats inform it
                key, factor = isolation_key(q)
                repeats = state.isolated.get(key)
                est = repeats.blue().estimate([factor]) if repeats is not None else None
            else:
                est = state.blue.estimate(state.atoms.vector(q))
        if est is None or est.posterior is None:
            raise NotEstimable(
                "history does not determine this query yet (it is not a linear combination of released "
                "answers); ask gw.query(...) for it first."
            )
        off = float(q.offset)  # est is of the linear part: so is its support
        post = Posterior(est.posterior.center, est.posterior.law, support_of(q.linear_part, state.table.rows))
        return post.probability(None if low is None else low - off, None if high is None else high - off)

    def close(self) -> None:
        """Close the data source and the ledger (if the gateway opened it).

        A file ledger's inference state is first checkpointed (``<ledger>.state``) so
        that the next gateway on it need not replay its records (see ``dpgate.ledger._checkpoint``).
        """
        if not self._ledger.closed and self._history.last_id > self._history.checkpointed:
            # Best effort: a ledger that can no longer be read (deleted, tampered) gets none.
            with self._lock, contextlib.suppress(Error):
                self._history.save_checkpoint(self._ledger.records())
        self._cube.close()
        if self._owns_ledger:
            self._ledger.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the seam for extensions (dpgate.plan.seam.GatewaySeam: dpgate.model, dpgate.warmstart) --
    def compile(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None, *,
                max_outputs: int | None = None) -> CompiledStatement:
        """Compile one SELECT against this gateway's schema and dialect (reads no data, spends nothing).

        Raises:
            UnsupportedQuery, SchemaError: the SQL is refused.
            ProgrammingError: a ``SET dpgate.*`` statement (those configure DB-API sessions).
        """
        stmt = self.compile_any(sql, params, max_outputs=max_outputs)
        if not isinstance(stmt, CompiledStatement):
            raise ProgrammingError(
                "SET dpgate.* statements configure a DB-API connection; pass accuracy= and "
                "confidence= to Gateway.query instead."
            )
        return stmt

    def compile_any(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None, *, max_outputs: int | None = None
    ) -> CompiledStatement | SetOption:
        """:meth:`compile`, also of ``SET dpgate.*``: what a DB-API connection compiles, once per statement,
        before it routes it; ``max_outputs``: a larger exact statement is refused before per-group work."""
        with memory_budget(self.max_memory):
            return compile_cache.compiled(sql, params, self.schema, self._schema_fingerprint(), self.dialect,
                                          max_outputs=max_outputs)

    def _schema_fingerprint(self) -> str:
        """``self.schema.fingerprint()``, computed once per schema object."""
        found = self._fingerprinted
        if found is None or found[0] is not self.schema:
            found = self._fingerprinted = (self.schema, self.schema.fingerprint())
        return found[1]

    @contextmanager
    def locked_view(self, table: str, queries: Sequence[LinearQuery] = ()) -> Iterator[TableView]:
        """Hold the gateway's lock and give a frozen snapshot of ``table``'s history.

        On entry: take the lock (re-entrant), apply the ledger records other processes
        wrote, refine the atoms with ``queries`` (public structure only, so that their
        vectors over the view's atoms exist) and snapshot the table's history.  The
        lock is held until the block ends, so an extension's reads and its releases
        through :meth:`release_measurements` are not interleaved with this gateway's
        other threads.  The view holds copies and stays valid after the block.

        Reading the view is post-processing of released values: nothing is spent.

        Raises:
            SchemaError: ``table`` is not declared.
            UnsupportedQuery: refining with ``queries`` would exceed the atom limits.
        """
        with self._lock, one_blas_thread():
            self._history.sync()
            yield self._history.state(table).refined(queries).view()

    # -- internals -------------------------------------------------------------------
    def _checked(self, stmt: CompiledStatement) -> CompiledStatement:
        """``stmt``, refused if it has more outputs than ``max_outputs``."""
        if len(stmt.queries) > self.max_outputs:
            raise too_many_outputs(len(stmt.queries), self.max_outputs)
        return stmt

    def _warn_if_seeded(self) -> None:
        """Warn once per gateway, before its first release, that its noise is seeded."""
        if not self._noise.secure and not self._warned_seeded:
            warnings.warn(
                "this dpgate gateway draws its noise from a seed: releases are reproducible and "
                "INSECURE (anyone who knows the seed can subtract the noise); answers carry "
                "secure=False. Use seed= for tests and benchmarks only.",
                DPGateWarning,
                stacklevel=_outside_dpgate(),
            )
            self._warned_seeded = True

    def _plan(self, stmt: CompiledStatement, accuracy: float, confidence: float, policy: str) -> Plan:
        """Plan ``stmt`` on a refined copy of its table's (or a local) history; AVG/VAR/STDDEV plan their components."""
        queries = measured_queries(stmt)
        with memory_budget(self.max_memory):
            state = self._history.planning_state(stmt.table, queries)
            return plan(state, queries, accuracy, plan_confidence(stmt, confidence), policy)

    def _measure(
        self,
        stmt: CompiledStatement,
        sql: str,
        planned: Plan,
        accuracy: float,
        confidence: float,
        policy: str,
        allow_partial: bool,
    ) -> tuple[list[Step], IncrementalBLUE, bool]:
        """Under the ledger lock: re-plan if others released meanwhile, check the budget, measure, record,
        commit — and only then hand values back, with the inference state before this statement's releases
        (a copy), or (third: True) after them (``Plan.replayed``, revalued); ``planned``: the statement's plan."""
        self._warn_if_seeded()
        with self._ledger.transaction() as tx:
            seen = self._history.last_id
            self._history.sync(tx.records(since=seen))
            if self._history.last_id != seen:
                planned = self._plan(stmt, accuracy, confidence, policy)
            state, steps = planned.refined, planned.steps
            before = state.blue.copy()  # the live state's appends below must not reach it
            needed = float(sum(s.increase for s in steps))
            spent = self._history.spent()
            if not fits(spent, needed, self.budget):
                if allow_partial:
                    return [replace(s, kind="unavailable", increase=0.0) if s.kind == "fresh" else s for s in steps], before, False
                raise refusal(state.blue, steps, needed, spent, self.budget, accuracy, confidence,
                              secure=self._history.secure(state.table.name), rows=state.table.rows, unit=self.unit)
            charges = planned.recorded_charges()
            values, records = self._record(tx, state, planned.measurements, sql, "query", spent, charges)
        # Committed (fsync'd): only now may anything derived from the values leave.
        if planned.replayed is not None:
            planned.replayed.revalue(values)
        self._history.applied(planned, records, charges)
        it = iter(values)
        measured = [s.measured(tuple(next(it) for _ in s.measurements)) if s.measurements else s for s in steps]
        return (measured, before, False) if planned.replayed is None else (measured, planned.replayed, True)

    def _record(
        self, tx: LedgerTransaction, state: TableState, parts: Sequence[Measurement], sql: str, kind: str,
        spent: float, charges: RecordedCharges,
    ) -> tuple[list[float], list[LedgerRecord]]:
        """Inside an open ledger transaction: read the true answers, add noise, append
        one record per measurement.  Values leave only after the caller commits.
        Returns the values and the records (for :meth:`LedgerHistory.applied`).
        ``charges``: what recording ``parts`` in order charges (``Plan.recorded_charges``)."""
        truths = self._cube.true_numerators([m.query for m in parts])
        start, after = charges.before, charges.after
        gaussian = any(m.gaussian for m in parts)  # a zCDP gateway's: σ = S/α, α²/2-zCDP (release._gaussian)
        rels = (release_gaussian_many if gaussian else release_many)(
            [(truth, m.query.denominator, m.sensitivity, m.alpha) for m, truth in zip(parts, truths, strict=True)],
            self._noise,
        )
        noise = GAUSSIAN_NOISE if gaussian else "discrete_laplace"
        records = tx.append_many([
            {"kind": kind, "table": state.table.name, "query": m.query.to_json(), "sql": sql, "alpha": m.alpha,
             "sensitivity": m.sensitivity, "scale": rel.scale, "lattice": rel.lattice, "noise": noise,
             "value": rel.value, "cost_after": spent - to_epsilon(start) + to_epsilon(charge), "secure": rel.secure}
            for m, rel, charge in _progress.track(zip(parts, rels, after, strict=True), len(parts), "releasing")
        ])  # fmt: skip
        return [rel.value for rel in rels], records

    @single_threaded
    def release_measurements(
        self, table: str, measurements: Sequence[tuple[LinearQuery, float]], *, kind: str = "warm_start", label: str = ""
    ) -> list[float]:
        """**Spends budget**: release noisy answers of given linear queries at given budgets α.

        The release primitive behind :meth:`warm_start` (and designed workloads): no
        requirement, no reuse of history — every pair ``(q, α)`` is measured.

        Privacy guarantee:

        * Neighbouring relation: add/remove one person (one row, or the
          ``max_rows_per_unit`` rows kept of a privacy unit, see ``dpgate.plan.accounting``).
        * Sensitivity: ``S = max|q|`` of each query's weights (its linear part; the
          offset is public).
        * Noise law and scale: two-sided geometric (discrete Laplace) noise on the
          query's lattice ``γ`` with scale ``b = S/α`` (``dpgate.release.noise.release``), so
          each release is ``α``-DP for its query; with ``privacy="zcdp"``, discrete Gaussian
          noise of deviation ``σ = S/α`` on the same lattice (``dpgate.release._gaussian``),
          ``α²/2``-zCDP.
        * Cost charged: cell ``j`` is charged ``(α/S)|q_j|`` per release, and the
          system cost rises to ``k · max_j B_j`` (Xiao & Xiong (2012), Theorem 5.5); with
          ``privacy="zcdp"``, ``(α|q_j|/S)²/2`` and ``k² · max_j R_j`` in ρ (``dpgate.plan.zcdp``).
          The whole increase is checked against the budget before any data is read;
          the values are recorded in the ledger and returned only after it commits.
          They join the history that later queries answer from.

        Args:
            table: the declared table.
            measurements: ``(query, α)`` pairs; each α > 0 and finite, each query non-zero.
            kind: the ledger record kind (``"warm_start"``, ``"query"``).
            label: recorded as the release's SQL text.

        Returns:
            The released noisy values, in the order of ``measurements``.

        Raises:
            BudgetExhausted: the releases would overspend (nothing read, nothing spent).
            InvalidRequirement: an α is not positive and finite, or a query is zero.
        """
        for q, alpha in measurements:
            positive_finite(alpha, "every budget α", error=InvalidRequirement)
            if q.is_zero:
                raise InvalidRequirement("a measured query must have a non-zero weight somewhere.")
        with self._lock:
            self._warn_if_seeded()
            with self._ledger.transaction() as tx:
                self._history.sync(tx.records(since=self._history.last_id))
                # Planned by the rule the records are applied by, so the charge checked is the one recorded.
                state = self._history.state(table).refined([q for q, _ in measurements], isolate=True)
                parts = [measurement(state, q, q.sensitivity / a,
                                     h=np.array([isolation_key(q)[1]]) if i in state.outside else None)
                         for i, (q, a) in enumerate(measurements)]
                charges = state.recorded_charges([(m.c, m.alpha, m.sensitivity) for m in parts])
                start, after = charges.before, charges.after
                needed, spent = to_epsilon(after[-1] if after else start) - to_epsilon(start), self._history.spent()
                if not fits(spent, needed, self.budget):
                    raise exhausted(needed, spent, self.budget, what=f"Releasing these {len(parts)} measurements",
                                    unit=self.unit)
                values, records = self._record(tx, state, parts, label, kind, spent, charges)
            self._history.applied(Plan.of_releases(state, parts, charges), records, charges)
        return values
