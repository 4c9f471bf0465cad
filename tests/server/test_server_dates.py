"""Dates through ``dpgate serve``: a live server answers date queries with ISO keys, and refuses bad
date literals with the compiler's message before anything is read or spent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import psycopg
import pytest
from _dpserve import dsn, psql, users_file

import dpgate
from dpgate.server import Server
from dpgate.server.users import load_users

SCHEMA = {"tables": {"ev": {"columns": {
    "d": {"type": "date", "min": "2024-01-01", "max": "2024-06-30"},
    "ts": {"type": "timestamp", "min": "2024-01-01 00:00", "max": "2024-01-07 23:00", "granularity": "hour"},
}}}}


def test_live_server_dates(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"d": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 182, 400), unit="D"),
                       "ts": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 7 * 1440, 400), unit="m")})
    users = load_users(users_file(tmp_path, {"alice": 5.0}))
    gw = dpgate.Gateway(df, SCHEMA, budget=5.0, ledger=str(tmp_path / "ledger.db"))
    server = Server(gw, users, port=0, defaults={"accuracy": 25.0}).start()
    try:
        port = server.port
        with psycopg.connect(dsn(port), autocommit=True, connect_timeout=10) as con:
            rows = con.execute("SELECT date_trunc('month', d) AS m, COUNT(*) FROM ev "
                               "WHERE d >= DATE '2024-02-01' GROUP BY m").fetchall()
            assert [r[0] for r in rows] == ["2024-02-01", "2024-03-01", "2024-04-01", "2024-05-01", "2024-06-01"]
            import datetime as dt

            got = con.execute("SELECT COUNT(*) FROM ev WHERE d >= %s AND ts < %s",
                              (dt.date(2024, 2, 1), dt.datetime(2024, 1, 3, 10))).fetchall()
            assert len(got) == 1
            spent = con.execute("SHOW dpgate.budget").fetchone()
            for bad in ["SELECT COUNT(*) FROM ev WHERE d >= '2024-03-01 10:30'",
                        "SELECT COUNT(*) FROM ev WHERE d < '2031-01-01'",
                        "SELECT COUNT(*) FROM ev WHERE EXTRACT(week FROM ts) = 2",
                        "SELECT COUNT(*) FROM ev WHERE d = DATE '2024-02-31'"]:
                with pytest.raises(psycopg.Error) as err:
                    con.execute(bad)
                assert "dpgate" not in str(err.value) or "bug" not in str(err.value)
                assert any(w in str(err.value) for w in ("boundary", "declared range", "unit", "not a date"))
            assert con.execute("SHOW dpgate.budget").fetchone() == spent
        out = psql(port, r"\d ev")
        assert out.returncode == 0 and "date" in out.stdout and "timestamp" in out.stdout, out.stderr
    finally:
        server.shutdown(timeout=10)
