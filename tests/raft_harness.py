"""A readable, synchronous harness for scripting Raft scenarios against the real core.

Messages wait in a mailbox until a test delivers, drops or filters them, so a scenario
reads like the paper's figures: `campaign 1`, `deliver`, `isolate 3`, `stabilize`.
Storage is the simulator's in-memory disk: `persist()` is an fsync, `crash()` drops what
was never fsynced. Each node's state machine is the list of MESSAGES payloads it applied
(`state`); `snapshot(i)` saves it at node i's applied index and compacts its log, and a
snapshot a leader sends is installed at once, or held until `install(i)` when
`auto_install` is off. `lose_state(i)` restarts node i without its snapshot and state
but with its log, as a node whose snapshot was damaged starts. `corrupt(i, index)` damages an entry on node i's disk; the core
lists it in `Ready.repair` once it meets it (`to_repair`), and `repair(i)` copies the
entries it awaits from a peer that holds them intact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from raftlog.core import RaftConfig, RaftNode
from raftlog.driver import carry_out
from raftlog.sim.disk import SimStore
from raftlog.types import (
    Entry,
    EntryType,
    HardState,
    Membership,
    Message,
    ReadState,
    Role,
    Snapshot,
)


class Cluster:
    def __init__(
        self,
        n: int = 3,
        *,
        seed: int = 1,
        auto_persist: bool = True,
        config: Callable[[int], RaftConfig] | None = None,
        voters: Iterable[int] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.config = config or (lambda i: RaftConfig())
        self.auto_persist = auto_persist
        self.auto_install = True
        self.installing: dict[int, Snapshot] = {}  # handed out, held back (auto_install off)
        self.installed: dict[int, list[Snapshot]] = {}
        self.state: dict[int, list[bytes]] = {}
        self.stores: dict[int, SimStore] = {}
        self.nodes: dict[int, RaftNode] = {}
        self.mailbox: list[Message] = []
        self.applied: dict[int, list[Entry]] = {}
        self.reads: dict[int, list] = {}
        self.to_repair: dict[int, list[int]] = {}
        self.cut: set[tuple[int, int]] = set()
        members = Membership(frozenset(voters or range(1, n + 1)))
        for i in range(1, n + 1):
            self.stores[i] = SimStore(HardState(configs=((0, 0, members),)))
            self.start(i)

    def start(self, i: int, *, stateless: bool = False) -> None:
        st = self.stores[i]
        snap = st.snapshot
        self.nodes[i] = RaftNode(
            i, st, st.hard_state, self.config(i), rng=random.Random(self.rng.random()),
            applied=snap.index if snap is not None else 0, stateless=stateless,
        )
        self.state[i] = _decode_state(snap.data) if snap is not None else []
        if snap is not None:
            self.nodes[i].set_snapshot(snap)
        for index in sorted(st.corrupt):  # found at open, as the runtime's verify does
            self.nodes[i].entry_unreadable(index)
        self.applied[i] = []
        self.reads.setdefault(i, [])
        self.installed.setdefault(i, [])
        self.installing.pop(i, None)

    def crash(self, i: int) -> None:
        self.stores[i].crash()
        del self.nodes[i]
        self.mailbox = [m for m in self.mailbox if m.dst != i and m.src != i]

    def lose_state(self, i: int) -> None:
        """Crash node i and start it again with its log but without its snapshot."""
        self.crash(i)
        self.stores[i].snapshot = None
        self.start(i, stateless=True)

    def process(self, i: int) -> None:
        """Carry out node i's next Ready with the driver the runtime and simulator use."""
        node = self.nodes.get(i)
        if node is None:
            return
        rd = node.ready()
        if rd.snapshot is not None:
            assert not rd.entries and not rd.apply
        carry_out(rd, _NodeShell(self, i))
        if self.auto_persist:
            self.persist(i)

    def _installed(self, i: int) -> None:
        snap = self.installing.pop(i)
        assert snap.base is not None
        if not snap.keep_log:
            self.stores[i].reset_to(*snap.base)
        self.state[i] = _decode_state(snap.data)
        self.installed[i].append(snap)
        self.nodes[i].snapshot_installed(snap.index, snap.term)

    def install(self, i: int) -> None:
        """Finish the install held back for node i (auto_install off)."""
        self._installed(i)
        self.process(i)

    def snapshot(self, i: int, keep: int = 0) -> Snapshot:
        """Node i snapshots its state at its applied index and compacts its log up to
        there (minus `keep` entries), as the runtime's retention does."""
        node, st = self.nodes[i], self.stores[i]
        snap = Snapshot(node.applied, node.term_at(node.applied), _encode_state(self.state[i]),
                        node.membership_at(node.applied))
        st.save_snapshot(snap)
        node.set_snapshot(snap)
        upto = min(snap.index, st.durable_len) - keep
        if upto > st.base[0]:
            st.compact(upto)
        return snap

    def persist(self, i: int) -> None:
        st = self.stores[i]
        if st.unsynced:
            st.begin_sync()
            durable = st.finish_sync()
            self.nodes[i].persisted(durable, st.term(durable))

    def process_all(self) -> None:
        for _ in range(3):
            for i in list(self.nodes):
                self.process(i)

    def isolate(self, i: int) -> None:
        for j in self.stores:
            if j != i:
                self.cut |= {(i, j), (j, i)}

    def heal(self) -> None:
        self.cut.clear()

    def deliver(self, keep: Callable[[Message], bool] = lambda m: True) -> int:
        """Deliver every queued message `keep` accepts (others are dropped). Returns count."""
        self.process_all()
        batch, self.mailbox = self.mailbox, []
        n = 0
        for m in batch:
            if (m.src, m.dst) in self.cut or m.dst not in self.nodes or not keep(m):
                continue
            self.nodes[m.dst].step(m)
            self.process(m.dst)
            n += 1
        self.process_all()
        return n

    def stabilize(self, limit: int = 200) -> None:
        for _ in range(limit):
            if not self.deliver():
                return
        raise AssertionError("cluster did not stabilize")

    def tick(self, times: int = 1, only: Iterable[int] | None = None) -> None:
        for _ in range(times):
            for i in list(only or self.nodes):
                if i in self.nodes:
                    self.nodes[i].tick()
            self.stabilize()

    def campaign(self, i: int) -> None:
        """Make node i time out now (the rest keep their timers)."""
        node = self.nodes[i]
        term, role = node.term, node.role
        for _ in range(node.cfg.election_ticks * 2):
            node.tick()
            if node.term != term or node.role != role:
                break
        self.stabilize()

    def leader(self) -> RaftNode:
        leaders = [n for n in self.nodes.values() if n.role == Role.LEADER]
        assert len(leaders) == 1, [n.describe() for n in self.nodes.values()]
        return leaders[0]

    def elect(self) -> RaftNode:
        for _ in range(100):
            leaders = [n for n in self.nodes.values() if n.role == Role.LEADER]
            if len(leaders) == 1:
                lead = leaders[0]
                members = [self.nodes[i] for i in lead.membership.members if i in self.nodes]
                if all(n.leader == lead.id for n in members):
                    return lead
            self.tick()
        raise AssertionError("no leader elected")

    def propose(self, data: bytes, type: EntryType = EntryType.MESSAGES) -> int:
        leader = self.leader()
        index = leader.propose(data, type)
        self.stabilize()
        return index

    def corrupt(self, i: int, index: int) -> None:
        assert self.stores[i].corrupt_entry(index)

    def repair(self, i: int) -> list[int]:
        """Copy every entry node i awaits from a peer holding it intact; the repaired."""
        node, st = self.nodes[i], self.stores[i]
        done = []
        for index in sorted(node.unreadable):
            for j, peer in self.stores.items():
                good = peer.readable(index) if j != i else None
                if good is not None and st.repair(index, good):
                    node.entry_repaired(index)
                    done.append(index)
                    break
        return done

    def payloads(self, i: int) -> list[bytes]:
        return [e.data for e in self.applied[i] if e.type == EntryType.MESSAGES]


