"""A feasibility check for issue 28 (not dpgate code): long random-range histories in the prefix-sum basis.

A range count ``[lo, hi]`` over a 1-D column is ``P(hi+1) − P(lo)`` with ``P(k)`` the number of
rows below cell k (``P(0) = 0`` known): two non-zeros, whatever the history.  The BLUE of the
releases is then a weighted graph Laplacian over the endpoints (the information matrix
``Gᵀ W G``, ``W = 1/b²``), one per connected component of the endpoint graph, and a query is
estimable iff its prefix coefficients sum to zero on every component other than ``P(0)``'s.

This builds ``--releases`` random ranges through a gateway (as ``bench_long_history.py``, in
memory, NETTRACE), then, on the largest component (grounded at its first node: differences
inside a component do not depend on it): the Laplacian's sparse LU (SuperLU, COLAMD order),
its fill, the time of one solve per fresh random range, and each range's estimate and
variance beside the gateway's BLUE (the dense basis form) — and the exact rank
(nodes − components) beside the basis form's.

Writes ``benchmarks/results/prefix_form.json``.

Usage::

    python benchmarks/bench_prefix_form.py [--releases 5000] [--probe 200] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as spl
from bench_long_history import _build, _ranges  # type: ignore[import-not-found]

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.datasets import load_histogram

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _ends(query: LinearQuery, n: int) -> tuple[int, int]:
    """``(lo, hi + 1)`` of a released range (its non-zero slab run)."""
    bps, nums = list(query.breakpoints[0]), np.asarray(query.numerators)
    on = np.flatnonzero(nums)
    return bps[on[0]], bps[on[-1] + 1] if on[-1] + 1 < len(bps) else n


def _range(table, lo: int, hi: int) -> LinearQuery:  # type: ignore[no-untyped-def]
    n = table.columns[0].n_cells
    bps = sorted({0, lo, hi + 1} - {n})
    return LinearQuery.from_grid(table, [table.columns[0].name], [bps], np.array([float(lo <= b <= hi) for b in bps]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=int, default=5000)
    p.add_argument("--probe", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="3 000 releases, 50 probes")
    args = p.parse_args(argv)
    if args.quick:
        args.releases, args.probe = min(args.releases, 3000), min(args.probe, 50)
    warnings.simplefilter("ignore", dpgate.Warning)
    df, schema = load_histogram("nettrace")
    gw = dpgate.Gateway(df, schema, budget=1e9, seed=1)
    _build(gw, args.releases, 250, np.random.default_rng(3))
    state = gw._history.state(schema.tables[0].name)
    blue, n = state.blue, schema.tables[0].columns[0].n_cells
    y, w = blue.values, 1.0 / blue.scales**2
    t0 = time.perf_counter()
    ends = np.array([_ends(q, n) for q in state.queries])
    m = len(ends)
    G = sp.csr_matrix((np.tile([-1.0, 1.0], m), (np.repeat(np.arange(m), 2), ends.ravel())), shape=(m, n + 1))
    count, label = csgraph.connected_components(G.T @ G, directed=False)
    members = np.flatnonzero(label == np.bincount(label).argmax())
    ref, nodes = members[0], members[1:]
    Gc = G[:, nodes]
    lap = (Gc.T @ sp.diags(w) @ Gc).tocsc()
    t1 = time.perf_counter()
    lu = spl.splu(lap, permc_spec="COLAMD")
    t2 = time.perf_counter()
    rhs = Gc.T @ (w * y)
    at = {int(v): i for i, v in enumerate(nodes)}
    solves, value_err, var_err, sd = [], [], [], []
    for lo, hi in _ranges(np.random.default_rng(7), n, args.probe):
        a = np.zeros(nodes.size)
        if not all(e == ref or e in at for e in (lo, hi + 1)):
            continue  # not inside the largest component
        for e, s in ((hi + 1, 1.0), (lo, -1.0)):
            if e != ref:
                a[at[e]] += s
        t = time.perf_counter()
        z = lu.solve(a)
        value, variance = float(z @ rhs), 2.0 * float(a @ z)  # Laplace: variance 2b², weights 1/b²
        solves.append(time.perf_counter() - t)
        est = blue.estimate(state.atoms.vector(_range(state.table, lo, hi)))
        if est.estimable:
            sd.append(np.sqrt(est.variance))
            value_err.append(abs(value - est.value) / np.sqrt(est.variance))
            var_err.append(abs(variance - est.variance) / est.variance)
    out = {
        "releases": m, "components": int(count), "largest_component": int(members.size),
        "exact_rank": int(n + 1 - count), "basis_form_rank": int(blue.rank), "atoms": int(blue.n_atoms),
        "laplacian_nnz": int(lap.nnz), "lu_nnz": int(lu.L.nnz + lu.U.nnz),
        "lu_mb": (lu.L.nnz + lu.U.nnz) * 12 / 2**20, "build_ms": 1e3 * (t1 - t0), "factor_ms": 1e3 * (t2 - t1),
        "solve_p50_ms": 1e3 * float(np.median(solves)) if solves else None, "compared": len(value_err),
        "value_diff_over_sd_max": max(value_err, default=None), "value_diff_over_sd_p50": float(np.median(value_err))
        if value_err else None, "variance_rel_diff_max": max(var_err, default=None),
    }
    for k, v in out.items():
        print(f"{k:26s} {v:.4g}" if isinstance(v, float) else f"{k:26s} {v}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "prefix_form.json"), "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
