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

from namesrv.registry import Registry, parse_registration
from transport.framing import Caller, FrameStream, open_frame_stream, serve_frames
from wire.protocol import (
    Code,
    Frame,
    Op,
    RequestError,
    encode_frame,
    ok_header,
    parse_address,
)


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
    assert r.route("orders", now=119).header()["queues"][0] == [0, "g0", "127.0.0.1:7001"]
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
    route = r.route("orders", now=12).header()
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
    route = r.route("orders", now=1).header()
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
    route = r.route("orders", now=1).header()
    assert route["total"] == 4
    assert route["queues"] == [
        [0, "gb", "127.0.0.1:7002"],
        [1, "ga", "127.0.0.1:7001"],
        [2, "gb", "127.0.0.1:7002"],
        [3, "ga", "127.0.0.1:7001"],
    ]
    assert set(route["replicas"]) == {"ga", "gb"}
    assert route["terms"] == {"ga": 2, "gb": 5}
    assert r.route("audit", now=1).header() == {
        "total": 1,
        "queues": [[0, "gb", "127.0.0.1:7002"]],
        "replicas": {"gb": ["127.0.0.1:7002", "127.0.0.1:7003"]},
        "terms": {"gb": 5},
    }


def test_a_new_leader_that_has_not_applied_its_predecessors_entries_yet_hides_no_topic():
    """After a full restart the first leader may register before it has applied what
    was committed (its table then lacks topics): the member that applied most is
    believed for topics, so a route does not answer UNKNOWN_TOPIC for a topic that
    exists; once the leader has applied as much, its own table is used again."""
    r = Registry(expiry=120)
    register(r, reg(1, {"g0": group("leader", 4, leader=1, topics={}, applied=3)}), now=0)
    register(r, reg(2, {"g0": group("follower", 4, leader=1, applied=10)}), now=0)
    route = r.route("orders", now=1).header()
    assert route["queues"][0] == [0, "g0", "127.0.0.1:7001"]  # led by the new leader
    assert r.cluster(now=1)["groups"]["g0"]["topic_count"] == 1
    # the leader catches up and deletes the topic: its newer table wins again
    register(r, reg(1, {"g0": group("leader", 4, leader=1, topics={}, applied=12)}), now=2)
    with pytest.raises(RequestError) as err:
        r.route("orders", now=3)
    assert err.value.code == Code.UNKNOWN_TOPIC


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
    async def handler(_caller: Caller, frame: Frame) -> tuple[dict[str, Any], bytes] | None:
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

    # a virtual clock: the slow handler's sleep ends only once every other task is
    # blocked, so the slow one answers last by construction, however loaded the machine
    order = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
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


@pytest.mark.live
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


# ------------------------------------------------------------------ large tables, deltas


def _configs(names: list[str], queues: int = 4, hosted: tuple[int, ...] = (0, 3)) -> dict:
    from broker.state.statemachine import TopicConfig

    return {n: TopicConfig(n, queues, hosted) for n in names}


def versioned(node: int, tables: dict[str, tuple[int, dict]], *, inc: int = 7,
              base: dict[str, int] | None = None, dels: dict[str, list[str]] | None = None,
              role: str = "leader", term: int = 3) -> tuple[dict[str, Any], bytes]:
    """A REGISTER as a node sends it: versions in the header, tables (or changes) in the body."""
    import msgpack

    from wire.protocol import topic_shapes

    groups: dict[str, Any] = {}
    body: dict[str, Any] = {}
    for gid, (tv, topics) in tables.items():
        g = group(role, term, leader=node) | {"tv": tv}
        del g["topics"]
        entry: dict[str, Any] = {"set": topic_shapes(topics)}
        if base is not None and gid in base:
            g["base"] = base[gid]
            entry["del"] = (dels or {}).get(gid, [])
        groups[gid] = g
        body[gid] = entry
    header = reg(node, groups) | {"inc": inc}
    return header, msgpack.packb(body, use_bin_type=True)


