"""A parse tree becomes nested closures that evaluate as RocketMQ's expression objects do.

Each node knows, besides its closure, what RocketMQ's checks look at when it builds an
expression: whether it is a literal (a `ConstantExpression`, even inside parentheses or
after a unary plus), a condition (a `BooleanExpression`), or a bare property, and the one
Java class its value always has (see `values.JType`). Those decide which expressions are
refused at compile time and which conversion a comparison makes, so a comparison's
closure is chosen once, for its two classes, and does no type dispatch per message.

A closure returns True, False or None (SQL's unknown) for a condition, and the value
for an operand; a Java exception is `JavaError`, which `compile` turns into "no match".
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Token, Tree

from .syntax import FilterError, Position, position, token_position
from .values import (
    INT_MAX,
    LONG_MAX,
    NUMERIC,
    JType,
    compare_fn,
    ordering_fn,
)

__all__ = ["MAX_DEPTH", "Eval", "build"]

Eval = Callable[[Mapping[str, str]], Any]

# Nesting deeper than this is refused: evaluation recurses once per level, and Java's own
# recursive parser gives up on deep nesting too (its stack overflows).
MAX_DEPTH = 200


@dataclass(frozen=True, slots=True)
class Node:
    """A compiled expression and the facts RocketMQ's construction-time checks use."""

    fn: Eval
    jtype: JType
    at: Position
    constant: bool = False  # a literal (RocketMQ: ConstantExpression)
    boolean: bool = False  # a condition (RocketMQ: BooleanExpression)
    prop: str | None = None  # a bare property (RocketMQ: PropertyExpression)
    pure: bool = False  # always evaluates to `value`, touching nothing
    value: Any = None
    negates: Node | None = None  # what a NOT or a unary minus applies to


def _const(value: Any) -> Eval:
    return lambda props: value


def _gt(answer: int) -> bool:
    return answer > 0


def _ge(answer: int) -> bool:
    return answer >= 0


def _lt(answer: int) -> bool:
    return answer < 0


def _le(answer: int) -> bool:
    return answer <= 0


_TESTS = {"gt": (_gt, ">"), "ge": (_ge, ">="), "lt": (_lt, "<"), "le": (_le, "<=")}


def _unquote(tok: Any) -> str:
    return str(tok)[1:-1].replace("''", "'")


def _describe(node: Node) -> str:
    if node.prop is not None:
        return f"property {node.prop}"
    if node.constant:
        if node.jtype is JType.NULL:
            return "NULL"
        if node.jtype is JType.BOOL:
            return "TRUE" if node.value else "FALSE"
        if node.jtype is JType.STR:
            return "a string"
        return "a number"
    if node.boolean:
        return "a condition"
    return "a negated value"


