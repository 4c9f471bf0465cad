"""``dpgate serve --privacy zcdp``: ρ budget and caps, SHOW dpgate.budget with ε at δ beside ρ (issue 31)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from _dpserve import dsn, spawn_server, users_file

from dpgate.plan.zcdp import epsilon_of


def test_serve_privacy_zcdp_smoke(tmp_path: Path) -> None:
    users_file(tmp_path, {"alice": 0.05, "bob": 0.0})
    proc, port = spawn_server(tmp_path, budget=0.1, extra=("--privacy", "zcdp"))
    try:
        with psycopg.connect(dsn(port, "alice"), autocommit=True, connect_timeout=10) as con:
            con.execute("SET dpgate.intervals = on")
            row = con.execute("SELECT COUNT(*) FROM pums WHERE age < 40").fetchone()
            assert row is not None and row[3] == "fresh"
            budget = con.execute("SHOW dpgate.budget").fetchone()
            names = [d.name for d in con.execute("SHOW dpgate.budget").description]
            got = dict(zip(names, budget, strict=True))
            assert got["privacy"] == "zcdp" and got["budget"] == pytest.approx(0.1)
            assert 0 < got["spent"] <= 0.05 and got["spent"] == pytest.approx(got["analyst_spent"])
            assert got["delta"] == pytest.approx(1e-6)
            assert got["epsilon_spent"] == pytest.approx(epsilon_of(got["spent"]), rel=1e-6)
            explained = con.execute("EXPLAIN SELECT COUNT(*) FROM pums WHERE age >= 60").fetchall()
            assert any(str(r[0]).startswith("(as ε at δ=") for r in explained)
            with pytest.raises(psycopg.Error) as err:  # over alice's ρ cap
                con.execute("/*+ dpgate accuracy=1 */ SELECT COUNT(*) FROM pums WHERE age >= 60")
            assert err.value.sqlstate == "53400"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
