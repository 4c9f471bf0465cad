"""Synthetic rows from the maximum-entropy model.

The sampler of Chen, Zhou & Bhowmick, "Integrating Historical Noisy Answers for
Improving Data Utility under Differential Privacy" (EDBT 2016), §4.2, last paragraph.

Sampling is post-processing of the fitted model (released answers only), so it
spends no budget and needs no secure randomness; ``seed`` makes it reproducible.

Exact fit — each row: an atom is drawn from ``p_w``; within it a grid box with probability
proportional to its prior mass; within the box one cell per column, proportional
to the column's prior (uniform unless a marginal prior is in use), over the box's
slab for grid columns and over the whole column otherwise.  Stochastic fit
(:class:`~dpgate.model.gibbs.GibbsFit`) — rows of cells are taken from its
Metropolis-within-Gibbs chains at the fitted weights, thinned (approximate draws from
``p_w``; ``attrs["dpgate"]["sampler"] == "gibbs"``).  Then one concrete value per cell:

=============  =============================================================
cell           value emitted
=============  =============================================================
integer        the integer (dtype ``Int64``)
binned         a value drawn uniformly inside the half-open bin — an integer
               when the column declares integer ``min``/``max`` (``Int64``),
               else a float (``float64``)
categorical    the category string; the out-of-domain cell gives the literal
               ``"<other>"`` (:data:`dpgate.schema.domains.OTHER_LABEL`, only when the
               column declares ``other: true``), which is not a declared value,
               so it maps back to the ``other`` cell (object dtype)
boolean        ``False`` / ``True`` (dtype ``boolean``)
NULL cell      a missing value (``pd.NA`` / ``None`` / ``NaN``; only when the
               column declares ``nullable: true``)
=============  =============================================================

Rows are drawn from the model *conditioned on declared values*: a column emits NULL
only when it declares ``nullable: true``, and ``"<other>"`` only when it declares
``other: true`` (the values ``GROUP BY`` emits, :meth:`dpgate.schema.domains.Column.group_cells`).
Exact fit: the box probabilities are multiplied by the declared share of each box and
cells are drawn among declared cells only; stochastic fit: rows with an undeclared
cell are redrawn.

Reading the frame back through the same schema therefore reproduces exactly the
sampled cells.  Under the uniform prior a column no released query mentions is
uniform over its declared cells: nothing released says otherwise.  (Release 1-D
marginals, or pass ``prior=``, to inform it.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgate.errors import DPGateInternalError, NotEstimable
from dpgate.model._released import History, box_mass
from dpgate.schema.domains import OTHER_LABEL, Column, Table

__all__ = ["sample_frame"]


def _cells_in(rng: np.random.Generator, start: np.ndarray, end: np.ndarray, p: np.ndarray | None) -> np.ndarray:
    """One cell in each ``[start, end)``, uniform or proportional to ``p``."""
    u = rng.random(start.size)
    if p is None:
        return np.minimum(start + np.floor(u * (end - start)).astype(np.int64), end - 1)
    # Only cells of positive weight can be drawn (zero-weight ones are undeclared): index those.
    idx = np.flatnonzero(p > 0)
    cum = np.concatenate([[0.0], np.cumsum(p[idx])])
    lo, hi = np.searchsorted(idx, start), np.searchsorted(idx, end)
    target = cum[lo] + u * (cum[hi] - cum[lo])
    k = np.clip(np.searchsorted(cum, target, side="right") - 1, lo, np.maximum(hi - 1, lo))
    return idx[np.minimum(k, len(idx) - 1)]


#: Rounds of redrawing a stochastic fit's rows with undeclared cells before giving up.
_MAX_REDRAWS = 64
_NO_DECLARED_MASS = (
    "the model puts (almost) no probability on rows whose every value is declared: the released answers "
    "say most rows hold NULL or undeclared values; declare them (nullable: true, other: true) to synthesize them."
)


def _declared_weights(col: Column, marginals: dict[str, np.ndarray]) -> np.ndarray | None:
    """Per-cell sampling weights of ``col`` restricted to its declared cells (None: uniform, all declared)."""
    mask = col.declared_cells()
    p = marginals.get(col.name)
    if p is None:
        return None if mask.all() else mask.astype(float)
    return p * mask


def _declared_share(t: Table, atoms: Any, marginals: dict[str, np.ndarray]) -> np.ndarray:
    """For every grid box, the share of its prior mass on cells every column declares."""
    share = np.ones(())
    for c, bp in zip(atoms.columns, atoms.breakpoints, strict=True):
        col = t.column(c)
        full = marginals.get(col.name)
        full = np.ones(col.n_cells) if full is None else full
        starts = np.asarray(bp, dtype=np.int64)
        declared = np.add.reduceat(full * col.declared_cells(), starts)
        total = np.add.reduceat(full, starts)
        share = np.multiply.outer(share, np.divide(declared, total, out=np.zeros_like(total), where=total > 0))
    return share


def _masked(values: np.ndarray, null: np.ndarray, dtype: str) -> Any:
    import pandas as pd

    arr = pd.array(values, dtype=dtype)
    arr[null] = pd.NA
    return arr


def _values(col: Column, cells: np.ndarray, rng: np.random.Generator) -> Any:
    null = cells == col.null_cell
    if col.kind == "integer":
        return _masked(np.where(null, 0, col.min + cells), null, "Int64")
    if col.kind == "boolean":
        return _masked(np.where(null, False, cells == 1), null, "boolean")
    if col.kind == "categorical":
        labels = np.array([*col.values, OTHER_LABEL, None], dtype=object)
        return labels[cells]
    if col.kind in ("date", "timestamp"):  # a granule's first instant
        return np.array(col.labels(), dtype=object)[cells]
    # binned
    e = np.asarray(col.edges, dtype=float)
    k = np.minimum(cells, len(e) - 2)
    lo_e, hi_e = e[k], e[k + 1]
    u = rng.random(cells.size)
    if col.min is not None:
        lo = np.ceil(lo_e)
        hi = np.ceil(hi_e) - 1
        clo, chi = np.maximum(lo, col.min), np.minimum(hi, col.max)  # type: ignore[arg-type]
        lo, hi = np.where(clo <= chi, clo, lo), np.where(clo <= chi, chi, hi)
        if np.all(lo[~null] <= hi[~null]):
            v = lo + np.floor(u * (hi - lo + 1))
            v = np.minimum(v, hi)
            return _masked(np.where(null, 0, v).astype(np.int64), null, "Int64")
    v = lo_e + u * (hi_e - lo_e)
    v = np.minimum(v, np.nextafter(hi_e, -np.inf))
    return np.where(null, np.nan, v)


def _row_count(hist: History, model: Any, rows: int | None) -> tuple[int, str]:
    t = hist.table
    if rows is not None:
        return int(rows), "argument"
    if t.rows is not None:
        return int(t.rows), "public (Table.rows)"
    return int(round(model.total)), "estimated: " + str(model.info.get("total_source", "model total"))


def _frame(data: dict[str, Any], info: dict[str, Any], n: int, source: str, seed: int | None, **extra: Any) -> Any:
    """The DataFrame of the columns' values; the fit's ``info`` and the draw's facts in ``attrs["dpgate"]``."""
    import pandas as pd

    df = pd.DataFrame(data)
    meta = {k: v for k, v in info.items() if k != "cv_curve"}
    meta.update(source="model", method="maxent", epsilon_spent=0.0, rows=n, rows_source=source, seed=seed,
                other_label=OTHER_LABEL, declared_values_only=True, **extra)
    df.attrs["dpgate"] = meta
    return df


