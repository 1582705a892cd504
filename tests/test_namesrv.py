"""Name server: the route registry (pure) and the real process over real sockets."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from typing import Any

import pytest
import trio
import trio.testing

from broker.framing import FrameStream, open_frame_stream, serve_frames
from broker.protocol import (
    Code,
    Frame,
    Op,
    RequestError,
    encode_frame,
    ok_header,
    parse_address,
)
from namesrv.registry import Registry, parse_registration


def group(role: str, term: int, *, leader: int | None = None, topics: Any = None,
          replicas: Any = None, commit: int = 10, applied: int = 10) -> dict[str, Any]:
    return {
        "role": role,
        "leader": leader,
        "term": term,
        "replicas": replicas or {1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 3: "127.0.0.1:7003"},
        "topics": topics if topics is not None else {"orders": {"queues": 4, "hosted": [0, 1]}},
        "commit": commit,
        "applied": applied,
    }


def reg(node: int, groups: dict[str, Any], addr: str | None = None) -> dict[str, Any]:
    return {"op": int(Op.REGISTER), "id": 1, "node": node,
            "addr": addr or f"127.0.0.1:{7000 + node}",
            "metrics": f"127.0.0.1:{8000 + node}", "groups": groups}


def register(r: Registry, header: dict[str, Any], now: float) -> None:
    r.register(parse_registration(header), now)


# ------------------------------------------------------------------ registry


def test_registrations_expire_without_a_fresh_register():
    r = Registry(expiry=120)
    register(r, reg(1, {"g0": group("leader", 3, leader=1)}), now=0)
    register(r, reg(2, {"g0": group("follower", 3, leader=1)}), now=50)
    assert r.route("orders", now=119)["queues"][0] == [0, "g0", "127.0.0.1:7001"]
    assert r.expire(now=121) == [1]
    assert sorted(r.cluster(now=121)["nodes"]) == [2]
    register(r, reg(2, {"g0": group("follower", 3, leader=1)}), now=160)
    assert r.expire(now=240) == []
    assert r.cluster(now=281)["nodes"] == {}
    with pytest.raises(RequestError) as err:
        r.route("orders", now=281)
    assert err.value.code == Code.UNKNOWN_TOPIC


def test_the_leader_claim_with_the_highest_term_wins():
    r = Registry()
    # node 1 led term 3 and still registers (it is partitioned from its peers); node 2 has
    # since won term 4 and registered at once
    register(r, reg(1, {"g0": group("leader", 3, leader=1)}), now=10)
    register(r, reg(2, {"g0": group("leader", 4, leader=2)}), now=5)
    register(r, reg(3, {"g0": group("follower", 3, leader=1)}), now=11)
    route = r.route("orders", now=12)
    assert route["queues"] == [[0, "g0", "127.0.0.1:7002"], [1, "g0", "127.0.0.1:7002"]]
    g0 = r.cluster(now=12)["groups"]["g0"]
    assert (g0["leader"], g0["term"], g0["leader_addr"]) == (2, 4, "127.0.0.1:7002")
    assert g0["members"][1]["role"] == "leader" and g0["members"][3]["term"] == 3
    # the new leader's registration lapses: a follower's report of term 4 still names it
    register(r, reg(3, {"g0": group("follower", 4, leader=2)}), now=126)
    register(r, reg(1, {"g0": group("leader", 3, leader=1)}), now=126)
    g0 = r.cluster(now=127)["groups"]["g0"]
    assert (g0["leader"], g0["term"], g0["leader_addr"]) == (2, 4, "127.0.0.1:7002")


def test_no_leader_known_gives_none_and_replicas_for_hints():
    r = Registry()
    register(r, reg(1, {"g0": group("candidate", 7)}), now=0)
    register(r, reg(2, {"g0": group("follower", 7)}), now=0)
    route = r.route("orders", now=1)
    assert route["queues"] == [[0, "g0", None], [1, "g0", None]]
    assert route["replicas"] == {"g0": ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]}
    assert r.cluster(now=1)["groups"]["g0"]["leader"] is None


def test_routes_span_groups_sorted_by_queue():
    r = Registry()
    spread = {"orders": {"queues": 4, "hosted": [1, 3]}}
    rest = {"orders": {"queues": 4, "hosted": [2, 0]}, "audit": {"queues": 1, "hosted": [0]}}
    reps_b = {2: "127.0.0.1:7002", 3: "127.0.0.1:7003"}
    register(r, reg(1, {"ga": group("leader", 2, leader=1, topics=spread)}), now=0)
    register(r, reg(2, {"ga": group("follower", 2, leader=1, topics=spread),
                        "gb": group("leader", 5, topics=rest, replicas=reps_b)}), now=0)
    route = r.route("orders", now=1)
    assert route["total"] == 4
    assert route["queues"] == [
        [0, "gb", "127.0.0.1:7002"],
        [1, "ga", "127.0.0.1:7001"],
        [2, "gb", "127.0.0.1:7002"],
        [3, "ga", "127.0.0.1:7001"],
    ]
    assert set(route["replicas"]) == {"ga", "gb"}
    assert route["terms"] == {"ga": 2, "gb": 5}
    assert r.route("audit", now=1) == {
        "total": 1,
        "queues": [[0, "gb", "127.0.0.1:7002"]],
        "replicas": {"gb": ["127.0.0.1:7002", "127.0.0.1:7003"]},
        "terms": {"gb": 5},
    }


def test_unknown_topic_is_a_clear_error():
    r = Registry()
    register(r, reg(1, {"g0": group("leader", 1, leader=1)}), now=0)
    with pytest.raises(RequestError) as err:
        r.route("nope", now=0)
    assert err.value.code == Code.UNKNOWN_TOPIC and "'nope'" in err.value.message


@pytest.mark.parametrize(
    "patch",
    [
        {"node": "1"},
        {"node": True},
        {"addr": "localhost"},
        {"addr": None},
        {"metrics": 5},
        {"groups": []},
        {"groups": {"g0": {"role": "leader", "term": "3"}}},
        {"groups": {"g0": group("leader", 1, topics={"t": {"queues": 2, "hosted": [2]}})}},
        {"groups": {"g0": group("leader", 1, replicas={"one": "127.0.0.1:1"})}},
    ],
)
def test_ill_typed_registrations_are_malformed(patch):
    header = reg(1, {"g0": group("leader", 1, leader=1)}) | patch
    with pytest.raises(RequestError) as err:
        parse_registration(header)
    assert err.value.code == Code.MALFORMED


# ------------------------------------------------------------------ framing


def test_a_slow_request_does_not_block_the_next_on_the_same_connection():
    async def handler(frame: Frame) -> tuple[dict[str, Any], bytes] | None:
        if frame.header.get("slow"):
            await trio.sleep(0.3)
        if frame.header.get("oneway"):
            return None
        if frame.header.get("boom"):
            raise RuntimeError("bug")
        if frame.header.get("refuse"):
            raise RequestError(Code.BUSY, "later", leader=None)
        return ok_header(frame.header["id"], echo=frame.header.get("x")), frame.body

    async def main() -> list[int]:
        client, server = trio.testing.memory_stream_pair()
        order = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_frames, server, handler)
            fs = FrameStream(client)
            await fs.send({"op": 99, "id": 1, "slow": True})
            await fs.send({"op": 99, "id": 2, "oneway": True})
            await fs.send({"op": 99, "id": 3, "x": "hi"}, b"body")
            await fs.send({"op": 99, "id": 4, "boom": True})
            await fs.send({"op": 99, "id": 5, "refuse": True})
            for _ in range(4):
                frame = await fs.receive()
                assert frame is not None
                order.append(frame.header["id"])
                if frame.header["id"] == 3:
                    assert frame.header["echo"] == "hi" and frame.body == b"body"
                elif frame.header["id"] == 4:
                    assert frame.header["code"] == Code.INTERNAL
                elif frame.header["id"] == 5:
                    assert frame.header["code"] == Code.BUSY and "leader" in frame.header
            await fs.aclose()
        return order

    order = trio.run(main)
    assert sorted(order[:3]) == [3, 4, 5] and order[3] == 1  # the slow one answers last


# ------------------------------------------------------------------ real process


@pytest.fixture
def namesrv_proc():
    proc = subprocess.Popen(
        [sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0", "--expiry", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("ready "), (line, proc.stderr.read() if proc.stderr else "")
        yield proc, line.split()[1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def call(fs: FrameStream, header: dict[str, Any]) -> dict[str, Any]:
    await fs.send(header)
    frame = await fs.receive()
    assert frame is not None
    assert frame.header["id"] == header.get("id", 0)
    return frame.header


def test_namesrv_process_serves_routes_and_survives_a_broken_client(namesrv_proc):
    proc, addr = namesrv_proc
    topics = {"orders": {"queues": 2, "hosted": [0, 1]}}

    async def main() -> None:
        with trio.fail_after(10):
            fs = await open_frame_stream(addr)
            for node, role in ((1, "leader"), (2, "follower")):
                r = await call(fs, reg(node, {"g0": group(role, 4, leader=1, topics=topics)})
                               | {"id": 10 + node})
                assert r["code"] == 0, r
            route = await call(fs, {"op": int(Op.ROUTE), "id": 20, "topic": "orders"})
            assert route["code"] == 0
            assert route["total"] == 2
            assert route["queues"] == [[0, "g0", "127.0.0.1:7001"], [1, "g0", "127.0.0.1:7001"]]
            assert route["replicas"]["g0"][0] == "127.0.0.1:7001"

            cluster = await call(fs, {"op": int(Op.CLUSTER), "id": 21})
            assert set(cluster["nodes"]) == {1, 2}
            assert cluster["nodes"][2]["metrics"] == "127.0.0.1:8002"
            assert 0 <= cluster["nodes"][1]["age"] < 10
            g0 = cluster["groups"]["g0"]
            assert g0["leader"] == 1 and g0["term"] == 4 and set(g0["members"]) == {1, 2}

            missing = await call(fs, {"op": int(Op.ROUTE), "id": 22, "topic": "nope"})
            assert missing["code"] == Code.UNKNOWN_TOPIC and "nope" in missing["msg"]
            unknown = await call(fs, {"op": 12345, "id": 23})
            assert unknown["code"] == Code.UNKNOWN_OP
            bad = await call(fs, {"op": int(Op.ROUTE), "id": 24, "topic": 7})
            assert bad["code"] == Code.MALFORMED
            bad = await call(fs, reg(3, {}) | {"id": 25, "addr": 3})
            assert bad["code"] == Code.MALFORMED

            # a broken frame (header length 0) on a second connection: one error, then EOF
            other = await trio.open_tcp_stream(*parse_address(addr))
            await other.send_all(struct.pack(">II", 4, 0) + b"junk")
            broken = FrameStream(other)
            err = await broken.receive()
            assert err is not None and err.header["id"] == 0
            assert err.header["code"] == Code.MALFORMED
            assert await broken.receive() is None
            await broken.aclose()

            # an oversized frame is refused the same way, before its body is even sent
            other = await trio.open_tcp_stream(*parse_address(addr))
            await other.send_all(struct.pack(">II", 1 << 30, 8))
            broken = FrameStream(other)
            err = await broken.receive()
            assert err is not None and err.header["code"] == Code.FRAME_TOO_LARGE
            await broken.aclose()

            # the first connection is unaffected
            again = await call(fs, {"op": int(Op.ROUTE), "id": 26, "topic": "orders"})
            assert again["code"] == 0 and again["queues"] == route["queues"]
            await fs.aclose()

    trio.run(main)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0


def test_encode_frame_round_trips_through_the_stream():
    # guards the helper the integration test relies on
    async def main() -> Frame | None:
        a, b = trio.testing.memory_stream_pair()
        await a.send_all(encode_frame({"id": 5, "code": 0}, b"xy"))
        await a.aclose()
        fs = FrameStream(b)
        frame = await fs.receive()
        assert await fs.receive() is None
        return frame

    frame = trio.run(main)
    assert frame is not None and frame.header == {"id": 5, "code": 0} and frame.body == b"xy"
