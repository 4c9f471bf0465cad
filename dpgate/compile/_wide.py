"""Small helpers that keep wide columns (500 000 cells) cheap: one shared tuple for unit slabs,
a tuple that hashes once, and a distinct count by sorting.  Used by :mod:`dpgate.compile.query`."""

from __future__ import annotations

import functools
import hashlib
from typing import Any, cast

import numpy as np

__all__ = ["HashOnceTuple", "distinct", "more_distinct_than", "numerators_digest", "unit_breakpoints"]

#: How many leading (and as many evenly spaced) values :func:`more_distinct_than` sorts before it sorts them all.
_SAMPLE = 4096


def distinct(values: np.ndarray) -> int:
    """How many distinct values ``values`` holds (a sort: np.unique hashes, slower on wide arrays)."""
    ordered = np.sort(values, axis=None)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1 if ordered.size else 0


class HashOnceTuple(tuple):
    """A tuple that computes its hash once (CPython's tuples hash all their items on every call).
    Equal to, and hashes like, the plain tuple of the same items, so dictionaries keyed by either
    (checkpoints written before it existed) find each other; pickled as its items only."""

    def __hash__(self) -> int:
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = tuple.__hash__(self)
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        return (HashOnceTuple, (tuple(self),))


@functools.lru_cache(maxsize=16)
def unit_breakpoints(n: int) -> tuple[int, ...]:
    """``(0, 1, …, n − 1)``, one tuple per ``n``: queries on unit slabs share it (memory, and
    :func:`expand_grid` recognises the same slabs by identity)."""
    return tuple(range(n))


def more_distinct_than(values: np.ndarray, limit: int) -> bool:
    """Whether ``values`` holds more than ``limit`` distinct values.  A subset — a prefix and an
    evenly spaced sample — with that many decides it without sorting all of a wide query's
    weights (``SUM(income)``'s 500 001 are all distinct)."""
    flat = values.ravel()
    if flat.size <= limit:
        return False
    sample = np.concatenate((flat[:_SAMPLE], flat[::max(1, flat.size // _SAMPLE)]))
    return distinct(sample) > limit or (flat.size > _SAMPLE and distinct(flat) > limit)


def numerators_digest(owner: Any, numerators: np.ndarray) -> bytes:
    """SHA-256 of ``numerators``' int64 bytes, memoised in ``owner.__dict__`` (``_digest``): a
    query's key and pattern read the same digest, and a wide GROUP BY's group query hashes
    72 MB of (mostly zero) numerators."""
    found = owner.__dict__.get("_digest")
    if found is None:
        found = owner.__dict__["_digest"] = hashlib.sha256(np.ascontiguousarray(numerators, dtype=np.int64).data).digest()
    return cast(bytes, found)
