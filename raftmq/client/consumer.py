"""Consumers: a pull consumer with explicit positions, and a push consumer built on it.

Both read with FETCH from the leader of the group hosting a queue; the node holds a
fetch at the end of a queue for up to `wait_ms` (long polling), so an idle consumer costs
one request per hold period per queue.

Offsets follow RocketMQ: a committed offset is the next offset to consume. Clustering
groups commit through the Raft log (COMMIT_OFFSET), so a failover never rewinds them;
broadcast consumers keep their offsets in a local file (`raftmq.client.localoffsets`).

The push consumer hands messages to the handler concurrently, so they finish out of
order; an `OffsetWindow` per queue commits only the lowest unfinished offset, which
means a crash redelivers (at least once) but never skips a message.

This module is the consumers' public face; the parts live beside it:

* `reads`: the read path both share (FETCH and its answer, queue bounds, committed
  offsets);
* `allocation`: how a group shares a topic's queues among its members;
* `groupclient`: membership in a consumer group (heartbeats, members, assignment);
* `pull` and `push`: the two consumers;
* `offsetwindow`: what a push consumer may commit while handlers finish out of order.
"""

from __future__ import annotations

from .allocation import allocate_average, allocate_round_robin
from .groupclient import QueuesCallback, check_isolation
from .offsetwindow import OffsetWindow
from .pull import CALL_TIMEOUT, PullConsumer
from .push import PushConsumer
from .reads import (
    LONG_POLL_MS,
    PullResult,
    Tags,
    commit_offsets,
    decode_fetch,
    fetch,
    fetch_answer,
    parse_tags,
    query_offset,
    queue_bounds,
)

__all__ = [
    "CALL_TIMEOUT",
    "LONG_POLL_MS",
    "OffsetWindow",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "QueuesCallback",
    "Tags",
    "allocate_average",
    "allocate_round_robin",
    "check_isolation",
    "commit_offsets",
    "decode_fetch",
    "fetch",
    "fetch_answer",
    "parse_tags",
    "query_offset",
    "queue_bounds",
]
