"""ConsumeQueue chunks: snapshots that reference sealed chunks instead of copying them
(`broker.state.cqchunks`, the queues part's section version 2)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.cqchunks import (
    ChunkGone,
    CorruptChunk,
    FileChunkStore,
    MemoryChunkStore,
    is_shipped,
    provide,
    ship,
    unship,
)
from broker.state.statemachine import (
    BrokerState,
    Retain,
    chunk_refs,
    control_create_topic,
    control_delete_topic,
)
from raftlog.fsutil import disable_sync_marks, enable_sync_marks, load_sync_marks
from raftlog.snapshot import SnapshotSkipped
from raftlog.types import Entry, EntryType
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

N = 4  # records per chunk: small, so a few dozen messages make several chunks
REC = 28


def batch(queue: int, count: int, topic: str = "t", key: str = "") -> bytes:
    return STORED_PREFIX.pack(1000) + encode_batch(
        topic, queue, [OutgoingMessage(b"m%d" % i, key=key) for i in range(count)])


class Feed:
    """A state fed entries with consecutive indexes."""

    def __init__(self, store: Any = None, chunk: int = N) -> None:
        self.store = store if store is not None else MemoryChunkStore()
        self.state = BrokerState("g", chunk_store=self.store, chunk_records=chunk)
        self.index = 0

    def entry(self, type_: EntryType, data: bytes) -> Any:
        self.index += 1
        return self.state.apply(Entry(self.index, 1, type_, data))

    def messages(self, queue: int, count: int, **kw: Any) -> Any:
        return self.entry(EntryType.MESSAGES, batch(queue, count, **kw))


def fed(counts: list[tuple[int, int]], store: Any = None, queues: int = 2) -> Feed:
    f = Feed(store)
    f.entry(EntryType.CONTROL, control_create_topic("t", queues, range(queues)))
    for q, n in counts:
        f.messages(q, n, key=f"k{n % 3}")
    return f


def queues_section(data: bytes) -> dict[str, Any]:
    d = msgpack.unpackb(data, raw=False, strict_map_key=False)
    (section,) = [s for name, v, s in d["parts"] if name == "queues" and v == 2]
    return dict(section)


def inline_bytes(data: bytes) -> int:
    return sum(len(head) + len(tail)
               for _t, _q, _lo, _end, head, _hk, _refs, tail, _tk in queues_section(data)["queues"])


def records_of(state: BrokerState, queue: int) -> list[Any]:
    lo, end = state.queue_range("t", queue)
    return state.lookup("t", queue, lo, max(end - lo, 1), 1 << 30)[0] if end > lo else []


# ---------------------------------------------------------------------- the part


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(1, 9)), max_size=12),
    st.lists(st.integers(1, 12), max_size=3),
)
def test_a_restored_state_equals_the_original(counts: list[tuple[int, int]],
                                               retains: list[int]) -> None:
    f = fed(counts)
    for r in sorted(retains):
        f.entry(EntryType.CONTROL, Retain(r).encode())
        f.messages(0, 3)
    data = f.state.snapshot()
    again = BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N)
    assert again.snapshot() == data
    for q in (0, 1):
        assert again.queue_range("t", q) == f.state.queue_range("t", q)
        assert records_of(again, q) == records_of(f.state, q)
        assert again.keys("t", "k0") == f.state.keys("t", "k0")
    # each chunk holds exactly N records; what is inline is under 2 N records per queue
    for _t, _q, _lo, _end, head, _hk, _refs, tail, _tk in queues_section(data)["queues"]:
        assert len(head) < N * REC and len(tail) < N * REC
    assert {name for name, _, _ in chunk_refs(data)} <= f.store.names()


def test_the_snapshot_stops_growing_with_the_messages() -> None:
    small, large = fed([(0, 7)] * 10), fed([(0, 7)] * 200)
    s, lg = small.state.snapshot(), large.state.snapshot()
    assert large.state.messages_applied == 20 * small.state.messages_applied
    assert inline_bytes(s) < 2 * N * REC and inline_bytes(lg) < 2 * N * REC
    assert len(chunk_refs(lg)) == 1400 // N  # the only part that grows: 15 bytes per chunk
    assert len(lg) - len(s) < 16 * (len(chunk_refs(lg)) - len(chunk_refs(s)))


def test_replicas_snapshot_the_same_bytes_whenever_they_wrote_chunks() -> None:
    """One replica snapshots after every entry (writing chunks as they seal), another only
    at the end, a third is restored halfway: all three end with the same bytes."""
    entries = [(q % 2, 1 + q % 5) for q in range(40)]
    a, b = Feed(), Feed()
    for f in (a, b):
        f.entry(EntryType.CONTROL, control_create_topic("t", 2, [0, 1]))
    for i, (q, n) in enumerate(entries):
        a.messages(q, n)
        b.messages(q, n)
        a.state.snapshot()
        if i == 20:
            a.entry(EntryType.CONTROL, Retain(9).encode())
            b.entry(EntryType.CONTROL, Retain(9).encode())
            c = Feed()
            c.state = BrokerState.restore("g", b.state.snapshot(), chunk_store=b.store,
                                          chunk_records=N)
            c.index = b.index
    for q, n in entries[21:]:
        c.messages(q, n)
    assert a.state.snapshot() == b.state.snapshot() == c.state.snapshot()
    assert a.store.names() >= {name for name, _, _ in chunk_refs(b.state.snapshot())}


def test_chunks_are_written_once() -> None:
    f = fed([(0, 9)])
    f.state.snapshot()
    first = dict(f.store.chunks)
    f.store.chunks = {k: b"x" for k in first}  # would show if anything were rewritten
    f.messages(0, 9)
    f.state.snapshot()
    assert {k: v for k, v in f.store.chunks.items() if k in first} == {k: b"x" for k in first}
    assert len(f.store.chunks) > len(first)


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "extend"])
def test_a_damaged_chunk_makes_the_snapshot_unusable(damage: str) -> None:
    f = fed([(0, 9), (1, 9)])
    data = f.state.snapshot()
    name = sorted(f.store.chunks)[1]
    chunk = bytearray(f.store.chunks[name])
    if damage == "flip":
        chunk[REC + 5] ^= 0x10
        f.store.chunks[name] = bytes(chunk)
    elif damage == "truncate":
        f.store.chunks[name] = bytes(chunk[:-1])
    elif damage == "extend":
        f.store.chunks[name] = bytes(chunk) + b"\0" * REC
    else:
        del f.store.chunks[name]
    with pytest.raises(CorruptChunk, match="corrupt consume queue chunk"):
        BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N)


def test_a_chunk_filed_under_another_name_is_refused() -> None:
    f = fed([(0, 9)])
    data = f.state.snapshot()
    a, b = sorted(f.store.chunks)[:2]
    f.store.chunks[a], f.store.chunks[b] = f.store.chunks[b], f.store.chunks[a]
    with pytest.raises(CorruptChunk):
        BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N)


def test_retention_deletes_chunks_once_a_snapshot_without_them_is_saved() -> None:
    f = fed([(0, 9)] * 4)  # 36 records: chunks at offsets 0, 4, ... 32
    f.state.snapshot_later()()
    before = set(f.store.chunks)
    assert len(before) == 9
    f.entry(EntryType.CONTROL, Retain(4).encode())  # entries 2, 3 dropped: offsets 0..17
    assert f.state.queue_range("t", 0) == (18, 36)
    later = f.state.snapshot_later()
    data = later()
    assert set(f.store.chunks) == before  # nothing goes before the snapshot is saved
    later.saved()
    kept = {name for name, _, _ in chunk_refs(data)}
    assert set(f.store.chunks) == kept and len(kept) == 4  # offsets 20..35; 18, 19 inline
    assert BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N).snapshot() == data
    # deleting the topic leaves nothing referenced
    f.entry(EntryType.CONTROL, control_delete_topic("t"))
    last = f.state.snapshot_later()
    last()
    last.saved()
    assert f.store.chunks == {}


def test_a_snapshot_whose_chunks_went_meanwhile_is_not_written() -> None:
    f = fed([(0, 9)])
    f.state.snapshot()
    later = f.state.snapshot_later()
    f.store.chunks.clear()  # what a stale snapshot's clean-up may do (see ChunkGone)
    with pytest.raises(ChunkGone) as info:
        later()
    assert isinstance(info.value, SnapshotSkipped)  # the runtime skips it, as routine
    data = f.state.snapshot()  # the next one copies them again
    assert BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N).snapshot() == data


@pytest.mark.parametrize("hot", [3, 70])
def test_queue_sections_of_version_1_still_load(hot: int) -> None:
    f = fed([(0, 9), (1, 2)])
    f.messages(1, hot, key="hot")  # more than KEY_HISTORY: version 1 kept the newest only
    f.entry(EntryType.CONTROL, Retain(3).encode())
    part = f.state.queues
    v1 = {  # what the queues part wrote before chunks
        "counters": [part.messages_applied, part.bytes_applied],
        "queues": [[t, q, cq.min_offset, cq.records()] for (t, q), cq in
                   sorted(part.queues.items())],
        "keys": [[t, k, list(keys[k])] for t, keys in sorted(part._keys.items())
                 for k in sorted(keys)],
    }
    d = msgpack.unpackb(f.state.snapshot(), raw=False, strict_map_key=False)
    d["parts"] = [[n, 1, v1] if n == "queues" else [n, v, sec] for n, v, sec in d["parts"]]
    again = BrokerState.restore("g", msgpack.packb(d, use_bin_type=True),
                                chunk_store=MemoryChunkStore(), chunk_records=N)
    for key in ("k0", "k1", "k2", "hot"):
        assert again.keys("t", key) == f.state.keys("t", key)
    for q in (0, 1):
        assert records_of(again, q) == records_of(f.state, q)
    if hot < 64:  # nothing was forgotten: the very same snapshot
        assert again.snapshot() == f.state.snapshot()
    # and it goes on as the original does
    for s in (again, f.state):
        s.apply(Entry(f.index + 1, 1, EntryType.MESSAGES, batch(1, 5, key="hot")))
    assert again.keys("t", "hot") == f.state.keys("t", "hot")


@pytest.mark.parametrize("mangle", [
    lambda q: q.__setitem__(4, q[4] + b"\0" * REC),  # head past the chunk boundary
    lambda q: q.__setitem__(7, q[7] + b"\0" * REC * N),  # tail a whole chunk long
    lambda q: q.__setitem__(6, q[6][1:]),  # a chunk left out
    lambda q: q.__setitem__(2, q[2] + 1),  # min_offset off the layout
    lambda q: q.__setitem__(3, q[3] + 1),  # end_offset off the records
    lambda q: q.__setitem__(8, q[8] + [[q[3] + 1, "x"]]),  # a key past the end
    lambda q: q.__setitem__(8, q[8] + q[8][-1:]),  # a record keyed twice
])
def test_queue_sections_not_cut_at_chunk_boundaries_are_refused(mangle: Any) -> None:
    f = fed([(0, 6), (0, 9)])
    f.entry(EntryType.CONTROL, Retain(3).encode())  # min_offset 6: head of 2 records
    d = msgpack.unpackb(f.state.snapshot(), raw=False, strict_map_key=False)
    sec = next(s for name, _, s in d["parts"] if name == "queues")
    mangle(sec["queues"][0])
    with pytest.raises(ValueError):
        BrokerState.restore("g", msgpack.packb(d, use_bin_type=True), chunk_store=f.store,
                            chunk_records=N)


# ---------------------------------------------------------------------- InstallSnapshot


def test_a_shipped_snapshot_carries_its_chunks_to_a_store_that_has_none() -> None:
    f = fed([(0, 9), (1, 9)])
    data = f.state.snapshot()
    shipped = ship(data, chunk_refs(data), f.store)
    assert is_shipped(shipped) and not is_shipped(data)
    got, chunks = unship(shipped, chunk_refs)
    assert got == data
    follower = MemoryChunkStore()
    with pytest.raises(CorruptChunk):  # without the chunks, the snapshot is unusable
        BrokerState.restore("g", got, chunk_store=follower, chunk_records=N)
    provide(follower, chunk_refs(got), chunks)
    assert BrokerState.restore("g", got, chunk_store=follower, chunk_records=N).snapshot() == data
    # a damaged copy the follower already had is replaced by the shipped one
    name = sorted(follower.chunks)[0]
    follower.chunks[name] = b"\0" * len(follower.chunks[name])
    provide(follower, chunk_refs(got), chunks)
    assert BrokerState.restore("g", got, chunk_store=follower, chunk_records=N).snapshot() == data


def test_a_damaged_chunk_is_never_shipped_and_a_bad_shipment_is_refused() -> None:
    f = fed([(0, 9)])
    data = f.state.snapshot()
    refs = chunk_refs(data)
    good = f.store.chunks[refs[0][0]]
    f.store.chunks[refs[0][0]] = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(CorruptChunk):
        ship(data, refs, f.store)
    f.store.chunks[refs[0][0]] = good
    shipped = ship(data, refs, f.store)
    i = shipped.index(good)
    bad = shipped[:i + 3] + bytes([shipped[i + 3] ^ 1]) + shipped[i + 4:]
    with pytest.raises(ValueError, match="bad copy"):
        unship(bad, chunk_refs)
    short = ship(data, refs[1:], f.store)  # one referenced chunk left out
    with pytest.raises(ValueError, match="lacks chunk"):
        unship(short, chunk_refs)


# ---------------------------------------------------------------------- the file store


def test_the_file_store_makes_chunks_durable_before_the_snapshot_bytes_exist(
        tmp_path: Path) -> None:
    enable_sync_marks(tmp_path)
    try:
        store = FileChunkStore(tmp_path / "g" / "consumequeue")
        f = fed([(0, 9), (1, 5)], store=store)
        f.state.snapshot_later()()  # the chunk writes happen in the call, before the bytes
        durable = load_sync_marks(tmp_path)
        names = sorted(os.listdir(store.path))
        assert len(names) == 3
        for name in names:
            p = Path(store.path) / name
            rel = str(p.relative_to(tmp_path))
            assert durable.durable_size(rel, p.stat().st_ino) == p.stat().st_size > 4 * REC
    finally:
        disable_sync_marks(tmp_path)


def test_the_file_store_round_trips_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "cq"
    store = FileChunkStore(path)
    assert store.names() == set() and store.get("a") is None
    store.put("a", b"1" * 28)
    store.put("a", b"2" * 28)  # written once
    store.sync()
    assert store.get("a") == b"1" * 28
    store.put("a", b"2" * 28, overwrite=True)
    (path / "b.tmp").write_bytes(b"torn")  # what a crash mid-write leaves
    (path / "c").write_bytes(b"3")
    again = FileChunkStore(path)
    assert again.names() == {"a", "c"} and not (path / "b.tmp").exists()
    assert again.get("a") == b"2" * 28
    again.keep_only(["a"])
    assert sorted(os.listdir(path)) == ["a"]


def test_a_temporary_file_finished_while_the_store_lists_is_no_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store's first listing sweeps the temporary files of writes a crash cut short. A
    replica hosted again in the same directory lists it while the replica it replaced may
    still be saving its last snapshot there: a temporary file listed may be renamed by
    its writer before the sweep reaches it (a long run's node exited on that)."""
    path = tmp_path / "cq"
    path.mkdir()
    (path / "a").write_bytes(b"1")
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: [*real(p), "renamed-meanwhile.tmp"])
    store = FileChunkStore(path)
    assert store.names() == {"a"}


