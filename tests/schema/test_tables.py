"""Stage "schema" (:mod:`dpgate.schema.tables`, :mod:`dpgate.schema.domains`): the declared cells
of each column kind, and a schema's round trip through its file format."""

from __future__ import annotations

import pytest

from dpgate.errors import SchemaError
from dpgate.schema.domains import Schema
from dpgate.schema.tables import MAX_DECLARED_VALUES, NULL_LABEL, OTHER_LABEL, Column, Table

SPEC = {"tables": {"t": {"rows": 10, "columns": {
    "age": {"type": "integer", "min": 3, "max": 7, "nullable": True},
    "income": {"type": "integer", "min": 0, "max": 99, "bins": [0, 10, 50, 100]},
    "sex": {"type": "categorical", "values": ["f", "m"], "other": True},
    "married": {"type": "boolean"},
}}}}


def test_cells_of_each_kind_are_the_declared_ones_then_other_then_null() -> None:
    t = Schema.from_dict(SPEC).table("t")
    age, income, sex, married = (t.column(c) for c in ("age", "income", "sex", "married"))
    assert age.labels() == [3, 4, 5, 6, 7, NULL_LABEL] and age.n_cells == 6 and age.null_cell == 5
    assert income.n_cells == 4 and income.null_cell == 3  # three half-open bins, then NULL
    assert sex.labels() == ["f", "m", OTHER_LABEL, NULL_LABEL] and sex.other_cell == 2
    assert married.n_cells == 3 and married.other_cell is None
    # GROUP BY keys: the declared ones, NULL only where nullable, <other> only where other: true
    assert age.group_cells() == [0, 1, 2, 3, 4, 5] and sex.group_cells() == [0, 1, 2] and married.group_cells() == [0, 1]
    assert t.n_cells == 6 * 4 * 4 * 3 and t.axis("sex") == 2 and t.column("SEX") is sex


def test_a_schema_survives_its_file_format() -> None:
    s = Schema.from_dict(SPEC)
    again = Schema.from_dict(s.to_dict())
    assert again == s and again.fingerprint() == s.fingerprint()
    assert isinstance(again.table("T"), Table) and isinstance(again.table("t").column("age"), Column)


def test_bad_declarations_are_refused_with_a_message_that_says_what_to_change() -> None:
    with pytest.raises(SchemaError, match="min"):
        Schema.from_dict({"tables": {"t": {"columns": {"a": {"type": "integer", "min": 5, "max": 1}}}}})
    with pytest.raises(SchemaError, match=str(MAX_DECLARED_VALUES).replace("000", "[ ,_]?000")):
        Schema.from_dict({"tables": {"t": {"columns": {
            "c": {"type": "categorical", "values": [str(i) for i in range(MAX_DECLARED_VALUES + 1)]}}}}})
    with pytest.raises(SchemaError, match="not declared"):
        Schema.from_dict(SPEC).table("nope")
