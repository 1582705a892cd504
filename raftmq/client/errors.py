"""The errors the SDK raises, and the one rule for leaving a client object's block.

    RaftMQError                   every error raftmq raises to a caller
    ├── RequestError              a request failed; `.code` (a `Code`), `.message`, `.extra`
    │   ├── TransportError        the connection failed (`.sent`: the request had left)
    │   ├── UnavailableError      no node could be reached, or none leads the group now;
    │   │                         nothing was written (code UNAVAILABLE)
    │   └── OutcomeUnknownError   a write may or may not have been applied (a timeout, a
    │                             connection lost after sending): check before resending
    └── ClientClosedError         the client object is closed, or was never opened

A definite refusal is a `RequestError` with the broker's code (UNKNOWN_TOPIC,
MESSAGE_TOO_LARGE, OFFSET_TOO_LARGE, ...): nothing was written. `RequestError.retriable`
says whether trying again later may succeed.

Client objects (`Producer`, `PullConsumer`, `PushConsumer`, `Admin`) own task groups,
which wrap whatever leaves them in an `ExceptionGroup`; `close_stack` undoes that, so an
error raised inside `async with Producer(...)` leaves the block as itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from broker.protocol import Code, RaftMQError, RequestError

__all__ = [
    "ClientClosedError",
    "OutcomeUnknownError",
    "RaftMQError",
    "RequestError",
    "TransportError",
    "UnavailableError",
    "close_stack",
    "give_up",
    "leaves",
    "may_have_applied",
    "unwrap",
]


class TransportError(RequestError):
    """The connection failed before an answer arrived.

    Retriable. `sent` is False only when the request certainly never left this process
    (the dial failed: code UNAVAILABLE), so a caller can tell "not written" from
    "outcome unknown" (code CONNECTION_LOST).
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(Code.CONNECTION_LOST if sent else Code.UNAVAILABLE, message)
        self.sent = sent


class UnavailableError(RequestError):
    """No node could be reached, or no replica leads the group (a quorum is lost); the
    request was not applied. Retriable later."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.UNAVAILABLE, message, **extra)


class OutcomeUnknownError(RequestError):
    """A write was sent but no answer says whether it was applied (a timeout, a
    connection lost after sending, a leader lost before the entry committed). The write
    may have been stored: look for it (by key or id) before sending it again, or use an
    idempotent producer, whose retries are never stored twice."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.TIMEOUT, message, **extra)


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
    Returns what the stack returned (True: `exc` was a cancellation it absorbed).
    """
    try:
        return bool(await stack.__aexit__(
            type(exc) if exc else None, exc, exc.__traceback__ if exc else None))
    except BaseExceptionGroup as group:
        if exc is not None:
            return False  # the caller's error goes on as it was raised
        real = unwrap(group)
        if real is group:
            raise
        raise real from None


_NO_LEADER = frozenset({Code.NOT_LEADER, Code.TIMEOUT, Code.UNAVAILABLE, Code.CONNECTION_LOST,
                        Code.PROPOSAL_DROPPED})


def may_have_applied(exc: RequestError) -> bool:
    """Whether a write that failed with `exc` may have been applied all the same: no
    answer came (a timeout, a connection lost after sending), or the leader that took it
    lost leadership before the entry committed (NOT_LEADER marked `unknown`)."""
    if isinstance(exc, OutcomeUnknownError):
        return True
    if isinstance(exc, (UnavailableError, ClientClosedError)):
        return False
    if isinstance(exc, TransportError):
        return exc.sent
    return exc.code == Code.TIMEOUT or bool(exc.extra.get("unknown"))


def give_up(exc: RequestError, what: str, *, uncertain: bool = False) -> RequestError:
    """The error to raise once a request's retries are spent on `exc`.

    A write any of whose attempts may have been applied (`uncertain`) is an
    `OutcomeUnknownError`; a request no leader answered (no node reachable, none leading,
    answers that never came) is an `UnavailableError`, whatever the last attempt met, so a
    lost quorum reads the same in every command; any other error is raised as it is.
    """
    if isinstance(exc, (OutcomeUnknownError, UnavailableError)):
        return exc
    if uncertain:
        return OutcomeUnknownError(
            f"{what}: no answer says whether it was stored ({exc.message}); it may have "
            "been: check before sending it again", **exc.extra)
    if isinstance(exc, TransportError) or exc.code in _NO_LEADER:
        return UnavailableError(f"{what}: no leader answered ({exc.message})", **exc.extra)
    return exc
