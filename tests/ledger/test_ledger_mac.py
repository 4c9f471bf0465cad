"""The ledger's record MACs: the batched writer and reader compute exactly the MACs of the
original one-record formula (``HMAC-SHA256`` of ``json.dumps(["record", [previous, fields]])``
with floats as ``float.hex``), so ledgers written before and after read each other."""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgate.ledger._key import chain_macs, record_mac
from dpgate.ledger.core import Ledger

FP = "sha256:data+schema"


def reference_mac(key: bytes, previous: str, row: tuple) -> str:
    """The record MAC as first specified (one ``json.dumps`` and one ``hmac.new`` per record)."""
    fields = [(v + 0.0).hex() if isinstance(v, float) else v for v in row]
    text = json.dumps(["record", [previous, fields]], ensure_ascii=True, separators=(",", ":"))
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def reference_chain(key: bytes, previous: str, rows: list[tuple]) -> list[str]:
    out = []
    for row in rows:
        previous = reference_mac(key, previous, row)
        out.append(previous)
    return out


texts = st.sampled_from(["query", "pums", "", "SELECT 'é✓' \"q\"\\n", '{"a":[1,2]}', "\x00\t\u2028"]) | st.text(max_size=12)
reals = st.sampled_from([0.0, -0.0, 0.1, 1.0, 5e-324, 1e308, 2.0**-7]) | st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def record_rows(draw):
    """Rows in ``COLUMNS`` order: mostly the stored types, with runs of shared fields (a
    statement's records), sometimes another type (a bool flag, an int real, None)."""
    n = draw(st.integers(1, 6))
    shared = [draw(texts) for _ in range(4)], [draw(reals) for _ in range(4)]
    rows = []
    for i in range(n):
        pick_t = lambda j: shared[0][j] if draw(st.booleans()) else draw(texts)  # noqa: E731
        pick_r = lambda j: shared[1][j] if draw(st.booleans()) else draw(reals)  # noqa: E731
        secure = draw(st.sampled_from([0, 1, 1, True, False]))
        value = draw(reals | st.integers(-(2**70), 2**70) | st.none())
        rows.append((i + 1, pick_t(0), pick_t(1), draw(texts), pick_t(2), pick_r(0), pick_r(1), pick_r(2), pick_r(3),
                     pick_t(3), value, draw(reals), secure, draw(texts), draw(texts)))
    return rows


@settings(max_examples=300, deadline=None)
@given(key=st.binary(min_size=16, max_size=80), previous=texts, rows=record_rows())
def test_chain_macs_are_the_one_record_formula(key, previous, rows):
    assert chain_macs(key, previous, rows) == reference_chain(key, previous, rows)
    assert record_mac(key, previous, rows[0]) == reference_mac(key, previous, rows[0])


def _stored(path) -> tuple[str, list[tuple]]:
    with sqlite3.connect(path) as conn:
        header = dict(conn.execute("SELECT key, value FROM dpgate_meta"))["header_mac"]
        rows = conn.execute(
            "SELECT id, kind, table_name, query, sql, alpha, sensitivity, scale, lattice, noise, value, cost_after, "
            "secure, created_at, session, mac FROM dpgate_records ORDER BY id").fetchall()
    return header, rows


def test_batched_records_equal_one_by_one_field_by_field_and_mac_by_mac(tmp_path):
    """A statement's records appended in one batch are the records, and carry the MACs, of one
    ``append`` each; every stored MAC is the original formula's, chained from the header."""
    rng = np.random.default_rng(3)
    entries = [dict(kind="query", table="pums", query=json.dumps({"g": i}), sql="SELECT g, COUNT(*) FROM pums GROUP BY g",
                    alpha=0.125, sensitivity=1.0, scale=8.0, lattice=2.0**-7, noise="discrete_laplace",
                    value=float(rng.normal(100, 8)), cost_after=0.125 + 0.01 * (i // 3), secure=True,
                    created_at="2026-01-01T00:00:00.000001+00:00", session="s")
               for i in range(40)]  # fmt: skip
    entries[7] |= {"alpha": np.float64(0.25), "value": np.int64(-3), "secure": 0}  # converted by the checks
    entries[8] |= {"value": -0.0}
    key = bytes(range(32))
    stored = {}
    for name, batched in (("one.db", False), ("many.db", True)):
        path = tmp_path / name
        with Ledger.open(path, fingerprint=FP, budget=1.0, key=key) as led:
            with led.transaction() as tx:
                got = tx.append_many(entries) if batched else [tx.append(**e) for e in entries]
        with Ledger.open(path, fingerprint=FP, budget=1.0, key=key) as again:  # chain verified on reading
            assert again.records() == tuple(got)
        header, rows = _stored(path)
        assert [r[-1] for r in rows] == reference_chain(key, header, [r[:-1] for r in rows])
        stored[name] = [r[:-1] for r in rows]
    assert stored["one.db"] == stored["many.db"]
    assert [type(v) for v in stored["many.db"][7]] == [type(v) for v in stored["many.db"][0]]


def test_a_querys_ledger_json_is_computed_once_and_not_pickled():
    import pickle
    from fractions import Fraction

    from dpgate.compile.query import LinearQuery

    q = LinearQuery("t", ("x",), ((0, 4),), np.array([1, -2]), 3, Fraction(1, 2))
    text = q.to_json()
    assert q.to_json() is text and LinearQuery.from_json(text) == q
    again = pickle.loads(pickle.dumps(q))
    assert "_json" not in again.__dict__ and again.to_json() == text
