"""What the model-based estimators read: the released history of one table, on atoms.

Everything here is *public* or *already released*: query vectors (public
structure), noisy answers, noise scales, the declared schema and its optional
public row count.  No data is read, no budget is spent.

Geometry.  Both estimators of Chen, Zhou & Bhowmick, "Integrating Historical
Noisy Answers for Improving Data Utility under Differential Privacy" (EDBT 2016)
work with a prior ``p₀`` over the table's cells (uniform by default).  On atoms,
``p₀`` becomes one *mass* per atom (the prior probability of the atom's cells),
so the paper's inner product
``⟨q₁, q₂⟩ = Σ_t p₀(t) q₁(t) q₂(t)`` (Eq. 18) is ``Σ_j mass_j q₁_j q₂_j`` over atoms —
exact, because every history query is constant on each atom.  The prior is a
product of per-column cell probabilities (Eq. 19), so an atom's mass is a sum of
products of slab masses over the grid boxes it holds; it never needs the full domain.

Prior from noisy 1-D marginals (Chen, Zhou & Bhowmick (2016), §3.4).  For every column that some
released query depends on *alone* (e.g. ``GROUP BY age`` or ``age < 30``), the
released answers of those queries are fitted by non-negative least squares over the
column's slabs (weights ``1/σ``; the public row count as an extra equation when
declared), spread uniformly inside each slab and mixed with 0.1 % of the uniform
distribution so that no cell has probability 0 (the paper's footnote 3: negative
answers are truncated).  Columns without such queries stay uniform.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.errors import InvalidRequirement
from dpgate.plan.atoms import AtomPartition
from dpgate.schema.domains import Table

if TYPE_CHECKING:
    from dpgate.plan.state import TableView

__all__ = ["History", "history_of", "atom_mass", "box_mass", "fit_marginals", "noise_variance"]

#: Share of the uniform distribution mixed into a fitted marginal (no zero cells).
UNIFORM_MIX = 1e-3


@dataclass(frozen=True)
class History:
    """One table's released history on its atoms (copies; safe outside the gateway lock).

    Attributes:
        table: the declared table.
        atoms: the atom partition of the gateway's view (a snapshot).
        H: ``m × n`` query weights over atoms, in release order (read-only).
        values: the ``m`` released noisy answers.
        scales: Laplace scales ``b_i``.
        variances: noise variances (discrete Laplace on its lattice; ``2b²`` in the limit).
        sensitivities: ``S_i = max|q_i|``.
        queries: the released linear queries (from the ledger), same order.
        total: the public row count (``Table.rows``) or ``None``.
        blue_total: the BLUE of the row count from history when it is estimable
            (a noisy estimate, never the public count), else ``None``.
    """

    table: Table
    atoms: AtomPartition
    H: np.ndarray
    values: np.ndarray
    scales: np.ndarray
    variances: np.ndarray
    sensitivities: np.ndarray
    queries: tuple[LinearQuery, ...]
    total: float | None
    blue_total: float | None = None

    @property
    def m(self) -> int:
        """Number of released answers."""
        return int(self.values.size)


def noise_variance(scales: np.ndarray, lattice: np.ndarray) -> np.ndarray:
    """Variance of dpgate's noise: ``γ²·2r/(1−r)²`` with ``r = e^{−γ/b}`` (``2b²`` when γ = 0)."""
    b = np.asarray(scales, dtype=float)
    g = np.asarray(lattice, dtype=float)
    out = 2.0 * b**2
    disc = g > 0
    if np.any(disc):
        r = np.exp(-g[disc] / b[disc])
        out[disc] = g[disc] ** 2 * 2.0 * r / (-np.expm1(-g[disc] / b[disc])) ** 2
    return out


def history_of(view: TableView) -> History:
    """The model's reading of a table's history, from the gateway's frozen view.

    Take the view with the gateway's ``locked_view(table, queries)``
    (:class:`~dpgate.plan.seam.GatewaySeam`) so that the queries to answer are
    constant on its atoms.
    """
    t = view.table
    blue_total = None
    if view.m:
        est = view.estimate(np.ones(view.atoms.n_atoms))
        blue_total = float(est.value) if est.estimable else None
    return History(
        t,
        view.atoms,
        view.rows,
        view.values,
        view.scales,
        noise_variance(view.scales, view.lattice),
        view.sensitivities,
        view.queries,
        None if t.rows is None else float(t.rows),
        blue_total,
    )


# ----------------------------------------------------------------------------- prior


