"""Declared joins: the schema's ``references`` / ``public`` / ``key`` checked at load, joins
compiled to one table (:mod:`dpgate.compile._join`), and every join that is not allowed refused
before any data is read, nothing spent — through ``gw.query``, ``gw.explain`` and the DB-API."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile import compile_statement
from dpgate.schema.domains import Schema

SPEC: dict[str, Any] = {"tables": {
    "customers": {"privacy_unit": "id", "max_rows_per_unit": 1, "columns": {
        "id": {"type": "key"}, "age": {"type": "integer", "min": 0, "max": 9}}},
    "orders": {"privacy_unit": "customer_id", "max_rows_per_unit": 5,
               "references": {"customer_id": "customers.id", "shop": "shops.code"}, "columns": {
        "customer_id": {"type": "key"}, "shop": {"type": "key"}, "seller": {"type": "key"},
        "age": {"type": "integer", "min": 0, "max": 3}, "amount": {"type": "integer", "min": 0, "max": 9}}},
    "shops": {"public": True, "key": "code", "columns": {
        "code": {"type": "key"}, "region": {"type": "categorical", "values": ["n", "s"]}}},
    "visits": {"privacy_unit": "user_id", "max_rows_per_unit": 2, "columns": {
        "user_id": {"type": "key"}, "pages": {"type": "integer", "min": 0, "max": 9}}},
    "sellers": {"privacy_unit": "sid", "columns": {"sid": {"type": "key"}, "rating": {"type": "integer", "min": 0,
                                                                                    "max": 5}}},
}}
SCHEMA = Schema.from_dict(SPEC)
JOIN = "FROM orders o JOIN customers c ON o.customer_id = c.id"
PATHS = r"declared join paths: orders\.customer_id = customers\.id; orders\.shop = shops\.code"


def frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    n = 200
    return {
        "customers": pd.DataFrame({"id": np.arange(30), "age": rng.integers(0, 10, 30)}),
        "orders": pd.DataFrame({"customer_id": rng.integers(0, 30, n), "shop": rng.choice(["a", "b"], n),
                                "seller": rng.integers(0, 5, n), "age": rng.integers(0, 4, n),
                                "amount": rng.integers(0, 10, n)}),
        "shops": pd.DataFrame({"code": ["a", "b"], "region": ["n", "s"]}),
        "visits": pd.DataFrame({"user_id": rng.integers(0, 30, n), "pages": rng.integers(0, 10, n)}),
        "sellers": pd.DataFrame({"sid": np.arange(5), "rating": rng.integers(0, 6, 5)}),
    }


# -- the schema --------------------------------------------------------------------------------
def _with(table: str, **changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["tables"][table].update(changes)
    for k, v in list(spec["tables"][table].items()):
        if v is None:
            del spec["tables"][table][k]
    return spec


@pytest.mark.parametrize(("spec", "message"), [
    (_with("orders", references={"customer_id": "clients.id"}), "table 'clients' is not declared"),
    (_with("orders", references={"customer_id": "customers.age"}), "neither 'customers''s privacy unit nor the key"),
    (_with("orders", references={"nope": "customers.id"}), "'nope' is not one of its columns"),
    (_with("orders", references={"seller": "customers.id"}), "reference to a person must come from the table's own unit"),
    (_with("orders", references={"customer_id": "customers"}), "must be '<table>.<column>'"),
    (_with("orders", references=["customers.id"]), "references must map a column"),
    (_with("orders", references={"customer_id": "orders.customer_id"}), "itself; self-joins are not supported"),
    (_with("orders", references={"shop": "shops.region"}), "the public table's key is 'code'"),
    (_with("shops", key="nope"), "its key 'nope' is not one of its columns"),
    (_with("shops", public="yes"), "public must be true or false"),
    (_with("customers", key="id"), "add 'public: true'"),
    (_with("shops", privacy_unit="code"), "a public table holds no one's rows"),
    (_with("visits", references={"user_id": "sellers.sid"}), None),  # a unit table referencing another: loads
])
def test_references_are_checked_at_load(spec: dict[str, Any], message: str | None) -> None:
    if message is None:
        Schema.from_dict(spec)
        return
    with pytest.raises(dpgate.SchemaError, match=message):
        Schema.from_dict(spec)


def test_the_declarations_round_trip_and_older_schemas_keep_their_fingerprint() -> None:
    assert Schema.from_dict(SCHEMA.to_dict()) == SCHEMA
    plain = {"tables": {"t": {"privacy_unit": "u", "max_rows_per_unit": 2,
                              "columns": {"u": {"type": "key"}, "x": {"type": "integer", "min": 0, "max": 1}}}}}
    without = {"tables": {"t": {"privacy_unit": "u", "max_rows_per_unit": 2,
                                "columns": {"x": {"type": "integer", "min": 0, "max": 1}}}}}
    assert Schema.from_dict(plain).fingerprint() == Schema.from_dict(without).fingerprint()


# -- compiling ---------------------------------------------------------------------------------
def test_a_join_is_one_table_whatever_the_spelling() -> None:
    names = {compile_statement(sql, SCHEMA).table for sql in (
        f"SELECT COUNT(*) {JOIN}", "SELECT COUNT(*) FROM customers JOIN orders ON customers.id = orders.customer_id",
        "SELECT COUNT(*) FROM main.orders AS x INNER JOIN customers y ON (y.id = x.customer_id)")}
    assert names == {"orders JOIN customers ON orders.customer_id = customers.id"}
    st3 = compile_statement("SELECT region, c.age, o.age, COUNT(*) FROM orders o JOIN shops s ON o.shop = s.code "
                            "JOIN customers c ON o.customer_id = c.id GROUP BY region, c.age, o.age", SCHEMA)
    assert st3.table == ("orders JOIN customers ON orders.customer_id = customers.id "
                         "JOIN shops ON orders.shop = shops.code")
    assert st3.group_columns == ("region", "customers.age", "orders.age") and len(st3.group_keys) == 2 * 10 * 4
    assert SCHEMA.table(st3.table).bound() == 5 and SCHEMA.table(st3.table.upper()).name == st3.table


@pytest.mark.parametrize(("sql", "error", "message"), [
    ("SELECT COUNT(*) FROM orders o LEFT JOIN customers c ON o.customer_id = c.id", "UnsupportedQuery",
     "LEFT JOIN \\(an outer join\\) is not supported.*" + PATHS),
    ("SELECT COUNT(*) FROM orders o FULL OUTER JOIN customers c ON o.customer_id = c.id", "UnsupportedQuery",
     "outer join"),
    ("SELECT COUNT(*) FROM orders, customers", "UnsupportedQuery", "comma or CROSS JOIN.*" + PATHS),
    ("SELECT COUNT(*) FROM orders CROSS JOIN customers", "UnsupportedQuery", "comma or CROSS JOIN"),
    ("SELECT COUNT(*) FROM orders NATURAL JOIN customers", "UnsupportedQuery", "NATURAL JOIN is not supported"),
    ("SELECT COUNT(*) FROM orders o JOIN orders p ON o.customer_id = p.customer_id", "UnsupportedQuery",
     "self-join: table 'orders' appears twice"),
    ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.age = c.age", "UnsupportedQuery",
     "'o.age = c.age' is not a declared join path \\(the declared path between 'orders' and 'customers' is "
     "orders.customer_id = customers.id\\)"),
    ("SELECT COUNT(*) FROM orders o JOIN visits v ON o.customer_id = v.user_id", "UnsupportedQuery",
     "not a declared join path \\('orders' and 'visits' hold rows of people identified by 'customer_id' and "
     "'user_id'; no declared reference says these are the same person\\)"),
    ("SELECT COUNT(*) FROM orders o JOIN sellers s ON o.seller = s.sid", "UnsupportedQuery",
     "not a declared join path"),
    (f"SELECT COUNT(*) {JOIN} AND c.age > 3", "UnsupportedQuery", "put other conditions in WHERE"),
    ("SELECT COUNT(*) FROM orders JOIN customers USING (customer_id)", "UnsupportedQuery",
     "USING \\(customer_id\\) names no declared path"),
    ("SELECT COUNT(*) FROM orders o JOIN (SELECT * FROM customers) c ON o.customer_id = c.id", "UnsupportedQuery",
     "only declared tables may be joined"),
    ("SELECT COUNT(*) FROM orders o JOIN clients c ON o.customer_id = c.id", "SchemaError",
     "table 'clients' is not declared"),
    (f"SELECT o.customer_id, COUNT(*) {JOIN} GROUP BY 1", "SchemaError", "'orders''s privacy unit"),
    (f"SELECT COUNT(*) {JOIN} WHERE o.shop = 'a'", "SchemaError", "'orders''s key: it only joins tables"),
    (f"SELECT COUNT(*) {JOIN} WHERE age > 3", "SchemaError", "several joined tables declare it: write orders.age or customers.age"),
    (f"SELECT COUNT(*) {JOIN} WHERE x.age > 3", "SchemaError", "qualified by 'x', which names none"),
    (f"SELECT COUNT(*) {JOIN} WHERE c.pages > 3", "SchemaError", "'pages' is not declared in table 'customers'"),
    (f"SELECT COUNT(DISTINCT o.customer_id) {JOIN}", "UnsupportedQuery",
     "counts people.*'orders' keeps up to 5 rows per person.*write SELECT COUNT\\(\\*\\) FROM customers"),
    ("SELECT COUNT(DISTINCT user_id) FROM visits", "UnsupportedQuery", "counts people.*max_rows_per_unit: 1"),
    ("SELECT COUNT(*) FROM shops", "UnsupportedQuery", "table 'shops' is public"),
    ("SELECT COUNT(*) FROM sellers", "SchemaError", "no max_rows_per_unit"),
    ("SELECT COUNT(*) FROM orders o JOIN shops s ON o.shop = s.code JOIN customers c ON o.customer_id = c.id "
     "JOIN visits v ON v.user_id = c.id", "UnsupportedQuery", "not a declared join path"),
])
def test_refusals_name_the_declared_paths_and_spend_nothing(sql: str, error: str, message: str) -> None:
    cls = getattr(dpgate.errors, error)
    with pytest.raises(cls, match=message):
        compile_statement(sql, SCHEMA)
    with dpgate.Gateway(frames(), SCHEMA, budget=10.0, seed=1) as gw:
        for call in (lambda: gw.query(sql, accuracy=10), lambda: gw.explain(sql, accuracy=10)):
            with pytest.raises(cls, match=message):
                call()
        assert gw.spent == 0 and len(gw.ledger.records()) == 0


def test_count_distinct_of_the_unit_is_count_star_where_each_person_has_one_row() -> None:
    a = compile_statement("SELECT COUNT(DISTINCT id) FROM customers WHERE age > 3", SCHEMA)
    b = compile_statement("SELECT COUNT(*) FROM customers WHERE age > 3", SCHEMA)
    assert a.queries == b.queries
    c = compile_statement("SELECT COUNT(DISTINCT c.id) AS people FROM customers c", SCHEMA)
    assert c.output_names == ("people",)


def test_joins_through_query_explain_and_the_dbapi() -> None:
    data = frames()
    with dpgate.Gateway(data, SCHEMA, budget=10.0, seed=1) as gw:
        plan = gw.explain(f"SELECT c.age, COUNT(*) {JOIN} WHERE o.amount > 2 GROUP BY c.age", accuracy=20)
        assert gw.spent == 0 and plan.statement.table.startswith("orders JOIN customers") and len(plan.quotes) == 10
        res = gw.query(f"SELECT c.age, COUNT(*) {JOIN} WHERE o.amount > 2 GROUP BY c.age", accuracy=20)
        assert len(res.answers) == 10 and gw.spent > 0
    con = dpgate.connect(data, schema=SCHEMA, budget=10.0, accuracy=20)
    try:
        cur = con.cursor()
        cur.execute("SELECT s.region, SUM(o.amount) FROM orders o JOIN shops s ON o.shop = s.code GROUP BY s.region")
        rows = cur.fetchall()
        assert [r[0] for r in rows] == ["n", "s"] and [d[0] for d in cur.description] == ["region", "SUM(o.amount)"]
        with pytest.raises(dpgate.errors.UnsupportedQuery, match="outer join"):
            cur.execute("SELECT COUNT(*) FROM orders o LEFT JOIN shops s ON o.shop = s.code")
    finally:
        con.close()


# -- the compiler, as a property: a join's query is the same query over the table it makes --------
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 9), st.sampled_from(["<", ">=", "="]), st.integers(0, 3), st.booleans())
def test_a_join_compiles_like_the_table_it_makes(age: int, op: str, oage: int, grouped: bool) -> None:
    """Writing the join, or querying its table by name with its column names, gives the same queries."""
    name = "orders JOIN customers ON orders.customer_id = customers.id"
    group = " GROUP BY c.age" if grouped else ""
    sql = f"SELECT {'c.age, ' if grouped else ''}COUNT(*), SUM(amount) {JOIN} WHERE c.age {op} {age} AND o.age <> {oage}{group}"
    vgroup = ' GROUP BY "customers.age"' if grouped else ""
    vsql = (f'SELECT {chr(34) + "customers.age" + chr(34) + ", " if grouped else ""}COUNT(*), SUM(amount) FROM "{name}" '
            f'WHERE "customers.age" {op} {age} AND "orders.age" <> {oage}{vgroup}')
    a, b = compile_statement(sql, SCHEMA), compile_statement(vsql, SCHEMA)
    assert a.table == b.table == name and a.queries == b.queries and a.group_keys == b.group_keys
