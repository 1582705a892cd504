"""The broker state machine's parts: their records, the dispatch table, snapshot sections,
and the snapshot formats of earlier releases."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlRecord, ControlResult, Handler, Part, Refused, int_field
from broker.state.statemachine import (
    PARTS,
    BrokerState,
    CommitOffsets,
    CreateTopic,
    DeleteTopic,
    ErrorResult,
    ProduceResult,
    Retain,
    control_create_topic,
    control_delete_topic,
    control_offsets,
)
from raftlog.types import Entry, EntryType
from tests.broker.state.test_statemachine import PRELUDE, _op_entry, ops
from wire.protocol import Code
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

# Written by the release before parts (snapshot version 2) after these entries:
# create_topic t (2 queues, both hosted); t/0: 2 messages (key k, tags x), pid 7 seq 0;
# t/1: 1 message (key k); offsets cg t/0=1 req (3, 1); retain 3; t/0: 1 message pid 7 seq 1.
V2_SNAPSHOT = bytes.fromhex(
    "8ba17602a567726f7570a26731a76170706c69656406a872657461696e656403a8636f756e74657273920467"
    "a6746f706963739193a17402920001a67175657565739294a1740002c41c00000000000000060000002b0000"
    "00190000000000000000000003ea94a1740100c41c00000000000000030000002b0000001a00000000000000"
    "00000003e9a76f6666736574739194a26367a1740001a970726f647563657273919507a1740001919401020106"
    "a46b6579739193a174a16b9101a7636c69656e7473919403ff04919401a76f6666736574730100"
)
V2_ENTRIES = [
    (EntryType.CONTROL, control_create_topic("t", 2, [0, 1])),
    (EntryType.MESSAGES, STORED_PREFIX.pack(1000) + encode_batch(
        "t", 0, [OutgoingMessage(b"a", key="k", tags="x"), OutgoingMessage(b"b")], pid=7, seq=0)),
    (EntryType.MESSAGES, STORED_PREFIX.pack(1001) + encode_batch(
        "t", 1, [OutgoingMessage(b"c", key="k")])),
    (EntryType.CONTROL, control_offsets("cg", [("t", 0, 1)], req=(3, 1))),
    (EntryType.CONTROL, Retain(3).encode()),
    (EntryType.MESSAGES, STORED_PREFIX.pack(1002) + encode_batch(
        "t", 0, [OutgoingMessage(b"d")], pid=7, seq=1)),
]


def _run(state: BrokerState, entries: list[tuple[EntryType, bytes]], start: int = 1) -> list[Any]:
    return [state.apply(Entry(start + i, 1, t, d)) for i, (t, d) in enumerate(entries)]


def test_a_version_2_snapshot_restores_to_the_state_a_straight_run_reaches() -> None:
    straight = BrokerState("g1")
    _run(straight, V2_ENTRIES)
    restored = BrokerState.restore("g1", V2_SNAPSHOT)
    assert restored.snapshot() == straight.snapshot()
    assert restored.applied_index == 6 and restored.retained_index == 3
    assert restored.queue_range("t", 0) == (2, 3) and restored.queue_range("t", 1) == (0, 1)
    assert restored.keys("t", "k") == [(1, 0)]
    assert restored.consumer_offset("cg", "t", 0) == 1
    # what the snapshot remembered still deduplicates: a producer retry and a client retry
    later = [
        (EntryType.MESSAGES, V2_ENTRIES[5][1]),
        (EntryType.CONTROL, control_offsets("cg", [("t", 0, 0)], req=(3, 1))),
    ]
    assert _run(restored, later, 7) == _run(straight, later, 7)
    assert restored.consumer_offset("cg", "t", 0) == 1
    r = _run(restored, later[:1], 9)[0]
    assert isinstance(r, ProduceResult) and r.dup and r.base_offset == 2


def test_a_version_1_snapshot_restores_without_clients() -> None:
    old = msgpack.unpackb(V2_SNAPSHOT, raw=False, strict_map_key=False)
    old["v"] = 1
    del old["clients"]
    s = BrokerState.restore("g1", msgpack.packb(old, use_bin_type=True))
    assert s.consumer_offset("cg", "t", 0) == 1 and s.queue_range("t", 0) == (2, 3)
    # no clients known: the retry applies again (what version 1 replicas did)
    _run(s, [(EntryType.CONTROL, control_offsets("cg", [("t", 0, 0)], req=(3, 1)))], 7)
    assert s.consumer_offset("cg", "t", 0) == 0


def test_snapshots_have_one_versioned_section_per_part_in_order() -> None:
    s = BrokerState("g1")
    _run(s, V2_ENTRIES)
    d = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    assert d["v"] == 3
    assert [(name, version) for name, version, _ in d["parts"]] == [
        (p.name, p.version) for p in PARTS]


@pytest.mark.parametrize("mangle", [
    lambda d: d["parts"].append(["nobody", 1, []]),  # a part this release does not have
    lambda d: d["parts"].append(d["parts"][0]),  # a section twice
    lambda d: d["parts"][0].__setitem__(1, 99),  # a section version from the future
    lambda d: d["parts"].pop(0),  # queues without the topics they belong to
])
def test_snapshots_with_bad_sections_are_refused(mangle: Any) -> None:
    s = BrokerState("g1")
    _run(s, V2_ENTRIES)
    d = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    mangle(d)
    with pytest.raises(ValueError):
        BrokerState.restore("g1", msgpack.packb(d, use_bin_type=True))


# ---------------------------------------------------------------------- records


def _on_disk(**fields: Any) -> bytes:
    """A control entry as the log has always held it: the msgpack map, "op" first."""
    data: bytes = msgpack.packb(fields, use_bin_type=True)
    return data


@pytest.mark.parametrize(("record", "legacy"), [
    (CreateTopic("t", 4, (0, 2)), _on_disk(op="create_topic", topic="t", queues=4,
                                           hosted=[0, 2])),
    (DeleteTopic("t"), _on_disk(op="delete_topic", topic="t")),
    (CommitOffsets("cg", (("t", 0, 5), ("u", 1, 0))),
     _on_disk(op="offsets", cg="cg", offsets=[["t", 0, 5], ["u", 1, 0]])),
    (Retain(17), _on_disk(op="retain", min_index=17)),
])
def test_records_encode_as_the_entries_already_on_disk(record: ControlRecord,
                                                       legacy: bytes) -> None:
    assert record.encode() == legacy
    assert type(record).decode(legacy) == record
    assert record.describe().startswith(record.op + " ")


def test_a_record_with_a_request_id_encodes_the_envelope() -> None:
    rec = CommitOffsets("cg", (("t", 0, 5),))
    assert rec.encode(req=(4, 1)) == _on_disk(op="offsets", cg="cg", offsets=[["t", 0, 5]],
                                              req=[4, 1])
    assert rec.encode(req=(4, 1)) == control_offsets("cg", [("t", 0, 5)], req=(4, 1))


@pytest.mark.parametrize(("make", "code"), [
    (lambda: CreateTopic("bad name!", 1, (0,)), Code.INVALID_NAME),
    (lambda: CreateTopic("t", 0, (0,)), Code.MALFORMED),
    (lambda: CreateTopic("t", 2, ()), Code.MALFORMED),
    (lambda: CreateTopic("t", 2, (0, 0)), Code.MALFORMED),
    (lambda: CreateTopic("t", 2, (1, 0)), Code.MALFORMED),
    (lambda: CreateTopic("t", 2, (2,)), Code.MALFORMED),
    (lambda: CommitOffsets("bad cg", ()), Code.INVALID_NAME),
    (lambda: CommitOffsets("cg", (("t", 0, -1),)), Code.MALFORMED),
    (lambda: Retain(-1), Code.MALFORMED),
    (lambda: DeleteTopic(3), Code.MALFORMED),  # type: ignore[arg-type]
])
def test_invalid_records_cannot_be_made(make: Any, code: Code) -> None:
    with pytest.raises(Refused) as e:
        make()
    assert e.value.code == code


def test_decode_refuses_other_records_and_garbage() -> None:
    with pytest.raises(Refused):
        Retain.decode(control_delete_topic("t"))
    with pytest.raises(Refused):
        Retain.decode(b"\xc1")
    with pytest.raises(Refused):
        Retain.decode(msgpack.packb({"op": "retain", "min_index": "x"}))


# ---------------------------------------------------------------------- a new part


@dataclass(frozen=True, slots=True)
class Add(ControlRecord):
    op: ClassVar[str] = "tally_add"
    n: int

    def validate(self) -> None:
        int_field("n", self.n, 1, 100)

    def to_map(self) -> dict[str, Any]:
        return {"n": self.n}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Add:
        return cls(d.get("n"))  # type: ignore[arg-type]


class Tally(Part):
    """A part a later feature could add: its own record, handler, hooks and section."""

    name = "tally"
    records = (Add,)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.total = 0
        self.deleted: list[str] = []

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {Add.op: (Add, self._add)}

    def _add(self, rec: Add, index: int) -> ControlResult:
        self.total += rec.n
        return ControlResult(Add.op, rec.n)

    def topic_deleted(self, config: Any) -> None:
        self.deleted.append(config.name)

    def section(self) -> Any:
        return [self.total, list(self.deleted)]

    def load(self, version: int, section: Any) -> None:
        self.total, deleted = section
        self.deleted = list(deleted)


class WithTally(BrokerState):
    part_types = (*PARTS, Tally)


def test_a_new_part_slots_in_beside_the_others() -> None:
    s = WithTally("g1")
    _run(s, V2_ENTRIES)
    more = [(EntryType.CONTROL, Add(5).encode(req=(9, 1))),
            (EntryType.CONTROL, Add(5).encode(req=(9, 1))),  # a retry: deduplicated
            (EntryType.CONTROL, msgpack.packb({"op": "tally_add", "n": 0})),
            (EntryType.CONTROL, control_delete_topic("t"))]
    results = _run(s, more, 7)
    assert results[:2] == [ControlResult("tally_add", 5), ControlResult("tally_add", 5, dup=True)]
    assert isinstance(results[2], ErrorResult) and results[2].code == Code.MALFORMED
    tally = s.part(Tally)
    assert (tally.total, tally.deleted) == (5, ["t"])
    again = WithTally.restore("g1", s.snapshot())
    assert again.snapshot() == s.snapshot() and again.part(Tally).total == 5
    # a snapshot from before the part existed restores with the part empty
    assert WithTally.restore("g1", V2_SNAPSHOT).part(Tally).total == 0
    # without the part, its records are unknown ops, refused without change
    plain = BrokerState("g1")
    _run(plain, V2_ENTRIES)
    r = plain.apply(Entry(7, 1, EntryType.CONTROL, Add(5).encode()))
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_two_parts_claiming_one_op_is_an_error() -> None:
    class Twice(Tally):
        name = "twice"

    class Clash(BrokerState):
        part_types = (*PARTS, Tally, Twice)

    with pytest.raises(TypeError, match="tally_add"):
        Clash("g1")


class Holder(Part):
    """A part that holds the batches of topic "held" itself (the apply seam), as a timer
    or retry part will hold the batches addressed to it; at most 3 messages a batch."""

    name = "holder"
    claims_plain = True  # its batches are ordinary ones

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.held: list[tuple[int, int]] = []  # (index, messages)

    def claims_batch(self, header: Any) -> bool:
        return bool(header.topic == "held")

    def hold_batch(self, header: Any, refs: list[Any], index: int, store_ms: int) -> None:
        if len(refs) > 3:
            raise Refused(Code.MALFORMED, "at most 3 held messages a batch")
        self.held.append((index, len(refs)))

    def section(self) -> Any:
        return [list(h) for h in self.held]

    def load(self, version: int, section: Any) -> None:
        self.held = [(i, n) for i, n in section]


class WithHolder(BrokerState):
    part_types = (*PARTS, Holder)


def test_a_part_holds_the_batches_it_claims_after_the_composite_checked_them() -> None:
    s = WithHolder("g1")

    def batch(topic: str, n: int, seq: int) -> tuple[EntryType, bytes]:
        return EntryType.MESSAGES, STORED_PREFIX.pack(1000) + encode_batch(
            topic, 0, [OutgoingMessage(b"m%d" % i) for i in range(n)], pid=7, seq=seq)

    entries = [(EntryType.CONTROL, control_create_topic("held", 1, [0])),
               (EntryType.CONTROL, control_create_topic("t", 1, [0])),
               batch("held", 2, 0),
               batch("held", 2, 0),  # a producer's retry: the composite's dedup answers it
               batch("held", 4, 1),  # refused by the part: changes nothing
               batch("held", 1, 1),
               batch("t", 1, 0)]
    results = _run(s, entries)
    assert results[2] == ProduceResult(-1, 2, 3)
    assert isinstance(results[3], ProduceResult) and results[3].dup
    assert isinstance(results[4], ErrorResult) and results[4].code == Code.MALFORMED
    assert results[5] == ProduceResult(-1, 1, 6)  # seq 1 still free: the refusal took none
    assert results[6] == ProduceResult(0, 1, 7)  # other topics go to their queues
    assert s.part(Holder).held == [(3, 2), (6, 1)]
    assert s.queue_range("held", 0) == (0, 0)
    again = WithHolder.restore("g1", s.snapshot())
    assert again.part(Holder).held == s.part(Holder).held
    # without the part, the same batches go to their queue
    plain = BrokerState("g1")
    assert _run(plain, entries)[2] == ProduceResult(0, 2, 3)
    # and a transaction's prepared batch is claimed by the participant through the seam
    assert s.txpart.claims_batch(type("H", (), {"tx": ("tid", 0, 1), "half": None})())


# ---------------------------------------------------------------------- properties

_tally_ops = st.one_of(
    st.tuples(st.just("tally"), st.integers(0, 101), st.sampled_from([None, (7, 1), (7, 2)])),
    st.tuples(st.just("op"), ops),
)


def _tally_entry(op: tuple[Any, ...]) -> tuple[EntryType, bytes]:
    if op[0] == "tally":
        _, n, req = op
        d: dict[str, Any] = {"op": Add.op, "n": n}
        if req is not None:
            d["req"] = list(req)
        return EntryType.CONTROL, msgpack.packb(d, use_bin_type=True)
    return _op_entry(op[1])


def _sections(state: BrokerState, *leave_out: str) -> dict[str, Any]:
    d = msgpack.unpackb(state.snapshot(), raw=False, strict_map_key=False)
    return {name: section for name, _, section in d["parts"] if name not in leave_out}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_tally_ops, min_size=1, max_size=40), st.data())
def test_a_new_part_changes_nothing_for_the_others_and_resumes_exactly(
    op_list: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    entries = [_op_entry(op) for op in PRELUDE] + [_tally_entry(op) for op in op_list]
    with_part, plain = WithTally("g"), BrokerState("g")
    results = _run(with_part, entries)
    # The other parts answer every entry of theirs exactly as without the new part (the
    # tallies use a client id of their own) and end in the same state.
    is_tally = [op[0] == "tally" for op in [("op",)] * len(PRELUDE) + op_list]
    for tally, r_with, r_plain in zip(is_tally, results, _run(plain, entries), strict=True):
        if not tally:
            assert r_with == r_plain
    assert _sections(with_part, "tally", "requests") == _sections(plain, "requests")
    final = with_part.snapshot()
    cut = data.draw(st.integers(0, len(entries)), label="cut")
    first = WithTally("g")
    _run(first, entries[:cut])
    resumed = WithTally.restore("g", first.snapshot())
    assert _run(resumed, entries[cut:], cut + 1) == results[cut:]
    assert resumed.snapshot() == final


def test_a_part_must_handle_exactly_the_records_it_declares() -> None:
    class Silent(Tally):
        name = "silent"

        def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
            return {}

    class Mute(BrokerState):
        part_types = (*PARTS, Silent)

    with pytest.raises(TypeError, match="silent"):
        Mute("g1")


def test_committed_offsets_are_kept_for_a_bounded_number_of_consumer_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumer group names are the client's choice and every replica keeps their offsets:
    a commit for one group more than `MAX_CONSUMER_GROUPS` is refused (MALFORMED) and
    changes nothing; known groups keep committing; deleting a group (or a topic) makes
    room; a restored snapshot counts the same."""
    from broker.state.parts import offsets
    from broker.state.parts.base import ErrorResult
    from broker.state.statemachine import control_delete_group

    monkeypatch.setattr(offsets, "MAX_CONSUMER_GROUPS", 2)
    s = BrokerState("g1")
    _run(s, [(EntryType.CONTROL, control_create_topic("t", 2, [0, 1])),
             (EntryType.CONTROL, control_create_topic("u", 1, [0])),
             (EntryType.CONTROL, control_offsets("a", [("t", 0, 0), ("t", 1, 0)])),
             (EntryType.CONTROL, control_offsets("b", [("t", 0, 0)]))])
    before = s.consumer_offsets()
    [refused] = _run(s, [(EntryType.CONTROL, control_offsets("c", [("t", 0, 0)]))], 5)
    assert isinstance(refused, ErrorResult) and refused.code == Code.MALFORMED
    assert "at most 2 consumer groups" in refused.message
    assert s.consumer_offset("c", "t", 0) is None and s.consumer_offsets() == before
    again = _run(s, [(EntryType.CONTROL, control_offsets("a", [("t", 0, 0), ("u", 0, 0)]))], 6)
    assert not isinstance(again[0], ErrorResult)
    restored = BrokerState.restore("g1", s.snapshot())
    for state in (s, restored):
        _run(state, [(EntryType.CONTROL, control_delete_group("b"))], 7)
        [ok] = _run(state, [(EntryType.CONTROL, control_offsets("c", [("t", 0, 0)]))], 8)
        assert not isinstance(ok, ErrorResult) and state.consumer_offset("c", "t", 0) == 0
        [full] = _run(state, [(EntryType.CONTROL, control_offsets("d", [("t", 0, 0)]))], 9)
        assert isinstance(full, ErrorResult)
        _run(state, [(EntryType.CONTROL, control_delete_topic("t"))], 10)  # c had only t
        [room] = _run(state, [(EntryType.CONTROL, control_offsets("d", [("u", 0, 0)]))], 11)
        assert not isinstance(room, ErrorResult)
