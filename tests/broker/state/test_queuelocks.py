"""Queue locks (`broker.state.parts.queuelocks`): one holder per queue, renewal keeps,
expiry frees, only the holder unlocks, commits are fenced by another's live lease, a
deleted topic or group takes its locks, and replicas agree however they got their state."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlResult, ErrorResult, Refused
from broker.state.parts.offsets import CommitOffsets, DeleteGroup
from broker.state.parts.queuelocks import Held, Lock, Unlock
from broker.state.statemachine import BrokerState, control_create_topic, control_delete_topic
from raftlog.types import Entry
from tests.broker.state.test_receipts import Log
from wire.protocol import Code

CG = "orders"


def _log() -> Log:
    log = Log()
    log.control(control_create_topic("t", 4, [0, 1, 2]))  # queue 3 is another group's
    return log


def test_a_free_queue_is_granted_and_a_held_one_is_not() -> None:
    log = _log()
    r = log.control(Lock(CG, "t", (0, 1, 3), "a", 1000, 500))
    assert r == ControlResult("lock", 2, 1, items=(0, 1))  # 3: not hosted here, skipped
    assert log.state.queuelocks.holder(CG, "t", 0, 1000) == "a"
    r = log.control(Lock(CG, "t", (0, 2), "b", 1100, 500))
    assert r.items == (2,)
    assert log.state.queuelocks.of_group(CG) == {
        (CG, "t", 0): Held("a", 1500), (CG, "t", 1): Held("a", 1500),
        (CG, "t", 2): Held("b", 1600)}
    # another consumer group's locks are its own
    assert log.control(Lock("other", "t", (0,), "b", 1100, 500)).items == (0,)


def test_renewal_keeps_the_lock_and_expiry_frees_it() -> None:
    log = _log()
    log.control(Lock(CG, "t", (0,), "a", 1000, 500))
    assert log.control(Lock(CG, "t", (0,), "a", 1400, 500)).items == (0,)  # renewed to 1900
    assert log.control(Lock(CG, "t", (0,), "b", 1899, 500)).items == ()
    assert log.state.queuelocks.holder(CG, "t", 0, 1899) == "a"
    assert log.state.queuelocks.holder(CG, "t", 0, 1900) is None
    assert log.control(Lock(CG, "t", (0,), "b", 1900, 500)).items == (0,)
    # the part's time never goes back: a leader with a slower clock cannot revive "a"
    assert log.control(Lock(CG, "t", (0,), "a", 100, 500)).items == ()
    assert log.state.queuelocks.holder(CG, "t", 0, 0) == "b"


def test_only_the_holder_unlocks() -> None:
    log = _log()
    log.control(Lock(CG, "t", (0, 1), "a", 1000, 500))
    r = log.control(Unlock(CG, "t", (0, 1, 2), "b"))
    assert r == ControlResult("unlock", 0, 3, items=())
    assert log.control(Unlock(CG, "t", (1,), "a")).items == (1,)
    assert log.control(Lock(CG, "t", (1,), "b", 1001, 500)).items == (1,)
    assert log.state.queuelocks.holder(CG, "t", 0, 1001) == "a"


def test_commits_are_fenced_by_another_client_s_live_lease() -> None:
    log = _log()
    log.control(Lock(CG, "t", (0,), "a", 1000, 500))
    refused = log.control(CommitOffsets(CG, (("t", 0, 5), ("t", 1, 5)), "b", 1200))
    assert isinstance(refused, ErrorResult) and refused.code == Code.LOCK_LOST
    assert log.state.consumer_offsets(CG) == {}  # refused whole: queue 1 neither
    anonymous = log.control(CommitOffsets(CG, (("t", 0, 5),), None, 1200))
    assert isinstance(anonymous, ErrorResult) and anonymous.code == Code.LOCK_LOST
    assert log.control(CommitOffsets(CG, (("t", 0, 5),), "a", 1200)).applied == 1
    # unlocked queues, expired leases and unfenced commits (no time) are as ever
    assert log.control(CommitOffsets(CG, (("t", 1, 7),), "b", 1200)).applied == 1
    assert log.control(CommitOffsets(CG, (("t", 0, 6),), "b", 1500)).applied == 1
    log.control(Lock(CG, "t", (0,), "a", 1600, 500))
    assert log.control(CommitOffsets(CG, (("t", 0, 8),))).applied == 1
    assert log.state.consumer_offsets(CG)[(CG, "t", 0)] == 8


def test_a_deleted_topic_or_group_takes_its_locks() -> None:
    log = _log()
    log.control(Lock(CG, "t", (0,), "a", 1000, 500))
    log.control(Lock("keep", "t", (1,), "a", 1000, 500))
    log.control(DeleteGroup(CG))
    assert log.state.queuelocks.of_group(None) == {("keep", "t", 1): Held("a", 1500)}
    log.control(control_delete_topic("t"))
    assert log.state.queuelocks.of_group(None) == {}


def test_bad_records_are_refused_and_change_nothing() -> None:
    with pytest.raises(Refused):
        Lock(CG, "t", (), "a", 0)
    with pytest.raises(Refused):
        Lock(CG, "t", (0, 0), "a", 0)
    with pytest.raises(Refused):
        Lock(CG, "t", (0,), "a", 0, lease_ms=1)
    with pytest.raises(Refused):
        Unlock(CG, "t", (0,), "")
    log = _log()
    before = log.state.snapshot()
    bad = msgpack.packb({"op": "lock", "cg": CG, "t": "t", "qs": ["x"], "c": "a", "now": 1,
                         "lease": 1000})
    assert isinstance(log.control(bad), ErrorResult)
    assert BrokerState.restore("g", before).queuelocks.section() == (
        log.state.queuelocks.section())


# ---------------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_replicas_agree_and_a_queue_never_has_two_live_holders(data: st.DataObject) -> None:
    log = _log()
    clients = ["a", "b", "c"]
    now = 1000
    # what each client was granted: queue -> (client, expiry) by our own reckoning
    mine: dict[int, tuple[str, int]] = {}
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        now += data.draw(st.integers(0, 400), label="time passes")
        client = data.draw(st.sampled_from(clients), label="client")
        queues = tuple(data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=3,
                                          unique=True), label="queues"))
        op = data.draw(st.sampled_from(["lock", "unlock", "commit"]), label="op")
        if op == "lock":
            lease = data.draw(st.integers(100, 1000), label="lease")
            r = log.control(Lock(CG, "t", queues, client, now, lease))
            for q in queues:
                held = mine.get(q)
                free = held is None or held[1] <= now or held[0] == client
                assert (q in r.items) == free, (q, held, now)
                if free:
                    mine[q] = (client, now + lease)
        elif op == "unlock":
            r = log.control(Unlock(CG, "t", queues, client))
            for q in queues:
                assert (q in r.items) == (mine.get(q, ("", 0))[0] == client)
                if q in r.items:
                    del mine[q]
        else:
            r = log.control(CommitOffsets(CG, tuple(("t", q, now) for q in queues), client,
                                          now))
            fenced = any(q in mine and mine[q][1] > now and mine[q][0] != client
                         for q in queues)
            assert isinstance(r, ErrorResult) == fenced
        # never two holders: the part's one holder per queue is the one we reckon
        for q in range(3):
            held = mine.get(q)
            live = held[0] if held is not None and held[1] > now else None
            assert log.state.queuelocks.holder(CG, "t", q, now) == live
    # replicas: straight, and through a snapshot taken anywhere, hold the same state
    cut = data.draw(st.integers(0, len(log.entries)), label="snapshot at")
    b = BrokerState.restore("g", log.replay(cut).snapshot())
    for i, (kind, d2) in enumerate(log.entries[cut:], cut + 1):
        b.apply(Entry(i, 1, kind, d2))
    assert b.snapshot() == log.state.snapshot() == log.replay(len(log.entries)).snapshot()
