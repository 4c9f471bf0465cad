"""The console's defaults, importable without the web stack or the ledger (``dpgate --help`` reads them)."""

from __future__ import annotations

__all__ = ["DEFAULT_PORT", "TOKEN_ENV"]

#: The console's default port.
DEFAULT_PORT = 8080
#: The environment variable that gives the token when ``--token`` is not passed.
TOKEN_ENV = "DPGATE_CONSOLE_TOKEN"
