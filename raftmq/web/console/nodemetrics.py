"""What the console reads from the nodes' Prometheus endpoints: fsync latency and the
produce/fetch counters the live rates are drawn from.

`summarize` is pure (exposition text in, numbers out); `scrape` fetches every node's
text concurrently. A node whose endpoint does not answer is simply absent: its STATUS
already says whether it is up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["NodeMetrics", "scrape", "summarize", "totals"]

SCRAPE_TIMEOUT = 2.0

NodeMetrics = dict[str, dict[str, float]]
"""{group: {"fsyncs", "fsync_seconds", "produced", "fetched"}} of one node."""

_SAMPLES = {
    "raftmq_fsync_seconds_count": "fsyncs",
    "raftmq_fsync_seconds_sum": "fsync_seconds",
    "raftmq_produce_messages_total": "produced",
    "raftmq_fetch_messages_total": "fetched",
}


def summarize(text: str) -> NodeMetrics:
    """The per-group numbers of one node's exposition `text`."""
    out: NodeMetrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _SAMPLES.get(sample.name)
            group = sample.labels.get("group")
            if key is None or group is None:
                continue
            g = out.setdefault(group, {"fsyncs": 0.0, "fsync_seconds": 0.0,
                                       "produced": 0.0, "fetched": 0.0})
            g[key] += float(sample.value)
    return out


async def scrape(addresses: Mapping[int, str]) -> dict[int, NodeMetrics]:
    """{node: its summarized metrics} for each node whose endpoint answered."""
    found: dict[int, NodeMetrics] = {}

    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT) as client:
        async def one(node: int, addr: str) -> None:
            try:
                answer = await client.get(f"http://{addr}/metrics")
                answer.raise_for_status()
                found[node] = summarize(answer.text)
            except (httpx.HTTPError, ValueError):
                return

        async with anyio.create_task_group() as tg:
            for node, addr in addresses.items():
                tg.start_soon(one, node, addr)
    return found


def totals(metrics: Mapping[int, NodeMetrics]) -> dict[str, Any]:
    """Cluster-wide counters (every node counts what it served as leader) and each
    group's mean fsync latency per node, in ms."""
    produced = sum(g["produced"] for m in metrics.values() for g in m.values())
    fetched = sum(g["fetched"] for m in metrics.values() for g in m.values())
    fsync_ms = {node: {gid: round(1000 * g["fsync_seconds"] / g["fsyncs"], 3)
                       for gid, g in m.items() if g["fsyncs"]}
                for node, m in metrics.items()}
    return {"produced": int(produced), "fetched": int(fetched), "fsync_ms": fsync_ms}
