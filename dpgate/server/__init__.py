"""``dpgate serve``: the gateway as a PostgreSQL wire-protocol (v3) server.

Analysts connect with any PostgreSQL client (psql, psycopg, pg8000, asyncpg,
JDBC, SQLAlchemy, BI tools) and authenticate with SCRAM-SHA-256 against a
users file; the data, the budget and the ledger stay on the server's side.

Modules: :mod:`~dpgate.server._protocol` (framing), :mod:`~dpgate.server._scram`
(authentication), :mod:`~dpgate.server.users` (the users file),
:mod:`~dpgate.server._catalog` (introspection answered from the declared schema) with
:mod:`~dpgate.server._pg_catalog` (the virtual ``pg_catalog`` psql and SQLAlchemy describe from),
:mod:`~dpgate.server._parameters` (parameter types for Describe), :mod:`~dpgate.server._show_all`,
:mod:`~dpgate.server._history` (``SHOW dpgate.history`` with the statements' texts),
:mod:`~dpgate.ledger._provenance` (per-analyst charges and deliveries in the
ledger), :mod:`~dpgate.server._session` (one analyst's statements, SQLSTATEs),
:mod:`~dpgate.server._admission` (connection slots from accept, the authentication
deadline, per-analyst limits), :mod:`~dpgate.server.server` (the listener).

Analyst model.  The gateway's per-cell budget bounds the privacy loss of every
individual over *everything released to anyone*: that is the guarantee that
holds even if all analysts collude.  Each analyst also has a cap, charged the
per-cell accounting of the fresh releases made for them alone (``k · max_j`` of
their per-cell sums, so every fresh release costs them; a cap of 0 gets none); history
is shared, so an answer already released to anyone is free for everyone (it is
post-processing).  An analyst's cap therefore bounds only what was spent *on
their behalf*, not what they can learn: their view also contains every other
release that history lets them reuse, whose privacy loss is bounded by the
global budget alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use: ``dpgate --help`` lists ``serve`` without loading the gateway
    from dpgate.server.server import Server
    from dpgate.server.users import Analyst, add_user, load_users

__all__ = ["Server", "Analyst", "add_user", "load_users"]

_LAZY = {"Server": "dpgate.server.server", "Analyst": "dpgate.server.users", "add_user": "dpgate.server.users",
         "load_users": "dpgate.server.users"}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'dpgate.server' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
