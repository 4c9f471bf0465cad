"""What the console shows, read from the ledger alone: releases, budget over time, analysts, cells.

:class:`LedgerReader` opens a ledger with :meth:`~dpgate.ledger.Ledger.open_existing` (its key,
when readable, verifies the chain; the console never writes) and keeps a snapshot that each
request brings up to date with the records committed since (``records(since=last id)``), so a
ledger of 10 000 releases is read once, not on every page.  The provenance table of ``dpgate
serve`` (when there is one) says which analyst each fresh release was made for and which
statements each analyst received, and from where (``history``: free; ``fresh``; ``mixed``).
No data is read: the ledger holds only the public queries, their noise and released values.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.special import erfinv

from dpgate.errors import Error, InvalidArgument, LedgerError
from dpgate.ledger import Ledger, LedgerRecord
from dpgate.ledger._cell_spend import CellSpend, cell_spend
from dpgate.ledger._describe import _described
from dpgate.ledger._provenance import analyst_spent
from dpgate.schema.domains import Schema

__all__ = ["AnalystRow", "LedgerReader", "ReleaseRow", "Snapshot", "interval_halfwidth"]

#: The confidence of the intervals shown with released values: the noise's central 95 %.
CONFIDENCE = 0.95


def interval_halfwidth(scale: float, lattice: float, confidence: float = CONFIDENCE, noise: str = "") -> float:
    """The half-width ``m·γ`` of the smallest symmetric interval holding the release's noise
    ``Z·γ`` with probability ≥ ``confidence``: ``Z`` discrete Laplace of parameter ``t = b/γ``
    (:class:`~dpgate.release.noise.NoisyRelease`), ``P(|Z| > m) = 2e^{−(m+1)/t} / (1 + e^{−1/t})``.
    A Gaussian release (``noise="discrete_gaussian"``, zCDP): the normal's ``σ z`` plus one step γ
    (the quantile coupling of ``dpgate.release._gaussian``).

    >>> round(interval_halfwidth(10.0, 1.0), 6)
    30.0
    """
    if scale <= 0 or lattice <= 0:
        return 0.0
    if noise == "discrete_gaussian":
        return scale * math.sqrt(2.0) * float(erfinv(confidence)) + lattice
    t = scale / lattice
    m = math.ceil(t * math.log(2.0 / ((1.0 - confidence) * (1.0 + math.exp(-1.0 / t))))) - 1
    return max(0, m) * lattice


@dataclass(frozen=True)
class ReleaseRow:
    """One release as the history page shows it (from its ledger record and provenance)."""

    id: int
    created_at: str
    table: str
    sql: str
    measured: str
    alpha: float
    charged: float
    cost_after: float
    value: float
    halfwidth: float
    analyst: str
    source: str


@dataclass(frozen=True)
class AnalystRow:
    """One analyst: cap (``None`` when no users file gives it), spent, left, statements received,
    how many of them were answered from history alone (free), and whether ``spent`` was verified."""

    name: str
    cap: float | None
    spent: float
    left: float | None
    statements: int
    free: int
    verified: bool

    @property
    def free_share(self) -> float:
        """The share of the analyst's statements answered from history alone (0 without any)."""
        return self.free / self.statements if self.statements else 0.0


@dataclass
class Snapshot:
    """The ledger as last read: its budget, records and provenance rows (``dpgate serve``)."""

    budget: float
    records: list[LedgerRecord] = field(default_factory=list)
    releases: list[ReleaseRow] = field(default_factory=list)
    #: ``(id, analyst, kind, record_id, epsilon, statement, source, created_at)`` per provenance row.
    provenance: list[tuple[Any, ...]] = field(default_factory=list)
    charged_to: dict[int, str] = field(default_factory=dict)
    #: Position of each record in ``records``, by id.
    index: dict[int, int] = field(default_factory=dict)
    cells: dict[str, tuple[int, CellSpend]] = field(default_factory=dict)

    @property
    def spent(self) -> float:
        """The system cost after the last release (its record's ``cost_after``)."""
        return self.records[-1].cost_after if self.records else 0.0


