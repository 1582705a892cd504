"""The transaction coordinator part: epochs and fencing, the states of a transaction,
idempotent ends, refusals that change nothing, and its snapshot section."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from broker.state.parts import txcoord
from broker.state.parts.base import ControlResult, ErrorResult
from broker.state.parts.txcoord import TxAdd, TxComplete, TxEnd, TxExpire, TxInit, TxnState
from broker.state.parts.txpart import TxMarker
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.types import Entry, EntryType
from tests.broker.transactions.test_participant_part import Replica, sections
from wire.protocol import Code
from wire.txn import kafka_key


def ctl(rep: Replica, rec: Any) -> Any:
    return rep.control(rec.encode())


def refused(rep: Replica, data: bytes, code: Code) -> None:
    before = sections(rep.state)
    res = rep.control(data)
    assert isinstance(res, ErrorResult) and res.code == code, res
    assert sections(rep.state) == before


def state(rep: Replica, tid: str = "tid") -> TxnState:
    t = rep.state.txcoord.txn(tid)
    assert t is not None
    return t


def test_init_counts_epochs_from_zero() -> None:
    r = Replica()
    assert r.state.txcoord.txn("tid") is None
    for epoch in range(3):
        assert ctl(r, TxInit("tid", 60_000, 100 + epoch)) == ControlResult("tx_init", 1)
        t = state(r)
        assert (t.epoch, t.n, t.state, t.timeout_ms) == (epoch, 0, "empty", 60_000)


def test_a_transaction_from_add_to_complete() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    assert ctl(r, TxAdd("tid", 0, 0, ("g2", "g1"), 10)) == ControlResult("tx_add", 2)
    assert ctl(r, TxAdd("tid", 0, 0, ("g3", "g1"), 11)) == ControlResult("tx_add", 1)
    assert ctl(r, TxAdd("tid", 0, 0, ("g1",), 12)).dup
    t = state(r)
    assert (t.state, t.participants, t.started_ms) == ("ongoing", ("g1", "g2", "g3"), 10)
    assert r.state.txcoord.ongoing() == [t]
    assert ctl(r, TxEnd("tid", 0, 0, True, 50, "client")) == ControlResult("tx_end", 1)
    t = state(r)
    assert (t.state, t.decided_ms, t.reason) == ("prepare_commit", 50, "client")
    assert r.state.txcoord.unfinished() == [t] and r.state.txcoord.ongoing() == []
    # the same decision again is a duplicate; the other one is refused
    assert ctl(r, TxEnd("tid", 0, 0, True, 51, "client")).dup
    refused(r, TxEnd("tid", 0, 0, False, 52, "client").encode(), Code.TX_DECIDED)
    # no init while markers go out (the next transaction may start: see below)
    refused(r, TxInit("tid", 60_000, 53).encode(), Code.BUSY)
    assert ctl(r, TxComplete("tid", 0, 0)) == ControlResult("tx_complete", 1)
    assert ctl(r, TxComplete("tid", 0, 0)).dup
    assert state(r).state == "complete_commit" and r.state.txcoord.unfinished() == []
    done = r.state.txcoord.done_ring()
    assert [(d.tid, d.n, d.commit, d.participants) for d in done] == [
        ("tid", 0, True, ("g1", "g2", "g3"))]
    refused(r, TxEnd("tid", 0, 0, False, 60, "client").encode(), Code.TX_DECIDED)
    # the next one is n + 1, nothing else
    refused(r, TxAdd("tid", 0, 2, ("g1",), 61).encode(), Code.TX_UNKNOWN)
    assert ctl(r, TxAdd("tid", 0, 1, ("g1",), 62)).applied == 1
    assert state(r).n == 1


def test_the_next_transaction_starts_while_markers_go_out() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxAdd("tid", 0, 0, ("g1", "g2"), 1))
    ctl(r, TxEnd("tid", 0, 0, True, 2, "client"))
    first = state(r)
    # n + 1 starts; n is kept aside until its tx_complete, still a duty of the leader
    assert ctl(r, TxAdd("tid", 0, 1, ("g3",), 3)).applied == 1
    t = state(r)
    assert (t.n, t.state, t.participants) == (1, "ongoing", ("g3",))
    assert r.state.txcoord.unfinished() == [first]
    assert r.state.txcoord.find("tid", 0, 0) == first
    # its decision stays as it was
    assert ctl(r, TxEnd("tid", 0, 0, True, 4, "client")).dup
    refused(r, TxEnd("tid", 0, 0, False, 4, "client").encode(), Code.TX_DECIDED)
    # at most one aside: n + 2 waits while both n and n + 1 are still completing
    ctl(r, TxEnd("tid", 0, 1, False, 5, "client"))
    refused(r, TxAdd("tid", 0, 2, ("g1",), 6).encode(), Code.BUSY)
    refused(r, TxEnd("tid", 0, 2, True, 6, "client", ("g1",)).encode(), Code.BUSY)
    refused(r, TxInit("tid", 60_000, 6).encode(), Code.BUSY)
    assert [(u.n, u.state) for u in r.state.txcoord.unfinished()] == [
        (0, "prepare_commit"), (1, "prepare_abort")]
    # the snapshot keeps the one aside
    restored = BrokerState.restore("g1", r.state.snapshot())
    assert restored.txcoord.unfinished() == r.state.txcoord.unfinished()
    assert ctl(r, TxComplete("tid", 0, 0)).applied == 1
    assert r.state.txcoord.find("tid", 0, 0) is None
    assert [(d.n, d.commit) for d in r.state.txcoord.done_ring()] == [(0, True)]
    assert ctl(r, TxAdd("tid", 0, 2, ("g1",), 7)).applied == 1  # n + 1 moves aside now
    assert ctl(r, TxComplete("tid", 0, 1)).applied == 1
    assert r.state.txcoord.unfinished() == [] and state(r).n == 2


def test_an_end_names_groups_the_coordinator_never_registered() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxAdd("tid", 0, 0, ("g1",), 1))
    # the decision covers the union of the registered groups and those the client names
    ctl(r, TxEnd("tid", 0, 0, True, 2, "client", ("g3", "g2")))
    assert state(r).participants == ("g1", "g2", "g3")
    ctl(r, TxComplete("tid", 0, 0))
    # an end of a transaction whose TX_ADD never applied starts and decides it at once,
    # its markers going to the groups it names
    assert ctl(r, TxEnd("tid", 0, 1, False, 3, "client", ("g2",))).applied == 1
    t = state(r)
    assert (t.n, t.state, t.participants) == (1, "prepare_abort", ("g2",))
    assert r.state.txcoord.unfinished() == [t]
    refused(r, TxAdd("tid", 0, 1, ("g1",), 4).encode(), Code.TX_DECIDED)  # a late TX_ADD
    ctl(r, TxComplete("tid", 0, 1))
    too_many = [f"g{i}" for i in range(txcoord.MAX_PARTICIPANTS + 1)]
    refused(r, msgpack.packb({"op": "tx_end", "tid": "tid", "epoch": 0, "n": 2,
                              "commit": True, "ts": 5, "reason": "client",
                              "groups": too_many}), Code.TX_LIMIT)
    # the union counts: registered and named together over the limit is refused too
    ctl(r, TxAdd("tid", 0, 2, tuple(too_many[:60]), 6))
    refused(r, TxEnd("tid", 0, 2, True, 7, "client", tuple(too_many[60:])).encode(),
            Code.TX_LIMIT)
    assert state(r).state == "ongoing"


def test_an_end_without_participants_completes_at_once() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxEnd("tid", 0, 0, False, 5, "client"))  # nothing added at all
    assert state(r).state == "complete_abort"
    ctl(r, TxAdd("tid", 0, 1, (), 6))
    ctl(r, TxEnd("tid", 0, 1, True, 7, "client"))
    assert state(r).state == "complete_commit" and r.state.txcoord.unfinished() == []
    assert len(r.state.txcoord.done_ring()) == 2


def test_a_new_epoch_fences_an_ongoing_transaction() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxAdd("tid", 0, 0, ("g1", "g2"), 1))
    ctl(r, TxInit("tid", 60_000, 2))
    t = state(r)
    assert (t.epoch, t.n, t.state) == (1, 0, "empty")
    [old] = r.state.txcoord.unfinished()
    assert (old.epoch, old.n, old.state, old.reason) == (0, 0, "prepare_abort", "fenced")
    # the zombie can neither add nor end; a third init waits for the abort to finish
    refused(r, TxAdd("tid", 0, 0, ("g3",), 3).encode(), Code.TX_FENCED)
    refused(r, TxEnd("tid", 0, 0, True, 3, "client").encode(), Code.TX_FENCED)
    refused(r, TxInit("tid", 60_000, 3).encode(), Code.BUSY)
    refused(r, TxAdd("tid", 5, 0, ("g3",), 3).encode(), Code.TX_UNKNOWN)  # no such epoch
    assert ctl(r, TxComplete("tid", 0, 0)).applied == 1
    assert r.state.txcoord.unfinished() == []
    assert r.state.txcoord.done_ring()[-1].reason == "fenced"
    assert ctl(r, TxInit("tid", 60_000, 4)).applied == 1 and state(r).epoch == 2


def test_no_fencing_mutation_lets_an_old_epoch_act() -> None:
    r = Replica(mutations=("no-fencing",))
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxInit("tid", 60_000, 1))
    assert ctl(r, TxAdd("tid", 0, 0, ("g1",), 2)).applied == 1
    assert isinstance(ctl(r, TxEnd("tid", 0, 0, True, 3, "client")), ControlResult)


def test_unknown_transactional_ids_and_limits() -> None:
    r = Replica()
    refused(r, TxAdd("nope", 0, 0, ("g1",), 0).encode(), Code.TX_UNKNOWN)
    refused(r, TxEnd("nope", 0, 0, True, 0, "client").encode(), Code.TX_UNKNOWN)
    assert ctl(r, TxComplete("nope", 0, 0)).dup
    ctl(r, TxInit("tid", 60_000, 0))
    many = tuple(f"g{i}" for i in range(txcoord.MAX_PARTICIPANTS))
    ctl(r, TxAdd("tid", 0, 0, many, 1))
    refused(r, TxAdd("tid", 0, 0, ("extra",), 2).encode(), Code.TX_LIMIT)


BAD = [
    {"op": "tx_init", "tid": "", "timeout_ms": 1, "ts": 0},
    {"op": "tx_init", "tid": "a", "timeout_ms": 0, "ts": 0},
    {"op": "tx_init", "tid": "a", "timeout_ms": txcoord.MAX_TIMEOUT_MS + 1, "ts": 0},
    {"op": "tx_add", "tid": "a", "epoch": 0, "n": 0, "groups": "g1", "ts": 0},
    {"op": "tx_add", "tid": "a", "epoch": 0, "n": 0, "groups": ["bad name"], "ts": 0},
    {"op": "tx_add", "tid": "a", "epoch": -1, "n": 0, "groups": [], "ts": 0},
    {"op": "tx_end", "tid": "a", "epoch": 0, "n": 0, "commit": "yes", "ts": 0,
     "reason": "client"},
    {"op": "tx_end", "tid": "a", "epoch": 0, "n": 0, "commit": True, "ts": 0, "reason": "why"},
    {"op": "tx_complete", "tid": "a", "epoch": 0},
    {"op": "tx_expire", "tids": [], "ts": 10, "after_ms": 1},
    {"op": "tx_expire", "tids": "a", "ts": 10, "after_ms": 1},
    {"op": "tx_expire", "tids": ["a", ""], "ts": 10, "after_ms": 1},
    {"op": "tx_expire", "tids": ["a"] * (txcoord.EXPIRE_BATCH + 1), "ts": 10, "after_ms": 1},
    {"op": "tx_expire", "tids": ["a"], "ts": 10, "after_ms": 0},
    {"op": "tx_expire", "tids": ["a"], "ts": -1, "after_ms": 1},
]


@pytest.mark.parametrize("record", BAD)
def test_a_malformed_record_is_refused_and_changes_nothing(record: dict[str, Any]) -> None:
    r = Replica()
    ctl(r, TxInit("a", 60_000, 0))
    ctl(r, TxAdd("a", 0, 0, ("g1",), 0))
    before = sections(r.state)
    res = r.control(msgpack.packb(record))
    assert isinstance(res, ErrorResult) and res.code in (Code.MALFORMED, Code.INVALID_NAME)
    assert sections(r.state) == before


def test_too_many_groups_in_one_record_is_a_limit() -> None:
    r = Replica()
    ctl(r, TxInit("a", 60_000, 0))
    groups = [f"g{i}" for i in range(txcoord.MAX_PARTICIPANTS + 1)]
    refused(r, msgpack.packb({"op": "tx_add", "tid": "a", "epoch": 0, "n": 0,
                              "groups": groups, "ts": 0}), Code.TX_LIMIT)


@pytest.mark.parametrize("rec", [
    TxInit("a", 5, 6), TxAdd("a", 1, 2, ("g1", "g2"), 3), TxEnd("a", 1, 2, False, 3, "timeout"),
    TxEnd("a", 1, 2, True, 3, "client", ("g1", "g2")),
    TxComplete("a", 1, 2), TxExpire(("a", "b"), 7, 8),
])
def test_records_round_trip(rec: Any) -> None:
    assert type(rec).decode(rec.encode()) == rec


def test_snapshot_round_trip_matches_a_straight_run() -> None:
    r = Replica()
    ctl(r, TxInit("b", 60_000, 0))
    ctl(r, TxAdd("b", 0, 0, ("g1",), 1))
    ctl(r, TxInit("a", 30_000, 0))
    ctl(r, TxAdd("a", 0, 0, ("g2", "g1"), 1))
    ctl(r, TxEnd("a", 0, 0, True, 2, "client"))
    ctl(r, TxInit("b", 60_000, 3))  # fences b's ongoing one
    ctl(r, TxInit("c", 60_000, 3))
    ctl(r, TxEnd("c", 0, 0, False, 4, "client"))
    snap = r.state.snapshot()
    restored = BrokerState.restore("g1", snap)
    assert restored.snapshot() == snap
    assert restored.txcoord.unfinished() == r.state.txcoord.unfinished()
    later = [TxComplete("a", 0, 0), TxComplete("b", 0, 0), TxAdd("b", 1, 0, ("g1",), 9)]
    for i, rec in enumerate(later, r.index + 1):
        e = Entry(i, 1, EntryType.CONTROL, rec.encode())
        assert r.state.apply(e) == restored.apply(e)
    assert restored.snapshot() == r.state.snapshot()
    assert restored.txcoord.done_ring() == r.state.txcoord.done_ring()


def test_a_version_1_section_still_loads_and_a_later_one_is_refused() -> None:
    r = Replica()
    ctl(r, TxInit("a", 60_000, 0))
    ctl(r, TxAdd("a", 0, 0, ("g1",), 1))
    snap = msgpack.unpackb(r.state.snapshot(), raw=False)
    [part] = [p for p in snap["parts"] if p[0] == "txcoord"]
    assert part[1] == 3 and "completing" not in part[2] and "floor" not in part[2]
    for older in (1, 2):  # as written before `completing`, and before `floor`, existed
        part[1] = older
        restored = BrokerState.restore("g1", msgpack.packb(snap))
        assert restored.txcoord.txn("a") == r.state.txcoord.txn("a")
    part[1] = 4
    with pytest.raises(ValueError, match="txcoord"):
        BrokerState.restore("g1", msgpack.packb(snap))


def test_what_a_tick_finds_due_survives_a_restore() -> None:
    """`timed_out` and `unfinished` are kept aside (by deadline, by state) rather than
    found by scanning every transactional id: a restored replica rebuilds them."""
    r = Replica()
    for tid, timeout in (("a", 100), ("b", 50), ("c", 100)):
        ctl(r, TxInit(tid, timeout, 0))
        ctl(r, TxAdd(tid, 0, 0, ("g2",), 10))
    ctl(r, TxEnd("c", 0, 0, True, 20, "client"))  # decided: not ongoing, unfinished
    for coord in (r.state.txcoord,
                  BrokerState.restore("g1", r.state.snapshot()).txcoord):
        assert coord.timed_out(60) == []
        assert [t.tid for t in coord.timed_out(61)] == ["b"]
        assert [t.tid for t in coord.timed_out(111)] == ["a", "b"]
        assert [t.tid for t in coord.unfinished()] == ["c"]
    ctl(r, TxAdd("b", 0, 0, ("g3",), 30))  # more participants: the same deadline
    ctl(r, TxEnd("a", 0, 0, False, 40, "client"))
    assert [t.tid for t in r.state.txcoord.timed_out(1000)] == ["b"]
    assert [t.tid for t in r.state.txcoord.unfinished()] == ["a", "c"]


def test_a_commit_after_the_timeout_abort_says_it_was_the_timeout() -> None:
    """A producer that commits too late learns why its transaction is gone: aborted by
    the coordinator at its transaction timeout, which the refusal names."""
    r = Replica()
    ctl(r, TxInit("tid", 1_500, 0))
    ctl(r, TxAdd("tid", 0, 0, ("g1",), 10))
    ctl(r, TxEnd("tid", 0, 0, False, 1_600, "timeout"))
    res = r.control(TxEnd("tid", 0, 0, True, 2_000, "client").encode())
    assert isinstance(res, ErrorResult) and res.code == Code.TX_DECIDED
    assert "aborted by the coordinator" in res.message
    assert "transaction timeout of 1500 ms" in res.message
    ctl(r, TxComplete("tid", 0, 0))
    res = r.control(TxEnd("tid", 0, 0, True, 2_100, "client").encode())
    assert isinstance(res, ErrorResult) and "transaction timeout of 1500 ms" in res.message


DAY = 86_400_000


def test_an_id_idle_for_the_expiration_is_forgotten_and_its_next_epoch_is_higher() -> None:
    """Kafka's transactional.id.expiration.ms: an id with nothing open, idle that long,
    goes (memory, snapshot); its next producer gets an epoch above any it had, so one
    of an old epoch stays fenced."""
    r = Replica()
    coord = r.state.txcoord
    for _ in range(3):  # epochs 0, 1, 2
        ctl(r, TxInit("old", 60_000, 1_000))
    ctl(r, TxAdd("old", 2, 0, ("g2",), 2_000))
    ctl(r, TxEnd("old", 2, 0, True, 3_000, "client"))
    ctl(r, TxComplete("old", 2, 0))  # idle since its decision at 3,000
    ctl(r, TxInit("fresh", 60_000, 5_000))  # idle since its init
    assert coord.idle_ids(3_000 - 1) == []
    assert coord.idle_ids(3_000) == ["old"]
    assert coord.idle_ids(5_000) == ["fresh", "old"]
    # a record whose time is short of the expiration for an id leaves that id alone
    assert ctl(r, TxExpire(("old", "fresh"), 3_000 + DAY - 1, DAY)).dup
    assert ctl(r, TxExpire(("old", "fresh", "never"), 4_000 + DAY, DAY)) == \
        ControlResult("tx_expire", 1)
    assert coord.txn("old") is None and coord.txn("fresh") is not None
    assert coord.floor == 3
    refused(r, TxAdd("old", 2, 1, ("g2",), 9_000).encode(), Code.TX_UNKNOWN)
    ctl(r, TxInit("old", 60_000, 10_000))
    assert state(r, "old").epoch == 3  # above all it had: the old producer stays fenced
    refused(r, TxAdd("old", 2, 1, ("g2",), 11_000).encode(), Code.TX_FENCED)
    ctl(r, TxInit("brand-new", 60_000, 10_000))
    assert state(r, "brand-new").epoch == 3  # the floor is one number for every id
    snap = r.state.snapshot()
    assert BrokerState.restore("g1", snap).txcoord.floor == 3


@pytest.mark.parametrize("busy", ["ongoing", "deciding", "completing", "fenced"])
def test_an_id_with_anything_open_or_unwritten_is_not_forgotten(busy: str) -> None:
    r = Replica()
    coord = r.state.txcoord
    ctl(r, TxInit("t", 60_000, 1_000))
    ctl(r, TxAdd("t", 0, 0, ("g2",), 2_000))
    if busy in ("deciding", "completing"):
        ctl(r, TxEnd("t", 0, 0, True, 3_000, "client"))  # markers still going out
    if busy == "completing":
        ctl(r, TxAdd("t", 0, 1, ("g2",), 4_000))  # the next one runs meanwhile
        ctl(r, TxEnd("t", 0, 1, False, 5_000, "client"))
        ctl(r, TxComplete("t", 0, 1))  # the current one complete, the first still aside
    if busy == "fenced":
        ctl(r, TxInit("t", 60_000, 3_000))  # fences the ongoing one, aborting aside
    far = 100 * DAY
    assert coord.idle_ids(far) == []
    before = sections(r.state)
    assert ctl(r, TxExpire(("t",), far, DAY)).dup
    assert sections(r.state) == before
    # once everything of it is written, it is idle from then on
    if busy == "ongoing":
        ctl(r, TxEnd("t", 0, 0, False, 6_000, "client"))
    cur = coord.txn("t")
    assert cur is not None
    for t in coord.unfinished():
        ctl(r, TxComplete("t", t.epoch, t.n))
    assert coord.idle_ids(far) == ["t"]
    assert ctl(r, TxExpire(("t",), far, DAY)) == ControlResult("tx_expire", 1)


def test_an_id_used_again_before_the_record_applies_stays() -> None:
    r = Replica()
    ctl(r, TxInit("t", 60_000, 1_000))
    due = r.state.txcoord.idle_ids(1_000)
    assert due == ["t"]
    ctl(r, TxAdd("t", 0, 0, ("g2",), 2 * DAY))  # its producer came back meanwhile
    assert ctl(r, TxExpire(tuple(due), 1_000 + DAY, DAY)).dup
    assert state(r, "t").state == "ongoing"


def test_what_went_idle_survives_a_restore_and_an_init_of_before_is_never_forgotten() -> None:
    r = Replica()
    ctl(r, TxInit("a", 60_000, 1_000))
    ctl(r, TxInit("b", 60_000, 2_000))
    ctl(r, TxInit("c", 60_000, 0))  # time unknown (a record from before): kept
    restored = BrokerState.restore("g1", r.state.snapshot()).txcoord
    for coord in (r.state.txcoord, restored):
        assert coord.idle_ids(1_500) == ["a"]
        assert coord.idle_ids(100 * DAY) == ["a", "b"]
        assert coord.idle_ids(100 * DAY, limit=1) == ["a"]


# ---------------------------------------------------------------------- its own group


def _own_group() -> Replica:
    """Group g1 coordinating "tid" and holding a queue of topic t."""
    rep = Replica("g1")
    rep.control(control_create_topic("t", 1, [0]))
    ctl(rep, TxInit("tid", 60_000, 0))
    return rep


@pytest.mark.parametrize("commit", [True, False])
def test_the_decision_applies_in_its_own_group_within_the_tx_end(commit: bool) -> None:
    # the coordinator's group holds data of the transaction: the tx_end entry decides it
    # there too, as its marker would, so no marker entry or round trip is needed
    r = _own_group()
    ctl(r, TxAdd("tid", 0, 0, ("g1", "g2"), 10))
    r.batch("t", 0, [b"a", b"b"], tx=("tid", 0, 0))
    assert r.bodies("t", 0) == []
    assert ctl(r, TxEnd("tid", 0, 0, commit, 20, "client", mark_here=True)) == ControlResult(
        "tx_end", 1)
    assert r.bodies("t", 0) == ([b"a", b"b"] if commit else [])
    d = r.state.txpart.decision(kafka_key("tid", 0, 0))
    assert d is not None and d.commit is commit
    assert r.state.txpart.fence("tid") == 0
    # the other participant's marker is still due: the transaction is not complete
    assert state(r).state == ("prepare_commit" if commit else "prepare_abort")
    # the marker the duty would have sent changes nothing now
    assert ctl(r, TxMarker("tid", 0, 0, commit, 0, 30)).dup
    assert r.bodies("t", 0) == ([b"a", b"b"] if commit else [])


def test_a_tx_end_written_without_mark_here_leaves_the_marker_to_its_own_entry() -> None:
    # a log older leaders wrote replays as it was first applied: the decision alone,
    # the transaction's data entering the queue with the tx_marker after it
    r = _own_group()
    ctl(r, TxAdd("tid", 0, 0, ("g1", "g2"), 10))
    r.batch("t", 0, [b"a"], tx=("tid", 0, 0))
    ctl(r, TxEnd("tid", 0, 0, True, 20, "client"))
    assert r.state.txpart.decision(kafka_key("tid", 0, 0)) is None
    assert r.bodies("t", 0) == []
    ctl(r, TxMarker("tid", 0, 0, True, 0, 30))
    assert r.bodies("t", 0) == [b"a"]
    assert TxEnd.from_map(TxEnd("tid", 0, 0, True, 20, "client").to_map()).mark_here is False
    assert "mark_here" not in TxEnd("tid", 0, 0, True, 20, "client").to_map()


def test_a_decision_of_other_groups_only_leaves_this_groups_participant_alone() -> None:
    r = _own_group()
    ctl(r, TxAdd("tid", 0, 0, ("g2",), 10))
    ctl(r, TxEnd("tid", 0, 0, True, 20, "client", mark_here=True))
    assert r.state.txpart.decision(kafka_key("tid", 0, 0)) is None


def test_an_earlier_transaction_with_its_marker_still_due_here_goes_first() -> None:
    # epoch 0's open transaction is fenced by a new producer: its abort marker for this
    # group is the duty's to write. The new epoch's commit must not enter the queue
    # before it, so it is left to the duty too (which keeps the order)
    r = _own_group()
    ctl(r, TxAdd("tid", 0, 0, ("g1",), 10))
    r.batch("t", 0, [b"old"], tx=("tid", 0, 0))
    ctl(r, TxInit("tid", 60_000, 15))
    ctl(r, TxAdd("tid", 1, 0, ("g1",), 16))
    r.batch("t", 0, [b"new"], tx=("tid", 1, 0))
    ctl(r, TxEnd("tid", 1, 0, True, 20, "client", mark_here=True))
    assert r.state.txpart.decision(kafka_key("tid", 1, 0)) is None
    assert r.bodies("t", 0) == []
    ctl(r, TxMarker("tid", 0, 0, False, 1, 30))  # the duty: the older one first
    ctl(r, TxMarker("tid", 1, 0, True, 1, 31))
    assert r.bodies("t", 0) == [b"new"]


def test_the_next_tx_add_completes_the_previous_transaction_when_it_says_so() -> None:
    r = Replica()
    ctl(r, TxInit("tid", 60_000, 0))
    ctl(r, TxAdd("tid", 0, 0, ("g2",), 10))
    ctl(r, TxEnd("tid", 0, 0, True, 20, "client"))
    # its markers all applied, the leader starts the next one completing it
    assert ctl(r, TxAdd("tid", 0, 1, ("g2",), 30, completes=True)) == ControlResult(
        "tx_add", 1)
    assert r.state.txcoord.unfinished() == [] and "tid" not in r.state.txcoord.completing
    assert [(d.n, d.commit) for d in r.state.txcoord.done_ring()] == [(0, True)]
    assert state(r).state == "ongoing" and state(r).n == 1
    assert ctl(r, TxComplete("tid", 0, 0)).dup  # a late tx_complete changes nothing
    # without it, the previous one waits aside for its own tx_complete, as before
    ctl(r, TxEnd("tid", 0, 1, False, 40, "client"))
    ctl(r, TxAdd("tid", 0, 2, ("g2",), 50))
    assert [(t.n, t.state) for t in r.state.txcoord.unfinished()] == [(1, "prepare_abort")]
    ctl(r, TxComplete("tid", 0, 1))
    assert r.state.txcoord.unfinished() == []


def test_a_tx_add_without_completes_keeps_its_old_bytes() -> None:
    rec = TxAdd("tid", 0, 1, ("g2",), 30)
    assert "completes" not in msgpack.unpackb(rec.encode())
    assert TxAdd.decode(rec.encode()) == rec
    assert msgpack.unpackb(TxAdd("tid", 0, 1, ("g2",), 30, completes=True).encode())[
        "completes"] is True
