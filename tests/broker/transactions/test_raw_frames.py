"""Transactions over real node processes, driven with raw frames (no SDK).

One cluster (3 nodes, groups g0..g2, queue q of each topic in group g{q}) serves the
module, with small check-back timings and the `crash-before-answer` test mutation (it
acts only on requests that ask for it). Each test uses topics and transactional ids of
its own, so they pass alone and in any order.

Kafka's model: a transaction across the three groups committed and one aborted
(consumers see exactly the committed messages, in order; transactional offsets are
TX_PENDING until decided), fencing by TX_INIT, abort on timeout, and markers finished by
the coordinator's new leader after its old one died between the decision and the
markers. RocketMQ's: half messages committed and rolled back by HALF_END, check-back
answered by a raw client registered with PRODUCER_HEARTBEAT (and never sent for a decided
half), its count going on at a new leader after a failover, expiry after `tx_check_max`
checks. Data sent to a group no request named registers that group with the coordinator
(so a commit reaches it, and a fenced transaction's data is aborted). Bad input for every new op,
and TX_MARKER from a client refused.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.localcluster import LocalCluster
from tests.conftest import wait_for
from tests.live_cluster import LiveCluster, Raw, running
from wire.protocol import Code, Op, RequestError, encode_frame
from wire.records import OutgoingMessage, decode_record, encode_batch
from wire.txn import coordinator_group

pytestmark = pytest.mark.live

GROUPS = ["g0", "g1", "g2"]
QUEUES = 3
CHECK_MS = 300  # first check-back, and the interval between checks
CHECK_MAX = 3
# The leaders' transaction tick: slow enough that what a request must do itself (TX_INIT
# aborting a fenced transaction, TX_END its markers) is not done by a tick first.
TICK_MS = 500
ORPHAN_MS = 1500
NODE_SETTINGS = {
    "tx_check_first_ms": CHECK_MS, "tx_check_interval_ms": CHECK_MS,
    "tx_check_max": CHECK_MAX, "tx_tick_ms": TICK_MS, "tx_orphan_ms": ORPHAN_MS,
    "test_mutations": ["crash-before-answer"],
}


class Live(LiveCluster):
    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster, "tx-base", QUEUES)

    def new_topic(self, name: str) -> str:
        for q in range(QUEUES):
            self.call_leader(f"g{q}", {"op": int(Op.CREATE_TOPIC), "g": f"g{q}",
                                       "topic": name, "queues": QUEUES, "hosted": [q]})
        return name

    def ask(self, gid: str, op: Op, **fields: Any) -> dict[str, Any]:
        """One request to `gid`'s leader (retried while leadership moves): its answer's
        fields (without the request id)."""
        h, _ = self.call_leader(gid, {"op": int(op), "g": gid, **fields})
        h.pop("id", None)
        return h

    def produce(self, topic: str, queue: int, bodies: list[bytes], **prepared: Any) -> dict:
        batch = encode_batch(topic, queue, [OutgoingMessage(b) for b in bodies], **prepared)
        h, _ = self.call_leader(f"g{queue}", {"op": int(Op.PRODUCE), "g": f"g{queue}"}, batch)
        return h

    def bodies(self, topic: str, queue: int) -> list[bytes]:
        """Every message body of the queue, in offset order."""
        out = []
        for i, raw in self.fetch(queue, topic=topic).items():
            msg, _ = decode_record(raw, 0, topic=topic, queue=queue, offset=i, store_ms=0,
                                   msg_id="")
            out.append(bytes(msg.body))
        return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with running(tmp_path_factory.mktemp("tx"), Live, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                 node_overrides=NODE_SETTINGS) as lv:
        yield lv


def coord(tid: str) -> str:
    return coordinator_group(tid, GROUPS)


def refused(code: Code, fn: Any, *args: Any, **kw: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        fn(*args, **kw)
    assert info.value.code == code, info.value
    return info.value


def new_tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------- Kafka's model


def test_cross_group_transactions_commit_and_abort(live: Live) -> None:
    topic = live.new_topic("tx-cross")
    tid = new_tid("cross")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    assert epoch == 0
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=GROUPS)
    sent: dict[int, list[bytes]] = {}
    for q in range(QUEUES):
        sent[q] = [f"c{q}-{i}".encode() for i in range(3)]
        h = live.produce(topic, q, sent[q][:2], tx=(tid, epoch, 0))
        assert h["base"] == -1  # prepared: not in a queue yet
        live.produce(topic, q, sent[q][2:], tx=(tid, epoch, 0))
    # consumed input offsets commit with the transaction, and are pending until then
    live.ask("g1", Op.TX_OFFSETS, tid=tid, epoch=epoch, n=0, cg="cg-cross",
             offsets=[[topic, 1, 0]])
    refused(Code.TX_PENDING, live.call_leader, "g1", {
        "op": int(Op.QUERY_OFFSET), "cg": "cg-cross", "topic": topic, "queue": 1},
        timeout=0.5)
    refused(Code.TX_PENDING, live.call_leader, "g1", {
        "op": int(Op.COMMIT_OFFSET), "cg": "cg-cross", "offsets": [[topic, 1, 0]]},
        timeout=0.5)
    assert all(live.bodies(topic, q) == [] for q in range(QUEUES))

    end = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=True)
    assert end["state"] == "complete_commit" and end["dup"] is False
    assert {q: live.bodies(topic, q) for q in range(QUEUES)} == sent
    off = live.ask("g1", Op.QUERY_OFFSET, cg="cg-cross", topic=topic, queue=1)
    assert off["offset"] == 0
    again = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=True)
    assert again["state"] == "complete_commit" and again["dup"] is True
    refused(Code.TX_DECIDED, live.ask, c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=False)

    # transaction 1 aborts: none of it is ever served
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=1, groups=["g0", "g2"])
    live.produce(topic, 0, [b"aborted-0"], tx=(tid, epoch, 1))
    live.produce(topic, 2, [b"aborted-2"], tx=(tid, epoch, 1))
    end = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=1, commit=False)
    assert end["state"] == "complete_abort"
    assert {q: live.bodies(topic, q) for q in range(QUEUES)} == sent
    st = live.ask(c, Op.TX_STATUS, tid=tid)
    assert (st["epoch"], st["n"], st["state"]) == (0, 1, "complete_abort")
    assert st["participants"] == ["g0", "g2"]


def test_tx_init_fences_the_older_producer(live: Live) -> None:
    topic = live.new_topic("tx-fence")
    tid = new_tid("fence")
    c = coord(tid)
    old = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    live.ask(c, Op.TX_ADD, tid=tid, epoch=old, n=0, groups=["g0", "g1"])
    live.produce(topic, 0, [b"zombie-0"], tx=(tid, old, 0))
    new = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    assert new == old + 1
    # TX_INIT answered once the zombie's transaction was aborted in every participant:
    # the old producer can neither go on nor commit what it began
    with pytest.raises(RequestError) as info:
        live.produce(topic, 1, [b"zombie-1"], tx=(tid, old, 0))
    assert info.value.code == Code.TX_FENCED
    listed = live.ask(c, Op.TX_LIST, tx=tid)
    assert [(d["epoch"], d["n"], d["commit"], d["reason"]) for d in listed["done"]] == [
        (old, 0, False, "fenced")]
    refused(Code.TX_FENCED, live.ask, c, Op.TX_ADD, tid=tid, epoch=old, n=0, groups=["g2"])
    refused(Code.TX_FENCED, live.ask, c, Op.TX_END, tid=tid, epoch=old, n=0, commit=True)
    st = live.ask(c, Op.TX_STATUS, tid=tid)
    assert (st["epoch"], st["state"]) == (new, "empty")
    # the new producer works; the zombie's message was aborted
    live.ask(c, Op.TX_ADD, tid=tid, epoch=new, n=0, groups=["g0"])
    live.produce(topic, 0, [b"fresh"], tx=(tid, new, 0))
    assert live.ask(c, Op.TX_END, tid=tid, epoch=new, n=0, commit=True)["state"] == (
        "complete_commit")
    assert [live.bodies(topic, q) for q in range(QUEUES)] == [[b"fresh"], [], []]


def test_a_transaction_past_its_timeout_is_aborted(live: Live) -> None:
    topic = live.new_topic("tx-timeout")
    tid = new_tid("timeout")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=300)["epoch"]
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=["g1"])
    live.produce(topic, 1, [b"late"], tx=(tid, epoch, 0))
    wait_for(lambda: live.ask(c, Op.TX_STATUS, tid=tid)["state"] == "complete_abort", 20,
             "the timed-out transaction aborted")
    err = refused(Code.TX_DECIDED, live.ask, c, Op.TX_END, tid=tid, epoch=epoch, n=0,
                  commit=True)
    assert "aborted" in err.message
    assert live.bodies(topic, 1) == []
    done = live.ask(c, Op.TX_LIST, tx=tid)["done"]
    assert [(d["commit"], d["reason"]) for d in done] == [(False, "timeout")]


def test_a_new_coordinator_leader_finishes_the_markers(live: Live) -> None:
    """The coordinator's leader dies right after the commit decision is in its log and
    before any marker is sent; the group's next leader sends them."""
    topic = live.new_topic("tx-failover")
    tid = new_tid("failover")
    c = coord(tid)
    others = [g for g in GROUPS if g != c]
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=600_000)["epoch"]
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=others)
    for g in others:
        live.produce(topic, int(g[1:]), [f"m-{g}".encode()], tx=(tid, epoch, 0))
    leader = live.leader(c)
    raw = Raw(live.addr(leader))
    try:
        gone = raw.ask({"op": int(Op.TX_END), "id": 1, "g": c, "tid": tid, "epoch": epoch,
                        "n": 0, "commit": True, "test_exit": True})
        assert gone is None  # the node exited instead of answering
    finally:
        raw.close()
    wait_for(lambda: not live.cluster.is_running(leader), 10, "the coordinator leader exited")
    assert live.cluster.unexpected_exits() == {f"n{leader}": 70}
    try:
        wait_for(lambda: live.ask(c, Op.TX_STATUS, tid=tid)["state"] == "complete_commit",
                 30, "the new coordinator leader completed the transaction")
        for g in others:
            assert live.bodies(topic, int(g[1:])) == [f"m-{g}".encode()]
    finally:
        assert live.cluster.restart_and_wait(leader) is None
        live.settle()


