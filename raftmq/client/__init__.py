"""The raftmq client SDK: async (anyio: asyncio or trio) producer, consumers and admin,
plus blocking wrappers. It speaks only the wire protocol of `wire.protocol` and the
batch format of `wire.records`."""

from raftmq.filter import FilterError
from transport.connection import Connection, ConnectionPool
from wire.protocol import Code, RequestError
from wire.records import MESSAGE_GROUP_PROPERTY, Message, OutgoingMessage

from .admin import (
    Admin,
    DeadLetter,
    GroupQueue,
    QueueInfo,
    QueueLag,
    TopicInfo,
    TxListing,
    place_queues,
)
from .allocation import allocate_average, allocate_round_robin
from .blocking import (
    BlockingAdmin,
    BlockingHalfHandle,
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    BlockingSimpleConsumer,
    BlockingTransaction,
    connect_admin,
    connect_producer,
    connect_pull_consumer,
    connect_push_consumer,
    connect_simple_consumer,
)
from .errors import (
    ClientClosedError,
    IncompleteError,
    LockLostError,
    OutcomeUnknownError,
    PoisonMessage,
    ProducerFencedError,
    RaftMQError,
    StaleReceiptError,
    TransactionAbortedError,
    TransactionError,
    TransportError,
    UnavailableError,
)
from .localoffsets import OffsetsInUseError
from .membership import GroupMembers
from .offsetwindow import OffsetWindow
from .producer import Producer, SendFuture, SendNotDoneError, SendResult, key_queue
from .pull import PullConsumer
from .push import PushConsumer
from .reads import MessageSelector, PullResult
from .routes import Routes, TopicRoute
from .simple import Receipt, ReceivedMessage, SimpleConsumer
from .transactions import CheckRequest, HalfHandle, Transaction, TransactionResult

__all__ = [
    "Admin",
    "BlockingAdmin",
    "BlockingHalfHandle",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BlockingSimpleConsumer",
    "BlockingTransaction",
    "CheckRequest",
    "ClientClosedError",
    "Code",
    "Connection",
    "ConnectionPool",
    "DeadLetter",
    "FilterError",
    "GroupMembers",
    "MESSAGE_GROUP_PROPERTY",
    "GroupQueue",
    "HalfHandle",
    "IncompleteError",
    "Message",
    "MessageSelector",
    "OffsetWindow",
    "OffsetsInUseError",
    "OutcomeUnknownError",
    "OutgoingMessage",
    "Producer",
    "ProducerFencedError",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "QueueInfo",
    "QueueLag",
    "RaftMQError",
    "Receipt",
    "ReceivedMessage",
    "RequestError",
    "Routes",
    "SendFuture",
    "SendNotDoneError",
    "SendResult",
    "SimpleConsumer",
    "PoisonMessage",
    "LockLostError",
    "StaleReceiptError",
    "TopicInfo",
    "TopicRoute",
    "Transaction",
    "TransactionAbortedError",
    "TransactionError",
    "TransactionResult",
    "TransportError",
    "TxListing",
    "UnavailableError",
    "allocate_average",
    "allocate_round_robin",
    "connect_admin",
    "connect_producer",
    "connect_pull_consumer",
    "connect_push_consumer",
    "connect_simple_consumer",
    "key_queue",
    "place_queues",
]
