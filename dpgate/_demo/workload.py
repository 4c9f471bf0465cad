"""The online workload of Xiao & Xiong, "Bayesian Inference under Differential
Privacy" (2012), §6.4: query generation (eq. 73–74) and the unbounded setting's
hierarchical tree.  The metrics (definitions 6.1–6.3) are in
:mod:`dpgate._demo.metrics`, running a workload through a gateway in
:mod:`dpgate._demo.runner`.

The workload is a sequence of weighted counting queries over a 1-D ordered
domain of ``n`` cells (NETTRACE and SEARCHLOGS: ``n = 4096``, one row per unit,
``value`` = cell index), each with an accuracy requirement ``(ε, δ)``: the
analyst wants an interval of half-width ``ε`` that holds the truth with
probability ``1 − δ``.

Construction (Xiao & Xiong (2012), eq. 73–74), with the choices this module
makes where the paper is silent marked *[decision]*:

* **Cell probabilities (eq. 73).**  ``P_j = 0.9 · 10^(−floor((j−1)/10))`` for
  ``j = 1..n``: ten cells at 0.9, ten at 0.09, and so on — a "region of
  interest" at the start of the domain.  As printed these sum to ≈ 10, not 1;
  *[decision]* we normalise them by their sum (so each of the first ten cells
  has probability ≈ 0.09 and the first 10 cells together 0.9).  Paper cell
  ``j`` is our 0-based cell ``j − 1``.  ``roi_start`` (default 0, the paper's
  choice) rotates the region to start elsewhere; SEARCHLOGS' first ~40 cells
  are all zero, so the faithful workload mostly asks about empty cells there.
* **Queries (eq. 74).**  Draw ``n_t`` uniformly in ``1..10`` (the number of
  independent multinomial trials), then ``q ~ Multinomial(n_t, P)``.  The query
  is ``θ = Σ_j q_j x_j``: integer weights summing to ``n_t``, sensitivity
  ``S = max_j q_j``.
* **Requirements.**  ``δ = 0.2`` for every query; ``2ε ~ U[1, 1000]`` in the
  bounded setting (total budget 1), ``2ε ~ U[50, 1000]`` in the unbounded one.
  *[decision]* the query structure and a uniform ``u`` per query come from two
  independent child streams of ``seed``, and ``2ε = lo + u·(hi − lo)``, so the
  same seed gives the same queries (and the same quantile of ``ε``) in both
  settings: the settings differ only where the paper says they do.
* **Unbounded setting's history.**  A binary hierarchical tree (Hay et al.,
  Xiao & Xiong (2012)'s ref. [13]) over the ``n = 2^L`` cells: levels ``0..L``
  (root to leaves, ``L + 1 = 13`` levels for 4096 cells), every node a range
  count with ``S = 1``.  *[decision]* "0.3-differential privacy split evenly over
  levels" is read as ``α = 0.3 / (L + 1)`` per node: every cell lies in exactly
  one node per level, so the tree costs every cell exactly 0.3 under per-cell
  accounting (Theorem 5.5).  Its noisy answers are released *through the
  gateway* (:func:`dpgate._demo.runner.release_tree`), so they land in the
  ledger like any other release and the system cost α̅ includes them, for every
  system compared.
  *[decision, for run time]* by default only the nodes that intersect the first
  ``TREE_CELLS = 256`` cells of the region of interest are released (515 of the
  8191 nodes: the 511 nodes of that block's subtree and its 4 ancestors).  Every
  cell of the block still costs exactly 0.3, so ᾱ is the full tree's; the queries
  practically never leave the block (P(a trial lands beyond cell 255) ≈ 10⁻²⁵);
  and the BLUE variance of workload queries under the pruned tree is within
  0.014 % (max; mean 0.003 %) of the full tree's — computed exactly from the
  4096 × 4096 tree Gram matrix for 500 workload queries.  The full tree is a
  gateway performance problem, not a modelling choice: absorbing a release costs
  O(rank × atoms), so 4096 nodes (the tree over 2048 cells) take minutes to release
  (benchmarks/README.md, "Timings behind the code"), and with all 8191 nodes every later decision works on a 4096 × 4096 basis
  and an 8191 × 4096 coefficient matrix.
  ``tree_cells=None`` releases the full tree.

Example:
    >>> w = generate(n=4096, queries=3, setting="bounded", seed=1)
    >>> len(w.queries), w.budget, w.delta
    (3, 1.0, 0.2)
    >>> q = w.queries[0]
    >>> int(q.dense().sum()) == q.trials and q.sensitivity == max(q.weights)
    True
    >>> q.sql("nettrace").startswith("SELECT SUM(CASE")
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dpgate import _validate
from dpgate.errors import InvalidArgument, InvalidRequirement

__all__ = [
    "Setting",
    "SETTINGS",
    "DELTA",
    "MAX_TRIALS",
    "TREE_CELLS",
    "WorkloadQuery",
    "TreeNode",
    "Workload",
    "cell_probabilities",
    "generate",
    "tree_nodes",
]

Setting = Literal["bounded", "unbounded"]

#: Per setting: total budget (``inf`` = unbounded), range of ``2ε``, tree budget.
SETTINGS: dict[str, dict[str, float]] = {
    "bounded": {"budget": 1.0, "two_eps_low": 1.0, "two_eps_high": 1000.0, "tree_epsilon": 0.0},
    "unbounded": {"budget": math.inf, "two_eps_low": 50.0, "two_eps_high": 1000.0, "tree_epsilon": 0.3},
}
#: δ of every query in Xiao & Xiong (2012), §6.4.
DELTA = 0.2
#: Largest number of multinomial trials per query (``n_t`` in ``1..MAX_TRIALS``).
MAX_TRIALS = 10
#: Unbounded setting: the tree keeps the nodes over this many cells from the region of
#: interest on (see the module docstring); ``None`` in :func:`generate` keeps all 8191.
TREE_CELLS = 256


# -- the queries ---------------------------------------------------------------------
def _ranges(cells: Sequence[int], weights: Sequence[int | float]) -> list[tuple[int, int, int | float]]:
    """Merge runs of adjacent cells with equal weights into ``(lo, hi, w)`` ranges."""
    out: list[tuple[int, int, int | float]] = []
    for c, w in zip(cells, weights, strict=True):
        if out and out[-1][1] == c - 1 and out[-1][2] == w:
            out[-1] = (out[-1][0], c, w)
        else:
            out.append((c, c, w))
    return out


def _predicate(column: str, lo: int, hi: int) -> str:
    return f"{column} = {lo}" if lo == hi else f"{column} BETWEEN {lo} AND {hi}"


def _weight_sql(w: int | float) -> str:
    if float(w).is_integer():
        return str(int(w))
    return format(float(w), ".6f").rstrip("0")


@dataclass(frozen=True)
class WorkloadQuery:
    """One query of the workload: ``θ = Σ_j weights[k] · x[cells[k]]`` with a requirement.

    Attributes:
        index: position in the workload (0-based).
        n: number of cells of the domain.
        cells: the cells with a non-zero weight, increasing.
        weights: their (positive integer) weights ``q_j``.
        accuracy: the requested half-width ``ε``.
        confidence: ``1 − δ``.
    """

    index: int
    n: int
    cells: tuple[int, ...]
    weights: tuple[int, ...]
    accuracy: float
    confidence: float

    def __post_init__(self) -> None:
        if len(self.cells) != len(self.weights) or not self.cells:
            raise InvalidArgument(
                f"A workload query needs as many weights as cells and at least one cell; got {len(self.cells)} "
                f"cells and {len(self.weights)} weights."
            )
        increasing = all(a < b for a, b in zip(self.cells, self.cells[1:], strict=False))
        if not increasing or self.cells[0] < 0 or self.cells[-1] >= self.n:
            raise InvalidArgument(f"The cells must increase strictly within 0..{self.n - 1}, got {self.cells}.")
        _validate.positive_finite(self.accuracy, "accuracy", error=InvalidRequirement)
        _validate.probability(self.confidence, "confidence", error=InvalidRequirement)

    @property
    def sensitivity(self) -> int:
        """``S = max_j |q_j|``."""
        return int(max(abs(w) for w in self.weights))

    @property
    def trials(self) -> int:
        """``n_t``: the number of multinomial trials (= sum of the weights)."""
        return int(sum(self.weights))

    @property
    def delta(self) -> float:
        """``δ = 1 − confidence``."""
        return 1.0 - self.confidence

    def dense(self) -> np.ndarray:
        """The weight vector over all ``n`` cells (float64)."""
        v = np.zeros(self.n)
        v[list(self.cells)] = self.weights
        return v

    def truth(self, histogram: np.ndarray) -> float:
        """The true answer ``q · x`` on a histogram of ``n`` counts (for metrics only)."""
        h = np.asarray(histogram)
        return float(np.dot(np.asarray(self.weights, dtype=float), h[list(self.cells)].astype(float)))

    def sql(self, table: str, column: str = "value", style: Literal["case", "filter"] = "case") -> str:
        """The query as SQL over the one-column table.

        ``style="case"``: ``SELECT SUM(CASE WHEN value = 3 THEN 2 WHEN … ELSE 0 END) FROM t``;
        ``style="filter"``: ``SELECT 2 * COUNT(*) FILTER (WHERE value = 3) + … FROM t``.
        Runs of adjacent cells with equal weight become ``BETWEEN`` ranges.

        >>> WorkloadQuery(0, 16, (0, 1, 5), (2, 2, 1), 10.0, 0.8).sql("t", style="filter")
        'SELECT 2 * COUNT(*) FILTER (WHERE value BETWEEN 0 AND 1) + COUNT(*) FILTER (WHERE value = 5) FROM t'
        """
        ranges = _ranges(self.cells, self.weights)
        if style == "case":
            whens = " ".join(f"WHEN {_predicate(column, lo, hi)} THEN {_weight_sql(w)}" for lo, hi, w in ranges)
            return f"SELECT SUM(CASE {whens} ELSE 0 END) FROM {table}"
        if style == "filter":
            terms = []
            for lo, hi, w in ranges:
                agg = f"COUNT(*) FILTER (WHERE {_predicate(column, lo, hi)})"
                terms.append(agg if w == 1 else f"{_weight_sql(w)} * {agg}")
            return f"SELECT {' + '.join(terms)} FROM {table}"
        raise InvalidArgument(f"style must be 'case' or 'filter', got {style!r}.")


@dataclass(frozen=True)
class TreeNode:
    """One node of the hierarchical tree: the count of cells ``lo..hi`` at budget ``alpha``."""

    level: int
    lo: int
    hi: int
    alpha: float

    def sql(self, table: str, column: str = "value") -> str:
        """``SELECT COUNT(*) FILTER (WHERE value BETWEEN lo AND hi) FROM t``."""
        return f"SELECT COUNT(*) FILTER (WHERE {_predicate(column, self.lo, self.hi)}) FROM {table}"

    def requirement(self, delta: float = DELTA) -> tuple[float, float]:
        """``(accuracy, confidence)`` for which Theorem 5.3 spends exactly ``alpha``:
        ``ε = S·ln(1/δ)/α`` with ``S = 1``."""
        return math.log(1.0 / delta) / self.alpha, 1.0 - delta

    def dense(self, n: int) -> np.ndarray:
        v = np.zeros(n)
        v[self.lo : self.hi + 1] = 1.0
        return v


@dataclass(frozen=True)
class Workload:
    """A generated workload: the queries, the setting's budget, δ and (unbounded) the tree."""

    setting: str
    n: int
    seed: int
    queries: tuple[WorkloadQuery, ...]
    budget: float
    delta: float
    tree: tuple[TreeNode, ...] = field(default=(), repr=False)

    @property
    def gateway_budget(self) -> float:
        """A finite budget to give ``dpgate.Gateway`` (which requires one): the bounded
        budget, or 1e9 standing for "unbounded"."""
        return self.budget if math.isfinite(self.budget) else 1e9


