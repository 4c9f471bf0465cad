"""``dpgate console``: the command that starts the console (registered by :mod:`dpgate.cli`)."""

from __future__ import annotations

import functools
import os
from typing import Any

import click

from dpgate.console._defaults import DEFAULT_PORT, TOKEN_ENV  # the rest on use: ``dpgate --help`` loads no gateway

__all__ = ["console", "with_http_port"]


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
    from dpgate.console._serve import check_access, run

    if not os.path.isfile(ledger):
        raise FileNotFoundError(f"no ledger at {ledger!r}.")
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    check_access(host, token, tls_cert, tls_key)
    run(ledger, host=host, port=port, token=token, schema_path=schema_path, users_path=users_path,
        ledger_key=ledger_key, tls_cert=tls_cert, tls_key=tls_key)


def with_http_port(serve: click.Command) -> click.Command:
    """``dpgate serve`` with ``--http-port P`` (and ``--http-token``): the console's pages beside the
    PostgreSQL port, on the same host, under the same access rules and TLS files (a SQLite ledger only).
    Changes ``serve`` in place (the server's layer does not know the console) and returns it."""
    callback = serve.callback
    assert callback is not None
    serve.params.append(click.Option(["--http-port"], type=click.IntRange(0, 65535), default=None,
                                     help="Also serve the web console (dpgate console) on this port of --host."))
    serve.params.append(click.Option(["--http-token"], default=None,
                                     help=f"The console's token (default: ${TOKEN_ENV}); needed off loopback."))

    @functools.wraps(callback)
    def serve_with_console(*args: Any, http_port: int | None = None, http_token: str | None = None,
                           **kwargs: Any) -> Any:
        if http_port is None:
            return callback(*args, **kwargs)
        from dpgate.console._serve import check_access, listening, serve_beside

        ledger, host = kwargs["ledger"], kwargs["host"]
        if "://" in ledger:
            raise click.BadParameter("the console reads a SQLite ledger file, not a PostgreSQL ledger: run "
                                     "dpgate console on a host that reads it", param_hint="--http-port")
        token = http_token if http_token is not None else os.environ.get(TOKEN_ENV) or None
        check_access(host, token, kwargs["tls_cert"], kwargs["tls_key"])
        sock = listening(host, http_port)
        stop = serve_beside(ledger, sock, token=token, schema_path=kwargs["schema_path"],
                            users_path=kwargs["users_path"], ledger_key=kwargs["ledger_key"],
                            tls_cert=kwargs["tls_cert"], tls_key=kwargs["tls_key"])
        click.echo(f"dpgate: console on {'https' if kwargs['tls_cert'] else 'http'}://{host}:{sock.getsockname()[1]}",
                   err=True)
        try:
            return callback(*args, **kwargs)
        finally:
            stop()

    serve.callback = serve_with_console
    return serve
