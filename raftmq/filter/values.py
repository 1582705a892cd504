"""The value rules RocketMQ's filter inherits from Java, as plain functions.

A filter compares message properties (always strings) with literals (Java `Integer`,
`Long`, `Double`, `String`, `Boolean`) and with each other. What a comparison means
depends on the two Java classes involved, and a string is converted with Java's own
parsers (`Integer.valueOf`, `Long.valueOf`, `Double.valueOf`, `Boolean.valueOf`), whose
accepted forms differ from Python's `int()`/`float()`: these functions are those parsers.
A string Java refuses raises `JavaError`, which makes the whole evaluation fail (and the
message not match), exactly as the exception does in the broker.
"""

from __future__ import annotations

import enum
import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any

__all__ = [
    "JavaError", "JType", "NUMERIC", "compare_fn", "double_compare", "java_bool",
    "java_double", "java_int", "java_long", "ordering_fn",
]


class JavaError(Exception):
    """A Java exception during evaluation (a number that does not parse, a cast that
    fails): the broker logs it and the message does not match."""


class JType(enum.Enum):
    """The Java class of a filter value; every node of a compiled filter has exactly one
    (or NULL: it always evaluates to null)."""

    STR = "String"
    INT = "Integer"
    LONG = "Long"
    DOUBLE = "Double"
    BOOL = "Boolean"
    NULL = "null"


NUMERIC = frozenset({JType.INT, JType.LONG, JType.DOUBLE})

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# Integer.parseInt: an optional sign and decimal digits, any script's (Character.digit)
_INTEGER = re.compile(r"[+-]?\d+")
# Double.valueOf after trimming: NaN, Infinity, decimal or hexadecimal (with a binary
# exponent) forms, ASCII digits only, an optional f/F/d/D suffix on the numeric forms
_DOUBLE = re.compile(
    r"[+-]?(?:(NaN|Infinity)"
    r"|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)"
)
_JAVA_TRIM = "".join(map(chr, range(0x21)))  # String.trim() drops every char <= ' '
# the plain decimal forms, on which Python's float() and Java agree exactly
_PLAIN_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _parse_integer(text: str, low: int, high: int) -> int:
    if _INTEGER.fullmatch(text) is None:
        raise JavaError(f"not an integer: {text!r}")
    if len(text) <= 20:
        value = int(text)
    else:  # leading zeros are allowed; skip them before int() (which caps digit counts)
        sign = -1 if text[0] == "-" else 1
        digits = text.lstrip("+-")
        i = 0
        while i < len(digits) - 1 and unicodedata.decimal(digits[i]) == 0:
            i += 1
        if len(digits) - i > 20:
            raise JavaError(f"out of range: {text!r}")
        value = sign * int(digits[i:])
    if not low <= value <= high:
        raise JavaError(f"out of range: {text!r}")
    return value


def java_int(text: str) -> int:
    """`Integer.valueOf(text)`: no spaces, no fraction, 32-bit range."""
    if len(text) < 10 and text.isdecimal():  # the common case, short of any bound
        return int(text)
    return _parse_integer(text, INT_MIN, INT_MAX)


def java_long(text: str) -> int:
    """`Long.valueOf(text)`: no spaces, no fraction, 64-bit range."""
    if len(text) < 19 and text.isdecimal():
        return int(text)
    return _parse_integer(text, LONG_MIN, LONG_MAX)


def java_double(text: str) -> float:
    """`Double.valueOf(text)`: surrounding control characters and spaces are ignored;
    "NaN", "Infinity" and hexadecimal forms are numbers, Python's "inf" or "1_0" are not."""
    if _PLAIN_DOUBLE.fullmatch(text) is not None:
        return float(text)
    trimmed = text.strip(_JAVA_TRIM)
    m = _DOUBLE.fullmatch(trimmed)
    if m is None:
        raise JavaError(f"not a number: {text!r}")
    special, decimal, hexadecimal = m.groups()
    if special is not None:
        value = math.nan if special == "NaN" else math.inf
    elif decimal is not None:
        value = float(decimal)
    else:
        try:
            value = float.fromhex(hexadecimal)
        except OverflowError:
            value = math.inf
    return -value if trimmed[0] == "-" else value


