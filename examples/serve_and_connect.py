"""``dpgate serve``: the gateway as a PostgreSQL server, queried by ordinary clients.

Run:  python examples/serve_and_connect.py

Creates two analysts (alice and bob, each with a cap ε) with ``dpgate user add``, starts
``dpgate serve`` over the embedded PUMS CSV on 127.0.0.1 (a free port, a temporary
ledger), then connects with psycopg 3 and with pandas through SQLAlchemy.  The data,
the budget and the ledger stay in the server process; clients only see answers.
History is shared: what alice paid for, bob gets free.  Ends with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib.resources import files

import pandas as pd
import psycopg
import sqlalchemy as sa

DATA = files("dpgate") / "data"  # the shipped PUMS table and its public schema
CLI = [sys.executable, "-m", "dpgate.cli"]
tmp = tempfile.mkdtemp()
users, ledger = os.path.join(tmp, "users.yaml"), os.path.join(tmp, "pums.ledger")


def show_budget(who: str, con: psycopg.Connection) -> None:
    cur = con.execute("SHOW dpgate.budget")  # the analyst's cap, charges, what is left; the global budget
    names = [d.name for d in cur.description or ()]
    for row in cur.fetchall():
        print(f"{who} budget:", ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in zip(names, row, strict=True)))


# 1. Analysts: a SCRAM verifier (never the password) and a cap ε each.
for name, password, cap in (("alice", "alice-pw", "0.5"), ("bob", "bob-pw", "0.2")):
    subprocess.run([*CLI, "user", "add", users, name, "--budget", cap, "--password-stdin"],
                   input=password + "\n", text=True, check=True, capture_output=True, timeout=60)

with socket.socket() as s:  # a free port (another process could take it; fine for a demo)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

# 2. The server: global budget 1, default accuracy ±25; it logs one line per statement.
log = os.path.join(tmp, "server.log")
with open(log, "w") as log_file:  # the server keeps its own copy of the file descriptor
    server = subprocess.Popen(
        [*CLI, "serve", "--data", str(DATA / "PUMS.csv"), "--schema", str(DATA / "pums.yaml"), "--ledger", ledger,
         "--budget", "1", "--users", users, "--accuracy", "25", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log_file)
try:
    deadline = time.monotonic() + 60
    while True:  # wait until it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dpgate serve did not start; see {log}") from None
            time.sleep(0.2)

    dsn = f"host=127.0.0.1 port={port} dbname=pums connect_timeout=10"
    sql = "SELECT sex, COUNT(*) AS n FROM pums WHERE age < %s GROUP BY sex"
    # 3. alice: a quote (free), the query with a parameter (bound as a typed literal), her budget.
    with psycopg.connect(dsn, user="alice", password="alice-pw", autocommit=True) as con:
        for row in con.execute("EXPLAIN " + sql, (30,)).fetchall():
            print("alice EXPLAIN:", row)
        print("alice:", con.execute(sql, (30,)).fetchall())
        show_budget("alice", con)
    # 4. bob asks the same question: answered from history, charged nothing.
    with psycopg.connect(dsn, user="bob", password="bob-pw", autocommit=True) as con:
        print("bob:", con.execute(sql, (30,)).fetchall())
        show_budget("bob", con)
    # 5. pandas through SQLAlchemy's PostgreSQL dialect, unchanged.
    engine = sa.create_engine(f"postgresql+psycopg://bob:bob-pw@127.0.0.1:{port}/pums")
    print(pd.read_sql_query("SELECT married, COUNT(*) AS n FROM pums GROUP BY married", engine))
    engine.dispose()

    # 6. SIGTERM: statements in flight finish, then the server exits.
    server.send_signal(signal.SIGTERM)
    print("server exited with", server.wait(timeout=30))
finally:
    if server.poll() is None:
        server.kill()
        server.wait()
