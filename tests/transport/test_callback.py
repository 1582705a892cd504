"""Requests from the server to a client on the client's own connection, over real sockets:
a handler of `serve_frames` calls the client back (`Caller.request`) and the client answers
with the handler it registered (`ConnectionPool.on_request`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from transport.connection import ConnectionPool
from transport.framing import Caller, CallerGone, FrameStream, Response, serve_frames
from wire.protocol import Code, Frame, RequestError

ASK = 90  # client -> server: "ask me back"
CHECK = 91  # server -> client: the question (as a transaction check-back will be)
Handler = Callable[[Caller, Frame], Awaitable[Response | None]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[str]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners,
                           lambda s: serve_frames(s, handler), listeners)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


async def ask_back(caller: Caller, frame: Frame) -> Response:
    """Answers ASK with what the client said to CHECK (or the error it raised)."""
    try:
        answer = await caller.request(CHECK, {"txn": frame.header["txn"]}, b"q", timeout=5)
    except RequestError as exc:
        return {"code": 0, "error": int(exc.code), "gone": isinstance(exc, CallerGone)}, b""
    return {"code": 0, "said": answer.header["decision"], "remote": caller.remote}, answer.body


def test_the_server_calls_the_client_back_on_its_own_connection() -> None:
    seen: list[dict[str, Any]] = []

    async def check(frame: Frame) -> tuple[dict[str, Any], bytes]:
        seen.append(frame.header)
        return {"decision": "commit" if frame.header["txn"] == "t1" else "rollback"}, b"a"

    async def main() -> None:
        async with server(ask_back) as addr, ConnectionPool() as pool:
            pool.on_request(CHECK, check)
            f1 = await pool.request(addr, ASK, {"txn": "t1"})
            f2 = await pool.request(addr, ASK, {"txn": "t2"})
            assert (f1.header["said"], f1.body) == ("commit", b"a")
            assert f2.header["said"] == "rollback"
            assert f1.header["remote"].startswith("127.0.0.1:")
            assert pool.connection(addr).connects == 1  # one connection, both directions
        assert [h["txn"] for h in seen] == ["t1", "t2"]
        assert all(h["op"] == CHECK for h in seen)

    trio.run(main)


def test_a_client_without_a_handler_answers_unknown_op_and_a_failing_one_its_error() -> None:
    async def refuse(frame: Frame) -> tuple[dict[str, Any], bytes]:
        raise RequestError(Code.BUSY, "not now")

    async def main() -> None:
        async with server(ask_back) as addr, ConnectionPool() as pool:
            f = await pool.request(addr, ASK, {"txn": "t1"})
            assert f.header["error"] == Code.UNKNOWN_OP
            pool.on_request(CHECK, refuse)
            f = await pool.request(addr, ASK, {"txn": "t1"})
            assert f.header["error"] == Code.BUSY and not f.header["gone"]

    trio.run(main)


def test_a_caller_that_hangs_up_fails_the_request_sent_to_it() -> None:
    """A duty outside the connection (the transaction checker) holds a client's `Caller`;
    when the client leaves, a request waiting on it, and any later one, fail as gone."""
    callers: list[Caller] = []
    outcome: list[RequestError] = []
    asked = trio.Event()

    async def hello(caller: Caller, frame: Frame) -> Response:
        callers.append(caller)
        return {"code": 0}, b""

    async def hang(frame: Frame) -> tuple[dict[str, Any], bytes]:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError

    async def check_back(caller: Caller) -> None:
        try:
            await caller.request(CHECK, {}, timeout=30)
        except RequestError as exc:
            outcome.append(exc)

    async def main() -> None:
        async with server(hello) as addr, trio.open_nursery() as nursery:
            async with ConnectionPool() as pool:
                pool.on_request(CHECK, hang)
                await pool.request(addr, ASK)
                nursery.start_soon(check_back, callers[0])
                with trio.fail_after(10):  # the client never took the request
                    await asked.wait()
            with trio.fail_after(5):
                while not outcome:
                    await trio.sleep(0.01)
            with pytest.raises(CallerGone):
                await callers[0].request(CHECK, {}, timeout=30)

    trio.run(main)
    assert isinstance(outcome[0], CallerGone) and outcome[0].code == Code.TIMEOUT


def test_answers_are_told_from_requests() -> None:
    """Only a frame with a code, no op and a negative id (the server's own ids) can be an
    answer; anything else a client sends is a request (answered UNKNOWN_OP by the node),
    so a client's frame is never swallowed unanswered."""
    from transport.framing import is_answer

    assert is_answer(Frame({"id": -1, "code": 0}))
    assert not is_answer(Frame({"id": 1, "code": 0}))
    assert not is_answer(Frame({"code": "F"}))
    assert not is_answer(Frame({"id": -1}))
    assert not is_answer(Frame({"id": -1, "op": 2, "code": 0}))


def test_an_answer_nobody_waits_for_is_treated_as_a_request() -> None:
    """A late answer (its request timed out) reaches the handler as a request; the error
    sent back carries the negative id, which the client matches to nothing of its own."""

    async def late(caller: Caller, frame: Frame) -> Response:
        if frame.header.get("op") is None:
            return {"code": int(Code.UNKNOWN_OP), "msg": "no such request"}, b""
        return {"code": 0}, b""

    async def main() -> None:
        async with server(late) as addr:
            host, port = addr.split(":")
            stream = await trio.open_tcp_stream(host, int(port))
            fs = FrameStream(stream)
            await fs.send({"id": -7, "code": 0, "decision": "too late"})
            f = await fs.receive()
            assert f is not None and f.header["id"] == -7
            assert f.header["code"] == Code.UNKNOWN_OP
            await fs.aclose()

    trio.run(main)
