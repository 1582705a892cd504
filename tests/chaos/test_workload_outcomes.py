"""How the chaos workload records a failed write: `fail` (certainly not applied) only
when no error of the chain says the write may have been applied."""

from __future__ import annotations

from chaos.workload import _written_for_sure_not
from raftmq.client.errors import OutcomeUnknownError, RequestError, TransportError, give_up
from wire.protocol import Code


def _raised(final: RequestError, cause: RequestError) -> RequestError:
    """`final` as `routes.call` raises it: `from` the last try's error."""
    try:
        raise final from cause
    except RequestError as exc:
        return exc


def test_a_refusal_before_any_proposal_is_not_a_write() -> None:
    plain = RequestError(Code.NOT_LEADER, "this node does not lead that group")
    assert _written_for_sure_not(_raised(give_up(plain, "DELETE_TOPIC"), plain))
    unsent = TransportError("refused", sent=False)
    assert _written_for_sure_not(_raised(give_up(unsent, "DELETE_TOPIC"), unsent))


def test_a_proposal_its_leader_lost_may_be_a_write() -> None:
    doubt = RequestError(Code.NOT_LEADER, "lost it after appending", unknown=True)
    assert not _written_for_sure_not(_raised(give_up(doubt, "DELETE_TOPIC", uncertain=True),
                                             doubt))


def test_spent_tries_of_which_an_earlier_one_may_have_applied_are_no_refusal() -> None:
    # try 1 timed out (maybe stored); try 2 met a plain NOT_LEADER: the error raised is
    # an OutcomeUnknownError whose cause is only the last try's refusal
    last = RequestError(Code.NOT_LEADER, "this node does not lead that group")
    final = give_up(last, "PRODUCE", uncertain=True)
    assert isinstance(final, OutcomeUnknownError)
    assert not _written_for_sure_not(_raised(final, last))


def test_a_cause_chain_that_loops_is_walked_once() -> None:
    """A chain that comes back to an error already seen (`raise e from e`, as the
    client once did) ends the walk there instead of spinning the harness forever."""
    unavailable = RequestError(Code.UNAVAILABLE, "no leader answered")
    unavailable.__cause__ = unavailable
    assert _written_for_sure_not(unavailable)
    a, b = RequestError(Code.NOT_LEADER, "a"), RequestError(Code.NOT_LEADER, "b")
    a.__cause__, b.__cause__ = b, a
    assert _written_for_sure_not(a)
