"""A simulated network: one queue per (src, dst) path, ordered by delivery time.

Messages are the core's frozen `Message` values, delivered as-is. Faults: loss,
duplication, delay, reordering (a reordered message skips the path's FIFO floor) and
partitions of any shape, given as the set of blocked directed links. A partition is
checked at delivery, so a message in flight when a link breaks is lost with it.

In `hold` mode nothing is delivered on its own: a scenario script picks messages from
the paths (`pending`, `take`) and delivers them itself.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from raftlog.types import Message

__all__ = [
    "NetStats",
    "SimNetwork",
    "bridge",
    "isolate",
    "one_way",
    "ring",
    "split",
    "split_between",
]

Link = tuple[int, int]


@dataclass
class NetStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0  # random loss
    duplicated: int = 0
    cut: int = 0  # lost to a partition or a dead/paused destination
    partitions: dict[str, int] = field(default_factory=dict)


class SimNetwork:
    def __init__(
        self,
        rng: random.Random,
        *,
        latency_min_us: int = 1_000,
        latency_max_us: int = 5_000,
        drop_p: float = 0.0,
        dup_p: float = 0.0,
        reorder_p: float = 0.0,
        hold: bool = False,
    ) -> None:
        self.rng = rng
        self.latency_min_us = latency_min_us
        self.latency_max_us = latency_max_us
        self.drop_p = drop_p
        self.dup_p = dup_p
        self.reorder_p = reorder_p
        self.hold = hold
        self.paths: dict[Link, list[tuple[int, int, Message]]] = {}
        self._timeline: list[tuple[int, int, Link]] = []  # (at, seq, path) of every message
        self._taken: set[int] = set()  # seqs removed out of order by a script
        self._floor: dict[Link, int] = {}  # FIFO: next delivery on a path not before this
        self._seq = 0
        self.blocked: frozenset[Link] = frozenset()
        self.partition_name: str | None = None
        self.stats = NetStats()

    # ------------------------------------------------------------------ sending

    def send(self, msg: Message, now: int) -> None:
        self.stats.sent += 1
        rng = self.rng
        if self.drop_p and rng.random() < self.drop_p:
            self.stats.dropped += 1
            return
        self._enqueue(msg, now)
        if self.dup_p and rng.random() < self.dup_p:
            self.stats.duplicated += 1
            self._enqueue(msg, now)

    def _enqueue(self, msg: Message, now: int) -> None:
        path = (msg.src, msg.dst)
        if self.hold:
            at = now
        else:
            at = now + self.rng.randint(self.latency_min_us, self.latency_max_us)
            if not (self.reorder_p and self.rng.random() < self.reorder_p):
                floor = self._floor.get(path, 0)
                if at < floor:
                    at = floor
                self._floor[path] = at
        self._seq += 1
        queue = self.paths.get(path)
        if queue is None:
            queue = self.paths[path] = []
        heapq.heappush(queue, (at, self._seq, msg))
        heapq.heappush(self._timeline, (at, self._seq, path))

    # ------------------------------------------------------------------ delivery

    def next_time(self) -> int | None:
        """When the earliest queued message is due (None when the network is idle)."""
        tl = self._timeline
        while tl and tl[0][1] in self._taken:
            self._taken.discard(heapq.heappop(tl)[1])
        return tl[0][0] if tl else None

    def pop(self) -> Message | None:
        """Remove the earliest message; None when a partition swallowed it."""
        self.next_time()  # skip entries a script already took
        _at, _seq, path = heapq.heappop(self._timeline)
        _at, _seq, msg = heapq.heappop(self.paths[path])
        if path in self.blocked:
            self.stats.cut += 1
            return None
        return msg

    def defer(self, msg: Message, at: int) -> None:
        """Requeue a message for a destination that cannot take it before `at` (paused)."""
        self._seq += 1
        path = (msg.src, msg.dst)
        heapq.heappush(self.paths.setdefault(path, []), (at, self._seq, msg))
        heapq.heappush(self._timeline, (at, self._seq, path))

    # ------------------------------------------------------------------ scripting

    def pending(self, src: int | None = None, dst: int | None = None) -> list[Message]:
        """Queued messages (optionally of one source/destination), in delivery order."""
        out = [
            item
            for path, queue in self.paths.items()
            if (src is None or path[0] == src) and (dst is None or path[1] == dst)
            for item in queue
        ]
        return [m for _at, _seq, m in sorted(out, key=lambda item: (item[0], item[1]))]

    def take(self, keep: Callable[[Message], bool]) -> list[Message]:
        """Remove and return every queued message `keep` accepts, in delivery order."""
        taken: list[tuple[int, int, Message]] = []
        for queue in self.paths.values():
            kept = [item for item in queue if not keep(item[2])]
            if len(kept) != len(queue):
                taken.extend(item for item in queue if keep(item[2]))
                heapq.heapify(kept)
                queue[:] = kept
        taken.sort(key=lambda item: (item[0], item[1]))
        self._taken.update(seq for _at, seq, _m in taken)
        return [m for _at, _seq, m in taken]

    def in_flight(self) -> int:
        return sum(len(q) for q in self.paths.values())

    # ------------------------------------------------------------------ partitions

    def partition(self, name: str, blocked: Iterable[Link]) -> None:
        self.blocked = frozenset(blocked)
        self.partition_name = name
        self.stats.partitions[name] = self.stats.partitions.get(name, 0) + 1

    def heal(self) -> None:
        self.blocked = frozenset()
        self.partition_name = None

    def faults_off(self) -> None:
        """Liveness phase: heal, and stop losing, duplicating or reordering messages."""
        self.heal()
        self.drop_p = self.dup_p = self.reorder_p = 0.0


# ---------------------------------------------------------------------- partition shapes


def _cut(a: Iterable[int], b: Iterable[int]) -> set[Link]:
    b = tuple(b)
    return {(x, y) for x in a for y in b if x != y} | {(y, x) for x in a for y in b if x != y}


def split_between(a: Sequence[int], b: Sequence[int]) -> set[Link]:
    """Groups a and b cannot reach each other; inside each group all links work."""
    return _cut(a, b)


def isolate(nodes: Sequence[int], victim: int) -> set[Link]:
    """One node can neither send nor receive."""
    return _cut([victim], [n for n in nodes if n != victim])


def split(nodes: Sequence[int], rng: random.Random) -> set[Link]:
    """Two halves (sizes k and n-k, 1 <= k <= n/2) that cannot reach each other."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    k = rng.randint(1, len(shuffled) // 2)
    return _cut(shuffled[:k], shuffled[k:])


def one_way(nodes: Sequence[int], rng: random.Random) -> set[Link]:
    """Asymmetric: one node's messages out (or in) are lost, the other direction works."""
    victim = rng.choice(list(nodes))
    others = [n for n in nodes if n != victim]
    if rng.random() < 0.5:
        return {(victim, o) for o in others}
    return {(o, victim) for o in others}


def bridge(nodes: Sequence[int], rng: random.Random) -> set[Link]:
    """Two sides that reach each other only through one bridge node."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    middle = len(shuffled) // 2
    left, right = shuffled[:middle], shuffled[middle + 1 :]
    return _cut(left, right)


def ring(nodes: Sequence[int], rng: random.Random) -> set[Link]:
    """Each node reaches only its ring neighbours: with five, everyone sees a majority
    but no two nodes see the same one. With fewer than five, cut one random link pair."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    n = len(shuffled)
    if n < 5:
        a, b = shuffled[0], shuffled[1]
        return {(a, b), (b, a)}
    near = {(shuffled[i], shuffled[(i + d) % n]) for i in range(n) for d in (1, -1)}
    return {(x, y) for x in shuffled for y in shuffled if x != y and (x, y) not in near}
