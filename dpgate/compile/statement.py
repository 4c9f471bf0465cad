"""One statement: tokens, hints, SET, parameters, parse.

The first stage of the compiler: the SQL text is tokenized (hints are read from
the tokens' comments, several statements are refused from the tokens alone),
parsed into exactly one sqlglot tree, and PEP 249 parameters are bound as
literal nodes.  ``SET dpgate.<option> = <value>`` becomes a :class:`SetOption`.
Everything here works on sqlglot's tokens and trees; nothing is executed.
"""

from __future__ import annotations

import difflib
import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from dpgate._validate import FALSE_WORDS, TRUE_WORDS, confidence_level, finite, positive_finite
from dpgate.compile._dates import date_parameter
from dpgate.compile.bounds import check_number_text, check_parameter, excerpt
from dpgate.errors import (
    DataError,
    InvalidArgumentType,
    InvalidRequirement,
    ProgrammingError,
    QuerySyntaxError,
    QueryTooComplex,
    UnsupportedQuery,
)

__all__ = [
    "Hints", "SetOption", "HINT_KEYS", "METHOD_VALUES", "MODEL_METHODS", "SET_OPTIONS",
    "MAX_SQL_LENGTH", "MAX_TOKENS", "MAX_NESTING_DEPTH", "MAX_OPERATORS",
    "bind", "check_length", "check_complexity", "check_statement", "dialect_of", "hints", "literal", "parse",
    "set_option", "split_check", "tokenize",
]

# Size and nesting limits, checked on the text and the tokens before sqlglot's
# recursive-descent parser (and dpgate's own tree walkers) recurse: beyond them
# Python's recursion limit, not the query, decides what happens.  A counting
# query an analyst writes by hand stays far below each of them.
#: Longest SQL text accepted, in characters (long IN lists fit comfortably).
MAX_SQL_LENGTH = 100_000
#: Most tokens in one statement.
MAX_TOKENS = 20_000
#: Deepest nesting of parentheses and CASE … END blocks.
MAX_NESTING_DEPTH = 32
#: Most boolean and arithmetic operators (AND, OR, NOT, + - * / % ||) chained in one
#: expression (counted along nested parentheses); each one is a level of the parse
#: tree, and chains of them nest left-deep.  Separate SELECT items count separately.
MAX_OPERATORS = 200

_OPERATORS = frozenset({
    TokenType.AND, TokenType.OR, TokenType.NOT, TokenType.XOR, TokenType.PLUS, TokenType.DASH,
    TokenType.STAR, TokenType.SLASH, TokenType.MOD, TokenType.DPIPE,
})
# After these a ``*`` is COUNT(*) or SELECT * / t.*, not a multiplication.
_BEFORE_STAR = frozenset({TokenType.L_PAREN, TokenType.SELECT, TokenType.COMMA, TokenType.DOT})
# Tokens that start a new expression at the same nesting level (a new SELECT item, clause or branch).
_NEW_EXPRESSION = frozenset({
    TokenType.COMMA, TokenType.SELECT, TokenType.FROM, TokenType.WHERE, TokenType.GROUP_BY, TokenType.HAVING,
    TokenType.ORDER_BY, TokenType.LIMIT, TokenType.WHEN, TokenType.THEN, TokenType.ELSE,
})

#: Values of the ``method`` option: ``exact`` (the default: guaranteed answers from
#: history or fresh measurements) or a free, biased, model-based estimate
#: (``dpgate.Gateway.estimate``).
MODEL_METHODS = ("pca", "maxent", "mmse")
METHOD_VALUES = ("exact", *MODEL_METHODS)
#: Keys accepted in a ``/*+ dpgate key=value … */`` hint comment.
HINT_KEYS = ("accuracy", "confidence", "method", "allow_partial")
#: Options accepted by ``SET dpgate.<option> = <value>``.
SET_OPTIONS = ("accuracy", "confidence", "intervals", "method", "allow_partial", "round")


@dataclass(frozen=True)
class SetOption:
    """A ``SET dpgate.<name> = <value>`` statement: a session option, not a query.

    ``value`` is a float for accuracy and confidence, a bool for intervals,
    allow_partial and round, and a string for method.
    """

    name: str
    value: str | float | bool


def dialect_of(dialect: str) -> Dialect:
    """sqlglot's dialect named ``dialect``; an unknown name is a ProgrammingError."""
    try:
        return Dialect.get_or_raise(dialect)
    except (ValueError, KeyError) as exc:
        raise ProgrammingError(f"unknown SQL dialect {dialect!r}: {exc}") from None


