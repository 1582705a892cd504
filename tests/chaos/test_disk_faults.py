"""Disk faults of the chaos harness (`chaos.disk_faults`).

Units, on real CommitLog directories: the sync marks keep exactly what an fsync covered
(`discard_unsynced` throws away the rest, as a power loss would), and `corrupt_entry`
flips one byte in the body of one entry away from the log's tail.

Live, on a three-node cluster of real processes with ``test_sync_marks`` on:

* a power loss of every node loses no acknowledged message;
* the same with the ``skip-fsync`` mutation does, and the loss shows;
* a node whose stored entry was corrupted while it was down repairs it from a peer on
  restart, and then, as the group's leader, serves every acknowledged message.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import (
    ALLOW_MUTATIONS_ENV,
    ConfigError,
    NodeConfig,
    cluster_configs,
    dump_config,
)
from chaos.disk_faults import (
    KEEP_TAIL,
    corrupt_entry,
    damage_file,
    damageable_files,
    discard_unsynced,
    stored_entries,
)
from raftlog import fsutil
from raftlog.commitlog import HEADER_SIZE, CommitLog
from raftlog.fsutil import (
    SYNC_MARKS_NAME,
    atomic_write,
    disable_sync_marks,
    enable_sync_marks,
    fsync_dir,
    fsync_fd,
    load_sync_marks,
    sync_marks_path,
)
from raftlog.hardstate import HardStateFile
from raftlog.snapshot import load_snapshot, save_snapshot
from raftlog.types import HardState, Snapshot
from raftmq.client import Admin, Producer
from raftmq.localcluster import LocalCluster
from tests.conftest import group_leader, node_status, wait_for
from tests.live_cluster import LiveCluster, scrape_metrics
from tests.raftlog.test_commitlog import SEG, crash, make
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, iter_records

ALLOW = {ALLOW_MUTATIONS_ENV: "1"}

# --------------------------------------------------------------------------- units


@contextmanager
def marks(data: Path) -> Iterator[None]:
    enable_sync_marks(data)
    try:
        yield
    finally:
        disable_sync_marks(data)


def test_discard_unsynced_keeps_exactly_what_fsyncs_covered(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with marks(data):
        log = CommitLog.open(data / "g0", segment_size=SEG)
        log.append(make(1, 40, size=2000))  # several segments
        log.sync()
        log.append(make(40, 50, size=2000))
        plan = log.begin_sync()  # group commit in a worker thread, as the runtime does
        assert plan is not None
        worker = threading.Thread(target=plan.run)
        worker.start()
        worker.join()
        log.finish_sync(plan)
        log.append(make(50, 70, size=2000))  # written, never fsynced (a new segment too)
        HardStateFile(str(data / "g0" / "hardstate")).save(HardState(3, 2))
        (data / "g0" / "stray").write_bytes(b"never synced")
        (data / "g0" / "hardstate.tmp").write_bytes(b"a half-written temp file")
        crash(log)
    summary = discard_unsynced(data)
    assert summary["bytes_discarded"] > 20 * 2000
    assert {"g0/stray", "g0/hardstate.tmp"} <= set(summary["deleted"])
    assert summary["files_truncated"] >= 1
    assert json.loads(json.dumps(summary)) == summary
    assert discard_unsynced(data)["bytes_discarded"] == 0  # what is left is durable
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        assert log.last_index() == 49
        assert log.entries(1, 50, 1 << 30) == make(1, 50, size=2000)
    assert HardStateFile(str(data / "g0" / "hardstate")).load().term == 3


def test_marks_are_written_into_room_allocated_ahead(tmp_path: Path) -> None:
    """The marks live on the disk they describe: a disk-full fault must fail the node's
    own writes, not the record of an fsync that succeeded. So the marks file is
    allocated ahead and its writes fill that room instead of growing the file."""
    data = tmp_path / "n1"
    with marks(data):
        marks_file = sync_marks_path(data)
        reserved = marks_file.stat().st_size
        assert reserved >= 1 << 20  # room allocated, not just the baseline written
        with CommitLog.open(data / "g0", segment_size=SEG) as log:
            for i in range(1, 30):
                log.append(make(i, i + 1, size=100))
                log.sync()
        assert marks_file.stat().st_size == reserved  # written into the room
        assert load_sync_marks(data).sizes  # and read back past it
    assert discard_unsynced(data)["bytes_discarded"] == 0  # every mark was read
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        assert log.last_index() == 29


def test_without_fsyncs_a_power_loss_loses_every_append(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with marks(data):
        log = CommitLog.open(data / "g0", segment_size=SEG)
        log.append(make(1, 30))
        plan = log.begin_sync(fsync=False)  # the skip-fsync mutation
        assert plan is not None and not plan.fsynced
        assert log.finish_sync(plan) == 29  # reported persisted all the same
        crash(log)
    assert discard_unsynced(data)["bytes_discarded"] > 0
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        assert log.last_index() == 0


def test_what_was_there_before_the_marks_counts_as_durable(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        log.append(make(1, 10))
    (data / "g0" / "old-file").write_bytes(b"from an earlier run")
    with marks(data):
        pass
    summary = discard_unsynced(data)
    assert summary["bytes_discarded"] == 0 and summary["deleted"] == []
    assert (data / "g0" / "old-file").read_bytes() == b"from an earlier run"


def test_discard_refuses_a_directory_without_marks(tmp_path: Path) -> None:
    (tmp_path / "precious").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="test_sync_marks"):
        discard_unsynced(tmp_path)
    assert (tmp_path / "precious").exists()


def test_renames_and_directory_fsyncs(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with marks(data):
        atomic_write(data / "state", b"old contents")
        # an atomic write interrupted after its rename, before its directory fsync:
        # the new file's contents were fsynced, so it survives whole (never torn)
        fd = os.open(data / "state.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"new and longer contents")
        fsync_fd(fd, data / "state.tmp")
        os.close(fd)
        os.replace(data / "state.tmp", data / "state")
        # created and made durable by a directory fsync, contents never fsynced
        (data / "created").write_bytes(b"contents not synced")
        fsync_dir(data)
        (data / "created").write_bytes(b"contents not synced, longer")
        # removed, and the removal made durable
        (data / "doomed").write_bytes(b"x")
        fd = os.open(data / "doomed", os.O_RDONLY)
        fsync_fd(fd)  # the path is looked up from the descriptor
        os.close(fd)
        os.unlink(data / "doomed")
        fsync_dir(data)
    discard_unsynced(data)
    assert (data / "state").read_bytes() == b"new and longer contents"
    assert (data / "created").read_bytes() == b""
    assert not (data / "doomed").exists()
    state = load_sync_marks(data)
    assert "doomed" not in state.names


def test_an_atomic_write_whose_temp_name_was_bound_keeps_its_contents(tmp_path: Path) -> None:
    """A directory fsync made while an atomic write's temp file existed binds the temp
    name; the write's own directory fsync then moves the binding to the real name. The
    file keeps its fsynced contents through a power loss: a zero-length snapshot or
    hard state is a state no real crash leaves (a node refused to start on one)."""
    data = tmp_path / "n1"
    with marks(data):
        atomic_write(data / "snapshot", b"old snapshot")
        fd = os.open(data / "snapshot.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"new snapshot, written in a worker thread")
        atomic_write(data / "hardstate", b"term 7")  # its directory fsync binds snapshot.tmp
        fsync_fd(fd, data / "snapshot.tmp")
        os.close(fd)
        os.replace(data / "snapshot.tmp", data / "snapshot")
        fsync_dir(data)
    summary = discard_unsynced(data)
    assert (data / "snapshot").read_bytes() == b"new snapshot, written in a worker thread"
    assert (data / "hardstate").read_bytes() == b"term 7"
    assert summary["files_truncated"] == 0 and not summary["deleted"], summary


def test_a_name_no_directory_fsync_bound_vanishes_even_when_fsynced(tmp_path: Path) -> None:
    """Directory durability: a file created, or renamed to a new name, is not durable
    until its directory is fsynced, however much of its content was."""
    data = tmp_path / "n1"
    with marks(data):
        (data / "sub").mkdir()
        for name in ("created", "sub/created"):
            fd = os.open(data / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"fsynced contents")
            fsync_fd(fd, data / name)
            os.close(fd)
        fsync_dir(data / "sub")  # binds sub/created, not created
        fd = os.open(data / "moved.tmp", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"renamed to a new name")
        fsync_fd(fd, data / "moved.tmp")
        os.close(fd)
        fsync_dir(data)  # binds moved.tmp (and created) ...
        os.replace(data / "moved.tmp", data / "moved")  # ... but not the new name
        fd = os.open(data / "late", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"never bound")
        fsync_fd(fd, data / "late")
        os.close(fd)
    summary = discard_unsynced(data)
    assert sorted(summary["deleted"]) == ["late", "moved"]
    assert (data / "created").read_bytes() == b"fsynced contents"
    assert (data / "sub" / "created").read_bytes() == b"fsynced contents"
    assert not (data / "moved").exists() and not (data / "moved.tmp").exists()


def test_a_commitlog_that_rolls_segments_keeps_them_through_a_power_loss(tmp_path: Path) -> None:
    """New segments are bound by a directory fsync before their entries count as
    durable: everything `sync` vouched for survives the directory-aware model."""
    data = tmp_path / "n1"
    with marks(data):
        log = CommitLog.open(data / "g0", segment_size=SEG)
        for start in range(1, 60, 10):
            log.append(make(start, start + 10, size=2000))
            assert log.sync() == start + 9
        assert len(os.listdir(data / "g0" / "commitlog")) >= 3  # it rolled: 2 segments, index
        crash(log)
    discard_unsynced(data)
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        assert log.last_index() == 60
        assert log.entries(1, 61, 1 << 30) == make(1, 61, size=2000)


def test_a_reused_inode_number_does_not_inherit_an_old_size(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with marks(data):
        for name, size in (("a", 10), ("b", 100)):
            (data / name).write_bytes(b"x" * size)
            fd = os.open(data / name, os.O_RDONLY)
            fsync_fd(fd, data / name)
            os.close(fd)
            fsync_dir(data)
            if name == "a":
                os.unlink(data / "a")  # no directory fsync: "b" may get its inode number
    discard_unsynced(data)
    assert (data / "b").read_bytes() == b"x" * 100
    assert not (data / "a").exists()


def test_a_sync_counts_what_was_written_before_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "n1"
    path = data / "f"
    with marks(data):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fsutil.fsync_dir(data)  # the file's name is durable: only its bytes are in question
        os.write(fd, b"a" * 100)
        real = fsutil._fdatasync

        def racing(fd_: int) -> None:
            os.write(fd_, b"b" * 50)  # an append landing while the sync runs
            real(fd_)

        monkeypatch.setattr(fsutil, "_fdatasync", racing)
        fsutil.fdatasync_fd(fd, path)
        os.close(fd)
    assert path.stat().st_size == 150
    discard_unsynced(data)
    assert path.read_bytes() == b"a" * 100


def test_marks_cost_nothing_when_off(tmp_path: Path) -> None:
    with CommitLog.open(tmp_path / "g0", segment_size=SEG) as log:
        log.append(make(1, 5))
        log.sync()
    assert not (tmp_path / SYNC_MARKS_NAME).exists()
    assert fsutil._roots == {}


def test_corrupt_entry_flips_one_body_byte_away_from_the_tail(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    for g in ("g0", "g1"):
        with CommitLog.open(data / g, segment_size=SEG) as log:
            log.append(make(1, 30, size=500))
    before = {p: p.read_bytes() for p in data.rglob("0000*")}
    hit = corrupt_entry(data, random.Random(3))
    assert hit is not None
    assert set(hit) >= {"group", "index", "file", "position"}
    assert 1 <= hit["index"] <= 29 - KEEP_TAIL
    changed = {p for p, b in before.items() if p.read_bytes() != b}
    assert changed == {Path(hit["file"])}
    old, new = before[Path(hit["file"])], Path(hit["file"]).read_bytes()
    assert [i for i in range(len(old)) if old[i] != new[i]] == [hit["position"]]
    assert hit["position"] >= hit["entry_position"] + HEADER_SIZE  # in the body
    for g in ("g0", "g1"):
        with CommitLog.open(data / g, segment_size=SEG) as log:
            bad = [c.index for c in log.verify()]
            assert bad == ([hit["index"]] if g == hit["group"] else [])
            assert log.last_index() == 29


def test_corrupt_entry_can_flip_a_header_byte_of_a_chosen_entry(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    for g in ("g0", "g1"):
        with CommitLog.open(data / g, segment_size=SEG) as log:
            log.append(make(1, 30, size=500))
    hit = corrupt_entry(data, random.Random(3), part="header", group="g1", index=7)
    assert hit is not None and (hit["group"], hit["index"]) == ("g1", 7)
    assert hit["entry_position"] <= hit["position"] < hit["entry_position"] + HEADER_SIZE
    with CommitLog.open(data / "g1", segment_size=SEG) as log:
        assert [c.index for c in log.verify()] == [7]
    assert corrupt_entry(data, random.Random(3), group="g1", index=29) is None  # the tail
    with pytest.raises(ValueError, match="header"):
        corrupt_entry(data, random.Random(3), part="trailer")


def test_corrupt_entry_can_flip_a_header_byte_instead(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        log.append(make(1, 30, size=500))
    for seed in range(5):
        before = {p: p.read_bytes() for p in data.rglob("0000*")}
        hit = corrupt_entry(data, random.Random(seed), "header")
        assert hit is not None and hit["part"] == "header"
        assert hit["entry_position"] <= hit["position"] < hit["entry_position"] + HEADER_SIZE
        # the entry's header no longer verifies: a walk of the headers stops there
        walked = [e.index for e in stored_entries(data / "g0" / "commitlog")
                  if Path(e.file) == Path(hit["file"])]
        assert hit["index"] not in walked
        for p, b in before.items():
            p.write_bytes(b)
    with pytest.raises(ValueError, match="body or header"):
        corrupt_entry(data, random.Random(0), "footer")


def test_corrupt_entry_needs_an_entry_away_from_the_tail(tmp_path: Path) -> None:
    assert corrupt_entry(tmp_path, random.Random(1)) is None
    with CommitLog.open(tmp_path / "g0", segment_size=SEG) as log:
        log.append(make(1, 1 + KEEP_TAIL))
    assert corrupt_entry(tmp_path, random.Random(1)) is None
    assert len(stored_entries(tmp_path / "g0" / "commitlog")) == KEEP_TAIL


def test_sync_marks_are_refused_unless_mutations_are_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=ALLOW_MUTATIONS_ENV):
        cluster_configs(tmp_path, env={}, test_sync_marks=True)
    with pytest.raises(ConfigError, match="true or false"):
        cluster_configs(tmp_path, env=ALLOW, test_sync_marks="yes")
    (cfg, *_rest) = cluster_configs(tmp_path, env=ALLOW, test_sync_marks=True)
    assert cfg.test_sync_marks
    again = NodeConfig.from_dict(tomllib.loads(dump_config(cfg)), env=ALLOW)
    assert again == cfg
    assert not cluster_configs(tmp_path, env={})[0].test_sync_marks


# --------------------------------------------------------------------------- live

TOPIC = "D"
QUEUES = 3  # queue q lives in group g{q}


class Live(LiveCluster):
    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster, TOPIC, QUEUES)
        self.seq = {q: 0 for q in range(QUEUES)}

    def produce_some(self, batches: int, tag: str) -> None:
        for b in range(batches):
            for q in range(QUEUES):
                msgs = [OutgoingMessage(f"{tag}-q{q}-b{b}-m{i}".encode() * 20) for i in range(4)]
                self.produce_batch(q, msgs, pid=77, seq=self.seq[q], born_ms=1)
                self.seq[q] += 1

    def caught_up(self, timeout: float = 20.0) -> None:
        """Wait until every group's leader has applied its whole log: before that a
        restarted leader may not know the topic yet."""
        deadline = time.monotonic() + timeout
        for q in range(QUEUES):
            gid = f"g{q}"
            while True:
                try:
                    st = _group_status(self, self.leader(gid), gid)
                    if st["role"] == "leader" and st["applied"] == st["commit"] == st["last"]:
                        break
                except (OSError, RequestError, KeyError):
                    pass
                assert time.monotonic() < deadline, f"{gid} did not catch up"
                time.sleep(0.05)

    def readable(self) -> dict[int, dict[int, bytes]]:
        """What each queue serves now ({} for a queue whose topic is gone)."""
        self.caught_up()
        out: dict[int, dict[int, bytes]] = {}
        for q in range(QUEUES):
            try:
                out[q] = self.fetch(q)
            except RequestError as exc:
                if exc.code != Code.UNKNOWN_TOPIC:
                    raise
                out[q] = {}
        return out

    def power_loss(self) -> list[dict[str, Any]]:
        """SIGKILL every node, discard what none of them fsynced, restart them."""
        for i in self.cluster.node_ids:
            self.cluster.kill(i)
        summaries = [discard_unsynced(c.data) for c in self.cluster.configs]
        for i in self.cluster.node_ids:
            self.cluster.restart(i)
        self.cluster.wait_ready(timeout=30)
        return summaries


@contextmanager
def live_cluster(base: Path, **overrides: Any) -> Iterator[Live]:
    keys: dict[str | int, Any] = {"test_sync_marks": True}
    keys.update(overrides)
    with LocalCluster(base, tick_ms=50, env=ALLOW, node_overrides=keys) as cluster:
        cluster.wait_ready(timeout=30)
        live = Live(cluster)
        live.settle()
        live.create_topic()
        yield live


@pytest.mark.live
def test_a_power_loss_of_every_node_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with live_cluster(tmp_path) as live:
        live.produce_some(6, "before")
        assert all((c.data / SYNC_MARKS_NAME).stat().st_size > 0 for c in live.cluster.configs)
        live.power_loss()
        assert live.readable() == live.acked
        live.produce_some(2, "after")  # and the cluster goes on
        assert live.readable() == live.acked
        live.assert_nodes_healthy()


@pytest.mark.live
def test_a_power_loss_shows_that_skipping_fsync_loses_acknowledged_messages(
    tmp_path: Path,
) -> None:
    with live_cluster(tmp_path, test_mutations=["skip-fsync"]) as live:
        live.produce_some(4, "acked")
        summaries = live.power_loss()
        assert sum(s["bytes_discarded"] for s in summaries) > 0
        readable = live.readable()
        lost = sum(1 for q in range(QUEUES) for off, rec in live.acked[q].items()
                   if readable[q].get(off) != rec)
        assert lost > 0, "a power loss with skip-fsync must lose acknowledged messages"


def _fetch_from(addr: str, queue: int) -> dict[int, bytes]:
    """Every record of `queue` as the node at `addr` serves it (it must lead)."""
    out: dict[int, bytes] = {}
    offset = 0
    while True:
        h, body = request(addr, {"op": int(Op.FETCH), "topic": TOPIC, "queue": queue,
                                 "offset": offset, "max": 1024, "wait_ms": 0}, timeout=5.0)
        for (start, size), meta in zip(iter_records(body), h["msgs"], strict=True):
            out[meta[0]] = body[start : start + size]
        if h["next"] >= h["end"]:
            return out
        offset = h["next"]


def _group_status(live: Live, node: int, group: str) -> dict[str, Any]:
    h, _ = request(live.addr(node), {"op": int(Op.STATUS)}, timeout=2.0)
    st: dict[str, Any] = h["groups"][group]
    return st


@pytest.mark.live
def test_a_corrupted_entry_is_repaired_from_a_peer_and_served_again(tmp_path: Path) -> None:
    with live_cluster(tmp_path) as live:
        live.produce_some(8, "acked")
        cluster = live.cluster
        victim = 3
        cluster.kill(victim)
        hit = corrupt_entry(cluster.configs[victim - 1].data, random.Random(11))
        assert hit is not None
        group = hit["group"]
        cluster.restart(victim)

        deadline = time.monotonic() + 20
        while True:
            try:
                st = _group_status(live, victim, group)
                if st["repaired"] >= 1 and not st["unrepaired"]:
                    break
            except (OSError, RequestError):
                pass
            assert time.monotonic() < deadline, "the corrupt entry was not repaired"
            time.sleep(0.1)
        log = cluster.log_path(f"n{victim}").read_text(errors="replace")
        repaired = [json.loads(line) for line in log.splitlines()
                    if "entry repaired from a peer" in line]
        assert [(r["group"], r["index"]) for r in repaired] == [(group, hit["index"])]
        metrics_addr = cluster.configs[victim - 1].metrics
        assert metrics_addr is not None
        deadline = time.monotonic() + 10
        while True:  # refreshed every second
            m = scrape_metrics(metrics_addr)
            if m.get(f'raftmq_entries_repaired_total{{group="{group}"}}') == 1.0:
                break
            assert time.monotonic() < deadline, "no repair in the metrics"
            time.sleep(0.2)
        assert m[f'raftmq_unrepaired_entries{{group="{group}"}}'] == 0.0

        # the repaired replica leads its group and serves every acknowledged message
        queue = int(group[1:])
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "the repaired replica did not come to lead"
            st = _group_status(live, victim, group)
            if st["role"] != "leader":
                try:
                    live.call_leader(group, {"op": int(Op.TRANSFER_LEADER), "g": group,
                                             "to": victim}, timeout=5.0)
                except RequestError:
                    pass
                time.sleep(0.3)
                continue
            if st["applied"] < st["last"]:
                time.sleep(0.05)
                continue
            try:
                served = _fetch_from(live.addr(victim), queue)
                break
            except RequestError as exc:
                if not exc.retriable:
                    raise
        assert served == live.acked[queue]
        assert live.readable() == live.acked
        live.assert_nodes_healthy()


# --------------------------------------------------------------------------- damaged files


def _group_with_snapshot(data: Path) -> None:
    with CommitLog.open(data / "g0", segment_size=SEG) as log:
        log.append(make(1, 60, size=2000))
        log.sync()
    save_snapshot(str(data / "g0" / "snapshot"), Snapshot(index=30, term=1, data=b"s" * 500))
    (data / "g0" / "consumequeue").mkdir()
    (data / "g0" / "consumequeue" / "00000000000000000012-0-64").write_bytes(b"c" * 300)
    (data / "g0" / "consumequeue" / "00000000000000000013-0-64.tmp").write_bytes(b"t" * 30)


@pytest.mark.parametrize("how", ["truncate", "bitflip"])
def test_damage_file_changes_one_file_and_restore_puts_it_back(tmp_path: Path, how: str) -> None:
    data = tmp_path / "n1"
    _group_with_snapshot(data)
    kinds = {k for k, _ in damageable_files(data)}
    assert kinds == {"segment", "index", "snapshot", "chunk"}  # never a leftover *.tmp
    before = {p: p.read_bytes() for _, p in damageable_files(data)}
    seen = set()
    inodes = {p: p.stat().st_ino for p in before}
    for seed in range(12):
        d = damage_file(data, random.Random(seed), how)
        assert d is not None and d.how == how and d.kind in kinds
        seen.add(d.kind)
        changed = [p for p, b in before.items() if p.read_bytes() != b]
        assert changed == [d.path]
        if how == "truncate":
            assert d.path.stat().st_size == d.detail["kept"] < d.size
        else:
            assert d.path.stat().st_size == d.size and 1 <= len(d.detail["bits"]) <= 4
        assert json.loads(json.dumps(d.describe()))["file"] == str(d.path)
        d.restore()
        assert all(p.read_bytes() == b for p, b in before.items())
        # the same files: what sync marks say of them (by inode) still holds
        assert all(p.stat().st_ino == inodes[p] for p in before)
    assert seen == kinds
    only = damage_file(data, random.Random(0), how, ("snapshot",))
    assert only is not None and only.kind == "snapshot"
    assert damage_file(tmp_path / "empty", random.Random(0), how) is None
    with pytest.raises(ValueError, match="unknown"):
        damage_file(data, random.Random(0), "melt")

def test_a_restored_file_survives_a_later_simulated_power_loss(tmp_path: Path) -> None:
    """A node that refuses to start on a truncated file has already recorded, on start,
    the truncated size as durable; the restore must say the bytes put back are durable
    too, or a `crash-unsynced` before the node's next start cuts them off again."""
    data = tmp_path / "n1"
    _group_with_snapshot(data)
    for seed in range(6):
        d = damage_file(data, random.Random(seed), "truncate")
        assert d is not None
        enable_sync_marks(data)  # the node's start: marks what it found, then it refuses
        disable_sync_marks(data)
        d.restore()
        discard_unsynced(data)  # a power loss while the node is still down
        assert d.path.read_bytes() == d.original, d.describe()


