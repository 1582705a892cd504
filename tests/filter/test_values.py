"""Java's parsers and comparisons as the filter uses them: which strings are numbers
for `Integer.valueOf`, `Long.valueOf`, `Double.valueOf` and `Boolean.valueOf`, and how
`Double.compare` orders what Python's `<` cannot."""

from __future__ import annotations

import math

import pytest

from raftmq.filter.values import (
    JavaError,
    JType,
    compare_fn,
    double_compare,
    java_bool,
    java_double,
    java_int,
    java_long,
    ordering_fn,
)


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("-0", 0), ("+7", 7), ("-7", -7), ("007", 7), ("2147483647", 2**31 - 1),
    ("-2147483648", -(2**31)), ("\u0667", 7), ("\uff17", 7), ("\u0661\u0660", 10),
    ("0" * 40 + "5", 5), ("-" + "0" * 40 + "5", -5),
])
def test_integer_valueof_reads(text: str, value: int) -> None:
    assert java_int(text) == value


@pytest.mark.parametrize("text", [
    "", "+", "-", "2147483648", "-2147483649", " 1", "1 ", "1.0", "1e3", "0x10", "1_0",
    "1L", "++1", "+-1", "\u00b2", "1" * 30, "\u0665" * 5000,
])
def test_integer_valueof_refuses(text: str) -> None:
    with pytest.raises(JavaError):
        java_int(text)


def test_long_valueof_has_64_bits() -> None:
    assert java_long("9223372036854775807") == 2**63 - 1
    assert java_long("-9223372036854775808") == -(2**63)
    assert java_long("3000000000") == 3_000_000_000
    for text in ("9223372036854775808", "-9223372036854775809", "1" * 5000, "5L"):
        with pytest.raises(JavaError):
            java_long(text)


@pytest.mark.parametrize(("text", "value"), [
    ("1", 1.0), ("1.5", 1.5), ("-1.5", -1.5), ("+1.5", 1.5), ("1.", 1.0), (".5", 0.5),
    ("1e3", 1000.0), ("1E-3", 0.001), ("1e+3", 1000.0), ("1.5d", 1.5), ("1.5F", 1.5),
    ("1D", 1.0), (" 1.5 ", 1.5), ("\t1.5\n", 1.5), ("\x001.5\x1f", 1.5),
    ("0x10p0", 16.0), ("0x1p3", 8.0), ("0X1.8P1", 3.0), ("-0x.8p1", -1.0), ("0x1p3f", 8.0),
    ("Infinity", math.inf), ("-Infinity", -math.inf), ("+Infinity", math.inf),
    ("1e400", math.inf), ("-1e400", -math.inf), ("0x1p99999", math.inf), ("1e-400", 0.0),
    ("007.5", 7.5),
])
def test_double_valueof_reads(text: str, value: float) -> None:
    assert java_double(text) == value


def test_double_valueof_reads_nan_and_signed_zero() -> None:
    assert math.isnan(java_double("NaN"))
    assert math.isnan(java_double("-NaN"))
    assert math.copysign(1.0, java_double("-0")) < 0
    assert math.copysign(1.0, java_double("-0.0")) < 0
    assert math.copysign(1.0, java_double("0")) > 0


@pytest.mark.parametrize("text", [
    "", " ", ".", "e3", "1e", "1e+", "inf", "Inf", "infinity", "nan", "NAN", "1_0", "1,5",
    "\u0661", "\uff11", "\u00a01", "1\u00a0", "0x10", "0x", "0x1.8", "NaNd", "Infinityf",
    "1.5dd", "--1", "+-1", "1.5.5", "0b1", "1 2",
])
def test_double_valueof_refuses(text: str) -> None:
    with pytest.raises(JavaError):
        java_double(text)


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("TRUE", True), ("True", True), ("tRUE", True), ("false", False),
    ("", False), ("yes", False), ("1", False), (" true", False), ("true ", False),
    ("t\u0072ue", True), ("\u0130rue", False), ("tru\u212a", False),
])
def test_boolean_valueof(text: str, value: bool) -> None:
    assert java_bool(text) is value


@pytest.mark.parametrize(("a", "b", "answer"), [
    (1.0, 2.0, -1), (2.0, 1.0, 1), (1.0, 1.0, 0), (-0.0, 0.0, -1), (0.0, -0.0, 1),
    (-0.0, -0.0, 0), (math.nan, math.nan, 0), (math.nan, math.inf, 1),
    (math.inf, math.nan, -1), (math.nan, -1.0, 1), (-math.inf, math.inf, -1),
])
def test_double_compare_is_javas_total_order(a: float, b: float, answer: int) -> None:
    assert double_compare(a, b) == answer


def test_comparisons_convert_as_rocketmq_does() -> None:
    assert compare_fn(JType.STR, JType.INT)("5", 5) == 0
    assert compare_fn(JType.INT, JType.STR)(5, "6") == -1
    assert compare_fn(JType.STR, JType.LONG)("3000000000", 2**31) == 1
    assert compare_fn(JType.STR, JType.DOUBLE)("NaN", 1.0) == 1
    assert compare_fn(JType.DOUBLE, JType.STR)(1.0, " 1 ") == 0
    assert compare_fn(JType.STR, JType.BOOL)("TRUE", True) == 0
    assert compare_fn(JType.INT, JType.LONG)(5, 5) == 0
    assert compare_fn(JType.LONG, JType.DOUBLE)(2**53 + 1, float(2**53)) == 0
    assert compare_fn(JType.INT, JType.BOOL)(1, True) == -1  # unrelated: "less"
    assert compare_fn(JType.BOOL, JType.INT)(True, 1) == -1
    assert compare_fn(JType.BOOL, JType.BOOL)(False, True) == -1
    with pytest.raises(JavaError):
        compare_fn(JType.BOOL, JType.STR)(True, "true")  # Boolean cast to String
    with pytest.raises(JavaError):
        compare_fn(JType.STR, JType.INT)("5.0", 5)


def test_two_strings_order_as_doubles_but_equal_as_strings() -> None:
    assert ordering_fn(JType.STR, JType.STR)("9", "10") == -1
    assert ordering_fn(JType.STR, JType.STR)("1", "1.0") == 0
    assert compare_fn(JType.STR, JType.STR)("1", "1.0") != 0
    with pytest.raises(JavaError):
        ordering_fn(JType.STR, JType.STR)("1", "x")
