"""Row-level SQL node types → how the :class:`~dpgate.compile.evaluate.Evaluator` evaluates them.

Handlers see the evaluator through the :class:`Evaluator` protocol below, so this module does
not import :mod:`dpgate.compile.evaluate` (which imports it).

One function per node type, collected in one table, :data:`_HANDLERS` (sqlglot's
``Generator.TRANSFORMS`` idea, instead of an isinstance chain).
:func:`handler_for` walks a node class's MRO, so a subclass resolves to its
base's handler (``TryCast`` is a ``Cast``); a class with no handler in its MRO
is refused by :func:`_refuse` with a message naming what is supported.
Each handler takes the evaluator and the node and returns a
:class:`~dpgate.compile.cells.Val`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from sqlglot import exp

from dpgate.compile._dates import date_trunc, extract, is_time_cast, time_literal
from dpgate.compile.cells import BOOL, CAT, NULL, NUM, STR, Val, boolean, column_of, like_regex, parse_number
from dpgate.errors import UnsupportedQuery

__all__ = ["Evaluator", "Handler", "handler_for"]


class Evaluator(Protocol):
    """What a handler may ask of the evaluator that calls it (:class:`dpgate.compile.evaluate.Evaluator`
    is the one implementation): its children's values, and the shared typing and logic rules."""

    def ev(self, node: exp.Expr) -> Val: ...
    def column_value(self, node: exp.Column) -> Val: ...
    def num(self, node: exp.Expr, ctx: exp.Expr) -> Val: ...
    def as_num(self, a: Val, node: exp.Expr, ctx: exp.Expr) -> Val: ...
    def cond(self, node: exp.Expr) -> Val: ...
    def finite(self, a: Val, node: exp.Expr) -> None: ...
    def and_(self, a: Val, b: Val) -> Val: ...
    def or_(self, a: Val, b: Val) -> Val: ...
    def compare(self, sym: str, a: Val, b: Val, node: exp.Expr) -> Val: ...


#: A node handler: (evaluator, node) → value.
Handler = Callable[[Evaluator, Any], Val]


def _paren(ev: Evaluator, node: exp.Paren) -> Val:
    return ev.ev(node.this)


def _column(ev: Evaluator, node: exp.Column) -> Val:
    return ev.column_value(node)


def _literal(ev: Evaluator, node: exp.Literal) -> Val:
    if node.is_string:
        return Val(STR, node.this, False)
    return Val(NUM, float(parse_number(node.this)), False, text=node.this)


def _null(ev: Evaluator, node: exp.Null) -> Val:
    return Val(NULL, 0.0, True)


def _boolean(ev: Evaluator, node: exp.Boolean) -> Val:
    return Val(BOOL, bool(node.this), False)


def _neg(ev: Evaluator, node: exp.Neg) -> Val:
    a = ev.num(node.this, node)
    return Val(NUM, -a.v, a.null)


def _and_node(ev: Evaluator, node: exp.And) -> Val:
    return ev.and_(ev.cond(node.this), ev.cond(node.expression))


def _or_node(ev: Evaluator, node: exp.Or) -> Val:
    return ev.or_(ev.cond(node.this), ev.cond(node.expression))


def _not(ev: Evaluator, node: exp.Not) -> Val:
    a = ev.cond(node.this)
    return boolean(~a.v, a.null)


def _between(ev: Evaluator, node: exp.Between) -> Val:
    if node.args.get("symmetric"):
        raise UnsupportedQuery("BETWEEN SYMMETRIC is not supported; order the bounds and use BETWEEN.")
    x = ev.ev(node.this)
    lo = ev.compare(">=", x, ev.ev(node.args["low"]), node)
    hi = ev.compare("<=", x, ev.ev(node.args["high"]), node)
    return ev.and_(lo, hi)


def _like_node(ev: Evaluator, node: exp.Like | exp.ILike) -> Val:
    return _like(ev, node, None)


