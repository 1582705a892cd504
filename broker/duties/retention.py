"""Retention policy: which prefix of a group's log its leader proposes to drop.

Every `retention_check_interval` seconds, the leader of each group picks the first index
to keep and proposes `Retain(min_index)` (the registered duty `Retention`, run for each
group this node leads). Applying that entry moves every queue's
minimum offset past it (reads below get OFFSET_TOO_SMALL) on every replica, and each
replica's runtime then snapshots its state and deletes the log segments below (see
`raftlog.runtime`). The leader only *chooses*; the deletion is replicated like any entry.

What may go: a prefix of whole segments, never the active one, where each segment is

* older than `retention_hours`, i.e. its newest message was stored longer ago than that;
* or needed to bring the data file system back under `retention_disk_ratio` (oldest
  segments first, until the excess measured by `shutil.disk_usage` is covered).

Age comes from the store time the leader stamped in front of each MESSAGES batch
(`STORED_PREFIX`), not from file mtimes: it is replicated byte-for-byte, so every replica
and every future leader sees the same age; it survives copying or restoring files; and a
replica that fetched old entries late (a restarted follower, then maybe leader) does not
think them new. A segment whose last few entries hold no MESSAGES batch (only control
records) falls back to its file mtime.

Never past: the commit index, the lowest match index of any follower (voter or
learner), what the leader's state has applied, and the lowest index still holding
undecided prepared data of a transaction (`BrokerState.pinned_index`): a prepared batch
must stay readable until its decision makes it visible or drops it. Nor inside a *gap*
(`BrokerState.retention_gaps`): a committed transaction's records (and a late-decided
half message's) enter their queue at the decision, after records stored later than
their own prepare entry; a cut between the two would delete their entry while the
records queued before them stay, so the queue's minimum could not pass them and they
would read as gone. The cut waits below such a gap until the segments past it may go
too (the window is a transaction's prepare-to-commit time, normally seconds). A follower that needs deleted entries can still catch up -- the leader sends
it the group's whole snapshot (`raftlog` InstallSnapshot) -- but that is a transfer of
the entire state, so retention does not cause it for a follower that is merely behind.
The flip side: a follower that is down keeps the leader from deleting anything it lacks,
even under disk pressure. (A replica whose disk was replaced, or a new one, is caught up
by a snapshot whatever retention did.)
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import trio

from broker.duties.base import Duty, DutyHost
from broker.state.statemachine import BrokerState, Retain
from raftlog.commitlog import CommitLogError, SegmentInfo
from raftlog.runtime import GroupRuntime, NotLeader, ProposalDropped, ProposalLost
from raftlog.types import Entry, EntryType
from wire.records import STORED_PREFIX

__all__ = [
    "CommittedLog",
    "Retention",
    "RetentionPolicy",
    "choose_retain_index",
    "segment_newest_ms",
]

log = logging.getLogger("raftmq.retention")

_AGE_WALK = 64  # entries looked at, newest first, to find a segment's newest batch


class CommittedLog(Protocol):
    """What retention reads of a group's log (`GroupRuntime`'s read-only door; the reads
    that touch the disk are awaited: they run off the event loop)."""

    def log_bounds(self) -> tuple[int, int]: ...

    async def segment_bounds(self) -> list[SegmentInfo]: ...

    async def read_committed(self, index: int) -> Entry: ...


def choose_retain_index(
    segments: Sequence[SegmentInfo],
    *,
    limit: int,
    expired: Callable[[SegmentInfo], bool],
    excess_bytes: int = 0,
    gaps: Collection[tuple[int, int]] = (),
) -> int | None:
    """The first index to keep, or None if no segment can go.

    Deletes a prefix of `segments` (the last one, the active segment, always stays):
    each may go while `excess_bytes` are not yet freed or if it has `expired`, and only
    if every entry in it is below `limit`. The answer is the next segment's first index,
    never one inside a gap (lo, hi] of `gaps` (`BrokerState.retention_gaps`: a cut there
    would delete a late transactional record's entry but not the records queued before
    it); the cut then stays at an earlier boundary until one past the gap may go.
    """
    chosen: int | None = None
    freed = 0
    for seg, nxt in zip(segments, segments[1:], strict=False):
        if nxt.first_index > limit:
            break
        if freed < excess_bytes or expired(seg):
            freed += seg.size
            if not any(lo < nxt.first_index <= hi for lo, hi in gaps):
                chosen = nxt.first_index
        else:
            break
    return chosen


async def segment_newest_ms(
    log: CommittedLog, seg: SegmentInfo, *, walk: int = _AGE_WALK
) -> int:
    """Store time (ms) of the newest MESSAGES batch near the end of `seg`; the file's
    mtime if its last `walk` entries hold none (or cannot be read)."""
    lo = max(seg.first_index, seg.last_index - walk + 1)
    for i in range(seg.last_index, lo - 1, -1):
        try:
            e = await log.read_committed(i)
        except CommitLogError:
            continue  # a corrupt entry: it says nothing about age
        if e.type == EntryType.MESSAGES and len(e.data) >= STORED_PREFIX.size:
            (ms,) = STORED_PREFIX.unpack_from(e.data, 0)
            return int(ms)
    st = await trio.to_thread.run_sync(os.stat, seg.path)
    return int(st.st_mtime * 1000)


def _disk_usage(path: str) -> tuple[int, int]:
    u = shutil.disk_usage(path)
    return u.used, u.total


class RetentionPolicy:
    """Chooses a group's retain index; caches segment ages (full segments never change)."""

    def __init__(
        self,
        *,
        retention_hours: float,
        disk_ratio: float,
        data_dir: str | os.PathLike[str],
        usage: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.retention_ms = int(retention_hours * 3600 * 1000)
        self.disk_ratio = disk_ratio
        path = os.fspath(data_dir)
        self._usage = usage or (lambda: _disk_usage(path))
        self._ages: dict[str, int] = {}  # segment path -> newest store ms

    def excess_bytes(self) -> int:
        """Bytes above the disk ratio on the data file system (0 when under it)."""
        used, total = self._usage()
        return max(0, used - int(self.disk_ratio * total))

    async def candidate(
        self, lg: CommittedLog, *, commit: int, min_match: int, retained: int, now_ms: int,
        pinned: int | None = None, gaps: Collection[tuple[int, int]] = (),
    ) -> int | None:
        """The retain index to propose now, or None (nothing new may go); nothing at or
        above `pinned` (the lowest index still holding undecided prepared data) goes, and
        no cut falls inside one of `gaps` (see `choose_retain_index`)."""
        segments = await lg.segment_bounds()
        live = {s.path for s in segments}
        for p in [p for p in self._ages if p not in live]:
            del self._ages[p]
        limit = min(commit, min_match) + 1
        if pinned is not None:
            limit = min(limit, pinned)
        # the ages `choose_retain_index` may ask for: segments wholly below `limit`
        for seg, nxt in zip(segments, segments[1:], strict=False):
            if nxt.first_index > limit:
                break
            if seg.path not in self._ages:
                self._ages[seg.path] = await segment_newest_ms(lg, seg)

        def expired(seg: SegmentInfo) -> bool:
            return now_ms - self._ages[seg.path] > self.retention_ms

        excess = await trio.to_thread.run_sync(self.excess_bytes)  # a statvfs
        chosen = choose_retain_index(segments, limit=limit, expired=expired, excess_bytes=excess,
                                     gaps=gaps)
        if chosen is None or chosen <= max(retained, lg.log_bounds()[0]):
            return None
        return chosen


async def retain_once(policy: RetentionPolicy, g: GroupRuntime, state: BrokerState) -> int | None:
    """If `g` leads, propose the policy's retain index; returns it (None: nothing done)."""
    horizon = g.retention_horizon()
    if horizon is None:
        return None
    commit, min_match = horizon
    # Entries committed but not applied yet may hold prepared batches the state cannot
    # pin yet: nothing past what it applied goes either.
    pinned = state.pinned_index()
    applied = state.applied_index + 1
    index = await policy.candidate(
        g,
        commit=commit,
        min_match=min_match,
        retained=state.retained_index,
        now_ms=int(time.time() * 1000),
        pinned=applied if pinned is None else min(pinned, applied),
        gaps=state.retention_gaps(),
    )
    if index is None:
        return None
    await g.propose(Retain(index).encode(), EntryType.CONTROL)
    log.info("retain proposed", extra={"fields": {"group": g.group_id, "min_index": index}})
    return index


class Retention(Duty):
    """The policy run on a group this node leads, every `retention_check_interval`."""

    name = "retention"

    def __init__(self, host: DutyHost) -> None:
        super().__init__(host)
        config = host.config
        self.groups = host.registry
        self.interval = config.retention_check_interval
        self.policy = RetentionPolicy(retention_hours=config.retention_hours,
                                      disk_ratio=config.retention_disk_ratio,
                                      data_dir=config.data)

    async def run(self, gid: str) -> None:
        while True:
            await trio.sleep(self.interval)
            g = self.groups.get(gid)
            if g is None or not g.is_open:
                continue
            try:
                await retain_once(self.policy, g, self.groups.states[gid])
            except (NotLeader, ProposalDropped, ProposalLost) as exc:
                log.debug("retain not proposed", extra={"fields": {"group": gid,
                                                                   "why": repr(exc)}})
            except (CommitLogError, OSError):
                log.exception("retention check failed", extra={"fields": {"group": gid}})
