"""Repairing a corrupt CommitLog entry from a peer's copy: `CommitLog.repair` checks the
bytes and survives a crash mid-way, and a group's runtime finds corrupt entries, never
applies or sends past them, and repairs them from its peers."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from chaos.disk_faults import corrupt_entry
from raftlog.commitlog import (
    HEADER_SIZE,
    CommitLog,
    CommitLogError,
    CorruptEntry,
    OutOfRange,
    encode_entry,
    split_stored,
)
from raftlog.commitlog import _log as commitlog_log
from raftlog.fsutil import disable_sync_marks, enable_sync_marks, load_sync_marks
from raftlog.runtime import EntryUnavailable, FetchRaw, GroupRuntime
from raftlog.types import Entry, EntryType
from tests.raftlog.test_commitlog import SEG, crash, flip, locate, make, seg_files
from tests.runtime_harness import Group, core_of, log_of


def _pair(tmp: Path, n: int = 20) -> tuple[CommitLog, CommitLog, list[Entry]]:
    """Two logs holding the same entries: a replica and its healthy peer."""
    entries = make(1, n + 1, size=300)
    logs = []
    for name in ("local", "peer"):
        log = CommitLog.open(tmp / name, segment_size=SEG)
        log.append(entries)
        log.sync()
        logs.append(log)
    return logs[0], logs[1], entries


def _segment_bytes(log: CommitLog) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(Path(log.dir).iterdir()) if p.name.isdigit())


def test_a_corrupt_entry_found_at_open_is_repaired_from_the_peer(tmp_path: Path) -> None:
    local, peer, entries = _pair(tmp_path)
    seg, off = locate(local, 7)
    crash(local)  # no close: the index was not written, so recovery scans every entry
    flip(seg, off + HEADER_SIZE + 100)
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == [7]
        assert log.last_index() == 20  # kept, not truncated: the log's length stays
        assert log.term(7) == 1
        with pytest.raises(CorruptEntry):
            log.entries(7, 8, 1 << 20)
        assert log.entries(1, 21, 1 << 30) == entries[:6]  # a good prefix, then a stop
        assert log.repair(7, peer.read_raw(7, 8)) is True
        assert log.recovery.corrupt == []
        assert log.entries(1, 21, 1 << 30) == entries
        assert log.verify() == []
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == [] and log.verify() == []
        assert bytes(log.read_raw(1, 21)) == bytes(peer.read_raw(1, 21))
    peer.close()


def test_repair_refuses_bytes_that_are_not_the_entry(tmp_path: Path) -> None:
    local, peer, _ = _pair(tmp_path)
    seg, off = locate(local, 5)
    flip(seg, off + HEADER_SIZE + 3)
    assert [c.index for c in local.verify()] == [5]
    before = _segment_bytes(local)
    good = bytes(peer.read_raw(5, 6))
    garbled = bytearray(good)
    garbled[HEADER_SIZE + 10] ^= 1
    other_term = encode_entry(Entry(5, 2, EntryType(5 % 4), good[HEADER_SIZE:]))
    other_size = encode_entry(Entry(5, 1, EntryType(5 % 4), good[HEADER_SIZE:] + b"x"))
    with pytest.raises(CorruptEntry, match="body CRC"):
        local.repair(5, bytes(garbled))
    with pytest.raises(CorruptEntry):
        local.repair(5, good[:20])  # not even a header
    with pytest.raises(ValueError, match="holding entry 6"):
        local.repair(5, peer.read_raw(6, 7))
    with pytest.raises(ValueError, match="term 2"):
        local.repair(5, other_term)
    with pytest.raises(ValueError):
        local.repair(5, other_size)
    with pytest.raises(ValueError):
        local.repair(5, peer.read_raw(5, 7))  # two entries
    with pytest.raises(OutOfRange):
        local.repair(21, good)
    assert _segment_bytes(local) == before  # nothing was written
    assert local.repair(5, good) is True
    assert local.verify() == []
    assert local.repair(5, good) is False  # intact now: nothing to do
    local.close()
    peer.close()


def test_a_corrupt_header_is_repaired_by_its_index_record(tmp_path: Path) -> None:
    local, peer, entries = _pair(tmp_path)
    seg, off = locate(local, 9)
    local.close()  # a complete index: recovery checks only the last entry
    flip(seg, off + 12)  # inside the term field of the header
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == []
        bad = log.verify()
        assert [c.index for c in bad] == [9] and "CRC" in bad[0].reason
        assert log.term(9) == 1  # from the index record
        assert log.repair(9, peer.read_raw(9, 10)) is True
        assert log.entries(1, 21, 1 << 30) == entries
    peer.close()


def test_a_crash_during_repair_leaves_an_entry_that_is_repaired_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raftlog.commitlog._log as cl

    local, peer, entries = _pair(tmp_path)
    seg, off = locate(local, 12)
    flip(seg, off + HEADER_SIZE + 250)  # near the end of the body
    good = bytes(peer.read_raw(12, 13))

    def torn(fd: int, buffers: list[bytes | memoryview], offset: int) -> None:
        """The process dies half-way through the overwrite."""
        data = b"".join(bytes(b) for b in buffers)
        cl.os.pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(5, "killed mid-write")

    monkeypatch.setattr(cl, "pwritev_all", torn)
    with pytest.raises(CommitLogError, match="closed"):
        local.repair(12, good)
    monkeypatch.undo()
    assert local.closed
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.last_index() == 20
        assert [c.index for c in log.verify()] == [12]  # still corrupt, still there
        with pytest.raises(CorruptEntry):
            log.entries(12, 13, 1 << 20)
        assert log.repair(12, good) is True
        assert log.entries(1, 21, 1 << 30) == entries
    peer.close()


def test_repair_is_fsynced_through_the_sync_marks(tmp_path: Path) -> None:
    local, peer, _ = _pair(tmp_path)
    seg, off = locate(local, 3)
    flip(seg, off + HEADER_SIZE)
    enable_sync_marks(tmp_path / "local")
    try:
        size = seg.stat().st_size
        assert local.repair(3, peer.read_raw(3, 4))
    finally:
        disable_sync_marks(tmp_path / "local")
    assert load_sync_marks(tmp_path / "local").sizes[seg.stat().st_ino] == size
    local.close()
    peer.close()


def test_repair_many_writes_each_good_copy_and_fsyncs_once_per_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged run repaired from a peer's range: every entry is checked on its own (a
    wrong copy is refused, an intact local one left alone), the good ones written, and
    the whole round made durable with one fsync per segment, not one per entry."""
    local, peer, entries = _pair(tmp_path, n=400)
    damaged = range(5, 300)
    segs = set()
    for i in damaged:
        seg, off = locate(local, i)
        flip(seg, off + HEADER_SIZE + 7)
        segs.add(seg)
    assert len(segs) >= 2  # the run crosses a segment boundary
    syncs: list[int] = []
    real = commitlog_log._datasync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(commitlog_log, "_datasync", counting)
    frames = split_stored(peer.read_raw(4, 301), 4, 301)
    assert [i for i, _f in frames] == list(range(4, 301))
    frames[61] = (65, frames[62][1])  # entry 65 offered entry 66's bytes
    outcome = local.repair_many(frames)
    assert outcome[4] is False and outcome[300] is False  # intact here: nothing written
    assert isinstance(outcome[64], bool) and outcome[64]
    assert isinstance(outcome[65], ValueError)
    assert all(outcome[i] is True for i in damaged if i != 65)
    assert len(syncs) == len(segs)
    assert [c.index for c in local.verify()] == [65]  # the refused one stays corrupt
    assert local.repair(65, peer.read_raw(65, 66)) is True
    assert local.entries(1, 401, 1 << 30) == entries
    local.close()
    peer.close()


