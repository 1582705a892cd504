"""Laws a RocketMQ filter obeys, checked on generated filters and messages.

Only laws that survive RocketMQ's rules hold here: unknown (a missing property) and
failures (a string Java cannot parse) break several of SQL's textbook identities, and
the tests at the end pin where they break. `outcome` gives RocketMQ's raw result: T, F,
U (unknown) or X (the evaluation failed).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from raftmq.filter import FilterError, compile
from raftmq.filter.compiler import build
from raftmq.filter.syntax import parse
from raftmq.filter.values import JavaError

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

NAMES = ("a", "b", "c")
VALUES = st.one_of(
    st.sampled_from(["1", "5", "10", "1.5", "-3", "x", "", "true", "TRUE", "NaN", "-0.0",
                     "Infinity", " 5 ", "3000000000", "0x1p3", "5d", "\u0665", "axb"]),
    st.integers(-(2**40), 2**40).map(str),
    st.text(max_size=6),
)
PROPERTIES = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=3)
OPERANDS = st.sampled_from(["a", "b", "c", "5", "-5", "10", "1.5", "2147483648", "'x'",
                            "'5'", "'true'", "TRUE", "FALSE", "-a", "(b > 1)"])
LITERAL_NUMBERS = st.sampled_from(["-5", "0", "1", "5", "10", "1.5", "2.5", "-1.5",
                                   "2147483648", "1e3"])
STRINGS = st.sampled_from(["'x'", "''", "'5'", "'a''b'", "'true'", "'axb'"])


def outcome(expression: str, properties: dict[str, str]) -> str:
    evaluate = build(parse(expression), expression)
    try:
        value = evaluate(properties)
    except JavaError:
        return "X"
    return {True: "T", False: "F", None: "U"}[value]


def compiles(expression: str) -> bool:
    try:
        compile(expression)
    except FilterError:
        return False
    return True


@st.composite
def comparisons(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 7))
    name = draw(st.sampled_from(NAMES))
    if kind == 0:
        return f"{name} {draw(st.sampled_from(['>', '>=', '<', '<=']))} {draw(LITERAL_NUMBERS)}"
    if kind == 1:
        return f"{draw(OPERANDS)} {draw(st.sampled_from(['=', '<>']))} {draw(OPERANDS)}"
    if kind == 2:
        low, high = sorted(draw(st.lists(st.integers(-5, 10), min_size=2, max_size=2)))
        return f"{name} {draw(st.sampled_from(['', 'NOT ']))}BETWEEN {low} AND {high}"
    if kind == 3:
        items = ", ".join(draw(st.lists(STRINGS, min_size=1, max_size=4)))
        return f"{name} {draw(st.sampled_from(['', 'NOT ']))}IN ({items})"
    if kind == 4:
        op = draw(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]))
        return f"{name} {draw(st.sampled_from(['', 'NOT ']))}{op} {draw(STRINGS)}"
    if kind == 5:
        return f"{draw(OPERANDS)} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 6:
        return f"{name} {draw(st.sampled_from(['>', '>=', '<', '<=', '=', '<>']))} " \
               f"{draw(st.sampled_from(NAMES))}"
    return draw(st.sampled_from([*NAMES, "TRUE", "FALSE", "NULL"]))


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, children).map(lambda pq: f"({pq[0]}) AND ({pq[1]})"),
        st.tuples(children, children).map(lambda pq: f"({pq[0]}) OR ({pq[1]})"),
        children.map(lambda p: f"NOT ({p})"),
    )


CONDITIONS = st.recursive(comparisons(), _combine, max_leaves=6).filter(compiles)


def _and(p: str, q: str) -> str:
    """AND on RocketMQ's outcomes: left to right, a FALSE or a failure ends it."""
    if p in "FX":
        return p
    if q in "FX":
        return q
    return "U" if "U" in (p, q) else "T"


def _or(p: str, q: str) -> str:
    if p in "TX":
        return p
    if q in "TX":
        return q
    return "U" if "U" in (p, q) else "F"


@SETTINGS
@given(CONDITIONS, CONDITIONS, PROPERTIES)
def test_and_and_or_are_kleenes_evaluated_left_to_right(p: str, q: str,
                                                        props: dict[str, str]) -> None:
    op, oq = outcome(p, props), outcome(q, props)
    assert outcome(f"({p}) AND ({q})", props) == _and(op, oq)
    assert outcome(f"({p}) OR ({q})", props) == _or(op, oq)