def test_a_commit_reaches_a_group_no_request_named(live: Live) -> None:
    """Issue 25 #3: data sent to a group no TX_ADD named, with a TX_END naming no groups,
    got no marker; once the next transaction started, the orphan check aborted it
    although the coordinator had recorded the commit (a torn transaction). The group now
    registers itself with the coordinator before it prepares the data, so the commit's
    markers reach it, and the next transaction changes nothing."""
    topic = live.new_topic("tx-torn")
    tid = new_tid("torn")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=["g0"])
    live.produce(topic, 0, [b"named"], tx=(tid, epoch, 0))
    live.produce(topic, 1, [b"never named"], tx=(tid, epoch, 0))
    assert live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=True)["state"] == (
        "complete_commit")
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=1, groups=["g0"])  # the next one starts

    def decided() -> list[dict[str, Any]]:
        return [d for d in live.ask("g1", Op.TX_LIST, tx=tid)["decided"] if d["n"] == 0]

    [row] = wait_for(decided, 30, "g1's decision on transaction 0")
    assert (row["commit"], row["messages"]) == (True, 1), row
    assert live.bodies(topic, 0) == [b"named"] and live.bodies(topic, 1) == [b"never named"]


def test_data_of_a_transaction_no_client_registered_is_aborted_with_it(live: Live) -> None:
    """Data is the first word the coordinator hears of transaction 1 (its client never
    sent TX_ADD): the group registers it, so a new epoch's TX_INIT aborts it like any
    open transaction and the group's data goes with it, nothing waiting for an orphan
    check."""
    topic = live.new_topic("tx-orphan")
    tid = new_tid("orphan")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    live.produce(topic, 2, [b"left-behind"], tx=(tid, epoch, 0))
    st = live.ask(c, Op.TX_STATUS, tid=tid)
    assert (st["n"], st["state"], st["participants"]) == (0, "ongoing", ["g2"])
    assert live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"] == epoch + 1

    def resolved() -> list[dict[str, Any]]:
        return [d for d in live.ask("g2", Op.TX_LIST, tx=tid)["decided"] if d["n"] == 0]

    row = wait_for(resolved, 30, "the data of the fenced producer aborted")[0]
    assert (row["kind"], row["epoch"], row["commit"]) == ("kafka", epoch, False)
    assert live.bodies(topic, 2) == []
    # a made-up epoch or a transaction already decided prepares nothing
    refused(Code.TX_UNKNOWN, live.produce, topic, 2, [b"x"], tx=(tid, epoch + 5, 0))
    refused(Code.TX_FENCED, live.produce, topic, 2, [b"x"], tx=(tid, epoch, 1))
    assert live.ask("g2", Op.TX_LIST, tx=tid)["prepared"] == []


