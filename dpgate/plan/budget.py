"""The budget rule, written once: whether a charge fits a budget, and the refusal when it does not.

Every budget check of dpgate uses these: the gateway's (a query, a batch of
releases), the warm start's, :attr:`dpgate.plan.explain.Explanation.affordable`,
and the server's per-analyst caps (before a statement runs, and again when each
release is recorded).  A charge fits when ``spent + needed ≤ budget + SLACK``:
the slack absorbs the rounding of sums of floats (a budget spent in ten
releases of 0.1 each must still admit the last one), and is never more.

Pure functions, no I/O.

Example:
    >>> fits(0.7, 0.3, 1.0), fits(0.7, 0.31, 1.0)
    (True, False)
    >>> print(exhausted(0.41, 0.88, 1.0, what="This query", purpose=" to reach ±25 at 95%"))
    This query needs ε = 0.41 to reach ±25 at 95%; 0.12 of 1 remains.
"""

from __future__ import annotations

from dpgate.errors import BudgetExhausted

__all__ = ["SLACK", "fits", "remaining", "exhausted"]

#: The floating-point slack of every budget comparison (absolute, in ε).
SLACK = 1e-12

#: What an analyst over their cap can do instead (the end of their refusal).
_CAP_ADVICE = ("Ask for a lower accuracy, or for queries history already answers (free), "
               "or ask the operator to raise your cap.")


def fits(spent: float, needed: float, budget: float) -> bool:
    """Whether charging ``needed`` on top of ``spent`` stays within ``budget`` (up to :data:`SLACK`).

    A NaN anywhere does not fit.
    """
    return spent + needed <= budget + SLACK


def remaining(spent: float, budget: float) -> float:
    """What is left of ``budget`` after ``spent`` (never negative)."""
    return max(0.0, budget - spent)


def exhausted(
    needed: float,
    spent: float,
    budget: float,
    *,
    what: str,
    purpose: str = "",
    analyst: str | None = None,
    hint: str = "",
    estimate: object = None,
    unit: str = "ε",
) -> BudgetExhausted:
    """The refusal of a charge that does not :func:`fit <fits>`: one sentence with the numbers.

    ``"{what} needs ε = {needed}{purpose}; {remaining} of {budget} remains.{hint}"`` for the
    gateway's budget; for an analyst's cap the second half reads ``"analyst 'x' has ε = {remaining}
    left of their cap {budget}.{hint} Ask for ..."`` (what they can do instead).

    Args:
        needed: the ε the refused charge needs.
        spent, budget: what was spent of the budget (or cap) before it, and the budget.
        what: the subject of the sentence (``"This query"``, ``"This hierarchical warm start"``).
        purpose: what ``needed`` buys, from a leading space (``" to reach ±25 at 95%"``).
        analyst: the analyst whose cap ``budget`` is, or ``None`` for the gateway's budget.
        hint: further sentences, from a leading space.
        estimate: the best answer history alone gives, attached to the error.
        unit: the budget's unit, ``"ε"`` or (a zCDP gateway's) ``"ρ"``.
    """
    left = remaining(spent, budget)
    if analyst is None:
        rest = f"{left:.4g} of {budget:g} remains.{hint}"
    else:
        rest = f"analyst {analyst!r} has {unit} = {left:.4g} left of their cap {budget:g}.{hint} {_CAP_ADVICE}"
    return BudgetExhausted(f"{what} needs {unit} = {needed:.4g}{purpose}; {rest}", needed=needed, remaining=left,
                           estimate=estimate)
