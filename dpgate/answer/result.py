"""What a query returns: immutable ``Answer`` values grouped in a ``Result``.

Two honest touches are applied to every ``Answer`` as it is built (both are
post-processing of released values, so they cost no privacy):

* **On the support.**  A count is an integer ≥ 0 (at most the declared ``rows``), a sum of
  non-negative values is ≥ 0, and so on (:mod:`dpgate.inference._support`).  ``value`` is
  moved into that support and the interval is cut to it — stretched to at least
  ``[low, low + q]`` when ``θ̂ ± q`` falls below it, so it never collapses to a point.  The
  truth lies in the support, so the interval contains it whenever ``θ̂ ± q`` does
  (coverage cannot drop), and it is never wider than ``2q``.  ``unbiased`` (=
  ``posterior.mean()``) keeps the unrestricted estimate θ̂, which may be negative for a
  tiny count: use it to average answers.
* **No binary-float artefacts.**  ``value``, ``low`` and ``high`` are rounded to 15
  significant digits (``497.4999999999999`` → ``497.5``); the change, at most
  5·10⁻¹⁵ relative, is far below any noise.

:meth:`Result.rounded` (``round=True``, ``SET dpgate.round = on``) returns integers
for integer-valued queries (counts), the value moved into its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from dpgate.errors import InterfaceError
from dpgate.inference import support_of

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from dpgate.compile import CompiledStatement
    from dpgate.compile.query import LinearQuery
    from dpgate.inference import Posterior

__all__ = ["Answer", "Result", "Source"]

#: Where an answer came from.
#:  - ``"history"``: post-processing of earlier releases, no budget spent;
#:  - ``"fresh"``: a new noisy measurement was taken (and combined with history);
#:  - ``"exact"``: the answer is a public constant (every weight is zero);
#:  - ``"unavailable"``: nothing could be released (budget exhausted, history silent);
#:  - ``"model"``: a *biased* model-based estimate from history (``Gateway.estimate``,
#:    Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for Improving Data
#:    Utility under Differential Privacy", EDBT 2016): free, ``meets_requirement=False``,
#:    no posterior, and ``low``/``high`` are ``value ∓ z·RMSE_cv`` — a cross-validated
#:    error scale, NOT a guaranteed interval.
Source = Literal["history", "fresh", "exact", "unavailable", "model"]


@dataclass(frozen=True)
class Answer:
    """One released number with its honest interval.

    Attributes:
        value: the estimate θ̂ (the posterior centre) moved into the values the truth can take
            (a count is never negative: see :attr:`unbiased`); NaN when ``source == "unavailable"``.
        low, high: the narrowest ``interval_confidence`` credible interval, which is also an
            exact frequentist confidence interval for the true answer, on the values the truth
            can take (module docstring).
        confidence: the stated coverage 1−δ of ``[low, high]`` (the analyst's).
        accuracy: the half-width the analyst asked for.
        source: ``"history"``, ``"fresh"``, ``"exact"``, ``"unavailable"`` or ``"model"``
            (see ``Source``; a ``"model"`` answer's ``low``/``high`` are not a guaranteed interval).
        epsilon_spent: increase of the system privacy cost this answer caused (0 from history); for a
            zCDP gateway, what it added to the system's ε at δ = 1e-6 (``Gateway.spent_as``).
        posterior: scipy.stats-like law of the true answer given everything released
            (``cdf, sf, ppf, pdf, interval, mean, std, probability``), or ``None`` when
            the answer is exact or unavailable.
        meets_requirement: whether ``high - value <= accuracy``; False only for partial
            answers returned with ``allow_partial=True``.
        label: output column name.
        group: GROUP BY key as ``((column, key), …)``.
        query: the compiled linear query.
        secure: True only when every noisy release of the answer's table in the history
            (the releases it was, or could have been, computed from) drew its noise from
            the cryptographically secure source.  False when any of them was seeded
            (``seed=``, for tests only: reproducible noise can be subtracted), and by
            default, when whoever built the answer did not say.  An exact answer (a
            public constant) over seeded history is False as well: the flag describes
            the history, not one number.
        isolated: True when the query's statement cut the domain finer than the inference
            atom limit (``Gateway(max_atoms=...)``) allows, even on the local history of its
            own columns (``dpgate.ledger._history``): it was then answered on its own, from its
            exact repeats and rescalings only (never combined with other queries).  Its fresh
            releases are still charged their per-cell cost (wide ones: their budget on
            every cell of their support).
        components: for AVG / VAR / STDDEV (``dpgate.answer.combine``), the answers of the linear
            components it was computed from (``COUNT(x)``, ``SUM(x)``[, ``SUM(x*x)``], each at
            confidence ``1 − δ/k``); empty otherwise.  A derived answer has ``posterior=None``
            and ``query=None``: its interval is a Bonferroni box, not a distribution.
        interval_confidence: the confidence ``[low, high]`` was computed at: ``confidence`` itself, or
            more when the gateway holds several intervals of the query together (``Gateway(reasks=
            "simultaneous")``, the default: the k-th distinct interval of a query is at ``1 − δ_k``,
            ``dpgate.plan.asks``), so that the one an analyst stops on still covers at ``confidence``.
        rho_spent: for a zCDP gateway (``privacy="zcdp"``), the ρ this answer added; None for pure ε.
    """

    value: float
    low: float
    high: float
    confidence: float
    accuracy: float
    source: Source
    epsilon_spent: float
    posterior: Posterior | None = field(repr=False, default=None)
    meets_requirement: bool = True
    label: str = ""
    group: tuple[tuple[str, Any], ...] = ()
    query: LinearQuery | None = field(repr=False, default=None, compare=False)
    secure: bool = False
    isolated: bool = False
    components: tuple[Answer, ...] = field(default=(), repr=False)
    interval_confidence: float = field(default=math.nan, repr=False)
    rho_spent: float | None = None

    def __post_init__(self) -> None:
        if math.isnan(self.interval_confidence):  # not given: the interval is at the stated confidence
            object.__setattr__(self, "interval_confidence", self.confidence)
        value, low, high = _on_support(self.value, self.low, self.high, self.query, self.posterior, self.source)
        for name, x in (("value", value), ("low", low), ("high", high)):
            object.__setattr__(self, name, _tidy(x))

    @classmethod
    def _of(
        cls, value: float, low: float, high: float, confidence: float, accuracy: float, source: Source,
        epsilon_spent: float, posterior: Posterior | None, meets_requirement: bool, label: str,
        group: tuple[tuple[str, Any], ...], query: LinearQuery | None, secure: bool, isolated: bool,
    ) -> Answer:
        """``Answer(...)`` of these arguments (``components=()``), built faster for dpgate's own answers:
        the same instance, field by field, without the frozen ``__init__``'s per-field ``setattr``."""
        value, low, high = _on_support(value, low, high, query, posterior, source)
        out = object.__new__(cls)
        out.__dict__.update(
            value=_tidy(value), low=_tidy(low), high=_tidy(high), confidence=confidence, accuracy=accuracy,
            source=source, epsilon_spent=epsilon_spent, posterior=posterior, meets_requirement=meets_requirement,
            label=label, group=group, query=query, secure=secure, isolated=isolated, components=(),
            interval_confidence=confidence, rho_spent=None,
        )
        return out

    def rounded(self) -> Answer:
        """This answer with integers for an integer-valued query (integer weights and offset, e.g.
        ``COUNT``), else itself.  Post-processing, so free.

        The interval becomes ``[⌈low⌉, ⌊high⌋]``: the truth is an integer, so it lies in the
        new interval exactly when it lay in the old one (coverage unchanged).  The value is
        rounded to the nearest integer and then moved into that interval — so a count is never
        negative — which makes it a presentation, not an unbiased estimate (``posterior.mean()``
        keeps the unbiased one).  An interval narrower than one integer is widened to the value.
        """
        q = self.query
        if (q is None or q.denominator != 1 or q.offset.denominator != 1 or isinstance(self.value, int)
                or not math.isfinite(self.value)):
            return self
        value = round(self.value)
        low = math.ceil(self.low) if math.isfinite(self.low) else self.low
        high = math.floor(self.high) if math.isfinite(self.high) else self.high
        if low <= high:
            value = int(min(max(value, low), high))
        return replace(self, value=value, low=min(low, value), high=max(high, value))

    @property
    def unbiased(self) -> float:
        """The unbiased estimate θ̂ (``posterior.mean()``), before :attr:`value` was moved into the
        values the truth can take: average these, not ``value``, when combining answers."""
        return self.posterior.mean() if self.posterior is not None else self.value

    @property
    def certified_halfwidth(self) -> float:
        """The certified half-width of the interval: its posterior's at :attr:`interval_confidence`,
        before the cut to the values the truth can take (that cut depends on the value, so no
        decision may read it); :attr:`halfwidth` when there is no posterior."""
        return self.halfwidth if self.posterior is None else self.posterior.halfwidth(self.interval_confidence)

    @property
    def halfwidth(self) -> float:
        """Half the interval's width (``inf`` when unavailable)."""
        return (self.high - self.low) / 2 if math.isfinite(self.high - self.low) else math.inf

    def __repr__(self) -> str:
        where = f" {', '.join(f'{c}={k}' for c, k in self.group)}" if self.group else ""
        name = f"{self.label}{where}: " if self.label or where else ""
        cost = "free" if self.epsilon_spent == 0 else f"ε={self.epsilon_spent:.4g}"
        seeded = "" if self.secure else ", seeded noise"
        return (f"<Answer {name}{self.value:.6g} in [{self.low:.6g}, {self.high:.6g}] at {self.confidence:.0%} "
                f"({self.source}, {cost}{seeded})>")

    def _repr_html_(self) -> str:
        import html

        return f"<code>{html.escape(repr(self))}</code>"


@dataclass(frozen=True)
class Result:
    """Everything one SQL statement released.

    Attributes:
        answers: one ``Answer`` per (group, aggregate output column), groups in domain order.
        statement: the compiled statement (outputs, group columns, post-processing).
        epsilon_spent: total increase of the system privacy cost (for a zCDP gateway, of its ε at δ = 1e-6).
        rho_spent: for a zCDP gateway (``privacy="zcdp"``), the increase of its ρ; None for pure ε.
    """

    answers: tuple[Answer, ...]
    statement: CompiledStatement = field(repr=False)
    epsilon_spent: float = 0.0
    rho_spent: float | None = None

    def rounded(self) -> Result:
        """This result with :meth:`Answer.rounded` applied to every answer (``round=True``)."""
        return replace(self, answers=tuple(a.rounded() for a in self.answers))

    @property
    def answer(self) -> Answer:
        """The single answer; raises when the query released several (groups or columns)."""
        if len(self.answers) != 1:
            raise InterfaceError(
                f"this result holds {len(self.answers)} answers (groups × output columns); "
                "use .answers or .to_pandas() instead of .answer."
            )
        return self.answers[0]

    def __repr__(self) -> str:
        head = (f"<dpgate.Result {len(self.answers)} answers, ε spent {self.epsilon_spent:.6g}, "
                f"{self.answers[0].confidence:.0%} intervals>" if self.answers else "<dpgate.Result (empty)>")
        return head + "\n" + self.to_pandas().to_string(index=False, max_rows=60)

    def _repr_html_(self) -> str:
        """The frame of :meth:`to_pandas` with each interval also drawn as a small bar (HTML and CSS only)."""
        import html

        from dpgate.answer._plot import intervals_html

        head = html.escape(repr(self).splitlines()[0])
        aggregates = [out.name for out in self.statement.outputs if out.kind == "aggregate"]
        return f"<p>{head}</p>" + intervals_html(self.to_pandas(), aggregates)

    def plot(self) -> Figure:
        """The answers as points with their intervals as error bars, the groups side by side, one
        panel per aggregate output column; returns the matplotlib ``Figure`` (needs the ``demo``
        extra: ``pip install 'dpgate[demo]'``).  Draws only what was released: free.

        Raises:
            PlottingUnavailable: matplotlib is not installed (a ``dpgate.NotSupportedError``).
        """
        from dpgate.answer._plot import result_figure

        return result_figure(self.answers, self.statement.n_aggregates, self.statement.group_columns)

    def to_pandas(self, *, intervals: bool = True) -> pd.DataFrame:
        """One row per group: the group keys, then per output column its value and,
        with ``intervals``, ``<col>_low``, ``<col>_high``, ``<col>_secure`` (``False``: the
        noise was seeded, see ``Answer.secure``) and ``<col>_source``.
        ORDER BY / LIMIT / HAVING of the statement are applied to these released rows.

        Group keys are typed as their column: ``int64`` for integers (``Int64``, pandas'
        nullable integer, when a NULL group is emitted), ``bool`` for booleans (``boolean``
        with a NULL group), strings for categories and bins."""
        import pandas as pd

        st = self.statement
        n_aggs = st.n_aggregates
        rows = []
        for g, key in enumerate(st.group_keys):
            row: dict[str, Any] = {}
            keys: dict[str | None, Any] = dict(zip(st.group_columns, key, strict=True))
            chunk = self.answers[g * n_aggs : (g + 1) * n_aggs]
            agg_i = 0
            for out in st.outputs:
                if out.kind == "group":
                    row[out.name] = keys.get(out.column)
                    continue
                a = chunk[agg_i]
                agg_i += 1
                row[out.name] = a.value
                if intervals:
                    row[f"{out.name}_low"] = a.low
                    row[f"{out.name}_high"] = a.high
                    row[f"{out.name}_secure"] = a.secure
                    row[f"{out.name}_source"] = a.source
            rows.append(row)
        df = pd.DataFrame(rows, columns=_columns(st, intervals))
        for out in st.outputs:
            if out.kind == "group":
                df[out.name] = _typed(df[out.name], [k[out.index] for k in st.group_keys])
        return st.apply_postprocessing(df)


def _columns(st: CompiledStatement, intervals: bool) -> list[str]:
    """The frame's column names, in order (also for a result with no rows)."""
    names: list[str] = []
    for out in st.outputs:
        names.append(out.name)
        if out.kind == "aggregate" and intervals:
            names += [f"{out.name}_{s}" for s in ("low", "high", "secure", "source")]
    return names


def _typed(col: pd.Series, keys: list[Any]) -> pd.Series:
    """A key column with its column's type: int64 / Int64, bool / boolean, else object (str, None)."""
    present = [k for k in keys if k is not None]
    if present and all(isinstance(k, bool) for k in present):
        return col.astype("boolean" if len(present) < len(keys) else bool)
    if present and all(isinstance(k, int) and not isinstance(k, bool) for k in present):
        return col.astype("Int64" if len(present) < len(keys) else "int64")
    return col.astype(object).where(col.notna(), None)  # a NULL key is None, not NaN


def _on_support(
    value: float, low: float, high: float, q: LinearQuery | None, posterior: Posterior | None, source: str,
) -> tuple[float, float, float]:
    """``value`` and ``low``–``high`` on the values the truth can take (module docstring): the
    posterior's support, else the query's own (its weights' signs and lattice)."""
    if q is None or source == "unavailable" or not (low <= high):
        return value, low, high
    s = posterior.support if posterior is not None and posterior.support is not None else support_of(q)
    if s.low <= low and high <= s.high:  # already on it (a rounded answer keeps its integers)
        return (value if s.low <= value <= s.high else s.clip(value)), low, high
    low, high = s.interval((low + high) / 2, (high - low) / 2) if math.isfinite(high - low) else (
        max(low, s.low), min(high, s.high))
    return s.clip(value), low, high


def _tidy(x: Any) -> Any:
    """``x`` rounded to 15 significant digits (a float), so that binary-float artefacts such as
    ``497.4999999999999`` read ``497.5``; ints, NaN and infinities are returned as they are."""
    if isinstance(x, float) and math.isfinite(x):
        return float(f"{x:.15g}")
    return x
