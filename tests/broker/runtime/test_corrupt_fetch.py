"""A FETCH that meets a corrupt entry answers BUSY, and the entry is repaired from a peer.

The leader of g0 runs; one byte of a stored MESSAGES entry is flipped under it, in the
entry's body or in its header (any field, or the header CRC). A consumer's FETCH of that
entry must never get the damaged bytes: the leader answers BUSY (retriable) and sends the
entry for repair; once repaired, the same FETCH serves the acknowledged records intact.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.disk_faults import corrupt_entry
from raftlog.commitlog import HEADER_SIZE
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, iter_records

pytestmark = pytest.mark.live


def fetch_at(live: LiveCluster, node: int, offset: int, count: int) -> dict[int, bytes]:
    h, body = request(live.addr(node), {"op": int(Op.FETCH), "topic": live.topic, "queue": 0,
                                        "offset": offset, "max": count, "wait_ms": 0})
    return {meta[0]: body[start : start + size]
            for (start, size), meta in zip(iter_records(body), h["msgs"], strict=True)}


# seeds chosen so the flipped header byte lands in each field in turn
HEADER_FIELDS = {"magic": 5, "size": 2, "term": 13, "index": 1, "type": 8, "body-crc": 7,
                 "header-crc": 10}


@pytest.mark.parametrize(("part", "seed"), [("body", 1)] + [
    pytest.param("header", seed, id=f"header-{name}") for name, seed in HEADER_FIELDS.items()])
def test_fetch_of_a_corrupt_entry_answers_busy_then_serves_the_repaired_entry(
    tmp_path: Path, part: str, seed: int
) -> None:
    with live_cluster(tmp_path, groups=1) as cluster:
        live = LiveCluster(cluster, "t", 1)
        live.settle()
        live.create_topic()
        answers = []
        for b in range(8):
            msgs = [OutgoingMessage(f"b{b}-m{i}".encode() * 30) for i in range(4)]
            answers.append(live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1))
        leader = live.leader("g0")
        target = answers[2]  # neither the first entries nor the tail
        hit = corrupt_entry(cluster.configs[leader - 1].data, random.Random(seed), part=part,
                            group="g0", index=target["index"])
        assert hit is not None and hit["index"] == target["index"]
        where = hit["position"] - hit["entry_position"]
        assert (where < HEADER_SIZE) == (part == "header"), hit

        with pytest.raises(RequestError) as first:
            fetch_at(live, leader, target["base"], 4)
        assert first.value.code == Code.BUSY, (where, first.value)

        def served() -> dict[int, bytes] | None:
            try:
                return fetch_at(live, leader, target["base"], 4)
            except RequestError as exc:
                assert exc.code == Code.BUSY, exc
                return None

        got = wait_for(served, 30, f"entry {target['index']} repaired ({part} byte {where})")
        assert got == {o: live.acked[0][o] for o in range(target["base"], target["base"] + 4)}
        st = node_status(cluster, leader, "g0")
        assert st["repaired"] >= 1 and not st["unrepaired"], st
        assert live.fetch(0) == live.acked[0]
        live.assert_nodes_healthy()
