"""The stochastic-gradient / Gibbs-sampling fit of the maximum-entropy model.

From Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for Improving
Data Utility under Differential Privacy" (EDBT 2016), §4.2.

Used by :mod:`dpgate.model.maxent` beyond ``max_atoms`` atoms (or with
``solver="sgd"``); see that module for the model and the dual it solves, and
:func:`fit_sgd` for the algorithm.  Post-processing of released answers only:
the randomness here is a seeded numpy generator, not a secure source, because
nothing it touches is private.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.schema.domains import Table

__all__ = ["GibbsFit", "fit_sgd", "kkt_violation", "SGD_CHAINS", "SGD_TOL"]

#: Stochastic fit: independent Gibbs chains (the batch behind each gradient step).
SGD_CHAINS = 1024
#: First convergence checkpoint; later ones double (Polyak average over the last half).
SGD_MIN_ITER = 400
#: The stochastic fit's step decays like ``1/t`` from this iteration on (quiets the iterates).
SGD_DECAY_FROM = 800
#: Iteration cap of the stochastic fit.
SGD_MAX_ITER = 6400
#: Convergence: KKT residual below this fraction of each answer's noise scale b_i/(N·S_i).
SGD_TOL = 0.5
#: Monte Carlo sample of the fitted model: burn-in sweeps, draws per chain, sweeps between draws.
MC_BURN, MC_DRAWS, MC_THIN = 50, 100, 5
#: Largest (grid boxes × (queries + 1)²) searched for exact dependencies among queries on the same columns.
NULL_MAX_GRID = 1 << 26
#: Largest per-column lookup table (cells' slab → index contributions) of the stochastic fit.
LUT_MAX = 1 << 22
#: Synthetic rows contributed by one chain at most (more rows: more chains).
SYNTH_DRAWS = 25


class _Features:
    """Linear queries as functions of rows of cells, ``f_i(t) = q_i(t) / scale_i`` (no product grid).

    Each query's weights are flattened into one array ``flat`` (query ``i`` at
    ``offsets[i]``); a row's flat index for query ``i`` is ``offsets[i]`` plus, for each
    column the query reads, the stride-weighted index of the row's slab.  Per column,
    with ``L`` the union of the queries' slab starts on it and ``m_k`` the queries that
    read it, an ``m_k × L`` table gives those contributions after one ``searchsorted``
    of the cells; when that table would exceed :data:`LUT_MAX` entries, the queries'
    slab starts are instead concatenated into one sorted key array ``j·n_cells + start``
    and searched per (query, row).  Memory is the size of the queries themselves.
    """

    def __init__(self, table: Table, queries: Sequence[LinearQuery], scales: np.ndarray) -> None:
        self.m = len(queries)
        sizes = [int(q.numerators.size) for q in queries]
        self.offsets = np.cumsum([0, *sizes])[:-1].astype(np.int64)
        self.flat = np.concatenate(
            [np.ravel(q.numerators) / (q.denominator * float(s)) for q, s in zip(queries, scales, strict=True)] or [np.zeros(0)])
        per_col: dict[int, list[tuple[int, np.ndarray, int]]] = {}
        for i, q in enumerate(queries):
            shape = q.numerators.shape
            for a, (c, bp) in enumerate(zip(q.columns, q.breakpoints, strict=True)):
                per_col.setdefault(table.axis(c), []).append((i, np.asarray(bp, np.int64), math.prod(shape[a + 1:])))
        self.cols = tuple(sorted(per_col))
        self.users: dict[int, np.ndarray] = {}
        self._grid: dict[int, np.ndarray] = {}
        self._lut: dict[int, np.ndarray] = {}
        self._keys: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for ax, entries in per_col.items():
            self.users[ax] = np.array([i for i, _, _ in entries], dtype=np.int64)
            grid = np.unique(np.concatenate([bp for _, bp, _ in entries]))
            if grid.size * len(entries) <= LUT_MAX:
                self._grid[ax] = grid
                self._lut[ax] = np.stack(
                    [st * (np.searchsorted(bp, grid, side="right") - 1) for _, bp, st in entries])
            else:
                n = table.columns[ax].n_cells
                self._keys[ax] = (np.arange(len(entries), dtype=np.int64) * n,
                                  np.concatenate([j * n + bp for j, (_, bp, _) in enumerate(entries)]),
                                  np.concatenate([st * np.arange(len(bp), dtype=np.int64) for _, bp, st in entries]))

    def part(self, ax: int, cells: np.ndarray) -> np.ndarray:
        """Column ``ax``'s share of the flat index, ``(len(users[ax]), len(cells))``."""
        if ax in self._lut:
            return self._lut[ax][:, np.searchsorted(self._grid[ax], cells, side="right") - 1]
        shift, keys, contrib = self._keys[ax]
        return contrib[np.searchsorted(keys, shift[:, None] + cells[None, :], side="right") - 1]

    def index(self, rows: np.ndarray) -> np.ndarray:
        """Flat weight index of every (query, row): ``(m, len(rows))``."""
        out = np.repeat(self.offsets[:, None], len(rows), axis=1)
        for ax in self.cols:
            out[self.users[ax]] += self.part(ax, rows[:, ax])
        return out

    def values(self, rows: np.ndarray) -> np.ndarray:
        """``f_i(t)`` for every query and row, ``(m, len(rows))``."""
        return self.flat[self.index(rows)]


