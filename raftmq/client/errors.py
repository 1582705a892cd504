"""The errors the SDK raises, and the one rule for leaving a client object's block.

    RaftMQError                   every error raftmq raises to a caller
    ├── RequestError              a request failed; `.code` (a `Code`), `.message`, `.extra`
    │   ├── TransportError        the connection failed (`.sent`: the request had left)
    │   ├── UnavailableError      no node could be reached, or none leads the group now;
    │   │   │                     nothing was written (code UNAVAILABLE)
    │   │   └── IncompleteError   an answer gathered from several groups misses some:
    │   │                         `.unreadable` names them, `.partial` is what was read
    │   ├── OutcomeUnknownError   a write may or may not have been applied (a timeout, a
    │   │                         connection lost after sending): check before resending;
    │   │                         `.txid` names a half message whose `prepare` it was
    │   ├── StaleReceiptError     a simple consumer's receipt names a delivery that is
    │   │                         no longer current (delivered again, acked, dead-lettered)
    │   └── TransactionError      a transaction cannot go on (`.code` says why)
    │       ├── ProducerFencedError   a newer producer holds the transactional id (TX_FENCED):
    │       │                         this producer can no longer begin, send or commit
    │       └── TransactionAbortedError  the transaction was aborted, not committed (its
    │                                 timeout passed, a send failed, or it was fenced)
    ├── ClientClosedError         the client object is closed, or was never opened
    └── OffsetsInUseError         another live broadcast consumer of the group holds its
                                  local offsets file (`raftmq.client.localoffsets`)

A definite refusal is a `RequestError` with the broker's code (UNKNOWN_TOPIC,
MESSAGE_TOO_LARGE, OFFSET_TOO_LARGE, ...): nothing was written. `RequestError.retriable`
says whether trying again later may succeed.

Client objects (`Producer`, `PullConsumer`, `PushConsumer`, `Admin`) own task groups,
which wrap whatever leaves them in an `ExceptionGroup`; `close_stack` undoes that, so an
error raised inside `async with Producer(...)` leaves the block as itself.

`TransportError`, `ClientClosedError` and the task-group helpers are defined by the
connection layer that raises them (`transport.errors`) and re-exported here.
"""

from __future__ import annotations

from transport.errors import ClientClosedError, TransportError, close_stack, leaves, unwrap
from wire.protocol import Code, RaftMQError, RequestError

__all__ = [
    "ClientClosedError",
    "IncompleteError",
    "LockLostError",
    "OutcomeUnknownError",
    "RaftMQError",
    "ProducerFencedError",
    "RequestError",
    "StaleReceiptError",
    "TransactionAbortedError",
    "TransactionError",
    "TransportError",
    "UnavailableError",
    "close_stack",
    "as_sdk_error",
    "give_up",
    "leaderless",
    "leaves",
    "may_have_applied",
    "unwrap",
]


class UnavailableError(RequestError):
    """No node could be reached, or no replica leads the group (a quorum is lost); the
    request was not applied. Retriable later."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.UNAVAILABLE, message, **extra)


class IncompleteError(UnavailableError):
    """A read that gathers from several groups (or queues) could not read some of them:
    rather than an answer that silently leaves them out, this names them (`unreadable`,
    e.g. broker groups "g1" or queues "topic/3") and carries what was read (`partial`)."""

    def __init__(self, message: str, *, unreadable: list[str], partial: object) -> None:
        super().__init__(message, unreadable=unreadable)
        self.unreadable = unreadable
        self.partial = partial


class OutcomeUnknownError(RequestError):
    """A write was sent but no answer says whether it was applied (a timeout, a
    connection lost after sending, a leader lost before the entry committed). The write
    may have been stored: look for it (by key or id) before sending it again, or use an
    idempotent producer, whose retries are never stored twice.

    `txid` is set when the write was a half message (`Producer.prepare`,
    `send_in_transaction`): it may be stored, so commit or roll it back by that id
    (`Admin.tx_commit` / `tx_rollback`, `raftmq tx`), look it up (`Admin.tx_show`), or
    let the broker's check-back ask the check listener about it. None otherwise."""

    def __init__(self, message: str, *, txid: str | None = None, **extra: object) -> None:
        super().__init__(Code.TIMEOUT, message, **extra)
        self.txid = txid


class StaleReceiptError(RequestError):
    """A simple consumer acked, nacked or re-timed a delivery that is no longer current:
    its invisible time ran out and the message was delivered again (to this consumer or
    another), or it was acked or sent to the dead letters already. Nothing was done for
    it: the current delivery, if any, is its holder's to settle."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.STALE_RECEIPT, message, **extra)


class LockLostError(RequestError):
    """An offset commit for a queue that another client of the consumer group holds the
    lock of now (orderly consumption): this client's lease ran out and the queue moved
    on. Nothing was committed: what it handled since its last commit is the new holder's
    to handle again."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.LOCK_LOST, message, **extra)


