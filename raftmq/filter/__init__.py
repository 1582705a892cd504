"""RocketMQ's SQL92 message filters: `compile(expression)` gives a predicate over a
message's properties (a mapping of strings to strings), true when the message matches.

The filter is the one RocketMQ consumers subscribe with (`MessageSelector.bySql`), and
it must decide every message as a RocketMQ broker would, so its rules are RocketMQ's,
quirks included, rather than SQL's or Python's:

Syntax (`syntax.py`)
  * Keywords in any case: AND OR NOT BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH
    ENDSWITH. Properties are ASCII identifiers (`[A-Za-z_$][A-Za-z0-9_$]*`); a name that
    spells a keyword is the keyword (no quoting exists). NOW is an ordinary property.
  * Literals: integers `0` or without leading zeros, optional `L` (an Integer when it fits
    32 bits, else a Long; beyond 64 bits refused); floats `1.5`, `1.`, `.5`, `1E3`,
    `1.5e-3` (Doubles; beyond the largest double or rounding to 0.0 refused, so `0.0`
    is invalid: write `0`); no hex, octal or negative literals (`-5` is unary minus);
    strings in single quotes, `''` for a quote, no other escapes; TRUE, FALSE, NULL.
  * Precedence, tightest first: unary NOT, `-`, `+`; then `> >= < <=`, BETWEEN, IN,
    CONTAINS, STARTSWITH, ENDSWITH and their NOT forms; then `= <>` and IS [NOT] NULL;
    then AND; then OR. So `NOT a = 1` is `(NOT a) = 1`: write `NOT (a = 1)`.
  * Whitespace is space, tab, CR, LF and form feed; `/* */` comments, and `--` comments
    that a line break ends (without one, `--` is two minus signs).
  * What follows a complete expression is ignored, as RocketMQ's parser stops there:
    `a = 1 )` is `a = 1` (`compile(..., strict=True)` refuses it instead).
  * Refused at compile time, as RocketMQ refuses them: `>`, `<`, `>=`, `<=` and
    BETWEEN with a literal that is not a number or with a condition; `=`/`<>` with a
    NULL literal (use IS NULL) or with TRUE/FALSE left of another kind of literal;
    literal BETWEEN bounds in the wrong order or NULL; IN without a property on its
    left, or with anything but string literals in its list; CONTAINS & co. without a
    string literal; NOT, AND, OR or the whole filter over something that is not a
    condition or a property (`NOT 1`, `a AND 5`, `'x'`). These checks look at the
    literal as written: `-5`, `NOT NOT TRUE` are no longer literals and pass them.
  * Binary operators nested more than `MAX_DEPTH` (200) deep are refused (RocketMQ's
    recursive parser overflows its stack some hundreds of levels down); chains of NOT,
    minus, AND, OR and parentheses around one operand have no limit.

Values and comparisons (`values.py`, `compiler.py`)
  * Properties are strings, never converted on their own: a bare property used as a
    condition (`a`, `a AND b`, `NOT a`) is FALSE when present, whatever its value, and
    unknown when missing.
  * A missing property is null. `>`, `<`, `>=`, `<=`, IN and NOT IN are unknown on null;
    `x = y` is unknown when x is null and y is not, FALSE when only y is null, TRUE when
    both are (so `'v' = a` and `'v' <> a` differ from `a = 'v'` and `a <> 'v'`);
    CONTAINS, STARTSWITH, ENDSWITH and their NOT forms are FALSE on null (so
    `a NOT CONTAINS 'x'` never matches a message without `a`), and FALSE too for an
    empty search string. IS NULL / IS NOT NULL are never unknown.
  * A string meets a number by being parsed as that number's Java class: against an
    Integer literal with Java's `Integer.valueOf` (no spaces, no fraction, 32 bits:
    `a = 5` fails for "5.0", "x" or "3000000000"), against a Long with `Long.valueOf`,
    against a Double with `Double.valueOf` (which trims control characters and spaces
    and reads "NaN", "Infinity", "0x1p3", "1d"). Against TRUE/FALSE a property is true
    when it reads "true" in any case; TRUE/FALSE on the left of a property fails.
  * Two properties: `=` and `<>` compare the strings as they are ("1" <> "1.0"); `>`,
    `<`, `>=`, `<=`, BETWEEN parse both as doubles.
  * Numbers compare as Java does: Integer and Long exactly, either against a Double
    after conversion to double; doubles by `Double.compare`, so NaN is above every
    number and equal to itself, and -0.0 is below 0.0.
  * A string that does not parse (or a Boolean cast to a string) is an exception in
    RocketMQ: the evaluation stops at once, even inside an OR whose other side would be
    true, and the message does not match.
  * AND, OR, NOT follow SQL's three values: FALSE AND unknown is FALSE, TRUE OR unknown
    is TRUE, NOT unknown is unknown; both evaluate left to right and stop early.

Decision: a message matches only when the filter is TRUE; FALSE, unknown and a failure
all skip it.

Tag subscriptions (`"*"`, `"TagA || TagB"`) are not SQL: the client parses them with
`raftmq.client.reads.parse_tags`, and the broker matches tag hashes
(`wire.records.tag_hash`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from .compiler import MAX_DEPTH, build
from .syntax import FilterError, parse
from .values import JavaError

__all__ = ["MAX_DEPTH", "FilterError", "Predicate", "compile"]

Predicate = Callable[[Mapping[str, str]], bool]


def compile(expression: str, *, strict: bool = False) -> Predicate:  # noqa: A001
    """The predicate of a SQL92 filter, compiled once per distinct expression (cached):
    `FilterError`, with the position, for an expression RocketMQ refuses. `strict`
    also refuses anything after the expression, which RocketMQ ignores."""
    if not isinstance(expression, str):
        raise FilterError(f"a filter is a string, not {type(expression).__name__}", 0, 1, 1)
    return _compiled(expression, strict)


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str, strict: bool) -> Predicate:
    evaluate = build(parse(expression, strict=strict), expression)

    def matches(properties: Mapping[str, str]) -> bool:
        try:
            return evaluate(properties) is True
        except JavaError:  # RocketMQ logs the exception and skips the message
            return False

    matches.__doc__ = f"Whether a message's properties match {expression!r}."
    return matches
