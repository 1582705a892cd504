"""Values exchanged between the Raft core and the shell that drives it.

Everything here is an immutable value: entries, messages, the hard state the shell
persists, and the `Ready` bundle the core hands out after each batch of events.

The contract the shell keeps with the core (the etcd `Ready` loop, adapted):

1. Feed events: `tick()`, `step(msg)`, `propose(...)`, `persisted(index, term)`, ...
2. Call `ready()`. It drains everything the core wants done:
   a. `hard_state`, when set, is persisted atomically (and fsynced) *before* any message
      of this Ready is sent: vote grants and term changes depend on it.
   b. `snapshot`, when set (followers only), replaces the state machine and the log:
      make it durable (so a restart restores it), restore the state machine from its
      `data`, reset the store so that it holds no entries and `first_index() == b + 1`
      with `term(b) == t`, where (b, t) is `snapshot.base`, then call
      `snapshot_installed(index, term)`. The core then holds a log ending before the
      state (it is refilling: `raftlog.core`) until the leader's appends reach `index`. The hard state of the same Ready already names
      `snapshot.membership`; a Ready that carries a snapshot carries no `entries` and
      no `apply`. The install may take a while (the shell may await it): until
      `snapshot_installed` the core keeps taking events but appends nothing,
      acknowledges nothing, commits nothing and does not campaign. Should the process
      die in between, the shell finishes the install on restart (its snapshot is newer
      than its log) or starts over from its old log (it had not written the snapshot).
   c. `entries` are appended to the store before the next event is fed. When
      `entries[0].index <= store.last_index()` the store first truncates its suffix from
      that index (a conflicting, uncommitted tail). Durability may lag: the shell calls
      `persisted(index, term)` once an fsync covers `index`. Append acknowledgements and
      the leader's own vote in the commit count wait for that call, never for the write.
   d. `messages` may then be sent.
   e. `apply` entries are committed; hand them to the state machine in order.
   f. `reads` are ReadIndex answers: serve request `id` once applied >= `index`.
   g. `repair` lists entries newly found unreadable (`EntryUnreadable`, or reported with
      `entry_unreadable`): fetch each one's stored bytes from a peer, and report
      `entry_repaired(index)` once it reads again.
3. At construction the core assumes everything in the store is durable. A shell that
   restored its state machine from a snapshot passes `applied=snapshot.index` and hands
   the snapshot to `set_snapshot`, as it does each time it takes a new one: a leader
   sends its latest snapshot to a follower that needs entries below `first_index()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

__all__ = [
    "Entry",
    "EntryType",
    "EntryUnreadable",
    "HardState",
    "LogStore",
    "Membership",
    "Message",
    "MsgType",
    "ReadState",
    "Ready",
    "Role",
    "Sealable",
    "Snapshot",
]


class EntryType(IntEnum):
    NOOP = 0  # appended by every new leader so it can commit entries of older terms
    MESSAGES = 1  # a producer batch, stored byte-for-byte
    CONTROL = 2  # broker control records (offsets, transactions, topic config, ...)
    CONFIG = 3  # a membership change: msgpack of the whole new Membership


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. `frame`, when set, is its stored form (header with both CRCs, then
    `data`), made once by the leader that proposed it or received from a peer and
    verified: storage and the wire use it as is rather than encode the entry again, and
    `data` is then a view of it. Equality ignores it."""

    index: int
    term: int
    type: EntryType
    data: bytes | memoryview = b""
    frame: bytes | memoryview | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        return f"{self.index}@{self.term}:{self.type.name}({len(self.data)}B)"


class Sealable(Protocol):
    """A proposal the shell laid out in its stored form ahead of time (for the CommitLog,
    `raftlog.commitlog.EntryDraft`): once the core has given it an index and a term,
    `seal` returns the entry, its frame complete. The core only asks its length."""

    def __len__(self) -> int: ...

    def seal(self, index: int, term: int, type: EntryType) -> Entry: ...


@dataclass(frozen=True, slots=True)
class Membership:
    """The voters and learners of a group. Learners replicate but neither vote nor count."""

    voters: frozenset[int]
    learners: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.voters:
            raise ValueError("a membership needs at least one voter")
        if self.voters & self.learners:
            raise ValueError("a node cannot be both voter and learner")

    @property
    def members(self) -> frozenset[int]:
        return self.voters | self.learners

    def encode(self) -> bytes:
        import msgpack

        return msgpack.packb({"v": sorted(self.voters), "l": sorted(self.learners)})

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Membership:
        import msgpack

        d = msgpack.unpackb(data)
        return cls(frozenset(d["v"]), frozenset(d["l"]))


