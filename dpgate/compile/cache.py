"""Compiled statements kept for repeats (a GROUP BY answered from history, a dashboard's refresh).

Compiling depends only on the text, the parameters, the schema and the dialect, and a
compiled statement is immutable, so a repeat reuses it.  Kept for the process: gateways on
equal schemas (e.g. one per DB-API connection) share them.  Single dict operations, so safe
across threads without a lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpgate.compile import CompiledStatement, SetOption, compile_statement
from dpgate.compile._padded import HELD_WEIGHTS
from dpgate.schema.domains import Schema

__all__ = ["compiled"]

#: Compiled statements kept (the oldest are dropped all at once beyond this).
KEPT = 1024
#: Weights (numerators) the kept statements may hold together, 256 MiB of int64: a wide GROUP BY's
#: queries hold up to 1.5 million each, and a session of them must not keep every one for the process.
KEPT_WEIGHTS = 2**25
_COMPILED: dict[tuple[Any, ...], CompiledStatement] = {}
_KEPT_WEIGHTS = [0]  # what the kept statements hold (approximate across threads: a bound, not an account)
_PLAIN = (str, int, float, bool, type(None))


def _key(sql: str, params: Sequence[Any] | Mapping[str, Any] | None, dialect: str) -> tuple[Any, ...] | None:
    """The cache key of a compilation, or None when a parameter is not a plain value (not cached)."""
    if params is None:
        items: tuple[Any, ...] = ()
    elif isinstance(params, Mapping):
        items = tuple(sorted((str(k), type(v).__name__, v) for k, v in params.items()))
    else:
        items = tuple((type(v).__name__, v) for v in params)
    if not all(type(v) in _PLAIN for *_, v in items):
        return None
    return (sql, isinstance(params, Mapping), items, dialect)


def compiled(sql: str, params: Sequence[Any] | Mapping[str, Any] | None, schema: Schema, fingerprint: str,
             dialect: str, *, max_outputs: int | None = None) -> CompiledStatement | SetOption:
    """``compile_statement(sql, schema, dialect=dialect, params=params, max_outputs=max_outputs)``,
    reused when the same text, plain parameters, dialect and schema (by its ``fingerprint``) were
    compiled before.  A refusal is not kept, and a statement kept is compiled under some limit:
    the caller checks its own limit on what is found (``Gateway._checked``)."""
    text_key = _key(sql, params, dialect)
    key = None if text_key is None else (fingerprint, text_key)
    found = _COMPILED.get(key) if key is not None else None
    if found is not None:
        return found
    stmt = compile_statement(sql, schema, dialect=dialect, params=params, max_outputs=max_outputs)
    if isinstance(stmt, CompiledStatement) and key is not None:
        weights = sum(q.__dict__.get(HELD_WEIGHTS, q.numerators.size) for q in stmt.queries)  # a padded query: its block
        if len(_COMPILED) >= KEPT or _KEPT_WEIGHTS[0] + weights > KEPT_WEIGHTS:
            _COMPILED.clear()
            _KEPT_WEIGHTS[0] = 0
        if weights <= KEPT_WEIGHTS:
            _COMPILED[key] = stmt
            _KEPT_WEIGHTS[0] += weights
    return stmt
