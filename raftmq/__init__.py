"""raftmq: what users import and run — client SDK, CLI and configuration.

    import raftmq
    async with raftmq.Producer("127.0.0.1:7176") as producer:
        await producer.send("orders", b"hello")

Blocking code uses `raftmq.connect_producer(...)` and friends instead. Every error the
SDK raises is a `RaftMQError`; see `raftmq.client.errors` for the hierarchy.
"""

from raftmq.client import (
    Admin,
    BlockingAdmin,
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    BlockingSimpleConsumer,
    ClientClosedError,
    Code,
    IncompleteError,
    Message,
    OutcomeUnknownError,
    OutgoingMessage,
    PoisonMessage,
    Producer,
    PullConsumer,
    PullResult,
    PushConsumer,
    RaftMQError,
    RequestError,
    SendFuture,
    SendNotDoneError,
    SendResult,
    SimpleConsumer,
    StaleReceiptError,
    TransportError,
    UnavailableError,
    connect_admin,
    connect_producer,
    connect_pull_consumer,
    connect_push_consumer,
    connect_simple_consumer,
)

__all__ = [
    "Admin",
    "BlockingAdmin",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BlockingSimpleConsumer",
    "ClientClosedError",
    "Code",
    "IncompleteError",
    "Message",
    "OutcomeUnknownError",
    "OutgoingMessage",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "RaftMQError",
    "RequestError",
    "SendFuture",
    "SendNotDoneError",
    "SendResult",
    "SimpleConsumer",
    "PoisonMessage",
    "StaleReceiptError",
    "TransportError",
    "UnavailableError",
    "connect_admin",
    "connect_producer",
    "connect_pull_consumer",
    "connect_push_consumer",
    "connect_simple_consumer",
]
