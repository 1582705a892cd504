"""TX_ADDs of one transaction arriving together share one tx_add entry in the
coordinator's log: the client's TX_ADD and every participant's registration leave with
the sends, and each used to log its own entry (a transaction over three groups wrote up
to four). An add that an add in flight covers waits for it; one arriving while an add
waits for its barrier joins that entry; a refusal reaches every request that shared it.

One real node (port 0) leading three one-replica groups; `TxService.add` is called as the
TX_ADD door and the participants' registrations call it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from broker.node import Node
from broker.state.parts.txcoord import TxInit
from raftlog.types import EntryType
from tests.broker.transactions.one_node import leading, one_node, tid_coordinated_by
from wire.protocol import Code, RequestError

GROUPS = ("g0", "g1", "g2")


def _tid_coordinated_by(gid: str) -> str:
    return tid_coordinated_by(gid, "share", GROUPS)


def _run(tmp_path: Path, scenario: object) -> None:
    node = one_node(tmp_path, GROUPS)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await leading(node, GROUPS)
            await scenario(node)  # type: ignore[operator]
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("first", [("g0", "g1", "g2"), ("g1",)])
def test_adds_of_one_transaction_arriving_together_log_one_entry(
        tmp_path: Path, first: tuple[str, ...]) -> None:
    tid = _tid_coordinated_by("g0")

    async def scenario(node: Node) -> None:
        g = node.groups["g0"]
        await g.propose(TxInit(tid, 3_600_000, int(time.time() * 1000)).encode(),
                        EntryType.CONTROL)
        state = node.registry.states["g0"]
        before = state.applied_index
        tx = node.tx_service
        async with trio.open_nursery() as n:
            # the first add is on its way (its barrier) when the others come
            n.start_soon(tx.add, g, tid, 0, 0, first)
            await trio.sleep(0)
            for groups in (("g0",), ("g1",), ("g2",), ("g0", "g1", "g2")):
                n.start_soon(tx.add, g, tid, 0, 0, groups)
        assert state.applied_index - before == 1  # one tx_add for all five requests
        txn = state.txcoord.txn(tid)
        assert txn is not None and txn.state == "ongoing"
        assert txn.participants == GROUPS
        # covered already: a later add reads it after a barrier and logs nothing
        await tx.add(g, tid, 0, 0, ("g2",))
        assert state.applied_index - before == 1

    _run(tmp_path, scenario)


def test_a_refused_add_is_refused_to_every_request_that_shared_it(tmp_path: Path) -> None:
    tid = _tid_coordinated_by("g0")

    async def scenario(node: Node) -> None:
        g = node.groups["g0"]
        for _ in range(2):  # epoch 1: epoch 0 is fenced
            await g.propose(TxInit(tid, 3_600_000, int(time.time() * 1000)).encode(),
                            EntryType.CONTROL)
        tx = node.tx_service
        codes: list[Code] = []

        async def add(groups: tuple[str, ...]) -> None:
            try:
                await tx.add(g, tid, 0, 0, groups)
            except RequestError as exc:
                codes.append(exc.code)

        async with trio.open_nursery() as n:
            n.start_soon(add, ("g0", "g1"))
            await trio.sleep(0)
            n.start_soon(add, ("g1",))
            n.start_soon(add, ("g2",))
        assert codes == [Code.TX_FENCED] * 3
        assert not tx._adds  # nothing left waiting

    _run(tmp_path, scenario)
