"""``df.dp`` over frames joined along a declared unit column: ``orders.dp.configure(references=…,
tables={"customers": customers}, schemas={"customers": {...}})`` answers the join's brute-force truncated
truth (the keyed order of the join tests, :mod:`test_join_backends`), gives the joined frames one budget,
and refuses bad declarations with the gateway's own errors, before anything is spent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "release"))
from test_join_backends import SPEC, START, make_data, reference_join  # noqa: E402  (the keyed-order reference)

import dpgate  # noqa: E402
import dpgate.accessor  # noqa: E402, F401  (registers df.dp)

SECRET = b"a" * 32
CUSTOMERS, SHOPS = SPEC["tables"]["customers"], SPEC["tables"]["shops"]


def declare(**extra: Any) -> dict[str, Any]:
    """configure's keywords for the join tests' orders, declared as SPEC declares them."""
    return {"privacy_unit": "customer_id", "max_rows_per_unit": 3, "bounds": {"amount": (0, 20),
            "placed": (START, pd.Timestamp("2024-12-31").date())}, "categories": {"status": ["paid", "refunded"]},
            "nullable": ["amount"], "other": ["status"], "budget": 50.0, "seed": 2, **extra}


@pytest.fixture(autouse=True)
def fresh_registry():
    yield
    dpgate.accessor._forget_all()


def test_a_join_on_the_unit_answers_the_truncated_truth() -> None:
    data = make_data(5)
    orders = data["orders"]
    orders.dp.configure(**declare(references={"customer_id": "customers.id", "shop": "shops.shop"},
                                  tables={"customers": data["customers"], "shops": data["shops"]},
                                  schemas={"customers": CUSTOMERS, "shops": SHOPS}))
    orders.dp.gateway._cube.order_rows(SECRET)  # the reference's key (a gateway draws its own)
    j = reference_join(data, SECRET, shops=False)
    sql = "SELECT c.age, COUNT(*) AS n FROM df o JOIN customers c ON o.customer_id = c.id GROUP BY c.age"
    out = orders.dp.query(sql, accuracy=4, confidence=0.999)
    truth = j.groupby("age").size().reindex(range(10), fill_value=0)
    assert out["age"].tolist() == list(range(10)) and out["n_source"].eq("fresh").all()
    assert ((out["n_low"] <= truth.to_numpy()) & (truth.to_numpy() <= out["n_high"])).all(), (out, truth)
    js = reference_join(data, SECRET)
    lookup = "SELECT s.region, COUNT(*) AS n FROM df JOIN shops s USING (shop) JOIN customers c " \
             "ON c.id = df.customer_id WHERE c.age > 3 GROUP BY s.region"
    out = orders.dp.query(lookup, accuracy=4, confidence=0.999)
    truth = js[js["age"] > 3].groupby("region").size().reindex(["north", "south"], fill_value=0)
    assert ((out["n_low"] <= truth.to_numpy()) & (truth.to_numpy() <= out["n_high"])).all(), (out, truth)
    spent = orders.dp.spent
    assert spent > 0 and orders.copy().dp.spent == spent  # the same rows: the same budget
    # the joined frames have the one budget: customers' rows are not another set of people
    assert data["customers"].dp.spent == spent
    with pytest.raises(dpgate.ProgrammingError, match="already configured"):
        data["customers"].dp.configure(bounds={"age": (0, 9)}, budget=50.0)


def test_a_full_schema_and_the_frames_work_alike() -> None:
    data = make_data(6)
    orders = data["orders"]
    orders.dp.configure(SPEC, name="orders", tables={"customers": data["customers"], "shops": data["shops"]},
                        budget=50.0, seed=2)
    orders.dp.gateway._cube.order_rows(SECRET)
    j = reference_join(data, SECRET, shops=False)
    out = orders.dp.query("SELECT COUNT(*) AS n FROM orders o JOIN customers c ON o.customer_id = c.id",
                          accuracy=4, confidence=0.999)
    assert out["n_low"][0] <= len(j) <= out["n_high"][0]


def _refused(frame: pd.DataFrame, error: type[Exception], match: str, **kw: Any) -> None:
    with pytest.raises(error, match=match):
        frame.dp.configure(**declare(**kw))
    with pytest.raises(dpgate.ProgrammingError, match="no dpgate budget"):  # nothing configured, nothing spent
        frame.dp.spent  # noqa: B018


def test_bad_declarations_get_the_gateways_errors_and_nothing_is_configured() -> None:
    data = make_data(7)
    orders, customers = data["orders"], data["customers"]
    both = {"tables": {"customers": customers}, "schemas": {"customers": CUSTOMERS}}
    _refused(orders, dpgate.SchemaError, r"references df.customer_id → people.id, but table 'people' is not declared",
             references={"customer_id": "people.id"}, **both)
    _refused(orders, dpgate.SchemaError, r"the data source lacks declared tables \['customers'\]",
             references={"customer_id": "customers.id"}, schemas={"customers": CUSTOMERS})
    _refused(orders, dpgate.SchemaError, r"tables= holds a frame for 'shops'.*schemas=",
             references={"customer_id": "customers.id"}, tables={"customers": customers, "shops": data["shops"]},
             schemas={"customers": CUSTOMERS})
    _refused(orders, dpgate.SchemaError, r"references= names column 'buyer', which this DataFrame does not have",
             references={"buyer": "customers.id"}, **both)
    _refused(orders, dpgate.SchemaError, r"a reference to a person must come from the table's own unit",
             privacy_unit=None, max_rows_per_unit=None, references={"customer_id": "customers.id"}, **both)
    _refused(orders, dpgate.InvalidArgumentType, "tables= maps each other table's name to its DataFrame",
             tables={"customers": [1, 2]}, schemas={"customers": CUSTOMERS})
    orders.dp.configure(**declare(references={"customer_id": "customers.id"}, **both))
    for sql, match in {  # refused before anything is read or spent
        "SELECT COUNT(*) FROM df o JOIN customers c ON o.status = c.tier": "is not a declared join path",
        "SELECT COUNT(*) FROM df o JOIN shops s ON o.shop = s.shop": "table 'shops' is not declared",
    }.items():
        with pytest.raises(dpgate.Error, match=match):
            orders.dp.query(sql, accuracy=5)
    assert orders.dp.spent == 0
    # rows already configured (joined) cannot join another budget
    with pytest.raises(dpgate.ProgrammingError, match="the frame of table 'customers' .* holds the rows of"):
        other_people = orders.head(5).assign(shop="elsewhere")  # no row of these orders: other people
        other_people.dp.configure(**declare(references={"customer_id": "customers.id"}, **both))


def test_a_public_dimension_frame_may_serve_two_sets_of_people() -> None:
    data = make_data(9)
    shops = data["shops"]
    lookup = {"references": {"shop": "shops.shop"}, "tables": {"shops": shops}, "schemas": {"shops": SHOPS}}
    first, second = data["orders"], data["orders"].head(30).assign(shop="b", status="elsewhere")
    first.dp.configure(**declare(**lookup))
    second.dp.configure(**declare(**lookup))  # other people, the same public shops: no one's rows, no budget
    sql = "SELECT s.region, COUNT(*) FROM df o JOIN shops s ON o.shop = s.shop GROUP BY s.region"
    first.dp.query(sql, accuracy=10)
    assert first.dp.spent > 0 and second.dp.spent == 0
    with pytest.raises(dpgate.ProgrammingError):  # no budget of its own (its shop column meets the orders')
        shops.dp.spent  # noqa: B018
