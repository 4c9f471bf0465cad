"""Declared join paths and public tables (:mod:`dpgate.schema._references`): accepted, stored, checked.

Nothing reads them yet beyond the schema (declared joins are issue 30's item 4): these tests
pin the declaration format, the fingerprint of schemas that declare none, and bad input.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from dpgate.errors import SchemaError
from dpgate.schema.domains import Schema

AGE = {"age": {"type": "integer", "min": 0, "max": 100}}
AMOUNT = {"amount": {"type": "integer", "min": 0, "max": 9}}
SHOP = {"shop": {"type": "categorical", "values": ["a", "b"]}}


def spec(orders: dict[str, Any] | None = None, **others: dict[str, Any]) -> dict[str, Any]:
    tables = {
        "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {"id": {"type": "key"}, **AGE}},
        "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": 5, "columns": {**AMOUNT, **SHOP},
                   **(orders if orders is not None else {"references": {"customer_id": "customers.id",
                                                                        "shop": "shops.code"}})},
        "shops": {"public": True, "key": "code", "columns": SHOP},
    }
    for name, table in others.items():
        tables[name] = table
    return {"tables": tables}


def test_references_public_and_key_are_stored_and_round_trip() -> None:
    s = Schema.from_dict(spec())
    orders, shops = s.table("orders"), s.table("shops")
    assert orders.references == (("customer_id", "customers.id"), ("shop", "shops.code"))
    assert (shops.public, shops.key, orders.public, orders.key) == (True, "code", False, None)
    again = Schema.from_dict(s.to_dict())
    assert again == s and again.fingerprint() == s.fingerprint()
    assert s.to_dict()["tables"]["shops"] == {"columns": {"shop": SHOP["shop"]}, "public": True, "key": "code"}


def test_a_schema_declaring_none_keeps_its_format_and_fingerprint() -> None:
    s = Schema.from_dict({"tables": {"t": {"columns": AGE}}})
    assert s.to_dict() == {"tables": {"t": {"columns": {"age": {"type": "integer", "min": 0, "max": 100}}}}}
    blob = json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":"))
    assert s.fingerprint() == hashlib.sha256(blob.encode()).hexdigest()  # so ledgers bound to it still open


@pytest.mark.parametrize("orders,message", [
    ({"references": {"customer_id": "people.id"}}, "no table 'people' is declared"),
    ({"references": {"customer_id": "customers.age"}}, "'age' is not the key of 'customers'.*declare 'key: age'"),
    ({"references": {"nope": "customers.id"}}, "references 'nope', which is neither a declared column nor"),
    ({"references": {"customer_id": "customers"}}, "must be written 'table.column'"),
    ({"references": {"shop": "orders.customer_id"}}, "points at the table itself"),
    ({"references": {"customer_id": "a.b.c"}}, "must be written 'table.column'"),
    ({"references": {"customer_id": 3}}, "must be written 'table.column'"),
    ({"references": ["customer_id"]}, "references must map a column to 'table.column'"),
    ({"references": {}}, "references must map a column to 'table.column'"),
    ({"public": "yes"}, "public must be true or false"),
    ({"key": ""}, "key must name the column identifying its rows"),
    ({"key": ["a", "b"]}, "key must name the column identifying its rows"),
    ({"public": True}, "a public table holds no one's data, so it declares no privacy_unit"),
])
def test_bad_declarations_say_what_to_write(orders: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Schema.from_dict(spec(orders))


def test_an_unknown_table_key_lists_the_new_keys() -> None:
    with pytest.raises(SchemaError, match="allowed: columns, rows, privacy_unit, max_rows_per_unit, references, "
                                          "public, key"):
        Schema.from_dict({"tables": {"t": {"columns": AGE, "foreign_keys": {}}}})
