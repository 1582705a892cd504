"""The errors of the connection layer, and leaving a task group with the caller's error.

They live here, below the client SDK, because `connection` raises them; the SDK's error
hierarchy (`raftmq.client.errors`) re-exports them beside its own.

    RaftMQError (wire.protocol)
    ├── RequestError
    │   └── TransportError        the connection failed (`.sent`: the request had left)
    └── ClientClosedError         the client object is closed, or was never opened
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from wire.protocol import Code, RaftMQError, RequestError

__all__ = ["ClientClosedError", "TransportError", "close_stack", "leaves", "unwrap"]


class TransportError(RequestError):
    """The connection failed before an answer arrived.

    Retriable. `sent` is False only when the request certainly never left this process
    (the dial failed: code UNAVAILABLE), so a caller can tell "not written" from
    "outcome unknown" (code CONNECTION_LOST).
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(Code.CONNECTION_LOST if sent else Code.UNAVAILABLE, message)
        self.sent = sent


class ClientClosedError(RaftMQError, RuntimeError):
    """The client object was closed (or never opened with `async with`)."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or `[exc]`."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def unwrap(exc: BaseException) -> BaseException:
    """The one real error inside task-group wrapping (cancellations aside), else `exc`."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    cancelled = anyio.get_cancelled_exc_class()
    real = [e for e in leaves(exc) if not isinstance(e, cancelled)]
    return real[0] if len(real) == 1 else exc


async def close_stack(stack: AbstractAsyncContextManager[Any], exc: BaseException | None) -> bool:
    """Leave a client object's exit stack (its task group and pool) while `exc` is
    propagating out of the user's block, so that `exc` leaves as itself.

    The stack sees the error (its task group cancels its tasks), and the exception group
    that comes back is dropped in favour of the caller's own error. When the block
    succeeded, a failure of the client's own tasks is raised, unwrapped if it is one.
    A task that ran on between the close and its cancellation and met the closed client
    (`ClientClosedError`) did not fail: the close is what it met.
    Returns what the stack returned (True: `exc` was a cancellation it absorbed).
    """
    try:
        return bool(await stack.__aexit__(
            type(exc) if exc else None, exc, exc.__traceback__ if exc else None))
    except BaseExceptionGroup as whole:
        if exc is not None:
            return False  # the caller's error goes on as it was raised
        _, group = whole.split(ClientClosedError)
        if group is None:
            return False
        real = unwrap(group)
        if real is whole:
            raise
        raise real from None
