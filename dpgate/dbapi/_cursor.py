"""The DB-API ``Cursor`` (internal; public as :class:`dpgate.dbapi.Cursor`, where the module
docstring records every choice PEP 249 leaves open)."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from typing import Any

from dpgate.answer.result import Answer, Result
from dpgate.dbapi._rows import NO_ROWS, ResultSet, Statements
from dpgate.errors import InterfaceError, ProgrammingError

__all__ = ["Cursor"]


class Cursor:
    """A PEP 249 cursor.  Not to be shared between threads.

    Attributes:
        connection: the :class:`Connection` this cursor belongs to (PEP 249 extension).
        arraysize: default number of rows :meth:`fetchmany` returns (1).
    """

    def __init__(self, connection: Statements) -> None:
        self.connection = connection
        self.arraysize = 1
        self._closed = False
        self._sets: list[ResultSet] = []
        self._set = -1
        self._pos = 0

    # -- PEP 249 attributes ------------------------------------------------------------------------
    @property
    def description(self) -> tuple[tuple[Any, ...], ...] | None:
        """One 7-tuple ``(name, type_code, display_size, internal_size, precision, scale, null_ok)``
        per column; ``None`` before any execute and after ``SET``.  ``type_code`` is a DuckDB-style
        type name (``"DOUBLE"``, ``"BIGINT"``, ``"VARCHAR"``, ``"BOOLEAN"``) that compares equal to
        :data:`NUMBER` or :data:`STRING`; sizes, precision and scale are ``None``."""
        return self._current.description

    @property
    def rowcount(self) -> int:
        """Rows in the current result set; -1 before any execute and after ``SET``."""
        return self._current.rowcount

    @property
    def rownumber(self) -> int | None:
        """0-based index of the next row to fetch (PEP 249 extension); None without a result set."""
        return None if self._current.description is None else self._pos

    lastrowid = None  #: PEP 249 extension: always None (nothing is ever inserted).

    @property
    def result(self) -> Result | None:
        """The :class:`~dpgate.answer.result.Result` of the last statement: every answer it released, for
        every domain group, before HAVING / ORDER BY / LIMIT; None before execute and after SET."""
        return self._current.result

    @property
    def answers(self) -> tuple[Answer, ...]:
        """The :class:`~dpgate.answer.result.Answer` behind each value of the current result set's rows, in
        row order (for each row, its aggregate columns in SELECT order): ``value``, ``low``, ``high``,
        ``confidence``, ``source``, ``epsilon_spent``, ``posterior``.  Empty before execute and after SET."""
        return self._current.answers

    # -- PEP 249 methods ---------------------------------------------------------------------------
    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        """Run one statement: a counting SELECT, or ``SET dpgate.<option> = <value>``.

        Returns the cursor itself (so ``cur.execute(sql).fetchall()`` works).

        Privacy: each aggregate of each group is answered free from history when the
        released answers already pin it within ``accuracy`` at ``confidence``; otherwise
        a fresh measurement of that linear query (sensitivity ``S = max|weight|``) gets
        discrete Laplace noise of scale ``S/α`` at the smallest α that meets the
        requirement, charging ``(α/S)|q_j|`` to each cell ``j`` under add/remove-one-row
        DP (see :class:`~dpgate.Gateway`).  Nothing is charged if the statement fails.

        Raises:
            UnsupportedQuery: the SQL is not a supported counting query or SET (nothing read).
            SchemaError: undeclared table or column.
            InvalidRequirement: missing or bad accuracy / confidence.
            BudgetExhausted: answering would overspend (an ``OperationalError``).
            ProgrammingError: parameters do not match the placeholders.
            InterfaceError: the cursor or connection is closed.
        """
        self._check_open()
        self._sets, self._set, self._pos = [], -1, 0
        rs = self.connection._run(operation, parameters)
        self._sets, self._set = [rs], 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Any) -> Cursor:
        """Run ``operation`` once per parameter set; one result set per run (see :meth:`nextset`)."""
        self._check_open()
        self._sets, self._set, self._pos = [], -1, 0
        if isinstance(seq_of_parameters, (str, bytes, Mapping)) or not hasattr(seq_of_parameters, "__iter__"):
            raise ProgrammingError(
                f"executemany needs a sequence of parameter sets, got {type(seq_of_parameters).__name__}."
            )
        sets = [self.connection._run(operation, p) for p in seq_of_parameters]
        self._sets, self._set = sets, (0 if sets else -1)
        return self

    def nextset(self) -> bool | None:
        """Move to the next result set of :meth:`executemany`; True if there is one, else None."""
        self._check_open()
        if self._set < 0:
            raise ProgrammingError("no result sets: call execute() or executemany() first.")
        if self._set + 1 >= len(self._sets):
            return None
        self._set += 1
        self._pos = 0
        return True

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None when the result set is exhausted."""
        rows = self._rows()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``size`` (default :attr:`arraysize`) next rows; an empty list when exhausted."""
        rows = self._rows()
        n = self.arraysize if size is None else size
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ProgrammingError(f"fetchmany size must be a non-negative integer, got {n!r}.")
        out = list(rows[self._pos : self._pos + int(n)])
        self._pos += len(out)
        return out

    def fetchall(self) -> list[tuple[Any, ...]]:
        """All remaining rows."""
        rows = self._rows()
        out = list(rows[self._pos :])
        self._pos = len(rows)
        return out

    def close(self) -> None:
        """Close the cursor; later operations raise InterfaceError.  Closing twice is allowed."""
        self._closed = True
        self._sets, self._set = [], -1

    def setinputsizes(self, sizes: Any) -> None:
        """PEP 249: accepted and ignored."""
        self._check_open()

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """PEP 249: accepted and ignored."""
        self._check_open()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dpgate.dbapi.Cursor {'closed' if self._closed else 'open'} rowcount={self.rowcount}>"

    # -- internals ----------------------------------------------------------------------------------
    @property
    def _current(self) -> ResultSet:
        return self._sets[self._set] if self._set >= 0 else NO_ROWS

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this dpgate cursor is closed.")
        self.connection._check_open()

    def _rows(self) -> tuple[tuple[Any, ...], ...]:
        self._check_open()
        if self._set < 0:
            raise ProgrammingError("no result set to fetch from: call execute() with a SELECT first.")
        rs = self._sets[self._set]
        if rs.description is None:
            raise ProgrammingError("the last statement (SET dpgate.…) returns no rows; there is nothing to fetch.")
        return rs.rows
