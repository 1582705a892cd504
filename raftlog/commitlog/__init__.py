"""The on-disk CommitLog: the Raft log of one group, stored the way consumers read it.

Layout of a group directory ``<dir>``::

    <dir>/commitlog/00000000000000000000   segment starting at position 0
    <dir>/commitlog/00000000001073741801   next segment (starts where the previous ends)
    <dir>/commitlog/index                  Raft index -> (position, term, size, type)
    <dir>/commitlog/base                   (index, term) of the entry before the first kept
                                           (and, after `reset_to`, where the log restarts)

The parts, each in its own module with its part of the story in its docstring:

    `_format`     entry format (header, both CRCs), encoding and checking entries
    `_segments`   positions and segment files; byte-level writes and reads
    `_index`      the index file and its in-memory tail; `term()` from records alone
    `_retention`  deleting old segments and resetting for a snapshot (the base file)
    `_recovery`   what `open` does to make the files a consistent, durable log again
    `_log`        the façade, `CommitLog`: append, sync (group commit), read, repair

`CommitLog` is built in layers, each a class over the one below (segments, index,
retention, recovery, façade), sharing the one object's state.

Threading: a CommitLog is not thread-safe. The caller serializes all calls; `sync` may
run in a worker thread (``trio.to_thread.run_sync``) provided nothing else runs on the
log meanwhile.
"""

from raftlog.commitlog._format import (
    HEADER_SIZE,
    MAGIC,
    CommitLogError,
    CorruptEntry,
    CorruptIndex,
    EntryDraft,
    OutOfRange,
    decode_entries,
    encode_entry,
    split_stored,
)
from raftlog.commitlog._index import INDEX_RECORD_SIZE
from raftlog.commitlog._log import CommitLog, SyncPlan
from raftlog.commitlog._recovery import RecoveryReport
from raftlog.commitlog._segments import SegmentInfo

__all__ = [
    "HEADER_SIZE",
    "INDEX_RECORD_SIZE",
    "MAGIC",
    "CommitLog",
    "CommitLogError",
    "CorruptEntry",
    "CorruptIndex",
    "EntryDraft",
    "OutOfRange",
    "RecoveryReport",
    "SegmentInfo",
    "SyncPlan",
    "decode_entries",
    "encode_entry",
    "split_stored",
]
