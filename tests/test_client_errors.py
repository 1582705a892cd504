"""The SDK's error rules without a cluster: which failures leave a write's outcome
unknown, what a request raises once its retries are spent, and that leaving a client
object's block neither wraps errors nor turns a cancellation into one."""

from __future__ import annotations

import anyio
import pytest

from broker.protocol import Code, RequestError
from raftmq import Admin, Producer, PullConsumer
from raftmq.client.errors import (
    OutcomeUnknownError,
    RaftMQError,
    TransportError,
    UnavailableError,
    give_up,
    may_have_applied,
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize(("error", "unknown"), [
    (TransportError("refused", sent=False), False),
    (TransportError("lost after sending", sent=True), True),
    (RequestError(Code.TIMEOUT, "no answer"), True),
    (RequestError(Code.NOT_LEADER, "not me"), False),
    (RequestError(Code.NOT_LEADER, "lost it after proposing", unknown=True), True),
    (RequestError(Code.PROPOSAL_DROPPED, "nothing written"), False),
    (RequestError(Code.STALE_REQUEST, "retry older than the window"), True),
    (RequestError(Code.UNKNOWN_TOPIC, "no such topic"), False),
    (UnavailableError("nobody leads"), False),
])
def test_which_failures_leave_a_write_in_doubt(error: RequestError, unknown: bool) -> None:
    assert may_have_applied(error) is unknown


def test_spent_retries_say_unknown_unavailable_or_the_refusal() -> None:
    timeout = RequestError(Code.TIMEOUT, "no answer")
    assert isinstance(give_up(timeout, "send", uncertain=True), OutcomeUnknownError)
    for no_leader in (timeout, RequestError(Code.NOT_LEADER, "x"),
                      TransportError("refused", sent=False)):
        err = give_up(no_leader, "fetch")
        assert isinstance(err, UnavailableError) and err.code == Code.UNAVAILABLE
    refusal = RequestError(Code.MESSAGE_TOO_LARGE, "big")
    assert give_up(refusal, "send") is refusal
    for cls in (OutcomeUnknownError, UnavailableError, TransportError):
        assert issubclass(cls, RequestError) and issubclass(cls, RaftMQError)


@pytest.mark.anyio
async def test_leaving_a_client_block_keeps_errors_and_cancellations_as_they_are(
        anyio_backend: str) -> None:
    makers = [lambda: Producer("127.0.0.1:1"), lambda: PullConsumer("127.0.0.1:1", "g"),
              lambda: Admin("127.0.0.1:1")]
    for make in makers:
        with anyio.move_on_after(0.1) as scope:
            async with make():
                await anyio.sleep(5)
        assert scope.cancelled_caught
        with pytest.raises(KeyError):
            async with make():
                raise KeyError("mine")
