"""``dpgate console``: the command that starts the console (registered by :mod:`dpgate.cli`)."""

from __future__ import annotations

import os

import click

from dpgate.console._serve import DEFAULT_PORT, TOKEN_ENV, check_access, run

__all__ = ["console"]


@click.command()
@click.option("--ledger", required=True, help="The ledger file (read only; its data are never needed).")
@click.option("--users", "users_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The users file of dpgate serve, for each analyst's cap.")
@click.option("--schema", "schema_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The schema YAML, to say what each release measured and where on the domain the budget went.")
@click.option("--ledger-key", default=None, type=click.Path(dir_okay=False),
              help="The ledger's key file, to verify the records (default: <ledger>.key when readable).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; any but loopback needs --token and --tls-cert/--tls-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--token", default=None,
              help=f"Every request must carry this token (default: ${TOKEN_ENV}); at least 16 characters.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key.")
def console(ledger: str, users_path: str | None, schema_path: str | None, ledger_key: str | None, host: str,
            port: int, token: str | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Serve a read-only web console of a ledger: budget over time, where it went, releases, analysts."""
    if not os.path.isfile(ledger):
        raise FileNotFoundError(f"no ledger at {ledger!r}.")
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    check_access(host, token, tls_cert, tls_key)
    run(ledger, host=host, port=port, token=token, schema_path=schema_path, users_path=users_path,
        ledger_key=ledger_key, tls_cert=tls_cert, tls_key=tls_key)
