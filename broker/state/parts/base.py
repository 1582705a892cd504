"""What every part of the broker state machine shares: results, refusals, records, the hooks.

A part owns one slice of a group's replicated state (`broker.state.statemachine` composes
them). It declares:

* `records`: the control records it owns, frozen and validated dataclasses that encode to
  (and decode from) a msgpack map with an "op" field, the on-log shape of CONTROL entries;
* `handlers()`: op -> handler, the dispatch table the composite merges with every other
  part's (two parts claiming one op is a programming error, found at construction);
* hooks the composite broadcasts to every part, in part order: a topic was created or
  deleted, the retention horizon moved;
* optionally, the batches it holds itself instead of their queue (`claims_batch` and
  `hold_batch`: the apply seam): a MESSAGES batch whose header names the part (a
  transaction's prepared batch names its transaction) is validated and deduplicated by
  the composite as any batch, then handed to the first part, in part order, that
  claims it;
* `section()` / `load(version, section)`: its own versioned section of the snapshot
  (`detach()` when the section references data kept outside it, see `Detached`).

Handlers and hooks are pure and total like `apply`: bad data raises `Refused` *before*
anything changes (validate everything, then mutate), and nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgpack

from wire.protocol import Code, RequestError, is_int  # is_int: the parts take it from here

if TYPE_CHECKING:
    from broker.state.statemachine import BrokerState
    from wire.records import BatchHeader, RecordRef

__all__ = [
    "MAX_QUEUES",
    "ApplyResult",
    "BatchOutcomes",
    "ControlRecord",
    "ControlResult",
    "Detached",
    "ErrorResult",
    "Handler",
    "Part",
    "ProduceResult",
    "Refused",
    "TopicConfig",
    "int_field",
    "is_int",
    "name_field",
    "pack",
]

MAX_QUEUES = 1024  # queues per topic; also what lets a key-index slot pack (offset, queue)


# ---------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic as this group knows it: `queues` in total, of which it hosts `hosted`."""

    name: str
    queues: int
    hosted: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Where a batch landed. A duplicate too old to remember has base_offset == index == -1.

    `shift` is how far into its entry's data the batch sits beyond the place of the
    entry's first batch (0 for that one): message ids name record positions in the entry,
    and a client knows them for its batch at the first place. It is a place, not part of
    the outcome, and is left out of comparisons."""

    base_offset: int
    count: int
    index: int
    dup: bool = False
    shift: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class ControlResult:
    """A control entry took effect: `applied` things changed, `skipped` were ignored.

    `items` is what a record's apply chose or found, for the door that proposed it (the
    messages a `receive` handed out, the receipts an `ack` found stale): the apply is
    where the choice is made, deterministically, so the door learns it from here. A
    retried request's result (`dup`) does not carry them."""

    op: str
    applied: int = 0
    skipped: int = 0
    dup: bool = False  # a retried request: the first copy's result, nothing changed now
    items: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ErrorResult:
    """The entry (or, in `BatchOutcomes`, the batch) was refused as a whole and changed
    nothing."""

    code: Code
    message: str


@dataclass(frozen=True, slots=True)
class BatchOutcomes:
    """What each batch of a MESSAGES entry holding several came to, in entry order: each
    is stored, a duplicate, or refused alone."""

    results: tuple[ProduceResult | ErrorResult, ...]


ApplyResult = ProduceResult | BatchOutcomes | ControlResult | ErrorResult | None


@dataclass(frozen=True, slots=True)
class Detached:
    """A part's snapshot section and, when it references data kept outside the snapshot
    (ConsumeQueue chunks), the I/O that goes with it, run by whoever writes the snapshot:
    `write` in the serialising thread before the snapshot bytes are made (the referenced
    data made durable first), `saved` once a snapshot holding this section is durable
    (data only older snapshots referenced may go)."""

    section: Any
    write: Callable[[], None] | None = None
    saved: Callable[[], None] | None = None


class Refused(ValueError):
    """Bad entry data: turns into an ErrorResult at the apply boundary. Also what a control
    record raises when constructed from invalid fields."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------- field checks


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def int_field(name: str, v: object, lo: int, hi: int | None = None) -> int:
    """`v` as an int in lo..hi, or Refused(MALFORMED) naming field `name`."""
    if not is_int(v) or v < lo or (hi is not None and v > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise Refused(Code.MALFORMED, f"{name} must be an integer {bound}, got {v!r}")
    return v


def name_field(validate: Callable[[Any], str], value: object) -> str:
    """`value` checked by one of `wire.protocol`'s name validators."""
    try:
        return validate(value)
    except RequestError as exc:
        raise Refused(exc.code, exc.message) from None