class _Chains:
    """Independent Metropolis-within-Gibbs chains over rows of cells, targeting ``p_w ∝ p₀·exp(w·f)``.

    A sweep visits each column some query reads and proposes a new cell from the
    prior's marginal of that column; the prior cancels in the Hastings ratio, which is
    ``exp(Σ_{i reads the column} w_i (f_i(new) − f_i(old)))`` — only those features are
    evaluated (§4.2).  Columns no query reads are independent of the rest under ``p_w``
    and distributed as the prior, so they are drawn afresh when rows are emitted.

    ``rows``: the chains' starting rows of cells, or their number (then drawn from ``p₀``,
    the exact target at ``w = 0``).
    """

    def __init__(self, feats: _Features, table: Table, marginals: Mapping[str, np.ndarray],
                 rows: np.ndarray | int, rng: np.random.Generator) -> None:
        self.feats, self.rng = feats, rng
        self._n_cells = [c.n_cells for c in table.columns]
        self._cum = {ax: np.cumsum(marginals[c.name]) for ax, c in enumerate(table.columns) if c.name in marginals}
        if isinstance(rows, (int, np.integer)):
            rows = np.stack([self._prior(ax, int(rows)) for ax in range(len(self._n_cells))], axis=1)
        self.rows = np.array(rows, dtype=np.int64)
        self.idx = feats.index(self.rows)
        self.val = feats.flat[self.idx]
        self.parts = {ax: feats.part(ax, self.rows[:, ax]) for ax in feats.cols}

    def _prior(self, ax: int, size: int) -> np.ndarray:
        """``size`` cells of column ``ax`` from the prior ``p₀`` (uniform unless a marginal is given)."""
        cum = self._cum.get(ax)
        if cum is None:
            return self.rng.integers(0, self._n_cells[ax], size)
        return np.minimum(np.searchsorted(cum, self.rng.random(size) * cum[-1], side="right"), cum.size - 1)

    def sweep(self, w: np.ndarray) -> None:
        """One Metropolis–Hastings update of every column some query reads, in every chain."""
        f, b = self.feats, len(self.rows)
        for ax in f.cols:
            users = f.users[ax]
            prop = self._prior(ax, b)  # proposal q = p₀'s marginal: cancels against p₀ in the ratio
            new_part = f.part(ax, prop)
            old, old_val = self.idx[users], self.val[users]
            new = old + (new_part - self.parts[ax])
            new_val = f.flat[new]
            acc = np.log(self.rng.random(b)) < w[users] @ (new_val - old_val)
            self.rows[:, ax] = np.where(acc, prop, self.rows[:, ax])
            self.idx[users] = np.where(acc, new, old)
            self.val[users] = np.where(acc, new_val, old_val)
            self.parts[ax] = np.where(acc, new_part, self.parts[ax])

    def features(self) -> np.ndarray:
        """``f_i`` of the current rows, ``(m, chains)`` (read-only use)."""
        return self.val

    def emit(self) -> np.ndarray:
        """The current rows, with the columns no query reads drawn from the prior."""
        out = self.rows.copy()
        for ax in range(len(self._n_cells)):
            if ax not in self.feats.users:
                out[:, ax] = self._prior(ax, len(out))
        return out


