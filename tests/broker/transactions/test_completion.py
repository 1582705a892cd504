"""A producer running transactions back to back spends no tx_complete entry on each: the
next transaction's tx_add completes the previous one once the coordinator's leader saw
all its markers applied (which its client waited for); a transaction no other follows is
completed by the leader's duty after `COMPLETE_GRACE_S`, as before.

One real node (port 0) leading two one-replica groups (coordinator g0, data in g1); the
test does what the doors do (TX_ADD, PRODUCE, TX_END waiting for the markers) through
`TxService` and the node's `TxTasks`, and counts the coordinator's entries."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.duties.transactions import COMPLETE_GRACE_S
from broker.state.parts.base import ControlResult, ProduceResult
from broker.state.parts.txcoord import TxAdd, TxEnd, TxInit
from broker.state.statemachine import control_create_topic
from raftlog.types import EntryType
from tests.broker.transactions.one_node import leading, one_node, tid_coordinated_by
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch


def test_back_to_back_transactions_are_completed_by_the_next_ones_tx_add(
        tmp_path: Path) -> None:
    node = one_node(tmp_path)
    tid = tid_coordinated_by("g0", "done")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await leading(node)
            coord, part = node.groups["g0"], node.groups["g1"]
            cstate = node.registry.states["g0"]
            tx, tasks = node.tx_service, node.txtasks
            await part.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            await coord.propose(TxInit(tid, 3_600_000, int(time.time() * 1000)).encode(),
                                EntryType.CONTROL)

            async def one(n: int) -> None:  # a transaction, as its client drives it
                await tx.add(coord, tid, 0, n, ("g1",))
                ts = int(time.time() * 1000)
                res = await part.propose(STORED_PREFIX.pack(ts) + encode_batch(
                    "t", 0, [OutgoingMessage(b"m")], tx=(tid, 0, n)))
                assert isinstance(res, ProduceResult), res
                res = await coord.propose(TxEnd(tid, 0, n, True, ts, "client").encode(),
                                          EntryType.CONTROL)
                assert isinstance(res, ControlResult), res
                assert await tasks.markers_applied("g0", tid, 0, n)

            await one(0)
            for n in range(1, 4):
                before = cstate.applied_index
                await one(n)  # tx_add completing n - 1, tx_end
                assert [d.n for d in cstate.txcoord.done_ring()] == list(range(n))
                assert cstate.applied_index - before == 2
            # the last one has no successor: the duty completes it after the grace
            t0 = time.monotonic()
            with trio.fail_after(30):
                while cstate.txcoord.unfinished():
                    await trio.sleep(0.01)
            assert time.monotonic() - t0 >= COMPLETE_GRACE_S / 2
            assert cstate.applied_index - before == 3  # its tx_complete only
            assert [d.n for d in cstate.txcoord.done_ring()] == [0, 1, 2, 3]
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("version", [1, 2])
def test_a_node_writes_the_records_its_tx_record_version_allows(
        tmp_path: Path, version: int) -> None:
    """During a rolling upgrade (`tx_record_version = 1`) a leader writes no record an
    older node would apply differently: its tx_add never completes the previous
    transaction, its tx_end never applies a decision in its own group."""
    node = one_node(tmp_path, tx_record_version=version)
    tid = tid_coordinated_by("g0", "version")
    records: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await leading(node)
            tx, lead = node.tx_service, node.tx_service.lead
            propose = lead.propose

            async def recording(g: Any, record: Any, *args: Any) -> Any:
                records.append(record)
                return await propose(g, record, *args)

            lead.propose = recording  # type: ignore[method-assign, assignment]
            coord, part = node.groups["g0"], node.groups["g1"]
            await part.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            await coord.propose(TxInit(tid, 3_600_000, int(time.time() * 1000)).encode(),
                                EntryType.CONTROL)
            for n in range(2):
                await tx.add(coord, tid, 0, n, ("g1",))
                ts = int(time.time() * 1000)
                await part.propose(STORED_PREFIX.pack(ts) + encode_batch(
                    "t", 0, [OutgoingMessage(b"m")], tx=(tid, 0, n)))
                await coord.propose(TxEnd(tid, 0, n, True, ts, "client").encode(),
                                    EntryType.CONTROL)
                assert await node.txtasks.markers_applied("g0", tid, 0, n)
            nursery.cancel_scope.cancel()

    trio.run(main)
    adds = [r for r in records if isinstance(r, TxAdd)]
    assert [a.n for a in adds] == [0, 1]
    assert adds[1].completes is (version == 2)
