"""The Raft consensus core: a plain object, events in, a `Ready` bundle out.

No sockets, files, clocks, threads or randomness of its own: the shell feeds ticks,
messages, proposals and "persisted up to N" reports, and carries out what `ready()`
returns (see `raftlog.types` for that contract). Sections cited are from the Raft paper
(Ongaro & Ousterhout 2014) and Ongaro's thesis.

Implemented: PreVote (thesis §9.6) and randomized election timeouts (doubled for a
replica far behind in applying, or without a state, so one that can serve sooner wins);
check-quorum with leader lease (thesis §6.2); pipelined, batched replication with xTerm/xIndex fast backup;
a NOOP on election and commit counting only current-term entries (§5.4.2); leadership
transfer by TimeoutNow (thesis §3.10) and a preferred leader; ReadIndex (thesis §6.4);
single-server membership changes with learners (thesis §4.1-4.2); InstallSnapshot
(paper §7, thesis §5.1).

Snapshots: the store may start after index 1 (retention deleted a prefix the state
machine had already snapshotted). The shell hands the core its latest snapshot with
`set_snapshot` (the core never reads files), and a leader sends it, whole, to a follower
whose next entry lies below `first_index()`: a replica whose disk was replaced, a new
learner, one that was down while retention ran. The follower hands it to its shell in
`Ready.snapshot`, and once the shell reports `snapshot_installed` its log, commit and
applied index all start at the snapshot's index and it acknowledges that index. The
snapshot carries the membership in force at its index, since the entries that set it
are gone. A follower whose disk was replaced says so when a heartbeat's commit lies
beyond its log, or refuses the entry it once acknowledged: the leader then forgets that
acknowledgement and probes from scratch (lowering a match is always safe).

Refilling: a state may reference log entries below its own index (the broker's
ConsumeQueues point at every retained entry, up to the snapshot's index and beyond), so
a snapshot alone does not make a replica whole. The leader sends its snapshot with a
base, the entry just before its own first one (in SNAPSHOT's `hint_index`/`hint_term`);
the follower resets its log to start right after the base, acknowledges the base, and
the leader sends it the entries from there on through ordinary appends. Until its log
reaches the snapshot's index the replica is refilling: `commit == applied` lies beyond
`last_index` (the only time it may), nothing is applied, it does not campaign (so it
never leads, or serves reads, lacking an entry its state points at), and it votes as if
its log ended at the snapshot's entry, which is committed and so protects what the
snapshot covers as that entry would. A replica whose own snapshot is ahead of its log
(the tail it had applied but not yet fsynced was lost) restarts refilling likewise.
Should a new leader no longer hold the entry a refilling replica needs next, the
replica installs that leader's snapshot even if it is older than its own state (its
commit and applied index move back with the state: it served nothing meanwhile).
Invariant: every entry from the base on that is at or below `commit` is committed.

A refill no voter can supply: after a power loss of every node that lost unsynced log
data (`fsync = "interval"`), every replica's snapshot may be ahead of its log, so every
replica is refilling, none campaigns and the group never elects. So a refilling replica
that hears from no leader for an election timeout asks every other voter whether it
could refill it (REFILL_PROBE, carrying its snapshot's last entry; never a term change).
A voter can when it is not refilling or installing and its log reaches that entry: it
may then lead (it wins this replica's vote) and refill it, so the replica waits. Only
once *every* other voter has answered, in the same round, that it cannot (a silent one
may be down and hold exactly those entries), the entries are gone from every log: the
replica abandons the refill and reinstalls its own snapshot with the base at its index
(`Snapshot.lost` names the entries lost, for the shell to report; `refill_gap` keeps
them). Its log then ends at the snapshot's entry, it is whole again and campaigns. A
replica that can be refilled is still refilled, and a leader never holds a hole it
could have filled.

Lost state: a replica whose log is intact but whose state is gone (its snapshot, or a
file the snapshot references, was damaged) starts `stateless`. Its log, and with it its
votes and acknowledgements, stays exactly as it was: nothing acknowledged is dropped.
It stores, acknowledges and commits appends as any follower does, but applies nothing,
and every heartbeat answer asks the leader for a state (`WANTS_STATE`, with its log's
first index). It votes on its log as before, and campaigns after twice the election
timeout (a replica with a state wins first): its log may be the only up-to-date one of a
quorum that is left. Elected, it serves nothing (proposals and reads are refused for
now), hands leadership to the first voter whose log caught up with its own, and steps
down when a voter lacks entries only a snapshot (which it does not hold) could bring. The leader offers its snapshot once the
follower's log is known to hold the snapshot's last entry (its match reached it) and
everything the state references (the follower's first index is at most the snapshot's
base + 1); until then the follower catches up through ordinary appends, and when the
leader's snapshot is missing or too old for the follower's log, `state_wanted` asks the
shell for a fresh one. The follower installs the offered snapshot without touching its
log (`Snapshot.keep_log`) and applies on from its index. Rebuilding from a leader costs
one transfer instead of a replay of the whole log. A snapshot whose last entry its log
lacks (it is behind the leader's first index, or holds another entry there) is
installed as any follower installs one: log reset to the base and refilled. A stateless
replica whose log still begins at entry 1 and is offered nothing for
`_STATELESS_PATIENCE` election timeouts (every replica lost its state, or no peer is
reachable) gives up waiting and replays its log from the first entry: its log alone
rebuilds the same state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from raftlog.progress import Progress
from raftlog.quorum import committed_index, has_quorum, vote_result
from raftlog.readonly import ReadOnly
from raftlog.types import (
    Entry,
    EntryType,
    EntryUnreadable,
    HardState,
    LogStore,
    Membership,
    Message,
    MsgType,
    ReadState,
    Ready,
    Role,
    Sealable,
    Snapshot,
)

__all__ = ["NotLeader", "ProposalDropped", "RaftConfig", "RaftNode", "MUTATIONS", "WANTS_STATE"]

#: Deliberately wrong behaviours, switched on only to prove the checkers catch them.
MUTATIONS = frozenset({"commit-old-term", "no-prevote-term-check", "snapshot-no-base"})

_VOTE_RESPONSE = {MsgType.PREVOTE: MsgType.PREVOTE_RESP, MsgType.VOTE: MsgType.VOTE_RESP}
_FROM_LEADER = frozenset({MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT})
_HANDBACK_BACKOFF_MAX = 5  # failed hand-backs wait 2, 4, ... 32 election timeouts at most
#: In a HEARTBEAT_RESP's `hint_term`: this replica lost its state and asks for a snapshot.
WANTS_STATE = 1
#: Election timeouts a stateless replica whose log begins at entry 1 waits for an offer
#: before it replays its log instead.
_STATELESS_PATIENCE = 10


class NotLeader(Exception):
    """This replica cannot serve the request; `leader` is its best guess (or None)."""

    def __init__(self, leader: int | None, term: int | None = None) -> None:
        super().__init__(f"not the leader (leader hint: {leader}, term {term})")
        self.leader = leader
        self.term = term  # the term the hint belongs to: a newer term outranks it


class ProposalDropped(Exception):
    """The leader refused the proposal for now (transfer or membership change under way)."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    max_append_bytes: int = 1 << 20
    max_inflight: int = 64
    max_apply_bytes: int = 16 << 20
    # entries one Ready applies at most: the shell applies them in place, so a backlog of
    # small entries (a state rebuilt from the log) goes in batches other work runs between
    max_apply_entries: int = 1024
    # a replica this many committed entries behind in applying (replaying a long log)
    # campaigns after twice its election timeout: one that could serve sooner wins first
    slow_apply_entries: int = 10_000
    check_quorum: bool = True
    pre_vote: bool = True
    preferred_leader: int | None = None
    snapshot_timeout_ticks: int = 0  # a sent snapshot unacknowledged this long is resent;
    # 0: 4 election timeouts (leaving room to write and restore it)
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if self.snapshot_timeout_ticks < 0:
            raise ValueError("snapshot_timeout_ticks must be >= 0")
        unknown = self.mutations - MUTATIONS
        if unknown:
            raise ValueError(f"unknown mutations: {sorted(unknown)}")

    @property
    def snapshot_retry_ticks(self) -> int:
        return self.snapshot_timeout_ticks or 4 * self.election_ticks


