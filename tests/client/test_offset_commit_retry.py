"""A retried offset commit never undoes an acknowledged one (over real node processes).

The chaos harness found this: a consumer's COMMIT_OFFSET(710) was appended by a leader
that was killed before answering; the new leader committed the entry; another consumer
then committed 716; only after that did the first client's retry of 710 arrive. Without
deduplication the retry was appended again and rolled 716 back. Here the leader's crash
between the commit and the answer is scripted (the "crash-before-answer" test
mutation, asked for by the request), so the interleaving happens every time, not once in eight chaos runs.
"""

from __future__ import annotations

import time

import pytest

from broker.doors.service import CRASH_BEFORE_ANSWER_EXIT
from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders
from tests.live_cluster import LiveCluster
from transport.blocking import request
from wire.protocol import Op
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live  # every test here starts a cluster

TOPIC = "offsets"


def _commit(addr: str, offset: int, req: list[int], **extra: object) -> dict:
    header = {"op": Op.COMMIT_OFFSET, "cg": "cg", "offsets": [[TOPIC, 0, offset]], "req": req,
              **extra}
    h, _ = request(addr, header, timeout=10.0)
    return h


def _committed(addr: str) -> int:
    h, _ = request(addr, {"op": Op.QUERY_OFFSET, "cg": "cg", "topic": TOPIC, "queue": 0},
                   timeout=10.0)
    return int(h["offset"])


def test_a_retry_of_a_commit_the_new_leader_applied_does_not_roll_back_a_later_one(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    with LocalCluster(tmp_path, groups=1, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                      node_overrides={"test_mutations": ["crash-before-answer"]}) as cluster:
        cluster.wait_ready(timeout=60)
        cluster.wait_preferred_leaders(timeout=120)  # so leadership stays where it is
        live = LiveCluster(cluster, TOPIC, 1)
        old = live.leader("g0")
        live.call_leader("g0", {"op": Op.CREATE_TOPIC, "g": "g0", "topic": TOPIC, "queues": 1,
                                "hosted": [0]})
        batch = encode_batch(TOPIC, 0, [OutgoingMessage(b"m%d" % i) for i in range(800)])
        live.call_leader("g0", {"op": Op.PRODUCE, "g": "g0"}, batch)

        # client 4's commit(710) is committed, then its leader dies before answering
        with pytest.raises(OSError):
            _commit(cluster.node_addr(old), 710, [4, 1], test_exit=True)
        deadline = time.monotonic() + 60
        while cluster.is_running(old):
            assert time.monotonic() < deadline, "the old leader did not exit"
            time.sleep(0.1)
        cluster.wait_ready(timeout=60, raise_on_exit=False)
        assert cluster.unexpected_exits() == {f"n{old}": CRASH_BEFORE_ANSWER_EXIT}
        new = cluster.node_addr(live.leader("g0"))
        assert _committed(new) == 710  # the new leader committed the old leader's entry

        assert _commit(new, 716, [3, 1])["dup"] is False  # another consumer moves on
        retry = _commit(new, 710, [4, 1])  # client 4 retries, as `Routes.call` does
        assert retry["code"] == 0 and retry["dup"] is True
        assert _committed(new) == 716  # the acknowledged 716 stands

        # the restarted old leader, the group's preferred leader, takes over again and
        # replays the same log to the same answer
        cluster.restart(old)
        cluster.wait_preferred_leaders(timeout=120)
        assert _committed(cluster.node_addr(old)) == 716


def test_the_sdk_sends_each_commit_with_a_request_id_a_retry_would_reuse(tmp_path) -> None:
    """What makes the SDK's retries safe: each commit carries (client id, sequence), and the
    same id sent again (as `Routes.call` does on every attempt) changes nothing."""
    import anyio

    from raftmq.client import Admin, PullConsumer

    with LocalCluster(tmp_path, groups=1) as cluster:
        steady_leaders(cluster)  # the leader looked up below still leads
        live = LiveCluster(cluster, TOPIC, 1)

        async def main() -> tuple[int, int]:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, 1)  # and waits until it is routed
            batch = encode_batch(TOPIC, 0, [OutgoingMessage(b"m%d" % i) for i in range(20)])
            live.call_leader("g0", {"op": Op.PRODUCE, "g": "g0"}, batch)
            async with PullConsumer(cluster.namesrv_addr, "cg") as consumer:
                await consumer.commit(TOPIC, 0, 10)
                await consumer.commit(TOPIC, 0, 12)
                return consumer.routes.client_id, consumer.routes.request_id()[1]

        client_id, next_seq = anyio.run(main)
        leader = cluster.node_addr(live.leader("g0"))
        assert _committed(leader) == 12
        # the first commit's id again, as a late retry of it would come: a duplicate
        assert _commit(leader, 10, [client_id, next_seq - 2])["dup"] is True
        assert _committed(leader) == 12
