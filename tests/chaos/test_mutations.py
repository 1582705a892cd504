"""The deliberate misbehaviours the chaos harness must be able to catch really misbehave,
and a node refuses them unless the test flag is set."""

from __future__ import annotations

import random
import time

import pytest
import trio

from broker.config import ConfigError
from broker.node import DUPLICATE_EVERY
from raftlog.core import RaftConfig
from raftlog.runtime import GroupOptions, GroupRuntime, NotLeader
from raftlog.types import Entry, Message
from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders
from transport.blocking import request
from wire.protocol import Op
from wire.records import OutgoingMessage, encode_batch


def test_mutations_are_refused_without_the_flag(tmp_path, monkeypatch):
    monkeypatch.delenv("RAFTMQ_ALLOW_MUTATIONS", raising=False)
    with pytest.raises(ConfigError, match="RAFTMQ_ALLOW_MUTATIONS"):
        LocalCluster(tmp_path, node_overrides={"test_mutations": ["ack-before-commit"]})


@pytest.mark.live
def test_ack_before_commit_acknowledges_what_a_leader_crash_then_loses(tmp_path, monkeypatch):
    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    with LocalCluster(tmp_path, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                      node_overrides={"test_mutations": ["ack-before-commit"]}) as cluster:
        leader = steady_leaders(cluster)["g0"]
        addr = cluster.node_addr(leader)
        request(addr, {"op": Op.CREATE_TOPIC, "g": "g0", "topic": "m", "queues": 1,
                       "hosted": [0]})
        followers = [n for n in cluster.node_ids if n != leader]
        for f in followers:
            cluster.pause(f)
        batch = encode_batch("m", 0, [OutgoingMessage(b"acked but never committed")])
        h, _ = request(addr, {"op": Op.PRODUCE, "g": "g0"}, batch, timeout=5)
        assert h["code"] == 0  # acked with no majority alive
        cluster.kill(leader)  # and it stays down: its log is the only one with the entry
        for f in followers:
            # SIGKILL while stopped: the append waiting in their socket buffers dies unread
            cluster.kill(f)
            cluster.restart(f)
        new = cluster.wait_ready(timeout=60)["g0"]
        assert new != leader
        h, _ = request(cluster.node_addr(new), {"op": Op.FETCH, "topic": "m", "queue": 0,
                                                "offset": 0, "wait_ms": 0})
        assert h["end"] == 0  # the acknowledged message is gone: what chaos runs must catch


@pytest.mark.live
def test_duplicate_batch_stores_every_eighth_batch_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    with LocalCluster(tmp_path, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                      node_overrides={"test_mutations": ["duplicate-batch"]}) as cluster:
        addr = cluster.node_addr(steady_leaders(cluster)["g0"])
        request(addr, {"op": Op.CREATE_TOPIC, "g": "g0", "topic": "m", "queues": 1,
                       "hosted": [0]})
        for i in range(DUPLICATE_EVERY):  # one request each, never retried
            batch = encode_batch("m", 0, [OutgoingMessage(b"b%d" % i)])
            h, _ = request(addr, {"op": Op.PRODUCE, "g": "g0"}, batch, timeout=5)
            assert h["code"] == 0 and h["base"] == i  # acknowledged where it belongs
        deadline = time.monotonic() + 10
        while True:
            h, body = request(addr, {"op": Op.FETCH, "topic": "m", "queue": 0, "offset": 0,
                                     "wait_ms": 0, "max": 32})
            if h["end"] > DUPLICATE_EVERY or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert h["end"] == DUPLICATE_EVERY + 1  # the last batch is in the queue twice


class _Apply:
    def __init__(self) -> None:
        self.n = 0

    def apply(self, entry: Entry) -> None:
        self.n += 1


