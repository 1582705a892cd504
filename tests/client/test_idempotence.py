"""Idempotence across failover: a committed batch that is sent again is stored once.

The leader of g0 runs with the `crash-before-answer` test mutation, and the producer's
connections ask for it on every PRODUCE (`test_exit`): the leader exits right after
committing the batch, before answering it. The idempotent producer never hears that its
batch was committed, so it must retry it, at the new leader; the state machine recognises
the batch (producer id + sequence) and answers with the original offset, marked `dup`.
The retry is forced by construction, not hoped for from a well-timed kill.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from broker.doors.service import CRASH_BEFORE_ANSWER_EXIT
from raftmq.client import Admin, Producer
from tests.conftest import group_leader, live_cluster, wait_for
from tests.live_cluster import CrashAskingPool, drain

pytestmark = pytest.mark.live


def test_a_retried_committed_batch_is_deduplicated_after_the_leader_dies(
    tmp_path: Path,
) -> None:
    with live_cluster(
        tmp_path, groups=1, env={ALLOW_MUTATIONS_ENV: "1"},
        node_overrides={1: {"test_mutations": ["crash-before-answer"]}},
    ) as cluster:
        wait_for(lambda: group_leader(cluster, "g0") == 1, 60, "node 1 leading g0")

        async def main() -> tuple[object, list[bytes]]:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic("t", 1)
            async with CrashAskingPool() as pool, Producer(
                cluster.namesrv_addr, idempotent=True, retries=10, pool=pool
            ) as producer:
                result = await producer.send("t", b"once")
            # every queue up to its end, not up to the first empty poll
            drained = await drain(cluster.namesrv_addr, "t", "c")
            bodies = [m.body for msgs in drained.values() for m in msgs]
            return result, bodies

        result, bodies = anyio.run(main, backend="trio")
        # the first attempt was committed and then its leader died unanswered ...
        assert cluster.unexpected_exits() == {"n1": CRASH_BEFORE_ANSWER_EXIT}
        # ... so the acknowledgement came from a retry, recognised as a repeat
        assert getattr(result, "dup", None) is True, result
        assert getattr(result, "offset", None) in (0, -1), result
        assert bodies == [b"once"]
