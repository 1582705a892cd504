"""Safety checkers: separate observers of the simulated cluster, run after every step.

Each checker watches one property (Raft paper §5.2-§5.4 and Figure 3, plus the
durability promise of DESIGN.md) and keeps whatever incremental state makes checking it
cheap. They only read: a checker never changes the cluster. A broken property raises
`Violation`, naming the invariant and the evidence.

Hooks (all optional): `on_step(cluster)` after every step; `on_send(node, msg)` as a
node sends a message; `on_append(node, entries)` when a node writes entries;
`on_apply(node, entry)`; `on_start(node)` when a node boots or restarts; `on_crash(cluster,
node)` after a crash (or a wipe); `on_read_request(node, rid)` and `on_read(node,
read_state)` for ReadIndex; `on_snapshot(node, snap)` when a node snapshots its state
machine and `on_install(node, snap)` when it installs one from a leader.

Logs may have lost a prefix to compaction or a snapshot install: `SimStore.entry` is None
there. What those entries fed is checked through the snapshots that replaced them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.sim.machine import GENESIS, chain, unpack
from raftlog.types import Entry, EntryType, Membership, Message, MsgType, ReadState, Role, Snapshot

if TYPE_CHECKING:
    from raftlog.sim.cluster import Cluster, SimNode

__all__ = [
    "Checker",
    "CommitLedger",
    "CommittedSurvivesCrash",
    "DurableBeforeSend",
    "ElectionSafety",
    "LeaderCompleteness",
    "Ledger",
    "LogMatching",
    "NodeBounds",
    "ReadIndexLinearizable",
    "ReferencedEntriesHeld",
    "RefillAbandonedOnlyWhenUnsuppliable",
    "StateMachineSafety",
    "Violation",
    "default_checkers",
]


class Violation(Exception):
    """A safety (or liveness) property failed."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class Checker:
    """Base observer: every hook does nothing unless overridden."""

    def on_step(self, cluster: Cluster) -> None: ...

    def on_send(self, node: SimNode, msg: Message) -> None: ...

    def on_append(self, node: SimNode, entries: list[Entry]) -> None: ...

    def on_apply(self, node: SimNode, entry: Entry) -> None: ...

    def on_start(self, node: SimNode) -> None: ...

    def on_crash(self, cluster: Cluster, node: SimNode) -> None: ...

    def on_read_request(self, node: SimNode, request_id: int) -> None: ...

    def on_read(self, node: SimNode, read: ReadState) -> None: ...

    def on_snapshot(self, node: SimNode, snap: Snapshot) -> None: ...

    def on_install(self, node: SimNode, snap: Snapshot) -> None: ...


class Ledger:
    """Every entry known committed (the committed prefix is one sequence), and for each
    term the highest index some node knew committed while in that term."""

    __slots__ = ("entries", "marks", "version")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.marks: dict[int, int] = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.entries)

    def record(self, entry: Entry, who: str) -> None:
        i = entry.index
        known = self.entries
        if i <= len(known):
            old = known[i - 1]
            if old is not entry and old != entry:
                raise Violation(
                    "committed-entry-changed",
                    f"index {i} was committed as {_show(old)} but {who} has {_show(entry)}",
                )
        elif i == len(known) + 1:
            known.append(entry)
            self.version += 1
        else:
            raise Violation("commit-gap", f"{who} committed {i} but only {len(known)} are known")

    def mark(self, term: int, index: int) -> None:
        if index > self.marks.get(term, 0):
            self.marks[term] = index
            self.version += 1

    def committed_before(self, term: int) -> int:
        """Highest index known committed in a term earlier than `term`."""
        return max((i for t, i in self.marks.items() if t < term), default=0)