def test_a_registration_of_20000_topics_fits_and_is_handled():
    from namesrv.server import NAMESRV_MAX_FRAME, NameServer
    from wire.protocol import MAX_HEADER, FrameDecoder

    names = [f"orders-{i:06d}" for i in range(20_000)]
    tables = {g: (1, _configs(names)) for g in ("g0", "g1", "g2")}
    header, body = versioned(1, tables)
    wire = encode_frame(header, body)
    assert len(wire) - len(body) < 4096 < MAX_HEADER  # the header does not grow with topics
    assert len(wire) < NAMESRV_MAX_FRAME
    dec = FrameDecoder(NAMESRV_MAX_FRAME)
    dec.feed(wire)
    frame = dec.next_frame()
    assert frame is not None

    ns = NameServer(clock=lambda: 1.0)
    answer, _ = trio.run(ns.handle, Caller(), frame)
    assert answer["code"] == 0 and "resend" not in answer
    route = ns.registry.route("orders-019999", now=1.0).header()
    assert route["total"] == 4 and [q for q, _, _ in route["queues"]] == [0, 3]

    # the periodic heartbeat carries no table: no body, and the tables stay as they were
    beat, _ = versioned(1, {g: (1, {}) for g in tables}, base={g: 1 for g in tables})
    answer, _ = trio.run(ns.handle, Caller(), Frame(beat, b""))
    assert answer["code"] == 0 and "resend" not in answer
    assert ns.registry.cluster(now=2.0, topics=False)["groups"]["g0"]["topic_count"] == 20_000


def test_deltas_apply_to_the_version_held_and_a_gap_asks_for_the_whole_table():
    r = Registry()
    full = _configs(["a", "b", "c"])
    header, body = versioned(1, {"g0": (1, full)})
    assert r.register(parse_registration(header, body), now=0) == []
    # v1 -> v2: "d" added, "b" deleted
    header, body = versioned(1, {"g0": (2, _configs(["d"]))}, base={"g0": 1},
                             dels={"g0": ["b"]})
    assert r.register(parse_registration(header, body), now=1) == []
    with pytest.raises(RequestError):
        r.route("b", now=1)
    assert r.route("d", now=1).total == 4 and r.route("a", now=1).total == 4

    # a lost registration: the node's next change is based on v3, which we never saw
    header, body = versioned(1, {"g0": (4, _configs(["e"]))}, base={"g0": 3})
    assert r.register(parse_registration(header, body), now=2) == ["g0"]
    assert r.route("d", now=2).total == 4  # the older table still routes meanwhile
    with pytest.raises(RequestError):
        r.route("e", now=2)
    # ... and nothing more is applied until the whole table comes
    header, body = versioned(1, {"g0": (5, _configs(["f"]))}, base={"g0": 4})
    assert r.register(parse_registration(header, body), now=3) == ["g0"]
    header, body = versioned(1, {"g0": (5, _configs(["a", "d", "e", "f"]))})
    assert r.register(parse_registration(header, body), now=4) == []
    assert r.route("f", now=4).total == 4

    # a restarted node (new incarnation) cannot build on the old versions either
    header, body = versioned(1, {"g0": (6, _configs(["g"]))}, base={"g0": 5}, inc=8)
    assert r.register(parse_registration(header, body), now=5) == ["g0"]


def test_an_unsynced_table_yields_to_a_synced_member():
    r = Registry()
    register(r, reg(2, {"g0": group("follower", 3, leader=1,
                                    topics={"old": {"queues": 1, "hosted": [0]},
                                            "new": {"queues": 1, "hosted": [0]}})}), now=0)
    # the leader's changes arrive at a name server that never had its table
    header, body = versioned(1, {"g0": (9, _configs(["new"]))}, base={"g0": 8})
    assert r.register(parse_registration(header, body), now=1) == ["g0"]
    assert r.route("new", now=1).header()["queues"] == [[0, "g0", "127.0.0.1:7001"]]


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # not msgpack
        {"g9": {"set": []}},  # a group not in the header
        {"g0": {"set": [[4, [0], ["t", 5]]]}},  # a name that is not a string
        {"g0": {"set": [[2, [2], ["t"]]]}},  # a queue beyond the total
        {"g0": {"set": [[2, [0]]]}},  # no names
        {"g0": {"set": [], "del": ["t"]}},  # deleting from a whole table
    ],
)
def test_ill_formed_register_bodies_are_malformed(body):
    import msgpack

    header, _ = versioned(1, {"g0": (1, {})})
    raw = body if isinstance(body, bytes) else msgpack.packb(body)
    with pytest.raises(RequestError) as err:
        parse_registration(header, raw)
    assert err.value.code == Code.MALFORMED


