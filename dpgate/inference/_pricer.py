"""Pricing a fresh measurement before it is taken: everything about "history + h_new at
scale b" that does not depend on b, for the incremental BLUE's two forms (``_basis_form``,
``_information_form``), read through their projections and solves."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from dpgate.inference._basis_form import BasisForm
from dpgate.inference._blocks import EXTEND_RTOL
from dpgate.inference._blue import ESTIMABLE_RTOL
from dpgate.inference._information_form import InformationForm

__all__ = ["Pricer"]


class Pricer:
    """Everything about "history + h_new at scale b" that does not depend on b.

    With ``s = 1/b``, ``c = s c_h`` and ``ρ = s ρ_h``.  If ``h_new`` adds no
    direction, Sherman–Morrison gives (κ = c_h M c_hᵀ, η = c_h M c_Qᵀ)::

        u_hist = C M c_Qᵀ − s² η/(1 + s² κ) · C M c_hᵀ,   u_new = s η / (1 + s² κ).

    If it adds the unit direction e (``‖ρ_h‖_D = ρ``, ``c_e = ⟨Q, e⟩_D``), the
    block formula gives ``u_hist = C M c_Qᵀ − (c_e/ρ) C M c_hᵀ`` and
    ``u_new = b c_e / ρ``.
    """

    def __init__(
        self, st: BasisForm | InformationForm, Q: NDArray[np.float64], h: NDArray[np.float64], *,
        weights: bool = True,
    ) -> None:
        same = Q is h or np.array_equal(Q, h)  # the usual case: measure the query itself
        self.same = same
        if isinstance(st, InformationForm):
            self._information(st, Q, h, weights)
            return
        c_h, rho = st.project(h)
        hn, rn = st.dnorm(h), st.dnorm(rho)
        self.extends = hn > 0 and rn > EXTEND_RTOL * hn
        cQ, res = (c_h, rho) if same else st.project(Q)
        qn = st.dnorm(Q)
        ce = 0.0
        if self.extends:
            e = rho / rn
            ce = st.inner(Q, e)
            res = res - ce * e
        self.estimable = st.dnorm(res) <= ESTIMABLE_RTOL * qn
        if not weights:  # only estimability was asked (:meth:`IncrementalBLUE.estimable_with`)
            return
        Mh = st.solve(c_h)
        MQ = Mh if same else st.solve(cQ)
        self.kappa, self.eta = float(c_h @ Mh), float(c_h @ MQ)
        self.CMQ, self.CMh = st.weights(cQ), st.weights(c_h)
        self.ce_over_rho = ce / rn if self.extends else 0.0

    def _information(self, st: InformationForm, Q: NDArray[np.float64], h: NDArray[np.float64],
                     weights: bool) -> None:
        """The same quantities in the information form: with ``w = (F + ÑÑᵀ)⁻¹ v`` and
        ``o(v) = ÑÑᵀw`` (v's part outside the row space), h adds a direction iff ``o(h) ≠ 0``;
        then Q is estimable iff ``o(Q) = t o(h)`` (least squares in ``‖·‖_D``), the new
        answer's weight is t and history estimates ``Q − t h``: ``u_hist = G(w_Q − t w_h)``
        (the basis form's ``c_e/ρ`` is t)."""
        wh = st.solve(h)
        oh = st.outside(wh)
        hn, on = st.dnorm(h), st.dnorm(oh)
        self.extends = hn > 0 and on > EXTEND_RTOL * hn
        wQ = wh if self.same else st.solve(Q)
        oQ = oh if self.same else st.outside(wQ)
        t = st.inner(oQ, oh) / (on * on) if self.extends else 0.0
        self.estimable = st.dnorm(oQ - t * oh) <= ESTIMABLE_RTOL * st.dnorm(Q)
        if not weights:
            return
        self.kappa, self.eta = float(h @ wh), float(h @ wQ)
        self.CMQ, self.CMh = st.weights(wQ), st.weights(wh)
        self.ce_over_rho = t

    def at(self, b: float) -> tuple[NDArray[np.float64], float]:
        """``(u_hist, u_new)`` for the new row at scale b."""
        if self.extends:
            return self.CMQ - self.ce_over_rho * self.CMh, b * self.ce_over_rho
        s2 = 1.0 / (b * b)
        denom = 1.0 + s2 * self.kappa
        return self.CMQ - (s2 * self.eta / denom) * self.CMh, (self.eta / b) / denom