class CommitLedger(Checker):
    """Feeds the ledger from every node's commit index and applied entries, and checks
    that an index is never committed (or applied) with two different entries."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen: dict[int, int] = {}

    def on_start(self, node: SimNode) -> None:
        self.seen[node.id] = 0

    def on_step(self, cluster: Cluster) -> None:
        ledger = self.ledger
        for node in cluster.live:
            raft = node.raft
            commit = raft.commit
            seen = self.seen.get(node.id, 0)
            if commit > seen:
                log = node.store.log
                if commit > len(log) and not _refilling(node):
                    raise Violation(
                        "commit-beyond-log", f"node {node.id} commit {commit} > last {len(log)}"
                    )
                who = f"node {node.id} (commit {commit}, t{raft.term})"
                for i in range(seen + 1, min(commit, len(log)) + 1):
                    e = log[i - 1]
                    if e is not None:  # else inside a snapshot, checked when it was made
                        ledger.record(e, who)
                ledger.mark(raft.term, commit)
                self.seen[node.id] = commit

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        self.ledger.record(entry, f"node {node.id} (applied)")


class ElectionSafety(Checker):
    """§5.2: at most one leader per term."""

    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}

    def on_step(self, cluster: Cluster) -> None:
        for node in cluster.live:
            raft = node.raft
            if raft.role == Role.LEADER:
                prev = self.leaders.setdefault(raft.term, node.id)
                if prev != node.id:
                    raise Violation(
                        "election-safety", f"nodes {prev} and {node.id} both led term {raft.term}"
                    )


class LogMatching(Checker):
    """§5.3 Log Matching, checked incrementally: an (index, term) pair always names the
    same entry following the same previous term, in every log, at every moment. By
    induction two logs sharing (index, term) are then identical up to there."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, int], tuple[Entry, int]] = {}

    def on_append(self, node: SimNode, entries: list[Entry]) -> None:
        known = self.known
        store = node.store
        for e in entries:
            prev_term = store.term(e.index - 1)
            key = (e.index, e.term)
            seen = known.get(key)
            if seen is None:
                known[key] = (e, prev_term)
            elif (seen[0] is not e and seen[0] != e) or seen[1] != prev_term:
                raise Violation(
                    "log-matching",
                    f"node {node.id} holds {_show(e)} after term {prev_term}; "
                    f"elsewhere {_show(seen[0])} follows term {seen[1]}",
                )


