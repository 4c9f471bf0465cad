"""``dpgate serve`` with real PostgreSQL clients: psql, psycopg 3, pg8000, asyncpg, SQLAlchemy + pandas, TLS."""

from __future__ import annotations

import asyncio
import subprocess
import time
import warnings
from pathlib import Path

import psycopg  # the test extra: a missing client fails, never skips
import pytest
from _dpserve import PASSWORDS, dsn, psql, thread_server

from dpgate.server.server import is_loopback

QUERY = "SELECT COUNT(*) FROM pums WHERE age < 30"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with thread_server(tmp_path_factory.mktemp("serve")) as s:
        yield s


def test_psql_counts_lists_tables_and_describes(server) -> None:
    out = psql(server.port, QUERY, r"\dt", r"\d pums")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert 150 < float(lines[0]) < 300  # one row: the noisy count (true: 220ish, ±25)
    assert "public|pums|table|dpgate" in lines
    assert "age|bigint|||" in lines and "sex|text|||" in lines and "married|boolean|||" in lines


def test_psql_refusal_carries_sqlstate_and_dpgates_message(server) -> None:
    out = psql(server.port, "SELECT age FROM pums")
    assert out.returncode != 0
    assert "ERROR:  0A000: the raw column 'age' is not aggregated" in out.stderr
    out = psql(server.port, "SELECT COUNT(*) FROM nope")
    assert "ERROR:  42P01:" in out.stderr


def test_psql_wrong_password_and_unknown_user_are_refused(server) -> None:
    for user, pw in (("alice", "bad"), ("mallory", "x")):
        out = psql(server.port, QUERY, user=user, password=pw)
        assert out.returncode != 0
        assert f'password authentication failed for user "{user}"' in out.stderr


def test_psycopg_params_types_settings_and_errors(server) -> None:
    with psycopg.connect(dsn(server.port), autocommit=True) as con:
        cur = con.execute("SELECT COUNT(*) AS n FROM pums WHERE age < %s", [30])
        assert [(d.name, d.type_code) for d in cur.description] == [("n", 701)]
        (n,) = cur.fetchone()
        assert isinstance(n, float)
        cur = con.execute("SELECT sex, married, COUNT(*) AS n FROM pums WHERE sex = %s GROUP BY sex, married",
                          ["1"])
        assert [d.type_code for d in cur.description] == [25, 16, 701]
        assert ("1", True) in [r[:2] for r in cur.fetchall()]
        con.execute("SET dpgate.intervals = on")
        cur = con.execute("SELECT COUNT(*) AS n FROM pums WHERE age < %s", [30])
        row = cur.fetchone()
        assert [d.name for d in cur.description] == ["n", "n_low", "n_high", "n_source"]
        assert row[3] == "history" and row[1] <= row[0] <= row[2] and abs(row[0] - n) <= 25
        assert con.execute("SHOW dpgate.intervals").fetchone() == ("on",)
        assert con.execute("SELECT 1").fetchone() == (1,)  # pools' liveness check: a constant
        with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
            con.execute("SELECT age FROM pums")
        assert "not aggregated" in str(err.value)
        with pytest.raises(psycopg.errors.UndefinedColumn):
            con.execute("SELECT COUNT(*) FROM pums WHERE height > 3")
        with pytest.raises(psycopg.Error) as err:
            con.execute("SELECT /*+ dpgate accuracy=0.001 */ COUNT(*) FROM pums WHERE age < 50")
        assert err.value.sqlstate == "53400"
        budget = con.execute("SHOW dpgate.budget").fetchone()
        assert budget[0] == "alice" and budget[1] == 0.5 and 0 < budget[2] <= 0.5 and budget[5] >= budget[2]


def test_psycopg_transaction_blocks_fail_until_rollback(server) -> None:
    with psycopg.connect(dsn(server.port)) as con:  # psycopg opens a transaction block (BEGIN)
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            con.execute("SELECT age FROM pums")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            con.execute(QUERY)
        con.rollback()
        assert con.execute(QUERY).fetchone()[0] > 0


def test_pg8000_and_asyncpg(server) -> None:
    import pg8000.dbapi as pg8000
    con = pg8000.connect(user="alice", password=PASSWORDS["alice"], host="127.0.0.1", port=server.port,
                         database="pums")
    cur = con.cursor()
    cur.execute("SELECT COUNT(*) FROM pums WHERE age < %s", (30,))
    assert cur.description[0][1] == 701 and len(cur.fetchall()) == 1
    con.close()
    import asyncpg

    async def run() -> list:
        c = await asyncpg.connect(user="bob", password=PASSWORDS["bob"], host="127.0.0.1", port=server.port,
                                  database="pums")
        try:
            rows = await c.fetch("SELECT COUNT(*) AS n FROM pums WHERE age < $1", 30)
            rows += await c.fetch("SELECT sex, COUNT(*) AS n FROM pums WHERE sex = $1 GROUP BY sex", "1")
            with pytest.raises(asyncpg.exceptions.FeatureNotSupportedError):
                await c.fetch("SELECT age FROM pums")
            return rows
        finally:
            await c.close()

    rows = asyncio.run(run())
    assert isinstance(rows[0]["n"], float) and ("1",) in [(r["sex"],) for r in rows[1:]]


