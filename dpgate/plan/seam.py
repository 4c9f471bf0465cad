"""What the extensions (``dpgate.model``, ``dpgate.warmstart``) may use of a gateway.

:class:`GatewaySeam` lists it: the public schema, compiling SQL, a frozen
:class:`~dpgate.plan.state.TableView` of a table's released history taken under the
gateway's lock, the budget read-outs, and the one release primitive,
``release_measurements``.  :class:`dpgate.Gateway` satisfies it structurally; the
extensions are typed against it, so they never import ``dpgate.gateway`` and the
gateway, the higher layer, imports them (its ``warm_start``, ``estimate`` and
``synthesize`` delegate to them).

Nothing here reads data or spends budget; only ``release_measurements`` does, and it
states its privacy guarantee on :meth:`dpgate.Gateway.release_measurements`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dpgate.compile import CompiledStatement
    from dpgate.compile.query import LinearQuery
    from dpgate.plan.state import TableView
    from dpgate.schema.domains import Schema

__all__ = ["GatewaySeam"]


class GatewaySeam(Protocol):
    """The part of a gateway an extension reads and releases through (``dpgate.Gateway`` is one)."""

    @property
    def schema(self) -> Schema:
        """The public schema (tables, columns, domains)."""
        ...

    @property
    def budget(self) -> float:
        """The total privacy budget ε."""
        ...

    @property
    def spent(self) -> float:
        """The ε spent so far (system cost, per-cell accounting)."""
        ...

    def compile(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> CompiledStatement:
        """One SELECT compiled against the gateway's schema and dialect (reads no data, spends nothing)."""
        ...

    def locked_view(self, table: str, queries: Sequence[LinearQuery] = ()) -> AbstractContextManager[TableView]:
        """Hold the gateway's lock; give a frozen snapshot of ``table``'s history refined with ``queries``."""
        ...

    def release_measurements(
        self, table: str, measurements: Sequence[tuple[LinearQuery, float]], *, kind: str = "warm_start", label: str = ""
    ) -> list[float]:
        """**Spends budget**: noisy answers of the given ``(query, α)`` pairs, recorded before they are returned."""
        ...