def _escape(ev: Evaluator, node: exp.Escape) -> Val:
    if not isinstance(node.this, (exp.Like, exp.ILike)):
        raise UnsupportedQuery(f"ESCAPE is only supported with LIKE / ILIKE, not in {node.sql()!r}.")
    esc = ev.ev(node.expression)
    if esc.kind != STR or len(esc.v) != 1:
        raise UnsupportedQuery("ESCAPE needs a one-character string constant.")
    return _like(ev, node.this, esc.v)


def _if(ev: Evaluator, node: exp.If) -> Val:
    return _branches(ev, [(node.this, node.args.get("true"))], node.args.get("false"), node)


def _coalesce(ev: Evaluator, node: exp.Coalesce) -> Val:
    vals = [ev.num(e, node) for e in [node.this, *node.expressions]]
    acc = vals[-1]
    for a in reversed(vals[:-1]):
        acc = Val(NUM, np.where(a.null, acc.v, a.v), a.null & acc.null)
    return _keep_bool(acc, vals)


def _abs(ev: Evaluator, node: exp.Abs) -> Val:
    a = ev.num(node.this, node)
    return Val(NUM, np.abs(a.v), a.null)


def _refuse(ev: Evaluator, node: exp.Expr) -> Val:
    """Every node type without a handler: refused, saying what to write instead."""
    sql = node.sql()
    if isinstance(node, exp.Placeholder):
        raise UnsupportedQuery(f"the parameter {sql} has no value; pass params= to bind it.")
    if isinstance(node, (exp.Subquery, exp.Select, exp.Exists, exp.SetOperation)):
        raise UnsupportedQuery(f"subqueries are not supported ({sql!r}); write one SELECT over one table.")
    if isinstance(node, exp.Window):
        raise UnsupportedQuery(f"window functions (OVER) are not supported ({sql!r}).")
    if isinstance(node, (exp.AggFunc, exp.Filter)):
        raise UnsupportedQuery(
            f"the aggregate {sql!r} is used inside a row-level expression (WHERE, FILTER, or another "
            "aggregate); aggregates may only appear at the top of SELECT items (use HAVING to filter groups)."
        )
    if isinstance(node, (exp.Func, exp.Anonymous)):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
        raise UnsupportedQuery(
            f"function {name.upper()} is not supported in {sql!r}; row-level expressions may use "
            "CASE WHEN, IF, COALESCE, ABS, CAST, arithmetic, comparisons, BETWEEN, IN, LIKE and IS NULL."
        )
    raise UnsupportedQuery(f"the expression {sql!r} ({type(node).__name__}) is not supported by dpgate.")


def _keep_bool(out: Val, parts: list[Val]) -> Val:
    """``out`` as a condition when every part was one (COALESCE of conditions stays a condition)."""
    if all(p.kind in (BOOL, NULL) for p in parts):
        return boolean(np.asarray(out.v) != 0, out.null)
    return out


def _in(ev: Evaluator, node: exp.In) -> Val:
    if node.args.get("query") is not None or node.args.get("unnest") is not None:
        raise UnsupportedQuery(f"IN with a subquery is not supported ({node.sql()!r}); list constants: IN (1, 2).")
    if not node.expressions:
        raise UnsupportedQuery(f"{node.sql()!r}: IN needs a list of constants.")
    x = ev.ev(node.this)
    first, *rest = node.expressions
    acc = ev.compare("=", x, ev.ev(first), node)
    for e in rest:
        acc = ev.or_(acc, ev.compare("=", x, ev.ev(e), node))
    return acc


