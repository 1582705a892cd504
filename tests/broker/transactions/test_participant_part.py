"""The transaction participant part: prepared batch headers, prepare, markers, half
messages, fences, limits, refusals that change nothing, and its snapshot section."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from broker.state.parts import txpart
from broker.state.parts.base import ControlResult, ErrorResult, ProduceResult, Refused
from broker.state.parts.txpart import (
    HalfChecked,
    HalfEnd,
    TxForgetFences,
    TxMarker,
    TxMarkers,
    TxOffsets,
)
from broker.state.statemachine import BrokerState, control_create_topic, control_delete_topic
from raftlog.types import Entry, EntryType
from wire.protocol import Code, RequestError
from wire.records import (
    STORED_PREFIX,
    BatchHeader,
    OutgoingMessage,
    decode_record,
    encode_batch,
    walk_batch,
)
from wire.txn import coordinator_group, half_key, kafka_key


class Replica:
    """A state fed entries at consecutive indexes, remembering MESSAGES data to read
    queues back as bodies."""

    def __init__(self, group: str = "g1", mutations: tuple[str, ...] = ()) -> None:
        self.state = BrokerState(group, mutations=mutations)
        self.index = 0
        self.data: dict[int, bytes] = {}

    def apply(self, etype: EntryType, data: bytes) -> Any:
        self.index += 1
        if etype == EntryType.MESSAGES:
            self.data[self.index] = data
        return self.state.apply(Entry(self.index, 1, etype, data))

    def control(self, data: bytes) -> Any:
        return self.apply(EntryType.CONTROL, data)

    def batch(self, topic: str, queue: int, bodies: list[bytes], *, store_ms: int = 1000,
              **kw: Any) -> Any:
        return self.apply(EntryType.MESSAGES,
                          STORED_PREFIX.pack(store_ms) + encode_batch(topic, queue, bodies, **kw))

    def bodies(self, topic: str, queue: int) -> list[bytes]:
        lo, end = self.state.queue_range(topic, queue)
        if lo == end:
            return []
        entries, _ = self.state.lookup(topic, queue, lo, end - lo, 1 << 40)
        out = []
        for e in entries:
            msg, _ = decode_record(self.data[e.index], e.start, topic=topic, queue=queue,
                                   offset=e.offset, store_ms=e.store_ms, msg_id="")
            out.append(msg.body)
        return out


def sections(s: BrokerState) -> list[Any]:
    """Every part's section: what a refused entry must leave alone (the applied index
    moves for any entry)."""
    return [p.section() for p in s.parts]


@pytest.fixture
def r() -> Replica:
    rep = Replica()
    rep.control(control_create_topic("t", 2, [0, 1]))
    rep.control(control_create_topic("u", 1, [0]))
    return rep


def refused(rep: Replica, etype: EntryType, data: bytes, code: Code) -> ErrorResult:
    """Apply an entry that must be refused with `code` and change nothing."""
    before = sections(rep.state)
    res = rep.apply(etype, data)
    assert isinstance(res, ErrorResult), res
    assert res.code == code, res
    assert sections(rep.state) == before
    return res


# ---------------------------------------------------------------------- batch header


def test_an_ordinary_batch_keeps_exactly_its_bytes() -> None:
    # the bytes the release before transactions wrote for the same calls
    a = encode_batch("t", 1, [b"x"], pid=3, seq=4, born_ms=5)
    assert a.hex() == (
        "52420100001d85a5746f706963a174a5717565756501a370696403a373657104a16e010000001900"
        "0000000000000500000000000000000000000178") and a.starts == (43,)
    b = encode_batch("t", 0, [OutgoingMessage(b"y", key="k", tags="a", properties={"p": "v"}),
                              b"z"])
    assert b.hex() == (
        "52420100001d85a5746f706963a174a5717565756500a370696400a3736571ffa16e0200000020000"
        "00000000000000001000100000005000000016b6181a170a176790000001900000000000000000000"
        "000000000000000000017a") and b.starts == (43, 75)
    assert walk_batch(a)[0] == BatchHeader("t", 1, 3, 4, 1)


def test_tx_and_half_headers_round_trip() -> None:
    h, refs = walk_batch(encode_batch("t", 0, [b"a", b"b"], tx=("orders-1", 2, 7)))
    assert h.tx == ("orders-1", 2, 7) and h.half is None and h.prepared and len(refs) == 2
    h, _ = walk_batch(encode_batch("t", 0, [b"a"], pid=1, seq=0, half=("ab12", "pg1")))
    assert h.half == ("ab12", "pg1") and h.tx is None and (h.pid, h.seq) == (1, 0)
    assert not walk_batch(encode_batch("t", 0, [b"a"]))[0].prepared


def _raw_batch(header: dict[str, Any]) -> bytes:
    """A one-record batch with any header map."""
    good = encode_batch("t", 0, [b"a"])
    hlen = int.from_bytes(good[4:6], "big")
    h = msgpack.packb(header)
    return good[:4] + len(h).to_bytes(2, "big") + h + good[6 + hlen:]


BAD_TX = [["", 0, 0], ["x" * 256, 0, 0], ["a\nb", 0, 0], [" a", 0, 0], [7, 0, 0],
          ["a", -1, 0], ["a", 0, -1], ["a", True, 0], ["a", 0, 1.5], ["a", 0], "a", None]
BAD_HALF = [["", "pg"], ["x", "bad name"], ["x", ""], ["x"], ["x", "pg", 1], "x", ["x", 3]]


@pytest.mark.parametrize("tx", BAD_TX[:-1])
def test_a_malformed_tx_header_is_refused(tx: Any) -> None:
    with pytest.raises(RequestError) as err:
        walk_batch(_raw_batch({"topic": "t", "queue": 0, "n": 1, "tx": tx}))
    assert err.value.code == Code.MALFORMED
    if isinstance(tx, list) and len(tx) == 3:
        with pytest.raises(RequestError):
            encode_batch("t", 0, [b"a"], tx=tuple(tx))  # type: ignore[arg-type]


@pytest.mark.parametrize("half", BAD_HALF)
def test_a_malformed_half_header_is_refused(half: Any) -> None:
    with pytest.raises(RequestError) as err:
        walk_batch(_raw_batch({"topic": "t", "queue": 0, "n": 1, "half": half}))
    assert err.value.code == Code.MALFORMED


def test_a_header_with_both_tx_and_half_is_refused() -> None:
    with pytest.raises(RequestError) as err:
        walk_batch(_raw_batch({"topic": "t", "queue": 0, "n": 1, "tx": ["a", 0, 0],
                               "half": ["b", "pg"]}))
    assert err.value.code == Code.MALFORMED
    with pytest.raises(RequestError):
        encode_batch("t", 0, [b"a"], tx=("a", 0, 0), half=("b", "pg"))


def test_a_malformed_prepared_batch_entry_changes_nothing(r: Replica) -> None:
    data = STORED_PREFIX.pack(1) + _raw_batch({"topic": "t", "queue": 0, "n": 1,
                                               "tx": ["", 0, 0]})
    refused(r, EntryType.MESSAGES, data, Code.MALFORMED)


def test_coordinator_group_is_a_stable_hash_over_sorted_groups() -> None:
    groups = ["g3", "g1", "g2"]
    chosen = {coordinator_group(f"tid-{i}", groups) for i in range(100)}
    assert chosen == {"g1", "g2", "g3"}
    assert coordinator_group("orders-1", groups) == coordinator_group("orders-1",
                                                                      reversed(groups))
    import zlib
    assert coordinator_group("x", groups) == ["g1", "g2", "g3"][zlib.crc32(b"x") % 3]
    with pytest.raises(ValueError):
        coordinator_group("x", [])


# ---------------------------------------------------------------------- Kafka flow


def test_prepared_batches_stay_out_of_queues_until_a_commit_marker(r: Replica) -> None:
    res = r.batch("t", 0, [b"a", b"b"], tx=("tid", 0, 0))
    assert res == ProduceResult(-1, 2, r.index)
    prepared_at = r.index
    assert r.batch("t", 0, [b"plain"]) == ProduceResult(0, 1, r.index)
    r.batch("t", 1, [b"c"], tx=("tid", 0, 0))
    r.batch("u", 0, [b"other"], tx=("tid2", 0, 0))
    assert r.bodies("t", 0) == [b"plain"] and r.bodies("t", 1) == []
    assert r.state.pinned_index() == prepared_at
    assert [k[:3] for k in r.state.txpart.pending_kafka()] == [("tid", 0, 0), ("tid2", 0, 0)]
    res = r.control(TxMarker("tid", 0, 0, True, 0).encode())
    assert res == ControlResult("tx_marker", 3)
    assert r.bodies("t", 0) == [b"plain", b"a", b"b"] and r.bodies("t", 1) == [b"c"]
    # the queue points at the stored batch: no copy
    entries, _ = r.state.lookup("t", 0, 1, 2, 1 << 20)
    assert [e.index for e in entries] == [prepared_at, prepared_at]
    assert r.state.txpart.decision(kafka_key("tid", 0, 0)).commit  # type: ignore[union-attr]
    assert r.state.pinned_index() == prepared_at + 3  # tid2's batch
    # a retried marker changes nothing, either way round
    before = sections(r.state)
    assert r.control(TxMarker("tid", 0, 0, True, 0).encode()).dup
    assert r.control(TxMarker("tid", 0, 0, False, 0).encode()).dup
    assert sections(r.state) == before
    assert r.bodies("t", 0) == [b"plain", b"a", b"b"]


def test_several_markers_in_one_entry_act_as_each_alone() -> None:
    def run(decide: Any) -> tuple[Replica, Any]:
        rep = Replica()
        rep.control(control_create_topic("t", 2, [0, 1]))
        rep.batch("t", 0, [b"a"], tx=("x", 0, 0))
        rep.batch("t", 0, [b"b"], tx=("y", 0, 4))
        rep.batch("t", 1, [b"c"], tx=("x", 0, 1))  # x's next transaction: not decided here
        return rep, decide(rep)

    ms = (TxMarker("y", 0, 4, True, 0), TxMarker("x", 0, 0, False, 2),
          TxMarker("z", 0, 0, True, 0))  # z: nothing prepared, the decision is kept
    one, res = run(lambda rep: rep.control(TxMarkers(ms).encode()))
    alone, _ = run(lambda rep: [rep.control(m.encode()) for m in ms])
    assert res == ControlResult("tx_markers", 1)
    # the same state, but for the Raft index each decision names (one entry, or three)
    a, b = one.state.txpart.section(), alone.state.txpart.section()
    assert [d[:3] + d[4:] for d in a.pop("decided")] == [d[:3] + d[4:] for d in b.pop("decided")]
    assert a == b
    assert [one.bodies("t", q) for q in (0, 1)] == [alone.bodies("t", q) for q in (0, 1)]
    assert one.bodies("t", 0) == [b"b"] and one.bodies("t", 1) == []
    assert [k[:3] for k in one.state.txpart.pending_kafka()] == [("x", 0, 1)]
    assert one.state.txpart.fence("x") == 2
    assert one.control(TxMarkers(ms[:2]).encode()).dup  # retried: nothing changes
    # one bad marker refuses them all
    bad = msgpack.packb({"op": "tx_markers", "markers": [
        ["x", 0, 1, True, 0], ["y", 0, 5, "yes", 0]]})
    refused(one, EntryType.CONTROL, bad, Code.MALFORMED)
    refused(one, EntryType.CONTROL, msgpack.packb({"op": "tx_markers", "markers": []}),
            Code.MALFORMED)
    assert [k[:3] for k in one.state.txpart.pending_kafka()] == [("x", 0, 1)]


def test_a_committed_message_is_found_by_its_id(r: Replica) -> None:
    batch = encode_batch("t", 0, [b"a", b"b"], tx=("tid", 0, 0))
    r.batch("t", 0, [b"before"])
    r.apply(EntryType.MESSAGES, STORED_PREFIX.pack(1) + batch)
    prepared_at = r.index
    for k in range(50):
        r.batch("t", 0, [b"%d" % k])
    r.control(TxMarker("tid", 0, 0, True, 0).encode())
    r.batch("t", 0, [b"after"])
    assert r.state.locate("t", 0, prepared_at, batch.starts[1]) == 52
    assert r.state.locate("t", 0, prepared_at - 1, encode_batch("t", 0, [b"before"]).starts[0]) == 0
    with pytest.raises(RequestError):
        r.state.locate("t", 0, prepared_at, batch.starts[1] + 1)


def test_an_abort_marker_drops_prepared_batches_and_offsets(r: Replica) -> None:
    r.batch("t", 0, [b"a"], tx=("tid", 0, 0))
    r.control(TxOffsets("tid", 0, 0, "cg", (("t", 0, 5),), 10).encode())
    assert r.state.txpart.pending_offsets("cg", "t", 0)
    res = r.control(TxMarker("tid", 0, 0, False, 0).encode())
    assert res == ControlResult("tx_marker", 0)
    assert r.bodies("t", 0) == [] and r.state.consumer_offset("cg", "t", 0) is None
    assert not r.state.txpart.pending_offsets("cg", "t", 0)
    assert r.state.pinned_index() is None
    # a late batch of that transaction is refused
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"late"], tx=("tid", 0, 0)),
            Code.TX_DECIDED)


def test_a_commit_marker_applies_prepared_offsets(r: Replica) -> None:
    r.control(TxOffsets("tid", 0, 0, "cg", (("t", 0, 5), ("t", 1, 2)), 10).encode())
    r.control(TxOffsets("tid", 0, 0, "cg", (("t", 0, 7),), 11).encode())
    assert r.state.consumer_offset("cg", "t", 0) is None
    assert r.state.txpart.pending_kafka() == [("tid", 0, 0, 10, 3)]
    assert r.state.pinned_index() is None  # offsets reference no log data
    r.control(TxMarker("tid", 0, 0, True, 0).encode())
    assert r.state.consumer_offset("cg", "t", 0) == 7  # last write wins
    assert r.state.consumer_offset("cg", "t", 1) == 2
    assert not r.state.txpart.pending_offsets("cg", "t", 0)


def test_offsets_of_queues_not_hosted_are_refused(r: Replica) -> None:
    refused(r, EntryType.CONTROL, TxOffsets("tid", 0, 0, "cg", (("t", 5, 1),), 1).encode(),
            Code.UNKNOWN_QUEUE)
    refused(r, EntryType.CONTROL, TxOffsets("tid", 0, 0, "cg", (("nope", 0, 1),), 1).encode(),
            Code.UNKNOWN_TOPIC)


def test_a_marker_for_nothing_prepared_records_the_decision(r: Replica) -> None:
    res = r.control(TxMarker("tid", 0, 3, False, 0).encode())
    assert res == ControlResult("tx_marker", dup=True)
    assert r.state.txpart.decision(kafka_key("tid", 0, 3)) is not None
    # a batch arriving after its marker is refused, not left pinned forever
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x"], tx=("tid", 0, 3)),
            Code.TX_DECIDED)
    # the marker's fence fences older epochs
    r.control(TxMarker("tid", 0, 4, False, 1).encode())
    assert r.state.txpart.fence("tid") == 1
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x"], tx=("tid", 0, 5)),
            Code.TX_FENCED)


def test_a_marker_only_touches_its_own_transaction(r: Replica) -> None:
    r.batch("t", 0, [b"n0"], tx=("tid", 0, 0))
    r.batch("t", 0, [b"n1"], tx=("tid", 0, 1))
    r.batch("t", 0, [b"e1"], tx=("tid", 1, 0))
    r.control(TxMarker("tid", 0, 1, True, 0).encode())
    assert r.bodies("t", 0) == [b"n1"]
    assert [k[:3] for k in r.state.txpart.pending_kafka()] == [("tid", 0, 0), ("tid", 1, 0)]


def test_fencing_refuses_older_epochs_and_nothing_changes(r: Replica) -> None:
    r.control(TxMarker("tid", 2, 9, False, 2).encode())  # the coordinator's epoch: 2
    assert r.state.txpart.fence("tid") == 2
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"z"], tx=("tid", 1, 5)),
            Code.TX_FENCED)
    refused(r, EntryType.CONTROL, TxOffsets("tid", 1, 5, "cg", (("t", 0, 1),), 1).encode(),
            Code.TX_FENCED)
    r.batch("t", 0, [b"a"], tx=("tid", 2, 0))
    # a marker raises the fence: the coordinator's newer epoch
    r.control(TxMarker("tid", 2, 0, False, 4).encode())
    assert r.state.txpart.fence("tid") == 4
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"z"], tx=("tid", 3, 0)),
            Code.TX_FENCED)
    assert r.batch("t", 0, [b"ok"], tx=("tid", 4, 0)).base_offset == -1


def test_a_clients_epoch_never_raises_the_fence(r: Replica) -> None:
    """A batch header or TX_OFFSETS claiming the highest epoch of someone else's id
    raises no fence: only the coordinator's markers do, so the id's owner keeps
    preparing data at its own epoch."""
    top = (1 << 63) - 1
    r.batch("t", 0, [b"evil"], tx=("victim", top, 0))
    r.control(TxOffsets("victim", top, 0, "cg", (("t", 0, 1),), 1).encode())
    assert r.state.txpart.fence("victim") == -1
    assert r.batch("t", 0, [b"mine"], tx=("victim", 0, 0)).base_offset == -1
    r.control(TxMarker("victim", 0, 0, True, 0).encode())
    assert r.bodies("t", 0) == [b"mine"]
    # the made-up epoch's data is aborted by a marker carrying the coordinator's epoch
    # (below the made-up one), which raises the fence to that epoch only
    assert r.control(TxMarker("victim", top, 0, False, 0).encode()) == ControlResult(
        "tx_marker", 0)
    assert r.state.txpart.fence("victim") == 0 and r.state.pinned_index() is None
    assert r.batch("t", 0, [b"next"], tx=("victim", 0, 1)).base_offset == -1


def test_no_fencing_mutation_accepts_older_epochs() -> None:
    rep = Replica(mutations=("no-fencing",))
    rep.control(control_create_topic("t", 1, [0]))
    rep.control(TxMarker("tid", 2, 9, False, 2).encode())
    assert rep.batch("t", 0, [b"z"], tx=("tid", 1, 0)) == ProduceResult(-1, 1, rep.index)
    assert isinstance(rep.control(TxOffsets("tid", 0, 0, "cg", (("t", 0, 1),), 1).encode()),
                      ControlResult)


def test_serve_prepared_mutation_shows_prepared_data_at_once() -> None:
    rep = Replica(mutations=("serve-prepared", "skip-fsync"))
    rep.control(control_create_topic("t", 1, [0]))
    rep.batch("t", 0, [b"a"], tx=("tid", 0, 0))
    rep.batch("t", 0, [b"b"], tx=("tid", 0, 1))
    assert rep.bodies("t", 0) == [b"a", b"b"]
    rep.control(TxMarker("tid", 0, 0, True, 0).encode())
    rep.control(TxMarker("tid", 0, 1, False, 0).encode())
    assert rep.bodies("t", 0) == [b"a", b"b"]  # not appended twice; the abort shows anyway


def test_a_retried_prepared_batch_is_a_duplicate(r: Replica) -> None:
    first = r.batch("t", 0, [b"a"], pid=9, seq=0, tx=("tid", 0, 0))
    again = r.batch("t", 0, [b"a"], pid=9, seq=0, tx=("tid", 0, 0))
    assert isinstance(again, ProduceResult) and again.dup and again.index == first.index
    r.control(TxMarker("tid", 0, 0, True, 0).encode())
    assert r.bodies("t", 0) == [b"a"]


def test_limits_refuse_and_change_nothing(r: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txpart, "MAX_TX_MESSAGES", 3)
    monkeypatch.setattr(txpart, "MAX_TX_BYTES", 200)
    monkeypatch.setattr(txpart, "MAX_OPEN", 2)
    r.batch("t", 0, [b"a", b"b"], tx=("tid", 0, 0))
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"c", b"d"], tx=("tid", 0, 0)),
            Code.TX_LIMIT)
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x" * 300], tx=("tid", 1, 1)),
            Code.TX_LIMIT)  # its newer epoch does not raise the fence either
    r.batch("t", 0, [b"h"], half=("h1", "pg"))
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x"], half=("h2", "pg")),
            Code.TX_LIMIT)
    refused(r, EntryType.CONTROL, TxOffsets("tid", 0, 9, "cg", (("t", 0, 1),), 1).encode(),
            Code.TX_LIMIT)
    # within the limits, more of an open one is fine
    assert r.batch("t", 0, [b"c"], tx=("tid", 0, 0)).base_offset == -1


def test_a_deleted_topic_takes_its_prepared_batches_along(r: Replica) -> None:
    r.batch("t", 0, [b"a"], tx=("tid", 0, 0))
    r.batch("u", 0, [b"b"], tx=("tid", 0, 0))
    r.batch("t", 1, [b"h"], half=("h1", "pg"))
    r.control(control_delete_topic("t"))
    assert r.state.txpart.pending_halves() == []
    assert r.state.txpart.pending_kafka()[0][:3] == ("tid", 0, 0)
    assert r.control(TxMarker("tid", 0, 0, True, 0).encode()) == ControlResult("tx_marker", 1)
    assert r.bodies("u", 0) == [b"b"]
    assert r.state.pinned_index() is None
    res = r.control(HalfEnd("h1", True, "client", "pg").encode())
    assert isinstance(res, ErrorResult) and res.code == Code.TX_UNKNOWN


# ---------------------------------------------------------------------- half messages


def test_a_committed_half_message_enters_its_queue_once(r: Replica) -> None:
    r.batch("t", 1, [b"h"], half=("h1", "pg"), store_ms=500)
    view = r.state.txpart.half("h1")
    assert view is not None and (view.topic, view.queue, view.prepared_ms) == ("t", 1, 500)
    assert view.msg_id == f"g1:{r.index}:{encode_batch('t', 1, [b'h'], half=('h1', 'pg')).starts[0]}"
    assert r.bodies("t", 1) == []
    assert r.control(HalfEnd("h1", True, "client", "pg").encode()) == ControlResult(
        "half_end", 1)
    assert r.bodies("t", 1) == [b"h"]
    assert r.control(HalfEnd("h1", True, "check", "pg").encode()).dup
    refused(r, EntryType.CONTROL, HalfEnd("h1", False, "client", "pg").encode(), Code.TX_DECIDED)
    assert r.bodies("t", 1) == [b"h"]
    assert r.state.txpart.half("h1") is None
    assert r.state.txpart.decision(half_key("h1")).source == "client"  # type: ignore[union-attr]


def test_half_rollback_and_the_rules_of_who_may_decide(r: Replica) -> None:
    r.batch("t", 0, [b"h"], half=("h1", "pg"))
    refused(r, EntryType.CONTROL, HalfEnd("h1", True, "client", "pg2").encode(), Code.FORBIDDEN)
    refused(r, EntryType.CONTROL, HalfEnd("nope", True, "client", "pg").encode(),
            Code.TX_UNKNOWN)
    # a half of another producer group may not add to it
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x"], half=("h1", "pg2")),
            Code.FORBIDDEN)
    assert r.control(HalfEnd("h1", False, "operator", "").encode()) == ControlResult("half_end")
    assert r.bodies("t", 0) == []
    assert not r.state.txpart.decision(half_key("h1")).commit  # type: ignore[union-attr]
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"x"], half=("h1", "pg")),
            Code.TX_DECIDED)


def test_check_backs_are_counted_until_decided(r: Replica) -> None:
    r.batch("t", 0, [b"h"], half=("h1", "pg"))
    assert r.control(HalfChecked("h1", 6000).encode()) == ControlResult("half_checked", 1)
    r.control(HalfChecked("h1", 36000).encode())
    v = r.state.txpart.half("h1")
    assert v is not None and (v.checks, v.last_check_ms) == (2, 36000)
    assert [h.txid for h in r.state.txpart.pending_halves()] == ["h1"]
    r.control(HalfEnd("h1", False, "expired", "").encode())
    before = sections(r.state)
    assert r.control(HalfChecked("h1", 99000).encode()).dup
    assert r.control(HalfChecked("never", 99000).encode()).dup
    assert sections(r.state) == before


# ---------------------------------------------------------------------- records


BAD_RECORDS: list[tuple[dict[str, Any], Code]] = [
    ({"op": "tx_marker", "tid": "", "epoch": 0, "n": 0, "commit": True, "fence": 0},
     Code.MALFORMED),
    ({"op": "tx_marker", "tid": "a", "epoch": 1, "n": 0, "commit": True, "fence": -1},
     Code.MALFORMED),  # a negative fence
    ({"op": "tx_marker", "tid": "a", "epoch": 0, "n": 0, "commit": 1, "fence": 0},
     Code.MALFORMED),
    ({"op": "tx_marker", "tid": "a", "epoch": "0", "n": 0, "commit": True, "fence": 0},
     Code.MALFORMED),
    ({"op": "tx_marker", "tid": "a", "epoch": 0, "n": -1, "commit": True, "fence": 0},
     Code.MALFORMED),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "bad name",
      "offsets": [["t", 0, 1]], "ts": 0}, Code.INVALID_NAME),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "cg", "offsets": [], "ts": 0},
     Code.MALFORMED),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "cg",
      "offsets": [["t", 0, -1]], "ts": 0}, Code.MALFORMED),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "cg",
      "offsets": [["t", 0]], "ts": 0}, Code.MALFORMED),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "cg",
      "offsets": "x", "ts": 0}, Code.MALFORMED),
    ({"op": "tx_offsets", "tid": "a", "epoch": 0, "n": 0, "cg": "cg",
      "offsets": [["t", 0, 1]], "ts": -5}, Code.MALFORMED),
    ({"op": "half_end", "txid": "h", "commit": True, "source": "who", "producer_group": "pg"},
     Code.MALFORMED),
    ({"op": "half_end", "txid": "h", "commit": True, "source": "client", "producer_group": ""},
     Code.INVALID_NAME),  # only the operator and expiry may skip the group
    ({"op": "half_end", "txid": "h", "commit": None, "source": "client",
      "producer_group": "pg"}, Code.MALFORMED),
    ({"op": "half_end", "txid": 5, "commit": True, "source": "client", "producer_group": "pg"},
     Code.MALFORMED),
    ({"op": "half_checked", "txid": "h", "ts": "now"}, Code.MALFORMED),
    ({"op": "half_checked", "ts": 1}, Code.MALFORMED),
]


@pytest.mark.parametrize(("record", "code"), BAD_RECORDS)
def test_a_malformed_record_is_refused_and_changes_nothing(
    r: Replica, record: dict[str, Any], code: Code
) -> None:
    r.batch("t", 0, [b"h"], half=("h", "pg"))
    r.batch("t", 0, [b"a"], tx=("a", 0, 0))
    refused(r, EntryType.CONTROL, msgpack.packb(record), code)


@pytest.mark.parametrize("rec", [
    TxOffsets("a", 1, 2, "cg", (("t", 0, 3),), 4), TxMarker("a", 1, 2, True, 3),
    TxMarkers((TxMarker("a", 1, 2, True, 3), TxMarker("b", 0, 0, False, 0))),
    HalfEnd("h", False, "operator", ""), HalfChecked("h", 5),
])
def test_records_round_trip(rec: Any) -> None:
    assert type(rec).decode(rec.encode()) == rec
    assert rec.describe().startswith(rec.op)


def test_constructing_an_invalid_record_raises() -> None:
    with pytest.raises(Refused):
        TxMarker("a", 0, 0, True, -1)
    with pytest.raises(Refused):
        HalfEnd("h", True, "check", "")


# ---------------------------------------------------------------------- snapshot and ring


def test_snapshot_round_trip_matches_a_straight_run(r: Replica) -> None:
    r.batch("t", 0, [b"a", b"b"], tx=("tid", 0, 0), pid=4, seq=0)
    r.batch("u", 0, [OutgoingMessage(b"k", key="key", tags="x")], tx=("tid", 0, 0))  # type: ignore[list-item]
    r.control(TxOffsets("tid", 0, 0, "cg", (("t", 1, 9),), 70).encode())
    r.batch("t", 1, [b"h"], half=("h1", "pg"))
    r.control(HalfChecked("h1", 6000).encode())
    r.batch("t", 1, [b"g"], half=("h2", "pg"))
    r.control(HalfEnd("h2", True, "client", "pg").encode())
    r.control(TxMarker("old", 0, 0, False, 3).encode())
    snap = r.state.snapshot()
    restored = BrokerState.restore("g1", snap)
    assert restored.snapshot() == snap
    # both go on alike
    later = [TxMarker("tid", 0, 0, True, 0).encode(), HalfEnd("h1", True, "check", "pg").encode()]
    for i, data in enumerate(later, r.index + 1):
        a = r.state.apply(Entry(i, 1, EntryType.CONTROL, data))
        b = restored.apply(Entry(i, 1, EntryType.CONTROL, data))
        assert a == b
    assert restored.snapshot() == r.state.snapshot()
    assert restored.keys("u", "key") == r.state.keys("u", "key") == [(0, 0)]


def test_a_snapshot_with_a_bad_txpart_section_is_refused(r: Replica) -> None:
    r.batch("t", 0, [b"a"], tx=("tid", 0, 0))
    d = msgpack.unpackb(r.state.snapshot(), raw=False, strict_map_key=False)
    for part in d["parts"]:
        if part[0] == "txpart":
            part[2]["prepared"][0][0] = ["z", 1]
    with pytest.raises(ValueError):
        BrokerState.restore("g1", msgpack.packb(d))


def test_the_decision_ring_forgets_the_oldest(r: Replica,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txpart, "DECISIONS", 3)
    for n in range(5):
        r.control(TxMarker("tid", 0, n, True, 0).encode())
    assert [k[3] for k in r.state.txpart.decided] == [2, 3, 4]


# ---------------------------------------------------------------------- mutations


def test_a_node_hands_the_transaction_mutations_to_its_states(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker.config import cluster_configs
    from broker.node import Node

    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    cfg = cluster_configs(tmp_path, nodes=3, groups=1, port_base=21300,
                          env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                          test_mutations=["serve-prepared", "no-fencing",
                                          "commit-before-durable-prepare"])[0]
    node = Node(cfg)
    state = node.groups["g0"].machine
    assert state.mutations == {"serve-prepared", "no-fencing"}
    assert state.txpart.serve_prepared and state.txpart.no_fencing and state.txcoord.no_fencing
    restored = node._restore_state("g0", state.snapshot())  # a snapshot install or restart
    assert restored.txpart.serve_prepared and restored.txcoord.no_fencing
    plain = Node(cluster_configs(tmp_path / "p", nodes=3, groups=1, port_base=21300)[0])
    p = plain.groups["g0"].machine
    assert not (p.mutations or p.txpart.serve_prepared or p.txpart.no_fencing)


def test_one_producer_group_cannot_fill_the_groups_open_slots(
        r: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 #5: a producer group that prepares half messages and never ends them
    filled all MAX_OPEN slots of the group, and every other producer's transactional
    send got TX_LIMIT. Each producer group holds at most MAX_OPEN_HALVES undecided."""
    monkeypatch.setattr(txpart, "MAX_OPEN_HALVES", 2)
    r.batch("t", 0, [b"a"], half=("a1", "greedy"))
    r.batch("t", 0, [b"b"], half=("a2", "greedy"))
    refused(r, EntryType.MESSAGES,
            STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"c"], half=("a3", "greedy")),
            Code.TX_LIMIT)
    assert r.batch("t", 0, [b"more of a1"], half=("a1", "greedy")).base_offset == -1
    assert r.batch("t", 0, [b"x"], half=("b1", "polite")).base_offset == -1
    assert r.batch("t", 1, [b"k"], tx=("tid", 0, 0)).base_offset == -1
    # a decision frees a slot; the count survives a snapshot (it is derived on load)
    r.control(HalfEnd("a1", False, "client", "greedy").encode())
    restored = Replica()
    restored.state = BrokerState.restore("g1", r.state.snapshot())
    restored.index, restored.data = r.index, r.data
    for rep in (r, restored):
        assert rep.batch("t", 0, [b"c"], half=("a3", "greedy")).base_offset == -1
        refused(rep, EntryType.MESSAGES,
                STORED_PREFIX.pack(1) + encode_batch("t", 0, [b"d"], half=("a4", "greedy")),
                Code.TX_LIMIT)
    # a deleted topic's halves free their slots too
    r.control(control_delete_topic("t"))
    r.control(control_create_topic("t", 2, [0, 1]))
    assert r.batch("t", 0, [b"e"], half=("a5", "greedy")).base_offset == -1


