"""``SHOW dpgate.history``: the analyst's provenance rows, with the text of the statement each was for.

The provenance store keeps a statement's hash (it binds a charge or a delivery to one statement
and its parameters); an analyst reading their history wants the SQL they sent.  A charge names
its ledger record, whose ``sql`` is that text; a delivery takes the text of a charge of the
same hash, else the text this session remembers for the hash (a statement answered from
history, never charged to this analyst, in a bounded memo); else NULL.  Only this analyst's own
rows are read, so only their own statements are shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpgate.server._protocol import Field
from dpgate.server._values import FLOAT8, INT8, TEXT, TYPE_SIZES

__all__ = ["FIELDS", "with_statements", "MEMO_SIZE"]

MEMO_SIZE = 4096  # statement texts a session remembers by hash
FIELDS = tuple(Field(n, o, TYPE_SIZES.get(o, -1)) for n, o in (
    ("id", INT8), ("created_at", TEXT), ("kind", TEXT), ("statement", TEXT), ("source", TEXT), ("epsilon", FLOAT8),
    ("record_id", INT8), ("sql", TEXT)))


def with_statements(rows: Sequence[tuple[Any, ...]], record_sql: Mapping[int, str],
                    memo: Mapping[str, str]) -> tuple[tuple[Any, ...], ...]:
    """``rows`` ``(id, created_at, kind, statement hash, source, epsilon, record_id)`` with the statement's text."""
    by_hash: dict[str, str] = {}
    for r in rows:
        if r[6] is not None and r[6] in record_sql:
            by_hash.setdefault(r[3], record_sql[r[6]])
    return tuple((*r, record_sql.get(r[6]) if r[6] is not None and r[6] in record_sql
                  else by_hash.get(r[3], memo.get(r[3]))) for r in rows)
