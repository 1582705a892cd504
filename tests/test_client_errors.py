"""The SDK's error rules without a cluster: which failures leave a write's outcome
unknown, what a request raises once its retries are spent, and that leaving a client
object's block neither wraps errors nor turns a cancellation into one."""

from __future__ import annotations

import anyio
import pytest

from broker.protocol import Code, Op, RequestError
from raftmq import Admin, Producer, PullConsumer
from raftmq.client.errors import (
    OutcomeUnknownError,
    ProducerFencedError,
    RaftMQError,
    TransactionError,
    TransportError,
    UnavailableError,
    as_sdk_error,
    give_up,
    may_have_applied,
)
from raftmq.client.routes import Routes, parse_route
from transport.connection import ConnectionPool


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
    # a later try that found no leader proves nothing of an earlier one that may have
    # been stored (a route lookup, or a caller's own loop over one-attempt calls)
    nobody = UnavailableError("send: no leader answered")
    assert give_up(nobody, "send") is nobody
    assert isinstance(give_up(nobody, "send", uncertain=True), OutcomeUnknownError)
    for cls in (OutcomeUnknownError, UnavailableError, TransportError):
        assert issubclass(cls, RequestError) and issubclass(cls, RaftMQError)


def test_transaction_refusals_are_the_sdks_transaction_errors() -> None:
    fenced = as_sdk_error(RequestError(Code.TX_FENCED, "newer epoch 3"))
    assert isinstance(fenced, ProducerFencedError) and fenced.code == Code.TX_FENCED
    for code in (Code.TX_UNKNOWN, Code.TX_DECIDED, Code.TX_LIMIT):
        err = as_sdk_error(RequestError(code, "no"))
        assert type(err) is TransactionError and err.code == code
        assert type(give_up(RequestError(code, "no"), "send")) is TransactionError
    other = RequestError(Code.NOT_LEADER, "elsewhere")
    assert as_sdk_error(other) is other


class _Refusing(ConnectionPool):
    """Every node answers with one refusal (the broker's answer, without a broker)."""

    def __init__(self, code: Code) -> None:
        super().__init__()
        self.code = code

    async def request(self, addr: str, op: object, header: object = None,
                      body: object = b"", **_: object) -> object:
        raise RequestError(self.code, f"{addr} refuses", detail=1)


@pytest.mark.anyio
@pytest.mark.parametrize(("code", "cls"), [(Code.TX_FENCED, ProducerFencedError),
                                          (Code.TX_LIMIT, TransactionError),
                                          (Code.TX_UNKNOWN, TransactionError)])
async def test_any_call_meeting_a_transaction_refusal_raises_the_sdks_type(
        anyio_backend: str, code: Code, cls: type) -> None:
    """A PRODUCE (a half message, a transaction's batch) refused with a transaction code
    raises the same type as the transaction calls do, itself, not wrapped."""
    routes = Routes(_Refusing(code), ["ns:1"])
    route = parse_route("t", {"total": 1, "queues": [[0, "g1", "a:1"]],
                              "replicas": {"g1": ["a:1"]}}, 100.0)
    routes._topics["t"] = route
    routes.learn_route(route, 100.0)
    with pytest.raises(cls) as caught:
        await routes.call_queue("t", 0, Op.PRODUCE, {"g": "g1"}, b"x", write=True)
    assert type(caught.value) is cls and caught.value.code == code
    assert caught.value.extra == {"detail": 1}


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