def java_bool(text: str) -> bool:
    """`Boolean.valueOf(text)`: "true" in any case is true, everything else false."""
    return len(text) == 4 and text.isascii() and text.lower() == "true"


def double_compare(a: float, b: float) -> int:
    """`Double.compare`: a total order where -0.0 < 0.0 and NaN is above everything
    (and equal to itself), unlike Python's `<`."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:  # 0.0 against -0.0
            return (math.copysign(1.0, a) > 0) - (math.copysign(1.0, b) > 0)
        return 0
    return (a != a) - (b != b)  # NaN involved


def _int_compare(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _cast_fails(a: Any, b: Any) -> int:
    # RocketMQ converts a Boolean on the left of a String by casting it to String
    raise JavaError("java.lang.ClassCastException: Boolean cannot be cast to String")


def _less(a: Any, b: Any) -> int:
    return -1  # classes RocketMQ cannot relate compare as "less", never equal


def _str_vs_int(a: str, b: int) -> int:
    x = java_int(a)
    return (x > b) - (x < b)


def _int_vs_str(a: int, b: str) -> int:
    y = java_int(b)
    return (a > y) - (a < y)


def _str_vs_long(a: str, b: int) -> int:
    x = java_long(a)
    return (x > b) - (x < b)


def _long_vs_str(a: int, b: str) -> int:
    y = java_long(b)
    return (a > y) - (a < y)


def _str_vs_double(a: str, b: float) -> int:
    return double_compare(java_double(a), b)


def _double_vs_str(a: float, b: str) -> int:
    return double_compare(a, java_double(b))


def _str_vs_bool(a: str, b: bool) -> int:
    x = java_bool(a)
    return (x > b) - (x < b)


def _int_vs_double(a: int, b: float) -> int:
    return double_compare(float(a), b)


def _double_vs_int(a: float, b: int) -> int:
    return double_compare(a, float(b))


_MIXED: dict[tuple[JType, JType], Callable[[Any, Any], int]] = {
    (JType.STR, JType.INT): _str_vs_int, (JType.INT, JType.STR): _int_vs_str,
    (JType.STR, JType.LONG): _str_vs_long, (JType.LONG, JType.STR): _long_vs_str,
    (JType.STR, JType.DOUBLE): _str_vs_double, (JType.DOUBLE, JType.STR): _double_vs_str,
    (JType.STR, JType.BOOL): _str_vs_bool, (JType.BOOL, JType.STR): _cast_fails,
    (JType.INT, JType.LONG): _int_compare, (JType.LONG, JType.INT): _int_compare,
    (JType.INT, JType.DOUBLE): _int_vs_double, (JType.DOUBLE, JType.INT): _double_vs_int,
    (JType.LONG, JType.DOUBLE): _int_vs_double, (JType.DOUBLE, JType.LONG): _double_vs_int,
}


def compare_fn(left: JType, right: JType) -> Callable[[Any, Any], int]:
    """RocketMQ's `compareTo` between two non-null values of the given classes, after
    its conversions: Integer widens to Long, both to Double (as Java's `(double)`), and
    a String is parsed as the class of the other side. Used for `=` (with
    `answer == 0`) and, except between two strings, for `<`, `>`, `<=`, `>=`."""
    if left is right:
        if left is JType.DOUBLE:
            return double_compare
        return _int_compare  # same order for int, str (only == 0 is ever asked), bool
    # a Boolean against a number, or null (never asked: nulls stop earlier)
    return _MIXED.get((left, right), _less)


def _both_doubles(a: str, b: str) -> int:
    return double_compare(java_double(a), java_double(b))


def ordering_fn(left: JType, right: JType) -> Callable[[Any, Any], int]:
    """The comparison behind `<`, `>`, `<=`, `>=` (and BETWEEN): two strings are both
    parsed as doubles (either failing fails the evaluation); otherwise `compare_fn`."""
    if left is JType.STR and right is JType.STR:
        return _both_doubles
    return compare_fn(left, right)
