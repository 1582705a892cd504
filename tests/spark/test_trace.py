"""The trace topic on real Spark: `raftmq.spark.trace` decodes the records a traced
producer and simple consumer left into rows, and the audit's account of them counts what
was handed over and never acknowledged."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, Producer, SimpleConsumer
from raftmq.localcluster import LocalCluster
from raftmq.spark.trace import trace_frame, trace_summary
from tests.conftest import live_cluster, wait_for
from tests.spark_support import requires_java, spark

pytestmark = [pytest.mark.live, requires_java]

N = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("sparktrace"), groups=1) as c:
        yield c


def test_trace_rows_and_their_account(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    assert trace_frame(spark(), ns).count() == 0  # nothing traced yet: no trace topic

    async def traffic() -> list[str]:
        async with Admin(ns) as admin:
            await admin.create_topic("audited", 2)
        async with Producer(ns, trace=True) as producer:
            ids = [(await producer.send("audited", f"m{i}")).msg_id for i in range(N)]
        async with SimpleConsumer(ns, "auditors", trace=True, invisible=300,
                                  client_id="auditor") as consumer:
            got: list = []
            with anyio.fail_after(60):
                while len(got) < N:
                    got += await consumer.receive("audited", N, wait=1)
            for m in sorted(got, key=lambda m: m.msg_id)[: N // 2]:
                await consumer.ack(m)
        return [i for i in ids if i is not None]

    ids = anyio.run(traffic)
    wait_for(lambda: trace_frame(spark(), ns).count() == 3 * N + N // 2, 30,
             "the trace topic routed and read")
    rows = trace_frame(spark(), ns).collect()
    assert {r["msg_id"] for r in rows} == set(ids)
    stored = [r for r in rows if r["kind"] == "stored"]
    assert all(r["group"] == "g0" and r["index"] > 0 and r["ms"] > 0 for r in stored)
    delivered = [r for r in rows if r["kind"] == "delivered"]
    assert {(r["cg"], r["client"]) for r in delivered} == {("auditors", "auditor")}
    assert trace_summary(trace_frame(spark(), ns)) == {
        "messages": N, "steps": {"sent": N, "stored": N, "delivered": N, "acked": N // 2},
        "stored_not_delivered": 0, "delivered_not_acked": N - N // 2,
        "delivered_more_than_once": 0}
