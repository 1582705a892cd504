"""raftmq: what users import and run — client SDK, CLI and configuration.

    import raftmq
    async with raftmq.Producer("127.0.0.1:9876") as producer:
        await producer.send("orders", b"hello")

Blocking code uses `raftmq.connect_producer(...)` and friends instead.
"""

from raftmq.client import (
    Admin,
    BlockingAdmin,
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    ClientClosedError,
    Code,
    Message,
    OutgoingMessage,
    Producer,
    PullConsumer,
    PullResult,
    PushConsumer,
    RequestError,
    SendFuture,
    SendResult,
    TransportError,
    connect_admin,
    connect_producer,
    connect_pull_consumer,
    connect_push_consumer,
)

__all__ = [
    "Admin",
    "BlockingAdmin",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "ClientClosedError",
    "Code",
    "Message",
    "OutgoingMessage",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "RequestError",
    "SendFuture",
    "SendResult",
    "TransportError",
    "connect_admin",
    "connect_producer",
    "connect_pull_consumer",
    "connect_push_consumer",
]
