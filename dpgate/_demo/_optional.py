"""The demo's optional dependencies (the ``demo`` extra: matplotlib, tqdm), imported on use.

The core package never imports them, so ``pip install dpgate`` works without
plotting; the demo and the benchmarks need ``pip install 'dpgate[demo]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dpgate.errors import NotSupportedError

__all__ = ["MissingDependency", "require"]


class MissingDependency(NotSupportedError, ImportError):
    """An optional dependency of the demo is not installed; the message says what to install.

    A :class:`dpgate.NotSupportedError` (so the CLI prints it as one line) and an
    ``ImportError`` (so ``except ImportError`` still catches it).
    """


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependency` naming the ``demo`` extra.

    >>> require("math", "arithmetic").sqrt(4.0)
    2.0
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{purpose} needs {module.split('.')[0]}, which is not installed; "
            "install dpgate with its demo extra: pip install 'dpgate[demo]'."
        ) from exc