# --------------------------------------------------------------------------- runtime


class _Applied:
    """Records what was applied, in order."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, int, bytes]] = []

    def apply(self, entry: Entry) -> int:
        self.applied.append((entry.index, entry.term, bytes(entry.data)))
        return entry.index


class _Repairing(Group[_Applied]):
    """The test harness' group, each replica in ``n{i}/g`` and able to fetch entries from
    the others' CommitLogs the way READ_RAW does; `blocked` peers answer nothing, and
    `hung` ones never answer (a paused process: the asker's timeout ends the wait)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, _Applied, node_dirs=True)
        self.blocked: set[int] = set()
        self.hung: set[int] = set()
        self.fetches: list[tuple[int, int, int]] = []  # (asker, peer, first index asked)
        self.max_bytes = 1 << 20  # of one answer, as READ_RAW_MAX_BYTES bounds a node's

    def fetcher(self, asker: int) -> FetchRaw | None:
        async def fetch(peer: int, lo: int, hi: int) -> bytes:
            await trio.sleep(0)
            self.fetches.append((asker, peer, lo))
            if peer in self.hung:
                await trio.sleep_forever()
            rt = self.runtimes.get(peer)
            if peer in self.blocked or peer in self.down or rt is None or not rt.is_open:
                raise OSError("unreachable")
            lg = log_of(rt)
            if lo < lg.first_index():
                raise EntryUnavailable("removed", gone=True)
            if lo > lg.last_index() or lo in rt.unrepaired:
                raise EntryUnavailable("not here")
            return (await rt.read_raw(lo, hi, self.max_bytes))[1]

        return fetch


def test_a_replica_repairs_a_corrupt_entry_and_applies_nothing_past_it_until_then(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        r = _Repairing(tmp_path)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            for k in range(30):
                await leader.propose(b"m%03d" % k)
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            await r.stop_and_wait(victim)
            hit = corrupt_entry(tmp_path / f"n{victim}", random.Random(7))
            assert hit is not None and hit["group"] == "g"
            bad = hit["index"]

            r.blocked = {1, 2, 3}  # no peer answers yet
            await r.start(n, victim)
            rt = r.runtimes[victim]
            assert rt.unrepaired == {bad}  # found at open by checking the replay range
            for k in range(30, 40):
                await leader.propose(b"m%03d" % k)
            last = log_of(leader).last_index()
            await r.wait(lambda: log_of(rt).durable_index() >= last)
            # the other follower learned that everything up to `last` is committed (the
            # same heartbeats reached the victim), and every task has had its turn since:
            # an apply past the corrupt entry would have happened by now
            other_rt = r.runtimes[next(i for i in (1, 2, 3) if i not in (victim, leader.node_id))]
            await r.wait(lambda: core_of(other_rt).commit >= last)
            await trio.testing.wait_all_tasks_blocked()
            applied = [e[0] for e in r.machines[victim].applied]
            assert applied == list(range(1, bad))  # nothing at or past the corrupt entry
            assert rt.status()["unrepaired"] == [bad]
            assert not rt.is_leader
            # its acknowledgements still count: with the other follower stopped the
            # leader commits new entries with the corrupt replica's votes alone
            other = next(i for i in (1, 2, 3) if i not in (victim, leader.node_id))
            await r.stop_and_wait(other)
            with trio.fail_after(5):
                await leader.propose(b"with the corrupt replica's ack")

            r.blocked = set()
            await r.wait(lambda: not rt.unrepaired)
            assert rt.repaired == 1
            target = core_of(leader).commit
            await r.wait(lambda: len(r.machines[victim].applied) >= target)
            assert r.machines[victim].applied == r.machines[leader.node_id].applied[:target]
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_leader_meeting_a_corrupt_entry_while_sending_has_it_repaired(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        r = _Repairing(tmp_path)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            lg = log_of(leader)
            assert lg is not None
            lagging, other = (i for i in (1, 2, 3) if i != leader.node_id)
            await r.stop_and_wait(lagging)
            for k in range(20):
                await leader.propose(b"x%03d" % k + b"." * 200)
            bad = lg.last_index() - 5
            seg, off = locate(lg, bad)
            flip(seg, off + HEADER_SIZE + 50)  # under the running leader
            await r.start(n, lagging)  # it needs the corrupt entry from the leader
            want = lg.last_index()
            await r.wait(lambda: r.runtimes[lagging].status()["applied"] >= want)
            assert leader.repaired == 1 and not leader.unrepaired
            assert any(asker == leader.node_id and index == bad
                       for asker, _p, index in r.fetches)
            assert r.machines[lagging].applied[:want] == r.machines[other].applied[:want]
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_middle_segment_cut_short_is_reported_and_repaired_in_place(tmp_path: Path) -> None:
    """The chaos `truncate-file` nemesis cut a middle segment of a stopped node: every
    entry past the cut is reported at open and put back where the index says it was,
    extending the file, never into the next segment."""
    local, peer, entries = _pair(tmp_path, n=600)
    local.close()
    files = seg_files(tmp_path / "local")
    assert len(files) >= 3
    victim = files[1]
    os.truncate(victim, victim.stat().st_size * 2 // 3)
    end = int(victim.name) + victim.stat().st_size
    nxt = int(files[2].name)
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        lost = [i for i in range(1, 601)
                if log.position_of(i) < nxt and log.position_of(i) + 300 + HEADER_SIZE > end]
        assert len(lost) > 2
        assert log.recovery.corrupt == lost  # reported at open, not on first read
        assert log.last_index() == 600  # nothing truncated
        for i in lost:
            with pytest.raises(CorruptEntry):
                log.entries(i, i + 1, 1 << 20)
        # reads and checks running from intact entries into the cut end cleanly
        assert log.entries(1, 601, 1 << 30) == entries[: lost[0] - 1]
        assert bytes(log.read_raw(1, 601)) == bytes(peer.read_raw(1, lost[0]))
        assert [c.index for c in log.verify()] == lost
        with pytest.raises(CorruptEntry):
            log.read_at(log.position_of(lost[-1]))
        # the last lost entry first: the file grows past a hole of the others
        for i in [lost[-1], *lost[:-1]]:
            assert log.repair(i, peer.read_raw(i, i + 1)) is True
            assert log.entries(i, i + 1, 1 << 20) == [entries[i - 1]]
            if i == lost[-1]:
                with pytest.raises(CorruptEntry):  # the hole stays unreadable until repaired
                    log.entries(lost[0], lost[0] + 1, 1 << 20)
        assert log.recovery.corrupt == []
        assert victim.stat().st_size == nxt - int(victim.name)
        assert log.entries(1, 601, 1 << 30) == entries
        assert bytes(log.read_raw(1, 601)) == bytes(peer.read_raw(1, 601))
        assert log.verify() == []
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == [] and log.verify() == []
        assert bytes(log.read_raw(1, 601)) == bytes(peer.read_raw(1, 601))
    peer.close()


def test_repair_never_writes_into_the_next_segment(tmp_path: Path) -> None:
    local, peer, _ = _pair(tmp_path, n=600)
    local.close()
    files = seg_files(tmp_path / "local")
    os.truncate(files[1], files[1].stat().st_size - 100)
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        bad = log.recovery.corrupt[-1]
        # an index record moved into the next segment's extent (as a damaged index
        # could say) must not let a repair overwrite the head of that segment
        pos, term, size, etype = log._record(bad)
        nxt = int(files[2].name)
        rec = (nxt - size + 1, term, size, etype)
        before = files[2].read_bytes()
        log._record = lambda i: rec if i == bad else CommitLog._record(log, i)  # type: ignore[method-assign]
        with pytest.raises(CommitLogError, match="next segment"):
            log.repair(bad, peer.read_raw(bad, bad + 1))
        assert files[2].read_bytes() == before
    peer.close()


def _cut_a_middle_segment(data: Path) -> None:
    """What the chaos `truncate-file` nemesis did to a stopped node's log."""
    files = seg_files(data)
    assert len(files) >= 3
    os.truncate(files[1], files[1].stat().st_size // 2)


async def _cut_one_follower(
    r: _Repairing, n: trio.Nursery, tmp_path: Path,
    damage: Callable[[Path], None] = _cut_a_middle_segment,
) -> tuple[GroupRuntime, int, int]:
    """Start the group, store 150 entries over several segments, stop a follower once it
    holds them all and `damage` its data (by default, cut a middle segment of its log
    short): (leader, that follower, the other follower). The follower is left stopped."""
    for i in (1, 2, 3):
        await r.start(n, i)
    leader = await r.leader()
    for k in range(150):
        await leader.propose(b"m%03d" % k + b"." * 200)
    victim = next(i for i in (1, 2, 3) if i != leader.node_id)
    other = next(i for i in (1, 2, 3) if i not in (victim, leader.node_id))
    await r.wait(lambda: log_of(r.runtimes[victim]).durable_index()
                 >= log_of(leader).last_index())
    await r.stop_and_wait(victim)
    damage(tmp_path / f"n{victim}" / "g")
    return leader, victim, other


def test_a_replica_started_on_a_cut_middle_segment_repairs_it_from_its_peers(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        r = _Repairing(tmp_path)
        r.opts["segment_size"] = 8 << 10
        async with trio.open_nursery() as n:
            leader, victim, _other = await _cut_one_follower(r, n, tmp_path)

            await r.start(n, victim)
            rt = r.runtimes[victim]
            lost = list(log_of(rt).recovery.corrupt)
            assert lost and rt.unrepaired == set(lost)  # found at open, before any read
            await r.wait(lambda: not rt.unrepaired)
            assert rt.repaired == len(lost) and rt.is_open
            await leader.propose(b"after the repair")
            last = log_of(leader).last_index()
            await r.wait(lambda: len(r.machines[victim].applied) >= last)
            assert r.machines[victim].applied == r.machines[leader.node_id].applied[:last]
            assert (bytes(log_of(rt).read_raw(1, last + 1))
                    == bytes(log_of(leader).read_raw(1, last + 1)))
            assert log_of(rt).verify() == []
            n.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("hung_peer", ["leader", "follower"])
def test_a_peer_that_never_answers_costs_one_timeout_not_one_per_entry(
    tmp_path: Path, hung_peer: str,
) -> None:
    """A cut segment leaves dozens of entries to repair; with one of the two peers
    paused, the repair asks it once, times out, and takes the rest from the other peer
    (asking it first for each entry would cost a timeout per entry: minutes)."""
    async def main() -> None:
        r = _Repairing(tmp_path)
        r.opts["segment_size"] = 8 << 10
        async with trio.open_nursery() as n:
            leader, victim, other = await _cut_one_follower(r, n, tmp_path)
            hung = leader.node_id if hung_peer == "leader" else other
            r.hung = {hung}

            await r.start(n, victim)
            rt = r.runtimes[victim]
            lost = list(log_of(rt).recovery.corrupt)
            assert len(lost) >= 10 and rt.unrepaired == set(lost)
            await r.wait(lambda: not rt.unrepaired)  # 10 s; a timeout is 3 s
            asked = [p for asker, p, _i in r.fetches if asker == victim]
            assert asked.count(hung) <= 1, asked
            assert rt.repaired == len(lost)
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_repair_the_log_refuses_leaves_the_entry_unreadable_and_the_replica_running(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        r = _Repairing(tmp_path)
        r.opts["segment_size"] = 8 << 10
        refused: list[int] = []

        def refusing(fn: Callable[[], Any]) -> Any:
            # the log's own refusal (an index record placing the entry where it cannot
            # be written), through the runtime's disk-call seam; the log stays open
            if getattr(getattr(fn, "func", None), "__name__", "") == "repair_many":
                indexes = [i for i, _raw in fn.args[0]]  # type: ignore[attr-defined]
                refused.extend(indexes)
                return {i: CommitLogError(f"entry {i} would run past the next segment")
                        for i in indexes}
            return fn()

        async with trio.open_nursery() as n:
            leader, victim, other = await _cut_one_follower(r, n, tmp_path)

            r.disk_calls[victim] = refusing
            await r.start(n, victim)
            rt = r.runtimes[victim]
            lost = set(log_of(rt).recovery.corrupt)
            await r.wait(lambda: set(refused) == lost)
            assert rt.is_open and not rt.closed and rt.unrepaired == lost
            with pytest.raises(CorruptEntry):
                await rt.read_raw(min(lost))
            # still a working replica: with the other follower stopped its
            # acknowledgements alone let the leader commit
            await r.stop_and_wait(other)
            with trio.fail_after(5):
                await leader.propose(b"with the damaged replica's ack")
            assert rt.is_open and rt.unrepaired == lost
            n.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("damage", ["cut-active-segment", "cut-index", "cut-index-and-middle"])
def test_a_replica_started_on_a_cut_log_or_index_recovers_and_catches_up(
    tmp_path: Path, damage: str
) -> None:
    """The other files the `truncate-file` nemesis cuts: recovery truncates or rebuilds,
    the replica runs and gets back what it lost from the leader."""

    async def main() -> None:
        r = _Repairing(tmp_path)
        r.opts["segment_size"] = 8 << 10
        def cut(data: Path) -> None:
            files = seg_files(data)
            if damage == "cut-active-segment":
                os.truncate(files[-1], files[-1].stat().st_size // 2)
            else:
                index = data / "commitlog" / "index"
                os.truncate(index, index.stat().st_size // 3)
                if damage == "cut-index-and-middle":
                    _cut_a_middle_segment(data)

        async with trio.open_nursery() as n:
            leader, victim, _other = await _cut_one_follower(r, n, tmp_path, cut)
            await r.start(n, victim)
            rt = r.runtimes[victim]
            await leader.propose(b"after the damage")
            last = log_of(leader).last_index()
            await r.wait(lambda: len(r.machines[victim].applied) >= last)
            assert rt.is_open and not rt.unrepaired
            assert r.machines[victim].applied == r.machines[leader.node_id].applied[:last]
            assert (bytes(log_of(rt).read_raw(1, last + 1))
                    == bytes(log_of(leader).read_raw(1, last + 1)))
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_crash_between_repairs_of_a_cut_segment_leaves_the_rest_reported(
    tmp_path: Path,
) -> None:
    local, peer, entries = _pair(tmp_path, n=600)
    local.close()
    files = seg_files(tmp_path / "local")
    os.truncate(files[1], files[1].stat().st_size * 2 // 3)
    log = CommitLog.open(tmp_path / "local", segment_size=SEG)
    lost = list(log.recovery.corrupt)
    assert len(lost) > 2
    assert log.repair(lost[-1], peer.read_raw(lost[-1], lost[-1] + 1))  # past a hole
    crash(log)
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == lost[:-1]  # the hole's entries, found at open
        for i in lost[:-1]:
            assert log.repair(i, peer.read_raw(i, i + 1))
        assert log.entries(1, 601, 1 << 30) == entries
    with CommitLog.open(tmp_path / "local", segment_size=SEG) as log:
        assert log.recovery.corrupt == [] and log.verify() == []
    peer.close()