def test_a_node_style_restore_from_files_reads_every_chunk(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path / "cq")
    f = fed([(0, 9)] * 5, store=store)
    later = f.state.snapshot_later()
    data = later()
    later.saved()
    fresh = FileChunkStore(tmp_path / "cq")  # a restarted node
    again = BrokerState.restore("g", data, chunk_store=fresh, chunk_records=N)
    assert again.snapshot() == data and records_of(again, 0) == records_of(f.state, 0)
    victim = sorted(fresh.names())[3]
    with open(Path(fresh.path) / victim, "r+b") as fh:
        fh.seek(30)
        byte = fh.read(1)
        fh.seek(30)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptChunk, match=victim):
        BrokerState.restore("g", data, chunk_store=FileChunkStore(tmp_path / "cq"),
                            chunk_records=N)


def test_a_chunk_file_no_snapshot_checked_is_written_again_not_adopted(tmp_path: Path) -> None:
    """A file already on disk under the name of a chunk a snapshot is about to reference,
    which no snapshot of this state checked (one a snapshot wrote before its own file
    failed to be written, damaged while the node was down), is replaced: adopting it by
    its name made the snapshot, and so every later start, refuse."""
    counts = [(0, 9)] * 5
    names = {name for name, _, _ in chunk_refs(fed(counts).state.snapshot())}
    path = tmp_path / "cq"
    path.mkdir()
    for name in names:
        (path / name).write_bytes(b"damaged")
    f = fed(counts, store=FileChunkStore(path))
    later = f.state.snapshot_later()
    data = later()
    later.saved()
    again = BrokerState.restore("g", data, chunk_store=FileChunkStore(path), chunk_records=N)
    assert again.snapshot() == data and records_of(again, 0) == records_of(f.state, 0)


def test_the_key_index_is_rebuilt_newest_first_across_queues_and_retention() -> None:
    f = fed([])
    for i in range(40):  # a hot key over both queues, more than KEY_HISTORY in all
        f.messages(i % 2, 3, key="hot")
    f.messages(0, 2, key="cold")
    data = f.state.snapshot()
    again = BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N)
    hot = f.state.keys("t", "hot")
    assert len(hot) == 64 and again.keys("t", "hot") == hot
    assert hot[-1] == (1, 59) and hot[0] == (0, 29)  # the newest 64, in log order
    assert again.keys("t", "cold") == f.state.keys("t", "cold") == [(0, 60), (0, 61)]
    # retention forgets what lies below the horizon, in the index and in what feeds it
    kept = len(f.state.queues._keyed[("t", 0)].offsets)
    f.entry(EntryType.CONTROL, Retain(30).encode())
    assert len(f.state.queues._keyed[("t", 0)].offsets) < kept
    data = f.state.snapshot()
    again = BrokerState.restore("g", data, chunk_store=f.store, chunk_records=N)
    assert again.keys("t", "hot") == f.state.keys("t", "hot") and len(again.keys("t", "hot")) < 64
