"""The dispatcher (`broker.doors.service`): one table of every door's ops, each op
answered by exactly one door, and what `handle` decides for every request before a door
is asked (peer-only ops, an unknown op)."""

from __future__ import annotations

import types

import pytest
import trio

from broker.doors.service import BrokerService
from broker.runtime.groups import GroupRegistry
from transport.framing import Caller
from wire.protocol import Code, Frame, Op, RequestError

#: The ops a node answers through its doors, by the door that answers each.
DOORS = {
    "produce": {Op.PRODUCE},
    "reads": {Op.FETCH, Op.GET_MESSAGE, Op.QUERY_KEY, Op.OFFSET_FOR_TIME, Op.READ_RAW},
    "offsets": {Op.COMMIT_OFFSET, Op.QUERY_OFFSET, Op.OFFSETS, Op.DELETE_GROUP},
    "topics": {Op.CREATE_TOPIC, Op.DELETE_TOPIC, Op.GROW_TOPIC, Op.TOPICS},
    "cluster": {Op.STATUS, Op.TRANSFER_LEADER, Op.MEMBERSHIP, Op.HOST_GROUP, Op.DROP_GROUP},
    "heartbeats": {Op.HEARTBEAT, Op.CONSUMERS},
    "locks": {Op.LOCK, Op.UNLOCK, Op.LOCKS},
    "trace": {Op.TRACE},
    "simple": {Op.RECEIVE, Op.ACK, Op.NACK, Op.CHANGE_INVISIBLE, Op.DLQ, Op.SEND_BACK},
    "transactions": {Op.TX_INIT, Op.TX_ADD, Op.TX_OFFSETS, Op.TX_END, Op.TX_MARKER,
                     Op.TX_STATUS, Op.HALF_END, Op.TX_LIST, Op.PRODUCER_HEARTBEAT},
}


def _service() -> BrokerService:
    node = types.SimpleNamespace(config=types.SimpleNamespace(groups=[]), metrics=None,
                                 skip_read_barrier=False, crash_before_answer=False)
    return BrokerService(GroupRegistry({}, {}), node)  # type: ignore[arg-type]


def test_every_op_is_answered_by_the_door_of_its_area() -> None:
    service = _service()
    table = service._handlers
    assert set(table) == set().union(*DOORS.values())
    for door, ops in DOORS.items():
        for op in ops:
            owner = table[op].__self__  # type: ignore[attr-defined]
            assert type(owner).__module__ == f"broker.doors.{door}", (op.name, owner)


def _ask(service: BrokerService, header: dict, *, peer: bool = False) -> RequestError:
    caller = Caller("127.0.0.1:5000", peer=2 if peer else None)
    with pytest.raises(RequestError) as err:
        trio.run(service.handle, caller, Frame(header, b"", 0))
    return err.value


@pytest.mark.parametrize("op", [Op.READ_RAW, Op.RAFT, Op.TX_MARKER])
def test_a_peer_only_op_is_forbidden_to_a_client(op: Op) -> None:
    err = _ask(_service(), {"op": int(op), "id": 1})
    assert err.code == Code.FORBIDDEN and op.name in err.message


@pytest.mark.parametrize("op", [999, "FETCH", None, int(Op.RAFT)])
def test_an_op_no_door_answers_is_unknown(op: object) -> None:
    err = _ask(_service(), {"op": op, "id": 1}, peer=True)
    assert err.code == Code.UNKNOWN_OP
