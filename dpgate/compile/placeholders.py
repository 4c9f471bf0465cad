"""Client placeholder styles rewritten on tokens, before the statement is parsed.

psycopg's ``%s`` / ``%(name)s`` become ``?`` / ``:name``; ``?::BIGINT`` and ``%s::BIGINT`` (as
SQLAlchemy writes a typed parameter) become a placeholder and a cast, not sqlglot's ``?::``
try-cast operator; ``@name`` is refused.  :func:`dpgate.compile.statement.bind` then binds the
values as literal nodes.
"""

from __future__ import annotations

from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import Token, TokenType

from dpgate.compile.statement import STYLES_TEXT, tokenize
from dpgate.errors import QuerySyntaxError

__all__ = ["placeholders"]

#: Tokens that end a value: after one, ``?::`` is an operator, not a placeholder and a cast.
_VALUE_ENDS = frozenset({TokenType.VAR, TokenType.NUMBER, TokenType.STRING, TokenType.IDENTIFIER, TokenType.R_PAREN,
                         TokenType.R_BRACKET, TokenType.NULL, TokenType.TRUE, TokenType.FALSE, TokenType.STAR})


def placeholders(sql: str, tokens: list[Token], dialect: Dialect) -> tuple[str, list[Token]]:
    """Rewrite psycopg's ``%s`` / ``%(name)s`` placeholders to ``?`` / ``:name``; refuse ``@name``.

    Works on tokens (so a ``%s`` inside a string literal or comment is untouched): a
    ``%`` immediately followed by ``s``, or by ``(name)s``, is a placeholder, as in
    psycopg (a remainder by a column named ``s`` is written ``a % s``).  Returns the
    text sqlglot parses and its tokens (re-tokenized when anything changed).
    """
    edits: list[tuple[int, int, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        glued = _glued(tokens, i)  # tok and the tokens written right after it, without a space
        kinds = [t.token_type for t in glued[1:5]]
        if tok.token_type == TokenType.MOD and kinds[:1] == [TokenType.VAR] and glued[1].text == "s":
            # ``%s::BIGINT`` (SQLAlchemy): ``?::`` would read as sqlglot's try-cast operator
            edits.append((tok.start, glued[1].end, "? " if kinds[1:2] == [TokenType.DCOLON] else "?"))
            i += 2
            continue
        if tok.token_type == TokenType.QDCOLON and (i == 0 or tokens[i - 1].token_type not in _VALUE_ENDS):
            edits.append((tok.start, tok.end, "? ::"))  # ``?::BIGINT``: a placeholder cast, not a try-cast
            i += 1
            continue
        named = len(kinds) >= 3 and kinds[0] == TokenType.L_PAREN and kinds[2] == TokenType.R_PAREN
        if tok.token_type == TokenType.MOD and named and glued[2].text.isidentifier():  # %(limit)s: any word
            if kinds[3:] == [TokenType.VAR] and glued[4].text == "s":
                edits.append((tok.start, glued[4].end, f":{glued[2].text}"))
                i += 5
                continue
            bad = "".join(t.text for t in glued[:5])
            raise QuerySyntaxError(f"the placeholder {bad} is not supported; {STYLES_TEXT}")
        if tok.token_type == TokenType.PARAMETER and tok.text == "@" and kinds[:1] == [TokenType.VAR]:
            raise QuerySyntaxError(f"the placeholder @{glued[1].text} is not supported; {STYLES_TEXT}")
        i += 1
    if not edits:
        return sql, tokens
    out, pos = [], 0
    for start, end, text in edits:
        out += [sql[pos:start], text]
        pos = end + 1
    out.append(sql[pos:])
    text = "".join(out)
    return text, tokenize(text, dialect)


def _glued(tokens: list[Token], i: int) -> list[Token]:
    """``tokens[i]`` and the (at most four) tokens that follow it with no character in between."""
    out = [tokens[i]]
    for tok in tokens[i + 1 : i + 5]:
        if tok.start != out[-1].end + 1:
            break
        out.append(tok)
    return out