class _Builder:
    def __init__(self, text: str) -> None:
        self.text = text

    def error(self, reason: str, at: Position) -> FilterError:
        return FilterError(reason, at.offset, at.line, at.column)

    def at(self, item: Tree | Token) -> Position:
        if isinstance(item, Token):
            return token_position(item)
        meta = item.meta
        if getattr(meta, "empty", True):
            return position(self.text, 0)
        return Position(meta.start_pos, meta.line, meta.column)

    # ------------------------------------------------------------------ dispatch

    def build(self, tree: Tree, depth: int) -> Node:
        """The node of `tree`; chains of NOT, unary minus, unary plus and parentheses
        are walked in a loop, so only binary nesting counts towards `MAX_DEPTH`."""
        prefix: list[tuple[str, Position]] = []
        while tree.data in ("group", "plus", "not_", "negate"):
            if tree.data in ("not_", "negate"):
                prefix.append((tree.data, self.at(tree)))
            tree = tree.children[1]  # parentheses and unary plus add nothing
        if depth > MAX_DEPTH:
            raise self.error(f"the expression nests deeper than {MAX_DEPTH} levels",
                             self.at(tree))
        handler: Callable[[Tree, int], Node] = getattr(self, f"_{tree.data}")
        node = handler(tree, depth + 1)
        for op, at in reversed(prefix):
            if op == "not_":
                node = self.negation(self.condition(node, "NOT"), at)
            else:
                node = self.minus(node, at)
        return node

    def operands(self, tree: Tree, depth: int) -> list[Node]:
        return [self.build(c, depth) for c in tree.children if isinstance(c, Tree)]

    # ------------------------------------------------------------------ checks

    def condition(self, node: Node, what: str) -> Node:
        """RocketMQ's `asBooleanExpression`: a condition as it is, a bare property as
        "the property is a Boolean" (never, its value is a string: FALSE, or unknown
        when missing), anything else refused."""
        if node.boolean:
            return node
        if node.prop is not None:
            name = node.prop

            def cast(props: Mapping[str, str]) -> bool | None:
                return None if props.get(name) is None else False

            return Node(cast, JType.BOOL, node.at, boolean=True)
        raise self.error(f"{what} needs a condition, not {_describe(node)}", node.at)

    def orderable(self, node: Node, op: str) -> None:
        """RocketMQ's `checkLessThanOperand`: literals must be numbers, conditions are
        refused."""
        if node.constant:
            if node.jtype not in NUMERIC:
                raise self.error(f"{_describe(node)} cannot be compared with {op}: "
                                 "only numbers and properties can", node.at)
        elif node.boolean:
            raise self.error(f"a condition cannot be compared with {op}", node.at)

    def equatable(self, left: Node, right: Node) -> None:
        """RocketMQ's `checkEqualOperand` and `checkEqualOperandCompatability`."""
        for node in (left, right):
            if node.constant and node.jtype is JType.NULL:
                raise self.error("NULL cannot be compared with = or <>: use IS NULL or "
                                 "IS NOT NULL", node.at)
        if left.constant and right.constant and left.boolean and not right.boolean:
            raise self.error(f"{_describe(left)} cannot be compared with "
                             f"{_describe(right)}", left.at)

    # ------------------------------------------------------------------ literals

    def _string(self, tree: Tree, depth: int) -> Node:
        value = _unquote(tree.children[0])
        return Node(_const(value), JType.STR, self.at(tree), constant=True, pure=True,
                    value=value)

    def _decimal(self, tree: Tree, depth: int) -> Node:
        tok = tree.children[0]
        digits = str(tok).rstrip("lL")
        if len(digits) > 19 or int(digits) > LONG_MAX:
            raise self.error(f"integer {digits} is beyond a 64-bit long", self.at(tok))
        value = int(digits)
        jtype = JType.INT if value <= INT_MAX else JType.LONG
        return Node(_const(value), jtype, self.at(tok), constant=True, pure=True,
                    value=value)

    def _float(self, tree: Tree, depth: int) -> Node:
        tok = tree.children[0]
        value = float(str(tok))
        if math.isinf(value):
            raise self.error(f"number {tok} is beyond the largest double", self.at(tok))
        if value == 0.0:  # RocketMQ refuses doubles under Double.MIN_VALUE, 0.0 included
            raise self.error(f"number {tok} is below the smallest positive double "
                             "(write 0 for zero)", self.at(tok))
        return Node(_const(value), JType.DOUBLE, self.at(tok), constant=True, pure=True,
                    value=value)

    def _true(self, tree: Tree, depth: int) -> Node:
        return Node(_const(True), JType.BOOL, self.at(tree), constant=True, boolean=True,
                    pure=True, value=True)

    def _false(self, tree: Tree, depth: int) -> Node:
        return Node(_const(False), JType.BOOL, self.at(tree), constant=True, boolean=True,
                    pure=True, value=False)

    def _null(self, tree: Tree, depth: int) -> Node:
        return Node(_const(None), JType.NULL, self.at(tree), constant=True, boolean=True,
                    pure=True, value=None)

    def _property(self, tree: Tree, depth: int) -> Node:
        name = str(tree.children[0])

        def prop(props: Mapping[str, str]) -> str | None:
            return props.get(name)

        return Node(prop, JType.STR, self.at(tree), prop=name)

    # ------------------------------------------------------------------ unary

    def minus(self, x: Node, at: Position) -> Node:
        """Unary minus negates numbers and makes anything else null (RocketMQ's
        `createNegate`); the result is no longer a literal for the checks."""
        if x.jtype in NUMERIC and x.pure:
            return Node(_const(-x.value), x.jtype, at, pure=True, value=-x.value)
        if x.pure or x.prop is not None:
            return Node(_const(None), JType.NULL, at, pure=True)
        if x.jtype is JType.NULL and x.negates is not None:
            return x  # minus of minus of a condition: null all the same
        inner = x.fn

        def negate(props: Mapping[str, str]) -> None:
            inner(props)  # evaluated for its failures; a condition is never a number
            return None

        return Node(negate, JType.NULL, at, negates=x)

    def negation(self, x: Node, at: Position) -> Node:
        """NOT of a condition: unknown stays unknown; NOT NOT x is x."""
        if x.negates is not None and x.boolean:  # no longer a literal, as in RocketMQ
            return dataclasses.replace(x.negates, at=at, constant=False)
        inner = x.fn

        def not_(props: Mapping[str, str]) -> bool | None:
            v = inner(props)
            return None if v is None else not v

        return Node(not_, JType.BOOL, at, boolean=True, negates=x)

    # ------------------------------------------------------------------ AND / OR

    def _or_expr(self, tree: Tree, depth: int) -> Node:
        nodes = [self.condition(n, "OR") for n in self.operands(tree, depth)]
        return self.any_of(nodes, self.at(tree))

    def _and_expr(self, tree: Tree, depth: int) -> Node:
        nodes = [self.condition(n, "AND") for n in self.operands(tree, depth)]
        return self.all_of(nodes, self.at(tree))

    def any_of(self, nodes: list[Node], at: Position) -> Node:
        """OR, left to right: the first TRUE wins (the rest is not evaluated); else
        unknown if any was unknown; else FALSE."""
        fns = tuple(n.fn for n in nodes)

        def or_(props: Mapping[str, str]) -> bool | None:
            unknown = False
            for fn in fns:
                v = fn(props)
                if v is True:
                    return True
                if v is None:
                    unknown = True
            return None if unknown else False

        return Node(or_, JType.BOOL, at, boolean=True)

    def all_of(self, nodes: list[Node], at: Position) -> Node:
        """AND, left to right: the first FALSE wins; else unknown if any was unknown."""
        fns = tuple(n.fn for n in nodes)

        def and_(props: Mapping[str, str]) -> bool | None:
            unknown = False
            for fn in fns:
                v = fn(props)
                if v is False:
                    return False
                if v is None:
                    unknown = True
            return None if unknown else True

        return Node(and_, JType.BOOL, at, boolean=True)

    # ------------------------------------------------------------------ = <> IS NULL

    def equality(self, left: Node, right: Node, at: Position) -> Node:
        """RocketMQ's equality: null on the left gives unknown (TRUE if the right is
        null too), null on the right only gives FALSE; else equal after conversion."""
        lt, rt = left.jtype, right.jtype
        test: Callable[[Any, Any], bool]
        if (lt is rt and lt is not JType.DOUBLE) or {lt, rt} <= {JType.INT, JType.LONG}:
            test = operator.eq
        else:
            cmp = compare_fn(lt, rt)
            test = lambda a, b: cmp(a, b) == 0  # noqa: E731

        lf, rf = left.fn, right.fn
        if right.pure and right.value is None:  # IS NULL, or a null-valued right side

            def is_null(props: Mapping[str, str]) -> bool:
                return lf(props) is None

            return Node(is_null, JType.BOOL, at, boolean=True)
        if left.prop is not None and right.pure:
            name, c = left.prop, right.value
            if lt is rt:

                def equals_const(props: Mapping[str, str]) -> bool | None:
                    v = props.get(name)
                    return None if v is None else v == c

                return Node(equals_const, JType.BOOL, at, boolean=True)

            def converts_const(props: Mapping[str, str]) -> bool | None:
                v = props.get(name)
                return None if v is None else test(v, c)

            return Node(converts_const, JType.BOOL, at, boolean=True)

        def equals(props: Mapping[str, str]) -> bool | None:
            lv = lf(props)
            rv = rf(props)
            if lv is None:
                return True if rv is None else None
            if rv is None:
                return False
            return test(lv, rv)

        return Node(equals, JType.BOOL, at, boolean=True)

    def _eq(self, tree: Tree, depth: int) -> Node:
        left, right = self.operands(tree, depth)
        self.equatable(left, right)
        return self.equality(left, right, self.at(tree))

    def _ne(self, tree: Tree, depth: int) -> Node:
        left, right = self.operands(tree, depth)
        self.equatable(left, right)
        at = self.at(tree)
        return self.negation(self.equality(left, right, at), at)

    def _is_null(self, tree: Tree, depth: int) -> Node:
        (left,) = self.operands(tree, depth)
        return self.equality(left, self._null(tree, depth), self.at(tree))

    def _is_not_null(self, tree: Tree, depth: int) -> Node:
        (left,) = self.operands(tree, depth)
        at = self.at(tree)
        return self.negation(self.equality(left, self._null(tree, depth), at), at)

    # ------------------------------------------------------------------ < > <= >=

    def ordering(self, left: Node, right: Node, kind: str, at: Position) -> Node:
        """RocketMQ's ordering: unknown when either side is null (the right side is not
        evaluated when the left is null); two strings compare as doubles."""
        test, op = _TESTS[kind]
        self.orderable(left, op)
        self.orderable(right, op)
        cmp = ordering_fn(left.jtype, right.jtype)
        lf, rf = left.fn, right.fn
        if left.prop is not None and right.pure and right.value is not None:
            name, c = left.prop, right.value

            def orders_const(props: Mapping[str, str]) -> bool | None:
                v = props.get(name)
                return None if v is None else test(cmp(v, c))

            return Node(orders_const, JType.BOOL, at, boolean=True)

        def orders(props: Mapping[str, str]) -> bool | None:
            lv = lf(props)
            if lv is None:
                return None
            rv = rf(props)
            if rv is None:
                return None
            return test(cmp(lv, rv))

        return Node(orders, JType.BOOL, at, boolean=True)

    def _ordered(self, tree: Tree, depth: int) -> Node:
        left, right = self.operands(tree, depth)
        return self.ordering(left, right, tree.data, self.at(tree))

    _gt = _ge = _lt = _le = _ordered

    def _between(self, tree: Tree, depth: int, negated: bool = False) -> Node:
        value, low, high = self.operands(tree, depth)
        at = self.at(tree)
        if negated:  # value < low OR value > high, bounds unchecked as in RocketMQ
            return self.any_of([self.ordering(value, low, "lt", at),
                                self.ordering(value, high, "gt", at)], at)
        keyword = self.at(tree.children[1])
        if low.constant and high.constant:
            if low.jtype is JType.NULL or high.jtype is JType.NULL:
                raise self.error("BETWEEN bounds cannot be NULL", keyword)
            if (low.jtype in NUMERIC and high.jtype in NUMERIC
                    and compare_fn(high.jtype, low.jtype)(high.value, low.value) < 0):
                raise self.error(f"BETWEEN {low.value} AND {high.value}: the lower bound "
                                 "comes first", keyword)
        return self.all_of([self.ordering(value, low, "ge", at),
                            self.ordering(value, high, "le", at)], at)

    def _not_between(self, tree: Tree, depth: int) -> Node:
        return self._between(tree, depth, negated=True)

    # ------------------------------------------------------------------ strings

    def search(self, tree: Tree, depth: int, kind: str, negated: bool) -> Node:
        """CONTAINS, STARTSWITH, ENDSWITH: FALSE (never unknown) for a missing property,
        a value that is not a string, or an empty search string, negated or not."""
        (left,) = self.operands(tree, depth)
        needle = _unquote(tree.children[-1])
        at = self.at(tree)
        lf = left.fn
        if not needle:
            return Node(_const(False), JType.BOOL, at, boolean=True)
        if left.jtype is not JType.STR:
            if left.pure or left.prop is not None:
                return Node(_const(False), JType.BOOL, at, boolean=True)

            def not_a_string(props: Mapping[str, str]) -> bool:
                lf(props)  # evaluated for its failures
                return False

            return Node(not_a_string, JType.BOOL, at, boolean=True)
        found: Callable[[str], bool]
        if kind == "contains":
            found = lambda v: needle in v  # noqa: E731
        elif kind == "startswith":
            found = operator.methodcaller("startswith", needle)
        else:
            found = operator.methodcaller("endswith", needle)

        def searches(props: Mapping[str, str]) -> bool:
            v = lf(props)
            if v is None:
                return False
            return found(v) is not negated

        return Node(searches, JType.BOOL, at, boolean=True)

    def _contains(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "contains", False)

    def _not_contains(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "contains", True)

    def _startswith(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "startswith", False)

    def _not_startswith(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "startswith", True)

    def _endswith(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "endswith", False)

    def _not_endswith(self, tree: Tree, depth: int) -> Node:
        return self.search(tree, depth, "endswith", True)

    # ------------------------------------------------------------------ IN

    def _in_list(self, tree: Tree, depth: int, negated: bool = False) -> Node:
        """IN: only a property on the left; unknown when it is missing."""
        left = self.build(tree.children[0], depth)
        at = self.at(tree)
        if left.prop is None:
            raise self.error(f"IN needs a property on its left, not {_describe(left)}",
                             self.at(tree.children[2 if negated else 1]))
        strings = next(c for c in tree.children if isinstance(c, Tree) and c.data == "strings")
        members = frozenset(_unquote(t) for t in strings.children
                            if isinstance(t, Token) and t.type == "STRING")
        name = left.prop

        def in_(props: Mapping[str, str]) -> bool | None:
            v = props.get(name)
            return None if v is None else (v in members) is not negated

        return Node(in_, JType.BOOL, at, boolean=True)

    def _not_in_list(self, tree: Tree, depth: int) -> Node:
        return self._in_list(tree, depth, negated=True)


def build(tree: Tree, text: str) -> Eval:
    """The closure of a whole filter: True, False or None, or `JavaError`."""
    builder = _Builder(text)
    (root,) = tree.children
    node = builder.condition(builder.build(root, 0), "a filter")
    return node.fn