def test_tx_end_names_groups_never_registered(live: Live) -> None:
    """A client sends beside its TX_ADD, not after it: TX_END names every group it sent
    to, and the decision reaches each, registered or not, at once (no orphan wait)."""
    topic = live.new_topic("tx-named")
    tid = new_tid("named")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    # g1 gets its data before any TX_ADD applied; g0 is registered only afterwards
    live.produce(topic, 1, [b"early-1"], tx=(tid, epoch, 0))
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=["g0"])
    live.produce(topic, 0, [b"late-0"], tx=(tid, epoch, 0))
    end = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=True, groups=["g1", "g0"])
    assert end["state"] == "complete_commit"
    assert live.bodies(topic, 0) == [b"late-0"] and live.bodies(topic, 1) == [b"early-1"]
    st = live.ask(c, Op.TX_STATUS, tid=tid)
    assert (st["n"], st["participants"]) == (0, ["g0", "g1"])
    # transaction 1 never gets a TX_ADD at all: its TX_END starts and aborts it, with
    # abort markers to the group it names
    live.produce(topic, 2, [b"aborted-2"], tx=(tid, epoch, 1))
    end = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=1, commit=False, groups=["g2"])
    assert end["state"] == "complete_abort"
    # (TX_END answers once the markers are applied; tx_complete is logged right after)
    st = wait_for(lambda: (s := live.ask(c, Op.TX_STATUS, tid=tid))["state"] != (
        "prepare_abort") and s, 30, "transaction 1 logged complete")
    assert (st["n"], st["state"], st["participants"]) == (1, "complete_abort", ["g2"])
    [row] = [d for d in live.ask("g2", Op.TX_LIST, tx=tid)["decided"] if d["n"] == 1]
    assert row["commit"] is False
    assert live.bodies(topic, 2) == []
    # bad groups in TX_END are refused before anything is decided
    refused(Code.UNKNOWN_GROUP, live.ask, c, Op.TX_END, tid=tid, epoch=epoch, n=2,
            commit=True, groups=["g9"])
    refused(Code.MALFORMED, live.ask, c, Op.TX_END, tid=tid, epoch=epoch, n=2,
            commit=True, groups="g0")
    assert live.ask(c, Op.TX_STATUS, tid=tid)["n"] == 1


