"""dpgate: differentially private answers to SQL and pandas counting queries.

Before spending any privacy budget dpgate runs Bayesian inference over every
answer it has already released; when history already meets the analyst's
accuracy requirement the answer is free, otherwise it charges the smallest
budget that does.  Every answer carries an honest interval.
"""

from __future__ import annotations

import importlib
import sys
import typing as _typing

from dpgate import errors
from dpgate._version import __version__ as __version__
from dpgate.errors import *  # noqa: F403  (the exception classes: errors.__all__)

if _typing.TYPE_CHECKING:  # the names below are imported on first use (PEP 562): ``dpgate --version`` starts at once
    from dpgate import dbapi, inference
    from dpgate.answer.result import Answer, Result
    from dpgate.compile import compile_sql
    from dpgate.compile.query import LinearQuery
    from dpgate.dbapi import (
        BINARY,
        DATETIME,
        NUMBER,
        ROWID,
        STRING,
        Binary,
        Date,
        DateFromTicks,
        Time,
        TimeFromTicks,
        Timestamp,
        TimestampFromTicks,
        apilevel,
        connect,
        paramstyle,
        threadsafety,
    )
    from dpgate.gateway import POLICIES, Gateway
    from dpgate.ledger.core import Ledger
    from dpgate.plan.explain import Explanation
    from dpgate.schema.domains import Column, Schema, Table

__all__ = [
    "Answer",
    "BINARY",
    "Binary",
    "Column",
    "DATETIME",
    "Date",
    "DateFromTicks",
    "Explanation",
    "NUMBER",
    "ROWID",
    "STRING",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Gateway",
    "Ledger",
    "LinearQuery",
    "POLICIES",
    "Result",
    "Schema",
    "Table",
    "apilevel",
    "compile_sql",
    "connect",
    "dbapi",
    "inference",
    "paramstyle",
    "threadsafety",
]
__all__ += errors.__all__  # the exception classes, listed once in dpgate.errors

#: Where each public name is defined ("" for a subpackage): imported when first used.
_LAZY = {
    "Answer": "dpgate.answer.result", "Result": "dpgate.answer.result", "compile_sql": "dpgate.compile",
    "LinearQuery": "dpgate.compile.query", "POLICIES": "dpgate.gateway", "Gateway": "dpgate.gateway",
    "Ledger": "dpgate.ledger.core", "Explanation": "dpgate.plan.explain", "Column": "dpgate.schema.domains",
    "Schema": "dpgate.schema.domains", "Table": "dpgate.schema.domains", "dbapi": "", "inference": "",
    **{name: "dpgate.dbapi" for name in ("BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Date",
                                         "DateFromTicks", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks",
                                         "apilevel", "connect", "paramstyle", "threadsafety")},
}


def __getattr__(name: str) -> object:
    """A public name or a submodule, imported on first use (PEP 562)."""
    where = _LAZY.get(name)
    if where is None and not name.startswith("__"):
        try:
            return importlib.import_module(f"dpgate.{name}")  # dpgate.datasets after a bare ``import dpgate``
        except ModuleNotFoundError as exc:
            if exc.name != f"dpgate.{name}":
                raise
    if where is None:
        raise AttributeError(f"module 'dpgate' has no attribute {name!r}")
    value = importlib.import_module(f"dpgate.{name}") if where == "" else getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _DeferredAccessor:
    """``df.dp`` until :mod:`dpgate.accessor` is imported: its first use imports it (which registers
    the real accessor in this one's place) and returns the real one."""

    def __new__(cls, frame: _typing.Any) -> _typing.Any:
        from dpgate.accessor import DPAccessor

        return DPAccessor(frame)


def _register_accessor() -> None:
    """Register ``df.dp`` (the deferred accessor) unless :mod:`dpgate.accessor` already did."""
    import pandas as pd

    if "dp" not in vars(pd.DataFrame):
        pd.api.extensions.register_dataframe_accessor("dp")(_DeferredAccessor)


class _AfterPandas:
    """A meta path finder that registers ``df.dp`` once pandas is imported (and then leaves)."""

    def find_spec(self, fullname: str, path: _typing.Any, target: _typing.Any = None) -> _typing.Any:
        if fullname != "pandas":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("pandas")
        loader: _typing.Any = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: object) -> None:
                run(module)
                _register_accessor()

            loader.exec_module = exec_module
        return spec


# ``import dpgate`` registers ``df.dp`` — now if pandas is loaded, else as soon as it is — without
# importing the gateway (``dpgate --version`` starts at once; the first ``df.dp`` imports it).
if "pandas" in sys.modules:
    _register_accessor()
else:
    sys.meta_path.insert(0, _AfterPandas())
