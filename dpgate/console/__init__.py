"""The web console for the data owner: where the privacy budget went and what is left (``dpgate console``,
and ``dpgate serve --http-port``).

Read-only: it reads the ledger (never the data), so it can run on another host with a copy of
the ledger.  Pages: budget over time (global and per analyst, with the caps; free answers from
history against paid ones), where the budget went (per-cell spent budget over the declared
domain), the release history (filtered and paged on the server), and per analyst.  Needs the
``console`` extra (Starlette, uvicorn, Altair); the vega, vega-lite and vega-embed scripts that
draw the charts ship in ``static/`` (BSD-3-Clause, their licences beside them): no CDN.

- :mod:`~dpgate.console._data` — :class:`LedgerReader`: the ledger's snapshot and the pages' numbers;
- :mod:`~dpgate.console._charts` — the charts (Vega-Lite specifications built with Altair);
- :mod:`~dpgate.console._html`, :mod:`~dpgate.console._app` — the pages and the ASGI application (Starlette);
- :mod:`~dpgate.console._serve`, :mod:`~dpgate.console._cli` — the access rules, uvicorn, the command, and
  ``--http-port`` added to ``dpgate serve`` (the server's layer, below this one, does not know the console).

Access: loopback by default; any other address needs a token and TLS, else
:class:`ConsoleAccessError` at start.  With a token, a request without it gets 401.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpgate.console._defaults import TOKEN_ENV

if TYPE_CHECKING:  # imported on first use: ``dpgate --help`` lists ``console`` without loading the ledger
    from dpgate.console._data import LedgerReader
    from dpgate.console._serve import ConsoleAccessError, check_access, run

__all__ = ["ConsoleAccessError", "LedgerReader", "TOKEN_ENV", "check_access", "create_app", "run"]

_LAZY = {"LedgerReader": "dpgate.console._data",
         "ConsoleAccessError": "dpgate.console._serve", "check_access": "dpgate.console._serve",
         "run": "dpgate.console._serve"}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'dpgate.console' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def create_app(reader: LedgerReader, token: str | None = None) -> Any:
    """The console's ASGI application over ``reader`` (needs Starlette: the ``console`` extra);
    with ``token``, every request must carry it (``Authorization: Bearer``, or ``?token=`` once)."""
    from dpgate.console._app import create_app as build

    return build(reader, token)
