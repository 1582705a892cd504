"""The grammar of RocketMQ's SQL92 filters, parsed with lark's LALR parser.

The grammar has the shape of RocketMQ's own (a JavaCC grammar): NOT, unary minus and
unary plus bind tightest, then the comparisons (`>`, `<`, BETWEEN, IN, CONTAINS, ...),
then `=`, `<>` and IS [NOT] NULL, then AND, then OR; every binary level is
left-associative and may repeat. The tokens are RocketMQ's too: keywords in any case,
ASCII identifiers, integers (`0` or no leading zero, an optional `L`), floats
(`1.`, `.5`, `5E10`), strings in single quotes with `''` for a quote, `--` comments
ended by a line break and `/* */` comments.

RocketMQ's parser stops at the first token that cannot continue a complete expression
and ignores the rest: `a = 1 )` is the filter `a = 1`. `parse` does the same unless
`strict` (then anything after the expression is refused).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

__all__ = ["KEYWORDS", "FilterError", "parse", "position"]

KEYWORDS = frozenset({
    "NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
    "STARTSWITH", "ENDSWITH",
})

GRAMMAR = r"""
start: or_expr

?or_expr: and_expr (OR and_expr)*
?and_expr: eq_expr (AND eq_expr)*

?eq_expr: cmp_expr
    | eq_expr EQ cmp_expr               -> eq
    | eq_expr NE cmp_expr               -> ne
    | eq_expr IS NULL                   -> is_null
    | eq_expr IS NOT NULL               -> is_not_null

?cmp_expr: unary
    | cmp_expr GT unary                 -> gt
    | cmp_expr GE unary                 -> ge
    | cmp_expr LT unary                 -> lt
    | cmp_expr LE unary                 -> le
    | cmp_expr CONTAINS STRING          -> contains
    | cmp_expr NOT CONTAINS STRING      -> not_contains
    | cmp_expr STARTSWITH STRING        -> startswith
    | cmp_expr NOT STARTSWITH STRING    -> not_startswith
    | cmp_expr ENDSWITH STRING          -> endswith
    | cmp_expr NOT ENDSWITH STRING      -> not_endswith
    | cmp_expr BETWEEN unary AND unary  -> between
    | cmp_expr NOT BETWEEN unary AND unary -> not_between
    | cmp_expr IN LPAR strings RPAR     -> in_list
    | cmp_expr NOT IN LPAR strings RPAR -> not_in_list

strings: STRING (COMMA STRING)*

?unary: PLUS unary                      -> plus
    | MINUS unary                       -> negate
    | NOT unary                         -> not_
    | primary

?primary: STRING                        -> string
    | DECIMAL                           -> decimal
    | FLOAT                             -> float
    | TRUE                              -> true
    | FALSE                             -> false
    | NULL                              -> null
    | NAME                              -> property
    | LPAR or_expr RPAR                 -> group

%declare NOT AND OR BETWEEN IN TRUE FALSE NULL IS CONTAINS STARTSWITH ENDSWITH

