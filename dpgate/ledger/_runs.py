"""A table's recorded statements as :class:`~dpgate.ledger._history.LedgerHistory` keeps them for
local histories: wide releases by their ledger JSON, not by their weights (issue 28).

A release of ``SUM(income)`` grouped by sex and filtered on education holds 3–4.5 million int64
weights (24–36 MB); its ledger JSON, run-encoded, a few hundred bytes.  A local history replays a
statement's releases only when it is made or brought up to date, so a wide release is kept as
:class:`KeptRelease` — the JSON and the few values derived from its weights that replaying reads
(its pattern, support, lifted form, …: each computed once, on the query as released) — and its
weights are decoded for the replay and dropped after it.  Decoding is exact (``from_json`` is
:meth:`~dpgate.compile.query.LinearQuery.to_json`'s inverse), so a replay is the same as with the
query itself.  The history's memory for its runs is then a few hundred bytes per release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpgate.compile.query import LinearQuery
from dpgate.plan.state import RecordedRelease

__all__ = ["COMPACT_WEIGHTS", "KeptRelease", "kept", "released"]

#: A release whose query has more weights than this is kept as a :class:`KeptRelease` (32 KiB of
#: weights; narrower ones are cheaper kept than decoded at every replay).
COMPACT_WEIGHTS = 4096
#: The values derived from a query's weights that a replay reads (each memoised on the query's
#: ``__dict__``): kept with its JSON, so a replay does not hash, sort or lift its weights again.
_DERIVED = ("sensitivity", "weight_sign", "is_zero", "pattern", "_more_weights_than", "_support_query", "_lifted",
            "_json")


@dataclass(frozen=True, eq=False)
class KeptRelease:
    """A :class:`~dpgate.plan.state.RecordedRelease` with its query as ledger JSON (:meth:`release`
    decodes it).  ``derived``: the query's memoised values (:data:`_DERIVED`), not pickled."""

    record_id: int
    query_json: str
    scale: float
    value: float
    lattice: float
    alpha: float
    sensitivity: float
    gaussian: bool
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    def release(self) -> RecordedRelease:
        """The release with its query decoded (its memoised values set on it again)."""
        query = LinearQuery.from_json(self.query_json)
        query.__dict__.update(self.derived)
        return RecordedRelease(self.record_id, query, self.scale, self.value, self.lattice, self.alpha,
                               self.sensitivity, self.gaussian)

    def __reduce__(self) -> tuple[Any, ...]:
        """Checkpointed without ``derived`` (a pattern holds the wide column's breakpoints)."""
        return (KeptRelease, (self.record_id, self.query_json, self.scale, self.value, self.lattice, self.alpha,
                              self.sensitivity, self.gaussian))


def kept(item: RecordedRelease) -> RecordedRelease | KeptRelease:
    """``item`` as a statement's run keeps it: a :class:`KeptRelease` when its query is wide."""
    q = item.query
    if q.numerators.size <= COMPACT_WEIGHTS:
        return item
    derived = {k: q.__dict__[k] for k in _DERIVED if k in q.__dict__}
    derived["_json"] = q.to_json()
    return KeptRelease(item.record_id, derived["_json"], item.scale, item.value, item.lattice, item.alpha,
                       item.sensitivity, item.gaussian, derived)


def released(items: Sequence[RecordedRelease | KeptRelease]) -> list[RecordedRelease]:
    """A run's releases with their queries (wide ones decoded): what :meth:`TableState.record_inference` takes."""
    return [it.release() if isinstance(it, KeptRelease) else it for it in items]