@pytest.mark.live

def test_a_node_rebuilds_a_damaged_snapshot_from_the_leader(tmp_path: Path) -> None:
    """What the file nemeses rely on: a node whose snapshot is cut sets it aside, keeps
    its log as it is and installs the leader's snapshot over it: it starts, serves every
    message, and its next snapshot is whole. (Alone in its group over a log retention
    has cut, it refuses: tests/broker/runtime/test_start_refusals.py, tests/raftlog/test_snapshot_rebuild.py.)"""
    with LocalCluster(tmp_path / "c", nodes=3, groups=1, tick_ms=50,
                      node_overrides={"snapshot_every_entries": 5}) as cluster:
        cluster.wait_ready(30.0)

        async def produce(lo: int, hi: int) -> None:
            if lo == 0:
                async with Admin(cluster.namesrv_addr) as admin:
                    await admin.create_topic("t", 1)
            async with Producer(cluster.namesrv_addr) as p:
                for k in range(lo, hi):
                    await p.send("t", f"m{k}")

        trio.run(produce, 0, 30)
        snap = cluster.configs[0].data / "g0" / "snapshot"
        deadline = time.monotonic() + 20
        while not snap.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.kill(1)
        d = damage_file(cluster.configs[0].data, random.Random(1), "truncate", ("snapshot",))
        assert d is not None
        assert cluster.restart_and_wait(1, 30.0) is None  # no refusal
        cluster.wait_ready(30.0)
        assert (snap.parent / "snapshot.damaged").exists()
        st = node_status(cluster, 1, "g0")
        assert "corrupt snapshot" in st["snapshot_set_aside"], st
        wait_for(lambda: not node_status(cluster, 1, "g0")["stateless"], 30,
                 "node 1's state from the leader")
        trio.run(produce, 30, 40)  # five more snapshots' worth: a whole one is written
        wait_for(lambda: node_status(cluster, 1, "g0").get("applied", 0)
                 >= node_status(cluster, group_leader(cluster, "g0") or 1, "g0")["commit"]
                 and load_snapshot(snap) is not None, 30, "a new snapshot on node 1")
        cluster.kill(1)
        assert cluster.restart_and_wait(1, 30.0) is None
        cluster.wait_ready(30.0)
        assert node_status(cluster, 1, "g0")["snapshot_set_aside"] == ""
        # restarted, it learns the commit index from its leader before it applies the
        # last entries again
        wait_for(lambda: node_status(cluster, 1, "g0").get("queues", {}).get("t", {})
                 .get(0) == [0, 40], 30, "node 1 serving all 40 messages")
