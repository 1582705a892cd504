"""Scripted scenarios on the simulator's own network and disks, for the paper's figures.

Nothing happens on its own: no ticks, no timed deliveries. A script ticks a node until
it campaigns, delivers or drops the messages it names, crashes and restarts nodes, and
every checker runs after each action, exactly as in a random run:

    s = Script(5, max_append_bytes=1)
    s.campaign(1)
    s.stabilize()                    # deliver until quiet
    s.propose(1, b"x")
    s.stabilize(among={1, 2})        # only S1 and S2 talk
    s.drop(src=1)
    s.crash(1)

Fsyncs complete at once unless `auto_sync=False` (then `sync(node)` completes them).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

from raftlog.sim.cluster import Cluster, SimNode
from raftlog.sim.knobs import Knobs
from raftlog.types import Entry, Message, MsgType, Role

__all__ = ["Script"]

_VOTE_REQUESTS = frozenset({MsgType.PREVOTE, MsgType.VOTE})
_VOTE_TRAFFIC = frozenset({MsgType.PREVOTE, MsgType.VOTE, MsgType.PREVOTE_RESP, MsgType.VOTE_RESP})


class Script:
    def __init__(
        self,
        nodes: int = 3,
        *,
        seed: int = 0,
        mutation: str | None = None,
        auto_sync: bool = True,
        core: ModuleType | None = None,
        disable: Collection[str] = (),
        **config: Any,
    ) -> None:
        rng = random.Random(seed)
        fixed: dict[str, Any] = {
            "election_ticks": 10,
            "heartbeat_ticks": 1,
            "max_append_bytes": 1 << 20,
            "max_inflight": 64,
            "check_quorum": False,
            "pre_vote": False,
            "preferred_leader": None,
            "reconfig": False,
            "drop_p": 0.0,
            "dup_p": 0.0,
            "reorder_p": 0.0,
        }
        fixed.update(config)
        knobs = Knobs.draw(rng, seed, nodes, mutation, **fixed)
        self.auto_sync = auto_sync
        self.c = Cluster(knobs, rng, core=core, manual=True, disable=disable)
        self.transcript: list[str] = []
        self._settle()

    # ------------------------------------------------------------------ views

    def node(self, i: int) -> SimNode:
        return self.c.nodes[i]

    def raft(self, i: int) -> Any:
        return self.c.nodes[i].raft

    def log(self, i: int) -> list[tuple[int, int]]:
        """(index, term) of every entry held in node i's log."""
        return [(e.index, e.term) for e in self.c.nodes[i].store.log if e is not None]

    def entry(self, i: int, index: int) -> Entry:
        e = self.c.nodes[i].store.entry(index)
        if e is None:
            raise IndexError(f"node {i} holds no entry {index}")
        return e

    def pending(self, **match: Any) -> list[Message]:
        return [m for m in self.c.net.pending() if _matches(m, **match)]

    # ------------------------------------------------------------------ actions

    def tick(self, i: int, times: int = 1) -> None:
        for _ in range(times):
            self.c.nodes[i].tick()
            self._settle()

    def campaign(self, i: int) -> None:
        """Tick node i until its election timer fires and it asks for (pre-)votes; the
        other nodes' timers stand still."""
        raft = self.raft(i)
        asked = len(self.pending(src=i, type=_VOTE_REQUESTS))
        for _ in range(4 * raft.cfg.election_ticks):
            self.tick(i)
            if raft.role == Role.LEADER or len(self.pending(src=i, type=_VOTE_REQUESTS)) > asked:
                self.transcript.append(f"campaign {i}: {raft.role.name} t{raft.term}")
                return
        raise AssertionError(f"node {i} never campaigned")

    def elect(self, i: int, among: Collection[int], tries: int = 5) -> None:
        """Campaign with node i, only `among` exchanging votes, until it leads."""
        for _ in range(tries):
            self.campaign(i)
            self.stabilize(among=among, type=_VOTE_TRAFFIC)
            if self.raft(i).role == Role.LEADER:
                return
        raise AssertionError(f"node {i} did not win an election among {sorted(among)}")

    def deliver(self, **match: Any) -> list[Message]:
        """Deliver the pending messages that match (src=, dst=, type=, among=, where=)."""
        msgs = self.c.net.take(lambda m: _matches(m, **match))
        for m in msgs:
            node = self.c.nodes.get(m.dst)
            if node is None or not node.up:
                self.transcript.append(f"lost {m.describe()}")
                continue
            self.transcript.append(m.describe())
            self.c.deliver(m)
            self._settle()
        return msgs

    def redeliver(self, msg: Message) -> None:
        """Deliver a copy of an already delivered message (the network duplicated it)."""
        self.transcript.append(f"again {msg.describe()}")
        self.c.deliver(msg)
        self._settle()

    def drop(self, **match: Any) -> list[Message]:
        msgs = self.c.net.take(lambda m: _matches(m, **match))
        self.transcript.extend(f"drop {m.describe()}" for m in msgs)
        return msgs

    def stabilize(self, limit: int = 1000, **match: Any) -> int:
        """Deliver matching messages, and what they provoke, until none is left."""
        delivered = 0
        for _ in range(limit):
            got = self.deliver(**match)
            if not got:
                return delivered
            delivered += len(got)
        raise AssertionError("the scripted cluster did not settle")

    def propose(self, i: int, data: bytes) -> int:
        index = self.c.call(self.c.nodes[i], lambda raft: raft.propose(data))
        self.transcript.append(f"propose {i} {data!r} -> {index}")
        self._settle()
        return index

    def crash(self, i: int, *, torn: bool = False) -> None:
        self.transcript.append(f"crash {i}")
        self.c.crash(self.c.nodes[i], torn=torn)
        self.c.check()

    def restart(self, i: int) -> None:
        self.transcript.append(f"restart {i}")
        self.c.restart(self.c.nodes[i])
        self._settle()

    def sync(self, i: int) -> None:
        self.c.nodes[i].sync_now()
        self.c.check()

    def _settle(self) -> None:
        if self.auto_sync:
            for node in self.c.live:
                node.sync_now()
        self.c.check()


def _matches(
    m: Message,
    *,
    src: int | None = None,
    dst: int | None = None,
    type: MsgType | Collection[MsgType] | None = None,
    among: Collection[int] | None = None,
    where: Callable[[Message], bool] | None = None,
) -> bool:
    if src is not None and m.src != src:
        return False
    if dst is not None and m.dst != dst:
        return False
    if type is not None and (m.type != type if isinstance(type, MsgType) else m.type not in type):
        return False
    if among is not None and (m.src not in among or m.dst not in among):
        return False
    return where is None or where(m)