def test_sqlalchemy_and_pandas_without_warnings(server) -> None:
    import pandas as pd
    import sqlalchemy as sa

    engine = sa.create_engine(f"postgresql+psycopg://alice:{PASSWORDS['alice']}@127.0.0.1:{server.port}/pums",
                              pool_pre_ping=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            df = pd.read_sql_query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", engine)
            assert list(df.columns) == ["sex", "n"] and "1" in set(df["sex"])
            df = pd.read_sql_query(sa.text("SELECT COUNT(*) AS n FROM pums WHERE age < :a"), engine,
                                   params={"a": 30})
            assert len(df) == 1
            df = pd.read_sql_query("SELECT COUNT(*) AS n FROM pums WHERE age < 30", engine)  # pre-ping: SELECT 1
            insp = sa.inspect(engine)
            assert insp.has_table("pums") and not insp.has_table("secret")
            cols = {c["name"]: type(c["type"]).__name__ for c in insp.get_columns("pums")}
            assert cols["age"] == "BIGINT" and cols["sex"] == "TEXT" and cols["married"] == "BOOLEAN"
    finally:
        engine.dispose()


def _self_signed(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    with thread_server(tmp_path, tls_cert=cert, tls_key=key) as s:
        with psycopg.connect(dsn(s.port, sslmode="require")) as con:
            assert con.pgconn.ssl_in_use
            assert con.execute(QUERY).fetchone()[0] > 0
        out = psql(s.port, QUERY, PGSSLMODE="verify-ca", PGSSLROOTCERT=cert)
        assert out.returncode == 0, out.stderr


def test_no_tls_on_a_public_address_without_the_flag(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.org")
    with pytest.raises(ValueError, match="without TLS"):
        with thread_server(tmp_path, host="0.0.0.0"):
            pass


def test_one_log_line_per_statement_without_values(server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="dpgate.server"):
        with psycopg.connect(dsn(server.port, "bob"), autocommit=True) as con:
            value = con.execute("SELECT COUNT(*) FROM pums WHERE age < %s", [61]).fetchone()[0]
            with pytest.raises(psycopg.Error):
                con.execute("SELECT income FROM pums")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("analyst=bob")]
    assert len(lines) == 2 and "kind=query source=fresh epsilon=" in lines[0] and "kind=refused" in lines[1]
    assert all(f"{value:g}" not in line and "61" not in line and "income" not in line for line in lines)


def test_cancel_request_is_accepted_and_the_session_goes_on(server) -> None:
    with psycopg.connect(dsn(server.port), autocommit=True) as con:
        con.cancel_safe()  # nothing in flight: a no-op, as in PostgreSQL (cancel() would hold the GIL here)
        assert con.execute(QUERY).fetchone()[0] > 0


def test_user_add_command_writes_a_verifier(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dpgate.cli import cli
    from dpgate.server import load_users

    path = tmp_path / "users.yaml"
    res = CliRunner().invoke(cli, ["user", "add", str(path), "dave", "--budget", "0.2", "--password-stdin"],
                             input="hunter-2\n")
    assert res.exit_code == 0, res.output
    assert load_users(path)["dave"].budget == 0.2 and "hunter-2" not in path.read_text()
    res = CliRunner().invoke(cli, ["user", "add", str(path), "eve", "--budget", "0.1"], input="pw\npw\n")
    assert res.exit_code == 0 and sorted(load_users(path)) == ["dave", "eve"]


def dpgate_dir() -> str:
    import dpgate

    return str(Path(dpgate.__file__).parent)


def test_serve_needs_a_key_for_a_ledger_url_before_opening_anything(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dpgate.cli import cli

    data = Path(dpgate_dir()) / "data"
    users = tmp_path / "users.yaml"
    users.write_text("users: {}\n")
    res = CliRunner().invoke(cli, ["serve", "--data", str(data / "PUMS.csv"), "--schema", str(data / "pums.yaml"),
                                   "--ledger", "postgresql://127.0.0.1/x", "--budget", "1", "--users", str(users)])
    assert res.exit_code == 2 and "needs --ledger-key" in res.output


def test_connections_beyond_the_limit_are_refused(tmp_path: Path) -> None:
    with thread_server(tmp_path, max_connections=1) as s:
        with psycopg.connect(dsn(s.port), autocommit=True) as first:
            with pytest.raises(psycopg.OperationalError, match="too many clients"):
                psycopg.connect(dsn(s.port, "bob", sslmode="disable"))
            with pytest.raises(psycopg.OperationalError, match="error response during SSL exchange"):
                psycopg.connect(dsn(s.port, "bob"))  # refused before the SSLRequest is read: libpq hides the text
            assert first.execute("SHOW dpgate.accuracy").fetchone() == ("25.0",)
        deadline = time.monotonic() + 5
        while s.open_connections and time.monotonic() < deadline:  # the first one's thread lets its slot go
            time.sleep(0.01)
        with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as again:  # the slot is free again
            assert again.execute("SELECT current_schema()").fetchone() == ("public",)
