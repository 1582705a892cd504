"""A node asked to listen on port 0 binds a free port and says which (`Node.run`'s
task_status), so a test never races another process for a port it guessed was free."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trustme

from broker.config import GroupConfig, NodeConfig
from broker.node import Node
from transport.connection import ConnectionPool, TransportError
from wire.protocol import Op


def one_node(data: Path) -> NodeConfig:
    return NodeConfig(node_id=1, listen="127.0.0.1:0", data=data, peers={1: "127.0.0.1:0"},
                      groups=(GroupConfig("g0", (1,), 1),), tick_ms=10)


def test_a_node_on_port_0_reports_and_advertises_the_port_it_bound(tmp_path: Path) -> None:
    node = Node(one_node(tmp_path))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(node.run)
            host, port = addr.rsplit(":", 1)
            assert host == "127.0.0.1" and int(port) > 0
            async with ConnectionPool() as pool:
                with trio.fail_after(30):  # a one-replica group elects itself
                    while True:
                        status = (await pool.request(addr, Op.STATUS)).header
                        if status["groups"]["g0"]["role"] == "leader":
                            break
                        await trio.sleep(0.02)
            assert status["addr"] == addr
            assert status["groups"]["g0"]["leader_addr"] == addr  # hints carry the real port
            assert node.registration()["groups"]["g0"]["replicas"] == {1: addr}
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_node_given_ssl_contexts_serves_tls_only(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    with pytest.raises(ValueError, match="both"):
        Node(one_node(tmp_path), ssl_context=server)
    node = Node(one_node(tmp_path), ssl_context=server, peer_ssl_context=client)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(node.run)
            async with ConnectionPool(ssl_context=client) as pool:
                status = (await pool.request(addr, Op.STATUS)).header
                assert status["addr"] == addr
            async with ConnectionPool() as pool:
                with pytest.raises(TransportError):
                    await pool.request(addr, Op.STATUS, timeout=10)
            nursery.cancel_scope.cancel()

    trio.run(main)
