"""Partition shapes (`chaos.topology`): the properties each Jepsen shape promises."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.topology import (
    Partition,
    bridge,
    cut_off,
    halves,
    isolate,
    majority,
    majority_ring,
    pairs_between,
    reachable,
)

sizes = st.sampled_from([3, 5])
seeds = st.integers(min_value=0, max_value=2**32)
id_offsets = st.integers(min_value=0, max_value=5)  # ids need not start at 1


def nodes_of(n: int, offset: int) -> list[int]:
    return [offset + k for k in range(1, n + 1)]


def components(p: Partition) -> list[frozenset[int]]:
    """Connected components of the graph of open links (transitive, unlike `sees`)."""
    left, out = set(p.nodes), []
    while left:
        todo, comp = [left.pop()], set()
        while todo:
            x = todo.pop()
            comp.add(x)
            for y in p.sees(x) - comp:
                todo.append(y)
                left.discard(y)
        out.append(frozenset(comp))
    return out


def well_formed(p: Partition, nodes: list[int]) -> None:
    assert sorted(p.nodes) == sorted(nodes)
    for pair in p.blocked:
        assert len(pair) == 2 and pair <= set(nodes)
    assert p.description
    as_json = p.to_json()
    assert as_json["blocked"] == sorted(sorted(x) for x in p.blocked)


@given(sizes, seeds, id_offsets)
def test_halves_split_into_two_fully_connected_sides(n: int, seed: int, offset: int) -> None:
    nodes = nodes_of(n, offset)
    p = halves(nodes, random.Random(seed))
    well_formed(p, nodes)
    sides = sorted(components(p), key=len)
    assert [len(s) for s in sides] == [n // 2, n - n // 2]
    small, large = sides
    assert p.blocked == pairs_between(small, large)  # nothing inside a side is blocked
    assert p.cut_off == small  # the minority sees no majority, the majority does


@given(sizes, seeds, id_offsets)
def test_isolate_cuts_one_node_from_all_others(n: int, seed: int, offset: int) -> None:
    nodes = nodes_of(n, offset)
    p = isolate(nodes, random.Random(seed))
    well_formed(p, nodes)
    (alone,) = p.cut_off
    assert p.sees(alone) == {alone}
    assert len(p.blocked) == n - 1
    for other in set(nodes) - {alone}:
        assert p.sees(other) == set(nodes) - {alone}


def test_isolate_takes_the_node_it_is_given() -> None:
    assert isolate([1, 2, 3], random.Random(0), 2).cut_off == {2}
    with pytest.raises(ValueError, match="not one of"):
        isolate([1, 2, 3], random.Random(0), 9)


@given(sizes, seeds, id_offsets)
def test_bridge_node_sees_everyone_and_each_side_is_connected(
    n: int, seed: int, offset: int
) -> None:
    nodes = nodes_of(n, offset)
    p = bridge(nodes, random.Random(seed))
    well_formed(p, nodes)
    (middle,) = [x for x in nodes if p.sees(x) == set(nodes)]
    sides = components(Partition("sub", tuple(set(nodes) - {middle}), p.blocked, "-"))
    assert len(sides) == 2 and abs(len(sides[0]) - len(sides[1])) <= 1
    assert p.blocked == pairs_between(sides[0], sides[1])
    for side in sides:
        for x in side:
            assert p.sees(x) == side | {middle}
    # with an odd count every node, through the bridge, still sees a majority
    assert p.cut_off == frozenset()


@given(st.sampled_from([3, 4, 5, 6, 7]), seeds, id_offsets)
def test_majority_ring_every_node_sees_its_own_majority(n: int, seed: int, offset: int) -> None:
    nodes = nodes_of(n, offset)
    p = majority_ring(nodes, random.Random(seed))
    well_formed(p, nodes)
    views = [p.sees(x) for x in nodes]
    for x, view in zip(nodes, views, strict=True):
        assert x in view and len(view) >= majority(n)
    assert len(set(views)) == n, "no two nodes see the same majority"
    assert p.blocked, "some link is cut"
    assert p.cut_off == frozenset()


def test_majority_ring_of_five_is_a_ring_of_neighbours() -> None:
    p = majority_ring([1, 2, 3, 4, 5], random.Random(7))
    assert len(p.blocked) == 5  # 10 pairs, 5 ring edges kept
    assert all(len(p.sees(x)) == 3 for x in range(1, 6))


def test_majority_ring_of_three_degenerates_to_a_bridge() -> None:
    p = majority_ring([1, 2, 3], random.Random(1))
    assert len(p.blocked) == 1
    assert "bridge" in p.description


@pytest.mark.parametrize("shape", [halves, isolate, bridge, majority_ring])
def test_shapes_are_determined_by_ids_and_seed(shape: object) -> None:
    assert callable(shape)
    a = shape([3, 1, 2, 5, 4], random.Random(42))
    b = shape([1, 2, 3, 4, 5], random.Random(42))
    assert a == b
    seen = {shape([1, 2, 3, 4, 5], random.Random(s)).blocked for s in range(40)}
    assert len(seen) > 1, "the seed matters"


def test_too_few_or_repeated_nodes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        bridge([1, 2], random.Random(0))
    with pytest.raises(ValueError, match="at least 2"):
        halves([1], random.Random(0))
    with pytest.raises(ValueError, match="repeat"):
        majority_ring([1, 1, 2], random.Random(0))


def test_helpers() -> None:
    blocked = pairs_between([1], [2, 3])
    assert blocked == {frozenset({1, 2}), frozenset({1, 3})}
    assert reachable(1, [1, 2, 3], blocked) == {1}
    assert reachable(2, [1, 2, 3], blocked) == {2, 3}
    assert cut_off([1, 2, 3], blocked) == {1}
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