def test_tx_end_without_waiting_answers_once_decided(live: Live) -> None:
    """TX_END wait=false answers prepare_commit as soon as the decision is in the log;
    the markers follow, the next transaction may start meanwhile."""
    topic = live.new_topic("tx-nowait")
    tid = new_tid("nowait")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    for n in range(2):
        live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=n, groups=GROUPS)
        for q in range(QUEUES):
            live.produce(topic, q, [f"{n}-{q}".encode()], tx=(tid, epoch, n))
        end = live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=n, commit=True, wait=False)
        assert end["state"] == "prepare_commit"
    wait_for(lambda: [live.bodies(topic, q) for q in range(QUEUES)] == [
        [f"0-{q}".encode(), f"1-{q}".encode()] for q in range(QUEUES)], 30,
        "both transactions visible")
    wait_for(lambda: live.ask(c, Op.TX_STATUS, tid=tid)["state"] == "complete_commit", 30,
             "the coordinator logged them complete")
    assert live.ask(c, Op.TX_STATUS, tid=tid)["unfinished"] == []
    refused(Code.MALFORMED, live.ask, c, Op.TX_END, tid=tid, epoch=epoch, n=2,
            commit=True, wait="no")


# ---------------------------------------------------------------------- RocketMQ's model


def test_half_messages_commit_and_roll_back_with_half_end(live: Live) -> None:
    topic = live.new_topic("tx-half")
    yes, no = uuid.uuid4().hex, uuid.uuid4().hex
    assert live.produce(topic, 0, [b"yes"], half=(yes, "pg-half"))["base"] == -1
    live.produce(topic, 0, [b"no"], half=(no, "pg-half"))
    assert live.bodies(topic, 0) == []
    # another producer group cannot decide it; nothing changes
    refused(Code.FORBIDDEN, live.ask, "g0", Op.HALF_END, txid=yes, commit=True, pg="pg-other")
    assert live.ask("g0", Op.HALF_END, txid=yes, commit=True, pg="pg-half")["dup"] is False
    assert live.bodies(topic, 0) == [b"yes"]
    assert live.ask("g0", Op.HALF_END, txid=no, commit=False, pg="pg-half")["dup"] is False
    assert live.ask("g0", Op.HALF_END, txid=no, commit=False, pg="pg-half")["dup"] is True
    refused(Code.TX_DECIDED, live.ask, "g0", Op.HALF_END, txid=no, commit=True, pg="pg-half")
    refused(Code.TX_UNKNOWN, live.ask, "g0", Op.HALF_END, txid=uuid.uuid4().hex, commit=True,
            pg="pg-half")
    assert live.bodies(topic, 0) == [b"yes"]
    decided = {d["id"]: (d["commit"], d["source"])
               for d in live.ask("g0", Op.TX_LIST)["decided"] if d["kind"] == "half"}
    assert decided[yes] == (True, "client") and decided[no] == (False, "client")