# ---------------------------------------------------------------------- records

R = TypeVar("R", bound="ControlRecord")


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A control entry's payload. Subclasses set `op` and define `to_map` (the on-log
    fields without "op"), `from_map` (shape checks on the decoded map, then the
    constructor) and `validate` (the rules on typed fields, raising `Refused`), which
    `__post_init__` runs: an instance is always valid, however it was made.
    """

    op: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise Refused if the fields break the record's rules."""

    def to_map(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_map(cls: type[R], d: Mapping[str, Any]) -> R:
        raise NotImplementedError

    def encode(self, req: tuple[int, int] | None = None) -> bytes:
        """The CONTROL entry data; `req` (client id, sequence) lets the request-dedup part
        answer a retried copy with the first one's result."""
        d: dict[str, Any] = {"op": self.op, **self.to_map()}
        if req is not None:
            d["req"] = list(req)
        return pack(d)

    @classmethod
    def decode(cls: type[R], data: bytes) -> R:
        """The record in CONTROL entry data; Refused if it is not a valid one of this type."""
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise Refused(Code.MALFORMED, f"undecodable control entry: {exc}") from None
        if not isinstance(d, dict) or d.get("op") != cls.op:
            raise Refused(Code.MALFORMED, f"not a {cls.op} control entry")
        return cls.from_map(d)

    def describe(self) -> str:
        """One line for logs and transcripts."""
        args = " ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{self.op} {args}".rstrip()


#: A part's apply handler: (record, Raft index of the entry) -> result; raises Refused.
Handler = Callable[[Any, int], ControlResult]


class Part:
    """One sub-machine of the broker state. See the module docstring."""

    name: ClassVar[str] = ""  # its snapshot section's key; stable across releases
    version: ClassVar[int] = 1  # the section version `section()` writes
    records: ClassVar[tuple[type[ControlRecord], ...]] = ()

    def __init__(self, state: BrokerState) -> None:
        self.state = state  # the composite: other parts' queries, never their fields

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        """op -> (record type, handler) for the control records this part owns."""
        return {}

    # hooks, broadcast by the composite; they run after validation and must not raise

    def topic_created(self, config: TopicConfig) -> None:
        """`config` was just added to the catalog."""

    def topic_grown(self, old: TopicConfig, new: TopicConfig) -> None:
        """`old` became `new`: more queues in all, a superset of them hosted here."""

    def topic_deleted(self, config: TopicConfig) -> None:
        """`config` was just removed: forget what hangs off the topic (a re-created topic
        starts from scratch)."""

    def group_deleted(self, cg: str) -> None:
        """Consumer group `cg` was just deleted (`delete_group`): forget what is its."""

    def retained(self, min_index: int) -> int:
        """Nothing below Raft index `min_index` is referenced any more; returns how many
        messages this part dropped (only the queues count)."""
        return 0

    # the apply seam: batches held by a part instead of their queue

    #: Whether this part may claim a batch that is neither prepared nor delayed
    #: (`BatchHeader.held`). Unless some part says so, such a batch goes straight to its
    #: queue without being offered: the common batch, on every replica.
    claims_plain: ClassVar[bool] = False

    def claims_batch(self, header: BatchHeader) -> bool:
        """Whether this part holds batches with `header` itself (pure: the header only).
        Offered held batches only, and every batch when `claims_plain`."""
        return False

    def hold_batch(self, header: BatchHeader, refs: list[RecordRef], index: int,
                   store_ms: int) -> None:
        """Hold a batch this part claims, of the entry at `index`: its topic and queue
        exist here and it is no duplicate. Validates first; Refused changes nothing."""
        raise NotImplementedError(f"part {self.name!r} claims batches it cannot hold")

    # snapshot section

    def section(self) -> Any:
        """This part's state as plain msgpack-able values, detached from the live state
        (it is serialised later, possibly in a worker thread, while `apply` goes on).
        Deterministic: equal states give equal sections."""
        raise NotImplementedError

    def detach(self) -> Detached:
        """`section()` with the I/O it needs, if any (see `Detached`)."""
        return Detached(self.section())

    def load(self, version: int, section: Any) -> None:
        """Fill a fresh part from `section()` output of `version`; ValueError (or any
        exception, which the composite turns into one) on data that is not one."""
        raise NotImplementedError

    def check(self) -> None:
        """After every part loaded: ValueError if this part disagrees with the others."""
