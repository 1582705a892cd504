"""The producer-group registry (who answers check-backs) and the transaction settings of
a node's config."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.config import ConfigError, NodeConfig, dump_config
from broker.doors.producer_groups import MAX_TTL_MS, ProducerRegistry
from transport.framing import Caller, FrameWriter, serve_frames
from wire.protocol import Frame, FrameDecoder, Op, encode_frame

BASE: dict[str, Any] = {"node_id": 1, "listen": "127.0.0.1:7101", "data": "/tmp/n1",
                        "peers": {"1": "127.0.0.1:7101"}}


def test_a_member_is_reachable_until_its_connection_closes() -> None:
    registry = ProducerRegistry()

    async def handle(caller: Caller, frame: Frame) -> tuple[dict[str, Any], bytes]:
        h = frame.header
        registry.heartbeat(h["pg"], h["client"], caller, h["ttl_ms"], trio.current_time())
        return {"id": h["id"], "code": 0}, b""

    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_frames, server, handle)
            await client.send_all(encode_frame({"op": int(Op.PRODUCER_HEARTBEAT), "id": 1,
                                                "pg": "pg", "client": "c1",
                                                "ttl_ms": 30_000}))
            dec = FrameDecoder()
            while (f := dec.next_frame()) is None:
                dec.feed(await client.receive_some(4096))
            assert f.header["code"] == 0
            now = trio.current_time()
            (member,) = registry.members("pg", now)
            assert member.client == "c1" and member.caller.connected
            assert registry.pick("pg", now) is member
            assert registry.members("other", now) == []
            await client.aclose()
            with trio.fail_after(5):
                while registry.members("pg", trio.current_time()):
                    await trio.sleep(0.01)
            assert registry.pick("pg", trio.current_time()) is None
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_members_expire_after_their_ttl_and_are_picked_round_robin() -> None:
    registry = ProducerRegistry()
    callers = [_connected_caller() for _ in range(3)]
    for i, caller in enumerate(callers):
        registry.heartbeat("pg", f"c{i}", caller, 1_000, now=0.0)
    picked = {registry.pick("pg", 0.5).client for _ in range(3)}  # type: ignore[union-attr]
    assert picked == {"c0", "c1", "c2"}
    registry.heartbeat("pg", "c1", callers[1], 1_000, now=0.9)
    assert [m.client for m in registry.members("pg", 1.5)] == ["c1"]
    assert registry.members("pg", 2.0) == []
    registry.heartbeat("pg", "c9", callers[0], 10 * MAX_TTL_MS, now=0.0)  # clamped
    assert registry.members("pg", MAX_TTL_MS / 1000 + 1) == []
    registry.heartbeat("pg", "c9", callers[0], 1_000, now=0.0)
    registry.forget("pg", "c9")
    assert registry.members("pg", 0.0) == []


def _connected_caller() -> Caller:
    """A caller whose connection is served (an in-memory stream, answered by nobody)."""
    caller = Caller("test")
    caller._bind(FrameWriter(trio.testing.memory_stream_pair()[1]))
    return caller


def test_transaction_settings_default_and_validate() -> None:
    cfg = NodeConfig.from_dict(BASE, env={})
    assert (cfg.tx_check_first_ms, cfg.tx_check_interval_ms, cfg.tx_check_max,
            cfg.tx_timeout_max_ms, cfg.tx_orphan_ms, cfg.tx_tick_ms) == (
        6_000, 30_000, 15, 900_000, 120_000, 200)
    tuned = NodeConfig.from_dict({**BASE, "tx_check_first_ms": 10, "tx_check_max": 2}, env={})
    assert (tuned.tx_check_first_ms, tuned.tx_check_max) == (10, 2)
    assert "tx_check_max = 2" in dump_config(tuned)
    for key in ("tx_check_first_ms", "tx_check_interval_ms", "tx_check_max",
                "tx_timeout_max_ms", "tx_orphan_ms", "tx_tick_ms"):
        with pytest.raises(ConfigError, match=f"{key} must be >= 1"):
            NodeConfig.from_dict({**BASE, key: 0}, env={})
        with pytest.raises(ConfigError, match=f"{key} must be an integer"):
            NodeConfig.from_dict({**BASE, key: "5"}, env={})


def test_client_ids_and_members_are_capped() -> None:
    """A long client id is MALFORMED; a new member over the group's or the node's cap is
    BUSY until one leaves (its connection closes)."""
    from wire.protocol import Code, RequestError

    def connected() -> Caller:
        caller = Caller()
        caller._bind(FrameWriter(trio.testing.memory_stream_pair()[0]))
        return caller

    registry = ProducerRegistry(max_group_members=2, max_members=3)
    with pytest.raises(RequestError) as info:
        registry.heartbeat("pg", "x" * 256, connected(), 1_000, 0.0)
    assert info.value.code == Code.MALFORMED and len(registry) == 0
    a, b = connected(), connected()
    registry.heartbeat("pg", "a", a, 1_000, 0.0)
    registry.heartbeat("pg", "b", b, 1_000, 0.0)
    with pytest.raises(RequestError) as info:
        registry.heartbeat("pg", "c", connected(), 1_000, 0.0)
    assert info.value.code == Code.BUSY
    registry.heartbeat("other", "d", connected(), 1_000, 0.0)
    with pytest.raises(RequestError) as info:
        registry.heartbeat("third", "e", connected(), 1_000, 0.0)
    assert info.value.code == Code.BUSY
    b._close("gone")
    registry.heartbeat("third", "e", connected(), 1_000, 0.0)
    assert [m.client for m in registry.members("pg", 0.0)] == ["a"] and len(registry) == 3