# ---------------------------------------------------------------------- idle fences

DAY = 86_400_000


def test_a_fence_idle_for_the_expiration_with_nothing_prepared_is_forgotten(r: Replica) -> None:
    """Each marker stamps its id's fence with the leader's clock; `tx_forget_fences`
    drops the fences idle that long, never one whose id still has data prepared here."""
    part = r.state.txpart
    r.control(TxMarker("done", 0, 0, True, 3, ts=1_000).encode())
    r.batch("t", 0, [b"a"], tx=("busy", 1, 0))
    r.control(TxMarker("busy", 1, 0, True, 1, ts=2_000).encode())
    r.batch("t", 0, [b"b"], tx=("busy", 1, 1))  # its next transaction: still prepared
    r.control(TxMarkers((TxMarker("other", 0, 0, False, 0),), ts=3_000).encode())
    r.control(TxMarker("legacy", 0, 0, False, 5).encode())  # no time: never forgotten
    assert part.idle_fences(100 * DAY) == ["done", "other"]
    assert part.idle_fences(100 * DAY, limit=1) == ["done"]
    restored = BrokerState.restore("g1", r.state.snapshot()).txpart
    assert restored.idle_fences(100 * DAY) == ["done", "other"]
    assert r.control(TxForgetFences(("done", "other"), 1_000 + DAY - 1, DAY).encode()).dup
    res = r.control(TxForgetFences(("done", "busy", "other", "legacy", "never"), 2_000 + DAY,
                                   DAY).encode())
    assert res == ControlResult("tx_forget_fences", 1)
    assert (part.fence("done"), part.fence("busy"), part.fence("other"),
            part.fence("legacy")) == (-1, 1, 0, 5)
    # once its data is decided, busy's fence is idle from its last marker
    r.control(TxMarker("busy", 1, 1, False, 1, ts=4_000).encode())
    assert part.idle_fences(100 * DAY) == ["busy", "other"]
    assert r.control(TxForgetFences(("busy", "other"), 4_000 + DAY, DAY).encode()).applied == 2
    assert part.fences == {"legacy": 5} and part.idle_fences(100 * DAY) == []


