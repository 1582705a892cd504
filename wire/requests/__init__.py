"""One frozen, validated type per request and per answer of the wire protocol.

A request's header is a msgpack map from an untrusted peer. Its type says once which
fields it has, of what kind, which are optional (and their defaults) and how each is
checked, and `decode` turns a header into an instance or raises `RequestError` with the
code and message a malformed header has always had (MALFORMED naming the field, or the
field's own check's code, e.g. INVALID_NAME for a bad topic name). The node's doors
decode at the trust boundary and use typed values from there on; the SDK builds its
headers from the same types (`header()`), so both ends agree by construction; and
`docs/protocol.md` is generated from them (`python -m wire.requests`, held current by a
test).

One module per area (`reads`, `offsets`, ...) holds its ops' types; `types.TYPES` lists
them all. The ops not listed there yet are still described by the comments on
`wire.protocol.Op`, which the generated reference quotes for them.
"""

from wire.requests.base import WireType
from wire.requests.namesrv import (
    ClusterAnswer,
    ClusterRequest,
    FrozenMap,
    RegisterAnswer,
    RegisterAuth,
    RegisterGroup,
    RegisterRequest,
    RegisterTable,
    RouteAnswer,
    RouteRequest,
    TopicShape,
    shapes_of,
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
    is_offset_item,
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
from wire.requests.reference import op_comments, reference
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
from wire.requests.types import TYPES

__all__ = [
    "TYPES",
    "ClusterAnswer",
    "ClusterRequest",
    "CommitOffsetAnswer",
    "CommitOffsetRequest",
    "FetchAnswer",
    "FetchRequest",
    "FrozenMap",
    "QueryOffsetAnswer",
    "QueryOffsetRequest",
    "RegisterAnswer",
    "RegisterAuth",
    "RegisterGroup",
    "RegisterRequest",
    "RegisterTable",
    "RouteAnswer",
    "RouteRequest",
    "TopicShape",
    "AclAddAnswer",
    "AclAddRequest",
    "AclListAnswer",
    "AclListRequest",
    "AclRemoveAnswer",
    "AclRemoveRequest",
    "AuthAnswer",
    "AuthRequest",
    "UserDeleteAnswer",
    "UserDeleteRequest",
    "UserListAnswer",
    "UserListRequest",
    "UserPutAnswer",
    "UserPutRequest",
    "HalfEndAnswer",
    "HalfEndRequest",
    "ProducerHeartbeatAnswer",
    "ProducerHeartbeatRequest",
    "TxAddAnswer",
    "TxAddRequest",
    "TxCheckAnswer",
    "TxCheckRequest",
    "TxEndAnswer",
    "TxEndRequest",
    "TxInitAnswer",
    "TxInitRequest",
    "TxListAnswer",
    "TxListRequest",
    "TxMarkerAnswer",
    "TxMarkerRequest",
    "TxOffsetsAnswer",
    "TxOffsetsRequest",
    "TxStatusAnswer",
    "TxStatusRequest",
    "WireType",
    "is_offset_item",
    "op_comments",
    "reference",
    "shapes_of",
    "ProduceAnswer",
    "ProduceRequest",
    "GetMessageAnswer",
    "GetMessageRequest",
    "QueryKeyAnswer",
    "QueryKeyRequest",
    "ReadRawAnswer",
    "ReadRawRequest",
    "DeleteGroupAnswer",
    "DeleteGroupRequest",
    "OffsetsAnswer",
    "OffsetsRequest",
    "CreateTopicAnswer",
    "CreateTopicRequest",
    "DeleteTopicAnswer",
    "DeleteTopicRequest",
    "GrowTopicAnswer",
    "GrowTopicRequest",
    "TopicsAnswer",
    "TopicsRequest",
]
