"""The `commit-before-durable-prepare` test mutation really misbehaves: a leader answers a
prepared (transactional or half) batch before it is committed, so a coordinator could
decide commit while the prepared records are on no majority; ordinary batches are
still answered only once committed."""

from __future__ import annotations

import uuid

import pytest

from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders
from transport.blocking import request
from wire.protocol import Op, RequestError
from wire.records import OutgoingMessage, encode_batch
from wire.txn import coordinator_group


@pytest.mark.live
def test_prepared_batches_are_answered_with_no_majority_alive(tmp_path, monkeypatch):
    monkeypatch.setenv("RAFTMQ_ALLOW_MUTATIONS", "1")
    with LocalCluster(tmp_path, env={"RAFTMQ_ALLOW_MUTATIONS": "1"},
                      node_overrides={"test_mutations": ["commit-before-durable-prepare"]}
                      ) as cluster:
        leaders = steady_leaders(cluster)
        leader = leaders["g0"]
        addr = cluster.node_addr(leader)
        request(addr, {"op": Op.CREATE_TOPIC, "g": "g0", "topic": "m", "queues": 1,
                       "hosted": [0]})
        # the transaction's id initialised, and its first batch sent while a majority is
        # up: the group then knows the epoch is granted without asking the coordinator
        cg = coordinator_group("tid-1", list(leaders))
        request(cluster.node_addr(leaders[cg]), {"op": Op.TX_INIT, "g": cg, "tid": "tid-1",
                                                 "timeout_ms": 60_000})
        first = encode_batch("m", 0, [OutgoingMessage(b"first")], tx=("tid-1", 0, 0))
        request(addr, {"op": Op.PRODUCE, "g": "g0"}, first, timeout=30)
        followers = [n for n in cluster.node_ids if n != leader]
        for f in followers:
            cluster.pause(f)
        try:
            half = encode_batch("m", 0, [OutgoingMessage(b"prepared")],
                                half=(uuid.uuid4().hex, "pg"))
            h, _ = request(addr, {"op": Op.PRODUCE, "g": "g0"}, half, timeout=5)
            assert (h["code"], h["index"]) == (0, -1)  # answered, committed nowhere
            tx = encode_batch("m", 0, [OutgoingMessage(b"in a transaction")],
                              tx=("tid-1", 0, 0))
            h, _ = request(addr, {"op": Op.PRODUCE, "g": "g0"}, tx, timeout=5)
            assert (h["code"], h["index"]) == (0, -1)
            plain = encode_batch("m", 0, [OutgoingMessage(b"ordinary")])
            # no majority: never acknowledged (no answer, or NOT_LEADER once it steps down)
            with pytest.raises((OSError, RequestError)):
                request(addr, {"op": Op.PRODUCE, "g": "g0"}, plain, timeout=2)
        finally:
            for f in followers:
                cluster.resume(f)
