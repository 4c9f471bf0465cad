"""What a query returns: immutable ``Answer`` values grouped in a ``Result``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dpgate.errors import InterfaceError

if TYPE_CHECKING:
    import pandas as pd

    from dpgate.compile import CompiledStatement
    from dpgate.inference import Posterior
    from dpgate.query import LinearQuery

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
        value: the estimate θ̂ (the posterior centre); NaN when ``source == "unavailable"``.
        low, high: the narrowest ``confidence`` credible interval, which is also an
            exact frequentist confidence interval for the true answer.
        confidence: the stated coverage 1−δ of ``[low, high]``.
        accuracy: the half-width the analyst asked for.
        source: ``"history"``, ``"fresh"``, ``"exact"``, ``"unavailable"`` or ``"model"``
            (see ``Source``; a ``"model"`` answer's ``low``/``high`` are not a guaranteed interval).
        epsilon_spent: increase of the system privacy cost this answer caused (0 from history).
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
        isolated: True when the query cut the table's domain finer than its atom limit
            (``Gateway(max_atoms=...)``) allows: it was then answered on its own, from
            its exact repeats and rescalings only (never combined with other queries),
            and each fresh release of it was charged its full budget on every cell.
        components: for AVG / VAR / STDDEV (``dpgate.derived``), the answers of the linear
            components it was computed from (``COUNT(x)``, ``SUM(x)``[, ``SUM(x*x)``], each at
            confidence ``1 − δ/k``); empty otherwise.  A derived answer has ``posterior=None``
            and ``query=None``: its interval is a Bonferroni box, not a distribution.
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
        epsilon_spent: total increase of the system privacy cost.
    """

    answers: tuple[Answer, ...]
    statement: CompiledStatement = field(repr=False)
    epsilon_spent: float = 0.0

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
        import html

        head = html.escape(repr(self).splitlines()[0])
        return f"<p>{head}</p>" + self.to_pandas().to_html(index=False, max_rows=60)

    def to_pandas(self, *, intervals: bool = True) -> pd.DataFrame:
        """One row per group: the group keys, then per output column its value and,
        with ``intervals``, ``<col>_low``, ``<col>_high``, ``<col>_secure`` (``False``: the
        noise was seeded, see ``Answer.secure``) and ``<col>_source``.
        ORDER BY / LIMIT / HAVING of the statement are applied to these released rows."""
        import pandas as pd

        st = self.statement
        n_aggs = sum(1 for o in st.outputs if o.kind == "aggregate")
        rows = []
        for g in range(len(self.answers) // max(n_aggs, 1)):
            row: dict[str, Any] = {}
            chunk = self.answers[g * n_aggs : (g + 1) * n_aggs]
            keys: dict[str | None, Any] = dict(chunk[0].group) if chunk else {}
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
        df = pd.DataFrame(rows)
        return st.apply_postprocessing(df)
