"""The raftmq client SDK: async (anyio: asyncio or trio) producer, consumers and admin,
plus blocking wrappers. It speaks only the wire protocol of `broker.protocol` and the
batch format of `broker.records`."""

from broker.protocol import Code, RequestError
from broker.records import Message, OutgoingMessage
from transport.connection import ClientClosedError, Connection, ConnectionPool, TransportError

from .admin import Admin, QueueInfo, QueueLag, TopicInfo, place_queues
from .blocking import (
    BlockingAdmin,
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    connect_admin,
    connect_producer,
    connect_pull_consumer,
    connect_push_consumer,
)
from .consumer import (
    OffsetWindow,
    PullConsumer,
    PullResult,
    PushConsumer,
    allocate_average,
    allocate_round_robin,
)
from .producer import Producer, SendFuture, SendResult, key_queue
from .routes import Routes, TopicRoute

__all__ = [
    "Admin",
    "BlockingAdmin",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "ClientClosedError",
    "Code",
    "Connection",
    "ConnectionPool",
    "Message",
    "OffsetWindow",
    "OutgoingMessage",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "QueueInfo",
    "QueueLag",
    "RequestError",
    "Routes",
    "SendFuture",
    "SendResult",
    "TopicInfo",
    "TopicRoute",
    "TransportError",
    "allocate_average",
    "allocate_round_robin",
    "connect_admin",
    "connect_producer",
    "connect_pull_consumer",
    "connect_push_consumer",
    "key_queue",
    "place_queues",
]