def test_cluster_without_topics_stays_small_and_with_topics_uses_the_body():
    from namesrv.server import NameServer
    from raftmq.client.routes import merge_cluster_topics

    ns = NameServer(clock=lambda: 1.0)
    names = [f"t{i}" for i in range(5000)]
    header, body = versioned(1, {"g0": (1, _configs(names, 2, (0, 1)))})
    trio.run(ns.handle, Caller(), Frame(header, body))
    small, sbody = trio.run(ns.handle, Caller(), Frame({"op": int(Op.CLUSTER), "id": 2, "topics": False}))
    assert sbody == b"" and "topics" not in small["groups"]["g0"]
    assert small["groups"]["g0"]["topic_count"] == 5000 and small["groups"]["g0"]["leader"] == 1
    full, fbody = trio.run(ns.handle, Caller(), Frame({"op": int(Op.CLUSTER), "id": 3}))
    assert len(encode_frame(full)) < 4096 and fbody
    info = {k: v for k, v in full.items() if k not in ("id", "code")}
    merge_cluster_topics(info, fbody)
    assert info["groups"]["g0"]["topics"]["t4999"] == {"queues": 2, "hosted": [0, 1]}
    assert len(info["groups"]["g0"]["topics"]) == 5000
    assert ns.registry.cluster(now=1.0)["groups"]["g0"]["topics"] == info["groups"]["g0"]["topics"]


def test_the_node_table_log_sends_changes_since_any_recent_version():
    from broker.runtime.registrar import TopicTableLog

    log = TopicTableLog()
    assert log.update(_configs(["a", "b"])) == 1
    assert log.update(_configs(["a", "b"])) == 1  # equal configs: no new version
    assert log.update(_configs(["a", "b", "c"])) == 2
    assert log.update(_configs(["a", "c", "d"])) == 3
    assert log.changes_since(3) == ({}, [])
    changed, removed = log.changes_since(1) or ({}, [])
    assert sorted(changed) == ["c", "d"] and removed == ["b"]
    assert log.update(_configs(["a", "b", "c", "d"])) == 4  # "b" back again
    changed, removed = log.changes_since(2) or ({}, [])
    assert sorted(changed) == ["b", "d"] and removed == []
    assert log.changes_since(0) is not None and log.changes_since(5) is None
    for i in range(TopicTableLog.KEEP + 1):
        log.update(_configs([f"x{i}"]))
    assert log.changes_since(4) is None  # too far behind: the whole table goes instead


def test_logins_are_checked_against_the_freshest_registered_users():
    """With logins on, a registration carries the users' verifiers; the name server
    believes the live registration of the highest metadata index, and none without any
    (lookups open, as before); a malformed user list is refused, changing nothing."""
    key, v = b"k" * 32, [b"salt", 4096, b"s" * 32, b"S" * 32]
    r = Registry(expiry=120)
    register(r, reg(1, {}), now=0)
    assert r.auth(now=0) is None
    register(r, {**reg(1, {}), "auth": {"at": 7, "users": [["ann", *v]], "salt_key": key}}, 0)
    register(r, {**reg(2, {}), "auth": {"at": 9, "users": [], "salt_key": key}}, 1)
    auth = r.auth(now=1)
    assert auth is not None and auth.at == 9 and "ann" not in auth.users  # removed at 9
    assert r.auth(now=120.5) is not None and r.auth(now=120.5).at == 9  # node 1 expired
    assert r.auth(now=122) is None
    for bad in ({"at": 1, "users": [["ann", b"", 4096, b"s" * 32, b"S" * 32]], "salt_key": key},
                {"at": 1, "users": [["ann", *v]], "salt_key": b"short"},
                {"at": 1, "users": "ann", "salt_key": key}):
        with pytest.raises(RequestError) as info:
            parse_registration({**reg(3, {}), "auth": bad})
        assert info.value.code == Code.MALFORMED