def _slab_masses(table: Table, col: str, bp: Sequence[int], marginals: Mapping[str, np.ndarray]) -> np.ndarray:
    c = table.column(col)
    edges = np.append(np.asarray(bp, dtype=np.int64), c.n_cells)
    p = marginals.get(c.name)
    if p is None:
        return np.diff(edges).astype(float) / c.n_cells
    cum = np.concatenate([[0.0], np.cumsum(p)])
    return cum[edges[1:]] - cum[edges[:-1]]


def box_mass(table: Table, atoms: AtomPartition, marginals: Mapping[str, np.ndarray]) -> np.ndarray:
    """Prior mass of every grid box of ``atoms`` (shape of ``atoms.labels``; sums to 1)."""
    box = np.ones((), dtype=float)
    for c, bp in zip(atoms.columns, atoms.breakpoints, strict=True):
        box = np.multiply.outer(box, _slab_masses(table, c, bp, marginals))
    return box


def atom_mass(table: Table, atoms: AtomPartition, marginals: Mapping[str, np.ndarray]) -> np.ndarray:
    """Prior mass of every atom (sums to 1): the product prior summed over the atom's cells."""
    if not marginals:
        return atoms.cell_sizes / float(table.n_cells)
    box = box_mass(table, atoms, marginals)
    return np.bincount(atoms.labels.ravel(), weights=np.ravel(box), minlength=atoms.n_atoms)


def check_marginals(table: Table, prior: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validate user-given per-column cell probabilities (``{column: array over its cells}``)."""
    out: dict[str, np.ndarray] = {}
    for name, p in prior.items():
        c = table.column(name)
        arr = np.asarray(p, dtype=float)
        if arr.shape != (c.n_cells,) or not np.all(np.isfinite(arr)) or np.any(arr < 0) or arr.sum() <= 0:
            raise InvalidRequirement(
                f"prior for column {c.name!r} must be {c.n_cells} non-negative finite numbers (one per cell, "
                f"in schema cell order, NULL last), got shape {arr.shape}."
            )
        arr = arr / arr.sum()
        out[c.name] = (1 - UNIFORM_MIX) * arr + UNIFORM_MIX / c.n_cells
    return out


def fit_marginals(hist: History, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-column cell probabilities fitted to the released 1-D queries among ``rows``.

    Only queries whose weight depends on exactly one column are used; columns with
    none are left out (uniform).
    """
    from scipy.optimize import lsq_linear

    idx = np.arange(hist.m) if rows is None else np.asarray(rows)
    by_col: dict[str, list[int]] = {}
    for i in idx.tolist():
        q = hist.queries[i]
        if len(q.columns) == 1:
            by_col.setdefault(hist.table.column(q.columns[0]).name, []).append(i)
    out: dict[str, np.ndarray] = {}
    for name, rs in by_col.items():
        c = hist.table.column(name)
        bps = sorted({0, *(b for i in rs for b in hist.queries[i].breakpoints[0])})
        edges = np.append(np.asarray(bps, dtype=np.int64), c.n_cells)
        width = np.diff(edges).astype(float)
        A = np.zeros((len(rs), len(bps)))
        for k, i in enumerate(rs):
            q = hist.queries[i]
            slab = np.searchsorted(np.asarray(q.breakpoints[0]), edges[:-1], side="right") - 1
            A[k] = q.weights[slab]
        sd = np.sqrt(hist.variances[rs])
        A_w, y_w = A / sd[:, None], hist.values[rs] / sd
        total = hist.total
        if total is not None:  # the public count as a (very precise) equation
            A_w = np.vstack([A_w, 1e3 * np.ones(len(bps)) / max(sd.min(), 1e-9)])
            y_w = np.append(y_w, 1e3 * total / max(sd.min(), 1e-9))
        # A weak pull towards a flat density fixes the slabs no query separates.
        level = total if total is not None else max(float(np.abs(hist.values[rs]).max()), 1.0)
        ridge = 1e-3 / max(float(sd.max()), 1e-9)
        A_w = np.vstack([A_w, ridge * np.diag(1.0 / width)])
        y_w = np.append(y_w, ridge * np.full(len(bps), level / c.n_cells))
        sol = lsq_linear(A_w, y_w, bounds=(0.0, np.inf), method="bvls" if len(bps) <= 2000 else "trf")
        x = np.maximum(sol.x, 0.0)
        if not math.isfinite(float(x.sum())) or x.sum() <= 0:
            continue
        p = np.repeat(x / width, width.astype(np.int64))
        p = p / p.sum()
        out[c.name] = (1 - UNIFORM_MIX) * p + UNIFORM_MIX / c.n_cells
    return out