@pytest.mark.live
def test_skip_fsync_commits_entries_no_fsync_covers(tmp_path):
    async def main() -> None:
        runtimes: dict[int, GroupRuntime] = {}

        def send(_g: str, m: Message) -> None:
            runtimes[m.dst].step(m)

        for i in (1, 2, 3):
            runtimes[i] = GroupRuntime(
                "g", i, tmp_path / f"n{i}", (1, 2, 3), _Apply(), send,
                GroupOptions(raft=RaftConfig(), skip_fsync=True), rng=random.Random(i))
            runtimes[i].open()
        async with trio.open_nursery() as n:
            for rt in runtimes.values():
                n.start_soon(rt.run)

            async def ticks() -> None:
                while True:
                    await trio.sleep(0.05)  # not faster: a busy machine would churn leaders
                    for rt in runtimes.values():
                        rt.tick()

            async def leader() -> GroupRuntime:
                with trio.fail_after(30):
                    while not any(rt.is_leader for rt in runtimes.values()):
                        await trio.sleep(0.01)
                return next(rt for rt in runtimes.values() if rt.is_leader)

            n.start_soon(ticks)
            k = 0
            while k < 20:  # an election meanwhile is not what this test is about
                try:
                    await (await leader()).propose(b"p%d" % k)
                except NotLeader:
                    continue
                k += 1
            st = (await leader()).status()
            assert st["commit"] >= 21 and st["durable"] == 0 and st["fsyncs"] == 0
            n.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.live
def test_crash_before_answer_exits_after_any_write_that_asks_and_only_then(
    tmp_path, monkeypatch
):
    """One switch for every write: each of these requests, sent with `test_exit`, is
    committed (seen after the restart) and never answered; without it, none is affected."""
    from broker.doors.service import CRASH_BEFORE_ANSWER_EXIT
    from wire.protocol import RequestError

    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    with LocalCluster(tmp_path, nodes=1, groups=1, tick_ms=50, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                      node_overrides={"test_mutations": ["crash-before-answer"],
                                      "replication": 1}) as cluster:
        cluster.wait_ready(timeout=60)
        addr = cluster.node_addr(1)

        def status() -> dict:
            """g0 as the node reports it once it leads g0 again (after a restart) and has
            applied its whole log."""
            deadline = time.monotonic() + 60
            while True:
                try:
                    h, _ = request(addr, {"op": Op.STATUS}, timeout=5.0)
                    st = h["groups"]["g0"]
                    if st["role"] == "leader" and st["applied"] >= st["last"]:
                        return st
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the node did not come back"
                time.sleep(0.05)

        request(addr, {"op": Op.CREATE_TOPIC, "g": "g0", "topic": "t", "queues": 1,
                       "hosted": [0]})  # not asked: answered
        writes = [  # (header, body, what the committed write left in the node's status)
            ({"op": Op.CREATE_TOPIC, "g": "g0", "topic": "u", "queues": 1, "hosted": [0]}, b"",
             lambda st: "u" in st["queues"]),
            ({"op": Op.GROW_TOPIC, "g": "g0", "topic": "t", "queues": 2, "hosted": [0, 1]}, b"",
             lambda st: sorted(st["queues"]["t"]) == [0, 1]),
            ({"op": Op.PRODUCE, "g": "g0"}, encode_batch("t", 0, [OutgoingMessage(b"m")]),
             lambda st: st["queues"]["t"][0] == [0, 1]),
            ({"op": Op.COMMIT_OFFSET, "cg": "c", "offsets": [["t", 0, 1]]}, b"",
             lambda st: st["offsets"] == {"c": {"t": {0: 1}}}),
            ({"op": Op.DELETE_GROUP, "g": "g0", "cg": "c"}, b"",
             lambda st: st["offsets"] == {}),
            ({"op": Op.DELETE_TOPIC, "g": "g0", "topic": "u"}, b"",
             lambda st: "u" not in st["queues"]),
        ]
        for header, body, applied in writes:
            with pytest.raises((OSError, RequestError)):
                request(addr, {**header, "test_exit": True}, body, timeout=10.0)
            deadline = time.monotonic() + 60
            while cluster.is_running(1):
                assert time.monotonic() < deadline, f"{header} did not make the node exit"
                time.sleep(0.05)
            assert cluster.unexpected_exits() == {"n1": CRASH_BEFORE_ANSWER_EXIT}, header
            cluster.restart(1)
            st = status()
            assert applied(st), (header, st)