def cell_probabilities(n: int, roi_start: int = 0) -> np.ndarray:
    """Eq. 73, normalised: ``P_j ∝ 0.9·10^(−floor(j/10))`` for 0-based cell ``j``.

    >>> p = cell_probabilities(4096)
    >>> round(float(p[:10].sum()), 6), round(float(p.sum()), 12)
    (0.9, 1.0)
    """
    if n < 1:
        raise InvalidArgument(f"The domain needs at least one cell, got n = {n}.")
    j = np.arange(n)
    # 10^-k underflows to 0 past k ≈ 323; those cells are never drawn anyway.
    p = 0.9 * np.power(10.0, -np.minimum(j // 10, 400).astype(float))
    p = p / p.sum()
    return np.roll(p, roi_start % n)


def tree_nodes(n: int, epsilon: float, region: tuple[int, int] | None = None) -> tuple[TreeNode, ...]:
    """The binary hierarchical tree over ``n = 2^L`` cells, ``epsilon`` split evenly over
    its ``L + 1`` levels (root first, then level by level, left to right).

    With ``region = (lo, hi)`` only the nodes that intersect cells ``lo..hi`` are kept:
    every cell of the region still lies in exactly one node per level (so it costs
    exactly ``epsilon`` and the system cost is the full tree's), but the subtrees
    outside the region are dropped.  See :func:`generate` for why and how little
    that changes.
    """
    if n < 1 or n & (n - 1):
        raise InvalidArgument(f"The binary tree needs a power-of-two number of cells, got {n}.")
    _validate.positive_finite(epsilon, "the tree's epsilon", error=InvalidRequirement)
    lo_r, hi_r = (0, n - 1) if region is None else region
    if not (0 <= lo_r <= hi_r < n):
        raise InvalidArgument(f"The region must satisfy 0 <= lo <= hi < {n}, got {region}.")
    levels = n.bit_length()  # L + 1
    alpha = epsilon / levels
    out: list[TreeNode] = []
    for level in range(levels):
        width = n >> level
        out.extend(
            TreeNode(level, lo, lo + width - 1, alpha)
            for lo in range(0, n, width)
            if lo <= hi_r and lo + width - 1 >= lo_r
        )
    return tuple(out)


def generate(
    n: int = 4096,
    queries: int = 1000,
    setting: Setting = "bounded",
    seed: int = 0,
    *,
    roi_start: int = 0,
    delta: float = DELTA,
    tree_cells: int | None = TREE_CELLS,
) -> Workload:
    """Generate Xiao & Xiong (2012)'s online workload, §6.4 (pure: same arguments, same workload).

    Args:
        n: number of cells of the 1-D domain.
        queries: number of queries.
        setting: ``"bounded"`` (budget 1, ``2ε ~ U[1, 1000]``) or ``"unbounded"``
            (``2ε ~ U[50, 1000]`` and the hierarchical tree as initial history).
        seed: seed of the workload (not of the gateway's noise).
        roi_start: first cell of the region of interest (0 in the paper).
        delta: δ of every query (0.2 in the paper).
        tree_cells: unbounded setting: keep the tree's nodes that intersect the
            ``tree_cells`` cells from ``roi_start`` on (default 256: 515 of 8191
            nodes); ``None`` keeps the full tree.  See the module docstring.
    """
    if setting not in SETTINGS:
        raise InvalidArgument(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}.")
    if queries < 0:
        raise InvalidArgument(f"The number of queries must be ≥ 0, got {queries}.")
    _validate.probability(delta, "delta", error=InvalidRequirement)
    cfg = SETTINGS[setting]
    p = cell_probabilities(n, roi_start)
    q_rng, r_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    out = []
    for i in range(queries):
        trials = int(q_rng.integers(1, MAX_TRIALS + 1))
        counts = q_rng.multinomial(trials, p)
        cells = np.flatnonzero(counts)
        u = float(r_rng.random())
        two_eps = cfg["two_eps_low"] + u * (cfg["two_eps_high"] - cfg["two_eps_low"])
        out.append(
            WorkloadQuery(
                i, n, tuple(int(c) for c in cells), tuple(int(counts[c]) for c in cells), two_eps / 2, 1.0 - delta
            )
        )
    tree: tuple[TreeNode, ...] = ()
    if cfg["tree_epsilon"] > 0:
        region = None
        if tree_cells is not None and tree_cells < n:
            start = roi_start % n
            region = (start, min(n - 1, start + tree_cells - 1))
        tree = tree_nodes(n, cfg["tree_epsilon"], region)
    return Workload(setting, n, seed, tuple(out), cfg["budget"], delta, tree)