class LedgerReader:
    """A ledger opened for reading, with its snapshot (thread-safe; see the module docstring).

    Args:
        path: the SQLite ledger file.
        schema: the schema (for what each release measured and the per-cell pages); optional.
        caps: each analyst's cap ε (from a users file); optional.
        key: the ledger's key (bytes or a key file), default ``<path>.key`` when readable.
    """

    def __init__(self, path: str | os.PathLike[str], schema: Schema | None = None,
                 caps: Mapping[str, float] | None = None, key: bytes | str | None = None) -> None:
        self.ledger = Ledger.open_existing(path, key=key)
        self.schema = schema
        self.caps = dict(caps or {})
        self._lock = threading.Lock()
        self._snap = Snapshot(self.ledger.budget)
        self._provenance_seen = 0

    @property
    def verified(self) -> bool:
        """Whether the ledger was opened with its key (chain and provenance verified)."""
        try:
            self.ledger.provenance_key()
        except LedgerError:
            return False
        return True

    def close(self) -> None:
        """Close the ledger."""
        self.ledger.close()

    def snapshot(self) -> Snapshot:
        """The snapshot, brought up to date with the records and provenance committed since."""
        with self._lock:
            snap = self._snap
            new = self.ledger.records(since=snap.records[-1].id if snap.records else 0)
            rows = self._provenance_rows()
            named: list[int] = []
            for row in rows:
                if row[2] == "charge" and row[3] is not None:
                    snap.charged_to[int(row[3])] = str(row[1])
                    named.append(int(row[3]))
            snap.provenance.extend(rows)
            for rid in named:  # a charge may name a release read before: its analyst is filled in
                at = snap.index.get(rid)
                if at is not None:
                    snap.releases[at] = self._release(snap.records[at],
                                                      snap.records[at - 1].cost_after if at else 0.0, snap)
            previous = snap.records[-1].cost_after if snap.records else 0.0
            for record in new:
                snap.index[record.id] = len(snap.records)
                snap.releases.append(self._release(record, previous, snap))
                snap.records.append(record)
                previous = record.cost_after
            return snap

    def _provenance_rows(self) -> list[tuple[Any, ...]]:
        def fetch(conn: Any) -> list[tuple[Any, ...]]:
            there = conn.execute("SELECT name FROM sqlite_master WHERE name = 'dpgate_provenance'").fetchall()
            if not there:
                return []
            return [tuple(r) for r in conn.execute(
                "SELECT id, analyst, kind, record_id, epsilon, statement, source, created_at FROM dpgate_provenance "
                "WHERE id > ? ORDER BY id", (self._provenance_seen,)).fetchall()]
        rows: list[tuple[Any, ...]] = self.ledger.store.read(fetch)
        if rows:
            self._provenance_seen = int(rows[-1][0])
        return rows

    def _release(self, r: LedgerRecord, previous: float, snap: Snapshot) -> ReleaseRow:
        measured = ""
        if self.schema is not None:
            try:
                measured = _described(r.query, self.schema.table(r.table))
            except (Error, ValueError, KeyError, TypeError):
                measured = "(outside the schema)"
        analyst = snap.charged_to.get(r.id, "")
        return ReleaseRow(r.id, r.created_at, r.table, r.sql, measured, r.alpha, max(0.0, r.cost_after - previous),
                          r.cost_after, r.value, interval_halfwidth(r.scale, r.lattice, noise=r.noise), analyst,
                          "fresh" if analyst else "")

    # -- the pages' numbers ---------------------------------------------------------------------
    def analysts(self, snap: Snapshot) -> list[AnalystRow]:
        """Every analyst of the users file or the provenance, with what they were charged and received."""
        names = dict.fromkeys([*self.caps, *(str(row[1]) for row in snap.provenance)])
        charged: dict[str, float] = {}
        received: dict[str, list[int]] = {}  # per analyst: [statements, answered from history alone]
        for row in snap.provenance:
            name = str(row[1])
            if row[2] == "charge":
                charged[name] = charged.get(name, 0.0) + float(row[4])
            elif row[2] == "delivery":
                counts = received.setdefault(name, [0, 0])
                counts[0] += 1
                counts[1] += row[6] == "history"
        out = []
        for name in names:
            spent, verified = charged.get(name, 0.0), False
            if self.verified and snap.provenance:  # the exact, verified charge (per-cell, their releases)
                spent, verified = analyst_spent(self.ledger, name, self.schema), True
            cap = self.caps.get(name)
            statements, free = received.get(name, [0, 0])
            out.append(AnalystRow(name, cap, spent, None if cap is None else max(0.0, cap - spent), statements, free,
                                  verified))
        return out

    def analyst_series(self, snap: Snapshot) -> list[dict[str, Any]]:
        """Per analyst, their cumulative charge after each fresh release made for them."""
        totals: dict[str, float] = {}
        out = []
        for row in snap.provenance:
            if row[2] != "charge":
                continue
            name = str(row[1])
            totals[name] = totals.get(name, 0.0) + float(row[4])
            out.append({"release": int(row[3]), "analyst": name, "spent": totals[name], "time": str(row[7])})
        return out

    def sources(self, snap: Snapshot) -> list[dict[str, Any]]:
        """Per analyst and source (``history``: free, ``fresh``, ``mixed``), the statements received."""
        counts: dict[tuple[str, str], int] = {}
        for row in snap.provenance:
            if row[2] == "delivery" and row[6] in ("history", "fresh", "mixed"):
                counts[(str(row[1]), str(row[6]))] = counts.get((str(row[1]), str(row[6])), 0) + 1
        return [{"analyst": a, "source": s, "statements": n} for (a, s), n in sorted(counts.items())]

    def cells(self, snap: Snapshot, table: str) -> CellSpend:
        """``B`` of ``table`` (:func:`~dpgate.ledger._cell_spend.cell_spend`), kept until a release arrives."""
        if self.schema is None:
            raise InvalidArgument("the console was started without --schema, so it cannot place the releases on cells")
        t = self.schema.table(table)
        with self._lock:
            hit = snap.cells.get(t.name)
            count = len(snap.records)
        if hit is not None and hit[0] == count:
            return hit[1]
        found = cell_spend(snap.records[:count], t, zcdp=self.ledger.privacy == "zcdp")
        with self._lock:
            snap.cells[t.name] = (count, found)
        return found

    def filtered(self, snap: Snapshot, *, text: str = "", analyst: str = "", table: str = "") -> list[ReleaseRow]:
        """The releases whose SQL or description contains ``text`` (plain, case-insensitive), of
        ``analyst`` and ``table`` when given (exact; ``-`` for releases no analyst was charged)."""
        needle = text.lower()
        rows: Sequence[ReleaseRow] = snap.releases
        out = []
        for r in rows:
            if table and r.table.lower() != table.lower():
                continue
            if analyst and r.analyst != ("" if analyst == "-" else analyst):
                continue
            if needle and needle not in r.sql.lower() and needle not in r.measured.lower():
                continue
            out.append(r)
        return out
