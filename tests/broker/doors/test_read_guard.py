"""Reads are never stale: a leader cut off from its group does not answer from old state.

Node 1 leads g0 and is then cut off from its peers (its clients still reach it). Its
election timeout is made long (30 s), so for the whole test it still believes it leads,
while nodes 2 and 3 elect a new leader that commits a message and a consumer offset.
Asked directly, node 1 must refuse (NOT_LEADER, BUSY) or not answer in time; an answer
built from its own state would miss what the new leader committed. Node 1 still believing
it leads is asserted after the reads: the guard is what stops the stale answer, not a
timely step-down. `skip-read-barrier` (the deliberate bug) makes this test fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftmq.localcluster import LocalCluster
from tests.conftest import group_leader, node_status, proxied_cluster, wait_for
from transport.blocking import request
from wire.protocol import Op, RequestError
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live

TOPIC = "t"
SLOW_ELECTION_TICKS = 600  # 30 s at 50 ms: node 1 keeps believing it leads


def _call(cluster: LocalCluster, node: int, header: dict[str, Any], body: bytes = b"") -> dict:
    h, _ = request(cluster.node_addr(node), header, body, timeout=5.0)
    return h


def _on_leader(cluster: LocalCluster, among: list[int], header: dict[str, Any],
               body: bytes = b"") -> dict:
    """`header` sent to g0's leader among `among`, retried while leadership settles."""
    def attempt() -> dict | None:
        node = group_leader(cluster, "g0", among)
        if node is None:
            return None
        try:
            return _call(cluster, node, header, body)
        except RequestError as exc:
            if exc.retriable:
                return None
            raise
        except OSError:
            return None
    return wait_for(attempt, 30, f"an answer from g0's leader among {among}")


def _refused_or_silent(cluster: LocalCluster, node: int, header: dict[str, Any]) -> str:
    """How `node` handled a read: it must not answer it."""
    try:
        h, _ = request(cluster.node_addr(node), header, timeout=3.0)
    except RequestError as exc:
        return exc.code.name
    except OSError:
        return "no answer"
    raise AssertionError(f"a cut-off leader answered {header} from stale state: {h}")


def test_a_cut_off_leader_never_answers_reads(tmp_path: Path) -> None:
    overrides: dict[str | int, Any] = {1: {"election_ticks": SLOW_ELECTION_TICKS}}
    with proxied_cluster(tmp_path, groups=1, node_overrides=overrides) as (cluster, proxies):
        wait_for(lambda: group_leader(cluster, "g0") == 1, 60, "node 1 leading g0")
        _on_leader(cluster, [1], {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": TOPIC,
                                  "queues": 1, "hosted": [0]})
        first = encode_batch(TOPIC, 0, [OutgoingMessage(b"before")], born_ms=1)
        assert _on_leader(cluster, [1], {"op": int(Op.PRODUCE), "g": "g0"}, first)["base"] == 0
        _on_leader(cluster, [1], {"op": int(Op.COMMIT_OFFSET), "cg": "c",
                                  "offsets": [[TOPIC, 0, 1]]})
        old_term = node_status(cluster, 1, "g0")["term"]

        proxies.isolate(1)
        wait_for(lambda: group_leader(cluster, "g0", [2, 3]), 60, "a new leader of g0")
        second = encode_batch(TOPIC, 0, [OutgoingMessage(b"after")], born_ms=2)
        assert _on_leader(cluster, [2, 3], {"op": int(Op.PRODUCE), "g": "g0"}, second)["base"] == 1
        _on_leader(cluster, [2, 3], {"op": int(Op.COMMIT_OFFSET), "cg": "c",
                                     "offsets": [[TOPIC, 0, 2]]})

        fetch = {"op": int(Op.FETCH), "topic": TOPIC, "queue": 0, "max": 32, "wait_ms": 0}
        answers = [
            _refused_or_silent(cluster, 1, {**fetch, "offset": 0}),
            _refused_or_silent(cluster, 1, {**fetch, "offset": 1}),
            _refused_or_silent(cluster, 1, {"op": int(Op.QUERY_OFFSET), "cg": "c",
                                            "topic": TOPIC, "queue": 0}),
        ]
        # the precondition that makes this a test of the guard: node 1 still believed it
        # led, in its old term, all along
        st = node_status(cluster, 1, "g0")
        assert st["role"] == "leader" and st["term"] == old_term, (st, answers)
        proxies.heal()