class CheckListener:
    """A producer of group `pg` on raw connections to every node: registers with
    PRODUCER_HEARTBEAT, then answers each TX_CHECK from `answers` (txid -> state) and
    records the txids it was asked about."""

    def __init__(self, live: Live, pg: str, answers: dict[str, str],
                 hold: threading.Event | None = None) -> None:
        self.answers = answers
        self.hold = hold  # set: answers wait for it
        self.asked: list[str] = []
        self.answered: list[str] = []
        self.numbers: list[tuple[str, int]] = []  # (txid, the check's number) as asked
        self.lock = threading.Lock()
        self.raws = [Raw(live.addr(n), timeout=30) for n in live.cluster.node_ids]
        for raw in self.raws:
            h = raw.answer({"op": int(Op.PRODUCER_HEARTBEAT), "id": 1, "pg": pg,
                            "client": "listener-1", "ttl_ms": 60_000})
            assert h["code"] == 0, h
        self.threads = [threading.Thread(target=self._serve, args=(raw,), daemon=True)
                        for raw in self.raws]
        for t in self.threads:
            t.start()

    def _serve(self, raw: Raw) -> None:
        while True:
            try:
                f = raw.next()
            except OSError:
                return
            if f is None:
                return
            h = f.header
            if h.get("op") != Op.TX_CHECK:
                continue
            with self.lock:
                self.asked.append(h["txid"])
                self.numbers.append((h["txid"], h["checks"]))
            state = self.answers.get(h["txid"], "unknown")
            if self.hold is not None:
                self.hold.wait()
            raw.send(encode_frame({"id": h["id"], "code": 0, "state": state}))
            with self.lock:
                self.answered.append(h["txid"])

    def close(self) -> None:
        for raw in self.raws:
            raw.close()


def test_check_back_asks_a_live_producer_and_never_a_decided_half(live: Live) -> None:
    topic = live.new_topic("tx-check")
    commit, rollback, decided = (uuid.uuid4().hex for _ in range(3))
    listener = CheckListener(live, "pg-check", {commit: "commit", rollback: "rollback",
                                                decided: "rollback"})
    try:
        live.produce(topic, 0, [b"by-check"], half=(commit, "pg-check"))
        live.produce(topic, 0, [b"rolled-back"], half=(rollback, "pg-check"))
        live.produce(topic, 0, [b"by-client"], half=(decided, "pg-check"))
        live.ask("g0", Op.HALF_END, txid=decided, commit=True, pg="pg-check")
        wait_for(lambda: live.ask("g0", Op.TX_LIST)["halves"] == [], 20,
                 "check-back decided both halves")
        time.sleep(3 * max(CHECK_MS, TICK_MS) / 1000)  # a few more ticks: no check may come
        with listener.lock:
            asked = list(listener.asked)
        assert sorted(asked) == sorted([commit, rollback])  # each once, the decided never
        assert live.bodies(topic, 0) == [b"by-client", b"by-check"]
        rows = {d["id"]: (d["commit"], d["source"])
                for d in live.ask("g0", Op.TX_LIST)["decided"] if d["kind"] == "half"}
        assert rows[commit] == (True, "check") and rows[rollback] == (False, "check")
    finally:
        listener.close()