def _like(ev: Evaluator, node: exp.Expr, escape: str | None) -> Val:
    """[NOT] LIKE / ILIKE on a categorical column: the pattern is matched against the declared values."""
    x, p = ev.ev(node.this), ev.ev(node.expression)
    if x.kind != CAT:
        raise UnsupportedQuery(
            f"{node.sql()!r}: LIKE / ILIKE apply to categorical columns only (matched against their "
            "declared values)."
        )
    col = column_of(x)
    if p.kind == NULL:
        return boolean(np.zeros_like(x.v, dtype=bool), np.ones_like(x.v, dtype=bool))
    if p.kind != STR:
        raise UnsupportedQuery(f"{node.sql()!r}: the LIKE pattern must be a string constant.")
    rx = like_regex(str(p.v), escape, isinstance(node, exp.ILike))
    table = np.zeros(col.n_cells, dtype=bool)
    for i, value in enumerate(col.values):
        table[i] = rx.fullmatch(value) is not None
    if node.args.get("negate"):  # NOT LIKE: ``other`` matches no pattern, so NOT LIKE selects it
        table[: col.null_cell] = ~table[: col.null_cell]
    return boolean(table[np.asarray(x.v)], x.null)


def _is(ev: Evaluator, node: exp.Is) -> Val:
    a, rhs = ev.ev(node.this), node.expression
    if isinstance(rhs, exp.Null):
        ev.finite(a, node)
        null = np.asarray(a.null, dtype=bool)
        return Val(BOOL, null.copy() if null.ndim else bool(null), False)
    if isinstance(rhs, exp.Boolean):
        if a.kind not in (BOOL, NULL):
            raise UnsupportedQuery(f"{node.sql()!r}: IS TRUE / IS FALSE need a condition.")
        v = a.v if rhs.this else np.logical_and(np.logical_not(a.v), np.logical_not(a.null))
        return Val(BOOL, v, False)
    raise UnsupportedQuery(f"{node.sql()!r}: IS supports NULL, TRUE and FALSE only.")


# -- CASE / IF / CAST -----------------------------------------------------------------------
def _case(ev: Evaluator, node: exp.Case) -> Val:
    operand = node.this
    pairs = []
    for branch in node.args.get("ifs") or []:
        pairs.append((branch.this, branch.args.get("true"), operand))
    return _branches(ev, pairs, node.args.get("default"), node)


def _branches(ev: Evaluator, pairs: list[tuple], default: exp.Expr | None, node: exp.Expr) -> Val:
    """CASE / IF: the first branch whose condition is TRUE, else ``default`` (NULL when absent)."""
    acc = ev.ev(default) if default is not None else Val(NULL, 0.0, True)
    vals = [acc]
    results = []
    for pair in pairs:
        when, then = pair[0], pair[1]
        if len(pair) > 2 and pair[2] is not None:
            c = ev.compare("=", ev.ev(pair[2]), ev.ev(when), node)
        else:
            c = ev.cond(when)
        results.append((c, ev.ev(then) if then is not None else Val(NULL, 0.0, True)))
    vals += [r for _, r in results]
    all_bool = all(v.kind in (BOOL, NULL) for v in vals)
    for v, src in zip(vals, [default, *[p[1] for p in pairs]], strict=True):
        if v.kind not in (NUM, BOOL, NULL):
            raise UnsupportedQuery(
                f"{node.sql()!r}: CASE / IF branches must be numbers or conditions, but "
                f"{(src.sql() if src is not None else 'NULL')!r} is a {v.kind}; give each branch a number."
            )
    acc = ev.as_num(acc, node, node)
    for c, r in reversed(results):
        r = ev.as_num(r, node, node)
        acc = Val(NUM, np.where(c.v, r.v, acc.v), np.where(c.v, r.null, acc.null))
    if all_bool:
        return boolean(np.asarray(acc.v) != 0, acc.null)
    return acc


