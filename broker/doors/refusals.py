"""How a write the group's Raft refused or could not finish is answered to a client.

One place, so every request that proposes (produce, topic and offset writes,
transactions, users and ACLs) tells the client the same thing about the same outcome:
- not appended here (no leader here, a full disk): ``NOT_LEADER``, safe to retry
  elsewhere;
- a leader elected a moment ago that has not applied an entry of its own term yet
  (`NotReady`): ``NOT_LEADER`` naming itself as the leader, with ``ready`` false: retry
  there shortly, as after an election;
- appended here, then leadership lost (`ProposalInDoubt`): ``NOT_LEADER`` with
  ``unknown`` set, since the next leader may still commit it: a client must not report
  it as not written;
- dropped or lost before its fate was decided: ``PROPOSAL_DROPPED``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raftlog.runtime import (
    DiskFull,
    NotLeader,
    NotReady,
    ProposalDropped,
    ProposalInDoubt,
    ProposalLost,
)
from wire.protocol import Code, RequestError


def refusal(
    exc: NotLeader | ProposalDropped | ProposalLost,
    peer_addr: Callable[[int | None], str | None],
    *,
    in_doubt: bool = False,
    **fields: Any,
) -> RequestError:
    """The client's error for `exc`; `peer_addr` turns the leader's node id into the
    address the client should try. `in_doubt`: the caller knows the proposal was appended
    (a batch of `propose_many`), whatever the exception says."""
    if isinstance(exc, NotLeader):
        unknown = in_doubt or isinstance(exc, ProposalInDoubt)
        if isinstance(exc, NotReady):
            return RequestError(Code.NOT_LEADER, str(exc), leader=peer_addr(exc.leader),
                                term=exc.term, ready=False, **fields)
        if isinstance(exc, (ProposalInDoubt, DiskFull)):
            why = str(exc)
        elif unknown:
            why = "leadership was lost before the batch committed; it may still be stored"
        else:
            why = "this node does not lead that group"
        return RequestError(Code.NOT_LEADER, why, leader=peer_addr(exc.leader), term=exc.term,
                            **({"unknown": True} if unknown else {}), **fields)
    return RequestError(Code.PROPOSAL_DROPPED, str(exc))
