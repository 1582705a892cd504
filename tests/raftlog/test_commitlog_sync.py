"""Group commit off the event loop: `begin_sync` / `SyncPlan.run` / `finish_sync`, and
`store`, the truncate-then-append rule every shell of the core relies on."""

from __future__ import annotations

import threading

import pytest

from raftlog.commitlog import CommitLog, CommitLogError
from raftlog.types import Entry, EntryType


def _e(i: int, t: int = 1, data: bytes = b"x") -> Entry:
    return Entry(i, t, EntryType.MESSAGES, data * 10)


def test_plan_covers_only_what_was_written_before_it(tmp_path):
    log = CommitLog.open(tmp_path, segment_size=4096)
    log.store([_e(i) for i in range(1, 11)])
    plan = log.begin_sync()
    assert plan is not None and plan.last == 10
    # appends (and a segment roll) while the fsync runs elsewhere
    log.store([_e(i, data=b"y" * 50) for i in range(11, 200)])
    t = threading.Thread(target=plan.run)
    t.start()
    t.join()
    assert log.finish_sync(plan) == 10
    assert log.durable_index() == 10
    plan2 = log.begin_sync()
    assert plan2 is not None
    plan2.run()
    assert log.finish_sync(plan2) == 199
    assert log.begin_sync() is None  # nothing new
    log.close()
    reopened = CommitLog.open(tmp_path, segment_size=4096)
    assert reopened.last_index() == 199


def test_truncation_during_a_plan_does_not_vouch_for_replaced_entries(tmp_path):
    log = CommitLog.open(tmp_path)
    log.store([_e(i) for i in range(1, 6)])
    plan = log.begin_sync()
    assert plan is not None
    # a new leader replaces the tail before the fsync completes
    log.store([_e(4, 2), _e(5, 2), _e(6, 2)])
    plan.run()
    assert log.finish_sync(plan) == 3
    assert log.term(4) == 2
    # the truncation itself was durable; the new entries need their own fsync
    assert log.durable_index() == 3
    plan2 = log.begin_sync()
    assert plan2 is not None
    plan2.run()
    assert log.finish_sync(plan2) == 6
    log.close()


def test_skip_fsync_plan_reports_written_without_fsyncing(tmp_path):
    log = CommitLog.open(tmp_path)
    log.store([_e(1), _e(2)])
    plan = log.begin_sync(fsync=False)
    assert plan is not None and not plan.fds
    plan.run()
    assert log.finish_sync(plan) == 2
    assert log.durable_index() == 0
    log.close()


def test_interval_mode_reports_written_and_fsyncs_when_due(tmp_path):
    log = CommitLog.open(tmp_path, fsync="interval", fsync_interval=10.0)
    log.store([_e(1)])
    first = log.begin_sync(now=100.0)  # first fsync is always due
    assert first is not None and first.fds
    first.run()
    assert log.finish_sync(first) == 1
    log.store([_e(2)])
    early = log.begin_sync(now=101.0)
    assert early is not None and not early.fds
    assert log.finish_sync(early) == 2
    assert log.durable_index() == 1
    due = log.begin_sync(now=111.0)
    assert due is not None and due.fds
    due.run()
    log.finish_sync(due)
    assert log.durable_index() == 2
    log.close()


def test_failed_fsync_closes_the_log(tmp_path):
    log = CommitLog.open(tmp_path)
    log.store([_e(1)])
    plan = log.begin_sync()
    assert plan is not None
    plan.error = OSError(5, "EIO")
    with pytest.raises(CommitLogError, match="reopen"):
        log.finish_sync(plan)
    with pytest.raises(CommitLogError):
        log.store([_e(2)])