def test_the_check_count_survives_a_leader_failover(live: Live) -> None:
    """Each check is logged before it is sent, so the group's next leader goes on
    counting where the last one stopped: the numbers a producer is asked with only grow,
    and the half is rolled back after `tx_check_max` checks in all."""
    topic = live.new_topic("tx-check-failover")
    txid = uuid.uuid4().hex
    listener = CheckListener(live, "pg-count", {txid: "unknown"})
    leader = live.leader("g2")
    try:
        live.produce(topic, 2, [b"undecided"], half=(txid, "pg-count"))
        wait_for(lambda: listener.numbers, 20, "the first check-back")
        live.cluster.kill(leader)

        def expired() -> dict[str, Any] | None:
            rows = live.ask("g2", Op.TX_LIST, tx=txid)["decided"]
            return rows[0] if rows else None

        row = wait_for(expired, 30, "the half message expired")
        assert (row["commit"], row["source"]) == (False, "expired")
        with listener.lock:
            numbers = [n for t, n in listener.numbers if t == txid]
        assert numbers == sorted(set(numbers)) and numbers[-1] <= CHECK_MAX, numbers
        assert live.bodies(topic, 2) == []
    finally:
        listener.close()
        live.cluster.unexpected_exits()
        assert live.cluster.restart_and_wait(leader) is None
        live.settle()


def test_a_check_back_answered_after_the_commit_changes_nothing(live: Live) -> None:
    """A check-back in flight while the producer commits, answered "rollback" after the
    commit, then a failover: the half stays committed, delivered once, and neither the
    old leader's late answer, the new leader nor a client's late rollback decides it the
    other way (and the new leader never checks it)."""
    topic = live.new_topic("tx-late-check")
    txid = uuid.uuid4().hex
    hold = threading.Event()
    listener = CheckListener(live, "pg-late", {txid: "rollback"}, hold=hold)
    leader = live.leader("g1")
    try:
        live.produce(topic, 1, [b"late"], half=(txid, "pg-late"))
        wait_for(lambda: listener.asked, 20, "the first check-back")  # its answer held
        assert live.ask("g1", Op.HALF_END, txid=txid, commit=True, pg="pg-late")["dup"] is False
        hold.set()  # the held answer goes out: rollback, after the commit
        wait_for(lambda: listener.answered, 20, "the late answer sent")
        time.sleep(3 * max(CHECK_MS, TICK_MS) / 1000)  # the old leader's ticks act on it
        assert live.bodies(topic, 1) == [b"late"]
        live.cluster.kill(leader)
        assert live.leader("g1") != leader
        refused(Code.TX_DECIDED, live.ask, "g1", Op.HALF_END, txid=txid, commit=False,
                pg="pg-late")
        time.sleep(3 * max(CHECK_MS, TICK_MS) / 1000)  # the new leader's ticks: no check
        assert live.bodies(topic, 1) == [b"late"]
        rows = live.ask("g1", Op.TX_LIST, tx=txid)["decided"]
        assert [(r["commit"], r["source"]) for r in rows] == [(True, "client")]
        with listener.lock:
            assert listener.asked == [txid]
    finally:
        hold.set()
        listener.close()
        live.cluster.unexpected_exits()
        assert live.cluster.restart_and_wait(leader) is None
        live.settle()


