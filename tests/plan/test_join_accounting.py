"""Accounting of declared joins, by brute force (docs/privacy_unit.md, "Joins").

A tiny two-table domain — ``customers`` (one row per person) and ``orders`` (``k = 2`` per
person) joined by ``orders.customer_id = customers.id`` — and a real gateway releasing on the
fact table, the unit table and their join.  Then for EVERY neighbour that adds one person's
rows to both tables (0–2 customer rows, 0–3 orders, in every combination of cells: more than
the bounds, so bounding is exercised), the true numerator of every recorded release is
recomputed through the cube's own SQL (bounding, then joining), and the exact privacy loss of
everything released, under the noise law actually drawn from, must be at most ``gw.spent``.
Charging the join nothing (as if it were free post-processing of the two tables) would not be
enough: some neighbour loses more than the two tables' charges alone.
"""

from __future__ import annotations

import itertools
import warnings
from fractions import Fraction
from typing import Any

import pandas as pd
from test_unit_accounting import RecordingNoise, release_loss  # the same exact loss, same noise recorder

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.release._bounding import ROW_ORDER
from dpgate.release.cube import Cube
from dpgate.schema.domains import Schema

SPEC: dict[str, Any] = {"tables": {
    "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {
        "id": {"type": "key"}, "a": {"type": "integer", "min": 0, "max": 0, "nullable": True}}},
    "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": 2, "references": {"customer_id": "customers.id"},
               "columns": {"customer_id": {"type": "key"}, "b": {"type": "integer", "min": 0, "max": 0, "nullable": True}}},
}}
SCHEMA = Schema.from_dict(SPEC)
JOIN = "FROM orders o JOIN customers c ON o.customer_id = c.id"
SECRET = b"a" * 32


def base() -> dict[str, pd.DataFrame]:
    cust = pd.DataFrame({"id": [0, 1, 2], "a": pd.array([0, None, 0], dtype="Int64")})
    orders = pd.DataFrame({"customer_id": [0, 0, 0, 1, 2, 2, 3],
                           "b": pd.array([0, None, 0, 0, None, None, 0], dtype="Int64")})
    return {"customers": cust, "orders": orders}


def with_person(data: dict[str, pd.DataFrame], cust: tuple[int, ...], orders: tuple[int, ...]) -> dict[str, pd.DataFrame]:
    """``data`` plus person 9, with a customer row per cell in ``cust`` and an order per cell in ``orders``
    (cell 0: value 0, cell 1: NULL)."""
    def value(j: int) -> Any:
        return 0 if j == 0 else None
    c = pd.DataFrame({"id": [9] * len(cust), "a": pd.array([value(j) for j in cust], dtype="Int64")})
    o = pd.DataFrame({"customer_id": [9] * len(orders), "b": pd.array([value(j) for j in orders], dtype="Int64")})
    return {"customers": pd.concat([data["customers"], c], ignore_index=True),
            "orders": pd.concat([data["orders"], o], ignore_index=True)}


def test_no_person_loses_more_than_the_charge_of_the_tables_and_the_join() -> None:
    data = base()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded noise: a test
        gw = dpgate.Gateway(data, SCHEMA, budget=1e9, seed=0, ledger_key=SECRET)
    noise = gw._noise = RecordingNoise(0)
    with gw:
        gw.query(f"SELECT c.a, o.b, COUNT(*) {JOIN} GROUP BY c.a, o.b", accuracy=2)
        gw.query(f"SELECT COUNT(*) {JOIN} WHERE c.a IS NULL", accuracy=1)
        gw.query("SELECT b, COUNT(*) FROM orders GROUP BY b", accuracy=2)
        gw.query("SELECT COUNT(*) FROM customers WHERE a = 0", accuracy=1)
        gw.query(f"SELECT SUM(o.b) + COUNT(*) {JOIN} WHERE o.b IS NOT NULL", accuracy=1)
        records = gw.ledger.records()
        spent = Fraction(gw.spent)
        charges = {t: Fraction(s.costs.charge) for t, s in gw._history.tables.items()}
    assert len(records) == len(noise.ts) and len(charges) == 3  # orders, customers and the join
    queries = [LinearQuery.from_json(r.query) for r in records]
    laws = [(round(1 / (r.lattice * q.denominator)), Fraction(t)) for r, q, t in zip(records, queries, noise.ts,
                                                                                        strict=True)]
    # The cube keyed as the gateway's ledger keys it: the derived row-order secret.
    key = gw._ledger.derived_key(ROW_ORDER)
    before = _numerators(data, queries, key)
    worst = Fraction(0)
    for nc, no in itertools.product(range(3), range(4)):
        for cust in itertools.combinations_with_replacement(range(2), nc):
            for orders in itertools.combinations_with_replacement(range(2), no):
                after = _numerators(with_person(data, cust, orders), queries, key)
                loss = sum((release_loss((n1 - n0) * mult, t) for n0, n1, (mult, t) in zip(before, after, laws,
                                                                                         strict=True)), Fraction(0))
                assert loss <= spent * (1 + Fraction(1, 2**50)), (cust, orders, float(loss), float(spent))
                worst = max(worst, loss)
    join = next(v for t, v in charges.items() if " join " in t)
    assert worst > spent - join  # the join's own charge is needed: the tables' charges alone do not cover it


def _numerators(data: dict[str, pd.DataFrame], queries: list[LinearQuery], key: bytes) -> list[int]:
    with Cube(data, SCHEMA, row_order=key) as cube:
        return [cube.true_numerator(q) for q in queries]
