"""A node asked to listen on port 0 binds a free port and says which (`Node.run`'s
task_status), so a test never races another process for a port it guessed was free."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.config import GroupConfig, NodeConfig
from broker.node import Node
from broker.protocol import Op
from transport.connection import ConnectionPool


def test_a_node_on_port_0_reports_and_advertises_the_port_it_bound(tmp_path: Path) -> None:
    config = NodeConfig(node_id=1, listen="127.0.0.1:0", data=tmp_path,
                        peers={1: "127.0.0.1:0"}, groups=(GroupConfig("g0", (1,), 1),),
                        tick_ms=10)
    node = Node(config)

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
