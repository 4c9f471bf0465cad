"""Run-length encoding of integer arrays for the ledger: a wide query's weights in a few numbers.

``SUM(income)`` over a column of 500 001 cells has the weights ``0, 1, …, 500 000`` and as many
breakpoints; written as JSON lists they are megabytes per release, parsed again on every read of
the ledger.  Here an array is its first value and the run-length encoding of its differences
(one run for an arithmetic progression), used only when that is shorter, so a query without long
runs keeps the text older ledgers hold.  Used by :meth:`dpgate.compile.query.LinearQuery.to_json`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["decode_numerators", "decode_runs", "encode_runs", "numerator_runs", "runs_or"]


#: Arrays shorter than this are written as plain JSON lists (runs would save nothing worth a format).
_RUNS_MIN_SIZE = 16


def encode_runs(values: np.ndarray) -> dict[str, Any] | None:
    """A 1-D int64 array as ``{"start": a0, "steps": [[d, k], …]}`` — the first value and the
    run-length encoding of the differences (``k`` successive steps of ``d``) — when that is shorter
    than the plain list, else None (the plain list is kept).  ``SUM(income)``'s 500 001 weights
    ``0, 1, …`` are one step run.  A pure function of the values, so the ledger text of a query stays
    canonical; :func:`decode_runs` inverts it."""
    arr = np.asarray(values, dtype=np.int64).ravel()
    if arr.size < _RUNS_MIN_SIZE:
        return None
    diffs = np.diff(arr)
    change = np.flatnonzero(diffs[1:] != diffs[:-1]) + 1
    if 2 * (change.size + 1) + 1 >= arr.size:
        return None
    starts = np.concatenate(([0], change))
    counts = np.diff(np.concatenate((starts, [diffs.size])))
    return {"start": int(arr[0]), "steps": np.stack((diffs[starts], counts), axis=1).tolist()}


def runs_or(array: np.ndarray, plain: list[int] | None) -> Any:
    """:func:`encode_runs` of ``array``, or the plain list ledgers always held
    (``plain``, else ``array.tolist()``) when runs would not be shorter: a query without long runs
    keeps its former ledger text exactly."""
    runs = encode_runs(array) if array.size >= _RUNS_MIN_SIZE else None
    if runs is not None:
        return runs
    return plain if plain is not None else array.tolist()


def numerator_runs(numerators: np.ndarray) -> Any:
    """The numerators' JSON: runs (:func:`encode_runs`) of the values read with the longest axis
    innermost — ``{"start", "steps", "axes"}``, ``axes`` the order read when it is not the
    declared one (``SUM(income) … GROUP BY sex, married`` varies along income, not married) —
    or the plain nested list ledgers always held when runs would not be shorter."""
    axes = sorted(range(numerators.ndim), key=lambda a: (numerators.shape[a], a))  # the longest last
    if numerators.ndim < 2 or axes[-1] == numerators.ndim - 1:
        return runs_or(numerators, None)
    runs = encode_runs(np.transpose(numerators, axes)) if numerators.size >= _RUNS_MIN_SIZE else None
    return numerators.tolist() if runs is None else {**runs, "axes": axes}


def decode_numerators(encoded: Any, shape: list[int]) -> np.ndarray:
    """Inverse of :func:`numerator_runs`, for a grid of ``shape``."""
    flat = decode_runs(encoded)
    axes = encoded.get("axes") if isinstance(encoded, dict) else None
    if axes is None:
        return flat.reshape(shape)
    return np.transpose(flat.reshape([shape[a] for a in axes]), np.argsort(axes))


def decode_runs(encoded: Any) -> np.ndarray:
    """Inverse of :func:`encode_runs` (a plain list, as older ledgers hold, reads as itself)."""
    if isinstance(encoded, dict):
        steps = np.asarray(encoded["steps"], dtype=np.int64).reshape(-1, 2)
        out = np.empty(int(steps[:, 1].sum()) + 1, dtype=np.int64)
        out[0] = int(encoded["start"])
        np.cumsum(np.repeat(steps[:, 0], steps[:, 1]), out=out[1:])
        out[1:] += out[0]
        return out
    return np.asarray(encoded, dtype=np.int64).ravel()
