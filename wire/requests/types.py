"""Every typed op: its request type and its answer type."""

from __future__ import annotations

from wire.protocol import Op
from wire.requests.base import WireType
from wire.requests.cluster import (
    DropGroupAnswer,
    DropGroupRequest,
    HostGroupAnswer,
    HostGroupRequest,
    MembershipAnswer,
    MembershipRequest,
    StatusAnswer,
    StatusRequest,
    TransferLeaderAnswer,
    TransferLeaderRequest,
)
from wire.requests.consumers import (
    ConsumersAnswer,
    ConsumersRequest,
    HeartbeatAnswer,
    HeartbeatRequest,
)
from wire.requests.namesrv import (
    ClusterAnswer,
    ClusterRequest,
    RegisterAnswer,
    RegisterRequest,
    RouteAnswer,
    RouteRequest,
)
from wire.requests.offsets import (
    CommitOffsetAnswer,
    CommitOffsetRequest,
    DeleteGroupAnswer,
    DeleteGroupRequest,
    OffsetsAnswer,
    OffsetsRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
)
from wire.requests.produce import ProduceAnswer, ProduceRequest
from wire.requests.reads import (
    FetchAnswer,
    FetchRequest,
    GetMessageAnswer,
    GetMessageRequest,
    QueryKeyAnswer,
    QueryKeyRequest,
    ReadRawAnswer,
    ReadRawRequest,
)
from wire.requests.security import (
    AclAddAnswer,
    AclAddRequest,
    AclListAnswer,
    AclListRequest,
    AclRemoveAnswer,
    AclRemoveRequest,
    AuthAnswer,
    AuthRequest,
    UserDeleteAnswer,
    UserDeleteRequest,
    UserListAnswer,
    UserListRequest,
    UserPutAnswer,
    UserPutRequest,
)
from wire.requests.topics import (
    CreateTopicAnswer,
    CreateTopicRequest,
    DeleteTopicAnswer,
    DeleteTopicRequest,
    GrowTopicAnswer,
    GrowTopicRequest,
    TopicsAnswer,
    TopicsRequest,
)
from wire.requests.transactions import (
    HalfEndAnswer,
    HalfEndRequest,
    ProducerHeartbeatAnswer,
    ProducerHeartbeatRequest,
    TxAddAnswer,
    TxAddRequest,
    TxCheckAnswer,
    TxCheckRequest,
    TxEndAnswer,
    TxEndRequest,
    TxInitAnswer,
    TxInitRequest,
    TxListAnswer,
    TxListRequest,
    TxMarkerAnswer,
    TxMarkerRequest,
    TxOffsetsAnswer,
    TxOffsetsRequest,
    TxStatusAnswer,
    TxStatusRequest,
)

__all__ = ["TYPES"]

#: The typed ops: request type and answer type.
TYPES: dict[Op, tuple[type[WireType], type[WireType]]] = {
    Op.FETCH: (FetchRequest, FetchAnswer),
    Op.QUERY_OFFSET: (QueryOffsetRequest, QueryOffsetAnswer),
    Op.COMMIT_OFFSET: (CommitOffsetRequest, CommitOffsetAnswer),
    Op.REGISTER: (RegisterRequest, RegisterAnswer),
    Op.ROUTE: (RouteRequest, RouteAnswer),
    Op.CLUSTER: (ClusterRequest, ClusterAnswer),
    Op.TX_INIT: (TxInitRequest, TxInitAnswer),
    Op.TX_ADD: (TxAddRequest, TxAddAnswer),
    Op.TX_OFFSETS: (TxOffsetsRequest, TxOffsetsAnswer),
    Op.TX_END: (TxEndRequest, TxEndAnswer),
    Op.TX_MARKER: (TxMarkerRequest, TxMarkerAnswer),
    Op.TX_STATUS: (TxStatusRequest, TxStatusAnswer),
    Op.HALF_END: (HalfEndRequest, HalfEndAnswer),
    Op.TX_LIST: (TxListRequest, TxListAnswer),
    Op.TX_CHECK: (TxCheckRequest, TxCheckAnswer),
    Op.PRODUCER_HEARTBEAT: (ProducerHeartbeatRequest, ProducerHeartbeatAnswer),
    Op.AUTH: (AuthRequest, AuthAnswer),
    Op.USER_PUT: (UserPutRequest, UserPutAnswer),
    Op.USER_DELETE: (UserDeleteRequest, UserDeleteAnswer),
    Op.USER_LIST: (UserListRequest, UserListAnswer),
    Op.ACL_ADD: (AclAddRequest, AclAddAnswer),
    Op.ACL_REMOVE: (AclRemoveRequest, AclRemoveAnswer),
    Op.ACL_LIST: (AclListRequest, AclListAnswer),
    Op.PRODUCE: (ProduceRequest, ProduceAnswer),
    Op.GET_MESSAGE: (GetMessageRequest, GetMessageAnswer),
    Op.QUERY_KEY: (QueryKeyRequest, QueryKeyAnswer),
    Op.READ_RAW: (ReadRawRequest, ReadRawAnswer),
    Op.OFFSETS: (OffsetsRequest, OffsetsAnswer),
    Op.DELETE_GROUP: (DeleteGroupRequest, DeleteGroupAnswer),
    Op.CREATE_TOPIC: (CreateTopicRequest, CreateTopicAnswer),
    Op.DELETE_TOPIC: (DeleteTopicRequest, DeleteTopicAnswer),
    Op.GROW_TOPIC: (GrowTopicRequest, GrowTopicAnswer),
    Op.TOPICS: (TopicsRequest, TopicsAnswer),
    Op.STATUS: (StatusRequest, StatusAnswer),
    Op.TRANSFER_LEADER: (TransferLeaderRequest, TransferLeaderAnswer),
    Op.MEMBERSHIP: (MembershipRequest, MembershipAnswer),
    Op.HOST_GROUP: (HostGroupRequest, HostGroupAnswer),
    Op.DROP_GROUP: (DropGroupRequest, DropGroupAnswer),
    Op.HEARTBEAT: (HeartbeatRequest, HeartbeatAnswer),
    Op.CONSUMERS: (ConsumersRequest, ConsumersAnswer),
}
