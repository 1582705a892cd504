"""How a write Raft refused or could not finish is answered (`broker.doors.refusals`): one
mapping for every request that proposes, so a client can tell "not written, retry
elsewhere" from "may still be written" the same way for produce, admin, transactional
and security writes."""

from __future__ import annotations

import pytest

from broker.doors.refusals import refusal
from chaos.secworkload import _definite_refusal
from raftlog.core import NotLeader, ProposalDropped
from raftlog.runtime import DiskFull, NotReady, ProposalInDoubt, ProposalLost
from wire.protocol import Code, RequestError

ADDRS = {2: "127.0.0.1:9002"}


def _answer(exc: BaseException, **kw: object) -> RequestError:
    return refusal(exc, ADDRS.get, **kw)  # type: ignore[arg-type]


def test_not_leading_before_proposing_is_a_definite_refusal_with_a_hint() -> None:
    err = _answer(NotLeader(2, 7))
    assert err.code == Code.NOT_LEADER and "does not lead" in err.message
    assert err.extra == {"leader": "127.0.0.1:9002", "term": 7}
    assert _definite_refusal(err)


def test_a_proposal_appended_then_orphaned_is_in_doubt() -> None:
    err = _answer(ProposalInDoubt(NotLeader(None, 8)))
    assert err.code == Code.NOT_LEADER and err.extra["unknown"] is True
    assert "may still commit" in err.message and err.extra["leader"] is None
    assert not _definite_refusal(err)


def test_a_batch_known_to_be_appended_is_in_doubt_whatever_the_exception_says() -> None:
    err = _answer(NotLeader(2, 3), in_doubt=True)
    assert err.extra["unknown"] is True and "may still be stored" in err.message
    assert not _definite_refusal(err)


def test_a_full_disk_says_so_and_is_definite_before_proposing() -> None:
    err = _answer(DiskFull("g1"))
    assert err.code == Code.NOT_LEADER and "no space left" in err.message
    assert "unknown" not in err.extra and _definite_refusal(err)
    doubt = _answer(ProposalInDoubt(DiskFull("g1")))  # appended, then the disk filled
    assert doubt.extra["unknown"] is True


@pytest.mark.parametrize("exc", [ProposalDropped("transfer under way"),
                                 ProposalLost("entry 9 replaced")])
def test_dropped_or_lost_proposals_are_proposal_dropped(exc: Exception) -> None:
    err = _answer(exc)
    assert err.code == Code.PROPOSAL_DROPPED and err.message == str(exc)


def test_extra_fields_reach_the_client() -> None:
    assert _answer(NotLeader(2, 1), g="g0").extra["g"] == "g0"


def test_a_leader_not_ready_yet_names_itself_and_says_so() -> None:
    err = _answer(NotReady(2, 9))
    assert err.code == Code.NOT_LEADER and "not ready" in err.message
    assert err.extra == {"leader": "127.0.0.1:9002", "term": 9, "ready": False}
    assert err.retriable and _definite_refusal(err)


class _Led:
    """A group this node leads whose read barrier fails with `exc` (or succeeds)."""

    def __init__(self, exc: BaseException | None) -> None:
        self.is_leader, self.leader, self.exc = True, 1, exc

    def check_ready(self) -> None:
        pass

    async def read_barrier(self) -> None:
        if self.exc is not None:
            raise self.exc


def test_a_barrier_refused_while_confirming_leadership_is_the_requests_refusal() -> None:
    """A FETCH of a topic this node does not know yet confirms every group it leads
    (ReadIndex, together). A full disk or a lost leadership there reached the client as
    an internal error (the nursery's exception group), logged as a failed request; it is
    the refusal it would be for one group."""
    import trio

    from broker.doors.base import confirm_led

    def confirm(*groups: _Led) -> None:
        trio.run(confirm_led, {f"g{i}": g for i, g in enumerate(groups)})

    confirm(_Led(None), _Led(None))
    with pytest.raises(DiskFull):
        confirm(_Led(None), _Led(DiskFull("g1")))
    with pytest.raises(NotLeader):
        confirm(_Led(NotLeader(2)), _Led(DiskFull("g1")))
    with pytest.raises(BaseExceptionGroup):  # anything else stays what it is
        confirm(_Led(ValueError("a bug")), _Led(None))
