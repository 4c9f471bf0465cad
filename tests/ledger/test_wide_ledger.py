"""Wide queries in the ledger: releases written as runs (compact) and as the plain lists older
versions wrote both verify (MAC chain), read back to equal queries, describe themselves in
``gw.history``, and are reused by a repeat after re-opening."""

from __future__ import annotations

import json

import pytest

import dpgate
from dpgate.compile.query import LinearQuery

SQL = "SELECT sex, AVG(income) AS v FROM pums GROUP BY sex"
KEY = bytes(range(32))


def _old_json(self: LinearQuery) -> str:
    """``LinearQuery.to_json`` as dpgate wrote it before the run encoding (plain nested lists)."""
    return json.dumps({"table": self.table, "columns": list(self.columns),
                       "breakpoints": [list(b) for b in self.breakpoints], "numerators": self.numerators.tolist(),
                       "denominator": self.denominator, "offset": str(self.offset)}, separators=(",", ":"))


@pytest.mark.parametrize("old_format", [False, True])
def test_wide_releases_verify_read_back_and_are_reused_after_reopening(pums, tmp_path, monkeypatch, old_format) -> None:
    df, schema = pums
    path = tmp_path / "ledger.db"
    with monkeypatch.context() as patch:
        if old_format:
            patch.setattr(LinearQuery, "to_json", _old_json)
        with dpgate.Gateway(df, schema, budget=10.0, ledger=str(path), ledger_key=KEY, seed=3) as gw:
            first = gw.query(SQL, accuracy=20).to_pandas()
            spent = gw.spent
            texts = list(gw.history["query"])
            measured = list(gw.history["measured"])
    assert max(map(len, texts)) > 1_000_000 if old_format else max(map(len, texts)) < 2_000
    with dpgate.Gateway(df, schema, budget=10.0, ledger=str(path), ledger_key=KEY, seed=4) as again:
        history = again.history  # records read back through the MAC chain
        assert list(history["query"]) == texts and list(history["measured"]) == measured
        assert any(m.startswith("SUM of weights") and "sex = 1" in m for m in measured)
        for text in texts:
            q = LinearQuery.from_json(text)
            assert LinearQuery.from_json(q.to_json()) == q
        repeat = again.query(SQL, accuracy=20).to_pandas()
        assert (repeat["v_source"] == "history").all() and again.spent == pytest.approx(spent)
        assert repeat["v"].tolist() == first["v"].tolist()
