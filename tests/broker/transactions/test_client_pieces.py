"""The SDK's transaction pieces that need no cluster: listener verdicts, error mapping,
argument checks, and what a transactional producer refuses before any request."""

from __future__ import annotations

import threading

import pytest

from raftmq.client import (
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionError,
)
from raftmq.client.transactions import CheckRequest, decide, verdict
from raftmq.commands.tx import main as tx_main
from wire.protocol import Code, RequestError

NS = "127.0.0.1:1"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_verdict_is_one_of_three_answers_and_anything_else_is_none() -> None:
    for v in ("commit", "rollback", "unknown"):
        assert verdict(v) == v
    assert verdict("COMMIT") == "commit" and verdict(None) == "unknown"
    for v in ("yes", True, 1, b"commit"):
        assert verdict(v) is None


REQ = CheckRequest("t" * 32, "topic", 0, "g0:1:2", "g0", "pg", 1)


@pytest.mark.anyio
async def test_listeners_may_be_plain_or_async_and_their_failures_say_unknown() -> None:
    loop_thread = threading.get_ident()
    ran_in: list[int] = []

    def plain(req: CheckRequest) -> str:
        ran_in.append(threading.get_ident())
        return "rollback" if req.checks == 1 else "commit"

    async def coro(_req: CheckRequest) -> str:
        return "commit"

    def raises(_req: CheckRequest) -> str:
        raise RuntimeError("the database is down")

    async def bad(_req: CheckRequest) -> object:
        return 42

    assert await decide(plain, REQ, "x") == ("rollback", None)
    assert ran_in and ran_in[0] != loop_thread  # a plain listener may block: a thread
    assert await decide(coro, REQ, "x") == ("commit", None)
    answer, error = await decide(raises, REQ, "x")
    assert answer == "unknown" and isinstance(error, RuntimeError)
    answer, error = await decide(bad, REQ, "x")  # not a verdict: a bug, said as one
    assert answer == "unknown" and isinstance(error, TypeError)


def test_bad_transaction_arguments_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="transactional id"):
        Producer(NS, transactional_id="")
    with pytest.raises(ValueError, match="transactional id"):
        Producer(NS, transactional_id="x" * 256)
    with pytest.raises(ValueError, match="transaction_timeout_ms"):
        Producer(NS, transactional_id="t", transaction_timeout_ms=0)
    with pytest.raises(ValueError, match="producer_group"):
        Producer(NS, check_listener=lambda r: "commit")
    with pytest.raises(RequestError) as info:
        Producer(NS, producer_group="bad group!")
    assert info.value.code == Code.INVALID_NAME
    p = Producer(NS, transactional_id="t")
    assert p.idempotent and p.max_in_flight == 1 and not p.fenced


@pytest.mark.anyio
async def test_a_transactional_producer_sends_inside_transactions_only() -> None:
    p = Producer(NS, transactional_id="t")
    with pytest.raises(TransactionError, match="inside transactions"):
        await p.send("t", b"x")
    with pytest.raises(TransactionError, match="inside transactions"):
        await p.send_batch("t", [b"x"])
    plain = Producer(NS)
    with pytest.raises(ValueError, match="transactional_id"):
        await plain.begin()
    with pytest.raises(ValueError, match="producer_group"):
        await plain.prepare("t", b"x")


@pytest.mark.parametrize("isolation", ["read_uncommitted", "READ_COMMITTED", ""])
def test_consumers_read_committed_only(isolation: str) -> None:
    assert PullConsumer(NS, "c").isolation == "read_committed"
    with pytest.raises(ValueError, match="not supported"):
        PullConsumer(NS, "c", isolation=isolation)
    with pytest.raises(ValueError, match="not supported"):
        PushConsumer(NS, "c", ["t"], lambda m: True, isolation=isolation)


def test_tx_command_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert tx_main([]) == 2
    assert "choose list, show, commit or rollback" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        tx_main(["commit"])  # no txid
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        tx_main(["list", "--limit", "0"])
    assert info.value.code == 2