@dataclass(frozen=True, slots=True)
class HardState:
    """What must survive a crash besides the log: term, vote, and membership history.

    `configs` lists (index, term, membership) of CONFIG entries still in the log plus the
    bootstrap membership at index 0. Membership takes effect when appended (Raft thesis
    §4.1), so it is persisted here rather than recovered by scanning a large log.
    """

    term: int = 0
    vote: int | None = None
    configs: tuple[tuple[int, int, Membership], ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A state-machine image that includes every entry up to `index` (of term `term`).

    `membership` is the configuration in force at `index` (the last CONFIG entry at or
    below it, else the bootstrap one): a replica that installs the snapshot has no log
    left to learn it from (etcd's ConfState). It is None only in snapshot files written
    before it was recorded; the core then falls back on the configurations it knows.

    `base` is set on a snapshot installed from a leader: the (index, term) of the entry
    just before the first one the leader still held. A state may point into the log
    below its own index (the broker's ConsumeQueues reference every retained entry), so
    the installing replica keeps its log from the base on, not from `index`, and gets
    the entries in between through ordinary appends before it may lead (see
    `raftlog.core`, "Refilling"). None on a replica's own snapshot: its log already
    holds what its state references.

    `lost` is set only on the snapshot a replica reinstalls from itself when it abandons
    a refill no voter can supply (`raftlog.core`, "Refilling"): the entries (first, last)
    its state references that are gone from every log. Not saved with the file.

    `keep_log` is set only on a snapshot a leader offered a replica that lost its state
    but kept its log (`raftlog.core`, "Lost state"): the shell restores the state and
    keeps the log as it is, which already holds everything the state references. Not
    saved with the file.
    """

    index: int
    term: int
    data: bytes
    membership: Membership | None = None
    base: tuple[int, int] | None = None
    lost: tuple[int, int] | None = None
    keep_log: bool = False

    def __post_init__(self) -> None:
        if self.base is not None and not 0 <= self.base[0] <= self.index:
            raise ValueError(f"snapshot {self.index}: base {self.base[0]} outside [0, {self.index}]")

    def describe(self) -> str:
        m = self.membership
        who = f" voters {sorted(m.voters)}" if m is not None else ""
        if m is not None and m.learners:
            who += f" learners {sorted(m.learners)}"
        if self.base is not None and self.base[0] < self.index:
            who += f" log from {self.base[0] + 1}"
        if self.lost is not None:
            who += f" entries {self.lost[0]}..{self.lost[1]} lost"
        return f"snapshot {self.index}@{self.term} ({len(self.data)}B){who}"


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class MsgType(IntEnum):
    PREVOTE = 0
    PREVOTE_RESP = 1
    VOTE = 2
    VOTE_RESP = 3
    APPEND = 4
    APPEND_RESP = 5
    HEARTBEAT = 6
    HEARTBEAT_RESP = 7
    TIMEOUT_NOW = 8
    SNAPSHOT = 9
    REFILL_PROBE = 10
    REFILL_PROBE_RESP = 11


@dataclass(frozen=True, slots=True)
class Message:
    """One Raft message. Field meaning depends on `type`:

    - PREVOTE/VOTE: `log_index`/`log_term` = candidate's last entry; `context` = 1 when
      the election is a leadership transfer (voters skip the leader-lease check).
    - *_RESP to votes: `reject`.
    - APPEND: `log_index`/`log_term` = previous entry; `entries`; `commit`.
    - APPEND_RESP: success → `log_index` is the follower's match; reject → `log_index` is
      the rejected previous index, `hint_term`/`hint_index` the fast-backup hint (xTerm,
      xIndex), `commit` unused.
    - HEARTBEAT: `commit` (never above the follower's match), `context` = ReadIndex round.
    - HEARTBEAT_RESP: `context` echoed; `reject` when the heartbeat's commit lies beyond
      the follower's log (it lost entries it had acknowledged: a replaced disk), with
      `hint_index` = its last index + 1. Otherwise `hint_term` = `WANTS_STATE` when the
      follower lost its state but kept its log (`raftlog.core`, "Lost state"), with
      `hint_index` = its log's first index: the leader offers it a snapshot.
    - SNAPSHOT (InstallSnapshot: paper §7, thesis §5.1): `log_index`/`log_term` = the
      last entry the snapshot includes, `membership` = the configuration in force there,
      `snapshot` = the state machine's bytes, `commit` = the leader's, `hint_index`/
      `hint_term` = the snapshot's base: the entry just before the first one the leader
      holds (0: none given, the follower's log starts after `log_index`). Answered by an
      APPEND_RESP whose match is the base once the follower has installed it durably;
      the leader then sends the entries from there on as usual.

    - REFILL_PROBE (a refilling replica that heard from no leader, see `raftlog.core`,
      "Refilling"): `log_index`/`log_term` = its snapshot's last entry, `context` = the
      probe round. Never changes a term.
    - REFILL_PROBE_RESP: `context` echoed; `reject` when the sender cannot refill it (it
      is refilling or installing too, or its log ends before that entry).

    The core hands out the whole snapshot in one message, which keeps the protocol
    simple; the shell's transport may carry it in chunks (the node's peer links do, with
    each chunk's offset and the total size, heartbeats passing between chunks) and
    steps the receiver's core with the reassembled message. The image is held whole in
    memory at both ends; the thesis' per-chunk acknowledgements are not needed over one
    ordered connection, and a transfer cut short is resent whole like a lost message.
    """

    type: MsgType
    src: int
    dst: int
    term: int
    log_index: int = 0
    log_term: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0
    context: int = 0
    snapshot: bytes = b""
    membership: Membership | None = None

    def describe(self) -> str:
        parts = [f"{self.src}->{self.dst} {self.type.name} t{self.term}"]
        if self.type in (MsgType.APPEND, MsgType.PREVOTE, MsgType.VOTE, MsgType.SNAPSHOT,
                         MsgType.REFILL_PROBE):
            parts.append(f"[{self.log_index}@{self.log_term}]")
        if self.type == MsgType.SNAPSHOT:
            parts.append(f"({len(self.snapshot)}B)")
        if self.entries:
            parts.append(f"+{len(self.entries)}({self.entries[0].index}..{self.entries[-1].index})")
        if self.type in (MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT):
            parts.append(f"c{self.commit}")
        if self.type == MsgType.APPEND_RESP:
            parts.append(
                f"reject {self.log_index} hint {self.hint_index}@{self.hint_term}"
                if self.reject
                else f"match {self.log_index}"
            )
        elif self.reject:
            parts.append("reject")
        if self.context:
            parts.append(f"ctx{self.context}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ReadState:
    """A confirmed ReadIndex: request `id` may be served once applied >= `index`."""

    id: int
    index: int


class EntryUnreadable(Exception):
    """Raised by `LogStore.entries` for an entry the store holds but cannot read (its
    bytes fail their checks); the store still knows its index and term."""

    def __init__(self, index: int, reason: str = "") -> None:
        super().__init__(f"entry {index} is unreadable" + (f": {reason}" if reason else ""))
        self.index = index


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    apply: list[Entry] = field(default_factory=list)
    reads: list[ReadState] = field(default_factory=list)
    snapshot: Snapshot | None = None  # to install (followers): see the module docstring
    repair: list[int] = field(default_factory=list)  # unreadable entries to refetch

    def __bool__(self) -> bool:
        return bool(
            self.hard_state is not None
            or self.snapshot is not None
            or self.entries
            or self.messages
            or self.apply
            or self.reads
            or self.repair
        )


class LogStore(Protocol):
    """Read-only view of the durable-or-written log that the core consults.

    Index 0 is the sentinel before the first entry: `term(0) == 0`. Retention may delete
    a prefix, and installing a snapshot replaces the whole log: entries then start at
    `first_index()`, and `term(first_index() - 1)` must still be answered (it is the
    previous term of the first entry a leader can send). A log may hold no entries at
    all: `last_index() == first_index() - 1`.
    """

    def first_index(self) -> int:
        """Oldest index held (1 unless retention deleted a prefix)."""
        ...

    def last_index(self) -> int: ...

    def term(self, index: int) -> int: ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi); at least one if lo < hi, then as many as fit in max_bytes.

        An entry it cannot read ends the list early; when it is the first, the store
        raises `EntryUnreadable`."""
        ...
