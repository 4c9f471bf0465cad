"""Per-analyst provenance and budget caps, kept in the ledger's own database (SQLite or PostgreSQL).

Table ``dpgate_provenance`` (append-only, like the records) holds two kinds of row:

* ``charge``: written by a hook *inside the release's own ledger transaction*
  (:meth:`dpgate.ledger.core.Ledger.on_append`): which analyst a fresh release
  (``record_id``) was made for, and the ε it cost them — the increase of the
  system's per-cell cost ``max_j B_j`` it caused.  The hook first checks the
  analyst's cap (the sum of their charges, read under the ledger's write lock,
  so several server processes — on several hosts, with a PostgreSQL ledger — cannot
  overspend a cap together either); over the
  cap it raises :class:`~dpgate.errors.BudgetExhausted`, which rolls the whole
  transaction back: nothing is recorded and nothing is released.  This check is
  the authoritative one; the server also refuses *before* running a statement
  whose quote (:meth:`dpgate.Gateway.explain`) already exceeds the cap, so that a
  refused statement reads no data — but a quote can be stale when another
  release lands in between, which this hook catches.
* ``delivery``: one per answered statement, committed before the answer is
  sent (not fsync'd: it survives a crash of the server, not a power loss; it
  spends nothing): which analyst received which statement's answers (a SHA-256
  of the statement, never its values), from where (``history``, ``fresh``,
  ``mixed``) and the ε charged to them for it.

The table and its statements belong to the ledger's store
(:class:`~dpgate.ledger._store.LedgerStore`, :attr:`dpgate.ledger.core.Ledger.store`); this
module holds the rules: what is charged, when a cap refuses, and the refusal's words.

The per-cell charge an analyst pays sums, over the releases made for them, the
increase of the *global* cost; so the analysts' charges add up to at most the
global spend, and a release made for one analyst is free for every other
(answers from history are post-processing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from dpgate.ledger._store import ProvenanceRow, ProvenanceWriter
from dpgate.ledger.core import Ledger
from dpgate.plan.budget import exhausted, fits

__all__ = ["ensure_table", "charging", "record_delivery", "analyst_spent", "analyst_history", "statement_hash"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def statement_hash(sql: str, params: Any = None) -> str:
    """A short SHA-256 of the statement text and its parameters (for logs and provenance)."""
    bound = tuple(params) if params else ()  # the same for both protocols: () when nothing is bound
    return hashlib.sha256(f"{sql}\x00{bound!r}".encode()).hexdigest()[:16]


def ensure_table(ledger: Ledger) -> None:
    """Create the provenance table in the ledger's database if it is not there yet."""
    ledger.store.ensure_provenance()


@contextmanager
def charging(ledger: Ledger, analyst: str, cap: float, statement: str) -> Iterator[None]:
    """Within the block, every release this thread records is charged to ``analyst``
    in the same ledger transaction, and refused (rolled back) if it would take the
    analyst's charges above ``cap``."""
    # The previous record's cost and the analyst's charges, carried from one record of a statement
    # to the next in the same transaction (a GROUP BY appends many); read afresh otherwise.
    last: dict[str, Any] = {"tx": None, "id": None, "cost": 0.0, "spent": 0.0}

    def hook(provenance: ProvenanceWriter, record_id: int, cost_after: float) -> None:
        if last["tx"] is provenance and last["id"] == record_id - 1:
            prev, spent = last["cost"], last["spent"]
        else:
            prev, spent = provenance.cost_before(record_id), provenance.spent(analyst)
        delta = max(0.0, cost_after - prev)
        if not fits(spent, delta, cap):
            raise exhausted(delta, spent, cap, what="Answering this statement", purpose=" more for its next release",
                            analyst=analyst, hint=" Nothing was spent.")
        provenance.add(ProvenanceRow(analyst, "charge", record_id, delta, statement, "fresh", _now()))
        last.update(tx=provenance, id=record_id, cost=cost_after, spent=spent + delta)

    with ledger.on_append(hook):
        yield


def record_delivery(ledger: Ledger, analyst: str, statement: str, source: str, epsilon: float) -> None:
    """Record, before the answer is sent, that ``analyst`` received the answers of ``statement``.

    Committed without an fsync (it survives a crash of the server process, not a power loss):
    a delivery spends nothing — the ε of a fresh answer is in its charge rows, fsync'd with
    the release itself — and an fsync per free answer would cost more than answering it.
    """
    ledger.store.add_provenance(ProvenanceRow(analyst, "delivery", None, float(epsilon), statement, source, _now()),
                                fsync=False)


def analyst_spent(ledger: Ledger, analyst: str) -> float:
    """ε charged to ``analyst`` so far (committed charges)."""
    return ledger.store.analyst_spent(analyst)


def analyst_history(ledger: Ledger, analyst: str) -> list[tuple[Any, ...]]:
    """The analyst's provenance rows: ``(id, created_at, kind, statement, source, epsilon, record_id)``."""
    return ledger.store.analyst_history(analyst)
