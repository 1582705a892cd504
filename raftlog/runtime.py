"""The trio shell around one replica of one Raft group: disk, timers and proposals.

The core (`raftlog.core.RaftNode`) decides; this module only carries out its `Ready`
bundles, through the driver it shares with the simulator (`raftlog.driver`), in the
order `raftlog.types` prescribes:

* the hard state is saved (fsync + rename, in a worker thread) before any message of
  the same Ready leaves;
* a snapshot from the leader is installed (see below) in a task beside the loop: until
  it is done the core hands out nothing that depends on it;
* entries are written to the CommitLog at once (page cache; a conflicting suffix is
  truncated first, durably, in a worker thread), and a separate sync task
  runs group commit off the event loop: one `SyncPlan` (fdatasync of every segment
  written since the last) in a worker thread covers every append made before it began,
  and only then does the core hear `persisted()` — so acknowledgements and the leader's
  own commit vote wait for the disk, while appends keep streaming meanwhile;
* messages go to the node's peer links (non-blocking; Raft tolerates their loss);
* committed entries are applied to the group's state machine, which resolves the
  proposals waiting for them.

One ready-loop task per group drains the core, so everything proposed while a loop
iteration or an fsync was running lands in the next append and the next fsync. The
sync task drains it too, at once, after telling it what an fsync persisted when nothing
newer waits for an fsync (the acknowledgement or commit that the fsync allows leaves
without another task's turn; with more to sync, that fsync starts first).
Back-pressure: proposals wait while the group holds more than `max_uncommitted_bytes`
of proposed-but-unapplied data (slow followers or a slow disk).

Blocking disk work never runs on the event loop, which every group of the node shares:
hard-state saves, truncations, snapshot restore, writes and installs, segment deletion,
entry repairs and the reads of the door below run in worker threads (`trio.to_thread`).
The CommitLog is not thread-safe, so per group one task at a time holds the log and the
core (`_hold`); events for the core that arrive meanwhile wait their turn (`_give`).

A full disk (ENOSPC, EDQUOT) stops the group, not the node: the step that failed is
retried until it works (a failed append is undone, torn tail included), and meanwhile
the group sends and acknowledges nothing of that Ready, drops what it is sent as a
paused process would, and refuses proposals and reads (`DiskFull`). Once a write
succeeds it resumes and catches up like any replica that fell behind.

Nothing here knows about topics: the state machine is any object with `apply(entry)`.

Snapshots: a state machine may also offer `snapshot() -> bytes` (or, better,
`snapshot_later() -> Callable[[], bytes]`: detach a copy now, serialise it later in a
worker thread; the callable may also have a `saved()` method, called in that thread once
the snapshot file holding its bytes is durable) and a `retained_index` (entries below it are no longer needed). The state
is snapshotted at the last index of an applied batch when that batch advances
`retained_index`, and every `snapshot_every_entries` applied entries. The snapshot (with
the membership in force at its index) is written to `<group dir>/snapshot` (temp, fsync,
rename, fsync dir) in a worker thread and handed to the core, whose leader sends it to
followers lacking entries below the log's first index; for retention, log segments
below min(retained_index, snapshot index + 1) are deleted only then. On open a snapshot
is restored through the `restore` callback and the core starts with `applied=` its
index, so replay resumes after it.

Installing a snapshot a leader sent (`Ready.snapshot`): the state is restored through
`restore` (which also checks it), the file written, the CommitLog reset to start after
the snapshot's base (`CommitLog.reset_to`), then the core told; the leader then sends
the entries from the base on, which the state references (ConsumeQueues point at every
retained entry), and the core neither campaigns nor applies until its log reaches the
snapshot again (`raftlog.core`, "Refilling"). On open, an installed snapshot whose
entries the log does not hold yet (a crash came after the file was written, before the
reset or during the refill) resets the log to its base again: the refill starts over.
A replica's own snapshot records the retention horizon as its base (its log holds
everything from there), so one found ahead of its log (a follower applies entries
before its fsync covers them, and a crash lost them) is refilled the same way.
Snapshot files only ever move forward (writes are serialised and an older snapshot of
its own never replaces a newer one), but for the install that restarts a refill from
an older leader's snapshot.

Corrupt entries: the CommitLog keeps an entry whose bytes fail their CRCs but whose
index record is intact (`raftlog.commitlog`, "Repair"), so the log's length and terms,
and with them this replica's votes, stay right. What such an entry changes in Raft
belongs to the core (`RaftNode.entry_unreadable`: never handed out, commit capped below
it, no campaigning, frozen once it is the next to apply), which learns of them at open
(the CommitLog's recovery report plus a `verify` of every entry the replay will apply,
those after the snapshot), whenever a read meets one (the core's own reads through the
guard below, and `report_corrupt` for other readers), and lists them in `Ready.repair`.
A repair task fetches their stored bytes from a peer replica a run of consecutive
entries at a time (`fetch_raw`, e.g. the node's READ_RAW request, which answers a prefix
of the run; any replica's entry with the same index and term is the same entry), has
`CommitLog.repair_many` check each and write them with one fsync, tells the core
(`entry_repaired`), and retries across peers with backoff until each is repaired.

An entry no peer holds any more (every peer answers that retention removed it), or one
`CommitLog.repair` refuses to write back in this log (its index record places it where
it cannot go), is logged as an error and retried rarely: it stays unreadable, and if it
lies above the snapshot this replica cannot apply past it. Only a repair whose write or
fsync failed (the CommitLog closes itself) ends the group, as a failed sync does.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Literal, Protocol, TypeVar

import trio

from raftlog.commitlog import (
    CommitLog,
    CommitLogError,
    CorruptEntry,
    EntryDraft,
    SegmentInfo,
    split_stored,
)
from raftlog.core import NotLeader, ProposalDropped, RaftConfig, RaftNode
from raftlog.driver import Blocking, drain_async
from raftlog.fsutil import CorruptFile, fsync_dir
from raftlog.hardstate import HardStateFile
from raftlog.refillgap import load_refill_gap, save_refill_gap
from raftlog.snapshot import Snapshot, SnapshotSkipped, load_snapshot, save_snapshot
from raftlog.syncthread import SyncThread
from raftlog.types import (
    Entry,
    EntryType,
    EntryUnreadable,
    HardState,
    Membership,
    Message,
    MsgType,
    ReadState,
    Role,
)

__all__ = [
    "DiskCall",
    "DiskFull",
    "when_space",
    "EntryUnavailable",
    "FetchRaw",
    "GroupOptions",
    "GroupRuntime",
    "MissingEntries",
    "NotLeader",
    "NotReady",
    "ProposalDropped",
    "ProposalInDoubt",
    "ProposalLost",
    "StateMachine",
]

log = logging.getLogger("raftmq.raft")


class StateMachine(Protocol):
    """`apply` is required. Optional, for snapshots and retention: `snapshot() -> bytes`
    or `snapshot_later() -> Callable[[], bytes]`, and an int `retained_index` property
    (see the module docstring).

    An entry this replica proposed with a `context` (see `GroupRuntime.propose`) is
    applied as ``apply(entry, context)``: the proposer's own work on the entry (e.g. a
    batch it already parsed) comes back with it. The outcome must not depend on it."""

    def apply(self, entry: Entry) -> Any: ...


M = TypeVar("M", bound=StateMachine)


class MissingEntries(Exception):
    """The log starts after what the snapshot covers: entries in between are lost."""


class ProposalLost(Exception):
    """Another entry took the proposal's place in the log: it was never committed."""


class NotReady(NotLeader):
    """This replica leads the group but has not yet applied an entry of its own term, so
    its state may lack what its predecessor committed (the commit index is not stored;
    a new leader learns it only once its first entry commits). Retriable, at this same
    replica (`leader` names it), usually within a heartbeat round trip."""

    def __init__(self, leader: int, term: int) -> None:
        super().__init__(leader, term)
        self.args = (f"leader of term {term}, not ready yet: entries committed before the "
                     "election are still being applied",)


class ProposalInDoubt(NotLeader):
    """Leadership was lost (or the replica stopped, or its disk filled) after the
    proposal was appended to this replica's log and before it committed: followers may
    hold it, so the next leader may still commit it. A NotLeader like any other for
    routing (`leader`, `term`), but the proposal's outcome is unknown, not nothing."""

    def __init__(self, cause: NotLeader) -> None:
        super().__init__(cause.leader, cause.term)
        self.args = (f"leadership was lost before the proposal committed; it may still "
                     f"commit ({cause})",)


