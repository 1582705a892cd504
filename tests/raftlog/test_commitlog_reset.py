"""CommitLog.reset_to: the whole log replaced by "everything up to (index, term) is in a
snapshot", durably and crash-safely, and appending after it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import raftlog.commitlog._retention as cl
from raftlog.commitlog import CommitLog, CommitLogError, OutOfRange
from raftlog.types import Entry, EntryType
from tests.raftlog.test_commitlog_retention import crash, segment_names

SEG = 16 << 10


def entry(i: int, term: int = 1, size: int = 700) -> Entry:
    return Entry(i, term, EntryType(i % 3), bytes([i % 251]) * size)


def fill(path: Path, n: int) -> CommitLog:
    log = CommitLog.open(path, segment_size=SEG)
    log.append([entry(i) for i in range(1, n + 1)])
    log.sync()
    return log


def check_reset(log: CommitLog, index: int, term: int, last: int | None = None) -> None:
    """The log starts after (index, term) and holds entries index+1..last of term+1."""
    last = index if last is None else last
    assert log.first_index() == index + 1
    assert log.last_index() == last
    assert log.term(index) == term
    with pytest.raises(OutOfRange):
        log.entries(index, index + 1, 1 << 20)
    assert log.entries(index + 1, last + 1, 1 << 40) == [
        entry(i, term + 1) for i in range(index + 1, last + 1)
    ]
    assert not log.verify()


def test_reset_discards_every_entry_and_the_log_goes_on_after_it(tmp_path: Path) -> None:
    log = fill(tmp_path, 120)
    end = log.end_position()
    assert len(segment_names(tmp_path)) > 3
    log.reset_to(500, 7)
    check_reset(log, 500, 7)
    assert log.durable_index() == 500
    assert segment_names(tmp_path) == [f"{end:020d}"]  # positions are never reused
    assert log.segment_bounds()[0].start == end
    log.append([entry(i, 8) for i in range(501, 560)])
    log.sync()
    check_reset(log, 500, 7, 559)
    assert log.position_of(501) == end
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.recovery.index_rebuilt == 0 and not log.recovery.truncated_bytes
    check_reset(log, 500, 7, 559)
    log.close()


def test_reset_can_move_backwards_below_the_old_last_index(tmp_path: Path) -> None:
    """Installing a snapshot older than a follower's (uncommitted, conflicting) tail."""
    log = fill(tmp_path, 50)
    log.reset_to(20, 3)
    check_reset(log, 20, 3)
    log.append([entry(i, 4) for i in range(21, 25)])
    crash(log)  # unsynced: lost, the reset itself is durable
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.first_index() == 21 and 20 <= log.last_index() <= 24
    assert log.term(20) == 3
    log.close()


def test_reset_of_an_empty_log_and_twice_in_a_row(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_size=SEG)
    log.reset_to(10, 2)
    check_reset(log, 10, 2)
    assert segment_names(tmp_path) == [f"{0:020d}"]  # the empty segment is reused
    log.reset_to(30, 5)  # again, before anything was appended
    check_reset(log, 30, 5)
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_reset(log, 30, 5)
    log.append([entry(31, 6)])
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_reset(log, 30, 5, 31)
    log.close()


def test_reset_after_retention_and_then_retention_again(tmp_path: Path) -> None:
    log = fill(tmp_path, 100)
    first = log.delete_before(log.segment_bounds()[2].first_index)
    assert first > 1
    log.reset_to(200, 9)
    log.append([entry(i, 10) for i in range(201, 320)])
    log.sync()
    segs = log.segment_bounds()
    assert len(segs) > 3 and segs[0].first_index == 201
    assert log.delete_before(segs[2].first_index) == segs[2].first_index
    assert log.term(segs[2].first_index - 1) == 10
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.first_index() == segs[2].first_index and log.last_index() == 319
    log.close()


def test_an_fsync_begun_before_a_reset_vouches_for_nothing_after_it(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    log.append([entry(i) for i in range(11, 20)])
    plan = log.begin_sync()
    assert plan is not None
    log.reset_to(5, 1)
    plan.run()
    assert log.finish_sync(plan) == 5  # not 19: those entries are gone
    assert log.durable_index() == 5
    log.close()


# ------------------------------------------------------------------ crashes mid-reset


class Crash(BaseException):
    """The process dies here: nothing after this point runs."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, *, after: bool,
              nth: int = 1) -> None:
    real: Callable[..., Any] = getattr(obj, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] < nth:
            return real(*args, **kwargs)
        if after:
            real(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(obj, name, wrapper)


def _reset_crashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, obj: Any, name: str,
                    *, after: bool, nth: int = 1) -> tuple[CommitLog, list[str]]:
    log = fill(tmp_path, 120)
    names = segment_names(tmp_path)
    _crash_at(monkeypatch, obj, name, after=after, nth=nth)
    with pytest.raises(Crash):
        log.reset_to(500, 7)
    monkeypatch.undo()
    crash(log)
    return CommitLog.open(tmp_path, segment_size=SEG), names


def test_crash_before_the_base_file_keeps_the_old_log(tmp_path: Path, monkeypatch) -> None:
    log, names = _reset_crashing(tmp_path, monkeypatch, cl, "atomic_write", after=False)
    assert log.first_index() == 1 and log.last_index() == 120
    assert log.entries(1, 121, 1 << 40) == [entry(i) for i in range(1, 121)]
    assert segment_names(tmp_path)[: len(names)] == names  # plus an empty new segment
    log.append([entry(121)])
    log.sync()
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert log.last_index() == 121
    log.close()


@pytest.mark.parametrize(
    ("target", "nth"),
    [("atomic_write", 1), ("ftruncate", 1), ("unlink", 1), ("unlink", 3)],
    ids=["after-base", "after-index", "before-unlinks", "mid-unlinks"],
)
def test_crash_after_the_base_file_finishes_the_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, nth: int
) -> None:
    obj: Any = cl if target == "atomic_write" else os
    after = target in ("atomic_write", "ftruncate")
    log, names = _reset_crashing(tmp_path, monkeypatch, obj, target, after=after, nth=nth)
    check_reset(log, 500, 7)
    assert len(segment_names(tmp_path)) == 1
    assert set(log.recovery.deletion_finished) <= set(names)
    log.append([entry(i, 8) for i in range(501, 510)])
    log.close()
    log = CommitLog.open(tmp_path, segment_size=SEG)
    check_reset(log, 500, 7, 509)
    log.close()


def test_a_failed_reset_closes_the_log(tmp_path: Path, monkeypatch) -> None:
    log = fill(tmp_path, 50)

    def full(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cl, "atomic_write", full)
    with pytest.raises(CommitLogError, match="reopen"):
        log.reset_to(80, 2)
    monkeypatch.undo()
    assert log.closed
    log = CommitLog.open(tmp_path, segment_size=SEG)
    assert (log.first_index(), log.last_index()) == (1, 50)  # nothing changed
    assert len(segment_names(tmp_path)) == len(log.segment_bounds())
    log.close()


def test_an_unreadable_base_file_is_refused(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    log.reset_to(40, 2)
    log.close()
    base = tmp_path / "commitlog" / "base"
    raw = bytearray(base.read_bytes())
    raw[9] ^= 1
    base.write_bytes(bytes(raw))
    with pytest.raises(CommitLogError, match="corrupt"):
        CommitLog.open(tmp_path, segment_size=SEG)