class LeaderCompleteness(Checker):
    """§5.4: an entry committed in term T is in the log of every leader of a later term.
    Checked when a leader appears and again whenever more becomes known committed."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.checked: dict[tuple[int, int], int] = {}  # (term, leader) -> ledger version

    def on_step(self, cluster: Cluster) -> None:
        ledger = self.ledger
        for node in cluster.live:
            raft = node.raft
            if raft.role != Role.LEADER:
                continue
            key = (raft.term, node.id)
            if self.checked.get(key) == ledger.version:
                continue
            self.checked[key] = ledger.version
            index = ledger.committed_before(raft.term)
            if not index:
                continue
            want = ledger.entries[index - 1]
            log = node.store.log
            if index <= node.store.base[0]:
                continue  # inside the leader's snapshot, which is the committed prefix
            have = log[index - 1] if index <= len(log) else None
            if have is None or have.term != want.term:
                raise Violation(
                    "leader-completeness",
                    f"node {node.id} leads term {raft.term} with last {len(log)}"
                    f"@{node.store.term(len(log))} but lacks committed {_show(want)}"
                    f" (has {_show(have) if have else 'nothing'} there)",
                )


class StateMachineSafety(Checker):
    """§5.4.3: every node applies the same entry at each index, in order, across
    restarts (a restarted node resumes after its snapshot, or re-applies from 1).

    Snapshots extend it (paper §7): one taken or installed at index i must be exactly the
    state machine after applying the common sequence up to i (the simulated machine is a
    hash chain, kept here for every index), of the term of entry i, and name the
    membership in force at i; a node restarting from one must resume with that state."""

    def __init__(self, bootstrap: Membership | None = None) -> None:
        self.applied: dict[int, int] = {}
        self.sequence: list[Entry] = []
        self.states: list[bytes] = [GENESIS]  # states[i]: after applying sequence[:i]
        self.bootstrap = bootstrap
        self.configs: list[tuple[int, Membership]] = []  # CONFIG entries in the sequence

    def on_start(self, node: SimNode) -> None:
        self.applied[node.id] = node.applied
        self._check_state(node, node.applied, node.state, "restarted with")

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        expect = self.applied.get(node.id, 0) + 1
        if entry.index != expect:
            raise Violation(
                "apply-order", f"node {node.id} applied {entry.index}, expected {expect}"
            )
        self.applied[node.id] = expect
        seq = self.sequence
        if expect <= len(seq):
            other = seq[expect - 1]
            if other is not entry and other != entry:
                raise Violation(
                    "state-machine-safety",
                    f"node {node.id} applied {_show(entry)} where another applied {_show(other)}",
                )
        else:
            seq.append(entry)
            self.states.append(chain(self.states[-1], entry))
            if entry.type == EntryType.CONFIG:
                self.configs.append((entry.index, Membership.decode(entry.data)))

    def on_snapshot(self, node: SimNode, snap: Snapshot) -> None:
        self._check_snapshot(node, snap, "took")

    def on_install(self, node: SimNode, snap: Snapshot) -> None:
        self._check_snapshot(node, snap, "installed")
        self.applied[node.id] = snap.index

    def _check_snapshot(self, node: SimNode, snap: Snapshot, verb: str) -> None:
        self._check_state(node, snap.index, unpack(snap.data)[0], f"{verb} a snapshot of")
        seq = self.sequence
        if snap.index and seq[snap.index - 1].term != snap.term:
            raise Violation(
                "snapshot-term",
                f"node {node.id} {verb} snapshot {snap.index}@{snap.term}, but entry "
                f"{snap.index} has term {seq[snap.index - 1].term}",
            )
        want = self.membership_at(snap.index)
        if want is not None and snap.membership != want:
            raise Violation(
                "snapshot-membership",
                f"node {node.id} {verb} snapshot {snap.index} naming {snap.membership}, but "
                f"{want} was in force there",
            )

    def _check_state(self, node: SimNode, index: int, state: bytes, what: str) -> None:
        states = self.states
        if index >= len(states):
            raise Violation(
                "state-machine-safety",
                f"node {node.id} {what} state at {index}, beyond anything applied "
                f"({len(states) - 1})",
            )
        if states[index] != state:
            raise Violation(
                "state-machine-safety",
                f"node {node.id} {what} a state at {index} that differs from the state "
                "after applying the committed entries up to there",
            )

    def membership_at(self, index: int) -> Membership | None:
        for i, m in reversed(self.configs):
            if i <= index:
                return m
        return self.bootstrap


class NodeBounds(Checker):
    """Figure 3 bookkeeping: applied <= commit <= last (commit == applied beyond last only
    while refilling after a snapshot); commit never goes backwards on a
    live node; the term never goes backwards, even across restarts; and the hard state on
    disk carries the term the node acts in (persisted before any message is sent)."""

    def __init__(self) -> None:
        self.commit: dict[int, int] = {}
        self.term: dict[int, int] = {}

    def on_start(self, node: SimNode) -> None:
        self.commit[node.id] = 0

    def on_install(self, node: SimNode, snap: Snapshot) -> None:
        self.commit[node.id] = snap.index  # may move back: a refill restarted elsewhere

    def on_step(self, cluster: Cluster) -> None:
        for node in cluster.live:
            raft = node.raft
            nid = node.id
            commit = raft.commit
            if commit < self.commit.get(nid, 0):
                raise Violation(
                    "commit-regressed", f"node {nid} commit {self.commit[nid]} -> {commit}"
                )
            self.commit[nid] = commit
            last = raft.last_index
            if not node.applied <= commit <= last and not _refilling(node):
                raise Violation(
                    "bounds", f"node {nid} applied {node.applied} commit {commit} last {last}"
                )
            term = raft.term
            if term < self.term.get(nid, 0):
                raise Violation("term-regressed", f"node {nid} term {self.term[nid]} -> {term}")
            self.term[nid] = term
            if node.store.hard_state.term != term:
                raise Violation(
                    "hard-state-not-persisted",
                    f"node {nid} acts in term {term}, disk says {node.store.hard_state.term}",
                )


class DurableBeforeSend(Checker):
    """The Ready contract (`raftlog.types`): what a message vouches for is on disk when it
    leaves. An append acknowledgement never covers entries the sender has not fsynced; a
    vote is granted only once the vote is persisted; no message carries a term the sender
    has not persisted (pre-votes excepted: they speak of the next term)."""

    _UNPERSISTED_TERM_OK = frozenset({MsgType.PREVOTE, MsgType.PREVOTE_RESP})

    def on_send(self, node: SimNode, msg: Message) -> None:
        hs = node.store.hard_state
        if msg.term > hs.term and msg.type not in self._UNPERSISTED_TERM_OK:
            raise Violation(
                "term-not-persisted",
                f"node {node.id} sent {msg.describe()} with term {hs.term} on disk",
            )
        if msg.type == MsgType.APPEND_RESP and not msg.reject:
            if msg.log_index > node.store.durable_len:
                raise Violation(
                    "ack-not-durable",
                    f"node {node.id} sent {msg.describe()} with only "
                    f"{node.store.durable_len} of {len(node.store.log)} entries fsynced",
                )
        elif msg.type == MsgType.VOTE_RESP and not msg.reject:
            if (hs.term, hs.vote) != (msg.term, msg.dst):
                raise Violation(
                    "vote-not-persisted",
                    f"node {node.id} sent {msg.describe()} with (term {hs.term}, vote "
                    f"{hs.vote}) on disk",
                )


class CommittedSurvivesCrash(Checker):
    """DESIGN.md: an acknowledged (committed) entry is fsynced on a majority, so no crash
    can leave it on fewer than a majority of the voters' logs. Checked right after each
    crash, for groups whose membership never changed (with changes, which majority
    counts depends on which configuration committed it)."""

    def __init__(self, ledger: Ledger, voters: frozenset[int]) -> None:
        self.ledger = ledger
        self.voters = voters
        self.enabled = True

    def on_crash(self, cluster: Cluster, node: SimNode) -> None:
        if not self.enabled or not self.ledger.entries:
            return
        want = self.ledger.entries[-1]
        holders = [n.id for n in cluster.nodes.values() if n.id in self.voters and _holds(n, want)]
        if len(holders) < len(self.voters) // 2 + 1:
            raise Violation(
                "committed-entry-lost",
                f"after node {node.id} crashed, committed {_show(want)} survives only on "
                f"{sorted(holders)} of voters {sorted(self.voters)}",
            )


class ReadIndexLinearizable(Checker):
    """Thesis §6.4: a ReadIndex answer covers every entry committed before the read was
    asked for, so a read served at that index sees every acknowledged write."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.asked: dict[int, int] = {}

    def on_read_request(self, node: SimNode, request_id: int) -> None:
        self.asked[request_id] = len(self.ledger)

    def on_read(self, node: SimNode, read: ReadState) -> None:
        floor = self.asked.pop(read.id, None)
        if floor is None:
            raise Violation("read-unknown", f"node {node.id} answered read {read.id} never asked")
        if read.index < floor:
            raise Violation(
                "read-index-stale",
                f"node {node.id} answered read {read.id} at {read.index}, but {floor} was "
                "already committed when it was asked",
            )