NAME: /[A-Za-z_$][A-Za-z0-9_$]*/
FLOAT.3: /[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
DECIMAL.2: /0|[1-9][0-9]*[lL]?/
STRING: /'[^']*(?:''[^']*)*'/
EQ: "="
NE: "<>"
GE: ">="
GT: ">"
LE: "<="
LT: "<"
LPAR: "("
RPAR: ")"
COMMA: ","
PLUS: "+"
MINUS: "-"
WS: /[ \t\n\r\f]+/
LINE_COMMENT.4: /--[^\n\r]*(?:\r\n|\n|\r)/
BLOCK_COMMENT.4: /\/\*[^*]*\*+(?:[^\/*][^*]*\*+)*\//
%ignore WS
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""

_SHOWN = {
    "NAME": "a property name", "FLOAT": "a number", "DECIMAL": "a number",
    "STRING": "a string in single quotes", "EQ": "'='", "NE": "'<>'", "GE": "'>='",
    "GT": "'>'", "LE": "'<='", "LT": "'<'", "LPAR": "'('", "RPAR": "')'", "COMMA": "','",
    "PLUS": "'+'", "MINUS": "'-'", "$END": "the end of the expression",
}


class FilterError(ValueError):
    """An expression RocketMQ would refuse, with where: `offset` (0-based, in
    characters), `line` and `column` (1-based), and the bare `reason`."""

    def __init__(self, reason: str, offset: int, line: int, column: int) -> None:
        super().__init__(f"{reason} (line {line}, column {column})")
        self.reason = reason
        self.offset = offset
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class Position:
    """Where a token or node starts."""

    offset: int
    line: int
    column: int


def position(text: str, offset: int) -> Position:
    """The line and column of `offset` in `text` (lines end at \\n, \\r or \\r\\n)."""
    before = text[:offset].replace("\r\n", "\n").replace("\r", "\n")
    line = before.count("\n") + 1
    return Position(offset, line, len(before) - before.rfind("\n"))


def token_position(tok: Token) -> Position:
    return Position(tok.start_pos or 0, tok.line or 1, tok.column or 1)


def _keyword(tok: Token) -> Token:
    """Identifiers that spell a keyword (in any case) are the keyword, as in RocketMQ
    where the longest match wins and a keyword beats an identifier of the same length."""
    upper = tok.value.upper()
    if upper in KEYWORDS:
        tok.type = upper
    return tok


@functools.cache
def _lark() -> Lark:
    return Lark(GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True,
                lexer_callbacks={"NAME": _keyword})


def _describe(tok: Token) -> str:
    if tok.type == "$END":
        return "end of the expression"
    if tok.type in KEYWORDS:
        return f"keyword {tok.value.upper()}"
    kind = {"NAME": "property name ", "FLOAT": "number ", "DECIMAL": "number ",
            "STRING": "string "}.get(tok.type, "")
    return f"{kind}{tok.value!r}" if kind != "string " else f"string {tok.value}"


def _expected(names: set[str]) -> str:
    shown = sorted({name if name in KEYWORDS else _SHOWN.get(name, name) for name in names})
    return ", ".join(shown)


def _complete(lark: Lark, tokens: list[Token]) -> Tree | None:
    """The tree of `tokens` if they are a whole expression, else None."""
    ip = lark.parse_interactive()
    try:
        for tok in tokens:
            ip.feed_token(tok)
        tree = ip.feed_eof(tokens[-1])
    except UnexpectedToken:
        return None
    assert isinstance(tree, Tree)
    return tree


def parse(text: str, *, strict: bool = False) -> Tree:
    """The parse tree of `text`; `FilterError` where RocketMQ's parser refuses it."""
    lark = _lark()
    ip = lark.parse_interactive()
    fed: list[Token] = []
    stream = lark.lex(text)
    while True:
        try:
            tok = next(stream)
        except StopIteration:
            break
        except UnexpectedCharacters as e:
            offset = e.pos_in_stream or 0
            raise FilterError(_lexical_reason(text, offset),
                              *_where(position(text, offset))) from None
        try:
            ip.feed_token(tok)
        except UnexpectedToken as e:
            if not strict and fed:
                tree = _complete(lark, fed)
                if tree is not None:
                    return tree  # what follows a whole expression is ignored
            reason = f"unexpected {_describe(tok)}"
            if fed and _complete(lark, fed) is not None:
                reason += " after a complete expression"
            else:
                reason += f", expected {_expected(e.expected)}"
            raise FilterError(reason, *_where(token_position(tok))) from None
        fed.append(tok)
    if not fed:
        where = position(text, len(text))
        raise FilterError("empty expression", *_where(where))
    try:
        tree = ip.feed_eof(fed[-1])
    except UnexpectedToken as e:
        where = position(text, len(text))
        raise FilterError(f"the expression ends early, expected {_expected(e.expected)}",
                          *_where(where)) from None
    assert isinstance(tree, Tree)
    return tree


def _where(p: Position) -> tuple[int, int, int]:
    return p.offset, p.line, p.column


def _lexical_reason(text: str, offset: int) -> str:
    char = text[offset]
    if char == "'":
        return "unterminated string: a string ends with a single quote"
    if text.startswith("/*", offset):
        return "unterminated comment: '/*' needs its '*/'"
    if char == "/":
        return "unexpected character '/'"
    return f"unexpected character {char!r} (U+{ord(char):04X})"
