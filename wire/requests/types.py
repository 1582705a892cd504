"""Every typed op: its request type and its answer type."""

from __future__ import annotations

from wire.protocol import Op
from wire.requests.base import WireType
from wire.requests.offsets import (
    CommitOffsetAnswer,
    CommitOffsetRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
)
from wire.requests.reads import FetchAnswer, FetchRequest

__all__ = ["TYPES"]

#: The typed ops: request type and answer type.
TYPES: dict[Op, tuple[type[WireType], type[WireType]]] = {
    Op.FETCH: (FetchRequest, FetchAnswer),
    Op.QUERY_OFFSET: (QueryOffsetRequest, QueryOffsetAnswer),
    Op.COMMIT_OFFSET: (CommitOffsetRequest, CommitOffsetAnswer),
}
