"""The SDK's error rules without a cluster: which failures leave a write's outcome
unknown, what a request raises once its retries are spent, and that leaving a client
object's block neither wraps errors nor turns a cancellation into one."""

from __future__ import annotations

import anyio
import pytest

from raftmq import Admin, OutgoingMessage, Producer, PullConsumer
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
from raftmq.localcluster import free_ports
from transport.connection import ConnectionPool
from wire.protocol import Code, Op, RequestError


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


@pytest.mark.anyio
async def test_a_task_that_meets_its_clients_close_is_no_failure_but_a_real_one_is(
        anyio_backend: str) -> None:
    """A client's task woken just before the close runs on to its next checkpoint and may
    find the client closed: leaving the block must not raise that; a real failure of a
    client task still comes out as itself."""
    from contextlib import AsyncExitStack

    from raftmq.client.errors import ClientClosedError, close_stack

    async def leave_with(error: Exception) -> None:
        woken = anyio.Event()

        async def task() -> None:
            await woken.wait()
            raise error  # no checkpoint between the wake-up and this

        stack = AsyncExitStack()
        tg = await stack.enter_async_context(anyio.create_task_group())
        tg.start_soon(task)
        await anyio.sleep(0.01)
        woken.set()
        tg.cancel_scope.cancel()
        await close_stack(stack, None)

    await leave_with(ClientClosedError("the PullConsumer is not open"))
    with pytest.raises(KeyError):
        await leave_with(KeyError("a real one"))


@pytest.mark.anyio
async def test_no_name_server_answering_is_an_unavailable_error() -> None:
    """`except UnavailableError` catches "the cluster is down", name servers included."""
    dead = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens there
    async with Producer(dead, retries=0) as producer:
        with pytest.raises(UnavailableError, match="no name server answered") as info:
            await producer.send("t", b"x")
    assert isinstance(info.value.__cause__, TransportError)
    assert not may_have_applied(info.value)
    async with Admin(dead) as admin:
        with pytest.raises(UnavailableError):
            await admin.describe_cluster()


@pytest.mark.anyio
async def test_a_producer_used_before_its_block_says_so() -> None:
    from raftmq.client.errors import ClientClosedError

    producer = Producer("127.0.0.1:1")
    for call in (lambda: producer.send("t", b"x"), lambda: producer.send_async("t", b"x"),
                 lambda: producer.send_batch("t", [b"x"])):
        with pytest.raises(ClientClosedError, match="async with Producer"):
            await call()


@pytest.mark.anyio
@pytest.mark.parametrize(("fields", "error", "match"), [
    ({"key": b"k"}, TypeError, "key is a str"),
    ({"key": ["a"]}, TypeError, "key is a str"),
    ({"tags": ["A", "B"]}, TypeError, "one tag"),
    ({"tags": "A,B"}, ValueError, "one tag"),
    ({"tags": "Tag A"}, ValueError, "one tag"),
    ({"tags": "A || B"}, ValueError, "one tag"),
    ({"properties": {"a": 1}}, TypeError, "str to str"),
])
async def test_a_message_no_subscription_could_select_is_refused_before_sending(
    fields: dict, error: type[Exception], match: str,
) -> None:
    async with Producer("127.0.0.1:1", retries=0) as producer:  # never reached
        with pytest.raises(error, match=match):
            await producer.send("t", b"x", **fields)
        with pytest.raises(error, match=match):
            await producer.send_batch("t", [b"ok", OutgoingMessage(b"x", **fields)])


@pytest.mark.parametrize(("answer", "verdict"), [
    ("commit", "commit"), ("COMMIT", "commit"), (" Rollback ", "rollback"),
    ("COMMIT_MESSAGE", "commit"), ("ROLLBACK_MESSAGE", "rollback"), ("UNKNOW", "unknown"),
    (None, "unknown"), ("unknown", "unknown"),
    (True, None), (1, None), ("yes", None), (b"commit", None),
])
def test_listener_answers_read_as_verdicts_or_not_at_all(answer: object, verdict: object) -> None:
    import enum

    from raftmq.client.transactions import verdict as read_verdict

    assert read_verdict(answer) == verdict

    class State(enum.Enum):
        COMMIT_MESSAGE = 1
        ROLLBACK = "rollback"
        OTHER = 3

    assert [read_verdict(s) for s in State] == ["commit", "rollback", None]


@pytest.mark.parametrize("expr", ["TagA,TagB", "Tag A", ["A", "B,C"], "A || *"])
def test_a_subscription_no_message_could_match_is_a_value_error(expr: object) -> None:
    from raftmq.client.consumer import parse_tags

    with pytest.raises(ValueError, match="bad tag subscription"):
        parse_tags(expr)  # type: ignore[arg-type]
