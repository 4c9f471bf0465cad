"""Helpers for the ``dpgate serve`` tests: a server in a thread or a subprocess, real clients."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dpgate
from dpgate.datasets import load_pums
from dpgate.server import Server, add_user

ROOT = Path(__file__).resolve().parents[1]
PUMS_CSV = ROOT / "dpgate" / "data" / "PUMS.csv"
PUMS_YAML = ROOT / "dpgate" / "data" / "pums.yaml"
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}


def users_file(tmp: Path, caps: dict[str, float]) -> Path:
    path = tmp / "users.yaml"
    for name, cap in caps.items():
        add_user(path, name, PASSWORDS[name], cap)
    return path


def ledger_records(tmp: Path) -> int:
    """How many releases the ledger file of a :func:`thread_server` in ``tmp`` holds (read apart from dpgate)."""
    import sqlite3

    con = sqlite3.connect(tmp / "ledger.db")
    try:
        return int(con.execute("SELECT COUNT(*) FROM dpgate_records").fetchone()[0])
    finally:
        con.close()


@contextlib.contextmanager
def thread_server(tmp: Path, *, budget: float = 1.0, caps: dict[str, float] | None = None,
                  ledger: str | None = None, ledger_key: str | None = None, **options: Any) -> Iterator[Server]:
    """A server on 127.0.0.1:<free port> in this process, over PUMS, with a ledger file in ``tmp``
    (or ``ledger``: a ``postgresql://`` URL, with ``ledger_key``)."""
    from dpgate.server.users import load_users

    df, schema = load_pums()
    users = load_users(users_file(tmp, caps or {"alice": 0.5, "bob": 0.5, "carol": 0.0}))
    gw = dpgate.Gateway(df, schema, budget=budget, ledger=ledger or str(tmp / "ledger.db"), ledger_key=ledger_key)
    server = Server(gw, users, port=0, defaults={"accuracy": 25.0}, **options).start()
    try:
        yield server
    finally:
        server.shutdown(timeout=10)


def spawn_server(tmp: Path, *, budget: float = 1.0, extra: tuple[str, ...] = (), ledger: str | None = None,
                 data: Path = PUMS_CSV, schema: Path = PUMS_YAML) -> tuple[subprocess.Popen[str], int]:
    """``python -m dpgate.cli serve`` on a free port, serving ``data`` as ``schema`` declares it
    (PUMS by default) to the users of ``tmp/users.yaml``; returns the process and its port
    (``ledger``: instead of a file in ``tmp``, e.g. a ``postgresql://`` URL, with ``--ledger-key``
    in ``extra``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--data", str(data), "--schema", str(schema),
         "--ledger", ledger or str(tmp / "ledger.db"), "--budget", str(budget), "--users", str(tmp / "users.yaml"),
         "--port", "0", "--accuracy", "25", *extra],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on [\d.]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    raise RuntimeError(f"the server did not start (exit code {proc.wait()})")


def dsn(port: int, user: str = "alice", password: str | None = None, **extra: str) -> str:
    parts = {"host": "127.0.0.1", "port": str(port), "user": user, "password": password or PASSWORDS[user],
             "dbname": "pums", **extra}
    return " ".join(f"{k}={v}" for k, v in parts.items())


def psql(port: int, *commands: str, user: str = "alice", password: str | None = None,
         **env: str) -> subprocess.CompletedProcess[str]:
    args = ["psql", "-X", "-At", "-v", "VERBOSITY=verbose", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d",
            "pums"]
    for c in commands:
        args += ["-c", c]
    environment = {**os.environ, "PGPASSWORD": password or PASSWORDS[user], "PGCONNECT_TIMEOUT": "10", **env}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=environment)


def history_is_shared_and_free(carol: Any, alice: Any, sql: str) -> Any:
    """On two open connections: ``carol`` (cap 0) is refused a fresh ``sql``; once ``alice`` released
    it, carol gets it from history, free, charged nothing and shown as a delivery.  Alice's row."""
    with pytest.raises(psycopg.Error) as err:  # carol's cap is 0: no fresh release for her
        carol.execute(sql)
    assert err.value.sqlstate == "53400" and "carol" in str(err.value) and "cap" in str(err.value)
    alice.execute("SET dpgate.intervals = on")
    first = alice.execute(sql).fetchone()
    assert first is not None and first[3] == "fresh"
    carol.execute("SET dpgate.intervals = on")
    again = carol.execute(sql).fetchone()  # history is shared: free for carol
    assert again is not None and again[3] == "history" and again[0] == pytest.approx(first[0])
    mine = carol.execute("SHOW dpgate.budget").fetchone()
    assert mine is not None and mine[2] == 0.0 and mine[5] > 0
    hist = carol.execute("SHOW dpgate.history").fetchall()
    assert [(h[2], h[4], h[5]) for h in hist] == [("delivery", "history", 0.0)]
    return first
