"""What a statement returns.

- :mod:`~dpgate.answer.result` — the immutable ``Answer`` and ``Result`` values;
- :mod:`~dpgate.answer.combine` — AVG, VAR and STDDEV answers from the answers of their linear components;
- :mod:`~dpgate.answer._plot` — ``Result.plot`` (matplotlib, imported on use) and the interval bars of its HTML.
"""

from dpgate.answer.result import Answer, Result

__all__ = ["Answer", "Result"]
