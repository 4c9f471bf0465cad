"""Error laws with Gaussian terms (zCDP releases, issue 31): closed forms, Gil-Pelaez mixtures
against numerical convolution and Monte Carlo, and the scale search for a Gaussian release."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from dpgate.errors import InvalidArgument
from dpgate.inference import ErrorLaw, IncrementalBLUE, minimal_scale, single_release_scale
from dpgate.inference._law import halfwidths


@pytest.mark.parametrize("conf", [0.5, 0.8, 0.95, 0.99, 0.999999])
def test_all_gaussian_is_normal_in_closed_form(conf: float) -> None:
    law = ErrorLaw([1.0, -2.0, 0.5], [3.0, 1.0, 4.0], gaussian=[True, True, True])
    sd = math.sqrt(9.0 + 4.0 + 4.0)
    assert law.variance == pytest.approx(sd**2)
    z = norm.isf((1 - conf) / 2)
    assert law.halfwidth(conf) == pytest.approx(sd * z, rel=1e-11)
    assert law.halfwidth(conf) >= sd * z
    assert float(law.cdf(1.3)) == pytest.approx(norm.cdf(1.3 / sd), abs=1e-14)
    assert float(law.pdf(0.7)) == pytest.approx(norm.pdf(0.7 / sd) / sd, rel=1e-12)
    assert float(law.ppf(0.9)) == pytest.approx(sd * norm.ppf(0.9), rel=1e-10)
    assert law.n_terms == 3


def test_discrete_gaussian_terms_are_widened_by_their_lattice() -> None:
    law = ErrorLaw([1.0, 2.0], [3.0, 1.0], lattice=[0.01, 0.02], gaussian=[True, True])
    base = ErrorLaw([1.0, 2.0], [3.0, 1.0], gaussian=[True, True])
    assert law.halfwidth(0.95) == pytest.approx(base.halfwidth(0.95) + 0.01 + 0.04, rel=1e-12)


def _mixture_abs_cdf(b: float, s: float, q: float) -> float:
    """P(|L + N| ≤ q) for L ~ Laplace(b), N ~ N(0, s²), by numerical convolution."""
    f = lambda x: 0.5 / b * math.exp(-abs(x) / b) * (norm.cdf((q - x) / s) - norm.cdf((-q - x) / s))  # noqa: E731
    return integrate.quad(f, -60 * b, 60 * b, limit=400, points=[0.0])[0]


@pytest.mark.parametrize(("b", "s"), [(1.0, 2.0), (2.0, 0.5), (1.0, 1.0), (5.0, 0.01), (0.01, 3.0)])
@pytest.mark.parametrize("conf", [0.8, 0.95, 0.99])
def test_mixture_halfwidth_is_certified_and_tight(b: float, s: float, conf: float) -> None:
    law = ErrorLaw([1.0, 1.0], [b, s], gaussian=[False, True])
    assert law.variance == pytest.approx(2 * b * b + s * s)
    q = law.halfwidth(conf)
    p = _mixture_abs_cdf(b, s, q)
    assert p >= conf - 1e-8
    assert _mixture_abs_cdf(b, s, q * (1 - 1e-6)) <= conf + 1e-6  # not much wider than needed
    x = 0.6 * q
    assert float(law.cdf(x)) == pytest.approx(0.5 + 0.5 * _mixture_abs_cdf(b, s, x), abs=1e-8)


def test_mixture_of_many_terms_against_monte_carlo() -> None:
    c = [1.0, 0.5, -0.7, 1.2, 0.3]
    sc = [1.0, 2.0, 1.5, 0.8, 3.0]
    gm = [False, True, False, True, True]
    exact = ErrorLaw(c, sc, gaussian=gm)
    mc = ErrorLaw(c, sc, gaussian=gm, method="montecarlo", samples=400_000, rng=3)
    for conf in (0.8, 0.95, 0.99):
        assert exact.halfwidth(conf) == pytest.approx(mc.halfwidth(conf), rel=0.02)
    assert mc.variance == pytest.approx(exact.variance)
    draws = mc._samples()[0]
    assert float(np.var(draws)) == pytest.approx(exact.variance, rel=0.02)


def test_negligible_laplace_next_to_a_gaussian() -> None:
    law = ErrorLaw([1.0, 1e-17], [2.0, 1.0], gaussian=[True, False])
    assert law.halfwidth(0.95) == pytest.approx(2.0 * norm.isf(0.025), rel=1e-9)
    assert law.halfwidth(0.95) >= 2.0 * norm.isf(0.025)


def test_pure_laplace_laws_are_unchanged_by_a_false_mask() -> None:
    a = ErrorLaw([1.0, 0.5], [2.0, 3.0], lattice=[0.01, 0.0])
    b = ErrorLaw([1.0, 0.5], [2.0, 3.0], lattice=[0.01, 0.0], gaussian=[False, False])
    assert a.halfwidth(0.95) == b.halfwidth(0.95) and a.variance == b.variance


def test_halfwidths_memo_tells_families_apart() -> None:
    laws = [ErrorLaw([1.0, 1.0], [2.0, 2.0]), ErrorLaw([1.0, 1.0], [2.0, 2.0], gaussian=[False, True])]
    w = halfwidths(laws, 0.95)
    assert w[0] == laws[0].halfwidth(0.95) and w[1] == laws[1].halfwidth(0.95) and w[0] != w[1]


def test_gaussian_terms_refuse_the_convolution_method() -> None:
    with pytest.raises(InvalidArgument, match="convolution"):
        ErrorLaw([1.0], [1.0], method="convolution", gaussian=[True])
    with pytest.raises(InvalidArgument):
        ErrorLaw([1.0, 1.0], [1.0, 1.0], gaussian=[True])


def test_blue_weighs_gaussian_rows_by_their_variance() -> None:
    st = IncrementalBLUE(np.array([1.0]))
    st.append([1.0], 2.0, 10.0)  # Laplace b = 2: variance 8
    st.append([1.0], 2.0, 20.0, gaussian=True)  # Gaussian σ = 2: variance 4
    est = st.estimate([1.0])
    assert est.value == pytest.approx((10 / 8 + 20 / 4) / (1 / 8 + 1 / 4))
    assert est.variance == pytest.approx(1 / (1 / 8 + 1 / 4))
    law = est.posterior.law
    assert list(law.gaussian) == [False, True] and list(law.scales) == pytest.approx([2.0, 2.0])
    assert list(st.gaussian) == [False, True]
    # the same through extend, and a copy keeps the marks
    st2 = IncrementalBLUE(np.array([1.0]))
    st2.extend(np.array([[1.0], [1.0]]), [2.0, 2.0], [10.0, 20.0], gaussian=[False, True])
    assert st2.estimate([1.0]).value == pytest.approx(est.value) and list(st2.copy().gaussian) == [False, True]


@pytest.mark.parametrize("conf", [0.8, 0.95, 0.99])
def test_gaussian_scale_searches_meet_the_target(conf: float) -> None:
    sigma = single_release_scale(10.0, conf, gaussian=True)
    assert sigma is not None
    z = norm.isf((1 - conf) / 2)
    assert sigma == pytest.approx(10.0 / z, rel=1e-3) and sigma * z <= 10.0 * (1 + 1e-12)
    st = IncrementalBLUE(np.array([1.0, 1.0]))
    st.append([1.0, 0.0], 3.0, 5.0)  # an old Laplace release
    st.append([1.0, 1.0], 4.0, 9.0, gaussian=True)
    for h_new in ([1.0, 0.0], [0.0, 1.0]):
        s = minimal_scale(st, [1.0, 0.0], h_new, 4.0, conf, gaussian=True)
        if s is None:  # only when even an exact new answer cannot help enough
            exact = st.copy()
            exact.append(h_new, 1e-9, 0.0, gaussian=True)
            assert h_new == [0.0, 1.0] and exact.estimate([1.0, 0.0]).halfwidth(conf) > 4.0
            continue
        assert math.isfinite(s)
        trial = st.copy()
        trial.append(h_new, s, 0.0, gaussian=True)
        assert trial.estimate([1.0, 0.0]).halfwidth(conf) <= 4.0 * (1 + 1e-9)
        wider = st.copy()
        wider.append(h_new, s * 1.01, 0.0, gaussian=True)
        assert wider.estimate([1.0, 0.0]).halfwidth(conf) > 4.0