class CorruptNeverServed(Checker):
    """An entry damaged on a replica's disk is never applied there nor sent from there
    (issue 12 part 5); that it is repaired is the liveness phase's business (every
    member must apply past it, and await no repair, before the run counts as live)."""

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        if entry.index in node.store.corrupt:
            raise Violation(
                "corrupt-applied", f"node {node.id} applied entry {entry.index}, corrupt on its disk"
            )

    def on_send(self, node: SimNode, msg: Message) -> None:
        bad = [e.index for e in msg.entries if e.index in node.store.corrupt]
        if bad:
            raise Violation(
                "corrupt-served",
                f"node {node.id} sent entries {bad}, corrupt on its disk: {msg.describe()}",
            )


class ReferencedEntriesHeld(Checker):
    """A state points into the log (the broker's ConsumeQueues reference every retained
    entry, `raftlog.sim.machine`'s horizon models them): every entry from a replica's
    horizon on is in its log -- none was compacted or reset away -- and a leader holds
    all of them up to what it applied. A replica that installed a snapshot may still be
    refilling the entries below it from the leader, but may not lead meanwhile. Entries
    an abandoned refill declared lost (`RefillAbandonedOnlyWhenUnsuppliable`) are
    exempt: no log holds them any more."""

    def on_step(self, cluster: Cluster) -> None:
        for node in cluster.live:
            store, raft = node.store, node.raft
            if raft.installing is not None:
                continue  # the log is being replaced: checked once the install is done
            first = store.first_index()
            if first > max(node.horizon, cluster.lost_upto + 1):
                raise Violation(
                    "referenced-entry-dropped",
                    f"node {node.id} applied up to {node.applied} with a state referencing "
                    f"entries from {node.horizon}, but its log starts at {first}",
                )
            if raft.role == Role.LEADER and store.last_index() < node.applied:
                raise Violation(
                    "leader-lacks-referenced-entry",
                    f"node {node.id} leads term {raft.term} with its log ending at "
                    f"{store.last_index()}, before its applied {node.applied}",
                )


