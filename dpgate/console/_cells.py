"""Where the budget went: the per-cell spent budget of a table, from the ledger's records.

The computation lives in :mod:`dpgate.ledger._cell_spend` (the gateway's ``plot_cells`` shows the
same numbers); this module holds the console's limit on the grid it prices.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpgate.ledger import LedgerRecord, _cell_spend
from dpgate.ledger._cell_spend import CellSpend, cell_label
from dpgate.schema.domains import Table

__all__ = ["CellSpend", "MAX_BOXES", "cell_label", "cell_spend"]

#: The most boxes of a table's union grid the console prices (:data:`dpgate.ledger._cell_spend.MAX_BOXES`).
MAX_BOXES = _cell_spend.MAX_BOXES


def cell_spend(records: Sequence[LedgerRecord], table: Table) -> CellSpend:
    """:func:`dpgate.ledger._cell_spend.cell_spend` within the console's :data:`MAX_BOXES`."""
    return _cell_spend.cell_spend(records, table, max_boxes=MAX_BOXES)
