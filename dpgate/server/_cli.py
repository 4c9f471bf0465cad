"""The ``dpgate serve`` and ``dpgate user add`` commands (registered by :mod:`dpgate.cli`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

import click

__all__ = ["serve", "user"]


#: Seconds between the interpreter's thread switches in ``dpgate serve`` (Python's default: 0.005).
SWITCH_INTERVAL = 0.0001


@click.command()
@click.option("--data", required=True, help="A .duckdb, .csv or .parquet file (never modified), or an embedded data "
              "set: pums, nettrace, searchlogs.")
@click.option("--schema", "schema_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Schema YAML (public domains); omitted with an embedded data set.")
@click.option("--ledger", required=True,
              help="Durable ledger: a SQLite file, or a postgresql:// URL (shared by servers on several hosts; "
                   "needs --ledger-key); also holds per-analyst provenance.")
@click.option("--ledger-key", default=None, type=click.Path(dir_okay=False),
              help="The ledger's key file (default for a SQLite ledger: <ledger>.key; required for PostgreSQL, "
                   "and shared by every host).")
@click.option("--budget", type=float, required=True, help="Total (global, per-cell) privacy budget ε (ρ with --privacy zcdp).")
@click.option("--privacy", type=click.Choice(["pure", "zcdp"]), default="pure", show_default=True,
              help="pure: ε-DP; zcdp: ρ-zCDP (budget and analysts' caps in ρ), composing like √k.")
@click.option("--users", "users_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Users file (dpgate user add) with SCRAM verifiers and per-analyst caps.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=5433, show_default=True)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key.")
@click.option("--allow-insecure-password", is_flag=True,
              help="Allow password authentication without TLS on a non-loopback address (with --no-require-tls).")
@click.option("--require-tls/--no-require-tls", default=None,
              help="Refuse clients that do not use TLS. Default: on when --host is not a loopback address; "
                   "--no-require-tls there logs a warning.")
@click.option("--accuracy", type=float, default=None,
              help="Default half-width of answers (sessions change it with SET dpgate.accuracy).")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="Default confidence 1−δ.")
@click.option("--policy", type=click.Choice(["minimal", "paper", "no_reuse"]), default="minimal", show_default=True)
@click.option("--reasks", type=click.Choice(["simultaneous", "independent"]), default="simultaneous", show_default=True,
              help="simultaneous: all the intervals given for one query hold together at the stated confidence, so "
                   "an analyst may stop re-asking on what they see; independent: each on its own.")
@click.option("--max-connections", type=click.IntRange(min=1), default=100, show_default=True,
              help="Connections served at once (one thread each), counted from accept: authenticated or not.")
@click.option("--max-connections-per-analyst", type=click.IntRange(min=1), default=None,
              help="Connections one analyst may hold at once (default: a quarter of --max-connections, at least 1).")
@click.option("--auth-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds from accept within which a client must finish startup and authentication.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="Seconds an authenticated connection may stay without sending a message; 0: no limit.")
@click.option("--statement-deadline", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds a statement may spend being compiled and planned before it is refused (54000, "
                   "nothing read or spent); 0: no limit.")
@click.option("--fixed-latency", type=click.FloatRange(min=0, min_open=True, max=86_400), default=None,
              help="Seconds S: answer every statement that reads data S after it began (the next multiple of S "
                   "if it overruns), so response times do not depend on the data. Default: off.")
def serve(data: str, schema_path: str | None, ledger: str, ledger_key: str | None, budget: float, privacy: str,
          users_path: str,
          host: str, port: int, tls_cert: str | None, tls_key: str | None, allow_insecure_password: bool,
          require_tls: bool | None, accuracy: float | None, confidence: float, policy: Any, reasks: Any,
          max_connections: int, max_connections_per_analyst: int | None, auth_timeout: float, idle_timeout: float,
          statement_deadline: float, fixed_latency: float | None) -> None:
    """Serve the gateway over the PostgreSQL wire protocol (psql, psycopg, JDBC, BI tools).

    Logs one line per statement to stderr: analyst, statement hash, kind, source, ε — never values.
    SIGTERM or Ctrl-C: statements in flight finish, then the server exits.
    """
    from dpgate.backends import data_schema, open_data_file
    from dpgate.gateway import Gateway
    from dpgate.server.server import Server
    from dpgate.server.users import load_users

    if "://" in ledger and ledger_key is None:
        raise click.BadParameter("a PostgreSQL ledger needs --ledger-key: the path of a key file that every "
                                 "server host shares (created with a new ledger).", param_hint="--ledger-key")
    # One analyst's CPU-bound statement holds the interpreter lock; others wait for it to be handed
    # over, every 5 ms by default.  A shorter interval keeps a light statement's latency near its
    # own work beside a heavy one (tests/server/test_server_fuzz.py), at a small cost in throughput.
    sys.setswitchinterval(SWITCH_INTERVAL)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    schema = data_schema(data, schema_path, error=click.UsageError)
    users = load_users(users_path)
    gw = Gateway(open_data_file(data, schema, error=click.UsageError), schema, budget=budget, ledger=ledger,
                 ledger_key=ledger_key, policy=policy, fixed_latency=fixed_latency, reasks=reasks, privacy=privacy)
    try:
        server = Server(gw, users, host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                        allow_insecure_password=allow_insecure_password, require_tls=require_tls,
                        defaults={"accuracy": accuracy, "confidence": confidence},
                        max_connections=max_connections, max_connections_per_analyst=max_connections_per_analyst,
                        auth_timeout=auth_timeout, idle_timeout=idle_timeout, statement_deadline=statement_deadline)
    except BaseException:
        gw.close()
        raise

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, name="dpgate-shutdown").start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("dpgate.server").info(
        "listening on %s:%d (%s), %d analysts, budget %g", host, server.port, "TLS" if tls_cert else "no TLS",
        len(users), budget)
    server.serve_forever()
    logging.getLogger("dpgate.server").info("stopped")


@click.group()
def user() -> None:
    """Manage the analysts of a users file."""


@user.command("add")
@click.argument("users_file", type=click.Path(dir_okay=False))
@click.argument("name")
@click.option("--budget", type=float, required=True, help="This analyst's cap ε (fresh releases made for them).")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (one line) instead of prompting.")
def add(users_file: str, name: str, budget: float, password_stdin: bool) -> None:
    """Add or replace analyst NAME: stores a SCRAM-SHA-256 verifier (never the password) and a cap."""
    from dpgate.server.users import add_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    add_user(users_file, name, password, budget)
    click.echo(f"analyst {name!r} (cap ε = {budget:g}) written to {users_file}")
