"""Opening a gateway's ledger, and keying the order of privacy units' rows by it (internal)."""

from __future__ import annotations

from typing import Any

from dpgate.errors import LedgerError
from dpgate.ledger.core import Ledger
from dpgate.release._bounding import ROW_ORDER
from dpgate.release.cube import Cube

__all__ = ["ledger_for"]


def ledger_for(cube: Cube, ledger: str | Ledger | None, **how: Any) -> Ledger:
    """``ledger`` if it is open, else ``Ledger.open(ledger, **how)``; a schema with privacy units
    then keeps each unit's rows in an order keyed by the ledger's key, so that every answer ever
    recorded in it is about the same bounded table (:mod:`dpgate.release._bounding`)."""
    if isinstance(ledger, Ledger) and ledger.privacy != how.get("privacy", "pure"):
        raise LedgerError(f"This open ledger keeps {ledger.privacy!r} accounting, but the gateway was asked for "
                          f"privacy={how.get('privacy')!r}: pass privacy={ledger.privacy!r}, or another ledger.")
    opened = ledger if isinstance(ledger, Ledger) else Ledger.open(ledger, **how)
    if any(t.privacy_unit is not None for t in cube.schema.tables):
        try:
            cube.order_rows(opened.derived_key(ROW_ORDER))
        except BaseException:
            if opened is not ledger:
                opened.close()
            raise
    return opened