@SETTINGS
@given(CONDITIONS, PROPERTIES)
def test_not_not_is_the_identity(p: str, props: dict[str, str]) -> None:
    assert outcome(f"NOT NOT ({p})", props) == outcome(f"({p})", props)
    assert outcome(f"NOT ({p})", props) == {"T": "F", "F": "T"}.get(
        outcome(p, props), outcome(p, props))


@SETTINGS
@given(CONDITIONS, CONDITIONS, PROPERTIES)
def test_de_morgan_holds_failures_included(p: str, q: str, props: dict[str, str]) -> None:
    assert outcome(f"NOT (({p}) AND ({q}))", props) == \
        outcome(f"NOT ({p}) OR NOT ({q})", props)
    assert outcome(f"NOT (({p}) OR ({q}))", props) == \
        outcome(f"NOT ({p}) AND NOT ({q})", props)


@SETTINGS
@given(CONDITIONS, CONDITIONS, PROPERTIES)
def test_and_matches_in_either_order(p: str, q: str, props: dict[str, str]) -> None:
    assert compile(f"({p}) AND ({q})")(props) == compile(f"({q}) AND ({p})")(props)


@SETTINGS
@given(CONDITIONS, CONDITIONS, PROPERTIES)
def test_or_matches_in_either_order_unless_a_side_fails(p: str, q: str,
                                                        props: dict[str, str]) -> None:
    assume("X" not in (outcome(p, props), outcome(q, props)))
    assert compile(f"({p}) OR ({q})")(props) == compile(f"({q}) OR ({p})")(props)


@SETTINGS
@given(st.sampled_from(NAMES), LITERAL_NUMBERS, LITERAL_NUMBERS, PROPERTIES)
@example("a", "1", "5", {"a": "NaN"})
@example("a", "1.5", "2.5", {"a": "2"})
def test_between_is_two_comparisons(name: str, low: str, high: str,
                                    props: dict[str, str]) -> None:
    between = f"{name} BETWEEN {low} AND {high}"
    pair = f"{name} >= {low} AND {name} <= {high}"
    if compiles(between):
        assert outcome(between, props) == outcome(pair, props)
    else:  # only constant bounds in the wrong order are refused
        assert float(low) > float(high)
    outside = f"{name} NOT BETWEEN {low} AND {high}"
    assert outcome(outside, props) == outcome(f"{name} < {low} OR {name} > {high}", props)
    if compiles(between):
        assert outcome(outside, props) == outcome(f"NOT ({between})", props)


@SETTINGS
@given(OPERANDS, OPERANDS, PROPERTIES)
def test_not_equal_is_not_equal(x: str, y: str, props: dict[str, str]) -> None:
    assume(compiles(f"{x} = {y}"))
    assert outcome(f"{x} <> {y}", props) == outcome(f"NOT ({x} = {y})", props)


@SETTINGS
@given(OPERANDS, PROPERTIES)
def test_is_null_is_never_unknown_and_is_not_null_negates_it(x: str,
                                                              props: dict[str, str]) -> None:
    assert outcome(f"{x} IS NULL", props) in "TFX"
    assert outcome(f"{x} IS NOT NULL", props) == outcome(f"NOT ({x} IS NULL)", props)
    if x in NAMES:
        assert compile(f"{x} IS NULL")(props) is (x not in props)


@SETTINGS
@given(st.sampled_from(NAMES), st.lists(STRINGS, min_size=1, max_size=5), PROPERTIES)
def test_not_in_negates_in_and_both_are_unknown_without_the_property(
    name: str, items: list[str], props: dict[str, str]
) -> None:
    listed = ", ".join(items)
    yes, no = outcome(f"{name} IN ({listed})", props), outcome(f"{name} NOT IN ({listed})", props)
    assert no == outcome(f"NOT ({name} IN ({listed}))", props)
    if name not in props:
        assert yes == no == "U"
    else:
        members = {s[1:-1].replace("''", "'") for s in items}
        assert yes == ("T" if props[name] in members else "F")


@SETTINGS
@given(st.sampled_from(NAMES), st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
       st.text(min_size=1, max_size=3), PROPERTIES)
def test_string_tests_negate_only_when_the_property_is_there(
    name: str, op: str, needle: str, props: dict[str, str]
) -> None:
    literal = "'" + needle.replace("'", "''") + "'"
    yes = compile(f"{name} {op} {literal}")(props)
    no = compile(f"{name} NOT {op} {literal}")(props)
    if name not in props:
        assert yes is no is False
    else:
        value = props[name]
        found = {"CONTAINS": needle in value, "STARTSWITH": value.startswith(needle),
                 "ENDSWITH": value.endswith(needle)}[op]
        assert (yes, no) == (found, not found)