def sample_frame(
    hist: History,
    p: np.ndarray,
    mass: np.ndarray,
    marginals: dict[str, np.ndarray],
    model: Any,
    rows: int | None,
    seed: int | None,
    info: dict[str, Any],
) -> Any:
    """A pandas DataFrame of synthetic rows with the table's schema (see the module docstring)."""
    t, atoms = hist.table, hist.atoms
    n, source = _row_count(hist, model, rows)
    if not math.isfinite(float(p.sum())):
        raise DPGateInternalError("the model's probabilities are not finite")
    rng = np.random.default_rng(seed)
    labels = atoms.labels.ravel()
    box = np.ravel(box_mass(t, atoms, marginals)) if marginals else None
    if box is None:
        sizes = np.ones(())
        for c, bp in zip(atoms.columns, atoms.breakpoints, strict=True):
            sizes = np.multiply.outer(sizes, np.diff(np.append(bp, t.column(c).n_cells)).astype(float))
        box = np.ravel(sizes)
    within = np.zeros(atoms.n_atoms)
    np.add.at(within, labels, box)
    p_box = p[labels] * box / within[labels] * np.ravel(_declared_share(t, atoms, marginals))
    p_box = np.maximum(p_box, 0.0)
    if not p_box.sum() > 0:
        raise NotEstimable(_NO_DECLARED_MASS)
    p_box /= p_box.sum()
    picks = rng.choice(p_box.size, size=n, p=p_box) if n else np.zeros(0, dtype=np.int64)
    shape = tuple(len(b) for b in atoms.breakpoints)
    coords = np.unravel_index(picks, shape) if shape else ()
    grid = {c.lower(): (k, bp) for k, (c, bp) in enumerate(zip(atoms.columns, atoms.breakpoints, strict=True))}
    data = {}
    for col in t.columns:
        if col.name.lower() in grid:
            k, bp = grid[col.name.lower()]
            edges = np.append(np.asarray(bp, dtype=np.int64), col.n_cells)
            start, end = edges[coords[k]], edges[coords[k] + 1]
        else:
            start, end = np.zeros(n, dtype=np.int64), np.full(n, col.n_cells, dtype=np.int64)
        cells = _cells_in(rng, start, end, _declared_weights(col, marginals))
        data[col.name] = _values(col, cells, rng)
    return _frame(data, info, n, source, seed)


def sample_frame_gibbs(hist: History, model: Any, rows: int | None, seed: int | None, info: dict[str, Any]) -> Any:
    """Like :func:`sample_frame` for a stochastic fit: rows drawn from its Gibbs chains (thinned).

    ``model`` is a :class:`dpgate.model.gibbs.GibbsFit`; its chains restart from its
    stored draws and are run at its weights (see :meth:`~dpgate.model.gibbs.GibbsFit.sample_cells`),
    so the rows are approximate draws from ``p_w`` and successive rows of one chain are
    mildly dependent.
    """
    n, source = _row_count(hist, model, rows)
    rng = np.random.default_rng(seed)
    masks = [col.declared_cells() for col in hist.table.columns]
    kept: list[np.ndarray] = []
    have = 0
    for _ in range(_MAX_REDRAWS):  # rejection: rows with an undeclared cell are drawn again
        if have >= n:
            break
        draw = model.sample_cells(n, rng)
        ok = np.ones(len(draw), dtype=bool)
        for k, mask in enumerate(masks):
            ok &= mask[draw[:, k]]
        kept.append(draw[ok])
        have += int(ok.sum())
    if have < n:
        raise NotEstimable(_NO_DECLARED_MASS)
    cells = np.concatenate(kept)[:n] if kept else np.zeros((0, len(masks)), dtype=np.int64)
    data = {col.name: _values(col, cells[:, k], rng) for k, col in enumerate(hist.table.columns)}
    return _frame(data, info, n, source, seed, sampler="gibbs")