def test_fences_written_without_their_time_still_load(r: Replica) -> None:
    r.control(TxMarker("a", 0, 0, True, 2, ts=1_000).encode())
    snap = msgpack.unpackb(r.state.snapshot(), raw=False)
    [part] = [p for p in snap["parts"] if p[0] == "txpart"]
    assert part[1] == 2 and part[2]["fences"] == [["a", 2, 1_000]]
    part[1], part[2]["fences"] = 1, [["a", 2]]
    old = BrokerState.restore("g1", msgpack.packb(snap)).txpart
    assert old.fence("a") == 2 and old.idle_fences(100 * DAY) == []
    part[1] = 3
    with pytest.raises(ValueError, match="txpart"):
        BrokerState.restore("g1", msgpack.packb(snap))


@pytest.mark.parametrize("record", [
    {"op": "tx_forget_fences", "tids": [], "ts": 1, "after_ms": 1},
    {"op": "tx_forget_fences", "tids": ["a"], "ts": 1, "after_ms": 0},
    {"op": "tx_forget_fences", "tids": [7], "ts": 1, "after_ms": 1},
    {"op": "tx_marker", "tid": "a", "epoch": 0, "n": 0, "commit": True, "fence": 0, "ts": -1},
    {"op": "tx_markers", "markers": [["a", 0, 0, True, 0]], "ts": "now"},
])
def test_a_malformed_expiry_or_marker_time_is_refused_and_changes_nothing(
        r: Replica, record: dict[str, Any]) -> None:
    r.control(TxMarker("a", 0, 0, True, 0, ts=5).encode())
    before = sections(r.state)
    res = r.control(msgpack.packb(record))
    assert isinstance(res, ErrorResult) and res.code == Code.MALFORMED, res
    assert sections(r.state) == before
