"""Partition shapes as pure functions: which node pairs cannot talk.

A shape is a set of blocked *unordered* pairs (`frozenset({i, j})`); links are symmetric,
as a proxy per node pair blocks both directions at once. Each function takes the node ids
and a `random.Random`, sorts the ids first, and draws everything from that generator, so
the same ids and seed always give the same shape. The shapes are Jepsen's:

* `halves` — a random split into two sides, the smaller one first (a minority when the
  count is odd);
* `isolate` — one node cut from every other node;
* `bridge` — two halves that cannot see each other and one node that sees both;
* `majority_ring` — nodes on a ring, each sees its neighbours within a radius: every node
  sees a majority (itself included), and no two nodes see the same majority.

`Partition.cut_off` names the nodes that see no majority: a leader there cannot commit
and the group has to elect another, which is what a run measures.

On a cluster whose nodes are shards of a few hosts (`broker.config`'s `[hosts]`), a shape
is drawn over the hosts and `on_hosts` expands it to their shards: a host's shards keep
talking to each other (they share a machine) and are cut from a host's shards together.
Such a partition's `cut_off` is counted in hosts: a group keeps at most one replica per
host, so a host that sees a majority of the hosts keeps its groups' majorities.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

__all__ = [
    "Pair",
    "Partition",
    "bridge",
    "cut_off",
    "halves",
    "isolate",
    "majority",
    "majority_ring",
    "on_hosts",
    "pairs_between",
    "reachable",
]

Pair = frozenset[int]


def majority(n: int) -> int:
    """The smallest number of nodes that is more than half of `n`."""
    return n // 2 + 1


def pairs_between(a: Iterable[int], b: Iterable[int]) -> frozenset[Pair]:
    """Every pair with one node in `a` and the other in `b` (the links a cut severs)."""
    bs = list(b)
    return frozenset(frozenset((x, y)) for x in a for y in bs if x != y)


def reachable(node: int, nodes: Iterable[int], blocked: Collection[Pair]) -> frozenset[int]:
    """The nodes `node` talks to directly, itself included (no forwarding: Raft has none)."""
    return frozenset(m for m in nodes if m == node or frozenset((node, m)) not in blocked)


def cut_off(nodes: Collection[int], blocked: Collection[Pair]) -> frozenset[int]:
    """The nodes that see fewer than a majority of `nodes` (themselves included)."""
    need = majority(len(nodes))
    return frozenset(n for n in nodes if len(reachable(n, nodes, blocked)) < need)


@dataclass(frozen=True, slots=True)
class Partition:
    """One network shape: the blocked pairs, a readable description and who is cut off."""

    kind: str
    nodes: tuple[int, ...]
    blocked: frozenset[Pair]
    description: str
    # the shards of each host, when the shape was drawn over hosts (`on_hosts`); () when
    # every node is its own host
    hosts: tuple[tuple[int, ...], ...] = ()

    @property
    def cut_off(self) -> frozenset[int]:
        if not self.hosts:
            return cut_off(self.nodes, self.blocked)
        # a host sees another when their shards talk (all of them or none: `on_hosts`)
        firsts = [h[0] for h in self.hosts]
        lost = cut_off(firsts, self.blocked)
        return frozenset(n for h in self.hosts if h[0] in lost for n in h)

    def sees(self, node: int) -> frozenset[int]:
        return reachable(node, self.nodes, self.blocked)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly value for the history (sorted, so equal shapes print equally)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "description": self.description,
            "blocked": sorted(sorted(p) for p in self.blocked),
            "cut_off": sorted(self.cut_off),
        }
        if self.hosts:
            out["hosts"] = [list(h) for h in self.hosts]
        return out


def on_hosts(shape: Partition, hosts: Sequence[tuple[str, Sequence[int]]]) -> Partition:
    """`shape`, drawn over hosts numbered 1..H (the order of `hosts`: (name, its shards)),
    expanded to the shards: every shard of host a is cut from every shard of host b when
    a and b are, and shards of one host always talk. The description keeps the host
    numbers and says which host each is (`1=h1[1, 2]`)."""
    if sorted(shape.nodes) != list(range(1, len(hosts) + 1)):
        raise ValueError(f"on_hosts: the shape is over {list(shape.nodes)}, "
                         f"not hosts 1..{len(hosts)}")
    shards = {k: tuple(sorted(ns)) for k, (_, ns) in enumerate(hosts, 1)}
    every = [n for ns in shards.values() for n in ns]
    if not all(shards.values()) or len(set(every)) != len(every):
        raise ValueError(f"on_hosts: every host needs shards of its own, got {hosts}")
    blocked = frozenset(p for pair in shape.blocked
                        for p in pairs_between(*(shards[k] for k in sorted(pair))))
    return Partition(
        shape.kind, tuple(sorted(every)), blocked,
        f"{shape.description} over hosts "
        + ", ".join(f"{k}={name}{_side(ns)}" for k, (name, ns) in enumerate(hosts, 1)),
        tuple(shards[k] for k in sorted(shards)),
    )


def _ids(nodes: Iterable[int], least: int, shape: str) -> list[int]:
    ids = sorted(nodes)
    if len(set(ids)) != len(ids):
        raise ValueError(f"{shape}: node ids {ids} repeat")
    if len(ids) < least:
        raise ValueError(f"{shape} needs at least {least} nodes, got {ids}")
    return ids


def _side(nodes: Iterable[int]) -> str:
    return "[" + ", ".join(str(n) for n in sorted(nodes)) + "]"


def halves(nodes: Iterable[int], rng: random.Random) -> Partition:
    """Split the nodes at random into two sides of sizes floor(n/2) and ceil(n/2)."""
    ids = _ids(nodes, 2, "halves")
    rng.shuffle(ids)
    small, large = ids[: len(ids) // 2], ids[len(ids) // 2 :]
    return Partition(
        "halves", tuple(sorted(ids)), pairs_between(small, large),
        f"halves {_side(small)} | {_side(large)}",
    )


def isolate(nodes: Iterable[int], rng: random.Random, node: int | None = None) -> Partition:
    """Cut `node` (a random one when None) from every other node."""
    ids = _ids(nodes, 2, "isolate")
    if node is None:
        node = rng.choice(ids)
    elif node not in ids:
        raise ValueError(f"isolate: node {node} is not one of {ids}")
    others = [n for n in ids if n != node]
    return Partition("isolate", tuple(ids), pairs_between([node], others), f"isolate {node}")


def bridge(nodes: Iterable[int], rng: random.Random) -> Partition:
    """Two halves that cannot see each other, joined by one node that sees both.

    With an odd count each half plus the bridge is a majority, so either side can elect a
    leader with the bridge node's vote while the old leader on the other side still sees
    a majority too: leadership can flap, and stale leaders meet new terms late.
    """
    ids = _ids(nodes, 3, "bridge")
    rng.shuffle(ids)
    middle, rest = ids[0], ids[1:]
    left, right = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    return Partition(
        "bridge", tuple(sorted(ids)), pairs_between(left, right),
        f"bridge {_side(left)} <- {middle} -> {_side(right)}",
    )


def majority_ring(nodes: Iterable[int], rng: random.Random) -> Partition:
    """Nodes on a random ring; each sees those within radius r, so its view is a majority.

    Jepsen's majorities-ring gives each node exactly a majority with one-way drops; links
    here are symmetric, so the radius is the smallest one whose window (2r + 1 nodes) holds
    a majority. Windows of different nodes differ whenever 2r + 1 < n, which holds for
    every n >= 4. With 3 nodes the radius-1 window is the whole cluster and nothing would
    be blocked, so the ring degenerates to its 3-node equivalent, a bridge: one pair
    blocked, every node sees a majority (itself and the middle node) and the three views
    still differ.
    """
    ids = _ids(nodes, 3, "majority-ring")
    rng.shuffle(ids)
    n = len(ids)
    if n == 3:
        left, middle, right = ids
        return Partition(
            "majority-ring", tuple(sorted(ids)), pairs_between([left], [right]),
            f"majority ring of 3 = bridge [{left}] <- {middle} -> [{right}]",
        )
    radius = majority(n) // 2  # = ceil((m - 1) / 2): the window 2r + 1 >= m
    blocked = frozenset(
        frozenset((ids[a], ids[b]))
        for a, b in combinations(range(n), 2)
        if min(b - a, n - (b - a)) > radius
    )
    ring = "-".join(str(x) for x in ids)
    return Partition(
        "majority-ring", tuple(sorted(ids)), blocked, f"majority ring {ring} (radius {radius})"
    )