class PoisonMessage(Exception):  # noqa: N818 - what it is, not how it failed
    """Raise it in a `PushConsumer` handler for messages known to be poison: they go to
    the consumer group's dead letters at once, with this exception's text as their
    error, instead of being retried."""


class TransactionError(RequestError):
    """A transaction (Kafka's model) or a half message (RocketMQ's) cannot go on as
    asked. `code` says why: TX_DECIDED (committed or aborted already, also when the client
    itself knows it), TX_UNKNOWN (no such transaction), TX_LIMIT (too many messages,
    bytes or groups, or a timeout over the maximum), MALFORMED (a call out of turn, such
    as `begin` while a transaction is open). Nothing was changed by the refused call."""


class ProducerFencedError(TransactionError):
    """A producer with the same transactional id started after this one (a higher
    epoch): this one is a zombie. It can no longer begin, send, send offsets or commit;
    close it. Its open transaction is aborted by the coordinator."""

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(Code.TX_FENCED, message, **extra)


class TransactionAbortedError(TransactionError):
    """`commit` found the transaction aborted instead: its timeout passed, a newer
    producer fenced it, or one of its sends failed (the cause is chained). Nothing of it
    is visible to consumers; begin a new transaction to try again."""


_NO_LEADER = frozenset({Code.NOT_LEADER, Code.TIMEOUT, Code.UNAVAILABLE, Code.CONNECTION_LOST,
                        Code.PROPOSAL_DROPPED})


def may_have_applied(exc: RequestError) -> bool:
    """Whether a write that failed with `exc` may have been applied all the same: no
    answer came (a timeout, a connection lost after sending), or the leader that took it
    lost leadership before the entry committed (NOT_LEADER marked `unknown`), or the
    broker could no longer tell whether a retried request took effect (STALE_REQUEST)."""
    if isinstance(exc, OutcomeUnknownError):
        return True
    if isinstance(exc, (UnavailableError, ClientClosedError)):
        return False
    if isinstance(exc, TransportError):
        return exc.sent
    return exc.code in (Code.TIMEOUT, Code.STALE_REQUEST) or bool(exc.extra.get("unknown"))


def leaderless(exc: RequestError) -> bool:
    """Whether `exc` is what an election looks like from a client: no replica leads the
    group now (NOT_LEADER with nobody to follow), the one that did cannot be reached, or
    it is handing leadership over (PROPOSAL_DROPPED: a transfer or membership change under
    way, nothing written), which ends in an election's time too."""
    return exc.code in (Code.NOT_LEADER, Code.UNAVAILABLE, Code.PROPOSAL_DROPPED)


def as_sdk_error(exc: RequestError) -> RequestError:
    """A broker refusal as the SDK's own type, whichever call met it: STALE_RECEIPT is a
    `StaleReceiptError`; LOCK_LOST a `LockLostError`; TX_FENCED is a `ProducerFencedError`; TX_UNKNOWN, TX_DECIDED and TX_LIMIT are `TransactionError`s;
    anything else is returned as it is."""
    if isinstance(exc, TransactionError | StaleReceiptError | LockLostError):
        return exc
    if exc.code == Code.STALE_RECEIPT:
        return StaleReceiptError(exc.message, **exc.extra)
    if exc.code == Code.LOCK_LOST:
        return LockLostError(exc.message, **exc.extra)
    if exc.code == Code.TX_FENCED:
        return ProducerFencedError(exc.message, **exc.extra)
    if exc.code in (Code.TX_UNKNOWN, Code.TX_DECIDED, Code.TX_LIMIT):
        return TransactionError(exc.code, exc.message, **exc.extra)
    return exc


def give_up(exc: RequestError, what: str, *, uncertain: bool = False) -> RequestError:
    """The error to raise once a request's retries are spent on `exc`.

    A write any of whose attempts may have been applied (`uncertain`) is an
    `OutcomeUnknownError`; a request no leader answered (no node reachable, none leading,
    answers that never came) is an `UnavailableError`, whatever the last attempt met, so a
    lost quorum reads the same in every command; any other error is raised as the
    SDK's type for its code (`as_sdk_error`). An `UnavailableError` met after a try that
    may have been applied is no proof that nothing was: it becomes an
    `OutcomeUnknownError` too.
    """
    if isinstance(exc, OutcomeUnknownError):
        return exc
    if uncertain:
        return OutcomeUnknownError(
            f"{what}: no answer says whether it was stored ({exc.message}); it may have "
            "been: check before sending it again", **exc.extra)
    if isinstance(exc, UnavailableError):
        return exc
    if isinstance(exc, TransportError) or exc.code in _NO_LEADER:
        return UnavailableError(f"{what}: no leader answered ({exc.message})", **exc.extra)
    return as_sdk_error(exc)
