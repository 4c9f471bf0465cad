"""Warm starts: spend ε once, up front, on a designed release that later queries reuse.

Why one module of about 510 lines: the strategies share the budget split and
the release path through the gateway; the ISPE partition math is in ``_ispe.py``.

``Gateway.warm_start(strategy, epsilon, columns, table=None, **options)`` (or
:func:`warm_start`) releases a set of linear counts through
``Gateway.release_measurements`` — budget-checked before any data is read,
recorded durably in the ledger, added to the history that the decision loop
answers from — and returns a :class:`WarmStart` describing what was released.
ISPE, the geometric budget split and the MMSE estimator are from Xiao, Xiong &
Yuan, "ISPE: Adaptive Differentially Private Data Release and Query Estimation"
(Emory TR-2011-005, 2011).

Strategies (every one raises the per-cell cost of *every* cell of the table by
exactly ε, so the system cost rises by ``k·ε``, ``k = max_rows_per_unit``):

``"identity"``
    one count per cell of the product grid of ``columns`` (NULL / ``other``
    cells included), each at α = ε.  The cells are disjoint, so every cell is
    charged ε (per-cell accounting: Xiao & Xiong, "Bayesian Inference under
    Differential Privacy" (2012), Theorem 5.5).  Refused above ``MAX_IDENTITY_CELLS`` cells.
``"hierarchical"``
    the tree of Hay et al. over ONE ordered column (integer or binned): the
    column's ``m`` non-NULL cells are padded virtually to ``B^L ≥ m``
    (``B = branching``, default 2), level ``ℓ = 0..L`` (root first) holds the
    nodes ``[i·B^(L−ℓ), (i+1)·B^(L−ℓ)) ∩ [0, m)``, all at α_ℓ; the NULL cell is
    one more count at ε.  Every non-NULL cell lies in exactly one node per level,
    so it is charged ``Σ_ℓ α_ℓ = ε``.  ``split="even"``: α_ℓ = ε/(L+1);
    ``split="geometric"`` (Xiao, Xiong & Yuan (2011), §5.3.3): α_ℓ ∝ ``ratio^ℓ``
    (default 2, so the leaves get the largest share), normalised to sum to ε — the paper's printed
    ``α·2^(h−L−1)`` sums to ``α(1 − 2^−L)``, which would waste budget.
``"ispe"``
    Xiao, Xiong & Yuan (2011), §3, on a grid of ordered columns (any number of
    them): phase 1 is the identity release at ``α₁ = alpha1_fraction·ε``; the *noisy* non-NULL
    histogram is smoothed by a Gaussian filter (``iterations``, ``mask_size``,
    ``sigma``); region growing (threshold ``xi``, connectivity distance
    ``connectivity``) partitions the grid into connected regions of similar
    smoothed density; phase 2 releases one count per region at ``ε − α₁``.
    Cells with a NULL coordinate are singleton regions.

Privacy (every strategy).  Neighbouring relation: add/remove one row (one row
per individual, or ``k`` rows, see ``dpgate.plan.accounting``).  Each count has
sensitivity 1 and gets two-sided geometric noise of scale ``1/α`` on its
lattice (``dpgate.release.noise``), which is α-DP for that count.  Counts of one
level / phase are over disjoint cells (parallel composition) and levels /
phases compose sequentially, which per-cell accounting states exactly: a row in
cell ``j`` changes one count per level/phase, so its loss is the sum of those
α's, = ε.  For ISPE, phase 2's *design* (the partition) is a function of phase
1's released noisy values only — never of the data — so phase 2 is an
``(ε − α₁)``-DP mechanism chosen by post-processing of an α₁-DP output; by
adaptive sequential composition (McSherry's PINQ; Xiao, Xiong & Yuan (2011),
Theorems 2.1–2.2, 3.1) the pair is ε-DP, and the per-cell charge recorded in the ledger is exactly
α₁ + (ε − α₁) = ε for every cell.  Before anything is read the whole ``k·ε`` is
checked against the remaining budget (the increase is exactly ``k·ε`` because
every cell's cost rises by ε), so an overspending warm start raises
:class:`~dpgate.errors.BudgetExhausted` and changes nothing.

Intervals after a warm start.  Identity and hierarchical designs depend only on
the public schema and options, so the gateway's BLUE intervals are exact (the
error is a fixed linear combination of independent noises with known law).
ISPE's phase-2 design ``P = f(y₁)`` depends on the released phase-1 values, and
*this breaks exactness in general* — the argument "the phase-2 noise is
independent of phase 1, so intervals treating the design as fixed are exact"
does not go through.  What is exact:

* an estimator using phase-1 releases only (``P`` plays no role): exact, the
  identity design is fixed;
* an estimator using phase-2 releases only, *conditionally on* ``y₁``: given
  ``y₁`` the design is fixed and ``y₂ = P x + N₂`` with ``N₂`` independent of
  ``y₁``, so its error law is exactly the Laplace-sum law the gateway computes,
  for every ``y₁`` — hence also unconditionally.

The gateway's BLUE mixes both: its error is ``A₁(P)·N₁ + A₂(P)·N₂``.  Given
``y₁`` the second term has the stated law but the first is a *constant*, and
unconditionally the weights ``A₁(P)`` are correlated with ``N₁`` (the
partition selected where the noisy histogram looks smooth), so the law of
``A₁(P)·N₁`` is not the independent-Laplace law the interval assumes.  The
selection is symmetric under ``N₁ → −N₁`` only jointly with the data, so not
even unbiasedness is guaranteed exactly.  ``tests/model/test_warmstart.py``
(``test_ispe_blue_intervals_cover_empirically``) measures the coverage of BLUE
intervals after ISPE over 150 independent redraws of the whole release on
NETTRACE's first 32 cells, with a threshold at which the partition changes from
draw to draw; it is at the nominal rate there, but that is evidence, not proof:
treat intervals after an ISPE warm start as empirically calibrated.  If exact
intervals matter, use "identity" or "hierarchical".

ISPE's ``xi`` is in count units.  Its default, ``√2/α₁`` (the standard deviation
of one phase-1 count's noise), is public and data-free but merges little on
dense data; the paper tunes ξ per data set (Xiao, Xiong & Yuan (2011), §5.2.3).

MMSE with neighbourhood reference (Xiao, Xiong & Yuan (2011), §4): :func:`mmse_estimate` answers
from an ISPE release by a *model* that treats neighbouring cells of a region as
further observations of a cell.  It is biased by design, costs nothing (pure
post-processing), and its answers carry ``source="model"``,
``meets_requirement=False`` and a model credible interval that is not a
confidence guarantee.

Example:
    >>> import dpgate, dpgate.datasets
    >>> df, schema = dpgate.datasets.load_pums()
    >>> gw = dpgate.Gateway(df, schema, budget=1.0, seed=0)
    >>> ws = gw.warm_start("hierarchical", 0.5, "age")
    >>> len(ws.queries), round(gw.spent, 12)
    (206, 0.5)
    >>> a = gw.query("SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 39", accuracy=45).answer
    >>> a.source, a.epsilon_spent
    ('history', 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgate._validate import positive_finite, probability
from dpgate.answer.result import Answer, Result
from dpgate.compile.query import LinearQuery
from dpgate.errors import BudgetExhausted, InvalidRequirement, SchemaError, UnsupportedQuery
from dpgate.plan.budget import exhausted, fits
from dpgate.schema.domains import Table
from dpgate.warmstart import _ispe

if TYPE_CHECKING:
    from dpgate.plan.seam import GatewaySeam

__all__ = ["STRATEGIES", "MAX_IDENTITY_CELLS", "WarmStart", "warm_start", "mmse_estimate", "mmse_values"]

#: Accepted strategy names.
STRATEGIES: tuple[str, ...] = ("identity", "hierarchical", "ispe")
#: Largest cell grid an identity (or ISPE phase-1) release may have.
MAX_IDENTITY_CELLS = 16_384

_OPTIONS: dict[str, dict[str, Any]] = {
    "identity": {},
    "hierarchical": {"branching": 2, "split": "even", "ratio": 2.0},
    "ispe": {"alpha1_fraction": 0.5, "iterations": 5, "mask_size": 3, "sigma": 0.5, "xi": None, "connectivity": 1.0},
}


@dataclass(frozen=True, eq=False)
class WarmStart:
    """What one warm start released (everything here is public or already released).

    Attributes:
        strategy, table, columns, epsilon: as requested (columns in declaration order).
        options: the options used, defaults filled in.
        queries: the measured counts, in release order.
        alphas: the budget of each count.
        values: the released noisy answers, in the same order.
        levels: hierarchical: α of each level, root first.
        labels: ISPE: region id of every cell of the columns' full grid (NULL cells
            included, each its own region); read-only.
        cell_values: ISPE: the phase-1 noisy histogram on that grid; read-only.
        smoothed: ISPE: the smoothed non-NULL histogram the partition was grown on.
        region_values: ISPE: phase-2 noisy count of each region.
        alpha1, alpha2: ISPE: the two phases' budgets.
    """

    strategy: str
    table: str
    columns: tuple[str, ...]
    epsilon: float
    options: dict[str, Any]
    queries: tuple[LinearQuery, ...] = field(repr=False)
    alphas: tuple[float, ...] = field(repr=False)
    values: tuple[float, ...] = field(repr=False)
    levels: tuple[float, ...] = ()
    labels: np.ndarray | None = field(default=None, repr=False)
    cell_values: np.ndarray | None = field(default=None, repr=False)
    smoothed: np.ndarray | None = field(default=None, repr=False)
    region_values: tuple[float, ...] = field(default=(), repr=False)
    alpha1: float = 0.0
    alpha2: float = 0.0

    @property
    def n_regions(self) -> int:
        """ISPE: number of regions (NULL singletons included); 0 otherwise."""
        return len(self.region_values)


# -- entry point -------------------------------------------------------------------------
def warm_start(
    gw: GatewaySeam, strategy: str, epsilon: float, columns: str | Sequence[str], *, table: str | None = None, **options: Any
) -> WarmStart:
    """Release ``strategy``'s design at total per-cell cost ``epsilon`` through ``gw``.

    See the module docstring for the strategies, their options, the privacy
    argument and what the intervals afterwards mean.

    Raises:
        InvalidRequirement: bad ε, strategy, option or column kind (nothing read, nothing spent).
        InvalidArgument: a malformed ISPE smoothing or connectivity option (nothing read, nothing spent).
        SchemaError: unknown table or column.
        UnsupportedQuery: the grid is too large for an identity / ISPE release.
        BudgetExhausted: ``k·ε`` exceeds what remains (nothing read, nothing spent).
    """
    if strategy not in STRATEGIES:
        raise InvalidRequirement(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}.")
    epsilon = positive_finite(epsilon, "epsilon", error=InvalidRequirement)
    if not isinstance(columns, str) and not (isinstance(columns, Sequence) and columns):
        raise InvalidRequirement(f"columns must be a column name or a non-empty list of names, got {columns!r}.")
    t = _table(gw, table)
    cols = _columns(t, columns)
    opts = _options(strategy, options)
    with gw.locked_view(t.name):  # one gateway's threads do not interleave with a two-phase release
        _check_budget(gw, t, epsilon, strategy)
        if strategy == "identity":
            return _identity(gw, t, cols, epsilon, opts)
        if strategy == "hierarchical":
            return _hierarchical(gw, t, cols, epsilon, opts)
        return _ispe_release(gw, t, cols, epsilon, opts)


def _table(gw: GatewaySeam, table: str | None) -> Table:
    if table is None:
        if len(gw.schema.tables) != 1:
            raise InvalidRequirement(
                f"the schema declares {len(gw.schema.tables)} tables; pass table= to say which one to warm-start."
            )
        return gw.schema.tables[0]
    return gw.schema.table(table)


def _columns(t: Table, columns: str | Sequence[str]) -> tuple[str, ...]:
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names:
        raise InvalidRequirement("columns must name at least one declared column.")
    cols = [t.column(c).name for c in names]
    if len(set(c.lower() for c in cols)) != len(cols):
        raise InvalidRequirement(f"columns must be distinct, got {list(names)}.")
    return tuple(sorted(cols, key=t.axis))


def _options(strategy: str, given: dict[str, Any]) -> dict[str, Any]:
    allowed = _OPTIONS[strategy]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise InvalidRequirement(
            f"unknown option(s) {unknown} for strategy {strategy!r}; allowed: {sorted(allowed) or 'none'}."
        )
    return {**allowed, **given}


def _check_budget(gw: GatewaySeam, t: Table, epsilon: float, strategy: str) -> None:
    needed = t.max_rows_per_individual * epsilon
    if getattr(gw, "privacy", "pure") == "zcdp":  # per cell Σ ε_i ≤ ε, so its ρ Σ ε_i²/2 ≤ ε²/2 (k² for units)
        needed = needed**2 / 2
    spent = gw.spent
    if not fits(spent, needed, gw.budget):
        raise exhausted(needed, spent, gw.budget, what=f"This {strategy} warm start",
                        unit="ρ" if getattr(gw, "privacy", "pure") == "zcdp" else "ε")


def _release(gw: GatewaySeam, t: Table, ms: list[tuple[LinearQuery, float]], label: str) -> list[float]:
    return gw.release_measurements(t.name, ms, kind="warm_start", label=label)


# -- query builders ----------------------------------------------------------------------
def _box(t: Table, cols: Sequence[str], ranges: Sequence[tuple[int, int]]) -> LinearQuery:
    """Count of the grid box ``Π [lo, hi)`` (cell indices) over ``cols``."""
    bps, shape, idx = [], [], []
    for c, (lo, hi) in zip(cols, ranges, strict=True):
        n = t.column(c).n_cells
        bp = sorted({0, lo, hi} - {n})
        bps.append(bp)
        shape.append(len(bp))
        idx.append(bp.index(lo))
    w = np.zeros(shape)
    w[tuple(idx)] = 1.0
    return LinearQuery.from_grid(t, cols, bps, w)


def _mask_query(t: Table, cols: Sequence[str], mask: np.ndarray) -> LinearQuery:
    """Count of the cells where ``mask`` (full grid of ``cols``) is True."""
    bps = [range(t.column(c).n_cells) for c in cols]
    return LinearQuery.from_grid(t, cols, bps, mask.astype(float))


def _grid_size(t: Table, cols: Sequence[str], strategy: str) -> tuple[int, ...]:
    shape = tuple(t.column(c).n_cells for c in cols)
    size = math.prod(shape)
    if size > MAX_IDENTITY_CELLS:
        dims = " × ".join(f"{c} ({n})" for c, n in zip(cols, shape, strict=True))
        hint = (
            ' Use strategy="hierarchical" on one ordered column, or declare coarser bins.'
            if strategy == "identity"
            else " Declare coarser bins for these columns."
        )
        raise UnsupportedQuery(
            f"a {strategy} warm start over {dims} needs one count per cell, {size} counts, more than the "
            f"limit of {MAX_IDENTITY_CELLS}.{hint}"
        )
    return shape


# -- identity ----------------------------------------------------------------------------
def _identity(gw: GatewaySeam, t: Table, cols: tuple[str, ...], epsilon: float, opts: dict[str, Any]) -> WarmStart:
    shape = _grid_size(t, cols, "identity")
    qs = [_box(t, cols, [(i, i + 1) for i in idx]) for idx in np.ndindex(*shape)]
    ms = [(q, epsilon) for q in qs]
    values = _release(gw, t, ms, f"warm_start identity({', '.join(cols)}) ε={epsilon:g}")
    return WarmStart("identity", t.name, cols, epsilon, opts, tuple(qs), (epsilon,) * len(qs), tuple(values))


# -- hierarchical --------------------------------------------------------------------------
def tree_levels(m: int, branching: int) -> list[list[tuple[int, int]]]:
    """Nodes ``[lo, hi)`` of each level (root first) of the ``branching``-ary tree over ``m`` cells.

    >>> tree_levels(5, 2)
    [[(0, 5)], [(0, 4), (4, 5)], [(0, 2), (2, 4), (4, 5)], [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]]
    """
    L = 0
    while branching**L < m:
        L += 1
    return [
        [(lo, min(lo + branching ** (L - lev), m)) for lo in range(0, m, branching ** (L - lev))]
        for lev in range(L + 1)
    ]


def level_budgets(epsilon: float, n_levels: int, split: str, ratio: float = 2.0) -> tuple[float, ...]:
    """α of each level (root first), summing to ``epsilon``.

    >>> [round(a, 4) for a in level_budgets(0.7, 3, "geometric")]
    [0.1, 0.2, 0.4]
    """
    if split == "even":
        return (epsilon / n_levels,) * n_levels
    if split == "geometric":
        w = np.asarray([ratio**lev for lev in range(n_levels)], dtype=float)
        return tuple(float(a) for a in epsilon * w / w.sum())
    raise InvalidRequirement(f"split must be 'even' or 'geometric', got {split!r}.")


def _hierarchical(gw: GatewaySeam, t: Table, cols: tuple[str, ...], epsilon: float, opts: dict[str, Any]) -> WarmStart:
    if len(cols) != 1:
        raise InvalidRequirement(f"the hierarchical strategy takes ONE ordered column, got {list(cols)}.")
    col = t.column(cols[0])
    if not col.ordered:
        raise InvalidRequirement(
            f"column {col.name!r} is {col.kind}; the hierarchical strategy needs an ordered (integer or binned) column."
        )
    b = opts["branching"]
    if isinstance(b, bool) or not isinstance(b, int) or b < 2:
        raise InvalidRequirement(f"branching must be an integer ≥ 2, got {b!r}.")
    ratio = opts["ratio"]
    ratio = positive_finite(ratio, "ratio", error=InvalidRequirement)
    m = col.n_cells - 1
    levels = tree_levels(m, b)
    alphas = level_budgets(epsilon, len(levels), opts["split"], ratio)
    ms: list[tuple[LinearQuery, float]] = []
    for nodes, a in zip(levels, alphas, strict=True):
        ms.extend((_box(t, cols, [node]), a) for node in nodes)
    ms.append((_box(t, cols, [(m, m + 1)]), epsilon))  # the NULL cell, once at ε
    # Released leaves (and NULL cell) first: they split the column into its cells in one
    # step, and every other node is then constant on the atoms already.
    order = [*range(len(ms) - len(levels[-1]) - 1, len(ms)), *range(len(ms) - len(levels[-1]) - 1)]
    released = _release(gw, t, [ms[i] for i in order], f"warm_start hierarchical({col.name}) ε={epsilon:g}")
    values = [0.0] * len(ms)
    for i, v in zip(order, released, strict=True):
        values[i] = v
    return WarmStart(
        "hierarchical", t.name, cols, epsilon, opts,
        tuple(q for q, _ in ms), tuple(a for _, a in ms), tuple(values), levels=alphas,
    )


# -- ISPE ------------------------------------------------------------------------------------
def _ispe_release(gw: GatewaySeam, t: Table, cols: tuple[str, ...], epsilon: float, opts: dict[str, Any]) -> WarmStart:
    for c in cols:
        col = t.column(c)
        if not col.ordered:
            raise InvalidRequirement(
                f"column {col.name!r} is {col.kind}; ISPE grows regions of neighbouring cells and needs ordered "
                "(integer or binned) columns."
            )
    f = probability(opts["alpha1_fraction"], "alpha1_fraction", error=InvalidRequirement)
    shape = _grid_size(t, cols, "ispe")
    _ispe.gaussian_mask(opts["mask_size"], opts["sigma"])  # validates
    _ispe.neighbour_offsets(len(cols), opts["connectivity"])  # validates
    if int(opts["iterations"]) != opts["iterations"] or opts["iterations"] < 0:
        raise InvalidRequirement(f"iterations must be a non-negative integer, got {opts['iterations']!r}.")
    alpha1 = epsilon * f
    alpha2 = epsilon - alpha1
    xi = opts["xi"]
    if xi is None:
        xi = math.sqrt(2.0) / alpha1  # std of one phase-1 count's noise: public, data-free
    opts = {**opts, "xi": positive_finite(xi, "xi", error=InvalidRequirement)}

    # Phase 1: the cell histogram at α₁.
    cells = list(np.ndindex(*shape))
    q1 = [_box(t, cols, [(i, i + 1) for i in idx]) for idx in cells]
    v1 = _release(gw, t, [(q, alpha1) for q in q1], f"warm_start ispe phase 1 ({', '.join(cols)}) α1={alpha1:g}")
    y1 = np.asarray(v1, dtype=float).reshape(shape)
    # Post-processing of released values only: smoothing and region growing.
    spatial = tuple(slice(0, n - 1) for n in shape)
    sm = _ispe.smooth(y1[spatial], opts["iterations"], opts["mask_size"], opts["sigma"])
    labels = np.empty(shape, dtype=np.int64)
    inner = _ispe.grow_regions(sm, opts["xi"], opts["connectivity"])
    labels[...] = -1
    labels[spatial] = inner
    nxt = int(inner.max(initial=-1)) + 1
    for idx in cells:
        if labels[idx] < 0:  # a NULL coordinate: its own region
            labels[idx] = nxt
            nxt += 1
    # Phase 2: one count per region at ε − α₁.
    q2 = [_mask_query(t, cols, labels == r) for r in range(nxt)]
    try:
        v2 = _release(gw, t, [(q, alpha2) for q in q2], f"warm_start ispe phase 2 ({', '.join(cols)}) α2={alpha2:g}")
    except BudgetExhausted as exc:  # only if another process spent in between
        raise BudgetExhausted(
            f"ISPE phase 1 (α1 = {alpha1:.4g}) was released and is in history, but phase 2 was refused "
            f"because another session spent meanwhile: {exc}",
            needed=exc.needed,
            remaining=exc.remaining,
        ) from exc
    for a in (labels, y1, sm):
        a.setflags(write=False)
    return WarmStart(
        "ispe", t.name, cols, epsilon, opts,
        tuple(q1) + tuple(q2), (alpha1,) * len(q1) + (alpha2,) * len(q2), tuple(v1) + tuple(v2),
        labels=labels, cell_values=y1, smoothed=sm, region_values=tuple(float(v) for v in v2),
        alpha1=alpha1, alpha2=alpha2,
    )


# -- MMSE (model-based, free) ------------------------------------------------------------------
def mmse_values(release: WarmStart, query: LinearQuery, *, neighbours: bool = True) -> tuple[float, float]:
    """Model-based estimate of ``query`` from an ISPE release: ``(value, model std)``.

    Splits the query's cells by weight and by region (Xiao, Xiong & Yuan (2011), §4.1: "divide the
    query into several parts with every part belonging to one partition"), takes
    the MMSE of each part (:func:`dpgate.warmstart._ispe.mmse_part`; for a single cell with
    ``neighbours=True`` the other cells of its region within the connectivity
    distance are added as observations — neighbourhood reference) and sums
    ``weight × part`` (variances added as if independent).  Biased by design;
    the std is the model's, not a guarantee.  Costs nothing: it reads released
    values only.

    Raises:
        InvalidRequirement: ``release`` is not an ISPE release.
        UnsupportedQuery: the query depends on columns outside the release's grid.
    """
    if release.strategy != "ispe" or release.labels is None or release.cell_values is None:
        raise InvalidRequirement(f"MMSE needs an ISPE warm start, got a {release.strategy!r} one.")
    if query.table.lower() != release.table.lower():
        raise SchemaError(f"the query is on table {query.table!r}, the release on {release.table!r}.")
    mine = {c.lower() for c in release.columns}
    extra = [c for c in query.columns if c.lower() not in mine]
    if extra:
        raise UnsupportedQuery(
            f"the query depends on {extra}, outside the ISPE grid over {list(release.columns)}; "
            "MMSE answers only queries on the released grid."
        )
    shape = release.labels.shape
    # expand() reads only the grid (column names and breakpoints), never its table argument.
    grid = query.expand(None, release.columns, [range(n) for n in shape])  # type: ignore[arg-type]
    w = grid.astype(float) / query.denominator
    labels, y1 = release.labels, release.cell_values
    b1, b2 = 1.0 / release.alpha1, 1.0 / release.alpha2
    offs = _ispe.neighbour_offsets(len(shape), release.options["connectivity"])
    spatial = tuple(n - 1 for n in shape)
    total, var = float(query.offset), 0.0
    for weight in np.unique(w[w != 0]):
        sel = w == weight
        for r in np.unique(labels[sel]):
            region = labels == r
            part = sel & region
            cells_r = y1[region]
            part_r = part[region]
            nb: list[float] = []
            if neighbours and part_r.sum() == 1:
                (c,) = [tuple(int(v) for v in x) for x in np.argwhere(part)]
                if all(ci < si for ci, si in zip(c, spatial, strict=True)):
                    for off in offs:
                        k = tuple(a + b for a, b in zip(c, off, strict=True))
                        if all(0 <= ki < si for ki, si in zip(k, spatial, strict=True)) and labels[k] == r:
                            nb.append(float(y1[k]))
            mean, std = _ispe.mmse_part(cells_r, release.region_values[int(r)], part_r, np.ones_like(part_r), b1, b2, nb)
            total += float(weight) * mean
            var += (float(weight) * std) ** 2
    return total, math.sqrt(var)


def mmse_estimate(
    gw: GatewaySeam, sql: str, release: WarmStart, *, confidence: float = 0.95, neighbours: bool = True, params: Any = None
) -> Result:
    """Answer ``sql`` by ISPE's MMSE estimator with neighbourhood reference; free, model-based.

    Returns a ``dpgate.Result`` whose answers have ``source="model"``,
    ``epsilon_spent=0``, ``meets_requirement=False``, ``posterior=None`` and
    ``[low, high]`` = value ± z·(model std), a *model* credible interval — never a
    confidence guarantee (the estimator is biased by design).  Nothing is
    released or recorded: the answer is post-processing of ``release``.

    Raises:
        UnsupportedQuery, SchemaError: the SQL is refused, or depends on columns
            outside the release's grid.
    """
    from statistics import NormalDist

    confidence = probability(confidence, "confidence", error=InvalidRequirement)
    stmt = gw.compile(sql, params)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    answers = []
    for q in stmt.queries:
        value, std = mmse_values(release, q, neighbours=neighbours)
        answers.append(
            Answer(
                value, value - z * std, value + z * std, confidence, math.nan, "model", 0.0,
                posterior=None, meets_requirement=False, label=q.label, group=q.group, query=q,
            )
        )
    return Result(tuple(answers), stmt, 0.0)