def tokenize(sql: str, dialect: Dialect) -> list[Token]:
    """sqlglot's tokens of ``sql``; a tokenizer failure is a QuerySyntaxError."""
    try:
        return list(dialect.tokenize(sql))
    except TokenError as exc:
        raise QuerySyntaxError(f"the SQL text cannot be tokenized: {exc}") from None


def check_length(sql: str) -> None:
    """Refuse SQL text longer than :data:`MAX_SQL_LENGTH`, before it is tokenized."""
    if len(sql) > MAX_SQL_LENGTH:
        raise QueryTooComplex(
            f"the SQL text has {len(sql)} characters, more than the limit of {MAX_SQL_LENGTH}; "
            "split it into smaller queries."
        )


def check_complexity(tokens: list[Token]) -> None:
    """Refuse statements beyond :data:`MAX_TOKENS`, :data:`MAX_NESTING_DEPTH` or :data:`MAX_OPERATORS`.

    A single flat pass over the tokens, so it cannot recurse however the text is nested.
    """
    if len(tokens) > MAX_TOKENS:
        raise QueryTooComplex(
            f"the SQL text has {len(tokens)} tokens, more than the limit of {MAX_TOKENS}; "
            "split it into smaller queries."
        )
    # levels[i]: operators chained so far at nesting level i of the current expression;
    # their sum is the depth of the parse-tree path being built, which is what recurses.
    levels = [0]
    deepest = operators = 0
    previous: TokenType | None = None
    for tok in tokens:
        kind = tok.token_type
        if kind in (TokenType.L_PAREN, TokenType.CASE):
            levels.append(0)
            deepest = max(deepest, len(levels) - 1)
        elif kind in (TokenType.R_PAREN, TokenType.END):
            if len(levels) > 1:
                levels.pop()
        elif kind in _NEW_EXPRESSION:
            levels[-1] = 0
        elif kind in _OPERATORS and not (kind == TokenType.STAR and previous in _BEFORE_STAR):
            levels[-1] += 1
            operators = max(operators, sum(levels))
        previous = kind
    if deepest > MAX_NESTING_DEPTH:
        raise QueryTooComplex(
            f"the SQL text nests parentheses and CASE blocks {deepest} deep, more than the limit of "
            f"{MAX_NESTING_DEPTH}; remove redundant parentheses or flatten nested CASEs."
        )
    if operators > MAX_OPERATORS:
        raise QueryTooComplex(
            f"the SQL text chains {operators} AND/OR/NOT and arithmetic operators, more than the limit of "
            f"{MAX_OPERATORS} for one expression; use IN (…) or BETWEEN for long lists of alternatives, "
            "or split the query."
        )


def check_statement(sql: str, dialect: Dialect) -> list[Token]:
    """The tokens of ``sql``, within :func:`check_length` and :func:`check_complexity`: before any parser."""
    check_length(sql)
    check_complexity(tokens := tokenize(sql, dialect))
    return tokens


#: First words of PostgreSQL's and DuckDB's statements (some tokenize as plain words): refused, not syntax errors.
_COMMANDS = frozenset(
    "ABORT ALTER ANALYZE ATTACH BEGIN CALL CHECKPOINT CLOSE CLUSTER COMMENT COMMIT COPY CREATE DEALLOCATE DECLARE "
    "DELETE DESCRIBE DETACH DISCARD DO DROP END EXECUTE EXPLAIN EXPORT FETCH FORCE GRANT IMPORT INSERT INSTALL "
    "LISTEN LOAD LOCK MERGE MOVE NOTIFY PIVOT PRAGMA PREPARE REASSIGN REFRESH REINDEX RELEASE RESET REVOKE ROLLBACK "
    "SAVEPOINT SECURITY SELECT SET SHOW START SUMMARIZE TABLE TRUNCATE UNLISTEN UNPIVOT UPDATE USE VACUUM VALUES "
    "WITH".split())


