"""``SHOW ALL``: every setting a session can read, as PostgreSQL lists them (name, setting, description).

psql's ``\\dconfig`` reads ``pg_settings`` (answered empty by the catalogue); ``SHOW ALL`` is what
an analyst types to see the session's state: the ``dpgate.*`` options (``SET dpgate.<option>``),
the parameters the client set or the server reported, and the transaction isolation level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpgate.server._protocol import Field
from dpgate.server._values import TEXT

__all__ = ["show_all"]

_DESCRIPTIONS = {
    "accuracy": "Default half-width of every answer's interval (SET dpgate.accuracy = <number>).",
    "confidence": "Default confidence of the intervals, in [0.5, 1).",
    "intervals": "Return <name>_low, <name>_high and <name>_source columns with each estimate.",
    "allow_partial": "Answer what history can answer when the budget cannot pay for the rest.",
    "round": "Round counts to integers.",
    "method": "How a statement is answered (exact: one release per output).",
}


def _text(value: Any) -> str:
    return "" if value is None else "on" if value is True else "off" if value is False else str(value)


def show_all(settings: Mapping[str, Any], parameters: Mapping[str, str]) -> tuple[tuple[Field, ...],
                                                                                 tuple[tuple[str, str, str], ...]]:
    """The columns and rows of ``SHOW ALL`` for a session's ``dpgate.*`` ``settings`` and its ``parameters``."""
    rows = [(f"dpgate.{k}", _text(v), _DESCRIPTIONS.get(k, "A dpgate session option.")) for k, v in settings.items()]
    rows += [("dpgate.budget", "(SHOW dpgate.budget)", "The global budget and this analyst's cap, spent and left."),
             ("dpgate.history", "(SHOW dpgate.history)", "This analyst's statements, releases and deliveries.")]
    rows += [(k, v, "A session parameter (reported at connect, or SET by the client).") for k, v in sorted(parameters.items())]
    rows += [("transaction_isolation", "read committed", "Each statement is decided and recorded on its own.")]
    fields = tuple(Field(n, TEXT, -1) for n in ("name", "setting", "description"))
    return fields, tuple(sorted(rows))
