"""A producer's consecutive transactions enter a queue in their order, also when a
coordinator leader finds several of them decided with their markers unwritten (as a new
leader does after a failover) and starts all their marker jobs in one tick.

One real node (port 0) leading two one-replica groups: the coordinator's records and
the prepared batches are proposed straight into the groups' logs, as an old leader left
them, then the node's transaction duty ticks once. trio orders the tasks of one tick at
random (it reverses a batch half the time), so the scenario runs several rounds; before
the markers of one id were ordered, some round put a later transaction first."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from broker.state.parts.base import ControlResult, ProduceResult
from broker.state.parts.txcoord import TxAdd, TxEnd, TxInit
from broker.state.statemachine import control_create_topic
from raftlog.types import EntryType
from tests.broker.transactions.one_node import leading, one_node, tid_coordinated_by
from wire.records import STORED_PREFIX, OutgoingMessage, decode_record, encode_batch

ROUNDS = 10  # each round, before the fix: a later transaction first half the time
PER_ROUND = 2  # a coordinator keeps at most n and n + 1 of one id undelivered




def test_markers_of_one_producer_enter_a_queue_in_its_order(tmp_path: Path) -> None:
    node = one_node(tmp_path)
    tid = tid_coordinated_by("g0", "order")  # coordinator g0, data in g1

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await leading(node)
            coord, part = node.groups["g0"], node.groups["g1"]
            await part.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            await coord.propose(TxInit(tid, 3_600_000, int(time.time() * 1000)).encode(),
                                EntryType.CONTROL)
            want: list[bytes] = []
            n = 0
            for _round in range(ROUNDS):
                for _ in range(PER_ROUND):  # decided, markers not written
                    ts = int(time.time() * 1000)
                    res = await coord.propose(TxAdd(tid, 0, n, ("g1",), ts).encode(),
                                              EntryType.CONTROL)
                    assert isinstance(res, ControlResult), res
                    body = f"n{n}".encode()
                    res = await part.propose(STORED_PREFIX.pack(ts) + encode_batch(
                        "t", 0, [OutgoingMessage(body)], tx=(tid, 0, n)))
                    assert isinstance(res, ProduceResult), res
                    res = await coord.propose(TxEnd(tid, 0, n, True, ts, "client").encode(),
                                              EntryType.CONTROL)
                    assert isinstance(res, ControlResult), res
                    want.append(body)
                    n += 1
                node.txtasks.wake()  # one tick finds them all
                with trio.fail_after(60):
                    while node.registry.states["g0"].txcoord.unfinished():
                        await trio.sleep(0.02)
            bodies = []
            s = node.registry.states["g1"]
            lo, end = s.queue_range("t", 0)
            entries, _ = s.lookup("t", 0, lo, end - lo, 1 << 30)
            for e in entries:
                stored = await part.read_committed(e.index)
                msg, _ = decode_record(stored.data, e.start, topic="t", queue=0,
                                       offset=e.offset, store_ms=e.store_ms, msg_id="")
                bodies.append(bytes(msg.body))
            assert bodies == want
            nursery.cancel_scope.cancel()

    trio.run(main)
