"""ISPE internals: Gaussian smoothing, region growing, MMSE with neighbourhood reference.

The method is Xiao, Xiong & Yuan, "ISPE: Adaptive Differentially Private Data
Release and Query Estimation" (Emory TR-2011-005, 2011).

Pure functions on public arrays — the *noisy* phase-1 histogram and the released
region counts — never on data.  ``dpgate.warmstart.design`` wires them to the gateway.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from dpgate._validate import finite, positive_finite, real
from dpgate.errors import InvalidArgument
from dpgate.inference import ErrorLaw

__all__ = ["gaussian_mask", "smooth", "neighbour_offsets", "grow_regions", "is_connected", "mmse_part"]


def gaussian_mask(size: int = 3, sigma: float = 0.5) -> np.ndarray:
    """1-D normalised Gaussian mask of odd ``size`` (Xiao, Xiong & Yuan (2011), App. B; separable in d dims).

    With ``size=3, sigma=0.5`` its outer square is the paper's ``Gaussian(3)`` mask
    (centre 0.6193, edges 0.0838, corners 0.0113).

    >>> m = gaussian_mask(3, 0.5)
    >>> [round(float(v), 4) for v in np.outer(m, m)[1]]
    [0.0838, 0.6193, 0.0838]
    """
    if real(size, "mask_size") < 1 or int(size) != size or int(size) % 2 == 0:
        raise InvalidArgument(f"mask_size must be a positive odd integer, got {size!r}.")
    sigma = positive_finite(sigma, "sigma")
    r = int(size) // 2
    g = np.exp(-(np.arange(-r, r + 1) ** 2) / (2.0 * sigma**2))
    return g / g.sum()


def smooth(values: np.ndarray, iterations: int = 5, mask_size: int = 3, sigma: float = 0.5) -> np.ndarray:
    """Apply the separable Gaussian filter ``iterations`` times (Xiao, Xiong & Yuan (2011), §3.2).

    At the border the mask is renormalised over the cells inside the grid, so a
    constant histogram stays constant.

    >>> smooth(np.array([0.0, 0.0, 9.0, 0.0, 0.0]), iterations=1).round(3).tolist()
    [0.0, 0.959, 7.083, 0.959, 0.0]
    >>> bool(np.allclose(smooth(np.full((4, 5), 3.0), 4), 3.0))
    True
    """
    if real(iterations, "iterations") < 0 or int(iterations) != iterations:
        raise InvalidArgument(f"iterations must be a non-negative integer, got {iterations!r}.")
    g = gaussian_mask(mask_size, sigma)
    out = np.asarray(values, dtype=float).copy()
    for _ in range(int(iterations)):
        for ax in range(out.ndim):
            out = _convolve_axis(out, g, ax)
    return out


def _convolve_axis(a: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    r = g.size // 2
    moved = np.moveaxis(a, axis, -1)
    n = moved.shape[-1]
    num = np.zeros_like(moved)
    den = np.zeros(n)
    for k, w in zip(range(-r, r + 1), g, strict=True):
        lo, hi = max(0, -k), min(n, n - k)  # target positions t with t + k in range
        if lo >= hi:
            continue
        num[..., lo:hi] += w * moved[..., lo + k : hi + k]
        den[lo:hi] += w
    return np.moveaxis(num / den, -1, axis)


def neighbour_offsets(ndim: int, d: float) -> list[tuple[int, ...]]:
    """Non-zero integer offsets of Euclidean length ≤ ``d`` (Definition 3.1's connectivity).

    >>> len(neighbour_offsets(2, 1)), len(neighbour_offsets(2, math.sqrt(2)))
    (4, 8)
    """
    if not finite(d, "connectivity d") >= 1:
        raise InvalidArgument(f"connectivity d must be a finite distance ≥ 1 (one cell), got {d!r}.")
    r = int(math.floor(d + 1e-9))
    out = []
    for off in itertools.product(range(-r, r + 1), repeat=ndim):
        if any(off) and math.sqrt(sum(o * o for o in off)) <= d + 1e-9:
            out.append(off)
    return out


def grow_regions(smoothed: np.ndarray, xi: float, d: float = 1.0) -> np.ndarray:
    """Region growing (Xiao, Xiong & Yuan (2011), Algorithm 2) on a grid of smoothed noisy counts.

    Seeds are taken in C order (the first cell not yet clustered); a region grows
    breadth-first from each of its cells ``C_j`` to every unclustered cell ``C_k``
    within distance ``d`` with ``|Sm[C_k] − Sm[C_j]| < ξ``.  Deterministic given
    its inputs, so a fixed noise seed reproduces the partition.

    Returns:
        int64 labels of the grid's shape, regions numbered 0.. in seed order.
        Every region is connected (under the ``d``-neighbourhood) by construction.

    >>> grow_regions(np.array([1.0, 1.2, 5.0, 5.1, 1.0]), xi=1.0).tolist()
    [0, 0, 1, 1, 2]
    """
    sm = np.asarray(smoothed, dtype=float)
    if not real(xi, "threshold xi") > 0:  # inf is allowed: one region per connected component
        raise InvalidArgument(f"threshold xi must be positive, got {xi!r}.")
    shape = sm.shape
    labels = np.full(shape, -1, dtype=np.int64)
    offs = neighbour_offsets(sm.ndim, d)
    n_regions = 0
    for seed in np.ndindex(*shape):
        if labels[seed] >= 0:
            continue
        labels[seed] = n_regions
        queue = deque([seed])
        while queue:
            cj = queue.popleft()
            vj = sm[cj]
            for off in offs:
                ck = tuple(a + b for a, b in zip(cj, off, strict=True))
                if any(c < 0 or c >= s for c, s in zip(ck, shape, strict=True)) or labels[ck] >= 0:
                    continue
                if abs(sm[ck] - vj) < xi:
                    labels[ck] = n_regions
                    queue.append(ck)
        n_regions += 1
    return labels


def is_connected(mask: np.ndarray, d: float = 1.0) -> bool:
    """Whether the True cells of ``mask`` form one ``d``-connected component (tests)."""
    cells = {tuple(c) for c in np.argwhere(mask)}
    if not cells:
        return False
    offs = neighbour_offsets(mask.ndim, d)
    start = next(iter(cells))
    seen, queue = {start}, deque([start])
    while queue:
        c = queue.popleft()
        for off in offs:
            k = tuple(a + b for a, b in zip(c, off, strict=True))
            if k in cells and k not in seen:
                seen.add(k)
                queue.append(k)
    return len(seen) == len(cells)


def _obs_law(n1: int, b1: float, n2: int, b2: float) -> ErrorLaw:
    """Law of a sum of ``n1`` Laplace(b1) and ``n2`` Laplace(b2) noises (signs do not matter)."""
    return ErrorLaw([1.0] * (n1 + n2), [b1] * n1 + [b2] * n2)


def mmse_part(
    cell_values: np.ndarray,
    region_value: float,
    part: np.ndarray,
    region: np.ndarray,
    b1: float,
    b2: float,
    neighbours: Sequence[float] = (),
    grid_points: int = 2001,
) -> tuple[float, float]:
    """MMSE of the count of ``part`` ⊆ ``region`` (Xiao, Xiong & Yuan (2011), §4, Algorithms 3–4).

    Observations (each ``θ̃_i = θ + Ñ_i`` with the law of ``Ñ_i`` known):

    1. ``Σ_part y_I`` (|part| Laplace(b1));
    2. ``y_R − Σ_{region∖part} y_I`` (one Laplace(b2), |region∖part| Laplace(b1)),
       or ``y_R`` alone when the part is the whole region;
    3. neighbourhood reference (cell queries only): each given neighbour's noisy
       count, treated as an observation of θ with Laplace(b1) noise — this is the
       *model* assumption (neighbours in a region have equal counts) that biases
       the estimator.

    As in the paper, the observations are combined as if independent (Theorem
    4.1), with a uniform prior, on a grid of θ; returns the posterior mean and
    standard deviation **under that model** (not a frequentist guarantee).

    Args:
        cell_values: phase-1 noisy counts of the region's cells (flat).
        region_value: the phase-2 noisy count of the region.
        part, region: boolean masks over ``cell_values`` (part ⊆ region = all True).
        b1, b2: Laplace scales of phase 1 and phase 2.
        neighbours: noisy phase-1 counts of the neighbouring cells in the region.
    """
    y = np.asarray(cell_values, dtype=float)
    part = np.asarray(part, dtype=bool)
    k, rest = int(part.sum()), int((~part).sum())
    obs: list[tuple[float, ErrorLaw]] = [(float(y[part].sum()), _obs_law(k, b1, 0, b2))]
    if rest == 0:
        obs.append((float(region_value), _obs_law(0, b1, 1, b2)))
    else:
        obs.append((float(region_value - y[~part].sum()), _obs_law(rest, b1, 1, b2)))
    for v in neighbours:
        obs.append((float(v), _obs_law(1, b1, 0, b2)))
    centres = np.array([o for o, _ in obs])
    spread = max(law.std for _, law in obs)
    lo, hi = centres.min() - 8 * spread, centres.max() + 8 * spread
    theta = np.linspace(lo, hi, grid_points)
    logp = np.zeros_like(theta)
    for o, law in obs:
        dens = np.asarray(law.pdf(o - theta), dtype=float)
        logp += np.log(np.maximum(dens, 1e-300))
    logp -= logp.max()
    w = np.exp(logp)
    w /= w.sum()
    mean = float(np.dot(w, theta))
    std = float(math.sqrt(max(0.0, np.dot(w, (theta - mean) ** 2))))
    return mean, std
