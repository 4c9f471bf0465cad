"""HAVING / ORDER BY / LIMIT / OFFSET as post-processing of released rows.

These clauses act only on the *released* table — one row per group, one
column per SELECT output, values already noisy — so they cost no privacy.
They are rewritten to refer to output columns only, checked against a small
whitelist of node types, and run with DuckDB over that public frame in a fresh
in-memory connection with external access disabled.  SQL is built with sqlglot
builders, never by pasting user text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlglot import exp

from dpgate.errors import ProgrammingError, SchemaError, UnsupportedQuery
from dpgate.schema.domains import Table

__all__ = ["PostProcess", "build", "ROW_ID", "RELEASED"]

ROW_ID = "__dpgate_row"
RELEASED = "released"

_ALLOWED = (
    exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE,
    exp.And, exp.Or, exp.Not, exp.Is, exp.Between, exp.In, exp.Abs, exp.Case, exp.If, exp.Coalesce,
)


@dataclass(frozen=True)
class PostProcess:
    """HAVING / ORDER BY / LIMIT / OFFSET over the released rows.

    Attributes:
        having: the HAVING condition over output columns, as DuckDB SQL (or None).
        order_by: ORDER BY items over output columns, as DuckDB SQL.
        limit: LIMIT value, or None.
        offset: OFFSET value, or None.
    """

    having: str | None = None
    order_by: tuple[str, ...] = ()
    limit: int | None = None
    offset: int | None = None
    _having: exp.Expr | None = field(default=None, repr=False, compare=False)
    _order: tuple[exp.Ordered, ...] = field(default=(), repr=False, compare=False)

    @property
    def is_noop(self) -> bool:
        """True when there is nothing to apply."""
        return self._having is None and not self._order and self.limit is None and self.offset is None

    def sql(self, table: str = RELEASED) -> str:
        """The DuckDB query (over a frame registered as ``table``) that selects and orders row ids."""
        q = exp.select(exp.column(ROW_ID, quoted=True)).from_(exp.to_table(table))
        if self._having is not None:
            q = q.where(self._having.copy())
        q = q.order_by(*[o.copy() for o in self._order], exp.Ordered(this=exp.column(ROW_ID, quoted=True)))
        if self.limit is not None:
            q = q.limit(exp.Literal.number(self.limit))
        if self.offset is not None:
            q = q.offset(exp.Literal.number(self.offset))
        return q.sql(dialect="duckdb")

    def apply(self, df: Any, names: Sequence[str]) -> Any:
        """Apply to the released frame (one row per group, one column per output name)."""
        if self.is_noop:
            return df
        missing = [n for n in names if n not in df.columns]
        if missing:
            raise ProgrammingError(f"the released frame lacks the output columns {missing}.")
        import duckdb

        frame = df[list(names)].copy()
        frame.columns = [f"c{i}" for i in range(len(names))]
        frame[ROW_ID] = range(len(frame))
        con = duckdb.connect(":memory:", config={"enable_external_access": False})
        try:
            con.register(RELEASED, frame)
            rows = con.execute(self._aliased_sql(names)).fetchall()
        finally:
            con.close()
        return df.iloc[[r[0] for r in rows]].reset_index(drop=True)

    def _aliased_sql(self, names: Sequence[str]) -> str:
        # Output names may hold any characters; the registered frame uses c0, c1, … instead.
        mapping = {n: f"c{i}" for i, n in enumerate(names)}

        def rename(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.name in mapping:
                return exp.column(mapping[node.name], quoted=True)
            return node

        having = self._having.transform(rename) if self._having is not None else None
        # transform keeps the root's type (rename replaces columns only), so each item stays an Ordered.
        order = tuple(cast(exp.Ordered, o.transform(rename)) for o in self._order)
        return PostProcess(None, (), self.limit, self.offset, having, order).sql()


def build(
    tree: exp.Select,
    table: Table,
    qualifiers: set[str],
    items: Sequence[tuple[str, exp.Expr, str | None]],
    dialect: str,
) -> PostProcess:
    """Build the post-processing of a SELECT.

    ``items`` lists, per output: (output name, SELECT expression without alias,
    declared column name for group outputs or None).
    """
    args = tree.args
    if not (args.get("having") or args.get("order") or args.get("limit") or args.get("offset")):
        return _NOTHING  # most queries: skip building a new (frozen, equal) value
    having_node = tree.args.get("having")
    having = _rewrite(having_node.this, items, table, qualifiers, "HAVING") if having_node else None
    order: list[exp.Ordered] = []
    order_node = tree.args.get("order")
    for o in order_node.expressions if order_node else []:
        if not isinstance(o, exp.Ordered):
            raise UnsupportedQuery(f"ORDER BY item {o.sql()!r} is not supported.")
        key = o.this
        if isinstance(key, exp.Literal) and not key.is_string:
            k = _int(key, "ORDER BY position")
            if not 1 <= k <= len(items):
                raise UnsupportedQuery(f"ORDER BY {k} is out of range: the SELECT has {len(items)} output columns.")
            new_key: exp.Expr = exp.column(items[k - 1][0], quoted=True)
        else:
            new_key = _rewrite(key, items, table, qualifiers, "ORDER BY")
        extra = set(o.args) - {"this", "desc", "nulls_first"}
        if any(o.args.get(a) for a in extra):
            raise UnsupportedQuery(f"ORDER BY item {o.sql()!r} uses options dpgate does not support.")
        order.append(exp.Ordered(this=new_key, desc=bool(o.args.get("desc")), nulls_first=bool(o.args.get("nulls_first"))))
    limit = offset = None
    lim = tree.args.get("limit")
    if lim is not None:
        if not isinstance(lim, exp.Limit) or set(k for k, v in lim.args.items() if v) - {"expression"}:
            raise UnsupportedQuery(f"{lim.sql()!r}: only LIMIT <integer constant> is supported.")
        limit = _int(lim.expression, "LIMIT")
    off = tree.args.get("offset")
    if off is not None:
        offset = _int(off.expression, "OFFSET")
    return PostProcess(
        having.sql(dialect="duckdb") if having is not None else None,
        tuple(o.sql(dialect="duckdb") for o in order),
        limit,
        offset,
        having,
        tuple(order),
    )


_NOTHING = PostProcess()


def _int(node: exp.Expr | None, what: str) -> int:
    """The value of a non-negative integer constant (LIMIT, OFFSET, ORDER BY position), or refuse."""
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            value = int(node.this)
        except ValueError:
            value = -1
        if value >= 0 and str(value) == node.this.lstrip("+"):
            return value
    shown = node.sql() if node is not None else "nothing"
    raise UnsupportedQuery(f"{what} must be a non-negative integer constant, got {shown!r}.")


def _rewrite(
    node: exp.Expr,
    items: Sequence[tuple[str, exp.Expr, str | None]],
    table: Table,
    qualifiers: set[str],
    clause: str,
) -> exp.Expr:
    by_name = {name.lower(): name for name, _, _ in items}
    by_group = {col.lower(): name for name, _, col in items if col is not None}

    def fn(n: exp.Expr) -> exp.Expr:
        for name, expr, _ in items:
            if n == expr:
                return exp.column(name, quoted=True)
        if isinstance(n, exp.Column):
            if isinstance(n.this, exp.Star):
                raise UnsupportedQuery(f"{clause} cannot use *.")
            if n.table and n.table.lower() not in qualifiers:
                raise SchemaError(f"{clause} refers to {n.sql()!r}, which is not a column of {table.name!r}.")
            if not n.table and n.name.lower() in by_name:
                return exp.column(by_name[n.name.lower()], quoted=True)
            if table.has_column(n.name):
                declared = table.column(n.name).name
                if declared.lower() in by_group:
                    return exp.column(by_group[declared.lower()], quoted=True)
                raise UnsupportedQuery(
                    f"{clause} refers to column {n.name!r}, which is not an output of the SELECT; "
                    f"{clause} acts on the released rows only — add {n.name} to SELECT (and GROUP BY)."
                )
            raise SchemaError(
                f"{clause} refers to {n.name!r}, which is neither an output column "
                f"({[name for name, _, _ in items]}) nor a declared column of {table.name!r}."
            )
        if isinstance(n, (exp.AggFunc, exp.Filter, exp.Window)):
            raise UnsupportedQuery(
                f"{clause} uses {n.sql()!r}, which is not in the SELECT list; {clause} acts only on released "
                f"values — add {n.sql()} to SELECT (with an alias) and refer to it."
            )
        return n

    out = node.transform(fn)
    for sub in out.walk():
        if isinstance(sub, exp.In) and (sub.args.get("query") is not None or sub.args.get("unnest") is not None):
            raise UnsupportedQuery(f"{clause}: IN with a subquery is not supported.")
        if not isinstance(sub, _ALLOWED) and not (isinstance(sub, exp.If) and isinstance(sub.parent, exp.Case)):
            raise UnsupportedQuery(
                f"{clause} may only use output columns, constants, arithmetic, comparisons, BETWEEN, IN, "
                f"IS NULL, CASE and AND / OR / NOT; {sub.sql()!r} is not allowed."
            )
    return out
