"""A gateway's budget in a notebook (mixed into :class:`~dpgate.Gateway`): ``plot_budget`` and ``plot_cells``.

matplotlib (the ``demo`` extra) is imported on use, never at ``import dpgate``; each method returns a
bare matplotlib ``Figure`` (see :mod:`dpgate.answer._plot`).  Both read only the ledger's records —
what was released and what it cost — never the data, and spend nothing.  The per-cell numbers are
the console's (:mod:`dpgate.ledger._cell_spend`), computed from the records as the accounting does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpgate.answer._plot import new_figure
from dpgate.errors import InvalidArgument, InvalidArgumentType
from dpgate.ledger._cell_spend import cell_spend

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from dpgate.ledger.core import Ledger
    from dpgate.schema.domains import Schema, Table

__all__ = ["Plots"]


class Plots:
    """The plotting methods of :class:`~dpgate.Gateway` (a mixin: it holds no state of its own and
    reads only the gateway attributes declared here)."""

    schema: Schema

    if TYPE_CHECKING:
        @property
        def budget(self) -> float: ...

        @property
        def history(self) -> pd.DataFrame: ...

        @property
        def ledger(self) -> Ledger: ...

    def plot_budget(self) -> Figure:
        """The system's privacy cost over time: ``history["cost_after"]`` against the release number
        (``history["id"]``) as a step line with each release a point, and the budget as a dashed line.
        Returns the matplotlib ``Figure`` (needs ``pip install 'dpgate[demo]'``); free.

        Raises:
            PlottingUnavailable: matplotlib is not installed (a ``dpgate.NotSupportedError``).
        """
        fig = new_figure(figsize=(6.0, 3.5), layout="constrained")
        history = self.history
        ids = history["id"].to_numpy(dtype=float)
        cost = history["cost_after"].to_numpy(dtype=float)
        ax = fig.subplots()
        unit = "ρ" if self.ledger.privacy == "zcdp" else "ε"  # a zCDP gateway's costs are ρ
        ax.plot(ids, cost, drawstyle="steps-post", color="#1f3b73", label=f"spent {unit}")
        ax.plot(ids, cost, linestyle="none", marker="o", markersize=3, color="#1f3b73", label="releases")
        ax.axhline(self.budget, linestyle="--", color="#b03030", label=f"budget {unit} = {self.budget:g}")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # release numbers
        ax.set_xlabel("release")
        ax.set_ylabel(f"privacy cost {unit}")
        ax.set_ylim(0, self.budget * 1.05)
        ax.set_title("Budget over time")
        ax.legend(loc="center right")
        return fig

    def plot_cells(self, column: str, *, table: str | None = None) -> Figure:
        """Where the budget went along ``column``: per value (or range of values charged alike) of its
        declared cells, the spent budget ``B_j`` of a row there (ε; the most over the other columns),
        as the per-cell accounting computes it from the ledger's records; the table's cost is ``k``
        times the tallest bar.  ``table`` may be omitted when one table has ``column``.  Returns the
        matplotlib ``Figure`` (needs ``pip install 'dpgate[demo]'``); free.

        Raises:
            InvalidArgument: an unknown table or column, a column of several tables without ``table``,
                or releases splitting the table into too many boxes to price.
            PlottingUnavailable: matplotlib is not installed (a ``dpgate.NotSupportedError``).
        """
        t = self._plotted_table(column, table)
        col = t.column(column)
        fig = new_figure(figsize=(6.0, 3.5), layout="constrained")
        rows = cell_spend(self.ledger.records(), t, zcdp=self.ledger.privacy == "zcdp").over([col.name])
        labels = [str(r[col.name]) for r in rows]
        heights = [float(r["epsilon"]) for r in rows]  # type: ignore[arg-type]  # a float by construction
        ax = fig.subplots()
        ax.bar(range(len(rows)), heights, color="#4a78c2")
        ax.set_xticks(range(len(rows)), labels, rotation=45 if len(rows) > 6 else 0,
                      ha="right" if len(rows) > 6 else "center", parse_math=False)
        ax.set_xlabel(f"{t.name}.{col.name}", parse_math=False)  # declared names are text, never TeX
        ax.set_ylabel("spent budget ρ of a row" if self.ledger.privacy == "zcdp" else "spent budget ε of a row")
        ax.set_title(f"Where the budget went: {col.name}", parse_math=False)
        return fig

    def _plotted_table(self, column: str, table: str | None) -> Table:
        """The table ``plot_cells`` draws: ``table``, or the one table declaring ``column``."""
        if not isinstance(column, str) or (table is not None and not isinstance(table, str)):
            raise InvalidArgumentType(f"plot_cells takes a column name (and a table name), got {column!r}.")
        names = [t.name for t in self.schema.tables]
        if table is not None:
            found = [t for t in self.schema.tables if t.name.lower() == table.lower()]
            if not found:
                raise InvalidArgument(f"plot_cells: no table {table!r}; the schema declares {', '.join(names)}.")
            candidates = found
        else:
            candidates = list(self.schema.tables)
        having = [t for t in candidates if column.lower() in (c.name.lower() for c in t.columns)]
        if not having:
            declared = ", ".join(f"{t.name}.{c.name}" for t in candidates for c in t.columns)
            raise InvalidArgument(f"plot_cells: no column {column!r}; declared columns: {declared}.")
        if len(having) > 1:
            raise InvalidArgument(f"plot_cells: {column!r} is a column of {', '.join(t.name for t in having)}; "
                                  "name one with table=.")
        return having[0]