def split_check(tokens: list[Token]) -> None:
    """Refuse several statements, and statements that are not SELECT / SET, from the tokens alone."""
    statements: list[list[Token]] = [[]]
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            statements.append([])
        else:
            statements[-1].append(tok)
    statements = [s for s in statements if s]
    if not statements:
        raise UnsupportedQuery("the SQL text is empty (only comments or semicolons); send one SELECT statement.")
    if len(statements) > 1:
        starts = ", ".join(s[0].text.upper() for s in statements)
        raise UnsupportedQuery(
            f"the SQL text holds {len(statements)} statements ({starts}); dpgate runs exactly one SELECT per "
            "call — send them separately."
        )
    first = statements[0][0]
    word = first.text.upper()
    if first.token_type == TokenType.WITH:
        raise UnsupportedQuery(
            "common table expressions (WITH …) are not supported; write one SELECT over one declared table."
        )
    if first.token_type == TokenType.VALUES:
        raise UnsupportedQuery("VALUES lists are not supported; query a declared table with SELECT.")
    if first.token_type == TokenType.VAR and word not in _COMMANDS:  # no SQL statement: 42601, not a refusal
        guess = difflib.get_close_matches(word, ("SELECT", "SET", "EXPLAIN", "SHOW"), n=1)
        raise QuerySyntaxError(
            f"syntax error at or near {excerpt(first.text)}: it does not start an SQL statement"
            + (f" (did you mean {guess[0]}?)" if guess else "") + "; dpgate answers SELECT queries."
        )
    if first.token_type not in (TokenType.SELECT, TokenType.SET, TokenType.L_PAREN, TokenType.FROM):
        raise UnsupportedQuery(
            f"dpgate answers only SELECT queries (and SET dpgate.<option> = <value>); {word} statements are "
            "refused and nothing was executed."
        )


def parse(sql: str, dialect: Dialect) -> exp.Expr:
    """Parse exactly one statement; wrap sqlglot's ParseError with its line and column."""
    try:
        trees = [t for t in dialect.parse(sql) if t is not None]
    except ParseError as exc:
        errs = exc.errors or []
        if errs and "Mod'>" in str(errs[0].get("description")):
            # A % with nothing on its left: a placeholder style dpgate does not know (%d, %(x)d …).
            e = errs[0]
            raise QuerySyntaxError(
                f"SQL syntax error at line {e.get('line')}, column {e.get('col')}: a '%' that is neither a "
                f"remainder (a % b) nor a placeholder; {STYLES_TEXT}"
            ) from None
        if errs:
            e = errs[0]
            where = f"line {e.get('line')}, column {e.get('col')}"
            desc = e.get("description") or "syntax error"
            near = e.get("highlight")
            near_txt = f" near {near!r}" if near else ""
            raise QuerySyntaxError(
                f"SQL syntax error at {where}{near_txt}: {desc}. Check the statement's syntax."
            ) from exc
        raise QuerySyntaxError(f"SQL syntax error: {exc}") from exc
    except TokenError as exc:
        raise QuerySyntaxError(f"the SQL text cannot be tokenized: {exc}") from None
    if len(trees) != 1:
        raise UnsupportedQuery(f"expected one statement, found {len(trees)}; send exactly one SELECT.")
    return trees[0]


# -- hints ---------------------------------------------------------------------------------
# Unambiguous (``\s*,?\s*`` would try every split of a run of blanks: quadratic on a long one).
_HINT_PAIR = re.compile(r"""\s*(?:,\s*)?([A-Za-z_][A-Za-z_0-9]*)\s*=\s*("[^"]*"|'[^']*'|[^\s,]+)""")
_NOT_BLANK = re.compile(r"\S")


