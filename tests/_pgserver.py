"""A throw-away PostgreSQL server for the backend tests and benchmark.

Starts a real server with the machine's PostgreSQL binaries (``pg_config --bindir``,
else ``/usr/lib/postgresql/<N>/bin``) in a private temporary directory, listening on
127.0.0.1 on a free port, with ``log_statement = all`` so tests can read every
statement the server ran.  PostgreSQL refuses to run as root: then the server runs as
the ``postgres`` (else ``nobody``) user through ``runuser``.  Failing to find or start a
server raises — the tests that need one fail loudly, they never skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PgServer", "load_database", "plain_rows", "start_server"]


def _bindir() -> str:
    cands = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        cands.append(out.stdout.strip())
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for d in cands:
        if d and os.path.isfile(os.path.join(d, "initdb")) and os.path.isfile(os.path.join(d, "pg_ctl")):
            return d
    raise RuntimeError(
        "no PostgreSQL server binaries (initdb, pg_ctl) found via `pg_config --bindir` or /usr/lib/postgresql/*/bin; "
        "install the postgresql package (the backend tests need a real server)."
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """A running server: connect with :attr:`url` (user ``dpgate``, trust auth, local only)."""

    root: str
    port: int
    bindir: str
    user: str | None  # the OS user the server runs as (None: the current one)

    @property
    def log(self) -> str:
        return os.path.join(self.root, "server.log")

    def url(self, database: str = "postgres", driver: str = "postgresql") -> str:
        return f"{driver}://dpgate@127.0.0.1:{self.port}/{database}"

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        _run(self, [os.path.join(self.bindir, "pg_ctl"), "-D", os.path.join(self.root, "data"), "-m", "immediate", "-w",
                    "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _run(server: PgServer, cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    if server.user is not None:
        cmd = ["runuser", "-u", server.user, "--", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def start_server(settings: dict[str, str] | None = None) -> PgServer:
    """Initialise and start a server; the caller must :meth:`PgServer.stop` it."""
    bindir = _bindir()
    root = tempfile.mkdtemp(prefix="dpgate-pg-")
    user = None
    if os.geteuid() == 0:  # postgres refuses root: run it as an unprivileged account
        for name in ("postgres", "nobody"):
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            user = name
            os.chown(root, pw.pw_uid, pw.pw_gid)
            break
        else:
            raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")
    server = PgServer(root, _free_port(), bindir, user)
    data = os.path.join(root, "data")
    _run(server, [os.path.join(bindir, "initdb"), "-D", data, "-U", "dpgate", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--locale=C"])
    opts = {"listen_addresses": "'127.0.0.1'", "port": str(server.port), "unix_socket_directories": f"'{root}'",
            "log_statement": "'all'", "max_connections": "100", **(settings or {})}
    with open(os.path.join(data, "postgresql.auto.conf"), "a", encoding="utf-8") as f:
        f.writelines(f"{k} = {v}\n" for k, v in opts.items())
    for attempt in range(3):
        res = _run(server, [os.path.join(bindir, "pg_ctl"), "-D", data, "-l", server.log, "-w", "-t", "60", "start"],
                   check=False)
        if res.returncode == 0:
            return server
        # Another process took the port meanwhile: try a fresh one.
        server.port = _free_port()
        with open(os.path.join(data, "postgresql.auto.conf"), "a", encoding="utf-8") as f:
            f.write(f"port = {server.port}\n")
        time.sleep(0.2 * (attempt + 1))
    log = server.log_text() if os.path.exists(server.log) else ""
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start: {res.stdout}\n{res.stderr}\n{log[-2000:]}")


def plain_rows(df: Any) -> list[tuple[Any, ...]]:
    """A pandas frame's rows as plain Python values, as psycopg's COPY and Spark's
    ``createDataFrame`` take them: missing values None, numpy scalars Python ones, timestamps
    ``datetime`` (dates and strings as they are)."""
    import datetime as dt

    import numpy as np
    import pandas as pd

    def value(v: Any) -> Any:
        if isinstance(v, pd.Timestamp):
            return v.to_pydatetime()
        if v is None or (not isinstance(v, (dt.date, str)) and pd.isna(v)):
            return None
        return v.item() if isinstance(v, np.generic) else v

    return [tuple(value(v) for v in r) for r in df.astype(object).itertuples(index=False)]


def load_database(server: PgServer, database: str, tables: Mapping[str, tuple[str, Any]]) -> str:
    """``database`` created afresh on ``server`` with each table ``name: (column types, frame)``
    copied in; its URL."""
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {database}")
        con.execute(f"CREATE DATABASE {database}")
    with psycopg.connect(server.url(database)) as con:
        for name, (types, df) in tables.items():
            con.execute(f"CREATE TABLE {name} ({types})")
            with con.cursor().copy(f"COPY {name} FROM STDIN") as copy:
                for row in plain_rows(df):
                    copy.write_row(row)
    return str(server.url(database))
