"""What a node tells its name servers pairs each group's topic table with the applied
index of the state that table was read from. A name server trusts the table of the member
that applied most, so an index running ahead of its table (the core's count, advanced
before a Ready's entries are stored and applied) made a replica that was catching up
hide every topic of its group from the routes."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.config import GroupConfig, NodeConfig
from broker.node import Node
from broker.protocol import Code, Op, RequestError
from transport.connection import ConnectionPool


def test_a_registration_reports_the_applied_index_of_the_table_it_carries(
        tmp_path: Path) -> None:
    node = Node(NodeConfig(node_id=1, listen="127.0.0.1:0", data=tmp_path,
                           peers={1: "127.0.0.1:0"}, groups=(GroupConfig("g0", (1,), 1),),
                           tick_ms=10))
    mismatches: list[tuple[int, int]] = []
    samples = 0

    async def sample(done: trio.Event) -> None:
        """At every turn of the scheduler: the index reported beside the table, and the
        index of the state the table was read from."""
        nonlocal samples
        while not done.is_set():
            reported = node.registration()["groups"]["g0"]["applied"]
            if reported != node.states["g0"].applied_index:
                mismatches.append((reported, node.states["g0"].applied_index))
            samples += 1
            await trio.sleep(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(node.run)
            async with ConnectionPool() as pool:
                with trio.fail_after(30):
                    while (await pool.request(addr, Op.STATUS)).header["groups"]["g0"][
                            "role"] != "leader":
                        await trio.sleep(0.02)
                done = trio.Event()
                nursery.start_soon(sample, done)
                for i in range(40):
                    with trio.fail_after(30):
                        while True:  # a new leader answers once it applied what came before
                            try:
                                await pool.request(addr, Op.CREATE_TOPIC, {
                                    "g": "g0", "topic": f"t{i}", "queues": 1, "hosted": [0]})
                                break
                            except RequestError as exc:
                                if exc.code != Code.NOT_LEADER:
                                    raise
                                await trio.sleep(0.02)
                done.set()
            assert len(node.states["g0"].topics()) == 40
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert samples > 40
    assert not mismatches, mismatches[:5]
