"""CommitLog: round trips, truncation, recovery from torn tails and broken indexes."""

from __future__ import annotations

import hashlib
import os
import random
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.commitlog import (
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    CommitLog,
    CommitLogError,
    CorruptEntry,
    OutOfRange,
    decode_entries,
    encode_entry,
)
from raftlog.commitlog._index import index_record
from raftlog.types import Entry, EntryType

SEG = 64 << 10


def body_for(index: int, size: int | None = None) -> bytes:
    """Deterministic, index-specific content."""
    if size is None:
        size = (index * 7919) % 5000
    seed = hashlib.blake2b(index.to_bytes(8, "little"), digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


def make(lo: int, hi: int, term: int = 1, size: int | None = None) -> list[Entry]:
    return [Entry(i, term, EntryType(i % 4), body_for(i, size)) for i in range(lo, hi)]


def seg_files(path: Path) -> list[Path]:
    d = path / "commitlog"
    return sorted(p for p in d.iterdir() if p.name != "index")


def index_file(path: Path) -> Path:
    return path / "commitlog" / "index"


def crash(log: CommitLog) -> None:
    """Drop the log without close(): what a killed process leaves behind."""
    log._close_fds()


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def locate(log: CommitLog, index: int) -> tuple[Path, int]:
    """(segment file, offset in it) of entry `index`."""
    pos = log.position_of(index)
    starts = [int(p.name) for p in seg_files(Path(log.path))]
    start = max(s for s in starts if s <= pos)
    return Path(log.dir) / f"{start:020d}", pos - start


def vouched_end(path: Path) -> int:
    """Position after the last entry the index file vouches for (0 for none): what a
    crash cannot take, since each was fsynced before its record was written."""
    data = index_file(path).read_bytes()
    n = len(data) // INDEX_RECORD_SIZE
    if not n:
        return 0
    pos, _term, size = struct.unpack_from("<QQI", data, (n - 1) * INDEX_RECORD_SIZE)
    return int(pos + size)


def check_all(log: CommitLog, expected: list[Entry]) -> None:
    assert log.last_index() == (expected[-1].index if expected else 0)
    if not expected:
        return
    lo, hi = expected[0].index, expected[-1].index + 1
    assert log.entries(lo, hi, 1 << 40) == expected
    assert [log.term(e.index) for e in expected] == [e.term for e in expected]
    assert bytes(log.read_raw(lo, hi)) == b"".join(encode_entry(e) for e in expected)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "group"


# ------------------------------------------------------------------ basics


def test_fresh_log(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.first_index() == 1
        assert log.last_index() == 0
        assert log.term(0) == 0
        assert log.entries(1, 1, 100) == []
        assert log.sync() == 0
        assert log.durable_index() == 0
        with pytest.raises(IndexError):
            log.term(1)
    assert [p.name for p in seg_files(path)] == ["0" * 20]


def test_roundtrip_across_segments(path: Path) -> None:
    ents = make(1, 301)
    log = CommitLog.open(path, segment_size=SEG)
    positions: list[int] = []
    for lo in range(0, 300, 37):
        positions += log.append(ents[lo : lo + 37])
    assert log.last_index() == 300
    files = seg_files(path)
    assert len(files) > 5
    assert all(len(p.name) == 20 and p.name.isdigit() for p in files)
    # every segment starts at the position of its first entry, no entry spans two
    starts = [int(p.name) for p in files]
    assert set(starts) <= set(positions)
    for s, f in zip(starts, files, strict=True):
        assert f.stat().st_size <= SEG
        assert s + f.stat().st_size in set(positions) | {log.end_position()}
    check_all(log, ents)
    for e, pos in zip(ents, positions, strict=True):
        assert log.position_of(e.index) == pos
        assert log.read_at(pos) == e
    # positions are contiguous byte offsets
    for a, b, e in zip(positions, positions[1:], ents, strict=False):
        assert b - a == HEADER_SIZE + len(e.data)
    assert decode_entries(log.read_raw(10, 200)) == ents[9:199]
    assert log.sync() == 300 and log.durable_index() == 300
    log.close()
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.recovery.index_rebuilt == 0
        assert log.recovery.truncated_from_index is None
        check_all(log, ents)
        assert [log.position_of(e.index) for e in ents] == positions


def test_entries_max_bytes(path: Path) -> None:
    ents = make(1, 101, size=1000)
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(ents)
        stored = HEADER_SIZE + 1000
        assert log.entries(1, 101, 0) == ents[:1]  # at least one
        assert log.entries(5, 101, stored * 3) == ents[4:7]
        assert log.entries(5, 101, stored * 3 - 1) == ents[4:6]
        assert log.entries(5, 8, 1 << 30) == ents[4:7]
        # crossing segment boundaries with a limit
        got = log.entries(1, 101, 70_000)
        assert got == ents[: len(got)] and len(got) == 70_000 // stored
        raw = log.read_raw(3, 101, max_bytes=stored * 2 + 10)
        assert bytes(raw) == encode_entry(ents[2]) + encode_entry(ents[3])
        assert decode_entries(log.read_raw(1, 101, max_bytes=1)) == ents[:1]
        assert bytes(log.read_raw(1, 101, verify=False)) == bytes(log.read_raw(1, 101))


def test_big_entry_gets_own_segment(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(make(1, 4, size=1000))
        big = Entry(4, 1, EntryType.MESSAGES, body_for(4, 3 * SEG))
        (pos,) = log.append([big])
        log.append(make(5, 8, size=1000))
        assert int(seg_files(path)[1].name) == pos
        assert log.read_at(pos) == big
        assert log.entries(3, 6, 1) == [log.entries(3, 4, 1)[0]]
        assert log.entries(4, 5, 1) == [big]
        assert len(seg_files(path)) == 3
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.entries(4, 5, 1) == [big]
        assert log.last_index() == 7


def test_append_validation(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        with pytest.raises(ValueError):
            log.append(make(2, 3))
        log.append(make(1, 3, term=5))
        with pytest.raises(ValueError):
            log.append(make(2, 3, term=5))  # overlaps: truncate first
        with pytest.raises(ValueError):
            log.append(make(3, 4, term=4))  # term goes backwards
        with pytest.raises(ValueError):
            log.append([Entry(3, 5, EntryType.NOOP), Entry(5, 5, EntryType.NOOP)])
        assert log.last_index() == 2
        assert log.append([]) == []
        assert log.term(2) == 5


def test_range_errors(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(make(1, 11))
        for bad in (-1, 11, 12):
            with pytest.raises(OutOfRange):
                log.term(bad)
        with pytest.raises(IndexError):
            log.entries(0, 3, 100)
        with pytest.raises(IndexError):
            log.entries(5, 12, 100)
        with pytest.raises(IndexError):
            log.position_of(11)
        with pytest.raises(OutOfRange):
            log.read_at(log.end_position())
        assert log.entries(7, 7, 100) == []
        assert log.entries(11, 11, 100) == []
    with pytest.raises(CommitLogError):
        log.entries(1, 2, 10)


def test_read_at_rejects_non_boundary(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        pos = log.append(make(1, 5, size=200))
        with pytest.raises(CorruptEntry):
            log.read_at(pos[2] + 7)


# ------------------------------------------------------------------ truncation


def test_truncate_then_append_new_term(path: Path) -> None:
    ents = make(1, 201, term=1)
    log = CommitLog.open(path, segment_size=SEG)
    log.append(ents)
    log.sync()
    nseg = len(seg_files(path))
    log.truncate_from(60)
    assert len(seg_files(path)) < nseg
    assert log.last_index() == 59 and log.term(59) == 1
    assert log.durable_index() == 59
    new = make(60, 120, term=3)
    log.append(new)
    check_all(log, ents[:59] + new)
    log.close()
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, ents[:59] + new)
        log.truncate_from(120)  # nothing to drop
        assert log.last_index() == 119
        with pytest.raises(OutOfRange):
            log.truncate_from(121)
        with pytest.raises(OutOfRange):
            log.truncate_from(0)
        log.truncate_from(1)
        assert log.last_index() == 0
        assert log.end_position() == 0
        log.append(make(1, 5, term=7))
        check_all(log, make(1, 5, term=7))
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, make(1, 5, term=7))
        assert [p.name for p in seg_files(path)] == ["0" * 20]


def test_truncate_at_segment_start(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        ents = make(1, 101, size=3000)
        positions = log.append(ents)
        second = int(seg_files(path)[1].name)
        i = positions.index(second) + 1
        log.truncate_from(i)
        assert int(seg_files(path)[-1].name) < second
        assert log.end_position() == second
        log.append(make(i, i + 3, term=2, size=100))
        check_all(log, ents[: i - 1] + make(i, i + 3, term=2, size=100))


def test_truncate_before_sync_of_unsynced_tail(path: Path) -> None:
    log = CommitLog.open(path, segment_size=SEG)
    log.append(make(1, 50))
    log.sync()
    log.append(make(50, 80))  # unsynced
    log.truncate_from(70)
    assert log.durable_index() == 69
    crash(log)
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, make(1, 70))


# ------------------------------------------------------------------ durability


def test_sync_always_and_interval(path: Path) -> None:
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(make(1, 5))
        assert log.durable_index() == 0
        assert log.sync() == 4 == log.durable_index()
    with CommitLog.open(path / "b", segment_size=SEG, fsync="interval", fsync_interval=10) as log:
        t = time.monotonic()
        log.sync(now=t)  # the first sync after open fsyncs
        log.append(make(1, 5))
        assert log.sync(now=t + 1) == 4  # page-cache durability is reported
        assert log.durable_index() == 0  # ... but nothing was fsynced yet
        assert log.sync(now=t + 11) == 4
        assert log.durable_index() == 4
    with pytest.raises(ValueError):
        CommitLog.open(path / "c", fsync="never")  # type: ignore[arg-type]


def test_failed_fsync_closes_the_log(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import raftlog.commitlog._log as cl

    log = CommitLog.open(path, segment_size=SEG)
    log.append(make(1, 10))
    log.sync()
    log.append(make(10, 20))

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(cl, "_datasync", failing)
    with pytest.raises(CommitLogError, match="fsync failed"):
        log.sync()
    with pytest.raises(CommitLogError, match="closed"):
        log.sync()
    monkeypatch.undo()
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, make(1, 20))  # here the page cache still had it all


def test_index_written_only_after_fsync(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import raftlog.commitlog._index as cl

    monkeypatch.setattr(cl, "_INDEX_WRITE_RECORDS", 1)
    log = CommitLog.open(path, segment_size=SEG)
    log.append(make(1, 20))
    assert index_file(path).stat().st_size == 0
    log.sync()
    assert index_file(path).stat().st_size == 19 * INDEX_RECORD_SIZE
    log.append(make(20, 30))
    assert index_file(path).stat().st_size == 19 * INDEX_RECORD_SIZE
    assert log.term(25) == 1  # served from memory
    crash(log)
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.recovery.index_records_valid == 19
        assert log.recovery.index_rebuilt == 10
        check_all(log, make(1, 30))


def test_index_writes_are_batched(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import raftlog.commitlog._index as cl

    monkeypatch.setattr(cl, "_INDEX_WRITE_RECORDS", 50)
    log = CommitLog.open(path, segment_size=SEG)
    for i in range(1, 120, 10):
        log.append(make(i, i + 10))
        log.sync()
        written = index_file(path).stat().st_size // INDEX_RECORD_SIZE
        assert written in (0, 50, 100)
        assert log.last_index() - written < 50
    assert log.term(120) == 1 and log.position_of(110) > 0
    crash(log)
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.recovery.index_records_valid == 100
        assert log.recovery.index_rebuilt == 20
        check_all(log, make(1, 121))
    assert index_file(path).stat().st_size == 120 * INDEX_RECORD_SIZE


def test_term_reads_from_index_beyond_tail_cache(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raftlog.commitlog._index as cl

    monkeypatch.setattr(cl, "_TAIL_CACHE", 4)
    monkeypatch.setattr(cl, "_INDEX_WRITE_RECORDS", 1)
    with CommitLog.open(path, segment_size=SEG) as log:
        for lo in range(1, 200, 10):
            log.append(make(lo, lo + 10, term=lo))
            log.sync()
        assert len(log._tail) // INDEX_RECORD_SIZE <= 8 + 10
        assert [log.term(i) for i in range(1, 200)] == [
            ((i - 1) // 10) * 10 + 1 for i in range(1, 200)
        ]


# ------------------------------------------------------------------ recovery: torn tails


def _torn_tail_setup(path: Path, clean: bool) -> list[Entry]:
    ents = make(1, 121)
    log = CommitLog.open(path, segment_size=SEG)
    log.append(ents[:100])
    log.sync()
    log.append(ents[100:])
    if clean:
        log.close()
    else:
        crash(log)
    return ents


def _check_vouched_entry_kept(path: Path, ents: list[Entry]) -> None:
    """The damaged last entry, which the index vouches for, is kept as corrupt (the log
    end and last term unchanged), appends go after it, and `repair` puts it back."""
    last = ents[-1]
    after = Entry(last.index + 1, 9, EntryType.NOOP, b"after")
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == last.index and log.term(last.index) == last.term
        assert log.recovery.corrupt == [last.index]
        assert log.recovery.truncated_from_index is None
        assert [c.index for c in log.verify()] == [last.index]
        with pytest.raises(CorruptEntry):
            log.entries(last.index, last.index + 1, 1 << 20)
        log.append([after])
        log.sync()
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == after.index
        assert [c.index for c in log.verify()] == [last.index]
        assert log.repair(last.index, encode_entry(last))
        check_all(log, [*ents, after])
        assert log.verify() == []


@pytest.mark.parametrize("how", ["interval", "skip-fsync", "old-format"])
def test_an_entry_whose_record_vouches_for_nothing_is_cut_as_a_torn_tail(
    path: Path, how: str
) -> None:
    """Index records of an `interval` log, of one that skipped an fsync (the test
    mutation), and of files written before the flag existed do not say the entry was
    fsynced first: a damaged last entry there is a torn tail, as it always was."""
    ents = make(1, 21)
    log = CommitLog.open(path, segment_size=SEG, fsync="interval" if how == "interval"
                         else "always")
    log.append(ents)
    if how == "skip-fsync":
        plan = log.begin_sync(fsync=False)
        assert plan is not None
        log.finish_sync(plan)
    log.close()  # fsyncs the data, then writes every index record
    idx = index_file(path).read_bytes()
    assert len(idx) == 20 * INDEX_RECORD_SIZE
    if how == "old-format":  # records as written before the flags byte: zero, CRC redone
        assert idx[21] == 1  # VOUCHED, by this always-fsync log
        old = bytearray()
        for i in range(20):
            pos, term, size, etype = struct.unpack_from("<QQIB", idx, i * INDEX_RECORD_SIZE)
            old += index_record(i + 1, pos, term, size, etype)
        index_file(path).write_bytes(bytes(old))
    else:
        assert idx[21] == 0
    last = seg_files(path)[-1]
    os.truncate(last, last.stat().st_size - 3)
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, ents[:-1])
        assert log.recovery.truncated_from_index == 20 and log.recovery.corrupt == []


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize(
    "damage", ["cut_mid_body", "cut_mid_header", "garbage", "flip_body", "flip_header", "zeros"]
)
def test_torn_tail(path: Path, clean: bool, damage: str) -> None:
    ents = _torn_tail_setup(path, clean)
    last = seg_files(path)[-1]
    size = last.stat().st_size
    enc = encode_entry(ents[-1])
    assert size >= len(enc)
    start = size - len(enc)  # offset of the last entry in its segment
    expect = ents[:-1]
    if damage == "cut_mid_body":
        os.truncate(last, size - max(1, (len(enc) - HEADER_SIZE) // 2))
    elif damage == "cut_mid_header":
        os.truncate(last, start + 10)
    elif damage == "garbage":
        with open(last, "ab") as f:
            f.write(os.urandom(777))
        expect = ents
    elif damage == "zeros":
        with open(last, "ab") as f:
            f.write(bytes(4096))
        expect = ents
    elif damage == "flip_body":
        flip(last, size - 1 if len(enc) > HEADER_SIZE else start + 5)
    elif damage == "flip_header":
        flip(last, start + 12)
    if clean and expect is not ents:
        # a clean close fsynced the entry before its index record vouched for it: its
        # loss is damage, not a torn write
        _check_vouched_entry_kept(path, ents)
        return
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, expect)
        assert log.verify() == []
        if expect is not ents:
            assert log.recovery.truncated_from_index == 120
        # appending continues where the intact log ends
        log.append([Entry(len(expect) + 1, 9, EntryType.NOOP, b"after")])
        log.sync()
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, [*expect, Entry(len(expect) + 1, 9, EntryType.NOOP, b"after")])
        assert log.recovery.index_rebuilt == 0


def test_torn_tail_spanning_segments(path: Path) -> None:
    ents = make(1, 200, size=2000)
    log = CommitLog.open(path, segment_size=SEG)
    positions = log.append(ents[:20])
    log.sync()
    positions += log.append(ents[20:])
    crash(log)
    files = seg_files(path)
    assert len(files) >= 3
    # part of an unsynced, already-rolled segment never reached the disk: its successors
    # now start after a gap and must go as well
    victim = files[1]
    os.truncate(victim, victim.stat().st_size - 500)
    end = int(victim.name) + victim.stat().st_size
    survivors = [e for e, p in zip(ents, positions, strict=True) if p + HEADER_SIZE + 2000 <= end]
    assert 20 < len(survivors) < 199
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, survivors)
        assert [f.name for f in seg_files(path)] == [f.name for f in files[:2]]
        assert log.recovery.segments_removed == [f.name for f in reversed(files[2:])]
        assert log.recovery.truncated_from_index == len(survivors) + 1


def test_gap_between_segments_cuts_there(path: Path) -> None:
    ents = make(1, 150, size=2000)
    log = CommitLog.open(path, segment_size=SEG)
    log.append(ents)
    crash(log)
    files = seg_files(path)
    os.remove(files[2])
    # drop the index too so the scan has to walk over the gap
    os.remove(index_file(path))
    with CommitLog.open(path, segment_size=SEG) as log:
        n = log.last_index()
        assert 0 < n < 149
        assert log.end_position() == int(files[2].name)
        check_all(log, ents[:n])
        assert [f.name for f in seg_files(path)] == [f.name for f in files[:2]]


# ------------------------------------------------------------------ recovery: the index


def _index_setup(path: Path) -> tuple[list[Entry], bytes]:
    ents = make(1, 301)
    with CommitLog.open(path, segment_size=SEG) as log:
        for lo in range(0, 300, 50):
            log.append(ents[lo : lo + 50])
            log.sync()
    return ents, index_file(path).read_bytes()


@pytest.mark.parametrize(
    "damage",
    [
        "delete",
        "empty",
        "cut_mid_record",
        "cut_half",
        "flip_middle",
        "flip_first",
        "flip_last",
        "garbage_tail",
        "zero_middle",
        "stale_records",
    ],
)
def test_index_rebuilt_identically(path: Path, damage: str) -> None:
    ents, good = _index_setup(path)
    idx = index_file(path)
    n = len(good)
    if damage == "delete":
        idx.unlink()
    elif damage == "empty":
        idx.write_bytes(b"")
    elif damage == "cut_mid_record":
        os.truncate(idx, n - 13)
    elif damage == "cut_half":
        os.truncate(idx, n // 2)
    elif damage == "flip_middle":
        flip(idx, n // 2 + 3)
    elif damage == "flip_first":
        flip(idx, 9)  # the term of record 1
    elif damage == "flip_last":
        flip(idx, n - INDEX_RECORD_SIZE + 1)
    elif damage == "garbage_tail":
        with open(idx, "ab") as f:
            f.write(os.urandom(3 * INDEX_RECORD_SIZE + 5))
    elif damage == "zero_middle":
        with open(idx, "r+b") as f:
            f.seek(4096)
            f.write(bytes(4096))
    elif damage == "stale_records":
        # records for entries that are not in the data (e.g. an old, longer history)
        with open(idx, "ab") as f:
            f.write(good[-10 * INDEX_RECORD_SIZE :])
    with CommitLog.open(path, segment_size=SEG) as log:
        check_all(log, ents)
        assert log.verify() == []
    assert idx.read_bytes() == good


def test_index_corruption_after_open_is_reported(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raftlog.commitlog._recovery as cl

    monkeypatch.setattr(cl, "_TAIL_WARM", 10)
    ents, good = _index_setup(path)
    with CommitLog.open(path, segment_size=SEG) as log:
        flip(index_file(path), 5 * INDEX_RECORD_SIZE + 9)  # term of entry 6
        with pytest.raises(CommitLogError, match="record 6"):
            log.term(6)
        assert log.term(ents[-1].index) == 1
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.term(6) == 1
        assert log.recovery.index_records_valid == 5


def test_check_index_false_trusts_prefix(path: Path) -> None:
    ents, good = _index_setup(path)
    with CommitLog.open(path, segment_size=SEG, check_index=False) as log:
        check_all(log, ents)
        assert log.recovery.index_records_valid == 300


# ------------------------------------------------------------------ corruption in the middle


@pytest.mark.parametrize("where", ["body", "header"])
def test_middle_corruption_is_never_served(path: Path, where: str) -> None:
    ents = make(1, 101, size=500)
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(ents)
        seg, off = locate(log, 50)
        pos50 = log.position_of(50)
    flip(seg, off + (HEADER_SIZE + 100 if where == "body" else 20))
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == 100  # recovery only cuts tails
        assert log.recovery.truncated_from_index is None
        with pytest.raises(CorruptEntry) as info:
            log.entries(50, 60, 1 << 20)
        assert info.value.index == 50 and info.value.position == pos50
        assert seg.name in str(info.value)
        with pytest.raises(CorruptEntry):
            log.read_raw(50, 51)
        with pytest.raises(CorruptEntry):
            log.read_at(pos50)
        # a read that runs into it stops just before it
        assert log.entries(40, 60, 1 << 20) == ents[39:49]
        assert decode_entries(log.read_raw(40, 60)) == ents[39:49]
        # everything else still reads
        assert log.entries(1, 50, 1 << 20) == ents[:49]
        assert log.entries(51, 101, 1 << 20) == ents[50:]
        assert log.term(50) == 1
        bad = log.verify()
        assert [b.index for b in bad] == [50]
        assert bad[0].position == pos50
        # appends go on
        log.append(make(101, 103))
        assert log.entries(101, 103, 1 << 20) == make(101, 103)


def test_middle_corruption_found_by_scan_is_kept(path: Path) -> None:
    ents = make(1, 101, size=500)
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(ents)
        seg, off = locate(log, 97)
    flip(seg, off + HEADER_SIZE + 10)
    index_file(path).unlink()
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == 100
        assert log.recovery.corrupt == [97]
        with pytest.raises(CorruptEntry):
            log.entries(97, 98, 1)
        assert log.entries(98, 101, 1 << 20) == ents[97:]


def test_rebuild_walks_old_segments_by_header(path: Path) -> None:
    ents = make(1, 301, size=2000)
    with CommitLog.open(path, segment_size=SEG) as log:
        log.append(ents)
        seg, off = locate(log, 3)
    assert seg == seg_files(path)[0] and len(seg_files(path)) > 4
    flip(seg, off + HEADER_SIZE + 1000)  # a body in an old segment
    index_file(path).unlink()
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == 300
        assert log.recovery.index_rebuilt == 300
        assert log.recovery.corrupt == []  # header-only walk there: found on read instead
        with pytest.raises(CorruptEntry):
            log.entries(3, 4, 1)
        assert [b.index for b in log.verify()] == [3]
        assert log.entries(4, 301, 1 << 30) == ents[3:]


def test_corrupt_last_vouched_entry_with_valid_successor(path: Path) -> None:
    ents = make(1, 41, size=300)
    log = CommitLog.open(path, segment_size=SEG)
    log.append(ents[:20])
    log.sync()
    log.append(ents[20:])
    seg, off = locate(log, 20)
    crash(log)  # the index vouches for 1..20 only
    flip(seg, off + HEADER_SIZE + 3)
    with CommitLog.open(path, segment_size=SEG) as log:
        assert log.last_index() == 40
        assert log.recovery.corrupt == [20]
        assert [b.index for b in log.verify()] == [20]


# ------------------------------------------------------------------ raw replication path


def test_received_frames_are_stored_exactly_as_received(path: Path) -> None:
    ents = make(1, 201)
    with (
        CommitLog.open(path / "leader", segment_size=SEG) as leader,
        CommitLog.open(path / "follower", segment_size=SEG) as follower,
    ):
        leader.append(ents)
        i = 1
        while i <= 200:
            raw = leader.read_raw(i, 201, max_bytes=20_000)
            follower.append(decode_entries(raw))
            i = follower.last_index() + 1
        check_all(follower, ents)
        assert [follower.position_of(i) for i in range(1, 201)] == [
            leader.position_of(i) for i in range(1, 201)
        ]
        assert bytes(follower.read_raw(1, 201)) == bytes(leader.read_raw(1, 201))
        # a corrupt or non-contiguous batch is rejected whole
        more = make(201, 205)
        raw = bytearray(b"".join(encode_entry(e) for e in more))
        raw[-1] ^= 1
        with pytest.raises(CorruptEntry):
            follower.append(decode_entries(bytes(raw)))
        with pytest.raises(ValueError):
            follower.append(decode_entries(encode_entry(make(202, 203)[0])))
        # a frame is only ever stored as the entry it encodes
        other = decode_entries(encode_entry(make(201, 202, term=5)[0]))[0]
        with pytest.raises(ValueError, match="carries the frame"):
            follower.append([Entry(201, 1, other.type, other.data, frame=other.frame)])
        assert follower.last_index() == 200


def test_closed_log_raises(path: Path) -> None:
    log = CommitLog.open(path, segment_size=SEG)
    log.append(make(1, 3))
    log.close()
    log.close()
    for call in (lambda: log.append(make(3, 4)), lambda: log.entries(1, 2, 1), log.sync):
        with pytest.raises(CommitLogError):
            call()


def test_many_segments_bounded_fds(path: Path) -> None:
    with CommitLog.open(path, segment_size=4096) as log:
        ents = make(1, 400, size=1500)
        for lo in range(0, 399, 40):
            log.append(ents[lo : lo + 40])
            log.sync()
        assert len(seg_files(path)) > 100
        assert len(log._fds) <= 40
        assert log.entries(1, 400, 1 << 30) == ents
        assert log.verify() == []


# ------------------------------------------------------------------ property test


class Model:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.positions: list[int] = []

    @property
    def last(self) -> int:
        return len(self.entries)

    @property
    def term(self) -> int:
        return self.entries[-1].term if self.entries else 1

    def end(self) -> int:
        if not self.entries:
            return 0
        return self.positions[-1] + HEADER_SIZE + len(self.entries[-1].data)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.lists(st.integers(0, 3000), min_size=1, max_size=12),
            st.integers(0, 2),
        ),
        st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0)),
        st.tuples(st.just("reopen"), st.booleans(), st.just(0)),
        st.tuples(st.just("torn"), st.integers(1, 6000), st.just(0)),
        st.tuples(st.just("garbage"), st.integers(1, 200), st.just(0)),
        st.tuples(st.just("index"), st.integers(0, 2), st.integers(0, 10**6)),
        st.tuples(st.just("sync"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


@settings(
    max_examples=int(os.environ.get("COMMITLOG_MODEL_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=ops)
def test_model(ops: list[tuple[str, object, int]]) -> None:
    import raftlog.commitlog._index as cl

    saved = cl._INDEX_WRITE_RECORDS
    cl._INDEX_WRITE_RECORDS = 5
    try:
        _run_model(ops)
    finally:
        cl._INDEX_WRITE_RECORDS = saved


def _run_model(ops: list[tuple[str, object, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "g"
        seg = 8192
        log = CommitLog.open(p, segment_size=seg)
        m = Model()
        try:
            for op, a, b in ops:
                if op == "append":
                    assert isinstance(a, list)
                    term = m.term + b
                    new = [
                        Entry(
                            m.last + 1 + k,
                            term,
                            EntryType((m.last + k) % 4),
                            body_for(m.last + 1 + k, n),
                        )
                        for k, n in enumerate(a)
                    ]
                    if len(a) % 2:  # the follower path: stored bytes as received
                        pos = log.append(decode_entries(b"".join(encode_entry(e) for e in new)))
                    else:
                        pos = log.append(new)
                    assert pos[0] == m.end()
                    m.entries += new
                    m.positions += pos
                elif op == "truncate":
                    assert isinstance(a, float)
                    i = 1 + int(a * m.last)
                    log.truncate_from(i)
                    del m.entries[i - 1 :]
                    del m.positions[i - 1 :]
                elif op == "sync":
                    assert log.sync() == m.last
                elif op == "reopen":
                    if a:
                        log.close()
                    else:
                        crash(log)
                    log = CommitLog.open(p, segment_size=seg)
                elif op == "torn":
                    # a crash that loses the last `a` bytes written to the data, of
                    # those no index record vouches for (a vouched entry was fsynced)
                    assert isinstance(a, int)
                    crash(log)
                    last = seg_files(p)[-1]
                    size = last.stat().st_size
                    cut = max(0, size - a, vouched_end(p) - int(last.name))
                    os.truncate(last, cut)
                    new_end = int(last.name) + cut
                    while (
                        m.entries
                        and m.positions[-1] + HEADER_SIZE + len(m.entries[-1].data) > new_end
                    ):
                        m.entries.pop()
                        m.positions.pop()
                    log = CommitLog.open(p, segment_size=seg)
                elif op == "garbage":
                    assert isinstance(a, int)
                    crash(log)
                    with open(seg_files(p)[-1], "ab") as f:
                        f.write(random.Random(a).randbytes(a))
                    log = CommitLog.open(p, segment_size=seg)
                elif op == "index":
                    log.close()
                    idx = index_file(p)
                    data = idx.read_bytes()
                    if b == 0 or not data:
                        idx.unlink()
                    elif a == 1:
                        os.truncate(idx, b % len(data))
                    else:
                        flip(idx, b % len(data))
                    log = CommitLog.open(p, segment_size=seg)
                    if data:
                        assert index_file(p).read_bytes() == data
                assert log.last_index() == m.last
                assert log.end_position() == m.end()
                if m.entries:
                    assert log.entries(1, m.last + 1, 1 << 30) == m.entries
                    assert [log.term(i) for i in range(1, m.last + 1)] == [
                        e.term for e in m.entries
                    ]
                    assert [log.position_of(i) for i in range(1, m.last + 1)] == m.positions
            log.close()
            log = CommitLog.open(p, segment_size=seg)
            check_all(log, m.entries)
            assert log.verify() == []
        finally:
            log.close()
