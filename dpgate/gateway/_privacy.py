"""A gateway's accounting, pure ε or ρ-zCDP (mixed into :class:`~dpgate.Gateway`): its unit, ε at a δ, its display.

``Gateway(..., privacy="zcdp")`` keeps its budget, ``spent``, ``remaining`` and the ledger's
``cost_after`` in ρ (:mod:`dpgate.plan.zcdp`, whose docstring holds the proof of the per-cell
charge); every release is discrete Gaussian noise of deviation ``σ = S/α``
(:mod:`dpgate.release._gaussian`), charged a row in cell ``j`` ``(α|h_j|/S)²/2``
(:mod:`dpgate.plan.accounting`); intervals use its exact (normal, or mixed with a converted
ledger's Laplace releases) error law (``dpgate.inference.ErrorLaw(..., gaussian=...)``).  ``spent_as(delta)`` states the spend as (ε, δ)-DP; an answer
carries ``rho_spent`` (its ρ) and ``epsilon_spent`` (what it added to that ε at
:data:`~dpgate.plan.zcdp.DEFAULT_DELTA`).  A pure gateway is unchanged: ``rho_spent`` is None.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dpgate._validate import positive_finite
from dpgate.answer.result import Answer, Result
from dpgate.errors import InvalidRequirement
from dpgate.plan.explain import Explanation
from dpgate.plan.zcdp import DEFAULT_DELTA, Privacy, budget_in, check_privacy, epsilon_of

if TYPE_CHECKING:
    from dpgate.ledger._history import LedgerHistory
    from dpgate.schema.domains import Schema

__all__ = ["Accounting", "privacy_budget"]


def privacy_budget(privacy: object, budget: Any) -> tuple[Privacy, float]:
    """The accounting ``privacy`` names and ``budget`` in its unit (ε; ρ, or ``(ε, δ)`` converted).

    Raises:
        InvalidArgument: ``privacy`` is neither ``"pure"`` nor ``"zcdp"``.
        InvalidRequirement: the budget is not positive and finite, or not a valid ``(ε, δ)``.
    """
    mode = check_privacy(privacy)
    if mode == "zcdp" or isinstance(budget, (tuple, list)):
        return mode, budget_in(mode, budget)
    return mode, positive_finite(budget, "budget", error=InvalidRequirement)


class Accounting:
    """The accounting side of :class:`~dpgate.Gateway` (a mixin: it reads only the attributes declared here)."""

    schema: Schema
    policy: str
    privacy: Privacy
    _history: LedgerHistory

    if TYPE_CHECKING:
        @property
        def budget(self) -> float: ...

        @property
        def spent(self) -> float: ...

    @property
    def unit(self) -> str:
        """The unit of ``budget``, ``spent`` and ``remaining``: ``"ε"`` (pure) or ``"ρ"`` (zCDP)."""
        return "ρ" if self.privacy == "zcdp" else "ε"

    def spent_as(self, delta: float = DEFAULT_DELTA) -> float:
        """What was spent, as the ε of (ε, δ)-DP: for zCDP the tight conversion of ρ
        (:func:`dpgate.plan.zcdp.epsilon_of`); for pure ε, ``spent`` itself (ε-DP is (ε, δ)-DP).

        Raises:
            InvalidRequirement: ``delta`` is not in (0, 1).
        """
        return self._as_epsilon(self.spent, delta)

    def budget_as(self, delta: float = DEFAULT_DELTA) -> float:
        """The budget as the ε of (ε, δ)-DP (see :meth:`spent_as`)."""
        return self._as_epsilon(self.budget, delta)

    def _as_epsilon(self, amount: float, delta: float) -> float:
        if self.privacy == "zcdp":
            return epsilon_of(amount, delta)
        epsilon_of(0.0, delta)  # checks δ
        return amount

    def _in_unit(self, result: Result, spent_after: float) -> Result:
        """``result`` with its charges stated in this gateway's terms: unchanged when pure; for
        zCDP, each answer's ρ in ``rho_spent`` and ``epsilon_spent`` what it added to the ε at
        δ = 1e-6 of the system (in answer order, so they sum to the statement's)."""
        if self.privacy != "zcdp":
            return result
        rho = result.epsilon_spent
        answers, _ = _converted(result.answers, spent_after - rho)
        before, after = epsilon_of(max(0.0, spent_after - rho)), epsilon_of(spent_after)
        return replace(result, answers=tuple(answers), epsilon_spent=max(0.0, after - before), rho_spent=rho)

    def _stated(self, explanation: Explanation) -> Explanation:
        """``explanation`` marked with this gateway's accounting (a zCDP one adds its ε at δ)."""
        return replace(explanation, privacy="zcdp") if self.privacy == "zcdp" else explanation

    def _summary(self) -> list[tuple[str, str]]:
        """What ``repr`` and the notebook display show.  The release count is the last record id
        applied (ids run 1, 2, …), read after ``spent`` synced: the ledger is not re-read."""
        spent = self.spent
        rows = [("tables", ", ".join(t.name for t in self.schema.tables)), ("budget", f"{self.budget:g}"),
                ("spent", f"{spent:.6g}"), ("remaining", f"{max(0.0, self.budget - spent):.6g}"),
                ("releases", str(self._history.last_id)), ("policy", self.policy)]
        if self.privacy == "zcdp":
            rows.append(("privacy", f"zcdp (ε at δ={DEFAULT_DELTA:g}: {self._as_epsilon(spent, DEFAULT_DELTA):.4g} "
                                    f"of {self.budget_as():.4g})"))
        return rows

    def __repr__(self) -> str:
        s = dict(self._summary())
        zcdp = " privacy=zcdp" if self.privacy == "zcdp" else ""
        return (f"<dpgate.Gateway tables=[{s['tables']}] budget={s['budget']} spent={s['spent']} "
                f"remaining={s['remaining']} releases={s['releases']} policy={s['policy']}{zcdp}>")

    def _repr_html_(self) -> str:
        rows = [(f"budget {self.unit}" if k == "budget" else k, v) for k, v in self._summary()]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in rows)
        return f"<b>dpgate.Gateway</b><table>{body}</table>"


def _converted(answers: Sequence[Answer], base: float) -> tuple[list[Answer], float]:
    """``answers`` (and their components) with ``rho_spent`` their ρ and ``epsilon_spent`` the ε
    (at δ = 1e-6) each adds on top of ``base`` and of the answers before it; and the ρ after them."""
    out = []
    for a in answers:
        rho = a.epsilon_spent
        comps, _ = _converted(a.components, base) if a.components else ((), base)
        eps = max(0.0, epsilon_of(base + rho) - epsilon_of(base)) if rho > 0 else 0.0
        out.append(replace(a, epsilon_spent=eps, rho_spent=rho, components=tuple(comps)))
        base += rho
    return out, base
