"""A table's privacy unit (:mod:`dpgate.schema._unit`): declaration, the deprecated key, hostile input."""

from __future__ import annotations

from typing import Any

import pytest

from dpgate.errors import SchemaError
from dpgate.schema._unit import MAX_ROWS_PER_UNIT
from dpgate.schema.domains import Schema
from dpgate.schema.tables import Column, Table

COLUMNS = {"amount": {"type": "integer", "min": 0, "max": 9}}


def schema(**table: Any) -> Schema:
    return Schema.from_dict({"tables": {"orders": {"columns": COLUMNS, **table}}})


def test_a_unit_and_its_bound_survive_the_file_format() -> None:
    s = schema(privacy_unit="customer_id", max_rows_per_unit=5)
    t = s.table("orders")
    assert (t.privacy_unit, t.max_rows_per_unit, t.max_rows_per_individual) == ("customer_id", 5, 5)
    assert s.to_dict()["tables"]["orders"]["privacy_unit"] == "customer_id"
    again = Schema.from_dict(s.to_dict())
    assert again == s and again.fingerprint() == s.fingerprint()
    unbounded = schema(privacy_unit="customer_id").table("orders")  # loads, but no query on it will
    assert unbounded.max_rows_per_unit is None and Schema.from_dict(schema(privacy_unit="c").to_dict())
    with pytest.raises(SchemaError, match="no max_rows_per_unit.*'max_rows_per_unit: 5'"):
        unbounded.bound()
    assert schema().table("orders").privacy_unit is None  # row-level, as before


def test_the_old_key_still_loads_with_a_deprecation_that_says_what_to_write() -> None:
    with pytest.warns(DeprecationWarning, match="privacy_unit: <column identifying a person>.*max_rows_per_unit: 3"):
        s = schema(max_rows_per_individual=3)
    t = s.table("orders")
    assert (t.privacy_unit, t.max_rows_per_unit) == (None, 3)
    # Written back as it was declared, so ledgers bound to such a schema still open.
    assert s.to_dict()["tables"]["orders"] == {"columns": COLUMNS, "max_rows_per_individual": 3}
    with pytest.warns(DeprecationWarning, match="privacy_unit: pid"):
        assert schema(privacy_unit="pid", max_rows_per_individual=2).table("orders").max_rows_per_unit == 2


@pytest.mark.parametrize(("table", "message"), [
    ({"privacy_unit": "u", "max_rows_per_unit": 2, "max_rows_per_individual": 2}, "declares both"),
    ({"max_rows_per_unit": 2}, "needs 'privacy_unit"),
    ({"privacy_unit": "u", "max_rows_per_unit": 0}, "integer ≥ 1, got 0"),
    ({"privacy_unit": "u", "max_rows_per_unit": -4}, "integer ≥ 1"),
    ({"privacy_unit": "u", "max_rows_per_unit": True}, "integer ≥ 1, got True"),
    ({"privacy_unit": "u", "max_rows_per_unit": 2.0}, "integer ≥ 1"),
    ({"privacy_unit": "u", "max_rows_per_unit": "5"}, "integer ≥ 1"),
    ({"privacy_unit": "u", "max_rows_per_unit": MAX_ROWS_PER_UNIT + 1}, "above the limit"),
    ({"privacy_unit": "u", "max_rows_per_unit": 10**400}, "above the limit"),
    ({"privacy_unit": "u", "max_rows_per_unit": 10**5000}, "integer of 16610 bits, above the limit"),
    ({"privacy_unit": 7}, "privacy_unit must name the column"),
    ({"privacy_unit": ""}, "privacy_unit must name the column"),
    ({"privacy_unit": "   "}, "privacy_unit must name the column"),
    ({"privacy_unit": ["u"]}, "privacy_unit must name the column"),
    ({"privacy_unit": {"a": 1}}, "privacy_unit must name the column"),
    ({"privacy_unit": "x" * 10_000}, "privacy_unit must name the column"),
    ({"privacy_unit": "a\x00b"}, "privacy_unit must name the column"),
    ({"privacy_unit": "\ud800"}, "valid Unicode"),
])
def test_hostile_declarations_are_refused_with_a_specific_message(table: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message) as info:
        schema(**table)
    assert len(str(info.value)) < 600  # a huge declaration is not echoed whole


def test_the_deprecated_key_is_still_validated() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(SchemaError, match="max_rows_per_individual"):
        schema(max_rows_per_individual=0)


def test_a_unit_listed_under_columns_is_not_queryable() -> None:
    """As SmartNoise's ``private_id`` column: accepted in the file, its domain ignored, never a column."""
    columns = {**COLUMNS, "Customer_ID": {"type": "integer", "min": 0, "max": 10**6}}
    t = Schema.from_dict({"tables": {"orders": {"columns": columns, "privacy_unit": "customer_id",
                                                "max_rows_per_unit": 2}}}).table("orders")
    assert [c.name for c in t.columns] == ["amount"] and not t.has_column("customer_id")
    with pytest.raises(SchemaError, match="also one of the table's columns"):
        Table("orders", (Column("uid", "boolean"), Column("a", "boolean")), privacy_unit="UID")


def test_a_dataframe_schema_may_declare_its_unit() -> None:
    import pandas as pd

    df = pd.DataFrame({"uid": [1, 1, 2], "amount": [3, 4, 5]})
    t = Schema.from_dataframe(df, "orders", bounds={"amount": (0, 9)}, privacy_unit="uid",
                              max_rows_per_unit=2).table("orders")
    assert (t.privacy_unit, t.max_rows_per_unit, [c.name for c in t.columns]) == ("uid", 2, ["amount"])
    with pytest.raises(SchemaError, match="names no column"):
        Schema.from_dataframe(df, bounds={"amount": (0, 9)}, privacy_unit="user", max_rows_per_unit=2)
    with pytest.raises(SchemaError, match="needs 'privacy_unit"):
        Schema.from_dataframe(df.drop(columns="uid"), bounds={"amount": (0, 9)}, max_rows_per_unit=2)
    with pytest.raises(SchemaError, match="declares both"):
        Schema.from_dataframe(df, bounds={"amount": (0, 9)}, privacy_unit="uid", max_rows_per_unit=2,
                              max_rows_per_individual=2)
    with pytest.warns(DeprecationWarning, match="max_rows_per_unit: 3"):
        legacy = Schema.from_dataframe(df.drop(columns="uid"), bounds={"amount": (0, 9)}, max_rows_per_individual=3)
    assert legacy.tables[0].max_rows_per_individual == 3