class _Metadata:
    """A node's open metadata replica as `Guard.registration_auth` reads it: its applied
    index and its users part (the real one, loaded from a section)."""

    is_open = True

    def __init__(self, rows: list[list[Any]]) -> None:
        from broker.state.parts.users import Users

        self.users = Users(None)  # type: ignore[arg-type]  # the part needs no state here
        self.users.load(1, rows)
        self.machine = self

    def part(self, _kind: type) -> Any:
        return self.users

    def status(self) -> dict[str, Any]:
        return {"applied": 42}


class _AuthNode:
    """A node with logins on whose metadata replica holds `rows` (for `Guard`)."""

    def __init__(self, rows: list[list[Any]], root_password: str) -> None:
        from broker.config import NodeConfig
        from broker.doors.security import make_credential
        from broker.state.parts.users import format_verifier

        self.config = NodeConfig.from_dict({
            "node_id": 1, "listen": "127.0.0.1:7101", "data": "/nonexistent",
            "peers": {1: "127.0.0.1:7101"}, "groups": [{"id": "g0", "replicas": [1]}],
            "authenticate": True, "superusers": ["root"], "cluster_secret": "s" * 24,
            "superuser_scram": format_verifier(make_credential(root_password))})
        self.groups = {"g0": _Metadata(rows)}


@pytest.mark.live
@pytest.mark.parametrize("crowd", [0, 6_000])
def test_users_beyond_what_a_registration_carries_fail_closed_at_the_name_server(
        namesrv_proc, crowd):
    """A node registers its users' verifiers in the REGISTER header (1 MiB at most).
    With few users a stored one logs in at the name server; with 6,000 of the longest
    names and salts (some 1.2 MB of verifiers) the registration still fits and is taken
    (the node's routes do not expire), carrying only the configured superuser's
    verifier: the superuser logs in, a stored user is refused, saying why."""
    import os

    from broker.doors.security import Guard, make_credential
    from transport.blocking import request
    from transport.scram import Credentials
    from wire.protocol import MAX_HEADER

    _, addr = namesrv_proc
    ann = make_credential("ann's password")
    rows = [["ann", ann.salt, ann.iterations, ann.stored_key, ann.server_key]]
    rows += [[f"u{i:05d}" + "x" * 58, os.urandom(64), 4096, os.urandom(32), os.urandom(32)]
             for i in range(crowd)]
    guard = Guard(_AuthNode(rows, "root's password"))  # type: ignore[arg-type]
    auth = guard.registration_auth()
    assert auth is not None
    header = reg(1, {"g0": group("leader", 2, leader=1)}) | {"auth": auth}
    size = len(encode_frame(header))
    assert size < MAX_HEADER, f"a registration of {size} bytes"
    answer, _ = request(addr, header)
    assert answer["code"] == 0

    ok, _ = request(addr, {"op": int(Op.CLUSTER), "topics": False},
                    credentials=Credentials("root", "root's password"))
    assert set(ok["nodes"]) == {1}
    ann_login = Credentials("ann", "ann's password")
    if not crowd:
        request(addr, {"op": int(Op.ROUTE), "topic": "orders"}, credentials=ann_login)
        return
    with pytest.raises(RequestError) as info:
        request(addr, {"op": int(Op.ROUTE), "topic": "orders"}, credentials=ann_login)
    assert info.value.code == Code.UNAUTHENTICATED
    assert "more users than a registration carries" in info.value.message


@pytest.mark.parametrize(("flags", "message"), [
    (["--frame-timeout", "0"], "--frame-timeout must be a positive number"),
    (["--idle-timeout", "nan"], "--idle-timeout must be a positive number"),
    (["--max-connections", "0"], "--max-connections must be positive"),
    (["--max-buffered-bytes", "-1"], "--max-buffered-bytes must be positive"),
])
def test_the_budget_flags_are_checked_before_listening(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from namesrv.__main__ import main

    assert main(["--listen", "127.0.0.1:0", *flags]) == 2
    assert message in capsys.readouterr().err