class DiskFull(NotLeader):
    """This replica's disk is full: until space is freed its group writes, sends and
    acknowledges nothing, and refuses proposals and reads (retriable elsewhere, as from
    a replica that does not lead). It resumes by itself once a write succeeds again."""

    def __init__(self, group_id: str) -> None:
        super().__init__(None)
        self.args = (f"no space left on this node's disk: group {group_id} takes no writes "
                     "until space is freed",)


class EntryUnavailable(Exception):
    """A peer cannot hand out an entry's stored bytes. `gone`: it never will, retention
    removed the entry there (else it may later: it lags, or its copy is corrupt too)."""

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


#: (peer node id, lo, hi) -> the stored bytes at the peer of entries [lo, hi) (`read_raw`),
#: a prefix of that range holding at least entry `lo`; raises EntryUnavailable (the peer
#: cannot supply `lo`) or any transport error.
FetchRaw = Callable[[int, int, int], Awaitable[bytes]]

#: How a worker thread makes one blocking disk call for a group: ``disk_call(fn)``
#: returns ``fn()``. The default is exactly that; a test may slow the call down.
DiskCall = Callable[[Callable[[], Any]], Any]


def _call(fn: Callable[[], Any]) -> Any:
    return fn()

_REPAIR_TIMEOUT = 3.0  # seconds for one fetch from one peer
_REPAIR_RANGE = 4096  # entries asked for at most in one fetch (the peer bounds the bytes)
_REPAIR_BACKOFF = (0.05, 5.0)  # first and longest pause between rounds over the peers
_REPAIR_GONE_PAUSE = 60.0  # between rounds once every peer said the entry is gone
_RECENT_BYTES = 32 << 20  # written-but-unapplied entry data served from memory
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_SPACE_RETRY = (0.05, 1.0)  # first and longest pause between writes on a full disk
FORCED_SNAPSHOT_INTERVAL = 5.0  # seconds between snapshots taken for a follower's lost state


T = TypeVar("T")


async def when_space(work: Callable[[], T], doing: str, done: str, **fields: Any) -> T:
    """``work()`` in a worker thread, tried again and again while it fails for lack of
    space (ENOSPC, EDQUOT; `work` must be safe to retry), with a pause that grows to a
    second: a node that meets a full disk waits for space to be freed instead of
    exiting. Says once that it waits (``disk full <doing>``), and once the work is
    done after waiting (``disk space is back: <done>``)."""
    pause, waiting = _SPACE_RETRY[0], False
    while True:
        try:
            result = await trio.to_thread.run_sync(work)
        except (OSError, CommitLogError) as exc:
            if not _for_lack_of_space(exc):
                raise
            if not waiting:
                waiting = True
                log.error(f"disk full {doing}: it waits for space",
                          extra={"fields": {**fields, "error": str(exc)}})
            await trio.sleep(pause)
            pause = min(pause * 2, _SPACE_RETRY[1])
            continue
        if waiting:
            log.warning(f"disk space is back: {done}", extra={"fields": fields})
        return result