def _cast(ev: Evaluator, node: exp.Cast) -> Val:
    """CAST / TRY_CAST to BOOLEAN, an integer type (integers only) or a real type."""
    to: exp.DataType = node.args["to"]
    a = ev.ev(node.this)
    if is_time_cast(node):
        return time_literal(node, a)
    if to.is_type(exp.DataType.Type.BOOLEAN):
        if a.kind in (BOOL, NULL):
            return a
        a = ev.as_num(a, node.this, node)
        ev.finite(a, node)
        return boolean(np.asarray(a.v) != 0, a.null)
    if to.is_type(*exp.DataType.INTEGER_TYPES):
        a = ev.as_num(a, node.this, node)
        ev.finite(a, node)
        v = np.asarray(a.v, dtype=float)
        if np.any(np.logical_and(v != np.round(v), np.logical_not(a.null))):
            raise UnsupportedQuery(
                f"{node.sql()!r} casts a non-integer value to an integer type (SQL would round it); "
                "only integer and boolean values may be cast to INT."
            )
        return a
    if to.is_type(*exp.DataType.REAL_TYPES):
        return ev.as_num(a, node.this, node)
    raise UnsupportedQuery(
        f"{node.sql()!r}: CAST to {to.sql()} is not supported; cast to INTEGER, DOUBLE, BOOLEAN, DATE or TIMESTAMP."
    )


# -- the dispatch table -------------------------------------------------------------------------------
def _comparison(sym: str) -> Handler:
    def handle(ev: Evaluator, node: exp.Binary) -> Val:
        return ev.compare(sym, ev.ev(node.this), ev.ev(node.expression), node)

    return handle


def _arithmetic(op: Callable[[Any, Any], Any]) -> Handler:
    def handle(ev: Evaluator, node: exp.Binary) -> Val:
        a, b = ev.num(node.this, node), ev.num(node.expression, node)
        with np.errstate(all="ignore"):
            v = op(a.v, b.v)
        return Val(NUM, v, np.logical_or(a.null, b.null))

    return handle


def _sql_mod(a: Any, b: Any) -> Any:
    # SQL's remainder takes the sign of the dividend, like C's fmod; x % 0 is not a number.
    return np.where(np.asarray(b) == 0, np.nan, np.fmod(a, b))


#: Node type → handler.  A type missing here (after walking its MRO) is refused.
_HANDLERS: dict[type, Handler] = {
    exp.Paren: _paren,
    exp.Column: _column,
    exp.Literal: _literal,
    exp.Null: _null,
    exp.Boolean: _boolean,
    exp.Neg: _neg,
    exp.Add: _arithmetic(np.add),
    exp.Sub: _arithmetic(np.subtract),
    exp.Mul: _arithmetic(np.multiply),
    exp.Div: _arithmetic(np.divide),
    exp.Mod: _arithmetic(_sql_mod),
    exp.EQ: _comparison("="),
    exp.NEQ: _comparison("<>"),
    exp.LT: _comparison("<"),
    exp.LTE: _comparison("<="),
    exp.GT: _comparison(">"),
    exp.GTE: _comparison(">="),
    exp.And: _and_node,
    exp.Or: _or_node,
    exp.Not: _not,
    exp.Is: _is,
    exp.Between: _between,
    exp.In: _in,
    exp.Like: _like_node,
    exp.ILike: _like_node,
    exp.Escape: _escape,
    exp.Case: _case,
    exp.If: _if,
    exp.Coalesce: _coalesce,
    exp.Cast: _cast,
    exp.TryCast: _cast,
    exp.Abs: _abs,
    exp.Extract: lambda ev, node: extract(ev.ev(node.expression), node),
    exp.TimestampTrunc: lambda ev, node: date_trunc(ev.ev(node.this), node),
    exp.DateTrunc: lambda ev, node: date_trunc(ev.ev(node.this), node),
}
#: Node class → its resolved handler, filled on first use (sqlglot's node classes are a fixed set).
_RESOLVED: dict[type, Handler] = {}


def handler_for(cls: type) -> Handler:
    """The handler of node class ``cls``: the first class of its MRO in the table, else the refusal."""
    handler = _RESOLVED.get(cls)
    if handler is None:
        for base in cls.__mro__:
            handler = _HANDLERS.get(base)
            if handler is not None:
                break
        else:
            handler = _refuse
        _RESOLVED[cls] = handler
    return handler