@SETTINGS
@given(st.sampled_from(["=", "<>", ">", ">=", "<", "<="]),
       st.sampled_from(["5", "1.5", "'x'", "TRUE", "b", "2147483648"]))
def test_a_missing_property_matches_neither_a_test_nor_its_negation(op: str, rhs: str) -> None:
    expression = f"a {op} {rhs}"
    assume(compiles(expression))
    props = {"b": "7"}
    assert compile(expression)(props) is False
    assert compile(f"NOT ({expression})")(props) is False


@SETTINGS
@given(st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**63 - 1),
       st.sampled_from([">", ">=", "<", "<=", "=", "<>"]))
def test_integers_compare_as_numbers(value: int, literal: int, op: str) -> None:
    expected = {">": value > literal, ">=": value >= literal, "<": value < literal,
                "<=": value <= literal, "=": value == literal, "<>": value != literal}[op]
    # the property fits 32 bits, so it reads as an Integer and as a Long alike
    assert compile(f"a {op} {literal}")({"a": str(value)}) is expected
    assume(literal != 0)  # 0.0 is no valid literal
    assert compile(f"a {op} {literal}.0")({"a": str(value)}) is (
        {">": float(value) > float(literal), ">=": float(value) >= float(literal),
         "<": float(value) < float(literal), "<=": float(value) <= float(literal),
         "=": float(value) == float(literal), "<>": float(value) != float(literal)}[op])


@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(min_value=1e-300,
       max_value=1e300), st.sampled_from([">", ">=", "<", "<=", "="]))
def test_doubles_compare_as_numbers(value: float, literal: float, op: str) -> None:
    assume(not (value == 0.0 and math.copysign(1.0, value) < 0))  # -0.0 < 0.0 in Java
    expected = {">": value > literal, ">=": value >= literal, "<": value < literal,
                "<=": value <= literal, "=": value == literal}[op]
    assert compile(f"a {op} {literal!r}")({"a": repr(value)}) is expected


@SETTINGS
@given(st.sampled_from(NAMES), st.sampled_from(NAMES), PROPERTIES)
def test_ordering_two_properties_is_antisymmetric(x: str, y: str,
                                                  props: dict[str, str]) -> None:
    assert outcome(f"{x} > {y}", props) == outcome(f"{y} < {x}", props)
    assert outcome(f"{x} >= {y}", props) == outcome(f"{y} <= {x}", props)
    if x in props and y in props:
        assert outcome(f"{x} = {y}", props) == outcome(f"{y} = {x}", props)


# ------------------------------------------------------------ where textbook laws break

def test_or_does_not_commute_when_a_side_fails() -> None:
    props = {"a": "x", "b": "1"}
    assert compile("b = 1 OR a > 1")(props) is True
    assert compile("a > 1 OR b = 1")(props) is False


def test_equality_is_not_symmetric_with_a_missing_side() -> None:
    assert compile("NOT (a = 'x')")({}) is False
    assert compile("NOT ('x' = a)")({}) is True


def test_excluded_middle_fails_on_unknown() -> None:
    assert compile("a = 'x' OR NOT (a = 'x')")({}) is False
    assert compile("a = 'x' OR NOT (a = 'x')")({"a": "y"}) is True


# ------------------------------------------------------------ any text at all

TOKENS = st.sampled_from([
    "a", "b", "1", "0", "1.5", ".5", "1e3", "2147483648", "'x'", "''", "'", "TRUE", "NULL",
    "NOT", "AND", "OR", "IS", "IN", "BETWEEN", "CONTAINS", "STARTSWITH", "ENDSWITH", "(",
    ")", ",", "=", "<>", "<", ">", "<=", ">=", "+", "-", "--", "/*", "*/", "\n", "#", ".",
    "\u00e9", "0x1", "\u00a0",
])
TEXTS = st.one_of(st.text(max_size=40), st.lists(TOKENS, max_size=12).map(" ".join),
                  st.lists(TOKENS, max_size=12).map("".join))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS, st.dictionaries(st.sampled_from(["a", "b", "x"]), VALUES, max_size=3),
       st.booleans())
def test_any_text_compiles_or_is_refused_and_any_predicate_answers(
    text: str, props: dict[str, str], strict: bool
) -> None:
    try:
        match = compile(text, strict=strict)
    except FilterError as e:
        assert 0 <= e.offset <= len(text)
        assert e.line >= 1 and e.column >= 1
        return
    assert match(props) in (True, False)
    if strict:  # what strict accepts, the lenient parse accepts and decides alike
        assert compile(text)(props) is match(props)