class _NullSpace:
    """Exact linear dependencies among the features, ``n·f(t) = c`` for every cell ``t``.

    Along such a direction ``p_w`` does not change and the dual is linear, with slope
    ``n·π − c`` — the answers' inconsistency (e.g. the groups of a released GROUP BY,
    NULL and ``other`` included, that do not sum to ``N``; or a query released twice).
    Stochastic gradient would creep along it at that tiny rate towards the box's
    boundary, where the exact optimum lies; :meth:`walk` goes there in closed form.
    Dependencies are sought among queries over the same set of columns, on the union of
    their slab grids (skipped when that is larger than :data:`NULL_MAX_GRID` boxes).
    """

    def __init__(self, table: Table, queries: Sequence[LinearQuery], scales: np.ndarray) -> None:
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, q in enumerate(queries):
            groups.setdefault(tuple(c.lower() for c in q.columns), []).append(i)
        self.blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (members, rows n, constants c)
        for idx in groups.values():
            cols = queries[idx[0]].columns
            bps = [sorted({b for i in idx for b in queries[i].breakpoints[k]}) for k in range(len(cols))]
            if (len(idx) < 2 and cols) or math.prod(map(len, bps)) * (len(idx) + 1) ** 2 > NULL_MAX_GRID:
                continue
            F = np.stack([np.ravel(queries[i].expand(table, cols, bps)) / (queries[i].denominator * scales[i])
                          for i in idx])
            A = np.hstack([F.T, -np.ones((F.shape[1], 1))])  # [Fᵀ, −1]·(n, c) = 0 on every grid box
            A = np.vstack([A, np.zeros((max(0, A.shape[1] - A.shape[0]), A.shape[1]))])
            _, sv, vt = np.linalg.svd(A, full_matrices=False)
            null = vt[sv <= 1e-9 * max(float(sv.max(initial=0.0)), 1.0)]
            if not len(null):
                continue
            u, sn, wt = np.linalg.svd(null[:, :-1], full_matrices=False)  # orthonormal rows n
            keep = sn > 1e-9
            rows = wt[keep]
            consts = (u[:, keep].T @ null[:, -1]) / sn[keep]
            self.blocks.append((np.asarray(idx), rows, consts))

    def walk(self, w: np.ndarray, pi: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """Maximise the dual along the null directions from ``w``: a new ``w`` with the same ``p_w``."""
        w = w.copy()
        for idx, rows, consts in self.blocks:
            x, b = w[idx], beta[idx]
            h = rows @ pi[idx] - consts  # slope of the dual along each row
            for _ in range(len(idx)):
                blocked = np.abs(x) >= b * (1 - 1e-9)
                cons = rows[:, blocked]
                a = h - cons @ np.linalg.lstsq(cons, h, rcond=None)[0] if blocked.any() else h
                d = a @ rows
                d[blocked] = 0.0
                if float(a @ h) <= 1e-24 or not np.any(d):  # a·h = |a|²: the walk's slope
                    break
                with np.errstate(divide="ignore", invalid="ignore"):
                    room = np.where(d > 0, (b - x) / d, np.where(d < 0, (-b - x) / d, np.inf))
                j = int(np.argmin(room))
                x = np.clip(x + room[j] * d, -b, b)
                x[j] = np.sign(d[j]) * b[j]
            w[idx] = x
        return w


@dataclass(frozen=True, eq=False)
class GibbsFit:
    """A Gibbs distribution ``p_w ∝ p₀ · exp(Σ w_i q_i/S_i)`` fitted by stochastic gradient (§4.2).

    Unlike :class:`MaxEntFit` it never refers to atoms: expectations are Monte Carlo
    averages over ``samples``, rows of cell indices drawn from ``p_w`` by ``chains``
    independent chains (row ``d·chains + c`` is draw ``d`` of chain ``c``).

    Attributes:
        w: dual weights (Polyak average of the iterates).
        sensitivities: ``S_i`` of the answers used.
        total: ``N``.
        info: diagnostics as for :class:`MaxEntFit` plus ``solver="sgd"``, ``chains``,
            ``mc_samples``, ``thin``, ``learning_rate``, ``seed`` and ``sgd_residual`` (the
            last checkpoint's KKT residual over its tolerance; ``converged`` iff ≤ 1);
            ``kkt_residual`` is re-estimated from the Monte Carlo sample at the final
            ``w`` (``kkt_stderr``: its standard error), in π units.
        table: the declared table.
        marginals: the prior's per-column cell probabilities (empty: uniform).
        samples: read-only ``(draws, columns)`` cells.
        chains: number of independent chains behind ``samples``.
    """

    w: np.ndarray = field(repr=False)
    sensitivities: np.ndarray = field(repr=False)
    total: float
    info: dict[str, Any]
    table: Table = field(repr=False)
    marginals: Mapping[str, np.ndarray] = field(repr=False)
    features: _Features = field(repr=False)
    samples: np.ndarray = field(repr=False)
    chains: int = 1

    def expect(self, queries: Sequence[LinearQuery]) -> tuple[np.ndarray, np.ndarray]:
        """``N · E_pw[q]`` for each query, by Monte Carlo, and its standard error.

        The standard error is from batch means over the independent chains (it accounts
        for the autocorrelation within a chain); it omits the optimisation error of ``w``.
        """
        if not len(queries):
            return np.zeros(0), np.zeros(0)
        feats = _Features(self.table, queries, np.ones(len(queries)))
        c = self.chains
        draws = len(self.samples) // c
        per_chain = np.zeros((feats.m, c))
        step = max(1, (1 << 20) // max(c * max(feats.m, 1), 1))
        for lo in range(0, draws, step):
            part = self.samples[lo * c: min(draws, lo + step) * c]
            per_chain += feats.values(part).reshape(feats.m, -1, c).sum(axis=1)
        means = per_chain / draws
        se = means.std(axis=1, ddof=1) / math.sqrt(c) if c > 1 else np.full(feats.m, math.inf)
        return self.total * means.mean(axis=1), self.total * se

    def sample_cells(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows of cells from the chain at ``w`` (thinned), in random order.

        Chains restart from stored draws (already ≈ ``p_w``), run ``thin`` sweeps to
        decorrelate, then each contributes one row every ``thin`` sweeps, at most
        :data:`SYNTH_DRAWS` rows per chain.
        """
        thin = int(self.info.get("thin", MC_THIN))
        k = max(min(n, SGD_CHAINS), -(-n // SYNTH_DRAWS), 1)
        k = min(k, max(1, (1 << 24) // max(self.features.m, 1)))
        ch = _Chains(self.features, self.table, self.marginals,
                     self.samples[rng.integers(0, len(self.samples), k)], rng)
        out = []
        for _ in range(-(-n // k)):
            for _ in range(thin):
                ch.sweep(self.w)
            out.append(ch.emit())
        cells = np.concatenate(out or [np.zeros((0, len(self.table.columns)), np.int64)])[:n]
        return cells[rng.permutation(n)]


def fit_sgd(
    table: Table,
    queries: Sequence[LinearQuery],
    values: np.ndarray,
    scales: np.ndarray,
    sensitivities: np.ndarray,
    marginals: Mapping[str, np.ndarray],
    total: float,
    alpha: float = 1.0,
    *,
    seed: int = 0,
    w0: np.ndarray | None = None,
    chains: int | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    draws: int | None = None,
) -> GibbsFit:
    """Solve the dual of Theorem 6 by stochastic gradient with Gibbs sampling (Chen, Zhou & Bhowmick (2016), §4.2).

    Same objective, features, box and prior as :func:`fit`: maximise
    ``Σ w_i π_i − ln Z_w`` over ``|w_i| ≤ β_i``.  From ``w = w0`` (default 0) each
    iteration runs one Metropolis-within-Gibbs sweep of ``chains`` (default
    :data:`SGD_CHAINS`) independent chains (:class:`_Chains`; they start as exact draws
    from ``p₀``, the target at ``w = 0``), averages ``f_i`` over the batch and steps

        ``w_i ← clip(w_i + γ (π_i − f̄_i) / v_i, −β_i, β_i)``

    — the paper's update with a per-answer rate: ``v_i`` is a running estimate of
    ``Var_pw(f_i)`` (the diagonal of the dual's Hessian, floored at ``1/chains``), so a
    rare feature moves as fast as a common one, and ``γ = 1/λ_max`` of the batch
    correlation matrix of ``f`` (power iteration, re-estimated at every checkpoint),
    times ``min(1, SGD_DECAY_FROM / t)`` to quiet the iterates late in the run.  At the
    start and at every checkpoint ``w`` also walks, in closed form, along the exact
    linear dependencies among the features (:class:`_NullSpace`), where ``p_w`` is
    constant and the dual linear, to the box's boundary: stochastic gradient alone
    would creep there at the rate of the answers' inconsistency.
    Checkpoints come at iterations :data:`SGD_MIN_ITER`·2^k; at each, ``w̄`` is the
    Polyak average of the iterates over the second half of the run so far and ``ḡ``
    the average stochastic gradient over the same iterations.  Convergence: the KKT
    residual of ``ḡ`` at ``w̄`` (:func:`kkt_violation`) is at most ``tol·b_i/(N·S_i)``
    for every answer — ``tol`` (default :data:`SGD_TOL`) is a fraction of each answer's
    Laplace scale in π units — else the run stops after ``max_iter`` (default
    :data:`SGD_MAX_ITER`) iterations with ``converged=False``.  ``ḡ`` is itself a Monte
    Carlo average, so the test is conservative.  Finally :data:`MC_BURN` sweeps at
    ``w̄``, then ``draws`` (default :data:`MC_DRAWS`) rows per chain every
    :data:`MC_THIN` sweeps, give the Monte Carlo sample behind :meth:`GibbsFit.expect`.

    The result is **approximate**: its answers carry Monte Carlo error (reported per
    query by :meth:`GibbsFit.expect`) and the optimisation error the criterion allows;
    the chains' mixing is not guaranteed (§4.2: "the convergence rate is not
    guaranteed").

    Cost per iteration ``O(chains · (Σ_k m_k + m))``, ``m_k`` the answers reading
    column ``k``, plus one ``searchsorted`` of ``chains`` cells per column — independent
    of the domain size and of the atom count; at most
    ``max_iter + MC_BURN + draws·MC_THIN`` sweeps.  Memory ``O(m · chains)`` plus the
    sample (``chains · draws`` rows) and per-column tables of the queries' slabs.

    Randomness: ``numpy.random.Generator(seed)``; this is post-processing of released
    answers, so non-cryptographic randomness is fine and the fit is reproducible.
    """
    S = np.asarray(sensitivities, dtype=float)
    sc = np.asarray(scales, dtype=float)
    pi = np.asarray(values, dtype=float) / (total * S)
    beta = alpha * total * S / sc
    tol_i = (SGD_TOL if tol is None else tol) * sc / (total * S)
    b = SGD_CHAINS if chains is None else int(chains)
    cap = SGD_MAX_ITER if max_iter is None else int(max_iter)
    n_draws = MC_DRAWS if draws is None else int(draws)
    rng = np.random.default_rng(seed)  # non-cryptographic: post-processing of released data
    feats = _Features(table, queries, S)
    ch = _Chains(feats, table, marginals, b, rng)
    m = pi.size
    w = np.zeros(m) if w0 is None else np.clip(np.asarray(w0, float), -beta, beta)
    if w0 is not None:
        for _ in range(MC_BURN):
            ch.sweep(w)
    null = _NullSpace(table, queries, S)
    w = null.walk(w, pi, beta)
    floor = 1.0 / b
    f = ch.features()
    var = f.var(axis=1)
    lr = _step(f, np.maximum(var, floor))
    w_sum, g_sum, v_sum = np.zeros(m), np.zeros(m), np.zeros(m)
    w_bar, v_bar, t, converged, resid = w.copy(), var.copy(), 0, m == 0, 0.0
    check = SGD_MIN_ITER
    while not converged and t < cap:
        ch.sweep(w)
        f = ch.features()
        g = pi - f.mean(axis=1)
        var += 0.05 * (f.var(axis=1) - var)  # running Fisher diagonal Var_pw(f_i)
        w = np.clip(w + lr * g / np.maximum(var, floor), -beta, beta)
        t += 1
        if t > check // 2:
            w_sum += w
            g_sum += g
            v_sum += var
        if t == check or t == cap:
            n_avg = max(t - check // 2, 1)
            w_bar, v_bar = w_sum / n_avg, v_sum / n_avg
            resid = float(np.max(kkt_violation(w_bar, g_sum / n_avg, beta, v_bar) / tol_i, initial=0.0))
            converged = resid <= 1.0
            lr = _step(f, np.maximum(var, floor)) * min(1.0, SGD_DECAY_FROM / t)
            w = null.walk(w, pi, beta)
            check *= 2
            w_sum[:], g_sum[:], v_sum[:] = 0.0, 0.0, 0.0
    w = w_bar
    for _ in range(MC_BURN):
        ch.sweep(w)
    rows = []
    for _ in range(n_draws):
        for _ in range(MC_THIN):
            ch.sweep(w)
        rows.append(ch.emit())
    samples = np.concatenate(rows)
    samples.setflags(write=False)
    fr = GibbsFit(w, S, float(total), {}, table, marginals, feats, samples, b)
    kkt, kkt_se = np.zeros(0), np.zeros(0)
    if m:
        est, se = fr.expect(queries)
        kkt, kkt_se = kkt_violation(w, pi - est / (total * S), beta, v_bar), se / (total * S)
    info = dict(solver="sgd", iterations=t, converged=bool(converged), sgd_residual=resid,
                kkt_residual=float(kkt.max(initial=0.0)), kkt_stderr=float(kkt_se.max(initial=0.0)),
                at_bound=int(np.sum(np.abs(w) >= beta * (1 - 1e-6))), chains=b, mc_samples=len(samples),
                thin=MC_THIN, learning_rate=float(lr), seed=seed)
    return replace(fr, info=info)


def _step(f: np.ndarray, var: np.ndarray) -> float:
    """``1 / λ_max`` of the batch correlation of the features (the preconditioned Hessian).

    Power iteration on the batch ``f`` standardised by ``var``.
    """
    if f.size == 0:
        return 1.0
    x = (f - f.mean(axis=1, keepdims=True)) / np.sqrt(var)[:, None]
    v = np.ones(len(x)) / math.sqrt(len(x))
    lam = 0.0
    for _ in range(30):
        u = x @ (x.T @ v) / x.shape[1]
        lam = float(np.linalg.norm(u))
        if lam <= 0:
            break
        v = u / lam
    return 1.0 / max(lam, 1e-3)


def kkt_violation(w: np.ndarray, g: np.ndarray, beta: np.ndarray, var: np.ndarray | None = None) -> np.ndarray:
    """Per-answer KKT violation of the box-constrained dual (π units) at ``w``.

    ``g = π − p_w[f]`` is the ascent direction.  The violation is ``|g_i|``, but 0 when
    ``w_i`` is at the bound ``g_i`` pushes it to and, given ``var = Var_pw(f_i)``, at most
    ``var_i ·`` (distance to that bound) — to first order how far ``p_w[f_i]`` would still
    move if ``w_i`` went there (Polyak averages sit just inside an active bound).
    """
    gap = beta - np.sign(g) * w  # room left in the direction g pushes
    out = np.where(gap <= beta * 1e-9, 0.0, np.abs(g))
    return out if var is None else np.minimum(out, var * gap)