class RaftNode:
    """One replica of one Raft group."""

    def __init__(
        self,
        node_id: int,
        store: LogStore,
        hard_state: HardState,
        config: RaftConfig | None = None,
        *,
        rng: random.Random,
        applied: int = 0,
        stateless: bool = False,
    ) -> None:
        """`stateless`: the shell holds this replica's log but lost its state (see the
        module docstring, "Lost state"); `applied` is then 0."""
        if stateless and applied:
            raise ValueError("a stateless replica has applied nothing")
        self.id = node_id
        self.cfg = config or RaftConfig()
        self._store = store
        self._rng = rng
        self.term = hard_state.term
        self.vote = hard_state.vote
        last = store.last_index()
        first = store.first_index()
        # Membership records still backed by the log (a crash may have lost the tail);
        # those below the first index, or applied, were committed.
        self._configs = [
            (i, t, m)
            for i, t, m in hard_state.configs
            if i == 0 or i < first or i <= applied or (i <= last and store.term(i) == t)
        ]
        if not self._configs and stateless and hard_state.configs:
            # Every record lies past a log that an install reset and a crash cut short:
            # the oldest is the installed snapshot's (committed), which the lost state
            # would have vouched for.
            self._configs = [min(hard_state.configs)]
        if not self._configs:
            raise ValueError("hard state holds no membership: bootstrap it first")
        self._pending: list[Entry] = []  # appended here, not yet handed to the shell
        self._last_index = last
        self._last_term = store.term(last)
        self._persisted = last  # everything in the store is durable at construction
        # Invariant: applied <= commit <= last_index, but while refilling (see the module
        # docstring): a state restored beyond the log's end is committed there.
        self.commit = applied
        self.applied = applied
        if stateless:
            self.commit = max(0, first - 1)  # entries go from a log once applied: committed
        self.role = Role.FOLLOWER
        self.leader: int | None = None
        self._hs_dirty = False
        self._out: list[Message] = []
        self._reads_out: list[ReadState] = []
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._timeout_forced = False  # `_timeout` was set by `leader_unreachable`
        self._votes: dict[int, bool] = {}
        # Leader state.
        self._progress: dict[int, Progress] = {}
        self._needs_snapshot: set[int] = set()  # peers lacking entries we no longer hold
        self._pending_conf_index = 0
        self._transferee: int | None = None
        self._transfer_elapsed = 0
        # Hand-backs to the preferred leader that it never took (it could not: repairing
        # entries, refilling its log): each makes the next wait twice as long (`_tick_leader`).
        self._handbacks_failed = 0
        self._handback_wait = 0  # ticks before the next hand-back may start
        self._active_before: frozenset[int] = frozenset()  # heard from in the last round
        # Where leadership goes back to once that node has caught up: the config's at
        # first; the shell may change it (a replicated setting above the core).
        self.preferred_leader: int | None = self.cfg.preferred_leader
        self._needs_broadcast = False
        self._reads = ReadOnly()
        # Follower state: acknowledge appends only once persisted.
        self._ack_to: int | None = None
        self._ack_index = 0
        self._acked = 0
        # Snapshots: the newest the shell holds (what a leader sends), and one a leader
        # sent us that the shell is installing (handed out once as Ready.snapshot).
        self._snapshot: Snapshot | None = None
        self._installing: Snapshot | None = None
        self._snapshot_out: Snapshot | None = None
        # Corruption: entries the store holds but cannot read, until repaired from a peer.
        self._unreadable: set[int] = set()
        self._repair_out: list[int] = []  # newly unreadable (Ready.repair)
        # An abandoned refill (see the module docstring): the probe round, the voters
        # that answered it cannot refill us, and the entries lost when it was abandoned.
        self._refill_round = 0
        self._refill_refused: set[int] = set()
        self.refill_gap: tuple[int, int] | None = None
        # Lost state (see the module docstring): this replica waits for a leader's offer;
        # as leader, the peers whose state needs a snapshot newer than the one held.
        self.stateless = stateless
        self._stateless_ticks = 0  # ticks since it was last offered a state
        self._lacking_state: set[int] = set()  # peers whose heartbeat answers ask for one
        self._state_wanted: dict[int, int] = {}  # peer -> its log's first index
        self._step_role: dict[Role, Callable[[Message], None]] = {
            Role.FOLLOWER: self._step_follower,
            Role.PRE_CANDIDATE: self._step_candidate,
            Role.CANDIDATE: self._step_candidate,
            Role.LEADER: self._step_leader,
        }

    # ------------------------------------------------------------------ queries

    @property
    def membership(self) -> Membership:
        return self._configs[-1][2]

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def persisted_index(self) -> int:
        return self._persisted

    @property
    def transferee(self) -> int | None:
        return self._transferee

    @property
    def needs_snapshot(self) -> frozenset[int]:
        """Peers this leader cannot catch up: they need entries below the store's first
        index and no snapshot covering them was handed to `set_snapshot`. They get
        heartbeats only."""
        return frozenset(self._needs_snapshot)

    @property
    def state_wanted(self) -> dict[int, int]:
        """Peers that lost their state and need a snapshot newer than the one this
        leader holds (or it holds none), each with its log's first index: the shell
        takes one whose base (the entry before the first its state references) is at
        least the index before that first one."""
        return dict(self._state_wanted)

    @property
    def sending_snapshot(self) -> dict[int, int]:
        """Peers a snapshot was sent to and not yet acknowledged: peer -> its index."""
        return {p: pr.snapshot for p, pr in self._progress.items() if pr.snapshot}

    @property
    def snapshot_index(self) -> int:
        """Index of the snapshot a leader would send (0: none)."""
        return self._snapshot.index if self._snapshot is not None else 0

    @property
    def installing(self) -> Snapshot | None:
        """The snapshot the shell is installing (handed out, not yet reported done)."""
        return self._installing

    @property
    def unreadable(self) -> frozenset[int]:
        """Entries awaiting repair (see `entry_unreadable`)."""
        return frozenset(self._unreadable)

    @property
    def frozen(self) -> bool:
        """The next committed entry to apply is unreadable: until it is repaired this
        replica acts as if cut off (ticks and messages are ignored, `ready` is empty)."""
        nxt = self.applied + 1
        return nxt in self._unreadable and self.commit >= nxt and self._installing is None

    def membership_at(self, index: int) -> Membership:
        """The membership in force at `index`, for a snapshot taken there.

        Known for any index from the latest snapshot's on (records are kept until a
        snapshot passes them: restarts resume there); below it, the oldest on record.
        """
        for i, _t, m in reversed(self._configs):
            if i <= index:
                return m
        return self._configs[0][2]

    def peer_matches(self) -> dict[int, int]:
        """Each other member's match index as this leader knows it (empty unless leader):
        how far a learner has caught up, how far a follower lags."""
        return {p: pr.match for p, pr in self._progress.items() if p != self.id}

    def recently_active(self) -> frozenset[int]:
        """Members this leader heard from within the last one or two election timeouts
        (check-quorum's rounds): the ones alive and reachable as far as it knows."""
        if self.role != Role.LEADER:
            return frozenset()
        now = {p for p, pr in self._progress.items() if pr.recent_active}
        return frozenset(now | self._active_before | {self.id})

    def min_follower_match(self) -> int | None:
        """Lowest index known replicated on every other member (voters and learners);
        the leader's own persisted index when it has no peers; None unless leader.

        Retention must not delete past it, or a follower could never catch up.
        """
        if self.role != Role.LEADER:
            return None
        matches = [pr.match for p, pr in self._progress.items() if p != self.id]
        return min(matches) if matches else self._persisted

    def term_at(self, index: int) -> int:
        if index > self._last_index:
            raise IndexError(f"index {index} beyond last {self._last_index}")
        p = self._pending
        if p and index >= p[0].index:
            return p[index - p[0].index].term
        return self._store.term(index)

    def _entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) from the store and the pending tail, at least one if lo < hi."""
        if self._unreadable:
            hi = min([hi, *(i for i in self._unreadable if i >= lo)])
            if lo >= hi:
                return []
        p = self._pending
        split = p[0].index if p else hi
        out: list[Entry] = []
        if lo < split:
            try:
                out = self._store.entries(lo, min(hi, split), max_bytes)
            except EntryUnreadable as exc:
                self.entry_unreadable(exc.index)
                return []
            if not out or out[-1].index < min(hi, split) - 1:
                return out
            lo = out[-1].index + 1
        size = sum(len(e.data) for e in out)
        while lo < hi:
            e = p[lo - split]
            if out and size + len(e.data) > max_bytes:
                break
            out.append(e)
            size += len(e.data)
            lo += 1
        return out

    @property
    def refilling(self) -> bool:
        """Whether the log ends before the state (see the module docstring)."""
        return self._last_index < self.commit

    def _up_to_date(self, index: int, term: int) -> bool:
        """§5.4.1 election restriction: is a log ending at (index, term) at least as new?

        A refilling replica, or one installing a snapshot, compares with the snapshot's
        last entry: committed, so any leader must hold it."""
        if "no-prevote-term-check" in self.cfg.mutations:
            return True
        mine = (self._last_term, self._last_index)
        snap = self._installing or (self._snapshot if self.refilling else None)
        if snap is not None:
            mine = max(mine, (snap.term, snap.index))
        return (term, index) >= mine

    def _matches(self, index: int, term: int) -> bool:
        return index <= self._last_index and self.term_at(index) == term

    # ------------------------------------------------------------------ events

    def tick(self) -> None:
        """One unit of logical time; the shell decides how long a tick is."""
        if self._unreadable and self.frozen:
            if self.role == Role.LEADER:
                # A frozen leader sends nothing (no heartbeat, no append) and would never
                # hear that it lost its quorum: step down, so its clients are sent on
                # instead of waiting on a leader that cannot serve them.
                self._become_follower(self.term, None)
            return
        if self.stateless and self._installing is None:
            self._stateless_ticks += 1
            if (self._stateless_ticks >= _STATELESS_PATIENCE * self.cfg.election_ticks
                    and self._store.first_index() == 1):
                self.stateless = False  # replay the whole log: applied is 0
        if self.role == Role.LEADER:
            self._tick_leader()
        else:
            self._election_elapsed += 1
            # a stateless replica, or one far behind in applying, waits twice as long: a
            # replica that could serve sooner wins first (only timing: never safety)
            slow = self.stateless or self.commit - self.applied > self.cfg.slow_apply_entries
            if self._election_elapsed >= self._timeout * (2 if slow else 1):
                if self._can_campaign():
                    self._campaign(MsgType.PREVOTE if self.cfg.pre_vote else MsgType.VOTE)
                elif self._may_probe_refill():
                    self._probe_refill()

    def leader_unreachable(self, peer: int) -> None:
        """The shell lost its connection to `peer` (e.g. the peer's process died and its
        sockets were closed): if `peer` is our leader, campaign within a few ticks instead
        of waiting out the whole election timeout.

        Only a follower acts on it, and only about its current leader. It ends the
        leader's lease here (so this follower grants pre-votes to a peer that lost the
        leader too) and brings its election timer forward to fire after 1 + r ticks,
        r being this node's rank among the other voters. Distinct slots, not a random
        pick among a few ticks: the followers of a dead leader all hear of it at once,
        and two that campaign in the same tick split the vote and fall back to the full
        timeout; a tick apart, the second hears the first's vote request first.

        The campaign still starts with PreVote: a leader alive for the other voters keeps
        their lease, they refuse, and nothing is disrupted; a heartbeat arriving first
        cancels it as usual. Without PreVote it does nothing (a real election would bump
        the term of a live leader). Liveness only: an election is always safe.

        Repeated reports never postpone the slot: a shell that keeps redialling the dead
        leader may report each failed reconnect (through a proxy that accepts and then
        closes, several times a tick), and pushing the deadline back on each one would
        keep every follower but the first-ranked from ever campaigning.
        """
        if (self.role != Role.FOLLOWER or self.leader != peer or not self.cfg.pre_vote
                or not self._can_campaign() or self.frozen):
            return
        others = sorted(self.membership.voters - {peer})
        self._election_elapsed = max(self._election_elapsed, self.cfg.election_ticks)
        due = self._election_elapsed + 1 + others.index(self.id)
        self._timeout = min(self._timeout, due) if self._timeout_forced else due
        self._timeout_forced = True  # a heartbeat arriving first draws a random one again

    def step(self, m: Message) -> None:
        """Common checks for every role (term comparison, votes), then the role's handler."""
        if self._unreadable:
            guarded = self._guard_incoming(m)
            if guarded is None:
                return
            m = guarded
        if m.type == MsgType.REFILL_PROBE:
            self._answer_refill_probe(m)
            return
        if m.type == MsgType.REFILL_PROBE_RESP:
            self._refill_answer(m)
            return
        if m.term > self.term:
            if m.type in (MsgType.PREVOTE, MsgType.VOTE) and not m.context and self._in_lease():
                return  # thesis §4.2.3: a live leader's followers ignore disruptive candidates
            if m.type == MsgType.PREVOTE or (m.type == MsgType.PREVOTE_RESP and not m.reject):
                pass  # pre-votes never change terms
            else:
                # Paper §5.2 (Figure 2): the election timer restarts on hearing from the
                # current leader or on granting a vote, not on a newer term alone. A vote
                # refused to a lagging candidate must not hold back the up-to-date voters,
                # who alone can win (etcd's raft restarts it here; without PreVote lagging
                # candidates could then keep every electable node from timing out).
                leader = m.src if m.type in _FROM_LEADER else None
                self._become_follower(m.term, leader, restart_timer=False)
        elif m.term < self.term:
            if m.type in _FROM_LEADER:
                # Tell a stale leader about the newer term so it steps down (it may be
                # partitioned from everyone else and never see a vote request).
                self._send(MsgType.APPEND_RESP, m.src, reject=True, log_index=m.log_index)
            elif m.type == MsgType.PREVOTE:
                self._send(MsgType.PREVOTE_RESP, m.src, reject=True)
            return
        if m.type in _VOTE_RESPONSE:
            self._handle_vote_request(m)
        else:
            self._step_role[self.role](m)

    def propose(self, data: bytes | Sealable, type: EntryType = EntryType.MESSAGES) -> int:
        """Append a new entry as leader; returns its index. Commit is reported via `apply`.

        `data` may come already laid out in the shell's stored form (`Sealable`): the
        entry is then what its `seal` returns for the index and term given here."""
        if type == EntryType.CONFIG:
            raise ValueError("use add_learner/promote/remove for membership changes")
        self._check_can_propose()
        return self._append_new(type, data)

    def propose_many(
        self, items: Sequence[bytes | Sealable], type: EntryType = EntryType.MESSAGES
    ) -> int:
        """Append several new entries at once as leader, all or none; returns the index
        of the first (the others follow it). They leave in the same Ready: one store
        write, one fsync and one AppendEntries per follower for the lot."""
        if type == EntryType.CONFIG:
            raise ValueError("use add_learner/promote/remove for membership changes")
        if not items:
            raise ValueError("propose_many needs at least one entry")
        self._check_can_propose()
        first = self._last_index + 1
        entries = [
            Entry(first + i, self.term, type, d) if isinstance(d, bytes)
            else d.seal(first + i, self.term, type)
            for i, d in enumerate(items)
        ]
        self._append_entries(entries)
        self._needs_broadcast = True
        return first

    def persisted(self, index: int, term: int) -> None:
        """The store has fsynced everything up to `index`, whose term was `term`."""
        if self._installing is not None and not self._installing.keep_log:
            return  # the log it speaks of is being replaced
        if index <= self._persisted or index > self._last_index or self.term_at(index) != term:
            return  # stale: already known, or that entry has since been replaced
        self._persisted = index
        if self.role == Role.LEADER:
            self._progress[self.id].acked(index)
            self._maybe_commit()
        else:
            self._flush_ack()

    def set_snapshot(self, snap: Snapshot) -> None:
        """The shell holds `snap` durably (taken at an applied index, or restored at
        start): a leader sends it to followers that need entries below `first_index()`.
        Older snapshots than the one held are ignored. Without a membership (a file from
        before it was recorded) the core fills in `membership_at(snap.index)`."""
        if snap.index > self.applied:
            raise ValueError(f"snapshot at {snap.index} is beyond applied {self.applied}")
        if self._snapshot is not None and snap.index <= self._snapshot.index:
            return
        if snap.membership is None:
            snap = replace(snap, membership=self.membership_at(snap.index))
        elif self._configs[0][0] > snap.index:
            # After a restart the records may start above a snapshot restored below them
            # (superseded ones were dropped while applied ran ahead of it): the snapshot
            # knows what was in force at its index.
            self._configs.insert(0, (snap.index, snap.term, snap.membership))
        self._snapshot = snap

    def snapshot_installed(self, index: int, term: int) -> None:
        """The shell has done what `Ready.snapshot` asked: the snapshot is durable, the
        state machine restored from it and the store reset to start after its base.

        Commit and applied index are now `index`, the log ends at the base (refilling
        until appends reach `index`), the snapshot becomes the one this replica would
        send as leader, and the leader hears the base as the new match.
        """
        snap = self._installing
        if snap is None or (snap.index, snap.term) != (index, term):
            raise ValueError(f"no snapshot {index}@{term} is being installed")
        assert snap.membership is not None and snap.base is not None
        if snap.keep_log:
            self._state_installed(snap)
            return
        self._installing = None
        self._snapshot = snap
        self.stateless = False
        self._pending = []
        self._unreadable.clear()  # every old entry went with the log
        self._last_index, self._last_term = snap.base
        self._persisted = self._last_index
        self.commit = self.applied = index
        self._configs = [(index, term, snap.membership)]
        self._hs_dirty = True
        if self.leader is not None:
            # Any leader of this term or later holds the committed prefix up to `index`.
            self._ack_to = self.leader
            self._ack_index = self._last_index
            self._acked = 0
            self._flush_ack()

    def _state_installed(self, snap: Snapshot) -> None:
        """A stateless replica has its state again; its log is as it was."""
        self._installing = None
        self._snapshot = replace(snap, keep_log=False)
        self.stateless = False
        self.applied = snap.index
        self.commit = max(self.commit, snap.index)
        if self.leader is not None:
            self._ack_to = self.leader
            self._ack_index = max(self._ack_index, snap.index)
            self._flush_ack(repeat=True)

    def entry_unreadable(self, index: int) -> None:
        """The store holds entry `index` but cannot read it (its bytes fail their checks;
        its index record, and so its term, is intact). Until `entry_repaired(index)`:

        * it is never handed out, to a follower or to be applied: appends stop before it;
        * a commit index a leader sends is capped below it, so nothing from it on is
          applied, while appends are still stored and acknowledged and votes granted;
        * this replica does not seek leadership (no campaign, TIMEOUT_NOW ignored);
        * once it is the next entry to apply, the replica is `frozen` (acts as cut off;
          a frozen leader steps down on its next tick).

        It is listed once in `Ready.repair`. Ignored for an entry not in the store.
        """
        if index in self._unreadable or not self._stored(index):
            return
        self._unreadable.add(index)
        self._repair_out.append(index)

    def entry_repaired(self, index: int) -> None:
        """Entry `index` reads again (repaired from a peer), or is no longer in the log."""
        self._unreadable.discard(index)

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` once its log is caught up (thesis §3.10)."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if target == self.id or self._transferee == target:
            return
        if target not in self.membership.voters:
            raise ValueError(f"node {target} is not a voter")
        self._transferee = target
        self._transfer_elapsed = 0
        if self._progress[target].match == self._last_index:
            self._send(MsgType.TIMEOUT_NOW, target)
        else:
            self._send_append(target)

    def read_index(self, request_id: int) -> None:
        """Ask for a linearizable read point; answered later as a `ReadState`."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if self.stateless:
            raise ProposalDropped("this leader lost its state: leadership moves to a peer")
        self._reads.request(request_id, self._committed_in_term())

    def add_learner(self, node: int) -> int:
        m = self.membership
        if node in m.members:
            raise ValueError(f"node {node} is already a member")
        return self._propose_config(Membership(m.voters, m.learners | {node}))

    def promote(self, node: int) -> int:
        """Make a caught-up learner a voter (thesis §4.2.1: catch up before voting)."""
        m = self.membership
        if node not in m.learners:
            raise ValueError(f"node {node} is not a learner")
        if self.role == Role.LEADER and self._progress[node].match < self.commit:
            raise ProposalDropped(f"learner {node} has not caught up yet")
        return self._propose_config(Membership(m.voters | {node}, m.learners - {node}))

    def remove(self, node: int) -> int:
        m = self.membership
        if node not in m.members:
            raise ValueError(f"node {node} is not a member")
        return self._propose_config(Membership(m.voters - {node}, m.learners - {node}))

    def ready(self) -> Ready:
        """Drain everything the shell must now do (order: see `raftlog.types`)."""
        if self._unreadable and self.frozen:
            rd = Ready(repair=self._repair_out)
            self._repair_out = []
            return rd
        if self.role == Role.LEADER:
            if self._reads.has_new:
                self._start_read_round()
            if self._needs_broadcast:
                self._needs_broadcast = False
                for peer in self._progress:
                    if peer != self.id:
                        self._send_append(peer, fill=True)
        installing = self._installing is not None
        rd = Ready(
            entries=[] if installing else self._pending, messages=self._out, reads=self._reads_out
        )
        if self._snapshot_out is not None:
            rd.snapshot, self._snapshot_out = self._snapshot_out, None
        if self._hs_dirty:
            rd.hard_state = HardState(self.term, self.vote, tuple(self._configs))
            self._hs_dirty = False
        if self.commit > self.applied and not installing and not self.stateless:
            upto = min(self.commit, self.applied + self.cfg.max_apply_entries)
            rd.apply = self._entries(self.applied + 1, upto + 1, self.cfg.max_apply_bytes)
            if rd.apply:  # else the next one is unreadable: frozen until it is repaired
                self.applied = rd.apply[-1].index
        if not installing:
            self._pending = []
        self._out = []
        self._reads_out = []
        if self._repair_out:
            rd.repair, self._repair_out = self._repair_out, []
        return rd

    # ------------------------------------------------------------------ roles

    def _become_follower(self, term: int, leader: int | None, *,
                         restart_timer: bool = True) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
            self._hs_dirty = True
        if leader != self.leader or self.role != Role.FOLLOWER:
            self._ack_to = None
            self._ack_index = self._acked = 0
        was_leader = self.role == Role.LEADER
        self.role = Role.FOLLOWER
        self.leader = leader
        if restart_timer or was_leader:
            self._reset_timers()  # (a leader's own timer counted check-quorum rounds)
        self._clear_leader_state()

    def _clear_leader_state(self) -> None:
        self._progress = {}
        self._active_before = frozenset()
        self._needs_snapshot.clear()
        self._lacking_state.clear()
        self._state_wanted.clear()
        self._transferee = None
        self._needs_broadcast = False
        self._reads.clear()

    def _can_campaign(self) -> bool:
        # Not while a snapshot is being installed (the log is about to be replaced), the
        # log is refilled (a leader must hold every entry its state points at), nor while
        # holding an entry it cannot read (it could not serve it as leader).
        return (
            self.id in self.membership.voters
            and self._installing is None
            and not self.refilling
            and not self._unreadable
        )

    def _guard_incoming(self, m: Message) -> Message | None:
        """`m` as this replica may act on it while entries await repair (None: drop it)."""
        if self.frozen or m.type == MsgType.TIMEOUT_NOW:
            return None
        if m.type in _FROM_LEADER:
            ahead = [i for i in self._unreadable if i > self.applied]
            if ahead and m.commit >= min(ahead):
                return replace(m, commit=min(ahead) - 1)
        return m

    def _stored(self, index: int) -> bool:
        """Whether entry `index` was handed to the store (not still pending here)."""
        p = self._pending
        last_stored = p[0].index - 1 if p else self._last_index
        return self._store.first_index() <= index <= last_stored

    def _campaign(self, kind: MsgType, *, transfer: bool = False) -> None:
        """Start a pre-vote round or a real election (`transfer` skips voters' lease check)."""
        if kind == MsgType.PREVOTE:
            self.role = Role.PRE_CANDIDATE
            self.leader = None
            term = self.term + 1
        else:
            self._become_follower(self.term + 1, None)
            self.role = Role.CANDIDATE
            self.vote = self.id
            self._hs_dirty = True
            term = self.term
        self._reset_timers()
        self._votes = {self.id: True}
        if self._tally() is True:
            self._won_election(kind)
            return
        for peer in self.membership.voters:
            if peer != self.id:
                self._out.append(
                    Message(
                        kind,
                        self.id,
                        peer,
                        term,
                        log_index=self._last_index,
                        log_term=self._last_term,
                        context=int(transfer),
                    )
                )

    def _tally(self) -> bool | None:
        """True when a quorum granted, False when a quorum refused, else None."""
        return vote_result(self.membership.voters, self._votes)

    def _won_election(self, kind: MsgType) -> None:
        if kind == MsgType.PREVOTE:
            self._campaign(MsgType.VOTE)  # pre-vote won: now the real election
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        self._reset_timers()
        self._progress = {p: Progress(self._last_index + 1) for p in self.membership.members}
        self._progress.setdefault(self.id, Progress(self._last_index + 1))
        me = self._progress[self.id]
        me.match = self._persisted
        me.recent_active = True
        # Any earlier membership entry may be uncommitted: allow no change until ours commits.
        self._pending_conf_index = self._last_index + 1
        self._handbacks_failed = self._handback_wait = 0
        self._append_new(EntryType.NOOP, b"")  # §5.4.2: lets this term commit older entries

    def _reset_timers(self) -> None:
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._timeout_forced = False

    def _random_timeout(self) -> int:
        return self.cfg.election_ticks + self._rng.randrange(self.cfg.election_ticks)

    def _in_lease(self) -> bool:
        return (
            self.cfg.check_quorum
            and self.leader is not None
            and self._election_elapsed < self.cfg.election_ticks
        )

    # ------------------------------------------------------------------ votes

    def _handle_vote_request(self, m: Message) -> None:
        pre = m.type == MsgType.PREVOTE
        can_vote = (
            self.vote == m.src
            or (self.vote is None and self.leader is None)
            or (pre and m.term > self.term)
        )
        if can_vote and self._up_to_date(m.log_index, m.log_term):
            if not pre:
                self.vote = m.src
                self._hs_dirty = True
                self._election_elapsed = 0
            self._out.append(Message(_VOTE_RESPONSE[m.type], self.id, m.src, m.term))
        else:
            self._send(_VOTE_RESPONSE[m.type], m.src, reject=True)

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in _FROM_LEADER:
            self._become_follower(self.term, m.src)
            self._step_follower(m)
            return
        expected = MsgType.PREVOTE_RESP if self.role == Role.PRE_CANDIDATE else MsgType.VOTE_RESP
        if t != expected:
            return
        if t == MsgType.PREVOTE_RESP and not m.reject and m.term != self.term + 1:
            return  # answers an older pre-vote round
        self._votes[m.src] = not m.reject
        result = self._tally()
        if result is True:
            self._won_election(MsgType.PREVOTE if t == MsgType.PREVOTE_RESP else MsgType.VOTE)
        elif result is False:
            self._become_follower(self.term, None)

    # ------------------------------------------------------------------ refill probes

    def _may_probe_refill(self) -> bool:
        """Refilling from our own snapshot (its state is what we applied), no install
        under way: a refill only a leader can bring, and none was heard of."""
        snap = self._snapshot
        return (
            self.refilling
            and self._installing is None
            and snap is not None
            and snap.index == self.commit == self.applied
            and self.id in self.membership.voters
        )

    def _probe_refill(self) -> None:
        """Ask every other voter whether it could refill us (see the module docstring)."""
        self._reset_timers()
        self._refill_round += 1
        self._refill_refused = set()
        snap = self._snapshot
        assert snap is not None
        others = self.membership.voters - {self.id}
        if not others:
            self._abandon_refill()
            return
        for peer in sorted(others):
            self._send(MsgType.REFILL_PROBE, peer, log_index=snap.index, log_term=snap.term,
                       context=self._refill_round)

    def _answer_refill_probe(self, m: Message) -> None:
        can = (
            not self.refilling
            and self._installing is None
            and (self._last_term, self._last_index) >= (m.log_term, m.log_index)
        )
        self._send(MsgType.REFILL_PROBE_RESP, m.src, context=m.context, reject=not can)

    def _refill_answer(self, m: Message) -> None:
        if m.context != self._refill_round or not self._may_probe_refill():
            return  # an older round's, or no longer stuck
        if not m.reject:
            return  # it can lead and refill us: wait for it
        self._refill_refused.add(m.src)
        if self._refill_refused >= self.membership.voters - {self.id}:
            self._abandon_refill()

    def _abandon_refill(self) -> None:
        """No voter holds what our state references below the snapshot: reinstall the
        snapshot with its base at its own index, so the log is whole from there on."""
        snap = self._snapshot
        assert snap is not None
        self.refill_gap = (self._last_index + 1, snap.index)
        self._refill_round += 1
        self._start_install(replace(snap, base=(snap.index, snap.term), lost=self.refill_gap))

    # ------------------------------------------------------------------ follower

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MsgType.APPEND:
            self._heard_from_leader(m.src)
            if self._installing is None:  # else dropped: the leader resends after us
                self._handle_append(m)
        elif t == MsgType.HEARTBEAT:
            self._heard_from_leader(m.src)
            if self._installing is None and m.commit > self._last_index:
                # The leader counts entries we acknowledged and no longer hold: our disk
                # was replaced. Say so, and where our log ends, so it probes afresh.
                self._send(MsgType.HEARTBEAT_RESP, m.src, context=m.context, reject=True,
                           hint_index=self._last_index + 1)
                return
            if self._installing is None:
                self._commit_to(m.commit)
            if self.stateless and self._installing is None:
                self._send(MsgType.HEARTBEAT_RESP, m.src, context=m.context,
                           hint_term=WANTS_STATE, hint_index=self._store.first_index())
            else:
                self._send(MsgType.HEARTBEAT_RESP, m.src, context=m.context)
        elif t == MsgType.SNAPSHOT:
            self._heard_from_leader(m.src)
            self._handle_snapshot(m)
        elif t == MsgType.TIMEOUT_NOW and self._can_campaign() and not self.stateless:
            # (a stateless replica would only hand leadership on again)
            self._campaign(MsgType.VOTE, transfer=True)

    def _heard_from_leader(self, leader: int) -> None:
        self._election_elapsed = 0
        self._refill_round += 1  # a leader may refill us: answers to a probe are void
        if self._timeout_forced:
            self._timeout_forced = False
            self._timeout = self._random_timeout()
        if self.leader != leader:
            self.leader = leader
            self._ack_to = None
            self._ack_index = self._acked = 0

    def _handle_append(self, m: Message) -> None:
        held = min(self.commit, self._last_index)  # the commit, unless refilling
        if m.log_index < held:
            # Our committed prefix is known to match; acknowledge as much of it as is
            # on disk (a follower's commit may run ahead of its fsync) and let it resend.
            self._send(MsgType.APPEND_RESP, m.src, log_index=min(held, self._persisted))
            return
        if not self._matches(m.log_index, m.log_term):
            self._reject_append(m)
            return
        entries = m.entries
        for k, e in enumerate(entries):
            if e.index > self._last_index or self.term_at(e.index) != e.term:
                if e.index <= min(self.commit, self._last_index):
                    raise AssertionError(f"{self.id}: conflict at committed index {e.index}")
                self._append_entries(entries[k:])
                break
        last_new = m.log_index + len(entries)
        self._commit_to(min(m.commit, last_new))
        self._ack_to = m.src
        self._ack_index = max(self._ack_index, last_new)
        self._flush_ack(repeat=last_new <= self._persisted)

    def _handle_snapshot(self, m: Message) -> None:
        """InstallSnapshot receiver (paper §7, Figure 13)."""
        if self._installing is not None or m.membership is None:
            return  # one install at a time (the leader resends if this one was lost)
        index, term = m.log_index, m.log_term
        if self.stateless:
            if self._handle_state_offer(m):
                return
            base = (m.hint_index, m.hint_term)  # an offer's base 0 is entry 0: from entry 1
        else:
            base = (m.hint_index, m.hint_term) if 0 < m.hint_index <= index else (index, term)
        if self.refilling and index <= self.commit and self._last_index >= base[0]:
            # Our state is newer and the leader holds the entry our refill needs next:
            # acknowledge our log's end (committed entries, so matching) and go on.
            self._handle_append(
                Message(MsgType.APPEND, m.src, m.dst, m.term, log_index=self._last_index,
                        log_term=self._last_term, commit=m.commit)
            )
            return
        if not self.refilling and (index <= self.commit or self._matches(index, term)):
            # Our log already holds the snapshot's last entry and so, by Log Matching,
            # everything before it: keep the log and what follows (paper §7), and
            # answer as to an empty append after that entry.
            self._handle_append(
                Message(MsgType.APPEND, m.src, m.dst, m.term, log_index=index, log_term=term,
                        commit=m.commit)
            )
            return
        self._start_install(Snapshot(index, term, m.snapshot, m.membership, base))

    def _handle_state_offer(self, m: Message) -> bool:
        """A snapshot sent to this stateless replica (see the module docstring, "Lost
        state"). When the log holds its last entry it is installed over the log as it
        is, if the log also holds everything from just after its base (`hint_index`, 0
        for a log from entry 1); if not, it is answered as an append there and a newer
        one is asked for. A snapshot older than the log's beginning is ignored. A log
        holding entries beyond a snapshot's last entry is never reset: it may hold
        acknowledged entries a commit counted. Returns False when the log lacks the
        snapshot's entry: the caller installs it as any follower does."""
        index, term = m.log_index, m.log_term
        first = self._store.first_index()
        if m.hint_index > index or index < first - 1:
            return True
        self._stateless_ticks = 0
        if not self._matches(index, term):
            return False
        if first <= m.hint_index + 1:
            self._start_install(Snapshot(index, term, m.snapshot, m.membership,
                                         (m.hint_index, m.hint_term), keep_log=True))
        else:
            self._handle_append(
                Message(MsgType.APPEND, m.src, m.dst, m.term, log_index=index, log_term=term,
                        commit=m.commit)
            )
        return True

    def _start_install(self, snap: Snapshot) -> None:
        assert snap.membership is not None
        index, term = snap.index, snap.term
        self._installing = self._snapshot_out = snap
        if snap.keep_log:
            return  # the log, its acknowledgements and its memberships stay as they are
        # The log is frozen until the shell reports back: no entries handed out (what is
        # pending dies with the log), no acknowledgements, commits or campaigns.
        self._ack_to = None
        self._ack_index = self._acked = 0
        # The snapshot's membership is persisted (with this Ready's hard state) before
        # the shell resets the log. Records of the old log stay for a restart that
        # finds the reset undone; they lie below the new first index once it is done.
        self._configs = [c for c in self._configs if c[0] < index]
        self._configs.append((index, term, snap.membership))
        self._hs_dirty = True

    def _reject_append(self, m: Message) -> None:
        """Reply with the xTerm/xIndex hint so the leader skips a whole term per round trip."""
        if m.log_index > self._last_index:
            hint_term, hint_index = 0, self._last_index + 1
        else:
            hint_term = self.term_at(m.log_index)
            hint_index = m.log_index
            while hint_index - 1 > self.commit and self.term_at(hint_index - 1) == hint_term:
                hint_index -= 1
        self._send(
            MsgType.APPEND_RESP,
            m.src,
            reject=True,
            log_index=m.log_index,
            hint_term=hint_term,
            hint_index=hint_index,
        )

    def _flush_ack(self, *, repeat: bool = False) -> None:
        """Acknowledge the longest prefix that both matches the leader and is on disk.

        `repeat` answers an append that brought nothing new to persist: the leader is
        resending because our earlier acknowledgement was lost.
        """
        if self._ack_to is None:
            return
        match = min(self._persisted, self._ack_index)
        if match > self._acked or (repeat and match > 0):
            self._acked = match
            self._send(MsgType.APPEND_RESP, self._ack_to, log_index=match)

    # ------------------------------------------------------------------ leader

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        retry = self.cfg.snapshot_retry_ticks
        for pr in self._progress.values():
            if pr.snapshot:
                pr.snapshot_tick(retry)  # lost: back to probe, resent on the next contact
        if self._handback_wait > 0:
            self._handback_wait -= 1
        if self._transferee is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.cfg.election_ticks:
                if self._transferee == self.preferred_leader:
                    # it was caught up and answering, yet did not campaign: it cannot
                    # lead now, and each attempt refuses proposals for an election timeout
                    self._handbacks_failed += 1
                    self._handback_wait = self.cfg.election_ticks * (
                        2 ** min(self._handbacks_failed, _HANDBACK_BACKOFF_MAX))
                self._transferee = None  # the target never took over: resume service
        if self._election_elapsed >= self.cfg.election_ticks:
            self._election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)
                return
            if self.stateless and self._needs_snapshot & self.membership.voters:
                # a voter lacks entries only a snapshot covers, and we hold none: make way
                # for a replica that can bring it up to date
                self._become_follower(self.term, None)
                return
            self._consider_preferred_leader()
        if self._heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._broadcast_heartbeat()
            if self.stateless:
                self._hand_off()

    def _quorum_active(self) -> bool:
        active = [p for p, pr in self._progress.items() if pr.recent_active or p == self.id]
        for pr in self._progress.values():
            pr.recent_active = False
        self._active_before = frozenset(active)
        return has_quorum(self.membership.voters, active)

    def _consider_preferred_leader(self) -> None:
        pref = self.preferred_leader
        if (
            pref is not None
            and pref != self.id
            and pref in self.membership.voters
            and self._transferee is None
            and self._handback_wait == 0
            and self._committed_in_term()
            and self._progress[pref].match == self._last_index
            # heard from lately: a down or cut-off node can take nothing over, and each
            # attempt would refuse proposals for an election timeout
            and pref in self.recently_active()
            and pref not in self._lacking_state  # it could serve nothing
        ):
            self.transfer_leadership(pref)

    def _broadcast_heartbeat(self) -> None:
        ctx = self._reads.pending_ctx
        for peer, pr in self._progress.items():
            if peer != self.id:
                pr.beat = True
                self._send(MsgType.HEARTBEAT, peer, commit=min(pr.match, self.commit), context=ctx)

    def _check_can_propose(self) -> None:
        if self.role != Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if self._transferee is not None:
            raise ProposalDropped(f"leadership is moving to {self._transferee}")
        if self.stateless:
            raise ProposalDropped("this leader lost its state: leadership moves to a peer")

    def _propose_config(self, new: Membership) -> int:
        self._check_can_propose()
        if self._pending_conf_index > self.commit:
            raise ProposalDropped("a membership change is still in progress")
        index = self._append_new(EntryType.CONFIG, new.encode())
        self._pending_conf_index = index
        return index

    def _append_new(self, type: EntryType, data: bytes | Sealable) -> int:
        index = self._last_index + 1
        if isinstance(data, bytes):
            entry = Entry(index, self.term, type, data)
        else:
            entry = data.seal(index, self.term, type)
        self._append_entries((entry,))
        self._needs_broadcast = True
        return index

    def _step_leader(self, m: Message) -> None:
        pr = self._progress.get(m.src)
        if pr is None:
            return  # not a member (any more)
        pr.recent_active = True
        t = m.type
        if t == MsgType.APPEND_RESP:
            if m.reject:
                if pr.rejected(m.log_index, self._next_after_reject(m)):
                    self._send_append(m.src)
            else:
                was_probe = not pr.replicating
                news = pr.acked(m.log_index)  # leaves SNAPSHOT once the snapshot is in
                if pr.snapshot and pr.match + 1 >= self._store.first_index():
                    pr.become_probe()  # the log holds all it lacks: no snapshot needed
                if news:
                    if was_probe and not pr.snapshot:
                        pr.become_replicate()
                    self._maybe_commit()
                    if self.role != Role.LEADER:
                        return  # the commit removed us from the group
                    if self._transferee == m.src and pr.match == self._last_index:
                        self._send(MsgType.TIMEOUT_NOW, m.src)
                elif was_probe and not pr.snapshot and pr.match == self._last_index:
                    pr.become_replicate()
                self._send_append(m.src, fill=True)
                if self.stateless:
                    self._hand_off()
        elif t == MsgType.HEARTBEAT_RESP:
            if m.reject:
                pr.lost(m.hint_index)
            elif m.hint_term == WANTS_STATE:
                self._lacking_state.add(m.src)
                self._offer_state(m.src, pr, m.hint_index)
            else:
                self._lacking_state.discard(m.src)
                self._state_wanted.pop(m.src, None)
            # once per heartbeat interval, not per answer: ReadIndex rounds bring many,
            # and each must not cost a follower far behind another append read and sent
            if pr.beat_answered(self.cfg.max_inflight) and pr.match < self._last_index:
                self._send_append(m.src, empty_ok=True)
            if m.context:
                self._ack_read_rounds(m.src, m.context)

    def _next_after_reject(self, m: Message) -> int:
        """Fast backup: skip the follower's whole conflicting term in one round trip."""
        if m.hint_term == 0:
            return m.hint_index
        i = min(m.log_index, self._last_index)
        floor = self._store.first_index() - 1  # terms below it are gone with the entries
        while i > floor and self.term_at(i) > m.hint_term:
            i -= 1
        if i >= floor and i > 0 and self.term_at(i) == m.hint_term:
            return i + 1
        return m.hint_index  # (below our first index too: the snapshot will cover it)

    def _send_append(self, peer: int, *, fill: bool = False, empty_ok: bool = False) -> None:
        """Send what `peer` lacks: one append in probe, up to the window when replicating."""
        pr = self._progress[peer]
        if pr.snapshot:
            return  # a snapshot is on its way: wait for its acknowledgement
        first = self._store.first_index()
        if pr.next < first:
            self._send_snapshot(peer, pr, first)
            return
        self._needs_snapshot.discard(peer)
        while pr.can_send(self.cfg.max_inflight):
            lo = pr.next
            entries: list[Entry] = []
            if lo <= self._last_index:
                entries = self._entries(lo, self._last_index + 1, self.cfg.max_append_bytes)
                if not entries and lo in self._unreadable:
                    return  # resent after its repair (a heartbeat answer asks again)
            elif pr.replicating and not empty_ok:
                return  # nothing new; heartbeats carry the commit index
            prev = lo - 1
            self._out.append(
                Message(
                    MsgType.APPEND,
                    self.id,
                    peer,
                    self.term,
                    log_index=prev,
                    log_term=self.term_at(prev),
                    entries=tuple(entries),
                    commit=self.commit,
                )
            )
            pr.sent(entries[-1].index if entries else prev)
            if not (fill and pr.replicating and entries):
                return
            empty_ok = False

    def _send_snapshot(self, peer: int, pr: Progress, first: int) -> None:
        """`peer` needs entries below our first index: send the snapshot that covers them."""
        snap = self._snapshot
        if snap is None or snap.index < first - 1:
            self._needs_snapshot.add(peer)  # nothing covers the gap: heartbeats only
            return
        if not pr.can_send(self.cfg.max_inflight):
            return
        self._needs_snapshot.discard(peer)
        base = (first - 1, self._store.term(first - 1))
        if "snapshot-no-base" in self.cfg.mutations:
            base = (snap.index, snap.term)  # the follower keeps no entry its state points at
        self._send_snapshot_message(peer, snap, base)  # the follower's log restarts after it
        pr.become_snapshot(snap.index)

    def _send_snapshot_message(self, peer: int, snap: Snapshot, base: tuple[int, int]) -> None:
        self._out.append(
            Message(
                MsgType.SNAPSHOT,
                self.id,
                peer,
                self.term,
                log_index=snap.index,
                log_term=snap.term,
                commit=self.commit,
                snapshot=snap.data,
                membership=snap.membership,
                hint_index=base[0],
                hint_term=base[1],
            )
        )

    def _hand_off(self) -> None:
        """A leader without state serves nothing: hand leadership to the first voter
        whose log caught up with ours (it may lack a state too: the transfer then times
        out and the next one is tried)."""
        if self._transferee is not None:
            return
        for peer in sorted(self.membership.voters - {self.id}):
            if self._progress[peer].match == self._last_index and peer not in self._lacking_state:
                self.transfer_leadership(peer)
                return

    def _offer_state(self, peer: int, pr: Progress, their_first: int) -> None:
        """`peer` lost its state but kept its log (see the module docstring, "Lost
        state"): send it our snapshot once its log holds what that snapshot needs."""
        if pr.snapshot:
            return  # one on its way already
        snap = self._snapshot
        first = self._store.first_index()
        base = first - 1  # everything our state references lies above both bases
        if snap is not None and snap.base is not None:
            base = max(base, snap.base[0])
        if snap is None or their_first > base + 1:
            self._state_wanted[peer] = their_first  # none, or its log was cut above our base
            return
        self._state_wanted.pop(peer, None)
        if pr.match < snap.index:
            return  # its log does not hold the snapshot's entry yet: appends bring it
        self._send_snapshot_message(peer, snap, (base, self._store.term(base)))
        pr.offer_state(snap.index)

    def _maybe_commit(self) -> None:
        match = {p: pr.match for p, pr in self._progress.items()}
        index = committed_index(self.membership.voters, match)
        if index <= self.commit:
            return
        if self.term_at(index) != self.term and "commit-old-term" not in self.cfg.mutations:
            return  # §5.4.2: never commit an older term's entry by counting replicas
        self._commit_to(index)
        self._needs_broadcast = True
        if self._committed_in_term():
            self._reads.term_committed()
        if self.id not in self.membership.voters and self.commit >= self._configs[-1][0]:
            self._become_follower(self.term, None)  # thesis §4.2.2: removed leader steps down

    def _committed_in_term(self) -> bool:
        return self.commit > 0 and self.term_at(self.commit) == self.term

    # ------------------------------------------------------------------ ReadIndex

    def _start_read_round(self) -> None:
        single = len(self.membership.voters) == 1
        ctx, answered = self._reads.start_round(self.commit, self.id, single)
        self._reads_out.extend(answered)
        if not ctx:
            return
        for peer, pr in self._progress.items():
            if peer != self.id:
                self._send(MsgType.HEARTBEAT, peer, commit=min(pr.match, self.commit), context=ctx)

    def _ack_read_rounds(self, peer: int, ctx: int) -> None:
        self._reads_out.extend(self._reads.ack(peer, ctx, self.membership.voters))

    # ------------------------------------------------------------------ log

    def _append_entries(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Append (possibly replacing a conflicting suffix from entries[0].index)."""
        first = entries[0].index
        if first <= self._last_index:
            self._truncate_from(first)
        p = self._pending
        if p and first != p[-1].index + 1:
            raise AssertionError("pending entries must stay contiguous")
        p.extend(entries)
        last = entries[-1]
        self._last_index, self._last_term = last.index, last.term
        for e in entries:
            # (one at or below the commit comes with a refill: the snapshot's membership
            # already covers it)
            if e.type == EntryType.CONFIG and e.index > self.commit:
                self._add_config(e)

    def _truncate_from(self, index: int) -> None:
        if index <= self.commit:
            raise AssertionError(f"{self.id}: truncating committed index {index}")
        p = self._pending
        if p and index >= p[0].index:
            del p[index - p[0].index :]
        else:
            # The store holds the suffix: the next Ready's entries start at `index`,
            # which tells the shell to truncate there first. Keep what's pending below.
            self._pending = []
        self._last_index = index - 1
        self._last_term = self.term_at(index - 1)
        self._persisted = min(self._persisted, index - 1)
        self._unreadable = {i for i in self._unreadable if i < index}  # replaced ones are new
        self._ack_index = min(self._ack_index, index - 1)
        if self._configs[-1][0] >= index:
            self._configs = [c for c in self._configs if c[0] < index]
            self._hs_dirty = True
            self._membership_changed()

    def _add_config(self, e: Entry) -> None:
        self._configs.append((e.index, e.term, Membership.decode(e.data)))
        self._hs_dirty = True
        self._membership_changed()

    def _membership_changed(self) -> None:
        if self.role != Role.LEADER:
            return
        members = self.membership.members | {self.id}
        for p in list(self._progress):
            if p not in members:
                del self._progress[p]
                self._needs_snapshot.discard(p)
        for p in members - self._progress.keys():
            self._progress[p] = Progress(self._last_index)

    def _commit_to(self, index: int) -> None:
        if index <= self.commit:
            return
        self.commit = index
        if len(self._configs) == 1:
            return
        # Forget membership records superseded by a committed one that is also on our
        # disk: the hard state must still name a membership after a crash loses the tail.
        # Keep the one in force at our snapshot (0: none), where a restart resumes, so
        # that `membership_at` stays right for every snapshot taken after it.
        settled_at = min(index, self._persisted, self.snapshot_index)
        settled = [c for c in self._configs if c[0] <= settled_at]
        if len(settled) > 1:
            self._configs = [settled[-1], *(c for c in self._configs if c[0] > settled_at)]
            self._hs_dirty = True

    def _send(self, type: MsgType, to: int, **fields: object) -> None:
        self._out.append(Message(type, self.id, to, self.term, **fields))  # type: ignore[arg-type]

    def describe(self) -> str:
        installing = f" installing={self._installing.index}" if self._installing else ""
        return (
            f"node {self.id} {self.role.name} t{self.term} lead={self.leader} "
            f"last={self._last_index}@{self._last_term} commit={self.commit} "
            f"applied={self.applied} persisted={self._persisted}{installing}"
        )