class _NodeShell:
    """Node i's shell in the harness: disk in memory, messages to the mailbox."""

    def __init__(self, c: Cluster, i: int) -> None:
        self.c, self.i = c, i

    def save_hard_state(self, hs: HardState) -> None:
        self.c.stores[self.i].save_hard_state(hs)

    def install_snapshot(self, snap: Snapshot) -> None:
        self.c.stores[self.i].save_snapshot(snap)
        self.c.installing[self.i] = snap
        if self.c.auto_install:
            self.c._installed(self.i)

    def store_entries(self, entries: list[Entry]) -> None:
        self.c.stores[self.i].append(entries)

    def send_message(self, m: Message) -> None:
        self.c.mailbox.append(m)

    def apply_entries(self, entries: list[Entry]) -> None:
        self.c.applied[self.i].extend(entries)
        self.c.state[self.i].extend(e.data for e in entries if e.type == EntryType.MESSAGES)

    def answer_read(self, read: ReadState) -> None:
        self.c.reads[self.i].append(read)

    def fetch_for_repair(self, indexes: list[int]) -> None:
        self.c.to_repair.setdefault(self.i, []).extend(indexes)


def _encode_state(payloads: list[bytes]) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def _decode_state(data: bytes) -> list[bytes]:
    out, k = [], 0
    while k < len(data):
        n = int.from_bytes(data[k : k + 4], "big")
        out.append(data[k + 4 : k + 4 + n])
        k += 4 + n
    return out
