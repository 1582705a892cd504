"""Fault injection: every so often pick a fault by weight and schedule its undoing.

Only faults Raft promises to survive: crashes that lose unsynced writes (optionally
with a torn tail), process pauses, network partitions of every shape, replaced disks,
entries corrupted on one disk while peers hold them intact, and states lost (a node
restarts with its log but without its snapshot, as a damaged snapshot file leaves it, one
node at a time). Each action is a table entry, name → handler; the knobs' weights choose among them.

A replaced disk (`wipe`) loses the log, the snapshot and the state machine, and the node
comes back empty, to be caught up by a snapshot or the log. It keeps its hard state
(term and vote): a node that forgot its vote could vote twice in one term and elect two
leaders, so whoever replaces a disk must carry the small hard-state file over. Even so,
losing a voter's log is only survivable while what it acknowledged is not needed from
it: a Raft commit counts this node's acknowledgement, and its vote, granted with an empty
log, no longer defends what it held. So a voter is wiped only while a quorum of the
*other* voters durably hold its last durable entry (hence, by Log Matching, its whole
durable log), and only in groups whose membership never changes (which quorum counts is
then fixed). That is the operational rule too: replace one disk at a time, once the
rest of the group holds its data.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from raftlog.sim import network
from raftlog.sim.cluster import Cluster, SimNode

__all__ = ["Nemesis"]


class Nemesis:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.c = cluster
        self.rng = rng
        self.active = True
        self._partition_gen = 0
        self._links = random.Random(f"link-drops/{cluster.knobs.seed}/nemesis")
        self._corrupts = random.Random(f"corruption/{cluster.knobs.seed}/nemesis")
        self._losses = random.Random(f"lost-state/{cluster.knobs.seed}/nemesis")
        self._actions: dict[str, Callable[[], None]] = {
            "crash": self.crash,
            "crash_leader": self.crash_leader,
            "crash_majority": self.crash_majority,
            "pause": self.pause,
            "isolate": self.isolate,
            "isolate_leader": self.isolate_leader,
            "split": lambda: self._partition("split", network.split(self._ids(), self.rng)),
            "one_way": lambda: self._partition("one_way", network.one_way(self._ids(), self.rng)),
            "bridge": lambda: self._partition("bridge", network.bridge(self._ids(), self.rng)),
            "ring": lambda: self._partition("ring", network.ring(self._ids(), self.rng)),
            "heal": self.heal,
            "wipe": self.wipe,
        }
        weights = cluster.knobs.fault_weights
        unknown = {name for name, _ in weights} - self._actions.keys()
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}")
        self._names = [name for name, _ in weights]
        self._weights = [w for _, w in weights]

    def start(self) -> None:
        self._schedule()
        if self.c.knobs.flap_p:
            self.c.on_new_leader.append(self._new_leader)
        if self.c.knobs.link_drop_mean_us:
            self._schedule_link_drop()
        if self.c.knobs.corrupt_mean_us:
            self._schedule_corruption()
        if self.c.knobs.lose_state_mean_us:
            self._schedule_state_loss()

    def _schedule_state_loss(self) -> None:
        mean = self.c.knobs.lose_state_mean_us
        self.c.events.push(
            self.c.now + int(self._losses.expovariate(1 / mean)) + 1, self._lose_state
        )

    def _lose_state(self) -> None:
        """Crash one replica and start it again without its snapshot and state, its log
        kept (it rebuilds from a leader's snapshot, or from a log that begins at entry
        1). One at a time: a group whose every replica lost its state and whose logs
        were compacted has nothing left to rebuild from. Its own PRNG keeps the other
        faults of a seed where they were."""
        if not self.active:
            return
        self._schedule_state_loss()
        if any(self._stateless(n) for n in self.c.nodes.values()):
            return
        # what a replica holds only in its state (its compacted prefix) must be held by
        # a quorum of the others, as for a wiped disk
        up = [n for n in self.c.live if not n.retired
              and self._held_by_quorum_of_others(n, *self._only_in_state(n))]
        if not up:
            return
        node = self._losses.choice(up)
        self.c.crash(node)
        node.lose_state = True
        self.c.faults.states_lost += 1
        self.c.note("lose-state", node.id)
        self.c.events.push(
            self.c.now + int(self._losses.expovariate(1 / self.c.knobs.down_mean_us)) + 1,
            self._restart, node)

    def _schedule_corruption(self) -> None:
        mean = self.c.knobs.corrupt_mean_us
        self.c.events.push(
            self.c.now + int(self._corrupts.expovariate(1 / mean)) + 1, self._corrupt
        )

    def _corrupt(self) -> None:
        """Damage one durable entry on one replica's disk, its index and term still known
        (a flipped bit the CRCs catch). Only while a quorum of the other voters hold the
        entry intact and durable, and in groups whose membership never changes: the
        replica repairs it from a peer's copy, which must exist (the simulated retention
        keeps it, see `SimNode.take_snapshot`). Its own PRNG keeps the other faults of a
        seed where they were."""
        if not self.active:
            return
        self._schedule_corruption()
        if self.c.knobs.reconfig:
            return
        nodes = [n for n in self.c.nodes.values() if not n.retired and n.store.durable_len]
        if not nodes:
            return
        node = self._corrupts.choice(nodes)
        st = node.store
        lo, hi = st.first_index(), st.durable_len
        if lo > hi:
            return
        for _ in range(8):
            index = self._corrupts.randint(lo, hi)
            if index not in st.corrupt and self._held_elsewhere(node, index):
                st.corrupt_entry(index)
                self.c.faults.corruptions += 1
                self.c.note("corrupt", (node.id, index))
                return

    def _held_elsewhere(self, x: SimNode, index: int) -> bool:
        voters = self.c.committed_members.voters
        term = x.store.term(index)
        holders = 0
        for n in self.c.nodes.values():
            if n is x or n.retired or n.id not in voters:
                continue
            st = n.store
            held = st.readable(index) if index <= st.durable_len else None
            holders += held is not None and held.term == term
        return holders >= len(voters) // 2 + 1

    def _schedule_link_drop(self) -> None:
        mean = self.c.knobs.link_drop_mean_us
        self.c.events.push(
            self.c.now + int(self._links.expovariate(1 / mean)) + 1, self._drop_link
        )

    def _drop_link(self) -> None:
        """Break one random connection (a reset, not a partition: it reconnects at once).
        Its own PRNG keeps the other faults of a seed where they were."""
        if not self.active:
            return
        ids = self._ids()
        if len(ids) > 1:
            a, b = self._links.sample(ids, 2)
            self.c.drop_link(a, b)
        self._schedule_link_drop()

    def _new_leader(self, node: SimNode) -> None:
        """Sometimes cut a new leader off before its first entries spread: leaders then
        change while logs are partly replicated (the shape of the paper's Figure 8)."""
        if self.active and self.rng.random() < self.c.knobs.flap_p:
            delay = self.rng.randint(0, 2 * self.c.knobs.latency_max_us)
            self.c.events.push(self.c.now + delay, self._flap, node)

    def _flap(self, node: SimNode) -> None:
        """Put the leader in a minority (alone, or with some followers) for a while."""
        if self.active and node.up and not node.retired:
            ids = self._ids()
            others = [i for i in ids if i != node.id]
            self.rng.shuffle(others)
            side = [node.id, *others[: self.rng.randint(0, max(0, (len(ids) - 1) // 2 - 1))]]
            blocked = network.split_between(side, [i for i in ids if i not in side])
            self._partition("flap", blocked, 2 * self.c.knobs.election_timeout_us)

    def _schedule(self) -> None:
        mean = self.c.knobs.fault_mean_us
        self.c.events.push(self.c.now + int(self.rng.expovariate(1 / mean)) + 1, self._act)

    def _act(self) -> None:
        if not self.active:
            return
        name = self.rng.choices(self._names, self._weights)[0]
        self._actions[name]()
        self._schedule()

    # ------------------------------------------------------------------ helpers

    def _ids(self) -> list[int]:
        return [n.id for n in self.c.nodes.values() if not n.retired]

    def _up(self) -> list[SimNode]:
        return list(self.c.live)

    def _leader(self) -> SimNode | None:
        leaders = self.c.leaders()
        return max(leaders, key=lambda n: n.raft.term) if leaders else None

    def _duration(self, mean: int) -> int:
        return int(self.rng.expovariate(1 / mean)) + 1

    # ------------------------------------------------------------------ processes

    def _crash(self, node: SimNode) -> None:
        k = self.c.knobs
        self.c.crash(node, torn=self.rng.random() < k.torn_p)
        self.c.events.push(self.c.now + self._duration(k.down_mean_us), self._restart, node)

    def _restart(self, node: SimNode) -> None:
        if self.active:
            self.c.restart(node)

    def crash(self) -> None:
        up = self._up()
        if up:
            self._crash(self.rng.choice(up))

    def crash_leader(self) -> None:
        leader = self._leader()
        if leader is not None:
            self._crash(leader)

    def crash_majority(self) -> None:
        """Crash a majority at once (leader included when there is one)."""
        up = self._up()
        want = len(self.c.committed_members.voters) // 2 + 1
        leader = self._leader()
        victims = [leader] if leader is not None else []
        others = [n for n in up if n is not leader]
        self.rng.shuffle(others)
        victims += others[: max(0, want - len(victims))]
        for node in victims:
            self._crash(node)

    def wipe(self) -> None:
        """Replace the disk of a replica whose data the others hold (see the docstring)."""
        if self.c.knobs.reconfig:
            return
        nodes = [n for n in self.c.nodes.values() if not n.retired and self._wipe_safe(n)]
        if not nodes:
            return
        node = self.rng.choice(nodes)
        self.c.wipe(node)
        self.c.events.push(
            self.c.now + self._duration(self.c.knobs.down_mean_us), self._restart, node
        )

    def _wipe_safe(self, x: SimNode) -> bool:
        """What x holds: its durable log, or a snapshot beyond it (a replica refilling
        its log holds the entries up to its snapshot's index only in its state)."""
        st = x.store
        d = st.durable_len
        held = max(self._only_in_state(x), (d, st.term(d) if d else 0))
        return self._held_by_quorum_of_others(x, *held)

    def _held_by_quorum_of_others(self, x: SimNode, d: int, term: int) -> bool:
        """Whether a quorum of the voters other than `x` hold entry `d` (of `term`)
        durably (in their logs, or inside a state they still have)."""
        voters = self.c.committed_members.voters
        if x.id not in voters or d == 0:
            return True
        ledger = self.c.ledger.entries
        committed = d <= len(ledger) and ledger[d - 1].term == term
        holders = 0
        for n in self.c.nodes.values():
            if n is x or n.retired or n.id not in voters:
                continue
            st = n.store
            if d <= st.base[0] or (st.snapshot is not None and d <= st.snapshot.index):
                # inside its snapshot, which is the committed prefix, unless it lost its
                # state (the compacted prefix went with it)
                holders += committed and not self._stateless(n)
            else:
                holders += d <= st.durable_len and st.term(d) == term
        return holders >= len(voters) // 2 + 1

    @staticmethod
    def _only_in_state(n: SimNode) -> tuple[int, int]:
        """The last entry `n` holds in its state but not in its durable log: its
        snapshot's when that lies beyond the log (a refill), else its log's base."""
        st = n.store
        if st.snapshot is not None and st.snapshot.index > st.durable_len:
            return st.snapshot.index, st.snapshot.term
        return st.base

    @staticmethod
    def _stateless(n: SimNode) -> bool:
        return n.lose_state or (n.raft is not None and getattr(n.raft, "stateless", False))

    def pause(self) -> None:
        up = self._up()
        if up:
            node = self.rng.choice(up)
            self.c.pause(node, self.c.now + self._duration(self.c.knobs.down_mean_us))

    # ------------------------------------------------------------------ network

    def _partition(self, name: str, blocked: set[tuple[int, int]], mean: int = 0) -> None:
        self._partition_gen += 1
        self.c.net.partition(name, blocked)
        self.c.faults.partitions += 1
        self.c.note("partition", f"{name} blocks {sorted(blocked)}")
        heal_at = self.c.now + self._duration(mean or self.c.knobs.partition_mean_us)
        self.c.events.push(heal_at, self._heal_gen, self._partition_gen)

    def isolate(self) -> None:
        ids = self._ids()
        self._partition("isolate", network.isolate(ids, self.rng.choice(ids)))

    def isolate_leader(self) -> None:
        leader = self._leader()
        if leader is not None:
            self._partition("isolate_leader", network.isolate(self._ids(), leader.id))

    def _heal_gen(self, gen: int) -> None:
        if gen == self._partition_gen and self.active:
            self.heal()

    def heal(self) -> None:
        if self.c.net.blocked:
            self.c.net.heal()
            self.c.faults.heals += 1
            self.c.note("heal", "")
