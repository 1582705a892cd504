"""CommitLog retention: deleting whole old segments, crash-safely, and reopening after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.commitlog import INDEX_RECORD_SIZE, CommitLog, OutOfRange
from raftlog.types import Entry, EntryType

SEG = 16 << 10


def entry(i: int, size: int = 700) -> Entry:
    """Deterministic content; the term grows every 50 entries so base terms are checked."""
    return Entry(i, 1 + i // 50, EntryType(i % 3), bytes([i % 251]) * size)


def fill(path: Path, n: int, *, size: int = 700) -> CommitLog:
    log = CommitLog.open(path, segment_size=SEG)
    log.append([entry(i, size) for i in range(1, n + 1)])
    log.sync()
    return log


def crash(log: CommitLog) -> None:
    """Drop the log without close(): what a killed process leaves behind."""
    log._close_fds()


def segment_names(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "commitlog").iterdir() if p.name.isdigit())


def check_content(log: CommitLog, first: int, last: int, *, size: int = 700) -> None:
    assert log.first_index() == first
    assert log.last_index() == last
    assert log.entries(first, last + 1, 1 << 40) == [entry(i, size) for i in range(first, last + 1)]
    assert log.term(first - 1) == (0 if first == 1 else entry(first - 1).term)
    if first > 1:
        with pytest.raises(OutOfRange):
            log.entries(first - 1, first, 1 << 20)
    assert not log.verify()


def test_segment_bounds_cover_the_log_contiguously(tmp_path: Path) -> None:
    log = fill(tmp_path, 200)
    segs = log.segment_bounds()
    assert len(segs) > 4
    assert segs[0].first_index == 1 and segs[-1].last_index == 200
    for a, b in zip(segs, segs[1:], strict=False):
        assert b.first_index == a.last_index + 1
        assert b.start == a.start + a.size
    for s in segs:
        assert os.path.getsize(s.path) == s.size
        assert log.position_of(s.first_index) == s.start
    log.close()


def test_delete_before_removes_whole_segments_and_keeps_the_rest(tmp_path: Path) -> None:
    log = fill(tmp_path, 200)
    segs = log.segment_bounds()
    target = segs[3].first_index + 2  # inside segment 3: segments 0..2 can go
    names = segment_names(tmp_path)
    assert log.delete_before(target) == segs[3].first_index
    assert segment_names(tmp_path) == names[3:]
    check_content(log, segs[3].first_index, 200)
    assert log.segment_bounds() == segs[3:]
    # the index now starts at the new first entry
    assert os.path.getsize(tmp_path / "commitlog" / "index") <= (200 - segs[3].first_index + 1) * 32
    # still appendable, and a position still addresses the same entry
    log.append([entry(i) for i in range(201, 221)])
    log.sync()
    assert log.read_at(segs[4].start) == entry(segs[4].first_index)
    log.close()

    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.recovery.index_rebuilt == 0 and not log.recovery.truncated_bytes
    check_content(log, segs[3].first_index, 220)
    log.close()


def test_never_deletes_the_active_segment_or_past_the_durable_index(tmp_path: Path) -> None:
    log = fill(tmp_path, 200)
    segs = log.segment_bounds()
    assert log.delete_before(10**9) == segs[-1].first_index
    assert len(log.segment_bounds()) == 1
    check_content(log, segs[-1].first_index, 200)
    # unsynced entries: nothing past durable_index + 1 may go
    log.append([entry(i) for i in range(201, 400)])
    durable = log.durable_index()
    assert durable == 200
    first = log.delete_before(10**9)
    assert first <= durable + 1
    check_content(log, first, 399)
    log.close()


def test_repeated_deletions_and_an_index_that_lags_behind(tmp_path: Path) -> None:
    # tiny entries: the index file is written in batches, so it lags the synced data
    log = fill(tmp_path, 3000, size=40)
    assert log._written < 3000
    for _ in range(3):
        segs = log.segment_bounds()
        assert log.delete_before(segs[2].first_index) == segs[2].first_index
        check_content(log, segs[2].first_index, 3000, size=40)
    first = log.first_index()
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_content(log, first, 3000, size=40)
    assert os.path.getsize(tmp_path / "commitlog" / "index") == (3000 - first + 1) * INDEX_RECORD_SIZE
    log.close()


def test_truncate_down_to_the_first_kept_entry_then_reopen(tmp_path: Path) -> None:
    log = fill(tmp_path, 200)
    segs = log.segment_bounds()
    first = log.delete_before(segs[-1].first_index)
    log.truncate_from(first)  # an uncommitted suffix replaced: the log is now empty
    assert log.last_index() == first - 1
    assert log.term(first - 1) == entry(first - 1).term
    crash(log)
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert (log.first_index(), log.last_index()) == (first, first - 1)
    assert log.term(first - 1) == entry(first - 1).term
    log.append([entry(i) for i in range(first, first + 5)])
    log.sync()
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_content(log, first, first + 4)
    log.close()


# ------------------------------------------------------------------ crashes mid-deletion


def _plan(tmp_path: Path) -> tuple[CommitLog, int, int, list[str]]:
    log = fill(tmp_path, 300)
    segs = log.segment_bounds()
    new_first = segs[3].first_index
    return log, new_first, new_first - log.first_index(), segment_names(tmp_path)


@pytest.mark.parametrize("lagging_index", [False, True])
def test_crash_after_the_base_file_only(tmp_path: Path, lagging_index: bool) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    if not lagging_index:
        log._flush_index(force_fsync=True)
    log._write_base(new_first - 1, log.term(new_first - 1))
    crash(log)
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.recovery.deletion_finished == names[:3]
    assert segment_names(tmp_path) == names[3:]
    if not lagging_index:
        assert log.recovery.index_rebuilt == 0  # the index was rolled forward, not rebuilt
    check_content(log, new_first, 300)
    log.close()


def test_crash_after_the_new_index(tmp_path: Path) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    log._flush_index(force_fsync=True)
    log._write_base(new_first - 1, log.term(new_first - 1))
    log._rewrite_index(skip, log._written - skip)
    crash(log)
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert segment_names(tmp_path) == names[3:]
    assert log.recovery.index_rebuilt == 0
    check_content(log, new_first, 300)
    log.close()


def test_crash_while_unlinking(tmp_path: Path) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    log._flush_index(force_fsync=True)
    log._write_base(new_first - 1, log.term(new_first - 1))
    log._rewrite_index(skip, log._written - skip)
    crash(log)
    os.unlink(tmp_path / "commitlog" / names[0])  # one of three gone
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.recovery.deletion_finished == names[1:3]
    assert segment_names(tmp_path) == names[3:]
    check_content(log, new_first, 300)
    log.close()


def test_crash_before_the_base_rename_changes_nothing(tmp_path: Path) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    (tmp_path / "commitlog" / "base.tmp").write_bytes(b"half-written")
    (tmp_path / "commitlog" / "index.tmp").write_bytes(b"x" * 40)
    crash(log)
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert segment_names(tmp_path) == names
    assert not (tmp_path / "commitlog" / "base.tmp").exists()
    assert not (tmp_path / "commitlog" / "index.tmp").exists()
    check_content(log, 1, 300)
    log.close()


def test_a_failed_index_rewrite_leaves_the_log_usable(tmp_path: Path, monkeypatch) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    import raftlog.commitlog as cl
    import raftlog.commitlog._index as index_mod

    def boom(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index_mod, "copy_range", boom)
    with pytest.raises(cl.CommitLogError):
        log.delete_before(new_first)
    monkeypatch.undo()
    check_content(log, 1, 300)  # nothing changed in memory
    assert not (tmp_path / "commitlog" / "index.tmp").exists()
    log.append([entry(301)])
    log.sync()
    crash(log)
    # the base file was written: reopening finishes the deletion
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_content(log, new_first, 301)
    log.close()


def test_missing_segments_below_the_base_are_not_papered_over(tmp_path: Path) -> None:
    log, new_first, skip, names = _plan(tmp_path)
    assert log.delete_before(new_first) == new_first
    log.close()
    seg_dir = tmp_path / "commitlog"
    os.unlink(seg_dir / names[3])  # the first kept segment vanishes
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.first_index() > new_first
    with pytest.raises(OutOfRange):
        log.term(log.first_index() - 1)  # unknown: the caller must notice the gap
    log.close()