class Hints(Mapping[str, str]):
    """A statement's hints, read-only: a compiled statement is a frozen value that gateways
    cache and share (``Gateway.compile``), so no holder may change another's hints.
    Equal to the dict of the same items; pickles like one."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(items or {})

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __reduce__(self) -> tuple[type[Hints], tuple[dict[str, str]]]:
        return Hints, (self._items,)


def hints(tokens: list[Token], sql: str = "") -> dict[str, str]:
    """Collect ``/*+ dpgate key=value … */`` hints from the comments sqlglot's tokenizer kept.

    Comments are read from the tokens (never from the raw text), so a hint-like
    string inside a quoted literal is not a hint.  Comments that start with ``+``
    but not with ``dpgate`` (other systems' optimizer hints) are ignored.
    """
    out: dict[str, str] = {}
    for tok in tokens:
        for text in tok.comments or []:
            body = text.strip()
            if body.startswith("+"):
                body = body[1:].strip()
            elif body[:6].lower() != "dpgate" or not (tok.token_type == TokenType.HINT or f"/*+{text}*/" in sql):
                continue  # a plain comment (dialects that parse hints strip the "+"); cheap test first
            if not body.lower().startswith("dpgate") or (len(body) > 6 and not body[6].isspace()):
                continue
            rest = body[6:]
            pos = 0
            while _NOT_BLANK.search(rest, pos):
                m = _HINT_PAIR.match(rest, pos)
                if not m:
                    raise UnsupportedQuery(
                        f"malformed dpgate hint {excerpt(text.strip())}; write /*+ dpgate accuracy=25 confidence=0.95 */."
                    )
                key, value = m.group(1).lower(), m.group(2).strip("'\"")
                if key not in HINT_KEYS:
                    raise UnsupportedQuery(
                        f"unknown dpgate hint {key!r}; valid hints are {', '.join(HINT_KEYS)}."
                    )
                _check_option(key, value, "hint")
                if key in out and out[key] != value:
                    raise UnsupportedQuery(f"the dpgate hint {key!r} is given twice with different values.")
                out[key] = value
                pos = m.end()
    return out


def _check_option(key: str, value: Any, where: str) -> str | float | bool:
    """The value of option ``key`` (a hint or SET value) as dpgate uses it, or InvalidRequirement."""
    text = str(value).strip()
    label = where if where.startswith("SET ") else f"{where} {key}"  # "SET dpgate.confidence" names the option
    if key in ("accuracy", "confidence"):
        try:
            x = float(text)
        except ValueError:
            raise InvalidRequirement(f"{where} {key}={excerpt(text)} is not a number.") from None
        if key == "accuracy":
            return positive_finite(x, label, error=InvalidRequirement)
        return confidence_level(x, label, error=InvalidRequirement)  # refused now, not when a query runs
    if key in ("intervals", "allow_partial", "round"):
        if text.lower() in TRUE_WORDS:
            return True
        if text.lower() in FALSE_WORDS:
            return False
        raise InvalidRequirement(f"{label} must be on or off, got {excerpt(text)}.")
    if text.lower() not in METHOD_VALUES:
        raise InvalidRequirement(f"{label} must be one of {', '.join(METHOD_VALUES)}, got {excerpt(text)}.")
    return text.lower()


# -- SET -------------------------------------------------------------------------------------
def set_option(tree: exp.Set) -> SetOption:
    """``SET dpgate.<option> = <value>`` → SetOption; any other SET is refused."""
    items = tree.expressions
    ok = (
        not tree.args.get("unset")
        and len(items) == 1
        and isinstance(items[0], exp.SetItem)
        and isinstance(items[0].this, exp.EQ)
        and isinstance(items[0].this.this, exp.Column)
    )
    if ok:
        target: exp.Column = items[0].this.this
        ok = target.table.lower() == "dpgate" and not target.args.get("db")
    if not ok:
        raise UnsupportedQuery(
            f"only SET dpgate.<option> = <value> is accepted ({', '.join(SET_OPTIONS)}); {excerpt(tree.sql())} is refused."
        )
    name = target.name.lower()
    if name not in SET_OPTIONS:
        raise UnsupportedQuery(f"unknown option dpgate.{name[:80]}; valid options are {', '.join(SET_OPTIONS)}.")
    rhs = items[0].this.expression
    if isinstance(rhs, exp.Literal):
        raw: Any = rhs.this
    elif isinstance(rhs, exp.Boolean):
        raw = "on" if rhs.this else "off"
    elif isinstance(rhs, (exp.Var, exp.Column, exp.Identifier)):
        raw = rhs.name
    elif isinstance(rhs, exp.Neg) and isinstance(rhs.this, exp.Literal):
        raw = "-" + rhs.this.this
    else:
        raise UnsupportedQuery(f"SET dpgate.{name} needs a constant value, got {excerpt(rhs.sql())}.")
    return SetOption(name, _check_option(name, raw, f"SET dpgate.{name}"))


# -- parameters ----------------------------------------------------------------------------------
# The placeholder styles accepted (PEP 249's qmark, numeric, named, format and pyformat), as
# every refusal of another style names them.
STYLES_TEXT = (
    "placeholders may be ? or $1 (with a sequence of values), :name (with a mapping), or psycopg's %s "
    "(a sequence) and %(name)s (a mapping); write a literal % as a % b (a remainder) or inside quotes."
)


def bind(tree: exp.Expr, params: Sequence[Any] | Mapping[str, Any] | None) -> exp.Expr:
    """Replace placeholders (``?``, ``$1``, ``:name``; ``%s`` and ``%(name)s`` arrive here rewritten
    by :func:`placeholders`) by sqlglot literal nodes (PEP 249 binding).

    Values become ``exp.Literal.number`` / ``exp.Literal.string`` / ``exp.null()`` /
    ``exp.Boolean`` nodes — never SQL text.  A count or name mismatch raises
    ``ProgrammingError``.
    """
    holders = [n for n in tree.dfs() if isinstance(n, exp.Placeholder)]
    if not holders:
        if params:
            raise ProgrammingError(f"the statement has no parameter placeholders but {len(params)} parameters were given.")
        return tree
    if params is None:
        raise ProgrammingError(
            f"the statement has {len(holders)} parameter placeholder(s) but no parameters were given."
        )
    tree = tree.copy()
    holders = [n for n in tree.dfs() if isinstance(n, exp.Placeholder)]
    names = [h.this for h in holders]
    if all(n is None for n in names):
        style = "qmark"
    elif all(n is not None and str(n).isdigit() for n in names):
        style = "numeric"
    elif all(n is not None and not str(n).isdigit() for n in names):
        style = "named"
    else:
        raise ProgrammingError(
            "the statement mixes positional and named parameters; use one kind: ?, $1 or %s with a sequence, "
            ":name or %(name)s with a mapping."
        )
    if style == "named":
        if not isinstance(params, Mapping):
            raise InvalidArgumentType("named parameters (:name, %(name)s) need a mapping of name to value.")
        lookup = {str(k).lower(): v for k, v in params.items()}
        want = {str(n).lower() for n in names}
        missing, extra = sorted(want - set(lookup)), sorted(set(lookup) - want)
        if missing or extra:
            raise ProgrammingError(f"parameter names do not match: missing {missing}, unexpected {extra}.")
        values = [lookup[str(n).lower()] for n in names]
    else:
        if isinstance(params, Mapping) or isinstance(params, (str, bytes)):
            raise InvalidArgumentType(f"{style} parameters need a sequence of values, got {type(params).__name__}.")
        seq = list(params)
        if style == "qmark":
            if len(seq) != len(holders):
                raise ProgrammingError(
                    f"the statement has {len(holders)} ? placeholder(s) but {len(seq)} parameters were given."
                )
            values = seq
        else:
            idx = [int(n) for n in names]
            if set(idx) != set(range(1, len(seq) + 1)):
                raise ProgrammingError(
                    f"the statement uses parameters ${', $'.join(map(str, sorted(set(idx))))} "
                    f"but {len(seq)} parameters were given."
                )
            values = [seq[i - 1] for i in idx]
    for node, value in zip(holders, values, strict=True):
        _bind_one(node, value)
    return tree


def _bind_one(node: exp.Expr, value: Any) -> None:
    """Replace one placeholder by the literal of ``value``.  A placeholder cast to the type of its value
    (``%(x)s::VARCHAR`` with a string, ``$1::int8`` with an integer: how SQLAlchemy and JDBC type
    their parameters) becomes that typed literal, the cast dropped; a text cast to a number, the number."""
    cast = node.parent.parent if isinstance(node.parent, exp.Paren) else node.parent  # (?)::BIGINT
    if not isinstance(cast, exp.Cast):
        node.replace(literal(value))
        return
    to, integers, reals = cast.to, exp.DataType.INTEGER_TYPES, exp.DataType.REAL_TYPES
    if isinstance(value, str) and to.is_type(*integers, *reals):
        text = value.strip()
        check_number_text(text, "the parameter")  # before int() or float() reads it
        try:
            value = int(text) if to.is_type(*integers) else float(text)
        except ValueError:
            raise DataError(f"the parameter {excerpt(value)} is cast to {to.sql()} but is not a number of that "
                            "type; pass a number.") from None
    number = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    same = (isinstance(value, str) and to.is_type(*exp.DataType.TEXT_TYPES)) \
        or (isinstance(value, (bool, np.bool_)) and to.is_type(exp.DataType.Type.BOOLEAN)) \
        or (number and isinstance(value, numbers.Integral) and to.is_type(*integers)) \
        or (number and to.is_type(*reals))
    (cast if same else node).replace(literal(value))


def literal(value: Any) -> exp.Expr:
    """A sqlglot literal node for a Python parameter value."""
    if value is None:
        return exp.null()
    if isinstance(value, (bool, np.bool_)):
        return exp.Boolean(this=bool(value))
    check_parameter(value)  # sizes and ranges, before anything writes the value out
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, (Decimal, Fraction)):
        value = Decimal(value.numerator) / Decimal(value.denominator) if isinstance(value, Fraction) else value
        if not value.is_finite():
            raise ProgrammingError(f"parameter {value!r} is not a finite number.")
        return exp.Literal.number(format(value, "f"))
    if isinstance(value, numbers.Integral):
        return exp.Literal.number(int(value))
    if isinstance(value, numbers.Real):
        f = finite(value, f"the parameter {value!r}", error=ProgrammingError)
        return exp.Literal.number(repr(f))
    return date_parameter(value)  # a date or datetime, or refused naming the types accepted
