"""Fault proxies (`chaos.proxy`): forwarding, blackholes, and a cluster wired through them.

The first tests use plain trio sockets against a small echo server; the last one runs a
real 3-node cluster whose Raft and client traffic all pass the proxies.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import load_config
from chaos.proxy import Proxy, ProxyNet
from raftmq.localcluster import LocalCluster, free_ports
from tests.conftest import steady_leaders
from transport.blocking import request
from wire.protocol import Op, RequestError, encode_frame, parse_address

QUIET = 0.3  # how long "nothing arrives" is watched for


def run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test)


async def echo(stream: trio.SocketStream) -> None:
    """Echo everything, upper-cased, so an answer cannot be mistaken for the request."""
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data.upper())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[str, list[int]]]:
    """An echo server's address and a one-item list counting its accepted connections."""
    accepted = [0]

    async def handler(stream: trio.SocketStream) -> None:
        accepted[0] += 1
        await echo(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        yield f"127.0.0.1:{port}", accepted
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def serving(*proxies: Proxy) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for p in proxies:
            await nursery.start(p.serve)
        yield
        nursery.cancel_scope.cancel()


async def dial(addr: str) -> trio.SocketStream:
    host, port = parse_address(addr)
    return await trio.open_tcp_stream(host, port)


async def receive(stream: trio.SocketStream, n: int, timeout: float = 5.0) -> bytes:
    data = b""
    with trio.fail_after(timeout):
        while len(data) < n:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def silent(stream: trio.SocketStream) -> bool:
    """True when nothing (not even a close) arrives for QUIET seconds."""
    with trio.move_on_after(QUIET):
        await stream.receive_some(1)
        return False
    return True


async def closed(stream: trio.SocketStream, timeout: float = 5.0) -> bool:
    """True when the other side closes (EOF or reset) within `timeout`."""
    with trio.fail_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
    return True


# ------------------------------------------------------------------ one proxy


def test_forwards_both_directions_over_many_connections() -> None:
    async def main() -> None:
        async with echo_server() as (target, accepted):
            proxy = Proxy(target)
            async with serving(proxy):
                assert proxy.address.endswith(f":{parse_address(proxy.address)[1]}")
                streams = [await dial(proxy.address) for _ in range(3)]
                big = bytes(range(256)) * 4096  # 1 MiB: many chunks each way
                for k, s in enumerate(streams):
                    await s.send_all(b"hello %d" % k)
                    assert await receive(s, 7) == b"HELLO %d" % k
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(streams[0].send_all, big)
                    got = await receive(streams[0], len(big), timeout=20)
                assert got == big.upper()
                assert accepted[0] == 3 and proxy.accepted == 3
                assert proxy.link.connections == 3
                await streams[1].aclose()  # one side closing ends that forwarded connection
                with trio.fail_after(5):
                    while proxy.link.connections != 2:
                        await trio.sleep(0.01)

    run(main)


def test_block_is_silence_and_unblock_resets_then_forwards() -> None:
    async def main() -> None:
        async with echo_server() as (target, accepted):
            proxy = Proxy(target)
            async with serving(proxy):
                before = await dial(proxy.address)
                await before.send_all(b"ping")
                assert await receive(before, 4) == b"PING"

                proxy.block()
                assert proxy.blocked
                await before.send_all(b"lost")  # accepted by the proxy, never delivered
                assert await silent(before)
                during = await dial(proxy.address)  # accepted, but nothing is forwarded
                await during.send_all(b"nobody hears this")
                assert await silent(during)
                assert accepted[0] == 1, "a blackholed connection never reaches the target"
                assert proxy.link.dropped_bytes >= len(b"lost") + len(b"nobody hears this")

                proxy.unblock()
                assert await closed(before) and await closed(during)
                after = await dial(proxy.address)
                await after.send_all(b"again")
                assert await receive(after, 5) == b"AGAIN"

    run(main)


def test_delay_holds_each_chunk_back() -> None:
    async def main() -> None:
        async with echo_server() as (target, _):
            proxy = Proxy(target)
            async with serving(proxy):
                s = await dial(proxy.address)
                proxy.link.delay = 0.2
                t0 = trio.current_time()
                await s.send_all(b"slow")
                assert await receive(s, 4) == b"SLOW"
                assert trio.current_time() - t0 >= 0.4  # one delay each way

    run(main)


def test_delay_with_jitter_holds_chunks_back_and_never_reorders() -> None:
    """Chunks sent one after another on a link with 0.2 s ± 0.1 s are each held back at
    least 0.1 s and arrive whole and in order, although their draws differ."""

    async def main() -> None:
        async with echo_server() as (target, _):
            proxy = Proxy(target)
            async with serving(proxy):
                s = await dial(proxy.address)
                proxy.link.delay, proxy.link.jitter = 0.2, 0.1
                t0 = trio.current_time()
                sent = b""
                for k in range(20):
                    chunk = b"chunk%02d;" % k
                    await s.send_all(chunk)
                    sent += chunk
                    await trio.sleep(0.01)  # separate chunks, each with its own draw
                got = await receive(s, len(sent), timeout=10.0)
                took = trio.current_time() - t0
                assert got == sent.upper()  # whole and in order
                assert took >= 0.2  # at least the minimum one way (0.1 s), both ways
                assert proxy.link.lost_chunks == 0

    run(main)


def test_loss_stalls_chunks_and_sometimes_resets_the_connection() -> None:
    async def main() -> None:
        async with echo_server() as (target, accepted):
            proxy = Proxy(target)
            proxy.link.loss = 0.5
            proxy.link.rng.seed(3)
            async with serving(proxy):
                resets_seen = 0
                for _ in range(12):
                    s = await dial(proxy.address)
                    await s.send_all(b"x")
                    got = await receive(s, 1, timeout=5.0)
                    if got == b"":
                        resets_seen += 1
                    else:
                        assert got == b"X"  # a stalled chunk still arrives whole
                    await s.aclose()
                link = proxy.link
                assert link.lost_chunks > 0 and link.resets == resets_seen > 0
                assert link.resets < link.lost_chunks  # most losses are only stalls
                assert accepted[0] >= 12 - resets_seen

    run(main)


def test_a_dead_target_closes_the_accepted_connection() -> None:
    async def main() -> None:
        (port,) = free_ports(1)
        proxy = Proxy(f"127.0.0.1:{port}")
        async with serving(proxy):
            s = await dial(proxy.address)
            await s.send_all(b"anyone?")
            assert await closed(s)

    run(main)


def test_pair_proxy_sends_non_hello_traffic_through_the_client_link() -> None:
    """A client handed a pair proxy's address (in a NOT_LEADER hint) is client traffic:
    cutting the Raft pair must not cut it, and cutting clients must not cut Raft."""

    async def main() -> None:
        async with echo_server() as (target, _):
            clients = Proxy(target, name="clients")
            pair = Proxy(target, name="raft", clients=clients.link)
            async with serving(clients, pair):
                hello = encode_frame({"op": int(Op.HELLO), "node": 1})
                request = encode_frame({"op": int(Op.STATUS), "id": 1})
                raft, client = await dial(pair.address), await dial(pair.address)
                await raft.send_all(hello)
                await client.send_all(request)
                assert await receive(raft, len(hello)) == hello.upper()
                assert await receive(client, len(request)) == request.upper()
                assert pair.link.connections == 1 and clients.link.connections == 1

                pair.block()
                await raft.send_all(b"x")
                await client.send_all(b"y")
                assert await silent(raft)
                assert await receive(client, 1) == b"Y"
                pair.unblock()
                assert await closed(raft)

                clients.block()
                late_raft = await dial(pair.address)
                await late_raft.send_all(hello)
                assert await receive(late_raft, len(hello)) == hello.upper()
                await client.send_all(b"z")
                assert await silent(client)
                clients.unblock()
                assert await closed(client)

    run(main)


# ------------------------------------------------------------------ ProxyNet wiring


def test_proxynet_wires_each_node_through_its_own_peers_table(tmp_path: Path) -> None:
    net = ProxyNet([1, 2, 3])
    addrs = {net.listen_addr(i) for i in (1, 2, 3)}
    addrs |= {net.client(i).address for i in (1, 2, 3)}
    addrs |= {net.pair(i, j).address for i, j in ((1, 2), (1, 3), (2, 3))}
    assert len(addrs) == 9, "every node and proxy has its own port"
    assert net.pair(3, 1) is net.pair(1, 3)
    assert net.peers_table(2) == {
        1: net.client(1).address, 2: net.client(2).address, 3: net.pair(2, 3).address,
    }

    overrides = net.node_overrides({"segment_size": 1 << 20, 2: {"tick_ms": 7}})
    c = LocalCluster(tmp_path / "c", node_overrides=overrides)
    c.write_configs()
    for i in (1, 2, 3):
        cfg = load_config(c.config_path(i))
        assert cfg.listen == net.listen_addr(i) == c.node_addr(i)
        assert dict(cfg.peers) == net.peers_table(i)
        assert c.client_addr(i) == net.client(i).address
        assert cfg.segment_size == 1 << 20 and cfg.tick_ms == (7 if i == 2 else 100)
    # the same cluster again, through new proxies (new ports): still the same layout
    again = ProxyNet([1, 2, 3])
    LocalCluster(tmp_path / "c", node_overrides=again.node_overrides()).write_configs()


def test_a_cluster_wired_through_proxies_shares_no_port_with_them(tmp_path: Path) -> None:
    """The nodes' own ports, picked by `ProxyNet`, stay unbound until the nodes start; the
    cluster then picks the name server's and the metrics ports. None may be one of the
    net's, or the name server takes a node's port and that node cannot start (seen in CI
    as a chaos run whose n1 exited with EADDRINUSE)."""
    for _ in range(200):
        net = ProxyNet([1, 2, 3])
        c = LocalCluster(tmp_path / "c", node_overrides=net.node_overrides())
        theirs = {net.listen_addr(i) for i in (1, 2, 3)} | {p.address for p in net.proxies()}
        ours = {c.namesrv_addr} | {cfg.metrics for cfg in c.configs}
        assert len(theirs) == 9 and len(ours) == 4
        assert not theirs & ours


def test_proxynet_partition_and_heal_state() -> None:
    async def main() -> None:
        net = ProxyNet([1, 2, 3])
        async with trio.open_nursery() as nursery:
            await nursery.start(net.serve)
            net.set_partition({frozenset({1, 2}), frozenset({1, 3})})
            assert net.blocked_pairs() == {frozenset({1, 2}), frozenset({1, 3})}
            net.set_partition([frozenset({2, 3})])  # exactly these: the others reopen
            assert net.blocked_pairs() == {frozenset({2, 3})}
            net.cut_clients([3])
            net.set_delay(0.1)
            assert net.client(3).blocked and not net.client(1).blocked
            assert net.pair(1, 2).link.delay == 0.1
            with pytest.raises(ValueError, match="no such node pair"):
                net.set_partition([frozenset({1, 9})])
            shaped = net.shape(delay=0.1, jitter=0.05, pairs=[(1, 2)], clients=[2])
            assert shaped == ["raft 1->2", "clients->2"]
            assert net.pair(1, 2).link.jitter == 0.05 and net.client(2).link.delay == 0.1
            assert net.pair(1, 3).link.delay == 0.1  # from set_delay, left as it was
            assert net.client(1).link.delay == 0.0
            assert len(net.shape(loss=0.1)) == 6  # every pair and every node's clients
            with pytest.raises(ValueError, match="loss"):
                net.shape(loss=1.0)
            net.heal()
            assert net.blocked_pairs() == set()
            assert not any(p.blocked or p.link.delay or p.link.jitter or p.link.loss
                           for p in net.proxies())
            nursery.cancel_scope.cancel()

    run(main)


# ------------------------------------------------------------------ a live cluster


def _leaders(cluster: LocalCluster) -> dict[str, int | None]:
    try:
        return cluster.leaders(timeout=2.0)
    except OSError:
        return {}


def _status(cluster: LocalCluster, node: int | None) -> dict[str, Any]:
    """Group g0 as `node` itself reports it (asked directly, past the proxies)."""
    assert node is not None
    try:
        header, _ = request(cluster.node_addr(node), {"op": int(Op.STATUS)}, timeout=2.0)
    except (OSError, RequestError):
        return {}
    return dict(header["groups"].get("g0") or {})


@pytest.mark.live
def test_live_cluster_through_proxies_fails_over_when_the_leader_is_isolated(
    tmp_path: Path,
) -> None:
    from raftmq.client.admin import Admin
    from raftmq.client.producer import Producer

    facts: dict[str, Any] = {}

    async def main() -> None:
        net = ProxyNet([1, 2, 3])
        async with trio.open_nursery() as nursery:
            await nursery.start(net.serve)
            cluster = LocalCluster(tmp_path, tick_ms=50, node_overrides=net.node_overrides())
            try:
                await trio.to_thread.run_sync(cluster.start)
                await trio.to_thread.run_sync(steady_leaders, cluster)
                with trio.fail_after(15):  # a node leading nothing may register last
                    info = await trio.to_thread.run_sync(cluster.cluster_info)
                    while len(info["nodes"]) < 3:
                        await trio.sleep(0.1)
                        info = await trio.to_thread.run_sync(cluster.cluster_info)
                advertised = {int(n): v["addr"] for n, v in info["nodes"].items()}
                assert advertised == {i: net.client(i).address for i in (1, 2, 3)}

                async with Admin(cluster.namesrv_addr) as admin:
                    await admin.create_topic("t", 3)
                async with Producer(cluster.namesrv_addr) as producer:
                    for k in range(30):
                        await producer.send("t", f"m{k}")
                assert sum(net.client(i).accepted for i in (1, 2, 3)) > 0

                old = (await trio.to_thread.run_sync(steady_leaders, cluster))["g0"]
                others = [i for i in (1, 2, 3) if i != old]
                net.set_partition({frozenset({old, j}) for j in others})
                t0 = time.monotonic()
                with trio.fail_after(15):
                    while True:
                        now = await trio.to_thread.run_sync(_leaders, cluster)
                        if now.get("g0") in others:
                            break
                        await trio.sleep(0.1)
                facts["failover_s"] = time.monotonic() - t0
                new_term = (await trio.to_thread.run_sync(_status, cluster, now["g0"]))["term"]

                net.heal()  # the old leader's links reset, reconnect, and it learns the term
                with trio.fail_after(15):
                    while (await trio.to_thread.run_sync(_status, cluster, old)).get(
                            "term", -1) < new_term:
                        await trio.sleep(0.1)
                await trio.to_thread.run_sync(cluster.wait_ready, 30.0)
                async with Producer(cluster.namesrv_addr) as producer:
                    await producer.send("t", "after heal")
            finally:
                await trio.to_thread.run_sync(cluster.stop)
                nursery.cancel_scope.cancel()

    run(main)
    print(f"[figure] failover through the proxies: {facts['failover_s']:.2f} s")
