"""Clients: propose unique payloads to whoever leads (following NotLeader hints), ask
for ReadIndex reads, move leadership and, when enabled, change the membership one
server at a time (add a learner, promote it once caught up, remove a voter). The
operator's part: now and then a replica snapshots its state machine and compacts its
log (not bounded by what followers lack, unlike real retention: the point is to make
leaders send snapshots).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from raftlog.sim.cluster import Cluster, SimNode

__all__ = ["Workload"]


class Workload:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.c = cluster
        self.rng = rng
        self.active = True
        self.guess: int | None = None  # where the client thinks the leader is
        self.proposed = 0
        self.read_ids = 0
        k = cluster.knobs
        self._ops: dict[str, Callable[[], None]] = {
            "propose": self.propose,
            "read": self.read,
            "transfer": self.transfer,
            "reconfig": self.reconfig,
            "compact": self.compact,
        }
        weights = [
            (n, w) for n, w in k.op_weights if (n != "reconfig" or k.reconfig) and w > 0
        ]
        self._names = [n for n, _ in weights]
        self._weights = [w for _, w in weights]
        self._max_id = k.nodes
        self._max_nodes = k.nodes + 3

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        mean = self.c.knobs.client_mean_us
        self.c.events.push(self.c.now + int(self.rng.expovariate(1 / mean)) + 1, self._act)

    def _act(self) -> None:
        if not self.active:
            return
        self._ops[self.rng.choices(self._names, self._weights)[0]]()
        self._schedule()

    # ------------------------------------------------------------------ targets

    def _target(self) -> SimNode | None:
        """The guessed leader if reachable, else any live replica."""
        node = self.c.nodes.get(self.guess) if self.guess is not None else None
        if node is None or not node.up or node.retired or node.paused:
            live = [n for n in self.c.live if not n.paused]
            node = self.rng.choice(live) if live else None
        return node

    def _on_leader(self, fn: Callable[[Any], object]) -> object:
        """Call `fn` on the guessed leader; on NotLeader follow the hint once."""
        core = self.c.core
        for _ in range(2):
            node = self._target()
            if node is None:
                return None
            try:
                result = self.c.call(node, fn)
            except core.NotLeader as e:
                self.guess = e.leader
                continue
            except core.ProposalDropped:
                return None
            self.guess = node.id
            return result
        return None

    # ------------------------------------------------------------------ operations

    def propose(self) -> None:
        self.proposed += 1
        pad = self.rng.randbytes(self.rng.randint(0, self.c.knobs.payload_max))
        data = b"%d:%d:" % (self.c.knobs.seed, self.proposed) + pad
        if self._on_leader(lambda raft: raft.propose(data)) is not None:
            self.c.faults.proposals += 1
            self.c.note("propose", (self.guess, data[:16]))

    def read(self) -> None:
        self.read_ids += 1
        rid = self.read_ids
        node_box: list[SimNode] = []

        def ask(raft: object) -> bool:
            raft.read_index(rid)  # type: ignore[attr-defined]
            node_box.append(self.c.nodes[raft.id])  # type: ignore[attr-defined]
            return True

        if self._on_leader(ask):
            self.c.faults.reads += 1
            self.c.read_requested(node_box[-1], rid)

    def transfer(self) -> None:
        leaders = self.c.leaders()
        if not leaders:
            return
        leader = leaders[0]
        voters = sorted(leader.raft.membership.voters - {leader.id})
        if not voters:
            return
        target = self.rng.choice(voters)
        try:
            self.c.call(leader, lambda raft: raft.transfer_leadership(target))
        except (self.c.core.NotLeader, ValueError):
            return
        self.c.faults.transfers += 1
        self.c.note("transfer", (leader.id, target))

    def compact(self) -> None:
        """Snapshot a replica at its applied index and drop its log up to there (or keep
        a few entries, as retention keeps whole segments)."""
        live = [n for n in self.c.live if not n.paused]
        if not live or not hasattr(self.c.core.RaftNode, "set_snapshot"):
            return
        node = self.rng.choice(live)
        snap = node.take_snapshot(keep=self.rng.choice((0, 0, 1, 4, 16)))
        if snap is not None:
            self.c.faults.snapshots += 1
            self.c.note("snapshot", (node.id, snap.describe()))

    def reconfig(self) -> None:
        """One single-server change: promote a learner, else add one, else remove a voter."""
        leaders = self.c.leaders()
        if not leaders:
            return
        leader = leaders[0]
        m = leader.raft.membership
        core = self.c.core
        if m.learners:
            target = min(m.learners)
            op, fn = "promote", (lambda raft: raft.promote(target))
        elif len(m.voters) <= self.c.knobs.nodes and len(self.c.nodes) < self._max_nodes:
            self._max_id += 1
            target = self._max_id
            op, fn = "add_learner", (lambda raft: raft.add_learner(target))
        elif len(m.voters) > 3:
            target = self.rng.choice(sorted(m.voters))
            op, fn = "remove", (lambda raft: raft.remove(target))
        else:
            return
        try:
            index = self.c.call(leader, fn)
        except (core.NotLeader, core.ProposalDropped, ValueError):
            return
        self.c.faults.reconfigs += 1
        self.c.note("reconfig", f"{op} {target} at {index}")
        if op == "add_learner":
            self.c.add_node(target)