def test_check_immunity_delays_the_first_check_back(live: Live) -> None:
    """A half message whose CHECK_IMMUNITY_TIME_IN_SECONDS property says its local
    transaction takes an hour is not checked while one stored beside it without the
    property is checked again and again."""
    topic = live.new_topic("tx-immune")
    plain, immune = uuid.uuid4().hex, uuid.uuid4().hex
    listener = CheckListener(live, "pg-immune", {})
    try:
        live.produce(topic, 1, [b"plain"], half=(plain, "pg-immune"))
        batch = encode_batch(topic, 1, [OutgoingMessage(
            b"immune", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"})],
            half=(immune, "pg-immune"))
        h, _ = live.call_leader("g1", {"op": int(Op.PRODUCE), "g": "g1"}, batch)
        assert h["code"] == 0, h

        def plain_checks() -> int:
            with listener.lock:
                return sum(1 for t, _n in listener.numbers if t == plain)

        wait_for(lambda: plain_checks() >= 2, 30, "two check-backs of the plain half")
        with listener.lock:
            assert immune not in listener.asked
        rows = {r["txid"]: r for r in live.ask("g1", Op.TX_LIST)["halves"]}
        assert rows[immune]["checks"] == 0
    finally:
        listener.close()
        for txid in (plain, immune):  # leave nothing pending for the other tests
            try:
                live.ask("g1", Op.HALF_END, txid=txid, commit=False, pg="pg-immune")
            except RequestError:
                pass  # expired already


def test_an_unanswered_half_expires_after_the_last_check(live: Live) -> None:
    topic = live.new_topic("tx-expire")
    txid = uuid.uuid4().hex
    live.produce(topic, 2, [b"never"], half=(txid, "pg-nobody"))
    pending = live.ask("g2", Op.TX_LIST, tx=txid)["halves"]
    assert [(h["txid"], h["producer_group"]) for h in pending] == [(txid, "pg-nobody")]

    def expired() -> dict[str, Any] | None:
        rows = live.ask("g2", Op.TX_LIST, tx=txid)["decided"]
        return rows[0] if rows else None

    row = wait_for(expired, 30, "the half message expired")
    assert (row["commit"], row["source"]) == (False, "expired")
    assert live.bodies(topic, 2) == []


# ---------------------------------------------------------------------- bad input


BAD: list[tuple[str, Op, dict[str, Any], Code]] = [
    ("init without tid", Op.TX_INIT, {"timeout_ms": 1000}, Code.MALFORMED),
    ("init tid too long", Op.TX_INIT, {"tid": "x" * 256, "timeout_ms": 1000}, Code.MALFORMED),
    ("init timeout type", Op.TX_INIT, {"tid": "T", "timeout_ms": "1"}, Code.MALFORMED),
    ("init timeout zero", Op.TX_INIT, {"tid": "T", "timeout_ms": 0}, Code.MALFORMED),
    ("init timeout over max", Op.TX_INIT, {"tid": "T", "timeout_ms": 900_001}, Code.TX_LIMIT),
    ("add groups empty", Op.TX_ADD, {"tid": "T", "epoch": 0, "n": 0, "groups": []},
     Code.MALFORMED),
    ("add unknown group", Op.TX_ADD, {"tid": "T", "epoch": 0, "n": 0, "groups": ["g9"]},
     Code.UNKNOWN_GROUP),
    ("add bad group name", Op.TX_ADD, {"tid": "T", "epoch": 0, "n": 0, "groups": ["a b"]},
     Code.INVALID_NAME),
    ("add negative epoch", Op.TX_ADD, {"tid": "T", "epoch": -1, "n": 0, "groups": ["g0"]},
     Code.MALFORMED),
    ("add unknown tid", Op.TX_ADD, {"tid": "T-never", "epoch": 0, "n": 0, "groups": ["g0"]},
     Code.TX_UNKNOWN),
    ("end commit not bool", Op.TX_END, {"tid": "T", "epoch": 0, "n": 0, "commit": 1},
     Code.MALFORMED),
    ("end unknown tid", Op.TX_END, {"tid": "T-never", "epoch": 0, "n": 0, "commit": True},
     Code.TX_UNKNOWN),
    ("status without tid", Op.TX_STATUS, {}, Code.MALFORMED),
    ("offsets empty", Op.TX_OFFSETS, {"tid": "T", "epoch": 0, "n": 0, "cg": "cg",
                                      "offsets": []}, Code.MALFORMED),
    ("offsets bad item", Op.TX_OFFSETS, {"tid": "T", "epoch": 0, "n": 0, "cg": "cg",
                                         "offsets": [["tx-base", 0]]}, Code.MALFORMED),
    ("offsets bad cg", Op.TX_OFFSETS, {"tid": "T", "epoch": 0, "n": 0, "cg": "c g",
                                       "offsets": [["tx-base", 0, 0]]}, Code.INVALID_NAME),
    ("offsets other group's queue", Op.TX_OFFSETS, {
        "tid": "T", "epoch": 0, "n": 0, "cg": "cg", "offsets": [["tx-base", 1, 0]]},
     Code.UNKNOWN_QUEUE),
    ("offsets unknown topic", Op.TX_OFFSETS, {
        "tid": "T", "epoch": 0, "n": 0, "cg": "cg", "offsets": [["nope", 0, 0]]},
     Code.UNKNOWN_TOPIC),
    ("offsets beyond the end", Op.TX_OFFSETS, {
        "tid": "T", "epoch": 0, "n": 0, "cg": "cg", "offsets": [["tx-base", 0, 5]]},
     Code.OFFSET_TOO_LARGE),
    ("half_end without pg", Op.HALF_END, {"txid": "x", "commit": True}, Code.MALFORMED),
    ("half_end bad source", Op.HALF_END, {"txid": "x", "commit": True, "pg": "p",
                                          "source": "check"}, Code.MALFORMED),
    ("half_end bad pg", Op.HALF_END, {"txid": "x", "commit": True, "pg": "p q"},
     Code.INVALID_NAME),
    ("half_end unknown", Op.HALF_END, {"txid": "x", "commit": True, "pg": "p"},
     Code.TX_UNKNOWN),
    ("list bad limit", Op.TX_LIST, {"limit": 0}, Code.MALFORMED),
    ("heartbeat without client", Op.PRODUCER_HEARTBEAT, {"pg": "p"}, Code.MALFORMED),
    ("heartbeat bad pg", Op.PRODUCER_HEARTBEAT, {"pg": "", "client": "c"}, Code.INVALID_NAME),
]


@pytest.mark.parametrize(("op", "fields", "code"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_input_is_refused_and_changes_nothing(live: Live, op: Op, fields: dict[str, Any],
                                                  code: Code) -> None:
    tid = fields.get("tid", "T")
    gid = coord(tid) if op in (Op.TX_INIT, Op.TX_ADD, Op.TX_END, Op.TX_STATUS) else "g0"
    before = live.ask(coord("T"), Op.TX_STATUS, tid="T")
    err = refused(code, live.ask, gid, op, **fields)
    assert err.message
    assert live.ask(coord("T"), Op.TX_STATUS, tid="T") == before


def test_coordinator_ops_in_another_group_are_refused(live: Live) -> None:
    tid = new_tid("elsewhere")
    wrong = next(g for g in GROUPS if g != coord(tid))
    for op, fields in ((Op.TX_INIT, {"timeout_ms": 1000}),
                       (Op.TX_ADD, {"epoch": 0, "n": 0, "groups": ["g0"]}),
                       (Op.TX_END, {"epoch": 0, "n": 0, "commit": True}),
                       (Op.TX_STATUS, {})):
        err = refused(Code.NOT_COORDINATOR, live.ask, wrong, op, tid=tid, **fields)
        assert err.extra["coordinator"] == coord(tid)
    assert live.ask(coord(tid), Op.TX_STATUS, tid=tid)["state"] == "empty"


def test_tx_marker_from_a_client_is_forbidden(live: Live) -> None:
    topic = live.new_topic("tx-forged")
    tid = new_tid("forged")
    c = coord(tid)
    epoch = live.ask(c, Op.TX_INIT, tid=tid, timeout_ms=60_000)["epoch"]
    live.ask(c, Op.TX_ADD, tid=tid, epoch=epoch, n=0, groups=["g0"])
    live.produce(topic, 0, [b"held"], tx=(tid, epoch, 0))
    raw = Raw(live.addr(live.leader("g0")))
    try:
        h = raw.answer({"op": int(Op.TX_MARKER), "id": 5, "g": "g0", "tid": tid,
                        "epoch": epoch, "n": 0, "commit": True, "fence": epoch})
    finally:
        raw.close()
    assert h["code"] == Code.FORBIDDEN and "nodes of the cluster" in h["msg"]
    assert live.bodies(topic, 0) == []
    live.ask(c, Op.TX_END, tid=tid, epoch=epoch, n=0, commit=False)
    assert live.bodies(topic, 0) == []