def _for_lack_of_space(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from (the CommitLog wraps some), is a
    full disk."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain, not a cycle
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in _NO_SPACE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _GuardedLog:
    """The CommitLog as the core sees it: a corrupt entry is reported to the core as
    `EntryUnreadable` (the core then never asks for it again until it is repaired).

    Entries this replica stored and has not yet applied are also kept in memory
    (`remember`, up to `_RECENT_BYTES`): the core asks for each of them again to apply
    it a moment later, and serving those from the objects just written spares a read
    and two CRC checks per entry. They are the bytes this process wrote (the CRCs were
    computed from them), so nothing unverified is served; anything read back from the
    files still goes through the CommitLog's checks.
    """

    __slots__ = ("_log", "_recent", "_recent_lo", "_recent_bytes")

    def __init__(self, log: CommitLog) -> None:
        self._log = log
        self._recent: list[Entry] = []  # contiguous, starting at index `_recent_lo`
        self._recent_lo = 0
        self._recent_bytes = 0

    def first_index(self) -> int:
        return self._log.first_index()

    def last_index(self) -> int:
        return self._log.last_index()

    def term(self, index: int) -> int:
        return self._log.term(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo >= hi:
            return []
        out: list[Entry] = []
        recent, rlo = self._recent, self._recent_lo
        if recent and rlo <= lo < rlo + len(recent):
            size = 0
            for e in recent[lo - rlo : hi - rlo]:
                if out and size + len(e.data) > max_bytes:
                    return out
                out.append(e)
                size += len(e.data)
            lo = out[-1].index + 1
            if lo >= hi:
                return out
            max_bytes -= size
            if max_bytes <= 0:
                return out
        try:
            out += self._log.entries(lo, hi, max_bytes)
        except CorruptEntry as exc:
            if not out:
                raise EntryUnreadable(exc.index if exc.index is not None else lo, str(exc)) from None
        return out

    def remember(self, entries: list[Entry]) -> None:
        """`entries` were just stored (replacing any suffix from their first index)."""
        first = entries[0].index
        recent, rlo = self._recent, self._recent_lo
        if recent and rlo <= first <= rlo + len(recent):
            for e in recent[first - rlo :]:  # a conflicting suffix was overwritten
                self._recent_bytes -= len(e.data)
            del recent[first - rlo :]
        else:
            self.clear()
            recent = self._recent
            self._recent_lo = first
        for e in entries:
            if self._recent_bytes >= _RECENT_BYTES:
                return  # the rest is read back from the log when applied
            recent.append(e)
            self._recent_bytes += len(e.data)

    def applied(self, index: int) -> None:
        """Entries up to `index` were applied: no longer needed in memory."""
        recent, rlo = self._recent, self._recent_lo
        if not recent or index < rlo:
            return
        k = min(index - rlo + 1, len(recent))
        if k == len(recent):
            self.clear()
            return
        for e in recent[:k]:
            self._recent_bytes -= len(e.data)
        del recent[:k]
        self._recent_lo = rlo + k

    def clear(self) -> None:
        self._recent = []
        self._recent_bytes = 0


class _LogHold:
    """Whether a task holds a group's CommitLog and core (see `GroupRuntime._hold`).

    Deliberately plain (a flag and an event, no hand-over to a waiter): whoever runs
    first after a release takes it."""

    __slots__ = ("held", "_freed")

    def __init__(self) -> None:
        self.held = False
        self._freed = trio.Event()

    async def wait_free(self) -> None:
        """Return when nobody holds it (no checkpoint when nobody does)."""
        while self.held:
            await self._freed.wait()

    async def wait_change(self) -> None:
        """Return at the next release (or `nudge`)."""
        await self._freed.wait()

    async def take(self) -> None:
        await self.wait_free()
        self.held = True

    def release(self) -> None:
        self.held = False
        self.nudge()

    def nudge(self) -> None:
        """Wake whoever waits, to look again at why they wait."""
        self._freed.set()
        self._freed = trio.Event()


class _Shell:
    """How a GroupRuntime carries out each part of a Ready (`raftlog.driver.Shell`)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: GroupRuntime) -> None:
        self._rt = rt

    def save_hard_state(self, hs: HardState) -> Blocking:
        # Rare (terms, votes, membership) but four syscalls with two fsyncs: the driver
        # runs it in a worker thread, and nothing later in the Ready (no message) goes
        # before it is done.
        assert self._rt._hs is not None
        return partial(self._rt._hs.save, hs)

    def install_snapshot(self, snap: Snapshot) -> None:
        # Restoring and writing take a while: the install runs beside the loop, and the
        # core hands out nothing that depends on it until told it is done.
        rt = self._rt
        assert rt._nursery is not None
        rt._nursery.start_soon(rt._install, snap)

    def store_entries(self, entries: list[Entry]) -> Blocking | None:
        rt = self._rt
        lg = rt._log
        assert lg is not None and rt._guard is not None
        rt._guard.remember(entries)
        rt._sync_needed.set()
        if entries[0].index <= lg.last_index():
            # a conflicting suffix goes first, durably (fsyncs): in a worker thread
            return partial(lg.store, entries)
        try:
            lg.append(entries)  # the hot path: page cache only, group commit syncs it
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            # undone by the log (no torn entry stays); retried until space is back
            return partial(lg.store, entries)
        return None

    def send_message(self, m: Message) -> None:
        rt = self._rt
        if m.type == MsgType.SNAPSHOT:
            log.info("sending snapshot", extra={"fields": {
                "group": rt.group_id, "peer": m.dst, "snapshot": m.log_index,
                "bytes": len(m.snapshot)}})
        rt._send(rt.group_id, m)

    def apply_entries(self, entries: list[Entry]) -> None:
        self._rt._apply(entries)

    def answer_read(self, read: ReadState) -> None:
        rw = self._rt._read_waiters.pop(read.id, None)
        if rw is not None:
            rw.resolve(read.index)

    def fetch_for_repair(self, indexes: list[int]) -> None:
        rt = self._rt
        log.warning("corrupt entries found: fetching them from a peer", extra={
            "fields": {"group": rt.group_id, "entries": indexes}})
        rt._repair_needed.set()


@dataclass(frozen=True)
class GroupOptions:
    raft: RaftConfig = field(default_factory=RaftConfig)
    segment_size: int = 1 << 30
    fsync: Literal["always", "interval"] = "always"
    fsync_interval: float = 1.0
    max_uncommitted_bytes: int = 64 << 20
    snapshot_every_entries: int = 100_000  # 0: snapshot only for retention
    skip_fsync: bool = False  # the deliberate `skip-fsync` test mutation


@dataclass
class _DueSnapshot:
    """A state detached at `index` and waiting to be serialised and written."""

    index: int
    term: int
    membership: Membership
    serialise: Callable[[], bytes]  # safe to call in a worker thread
    retained: int  # delete log segments below it once written (0: none)
    base: tuple[int, int]  # the entry before the first one the state references


class _Waiter:
    __slots__ = ("term", "size", "context", "event", "result", "error")

    def __init__(self, term: int, size: int, context: Any = None) -> None:
        self.term = term
        self.size = size
        self.context = context  # handed back to `apply` with the entry (see StateMachine)
        self.event = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.event.set()


class GroupRuntime(Generic[M]):
    """One replica of one group, driven by trio. Open with `open()`, run with `run()`.

    The runtime is the one owner of the group's state machine: restoring a snapshot
    replaces it, so callers ask `machine` each time rather than keep the object."""

    def __init__(
        self,
        group_id: str,
        node_id: int,
        path: str | os.PathLike[str],
        replicas: tuple[int, ...],
        machine: M,
        send: Callable[[str, Message], None],
        options: GroupOptions | None = None,
        *,
        rng: random.Random | None = None,
        on_change: Callable[[GroupRuntime], None] | None = None,
        on_fsync: Callable[[float], None] | None = None,
        restore: Callable[[bytes], M] | None = None,
        fetch_raw: FetchRaw | None = None,
        disk_call: DiskCall | None = None,
    ) -> None:
        self.group_id = group_id
        self.node_id = node_id
        self.path = os.fspath(path)
        self.replicas = replicas
        self._machine = machine
        self.options = options or GroupOptions()
        self._send = send
        self._rng = rng or random.Random()
        self._on_change = on_change
        self._on_fsync = on_fsync
        self._log: CommitLog | None = None
        self._core: RaftNode | None = None
        self._hs: HardStateFile | None = None
        self._wakeup = trio.Event()
        self._sync_needed = trio.Event()
        self._applied_changed = trio.Event()
        self._space = trio.Event()
        self._waiters: dict[int, _Waiter] = {}
        self._read_waiters: dict[int, _Waiter] = {}
        self._read_seq = 0
        # term of the last entry the machine applied: once it is the leader's own term,
        # every entry committed before the election is applied too (`is_ready`)
        self._applied_term = 0
        # index of the last entry the machine applied (or its snapshot covers): the core
        # counts a Ready's entries as applied when it hands them out, and the Ready may
        # store overlapping entries in a worker thread before it applies them
        self._applied_index = 0
        self._uncommitted = 0
        self._seen: tuple[Role, int | None, int] = (Role.FOLLOWER, None, 0)
        self.fsyncs = 0
        self.closed = False
        self._restore = restore
        self.snapshot_path = os.path.join(self.path, "snapshot")
        self.snapshot_index = 0  # index of the durable snapshot (0: none)
        self.snapshots_written = 0
        self.snapshots_installed = 0
        # entries (first, last) the state references that no log held any more when a
        # refill was last abandoned (`raftlog.core`, "Refilling"); kept on disk
        # (`raftlog.refillgap`), so a restart still reports it
        self.refill_gap: tuple[int, int] | None = None
        self.refill_gap_path = os.path.join(self.path, "refill-gap")
        # why the last open set a damaged snapshot aside ("" if it did not): the state
        # then comes from a leader's snapshot over the log kept as it was, or, for a
        # replica alone in its group, from a replay of the log
        self.snapshot_set_aside = ""
        self._stateless = False  # the core is told so when it is built
        self._forced_snapshot_at = float("-inf")  # when a peer's lost state last forced one
        self._retain_seen = 0
        self._snapshot_taken = 0  # index of the last snapshot taken or installed
        self._snapshot_due: _DueSnapshot | None = None
        self._snapshot_writing = False  # the writer is saving a detached state
        self._snapshot_needed = trio.Event()
        self._snapshot_lock = trio.Lock()  # one snapshot write (or install) at a time
        self._lagging: frozenset[int] = frozenset()
        self._fetch_raw = fetch_raw
        self._guard: _GuardedLog | None = None
        self._nursery: trio.Nursery | None = None  # run()'s: snapshot installs run in it
        self.repaired = 0  # entries repaired from a peer since start
        self.repair_requests = 0  # fetches from peers the repairs made since start
        self._repair_needed = trio.Event()
        self._frozen = False  # what `core.frozen` was last seen as (for the logs)
        self._repair_rounds = 0
        self._repair_source: int | None = None  # the peer that supplied the last repair
        self._gone_logged: set[int] = set()
        self._refused_logged: set[int] = set()
        self._syncer: SyncThread | None = None  # run()'s thread for group commits
        # The rule for the CommitLog (not thread-safe) and the core (which reads it):
        # while a task holds `_hold`, only that task touches either. Blocking disk work
        # runs in a worker thread while that task awaits it (`_offload`, `_with_log`),
        # so a slow disk stalls this group only, never the event loop every group
        # shares. The ready loop (or the sync loop, `_carry_out`) holds it while it
        # carries out Readies; an event for the core that arrives while it is held
        # (`step`, `tick`, ...) waits in `_deferred` and is handed over, in order,
        # before the next Ready.
        self._hold = _LogHold()
        self._deferred: list[Callable[[], object]] = []
        self._disk_call: DiskCall = disk_call or _call
        self.disk_full = False  # a write failed for lack of space; retried until it works

    @property
    def machine(self) -> M:
        """The group's state machine now (a restored snapshot replaces the object)."""
        return self._machine

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Recover the CommitLog and hard state from disk (bootstrapping a new group).

        A failure leaves the group unopened, its files closed, so `open` may be called
        again (`open_when_space` does, after a full disk)."""
        os.makedirs(self.path, exist_ok=True)
        self._log = CommitLog.open(
            self.path,
            segment_size=self.options.segment_size,
            fsync=self.options.fsync,
            fsync_interval=self.options.fsync_interval,
        )
        try:
            self._open_on_log()
        except BaseException:
            lg, self._log, self._core, self._guard = self._log, None, None, None
            if not lg.closed:
                try:
                    lg.close()
                except OSError:  # a failed close must not mask the cause
                    log.exception("closing the CommitLog failed")
            raise

    async def open_when_space(self) -> None:
        """`open` in a worker thread (recovery reads and may rewrite whole files, which
        must not stall the node's other groups). On a full disk (ENOSPC, EDQUOT: recovery
        rewrites index records, a new group saves its hard state) the group waits and
        tries again until space is freed, as a running group does, rather than the
        node exiting."""
        await when_space(self.open, "while opening the group", "the group opened",
                         group=self.group_id)

    def _open_on_log(self) -> None:
        lg = self._log
        assert lg is not None
        self._hs = HardStateFile(os.path.join(self.path, "hardstate"))
        hs = self._hs.load()
        if not hs.configs:
            hs = HardState(hs.term, hs.vote, ((0, 0, Membership(frozenset(self.replicas))),))
            self._hs.save(hs)
        peers = hs.configs[-1][2].voters | hs.configs[-1][2].learners
        snap = self._load_snapshot(helped=bool(peers - {self.node_id}))
        self.refill_gap = load_refill_gap(self.refill_gap_path)
        applied = snap.index if snap is not None else 0
        self._guard = _GuardedLog(lg)
        self._core = RaftNode(
            self.node_id, self._guard, hs, self.options.raft, rng=self._rng, applied=applied,
            stateless=self._stateless,
        )
        if snap is not None:
            self._core.set_snapshot(snap)
        self._applied_index = applied
        self._find_corrupt(applied)
        self._seen = (self._core.role, self._core.leader, self._core.term)
        log.info("group opened", extra={"fields": {
            "group": self.group_id, "last_index": lg.last_index(), "term": hs.term,
            "recovery": repr(lg.recovery)}})

    def _find_corrupt(self, applied: int) -> None:
        """Tell the core of the corrupt entries recovery kept, and check every entry the
        replay will apply (recovery itself checks only what its index did not vouch for)."""
        lg, core = self._log, self._core
        assert lg is not None and core is not None
        first, last = lg.first_index(), lg.last_index()
        bad = {i for i in lg.recovery.corrupt if first <= i <= last}
        lo = max(applied + 1, first)
        if lo <= last:
            bad.update(c.index for c in lg.verify(lo, last + 1) if c.index is not None)
        for i in sorted(bad):
            core.entry_unreadable(i)  # listed in the first Ready's `repair`

    def _load_snapshot(self, *, helped: bool) -> Snapshot | None:
        """Restore the state machine from the snapshot file, if there is one.

        Restarts an install a crash interrupted (the log does not hold the installed
        snapshot's entries from its base on: reset the log to the base). Refuses to
        start when the log begins after the snapshot: replay would skip entries.

        A damaged snapshot (or a file it references, which `restore` checks) is set
        aside, and the log is kept exactly as it is (it may hold entries this replica
        acknowledged and a commit counted). In a group with peers (`helped`) the replica
        starts stateless: a leader sends it a snapshot that it installs over that log
        (`raftlog.core`, "Lost state"), one transfer instead of a replay of the whole
        log. It starts stateless again until a snapshot file exists anew (a restart
        before the install came: the set-aside file is still there and no snapshot; or
        no snapshot at all over a log retention cut). Alone in its group, it replays the log when the log still begins at entry 1
        (the state is a function of the committed log); once retention (or an install)
        has cut the log's beginning, the snapshot was the only copy of that part of the
        state: the damage is raised and the node refuses to start on it.
        """
        lg = self._log
        assert lg is not None
        try:
            snap = load_snapshot(self.snapshot_path)
            if snap is not None:
                if self._restore is None:
                    lg.close()
                    raise MissingEntries(
                        f"{self.snapshot_path} exists but no restore is configured")
                self._machine = self._restore(snap.data)
        except CorruptFile as exc:
            if lg.first_index() > 1 and not helped:
                raise
            self._set_aside(exc, stateless=helped)
            return None
        if snap is None and helped and (
                lg.first_index() > 1 or os.path.exists(self.snapshot_path + ".damaged")):
            self.snapshot_set_aside = "no snapshot, and the state is still to come"
            self._stateless = True
            log.warning("no snapshot: the state is rebuilt from a leader's snapshot, over "
                        "the log as it is", extra={"fields": {"group": self.group_id}})
            return None
        index = 0
        if snap is not None:
            index = self.snapshot_index = self._snapshot_taken = snap.index
            first, last = lg.first_index(), lg.last_index()
            if snap.base is not None:
                base, base_term = snap.base
                whole = first <= base + 1 and index <= last and lg.term(index) == snap.term
                empty_at_base = (first, last) == (base + 1, base) and lg.term(base) == base_term
                if not (whole or empty_at_base):
                    log.info("restarting an interrupted snapshot install", extra={"fields": {
                        "group": self.group_id, "snapshot": index, "base": base,
                        "log": [first, last]}})
                    lg.reset_to(base, base_term)
            elif index > last or (index >= first - 1 and lg.term(index) != snap.term):
                # a file from before bases were recorded: the old rule
                log.info("finishing an interrupted snapshot install", extra={"fields": {
                    "group": self.group_id, "snapshot": index, "log": [first, last]}})
                lg.reset_to(index, snap.term)
        self._retain_seen = int(getattr(self.machine, "retained_index", 0))
        first = lg.first_index()
        if first > index + 1:
            lg.close()
            raise MissingEntries(
                f"group {self.group_id}: the log starts at entry {first} but the snapshot "
                f"covers only up to {index}: entries {index + 1}..{first - 1} are lost"
            )
        return snap

    def _set_aside(self, damage: CorruptFile, *, stateless: bool) -> None:
        """Move a damaged snapshot out of the way (kept as `snapshot.damaged` for a
        look), durably; `snapshot_set_aside` says why in the group's status, and
        `stateless` whether the state is still to come from a leader."""
        aside = self.snapshot_path + ".damaged"
        if os.path.exists(self.snapshot_path):
            os.replace(self.snapshot_path, aside)
            fsync_dir(self.path)
        self.snapshot_set_aside = str(damage)
        self._stateless = stateless
        how = "from a leader's snapshot, over the log as it is" if stateless else "from the log"
        log.warning(f"damaged snapshot set aside: the state is rebuilt {how}", extra={
            "fields": {"group": self.group_id, "damage": str(damage), "kept_as": aside}})

    def close_log(self) -> None:
        """Close the CommitLog of a group opened but never run (`run` closes its own)."""
        if self._log is not None and not self._log.closed:
            self._log.close()
        self.closed = True

    async def run(self) -> None:
        """Drive the group until cancelled; the CommitLog is closed on the way out."""
        if self._core is None:
            self.open()
        self._syncer = SyncThread(f"raftmq-sync-{self.group_id}")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._ready_loop)
                nursery.start_soon(self._sync_loop)
                nursery.start_soon(self._snapshot_loop)
                nursery.start_soon(self._repair_loop)
        finally:
            self._syncer.stop()
            self.closed = True
            self._fail_waiters(NotLeader(None))
            self._fail_reads(NotLeader(None))
            if self._log is not None:
                try:
                    self._log.close()
                except Exception:  # noqa: BLE001 - a failed close must not mask the cause
                    log.exception("closing the CommitLog failed")

    # ------------------------------------------------------------------ events in

    def _give(self, event: Callable[..., object], *args: Any) -> None:
        """Hand an event to the core now, or once the task holding the log lets go
        (see `_hold`), after the events that came before it."""
        if self._hold.held:
            self._deferred.append(partial(event, *args))
        else:
            event(*args)
        self._wakeup.set()

    async def _log_free(self) -> None:
        """Return when no task holds the log: until its next await the caller may use
        the log and the core (no checkpoint when it is free)."""
        await self._hold.wait_free()

    def tick(self) -> None:
        assert self._core is not None
        if self.disk_full:
            return  # time stands still for a group waiting for space, as for a paused one
        self._give(self._core.tick)

    def step(self, m: Message) -> None:
        assert self._core is not None
        if self.disk_full:
            return  # lost, as to a paused process (Raft resends what matters)
        self._give(self._core.step, m)

    def peer_lost(self, peer: int) -> None:
        """The node's link to `peer` dropped: if it led this group, elect sooner (see
        `RaftNode.leader_unreachable`; the core ignores it otherwise)."""
        core = self._core
        if core is None or core.leader != peer:
            return
        self._give(core.leader_unreachable, peer)

    @property
    def unrepaired(self) -> frozenset[int]:
        """Corrupt entries still to fetch from a peer."""
        return self._core.unreadable if self._core is not None else frozenset()

    def report_corrupt(self, index: int, reason: str = "") -> None:
        """A read found entry `index` corrupt: refetch it from a peer (see the module
        docstring). Harmless for one already known or no longer in the log."""
        lg, core = self._log, self._core
        if lg is None or core is None or lg.closed or index in core.unreadable:
            return
        if reason:
            log.debug("corrupt entry reported", extra={"fields": {
                "group": self.group_id, "index": index, "reason": reason}})
        self._give(core.entry_unreadable, index)

    def transfer_leadership(self, target: int) -> None:
        """Ask the core to hand leadership to `target`. Raises NotLeader and ValueError
        (not a voter) at once; one that waits for the log to be let go is dropped if
        leadership moved meanwhile."""
        core = self._core
        assert core is not None
        if not self._hold.held:
            core.transfer_leadership(target)
            self._wakeup.set()
            return
        if core.role != Role.LEADER:
            raise NotLeader(core.leader, core.term)
        if target not in core.membership.voters:
            raise ValueError(f"node {target} is not a voter")
        self._give(self._transfer_if_leading, target)

    def _transfer_if_leading(self, target: int) -> None:
        core = self._core
        assert core is not None
        try:
            core.transfer_leadership(target)
        except NotLeader:
            pass  # leadership moved while the request waited: nothing to hand over

    def set_preferred_leader(self, node: int | None) -> None:
        """Where the core hands leadership back to once that node has caught up."""
        assert self._core is not None
        self._core.preferred_leader = node

    @property
    def membership(self) -> Membership:
        """The latest membership this replica knows (in force as soon as it is logged)."""
        assert self._core is not None
        return self._core.membership

    def recently_active(self) -> frozenset[int]:
        """Members this leader heard from lately (see `RaftNode.recently_active`)."""
        assert self._core is not None
        return self._core.recently_active()

    def peer_matches(self) -> dict[int, int]:
        """Each other member's match index, as this leader knows it (empty otherwise)."""
        assert self._core is not None
        return self._core.peer_matches()

    async def change_membership(self, action: Literal["add-learner", "promote", "remove"],
                                node: int) -> Membership:
        """One single-server membership change (thesis §4.1) as leader, waiting until it
        is applied. Raises NotLeader, ProposalDropped (another change in progress, or a
        learner not caught up yet: retry later) or ValueError (not allowed as asked)."""
        core = self._core
        assert core is not None
        await self._writable()  # the core appends the change to the log: see `_hold`
        if core.role != Role.LEADER:
            raise NotLeader(core.leader, core.term)
        if action == "add-learner":
            index = core.add_learner(node)
        elif action == "promote":
            index = core.promote(node)
        elif action == "remove":
            index = core.remove(node)
        else:
            raise ValueError(f"unknown membership change {action!r}")
        w = _Waiter(core.term, 0)
        self._waiters[index] = w
        self._wakeup.set()
        await w.event.wait()
        if w.error is not None:
            raise w.error
        return core.membership_at(index)

    def draft(self, size: int) -> EntryDraft:
        """Room for a new entry of `size` bytes in its stored form: write the data into
        `.data` (its only copy), then `propose` the draft."""
        return EntryDraft(size)

    async def propose(
        self,
        data: bytes | EntryDraft,
        type: EntryType = EntryType.MESSAGES,
        *,
        context: Any = None,
    ) -> Any:
        """Propose as leader and wait until the entry is applied; returns what the state
        machine's `apply` returned for it. The entry is encoded (header and both CRCs)
        once, here; `context`, when given, is handed back to `apply` with the entry
        should it commit as proposed (see `StateMachine`).

        Raises NotLeader (with a hint) or ProposalDropped before anything is written, and
        ProposalInDoubt (a NotLeader) or ProposalLost when leadership was lost before the
        entry committed (the outcome is then unknown to the caller, or known to be nothing).
        """
        core = self._core
        assert core is not None
        await self._room_to_propose(core)
        index = core.propose(data if isinstance(data, EntryDraft) else EntryDraft.of(data), type)
        w = _Waiter(core.term, len(data), context)
        self._waiters[index] = w
        self._uncommitted += w.size
        self._wakeup.set()
        await w.event.wait()
        if isinstance(w.error, NotLeader):
            raise ProposalInDoubt(w.error) from w.error
        if w.error is not None:
            raise w.error
        return w.result

    async def _room_to_propose(self, core: RaftNode) -> None:
        """Wait until a proposal may be made: refused on a full disk, held back while the
        uncommitted bytes are over their bound (NotLeader should leadership go
        meanwhile), and until no task holds the log (see `_hold`)."""
        self._check_space()
        while self._uncommitted > self.options.max_uncommitted_bytes:
            if core.role != Role.LEADER:
                raise NotLeader(core.leader, core.term)
            space = self._space
            await space.wait()
        await self._writable()

    async def propose_many(
        self,
        items: Sequence[bytes | EntryDraft],
        type: EntryType = EntryType.MESSAGES,
        *,
        contexts: Sequence[Any] | None = None,
    ) -> list[Any]:
        """Propose several entries together (one Ready: one store write, one fsync, one
        AppendEntries per follower) and wait until each is applied.

        Returns, per entry in order, what `apply` returned for it, or the exception that
        says it did not commit as proposed (NotLeader: outcome unknown; ProposalLost:
        not stored). Raises NotLeader or ProposalDropped, before anything is written, when
        the entries cannot be proposed at all. `contexts[i]` is handed back to `apply`
        with entry i, as `propose`'s `context` is.
        """
        core = self._core
        assert core is not None
        if contexts is not None and len(contexts) != len(items):
            raise ValueError("one context per entry")
        await self._room_to_propose(core)
        drafts = [d if isinstance(d, EntryDraft) else EntryDraft.of(d) for d in items]
        first = core.propose_many(drafts, type)
        term = core.term
        waiters = []
        for i, d in enumerate(drafts):
            w = _Waiter(term, len(d), None if contexts is None else contexts[i])
            self._waiters[first + i] = w
            self._uncommitted += w.size
            waiters.append(w)
        self._wakeup.set()
        for w in waiters:
            await w.event.wait()
        return [w.error if w.error is not None else w.result for w in waiters]

    async def read_barrier(self) -> None:
        """Return once this replica has applied everything committed before the call, and
        has confirmed with a majority that it still leads (ReadIndex, Raft thesis §6.4).

        What a caller reads from the state machine afterwards is linearizable: a leader
        cut off from its group cannot answer from its stale state. Reads issued together
        share one confirmation round. Raises NotLeader if leadership is lost meanwhile.
        """
        core = self._core
        assert core is not None
        await self._writable()
        self._read_seq += 1
        rid = self._read_seq
        core.read_index(rid)  # NotLeader unless leading
        w = _Waiter(core.term, 0)
        self._read_waiters[rid] = w
        self._wakeup.set()
        await w.event.wait()
        if w.error is not None:
            raise w.error
        while core.applied < w.result:
            if core.role != Role.LEADER:
                raise NotLeader(core.leader, core.term)
            await self._applied_changed.wait()

    async def wait_applied_change(self) -> None:
        """Return after the next apply (or role change): long polls wait on this."""
        await self._applied_changed.wait()

    # ------------------------------------------------------------------ queries

    @property
    def role(self) -> Role:
        assert self._core is not None
        return self._core.role

    @property
    def is_leader(self) -> bool:
        return self._core is not None and self._core.role == Role.LEADER

    @property
    def is_ready(self) -> bool:
        """Leading, with an entry of its own term applied (Raft thesis §6.4: a new
        leader's state is complete only once its first entry commits); until then its
        state may lack entries its predecessor committed. One comparison: requests check
        it on every call (`check_ready`)."""
        core = self._core
        return core is not None and core.role == Role.LEADER and self._applied_term == core.term

    @property
    def is_current(self) -> bool:
        """Whether this replica, leader or follower, has applied an entry of its current
        term and knows that term's leader. The commit index is not stored, so after a
        restart (or while an election is under way) a replica's state may lack entries
        committed long ago; once it applies the leader's first entry of the term, all of
        them are applied too. State answered from any replica (the users and ACLs every
        node checks requests against) is served only when this holds."""
        core = self._core
        return (core is not None and core.leader is not None
                and self._applied_term == core.term)

    def check_ready(self) -> None:
        """Raise NotLeader (with the hint) unless leading, NotReady unless `is_ready`:
        the one check every request answered from this group's state makes first."""
        core = self._core
        assert core is not None
        if core.role != Role.LEADER:
            raise NotLeader(core.leader, core.term)
        if self._applied_term != core.term:
            raise NotReady(self.node_id, core.term)

    @property
    def leader(self) -> int | None:
        assert self._core is not None
        return self._core.leader

    @property
    def term(self) -> int:
        assert self._core is not None
        return self._core.term

    def status(self) -> dict[str, Any]:
        core, lg = self._core, self._log
        assert core is not None and lg is not None
        return {
            "role": core.role.name.lower().replace("_", "-"),
            "ready": self.is_ready,
            "term": core.term,
            "leader": core.leader,
            "commit": core.commit,
            "applied": self._applied_index,  # what the machine holds, not what is on its way
            "last": lg.last_index(),
            "durable": lg.durable_index(),
            "first": lg.first_index(),
            "voters": sorted(core.membership.voters),
            "learners": sorted(core.membership.learners),
            "matches": core.peer_matches(),
            "preferred_leader": core.preferred_leader,
            "fsyncs": self.fsyncs,
            "uncommitted_bytes": self._uncommitted,
            "snapshot": self.snapshot_index,
            "needs_snapshot": sorted(core.needs_snapshot),
            "sending_snapshot": sorted(core.sending_snapshot),
            "installing": core.installing.index if core.installing is not None else None,
            "refilling": core.refilling,
            "unrepaired": sorted(core.unreadable),
            "repaired": self.repaired,
            "repair_requests": self.repair_requests,
            "refill_gap": list(self.refill_gap) if self.refill_gap is not None else None,
            "disk_full": self.disk_full,
            "snapshot_set_aside": self.snapshot_set_aside,
            "stateless": core.stateless,
        }

    # ------------------------------------------------------------------ the log, read-only

    # What the layers above read of the group's log, through this door only: they never
    # hold the CommitLog or the core, so what they may see (committed entries; raw bytes
    # for a peer's repair) and how a corrupt entry is handled stay decided here.

    @property
    def is_open(self) -> bool:
        """Opened and not yet closed: the log can be read and messages stepped."""
        return self._core is not None and self._log is not None and not self._log.closed

    def log_bounds(self) -> tuple[int, int]:
        """(first, last) index this replica's log holds (`last < first` when empty)."""
        assert self._log is not None
        return self._log.first_index(), self._log.last_index()

    async def segment_bounds(self) -> list[SegmentInfo]:
        """The log's segments, oldest first (the last is the active one)."""
        assert self._log is not None
        await self._writable()
        bounds: list[SegmentInfo] = await self._with_log(self._log.segment_bounds)
        return bounds

    async def read_committed(self, index: int) -> Entry:
        """Committed entry `index`, CRC-checked, read in a worker thread. A corrupt one
        is sent for repair from a peer (`report_corrupt`) and `CorruptEntry` raised; one
        below the log's first index raises `CommitLogError`."""
        lg, core = self._log, self._core
        assert lg is not None and core is not None
        if index > core.commit:
            raise ValueError(f"entry {index} of {self.group_id} is not committed "
                             f"(commit is {core.commit})")
        await self._writable()
        try:
            entries: list[Entry] = await self._with_log(lg.entries, index, index + 1, 1 << 62)
        except CorruptEntry as exc:
            self.report_corrupt(index, str(exc))
            raise
        return entries[0]

    async def read_raw(self, index: int, hi: int | None = None,
                       max_bytes: int = 1 << 62) -> tuple[int, bytes]:
        """(term of `index`, stored bytes of entries [index, hi)), for a peer repairing its
        copies (any replica's entry with the same index and term is the same), read in a
        worker thread: entry `index` always, then those after it up to `hi` (default: just
        `index`) that fit in `max_bytes`, ending before this replica's own next unreadable
        entry. A corrupt `index` is sent for repair here too and `CorruptEntry` raised."""
        lg = self._log
        assert lg is not None
        await self._writable()
        hi = index + 1 if hi is None else max(hi, index + 1)
        later = [i for i in self.unrepaired if index < i < hi]
        hi = min([hi, lg.last_index() + 1, *later])

        def read() -> tuple[int, bytes]:
            return lg.term(index), bytes(lg.read_raw(index, hi, max_bytes=max_bytes))

        try:
            found: tuple[int, bytes] = await self._with_log(read)
        except CorruptEntry as exc:
            self.report_corrupt(index, str(exc))
            raise
        return found

    def retention_horizon(self) -> tuple[int, int] | None:
        """(commit index, lowest match index of any follower) while this replica leads:
        retention may drop nothing above either. None when not leading (or no follower's
        match is known)."""
        core = self._core
        if core is None or not self.is_open or core.role != Role.LEADER:
            return None
        min_match = core.min_follower_match()
        return None if min_match is None else (core.commit, min_match)

    # ------------------------------------------------------------------ loops

    async def _offload(self, work: Callable[[], Any]) -> Any:
        """Run blocking disk work in a worker thread (the driver's I/O seam). Work that
        touches the log runs only while the caller holds `_hold`."""
        return await trio.to_thread.run_sync(self._disk_call, work)

    def _check_space(self) -> None:
        if self.disk_full:
            raise DiskFull(self.group_id)

    async def _writable(self) -> None:
        """`_log_free` for proposals and reads: refused as soon as the disk is full,
        also while waiting."""
        while self._hold.held:
            self._check_space()
            await self._hold.wait_change()
        self._check_space()

    async def _offload_until_space(self, work: Callable[[], Any]) -> Any:
        """`_offload` for the ready loop. On a full disk (ENOSPC, EDQUOT) the group waits
        and retries the same work until it succeeds, instead of the node exiting: the
        steps are idempotent (a failed append is undone, torn tail included; a hard-state
        save rewrites its temp file). Meanwhile the Ready's messages wait (no vote, no
        acknowledgement leaves), events for the core are dropped as for a paused
        process, and proposals and reads are refused (`DiskFull`)."""
        pause = _SPACE_RETRY[0]
        while True:
            try:
                return_value = await self._offload(work)
            except OSError as exc:
                if exc.errno not in _NO_SPACE:
                    raise
                if not self.disk_full:
                    self.disk_full = True
                    core = self._core
                    assert core is not None
                    lost = (core.step, core.tick)
                    self._deferred = [e for e in self._deferred
                                      if getattr(e, "func", None) not in lost]
                    log.error("disk full: the group writes and acknowledges nothing until "
                              "space is freed", extra={"fields": {
                                  "group": self.group_id, "error": str(exc)}})
                    self._fail_waiters(DiskFull(self.group_id))
                    self._fail_reads(DiskFull(self.group_id))
                    self._hold.nudge()  # proposals and reads waiting for the log: refused
                await trio.sleep(pause)
                pause = min(pause * 2, _SPACE_RETRY[1])
                continue
            if self.disk_full:
                self.disk_full = False
                log.warning("disk space is back: the group resumes", extra={"fields": {
                    "group": self.group_id}})
            return return_value

    async def _with_log(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the log, in a worker thread, holding `_hold`."""
        await self._hold.take()
        try:
            return await self._offload(partial(fn, *args))
        finally:
            self._let_go()

    def _let_go(self) -> None:
        self._hold.release()
        if self._deferred:
            self._wakeup.set()  # the ready loop hands them to the core

    def _hand_over_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for event in deferred:
            event()

    async def _ready_loop(self) -> None:
        core = self._core
        assert core is not None
        shell = _Shell(self)
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await self._carry_out(core, shell)
            # no checkpoint here: the wait above is one even when the event is already set

    async def _carry_out(self, core: RaftNode, shell: _Shell) -> None:
        """Hand the core the events that waited for the log, then do every Ready it has
        (holding the log), then look at what changed. The ready loop's work; the sync
        loop does it too, right after the core learns what was persisted when no other
        write waits for an fsync, rather than waking the ready loop for it: the
        acknowledgement (follower) or the commit (leader) that the fsync made possible
        leaves one turn of the event loop sooner."""
        hold = self._hold
        if hold.held:
            await hold.take()
        else:
            hold.held = True  # the usual case: no checkpoint on the hot path
        try:
            while True:
                self._hand_over_deferred()
                # the Ready sequence shared with the simulator
                await drain_async(core, shell, self._offload_until_space,
                                  trio.lowlevel.checkpoint)
                if not self._deferred:
                    break
        finally:
            hold.release()
        self._notice_frozen()
        self._notice_changes()
        self._notice_lagging()
        self._notice_state_wanted()

    def _notice_frozen(self) -> None:
        """Log when the core freezes on an unreadable next entry, and when it resumes."""
        core = self._core
        assert core is not None
        if core.frozen == self._frozen:
            return
        self._frozen = core.frozen
        if self._frozen:
            log.warning("the next entry to apply is corrupt: pausing the group until a "
                        "peer's copy repairs it", extra={"fields": {
                            "group": self.group_id, "index": core.applied + 1}})
        else:
            log.info("group resumed after repair", extra={"fields": {
                "group": self.group_id, "index": core.applied + 1}})

    async def _repair_loop(self) -> None:
        """Fetch every unrepaired entry from a peer until each is repaired or gone."""
        pause = _REPAIR_BACKOFF[0]
        while True:
            if not self.unrepaired:
                await self._repair_needed.wait()
                self._repair_needed = trio.Event()
                pause = _REPAIR_BACKOFF[0]
                continue
            self._repair_needed = trio.Event()
            unanswered: set[int] = set()  # peers that failed this round are asked last
            outcomes: list[str] = []
            cursor = 0
            while True:  # a run of consecutive unrepaired entries at a time, in order
                left = [i for i in self.unrepaired if i >= cursor]
                if not left:
                    break
                lo = min(left)
                hi = lo + 1
                while hi in self.unrepaired:
                    hi += 1
                outcomes.append(await self._repair_range(lo, hi, unanswered))
                cursor = lo + 1  # what the range repaired left `unrepaired` meanwhile
            if not self.unrepaired:
                continue
            if outcomes and all(o in ("gone", "refused") for o in outcomes):
                wait = _REPAIR_GONE_PAUSE
            else:
                wait, pause = pause, min(pause * 2, _REPAIR_BACKOFF[1])
            with trio.move_on_after(wait):
                await self._repair_needed.wait()

    def _repaired(self, index: int) -> None:
        """Entry `index` reads again, or left the log: the core may use it again."""
        assert self._core is not None
        self._core.entry_repaired(index)
        self._wakeup.set()

    async def _repair_range(self, lo: int, hi: int, unanswered: set[int]) -> str:
        """One round over the peers for the unrepaired entries [lo, hi): each peer is
        asked for the range (it answers a prefix of it, at least entry `lo`: up to its own
        first unreadable entry, or a size bound), whatever it supplies is written with
        one fsync, and the next peer is asked only while `lo` itself is not settled.
        Returns what became of `lo`: "repaired", "dropped" (no longer in the log),
        "gone" (every peer said retention removed it), "refused" (this log cannot take
        the entry back: it stays unreadable, retried rarely; a log closed by a failed
        write or fsync still ends the group) or "failed".

        The peer that supplied the last entries is asked first, and peers in
        `unanswered` (they failed or timed out earlier in this round; one is added here
        when it fails) last: a damaged segment holds hundreds of entries, and a peer that
        is down would otherwise cost a timeout for each range."""
        lg, core = self._log, self._core
        assert lg is not None and core is not None
        await self._log_free()
        if not lg.first_index() <= lo <= lg.last_index():
            self._repaired(lo)
            return "dropped"
        hi = min(hi, lg.last_index() + 1, lo + _REPAIR_RANGE)
        terms = {i: lg.term(i) for i in range(lo, hi)}
        peers = sorted(p for p in core.membership.members | set(self.replicas)
                       if p != self.node_id)
        if self._fetch_raw is None or not peers:
            return "failed"
        k = self._repair_rounds % len(peers)  # spread the asking over the peers
        peers = peers[k:] + peers[:k]
        self._repair_rounds += 1
        peers.sort(key=lambda p: (p in unanswered, p != self._repair_source))
        gone = 0
        for peer in peers:
            self.repair_requests += 1
            try:
                with trio.fail_after(_REPAIR_TIMEOUT):
                    raw = await self._fetch_raw(peer, lo, hi)
            except EntryUnavailable as exc:
                gone += exc.gone
                log.debug("peer cannot supply the entry", extra={"fields": {
                    "group": self.group_id, "index": lo, "peer": peer, "error": str(exc)}})
                continue
            except Exception as exc:  # noqa: BLE001 - any failure of one peer: ask the next
                unanswered.add(peer)
                log.debug("fetching the entry failed", extra={"fields": {
                    "group": self.group_id, "index": lo, "peer": peer, "error": repr(exc)}})
                continue
            # a first entry whose header fails goes to `repair` whole, which says why
            frames = split_stored(raw, lo, hi) or [(lo, memoryview(raw).cast("B"))]
            outcome = await self._write_repairs(peer, lo, frames, terms)
            if outcome is not None:
                return outcome
        if gone == len(peers):
            if lo not in self._gone_logged:
                self._gone_logged.add(lo)
                log.error("corrupt entry cannot be repaired: no peer holds it any more (retention "
                          "removed it); it stays unreadable", extra={"fields": {
                              "group": self.group_id, "index": lo, "applied": core.applied}})
            return "gone"
        return "failed"

    async def _write_repairs(self, peer: int, lo: int, frames: list[tuple[int, memoryview]],
                             terms: dict[int, int]) -> str | None:
        """Write the entries `peer` supplied (`CommitLog.repair_many`: one fsync) that are
        still unrepaired and still the entries of `terms`; what became of `lo` ("repaired",
        "dropped", "refused"), None when it is still to be asked of another peer."""
        lg = self._log
        assert lg is not None
        await self._hold.take()
        try:
            if lo not in self.unrepaired:
                return "dropped"  # overwritten or dropped while we waited
            todo: list[tuple[int, memoryview]] = []
            for index, frame in frames:
                if index not in self.unrepaired:
                    continue
                if (not lg.first_index() <= index <= lg.last_index()
                        or lg.term(index) != terms[index]):
                    self._repaired(index)  # overwritten: the new entry was never damaged
                    continue
                todo.append((index, frame))
            if lo not in self.unrepaired:
                return "dropped"
            results = await self._offload(partial(lg.repair_many, todo)) if todo else {}
        finally:
            self._let_go()
        outcome: str | None = None
        for index, result in sorted(results.items()):
            if isinstance(result, bool):
                self._repaired(index)
                self.repaired += 1
                self._repair_source = peer
                log.info("entry repaired from a peer", extra={"fields": {
                    "group": self.group_id, "index": index, "term": terms[index],
                    "peer": peer}})
                if index == lo:
                    outcome = "repaired"
            elif isinstance(result, (CorruptEntry, ValueError)):
                log.warning("a peer's copy of the entry was rejected", extra={"fields": {
                    "group": self.group_id, "index": index, "peer": peer,
                    "error": str(result)}})
            else:  # the index places it where this log cannot write it
                if index not in self._refused_logged:
                    self._refused_logged.add(index)
                    log.error("corrupt entry cannot be repaired in this log; it stays "
                              "unreadable and is retried later", extra={"fields": {
                                  "group": self.group_id, "index": index,
                                  "error": str(result)}})
                if index == lo:
                    outcome = "refused"
        if results:
            self._wakeup.set()
        return outcome

    async def _sync_loop(self) -> None:
        core, lg = self._core, self._log
        assert core is not None and lg is not None
        shell = _Shell(self)
        fsync = not self.options.skip_fsync
        syncer = self._syncer
        assert syncer is not None
        while True:
            await self._sync_needed.wait()
            self._sync_needed = trio.Event()
            await self._log_free()
            plan = lg.begin_sync(fsync=fsync)
            if plan is None:
                continue
            t0 = time.perf_counter()
            try:
                if plan.fds or plan.sync_dir:
                    # on duplicated descriptors: safe beside other use of the log
                    await syncer.run(plan.run)
            finally:
                plan.close()
            await self._log_free()
            persisted = lg.finish_sync(plan)
            if plan.fsynced:
                self.fsyncs += 1
                if self._on_fsync is not None:
                    self._on_fsync(time.perf_counter() - t0)
            if persisted > 0:
                core.persisted(persisted, lg.term(persisted))
                if self._sync_needed.is_set():
                    # more written meanwhile: its fsync starts first, while the ready
                    # loop carries out what this one allowed (group commit keeps going)
                    self._wakeup.set()
                else:
                    await self._carry_out(core, shell)  # (the log is free: no wait)

    def _apply(self, entries: list[Entry]) -> None:
        for e in entries:
            w = self._waiters.pop(e.index, None) if self._waiters else None
            ctx = w.context if w is not None and w.term == e.term else None  # ours, as proposed
            if ctx is None:
                result = self._machine.apply(e)
            else:
                result = self._machine.apply(e, ctx)  # type: ignore[call-arg]
            if w is None:
                continue
            self._release(w)
            if w.term == e.term:
                w.resolve(result)
            else:
                w.resolve(error=ProposalLost(f"entry {e.index} was replaced by a newer leader"))
        self._applied_term = entries[-1].term
        self._applied_index = entries[-1].index
        if self._guard is not None:
            self._guard.applied(entries[-1].index)
        self._applied_changed.set()
        self._applied_changed = trio.Event()
        self._maybe_snapshot(entries[-1].index, entries[-1].term)

    def _maybe_snapshot(self, index: int, term: int, *, forced: bool = False) -> bool:
        """Detach the state at `index` when retention or the periodic policy wants a
        snapshot; `_snapshot_loop` serialises and writes it.

        While a detached state waits for the writer or is being written, a new one is not
        detached: detaching costs the loop time in proportion to the state, and a replica
        replaying a long log would otherwise detach after every batch only for the writer
        to drop all but the last. The writer calls this again once it is free.

        `forced`: due whatever the policies say (a follower that lost its state needs
        one). Returns whether a state was detached."""
        retained = int(getattr(self.machine, "retained_index", 0))
        retain_due = retained > self._retain_seen
        every = self.options.snapshot_every_entries
        periodic_due = every > 0 and index - self._snapshot_taken >= every
        if not (retain_due or periodic_due or forced):
            return False
        if self._snapshot_due is not None or self._snapshot_writing:
            return False  # the writer looks again when it is done (`_snapshot_loop`)
        serialise = self._serialiser()
        if serialise is None:
            return False  # this state machine cannot be snapshotted
        core = self._core
        assert core is not None
        self._retain_seen = max(self._retain_seen, retained)
        self._snapshot_taken = index
        lg = self._log
        assert lg is not None
        base = max(retained, lg.first_index(), 1) - 1  # the log holds everything after it
        self._snapshot_due = _DueSnapshot(
            index,
            term,
            core.membership_at(index),
            serialise,
            retained if retain_due else 0,
            (base, lg.term(base)),
        )
        self._snapshot_needed.set()
        return True

    def _serialiser(self) -> Callable[[], bytes] | None:
        later = getattr(self.machine, "snapshot_later", None)
        if later is not None:
            fn: Callable[[], bytes] = later()
            return fn
        take = getattr(self.machine, "snapshot", None)
        if take is None:
            return None
        data: bytes = take()
        return lambda: data

    def _write_snapshot(self, due: _DueSnapshot) -> Snapshot:
        """Serialise and save `due` (blocking: runs in a worker thread)."""
        snap = Snapshot(due.index, due.term, due.serialise(), due.membership, due.base)
        save_snapshot(self.snapshot_path, snap)
        saved = getattr(due.serialise, "saved", None)
        if saved is not None:
            try:
                saved()
            except OSError:  # what it would free stays until the next snapshot's turn
                log.exception("cleaning up after the snapshot failed", extra={"fields": {
                    "group": self.group_id, "snapshot": due.index}})
        return snap

    async def _snapshot_loop(self) -> None:
        """Write due snapshots durably (off the event loop), hand them to the core, and
        for retention then delete the log segments they cover."""
        while True:
            await self._snapshot_needed.wait()
            self._snapshot_needed = trio.Event()
            due, self._snapshot_due = self._snapshot_due, None
            if due is None:
                continue
            self._snapshot_writing = True
            try:
                await self._save_due(due)
            finally:
                self._snapshot_writing = False
            # what came due meanwhile (it was not detached then)
            self._maybe_snapshot(self._applied_index, self._applied_term)

    async def _save_due(self, due: _DueSnapshot) -> None:
        """Write one detached state, then apply the retention it carries."""
        lg, core = self._log, self._core
        assert lg is not None and core is not None
        async with self._snapshot_lock:
            if due.index > self.snapshot_index:  # else an install got ahead of it
                try:
                    snap = await self._offload(partial(self._write_snapshot, due))
                except SnapshotSkipped as exc:
                    log.info("snapshot skipped; the next one covers it", extra={"fields": {
                        "group": self.group_id, "snapshot": due.index, "why": str(exc)}})
                    return
                except OSError:
                    # nothing was deleted; the next retain entry (or period) retries
                    log.exception("writing the snapshot failed", extra={"fields": {
                        "group": self.group_id, "snapshot": due.index}})
                    return
                self.snapshot_index = snap.index
                self.snapshots_written += 1
                await self._log_free()
                core.set_snapshot(snap)
                log.info("snapshot written", extra={"fields": {
                    "group": self.group_id, "snapshot": snap.index,
                    "bytes": len(snap.data)}})
            if not due.retained:
                return
            try:
                first = await self._with_log(
                    lg.delete_before, min(due.retained, self.snapshot_index + 1))
            except CommitLogError:
                if lg.closed:
                    raise
                log.exception("retention failed; the next retain retries",
                              extra={"fields": {"group": self.group_id}})
                return
            log.info("retention", extra={"fields": {
                "group": self.group_id, "snapshot": self.snapshot_index,
                "retained": due.retained, "first_index": first}})

    async def _install(self, snap: Snapshot) -> None:
        """Carry out `Ready.snapshot`: restore, save, reset the log, tell the core."""
        core, lg = self._core, self._log
        assert core is not None and lg is not None
        if self._restore is None:
            raise MissingEntries(
                f"group {self.group_id}: the leader sent snapshot {snap.index} but no restore "
                "is configured"
            )
        if snap.lost is not None:
            log.error("refill abandoned: no voter holds the entries this replica's state "
                      "references below its snapshot (every log lost them, e.g. a power "
                      "loss of every node under fsync=interval); they are lost and reads "
                      "of them answer OFFSET_TOO_SMALL", extra={"fields": {
                          "group": self.group_id, "snapshot": snap.index,
                          "lost": list(snap.lost)}})
        log.info("installing snapshot", extra={"fields": {
            "group": self.group_id, "snapshot": snap.index, "term": snap.term,
            "bytes": len(snap.data), "log": [lg.first_index(), lg.last_index()]}})
        restore = self._restore
        async with self._snapshot_lock:
            # first: a snapshot it refuses is not saved
            machine = await self._offload(partial(restore, snap.data))
            if snap.lost is not None:  # recorded before the install gives up on them
                await self._offload(partial(save_refill_gap, self.refill_gap_path, snap.lost))
            await self._offload(partial(save_snapshot, self.snapshot_path, snap))
            base, base_term = snap.base if snap.base is not None else (snap.index, snap.term)
            await self._hold.take()  # the core hears of it before it reads the log again
            try:
                if not snap.keep_log:  # else the log already holds what the state references
                    await self._offload(partial(lg.reset_to, base, base_term))
                    if self._guard is not None:
                        self._guard.clear()
                self._machine = machine
                self._applied_index, self._applied_term = snap.index, snap.term
                self.snapshot_index = self._snapshot_taken = snap.index
                self._retain_seen = int(getattr(machine, "retained_index", 0))
                self._snapshot_due = None  # detached from the state just replaced
                self.snapshots_installed += 1
                if snap.lost is not None:
                    self.refill_gap = snap.lost
                core.snapshot_installed(snap.index, snap.term)
            finally:
                self._let_go()
        self._applied_changed.set()
        self._applied_changed = trio.Event()
        self._wakeup.set()

    def _notice_lagging(self) -> None:
        core = self._core
        assert core is not None
        lagging = core.needs_snapshot
        if lagging != self._lagging:
            for peer in sorted(lagging - self._lagging):
                log.warning("follower needs entries deleted by retention and no snapshot "
                            "covers them; it cannot catch up", extra={"fields": {
                                "group": self.group_id, "peer": peer,
                                "first_index": self._log.first_index() if self._log else None,
                                "snapshot": core.snapshot_index}})
            self._lagging = lagging

    def _notice_state_wanted(self) -> None:
        """A follower lost its state and our snapshot cannot rebuild it (there is none,
        or its log was cut above our snapshot's base): take a fresh one, at most every
        `FORCED_SNAPSHOT_INTERVAL` seconds (each costs a serialisation of the state)."""
        core = self._core
        assert core is not None
        if not core.state_wanted or self._applied_index <= self._snapshot_taken:
            return
        now = trio.current_time()
        if now - self._forced_snapshot_at < FORCED_SNAPSHOT_INTERVAL:
            return
        if self._maybe_snapshot(self._applied_index, self._applied_term, forced=True):
            self._forced_snapshot_at = now
            log.info("snapshot taken for a follower that lost its state", extra={"fields": {
                "group": self.group_id, "peers": sorted(core.state_wanted),
                "snapshot": self._applied_index}})

    def _release(self, w: _Waiter) -> None:
        self._uncommitted -= w.size
        if self._uncommitted <= self.options.max_uncommitted_bytes:
            self._space.set()
            self._space = trio.Event()

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for w in waiters.values():
            self._release(w)
            w.resolve(error=error)
        self._space.set()
        self._space = trio.Event()

    def _fail_reads(self, error: BaseException) -> None:
        reads, self._read_waiters = self._read_waiters, {}
        for rw in reads.values():
            rw.resolve(error=error)

    def _notice_changes(self) -> None:
        core = self._core
        assert core is not None
        now = (core.role, core.leader, core.term)
        if now == self._seen:
            return
        was_leader = self._seen[0] == Role.LEADER
        self._seen = now
        if was_leader and core.role != Role.LEADER:
            self._fail_waiters(NotLeader(core.leader))
        if was_leader:  # read rounds of the old role/term were dropped by the core
            self._fail_reads(NotLeader(core.leader if core.role != Role.LEADER else None))
        self._applied_changed.set()
        self._applied_changed = trio.Event()
        log.info("role change", extra={"fields": {"group": self.group_id, "role": core.role.name,
                 "leader": core.leader, "term": core.term}})
        if self._on_change is not None:
            self._on_change(self)