class RefillAbandonedOnlyWhenUnsuppliable(Checker):
    """A replica abandons a refill (reinstalls its own snapshot with the referenced
    entries marked lost) only when no voter, up or down, could lead and make it whole:
    none holds the snapshot's last entry in a log that reaches its own snapshot, nor a
    whole state at or beyond it (its own log's base there, not itself from an abandoned
    refill). A replica that can be refilled is refilled, never left with a hole."""

    def on_install(self, node: SimNode, snap: Snapshot) -> None:
        if snap.lost is None:
            return
        voters = snap.membership.voters if snap.membership is not None else frozenset()
        lost_upto = node.cluster.lost_upto
        for other in node.cluster.nodes.values():
            if other is node or other.retired or other.id not in voters:
                continue
            st = other.store
            held = st.entry(snap.index)
            whole = st.snapshot is None or st.last_index() >= st.snapshot.index
            b, bt = st.base
            beyond = (b > snap.index or (b, bt) == (snap.index, snap.term)) and b > lost_upto
            if whole and (beyond or (held is not None and held.term == snap.term)):
                raise Violation(
                    "refill-abandoned-needlessly",
                    f"node {node.id} gave up entries {snap.lost[0]}..{snap.lost[1]} while "
                    f"node {other.id} (up: {other.up}) holds entry {snap.index}@{snap.term} "
                    "and could lead and refill it",
                )


def _refilling(node: SimNode) -> bool:
    """Whether the node's state is ahead of its log (legal after a snapshot only): its
    commit is its applied index, and it does not lead."""
    raft = node.raft
    return (raft.commit == node.applied and raft.role != Role.LEADER
            and bool(getattr(raft, "refilling", False)))


def _holds(n: SimNode, want: Entry) -> bool:
    """Whether `n`'s disk protects the committed entry `want`: its log holds it, or a
    snapshot covers it (after a restart the node refills or votes as if it held it)."""
    st, i = n.store, want.index
    if i <= st.base[0] or (st.snapshot is not None and i <= st.snapshot.index):
        return True
    return len(st.log) >= i and st.term(i) == want.term


def default_checkers(ledger: Ledger, voters: frozenset[int], *, static: bool) -> list[Checker]:
    """The full set, in the order they must run (the ledger first: others read it).
    `static`: the membership never changes (the crash-durability check needs that)."""
    survives = CommittedSurvivesCrash(ledger, voters)
    survives.enabled = static
    return [
        CommitLedger(ledger),
        ElectionSafety(),
        LogMatching(),
        LeaderCompleteness(ledger),
        StateMachineSafety(Membership(voters)),
        NodeBounds(),
        DurableBeforeSend(),
        survives,
        ReadIndexLinearizable(ledger),
        CorruptNeverServed(),
        ReferencedEntriesHeld(),
        RefillAbandonedOnlyWhenUnsuppliable(),
    ]


def _show(e: Entry) -> str:
    return f"{e.index}@{e.term}:{e.type.name}:{e.data[:24]!r}"
