"""Starting the console: the access rules, and uvicorn on the application.

Access (:func:`check_access`): on a loopback address the console may run without a token (only
this machine reaches it); on any other address it needs a token of at least 16 characters and
TLS (a certificate and its key), as ``dpgate serve`` needs TLS for passwords there.  Otherwise
it refuses to start with :class:`ConsoleAccessError`, saying which option to add.
"""

from __future__ import annotations

import os
from typing import Any

from dpgate.errors import InvalidArgument
from dpgate.server.server import is_loopback

__all__ = ["ConsoleAccessError", "DEFAULT_PORT", "TOKEN_ENV", "MIN_TOKEN", "check_access", "reader_for", "run"]

#: The console's default port.
DEFAULT_PORT = 8080
#: The environment variable that gives the token when ``--token`` is not passed.
TOKEN_ENV = "DPGATE_CONSOLE_TOKEN"
#: The shortest token accepted.
MIN_TOKEN = 16


class ConsoleAccessError(InvalidArgument):
    """The console was asked to listen where its access rules do not allow (see the module docstring)."""


def check_access(host: str, token: str | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Refuse a console that would be reachable from other machines without a token and TLS.

    >>> check_access("127.0.0.1", None, None, None)
    >>> check_access("0.0.0.0", None, None, None)
    Traceback (most recent call last):
    ...
    dpgate.console._serve.ConsoleAccessError: The console listens on 0.0.0.0, not a loopback address: pass --token (or set DPGATE_CONSOLE_TOKEN) with at least 16 characters, and --tls-cert and --tls-key; or listen on 127.0.0.1.
    """
    if token is not None and len(token) < MIN_TOKEN:
        raise ConsoleAccessError(f"The console token is too short ({len(token)} characters): use at least {MIN_TOKEN}.")
    if token is not None and (not token.isascii() or not token.isprintable() or " " in token):
        raise ConsoleAccessError("The console token must be printable ASCII without spaces.")
    if (tls_cert is None) != (tls_key is None):
        raise ConsoleAccessError("Pass both --tls-cert and --tls-key, or neither.")
    if is_loopback(host):
        return
    if token is None or tls_cert is None:
        raise ConsoleAccessError(
            f"The console listens on {host}, not a loopback address: pass --token (or set {TOKEN_ENV}) with at "
            f"least {MIN_TOKEN} characters, and --tls-cert and --tls-key; or listen on 127.0.0.1.")


def reader_for(ledger: str, *, schema_path: str | None = None, users_path: str | None = None,
               ledger_key: str | None = None) -> Any:
    """The :class:`~dpgate.console._data.LedgerReader` of a ledger file, with the schema and caps given."""
    from dpgate.console._data import LedgerReader
    from dpgate.schema.domains import Schema
    from dpgate.server.users import load_users

    schema = None if schema_path is None else Schema.load(schema_path)
    caps = None if users_path is None else {name: a.budget for name, a in load_users(users_path).items()}
    return LedgerReader(ledger, schema, caps, key=ledger_key)


def run(ledger: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
        schema_path: str | None = None, users_path: str | None = None, ledger_key: str | None = None,
        tls_cert: str | None = None, tls_key: str | None = None) -> None:
    """Serve the console of ``ledger`` until interrupted (checks :func:`check_access` first)."""
    check_access(host, token, tls_cert, tls_key)
    try:
        import uvicorn

        from dpgate.console._app import create_app
    except ModuleNotFoundError as exc:
        raise InvalidArgument(f"The console needs the package {exc.name!r}: pip install 'dpgate[console]'.") from None
    reader = reader_for(os.fspath(ledger), schema_path=schema_path, users_path=users_path, ledger_key=ledger_key)
    reader.analysts(reader.snapshot())  # read and verify the ledger once before the first page asks
    try:
        uvicorn.run(create_app(reader, token), host=host, port=port, log_level="warning",
                    ssl_certfile=tls_cert, ssl_keyfile=tls_key, limit_concurrency=64, timeout_keep_alive=5,
                    h11_max_incomplete_event_size=16 * 1024, server_header=False)
    finally:
        reader.close()
