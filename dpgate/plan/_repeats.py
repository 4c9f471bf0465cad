"""The history of queries the inference atoms do not hold: keyed by :func:`isolation_key`,
estimated from their exact repeats (:class:`Repeats`).

Re-exported by :mod:`dpgate.plan.state`, whose :class:`~dpgate.plan.state.TableState` keeps them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from dpgate.compile.query import LinearQuery
from dpgate.inference import ErrorLaw, Estimate, IncrementalBLUE, Posterior
from dpgate.plan._view import _frozen

__all__ = ["Repeats", "isolation_key"]

_ONE = np.ones(1)


def isolation_key(query: LinearQuery) -> tuple[str, float]:
    """``(key, factor)``: ``query`` is ``factor`` times the query the key names.

    Queries kept outside the atoms (see :meth:`TableState.refined`) are reused only
    across exact repeats and rescalings: two queries share a key iff they have the same
    grid and proportional weights (numerators divided by their gcd, first non-zero
    positive).  Zero queries are never measured and have no key.

    Memoised by the query's weights (a GROUP BY's isolated groups are keyed when planned
    and again when recorded).
    """
    memo = (query.table.lower(), query.pattern, query.denominator)
    found = _ISOLATION_KEYS.get(memo)
    if found is None:
        if len(_ISOLATION_KEYS) >= _ISOLATION_KEYS_MAX:
            _ISOLATION_KEYS.clear()
        found = _ISOLATION_KEYS[memo] = _isolation_key(query)
    return found


_ISOLATION_KEYS: dict[tuple[object, ...], tuple[str, float]] = {}
_ISOLATION_KEYS_MAX = 1 << 16


def _isolation_key(query: LinearQuery) -> tuple[str, float]:
    nums = np.asarray(query.numerators, dtype=np.int64).ravel()
    first = nums[int(np.argmax(nums != 0))]
    g = _gcd(nums) * (1 if first > 0 else -1)
    # The text of repr((table, columns, breakpoints, shape)), with a wide column's long breakpoint
    # tuple written once per tuple (the key is unchanged: ledgers' checkpoints hold it).
    bps = ", ".join(map(_long_repr, query.breakpoints)) + ("," if len(query.breakpoints) == 1 else "")
    head = f"({query.table.lower()!r}, {query.columns!r}, ({bps}), {query.numerators.shape!r})"
    digest = hashlib.sha256(head.encode())  # then the numerators' bytes, read in place (no copy of a wide query's)
    digest.update(np.ascontiguousarray(nums if g == 1 else nums // g).data)
    return digest.hexdigest(), g / query.denominator


def _gcd(nums: np.ndarray) -> int:
    """``gcd(|nums|)``, read in growing chunks that stop once it is 1 (a wide query's weights
    hold a 1 early: ``SUM(income)`` weighs the cell of income 1 by 1)."""
    g, start, step = 0, 0, 4096
    while start < nums.size and g != 1:
        g = int(np.gcd.reduce(np.abs(nums[start:start + step]), initial=g))
        start, step = start + step, step * 4
    return g


def _long_repr(values: tuple[int, ...]) -> str:
    """``repr(values)``, memoised by identity for long tuples (a wide column's unit slabs are one
    shared tuple; the memo holds it, so its id is not reused meanwhile)."""
    if len(values) <= 64:
        return repr(values)
    hit = _LONG_REPRS.get(id(values))
    if hit is None or hit[0] is not values:
        if len(_LONG_REPRS) >= 16:
            _LONG_REPRS.clear()
        hit = _LONG_REPRS[id(values)] = (values, repr(values))
    return hit[1]


_LONG_REPRS: dict[int, tuple[tuple[int, ...], str]] = {}


@dataclass(frozen=True)
class Repeats:
    """The releases of one query kept outside the atoms, and of its rescalings (one
    :func:`isolation_key`): per release ``(factor, scale, value, lattice)``, and a fifth 1.0 for a
    Gaussian release (scale = its deviation σ).  Its one-atom
    BLUE is built when first read — most such queries (a GROUP BY's isolated groups) are
    never asked again.  Immutable: :meth:`plus` returns a new one."""

    rows: tuple[tuple[float, ...], ...] = ()
    _blue: list[IncrementalBLUE] = field(default_factory=list, repr=False, compare=False)

    def blue(self) -> IncrementalBLUE:
        """The BLUE over these releases (one atom: the key's query); copy it before appending."""
        if not self._blue:
            blue = IncrementalBLUE(_ONE)
            for factor, scale, value, lattice, *gaussian in self.rows:
                blue.append([factor], scale, value, lattice=lattice, gaussian=bool(gaussian))
            self._blue.append(blue)
        return self._blue[0]

    def estimate(self, factor: float) -> Estimate:
        """The BLUE of ``factor`` times the key's query from these releases, in closed form
        (what :meth:`blue`'s ``estimate([factor])`` gives: one unknown, so each release
        ``(f, b)`` is weighted by ``f/b²``), without building the BLUE."""
        if any(len(r) > 4 for r in self.rows):  # Gaussian releases: each weighted by f/Var
            f, b, y, g = (np.array([r[k] for r in self.rows], dtype=float) for k in range(4))
            n = np.array([len(r) > 4 for r in self.rows])
            var = np.where(n, b**2, 2.0 * b**2)
            A = factor * (f / var) / float(np.dot(f, f / var))
            law = ErrorLaw(A, b, g, gaussian=n)
            value = float(A @ y)
            return Estimate(value, _frozen(A), law.variance, True, Posterior(value, law), _frozen(b), _frozen(g),
                            _frozen(n))
        f, b, y, g = (np.array(col, dtype=float) for col in zip(*self.rows, strict=True))
        A = factor * (f / b**2) / float(np.dot(f, f / b**2))
        value = float(A @ y)
        law = ErrorLaw(A, b, g)
        return Estimate(value, _frozen(A), law.variance, True, Posterior(value, law), _frozen(b), _frozen(g))

    def plus(self, factor: float, scale: float, value: float, lattice: float, gaussian: bool = False) -> Repeats:
        """These releases and one more (``gaussian``: its noise is Gaussian of deviation ``scale``)."""
        out = Repeats((*self.rows, (factor, scale, value, lattice, 1.0) if gaussian else (factor, scale, value, lattice)))
        if self._blue:  # already built: extend a copy rather than rebuild
            blue = self._blue[0].copy()
            blue.append([factor], scale, value, lattice=lattice, gaussian=gaussian)
            out._blue.append(blue)
        return out


_NO_REPEATS = Repeats()
