"""Starting the console: the access rules, and uvicorn on the application.

Access (:func:`check_access`): on a loopback address the console may run without a token (only
this machine reaches it); on any other address it needs a token of at least 16 characters and
TLS (a certificate and its key), as ``dpgate serve`` needs TLS for passwords there.  Otherwise
it refuses to start with :class:`ConsoleAccessError`, saying which option to add.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dpgate.console._defaults import DEFAULT_PORT, TOKEN_ENV
from dpgate.errors import InvalidArgument
from dpgate.server.server import is_loopback

__all__ = ["ConsoleAccessError", "DEFAULT_PORT", "TOKEN_ENV", "MIN_TOKEN", "check_access", "listening", "reader_for",
           "run", "serve_beside"]

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
    try:
        reader.analysts(reader.snapshot())  # read and verify the ledger once before the first page asks
        sock = listening(host, port)
        config = uvicorn.Config(create_app(reader, token), log_level="warning", **_UVICORN,
                                ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        print(f"dpgate: console on {'https' if tls_cert else 'http'}://{host}:{sock.getsockname()[1]}"
              f"{'' if token is None else ' (token required)'}", file=sys.stderr, flush=True)
        with sock:
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        reader.close()


#: uvicorn's settings for the console: few connections at once, short keep-alive, small requests.
_UVICORN: dict[str, Any] = {"limit_concurrency": 64, "timeout_keep_alive": 5, "h11_max_incomplete_event_size": 16 * 1024,
                            "server_header": False}


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` and listening (port 0: a free one), for :func:`serve_beside`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def serve_beside(ledger: str, sock: socket.socket, *, token: str | None = None, schema_path: str | None = None,
                 users_path: str | None = None, ledger_key: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None) -> Callable[[], None]:
    """The console of ``ledger`` on ``sock``, in a thread beside ``dpgate serve`` (``--http-port``); returns
    the function that stops it.  The thread waits for the gateway to have created the ledger."""
    import uvicorn

    from dpgate.console._app import create_app

    stopped = threading.Event()
    state: dict[str, Any] = {}

    def main() -> None:
        while not stopped.is_set():
            try:
                reader = reader_for(ledger, schema_path=schema_path, users_path=users_path, ledger_key=ledger_key)
                break
            except Exception:  # noqa: BLE001 - not created yet by the gateway: try again
                time.sleep(0.1)
        else:
            return
        config = uvicorn.Config(create_app(reader, token), log_level="warning", **_UVICORN, ssl_certfile=tls_cert,
                                ssl_keyfile=tls_key)
        state["server"] = server = uvicorn.Server(config)
        try:
            if not stopped.is_set():
                server.run(sockets=[sock])
        finally:
            reader.close()

    thread = threading.Thread(target=main, name="dpgate-console", daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        if "server" in state:
            state["server"].should_exit = True
        thread.join(10)
        sock.close()

    return stop
