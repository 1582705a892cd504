"""Receipts: the simple consumer's per-message state, replicated (RocketMQ 5's
SimpleConsumer, Kafka's share groups).

Per (consumer group, topic, queue) a group's simple consumers share, with no assignment:

* `next`: the lowest offset never handed out to the group (a fresh group starts at the
  queue's first retained offset; retention moves it up to the new one);
* in flight: offset -> (visible at, deliveries, handle, last error, message group), the
  messages below `next` handed out and not acked or dead-lettered yet;
* held: message group -> offsets below `next` not handed out yet because an earlier
  message of their group is in flight (FIFO message groups, below). In flight and held
  together are at most `cap` per queue (the record carries the cap).

FIFO message groups (RocketMQ 5's FIFO topics, SQS FIFO's message groups): a message
carrying a message group (`wire.records.MESSAGE_GROUP_PROPERTY`) is handed out only while
no earlier message of its group is in flight for the consumer group; it waits in `held`
until that one is acked or dead-lettered, then goes out before anything new. A nacked or
expired message stays in flight (its group blocked) and is redelivered first, so a group
is consumed in order, one message at a time, while different groups proceed in parallel.
Messages without a group are handed out as they come. The part reads no message: which
group each message carries (and which ones a receive's filter leaves out) travels in the
`Receive` record, read from the stored records by the leader that proposed it
(`broker.doors.simple`); a message's properties never change, so any leader writes the
same facts, and every replica applies the same record.

Time: records carry the leader's clock (`now_ms`); the part keeps the highest it saw and
uses the later of the two, so its time never goes back across leader changes. Nothing
expires by itself: an in-flight message whose `visible at` is past is simply visible
again to the next `receive`, which is a record with a time of its own.

The records:

* `Receive`: apply *chooses*, deterministically: first the in-flight messages visible
  again, in offset order (redeliveries), then new ones from `next` on, up to `max` in
  all and the cap (then, with the record's `upto`, held messages of groups no longer
  blocked, and new ones up to `upto` only, holding those of a blocked group and passing
  those in `skip`, which the receiver's filter left out, for good). Each chosen one
  becomes invisible for `invisible_ms`, its delivery
  count goes up by one, and its handle becomes this entry's Raft index, unique to this
  delivery. A visible message already delivered `max_deliveries` times is not delivered
  again: it goes to the dead letters (`broker.state.parts.deadletters`) in this apply.
  The result's `items` say what was chosen, with each record's place, for the door to
  read and answer.
* `Ack`: each (offset, handle) whose handle is the current one leaves the in-flight set;
  any other (the message was delivered again since, or acked, or dead-lettered) is
  skipped and reported stale in `items`: an ack is never applied to a later delivery.
  An ack of a delivery whose invisible time ran out is still taken while nobody else
  received the message meanwhile.
* `Nack`: each current delivery becomes visible again after `delay_ms`, or, when none is
  given, after `backoff_ms[deliveries - 1]` (the last step repeating); its handle is
  cleared, so a later ack of that delivery is stale. One delivered `max_deliveries` times
  already, or nacked with `dead` (a message known to be poison), goes to the dead letters
  at once with the error given.
* `ChangeInvisible`: a current delivery's invisible time is set again from now; a stale
  handle is refused (STALE_RECEIPT).
* `SendBack`: a push consumer of the group read a message by offset (its queue's
  assignment, not a receive) and its handler failed: the message enters the in-flight set
  as delivered once, visible again after the first backoff step (or dead letters at once
  when `dead` or `max_deliveries` is 1), and from then on it is the group's to receive
  again like any other; `next` moves past it. A receive with `retries_only` (the push
  consumer's) takes only such visible messages, never new ones: the push consumer reads
  new messages by offset. One consumer group uses either the simple consumer or push
  consumers on a topic, not both.

The defaults below are the client's: every setting travels in the records, so each
consumer group's clients choose theirs, within the bounds the records check.

Snapshot section, version 2: {"now": ms, "dropped": n, "queues": [[cg, topic, queue,
next, [[offset, visible_ms, deliveries, handle, error, group], ...], [[group, [offset,
...]], ...]], ...]} sorted (version 1, without groups and held messages, still loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from broker.state.parts.base import (
    MAX_QUEUES,
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    TopicConfig,
    int_field,
    is_int,
    name_field,
)
from broker.state.parts.deadletters import MAX_ERROR_CHARS, DeadLetters
from wire.protocol import (
    Code,
    RequestError,
    validate_client_id,
    validate_group_name,
    validate_topic_name,
)
from wire.records import MAX_MESSAGE_GROUP_CHARS

__all__ = [
    "DEFAULT_BACKOFF_MS",
    "DEFAULT_INFLIGHT_CAP",
    "DEFAULT_INVISIBLE_MS",
    "DEFAULT_MAX_DELIVERIES",
    "MAX_ACK_ITEMS",
    "MAX_BACKOFF_STEPS",
    "MAX_DELAY_MS",
    "MAX_DELIVERIES",
    "MAX_INFLIGHT_CAP",
    "MAX_INVISIBLE_MS",
    "MAX_GROUP_CHARS",
    "MAX_RECEIVE",
    "MAX_SCAN",
    "MIN_INVISIBLE_MS",
    "Ack",
    "ChangeInvisible",
    "Delivery",
    "InFlight",
    "Nack",
    "Receipts",
    "Receive",
    "SendBack",
]

_S, _M, _H = 1000, 60_000, 3_600_000

#: How long a received message stays invisible to the group's other receives (30 s).
DEFAULT_INVISIBLE_MS = 30 * _S
MIN_INVISIBLE_MS = 10
MAX_INVISIBLE_MS = 12 * _H
#: Deliveries before a message goes to the dead letters (RocketMQ's 16).
DEFAULT_MAX_DELIVERIES = 16
MAX_DELIVERIES = 1000
#: How long a nacked message waits before it is visible again, by how many times it was
#: delivered (RocketMQ's retry levels: 10 s 30 s 1 m 2 m ... 10 m 20 m 30 m 1 h 2 h); the
#: last step repeats.
DEFAULT_BACKOFF_MS: tuple[int, ...] = (
    10 * _S, 30 * _S, 1 * _M, 2 * _M, 3 * _M, 4 * _M, 5 * _M, 6 * _M, 7 * _M, 8 * _M,
    9 * _M, 10 * _M, 20 * _M, 30 * _M, 1 * _H, 2 * _H)
MAX_BACKOFF_STEPS = 64
MAX_DELAY_MS = 24 * _H  # a nack's delay, and each backoff step, at most
#: Messages in flight per (consumer group, queue) at most: what one group's in-flight
#: state can cost a replica.
DEFAULT_INFLIGHT_CAP = 4096
MAX_INFLIGHT_CAP = 65_536
MAX_RECEIVE = 1024  # messages one receive hands out at most
MAX_ACK_ITEMS = 1024  # receipts one ack or nack carries at most
#: Messages one receive record describes at most (`upto` - `next`): its groups and skips.
MAX_SCAN = 65_536
MAX_GROUP_CHARS = MAX_MESSAGE_GROUP_CHARS  # (`wire.records.message_group_problem`)


class InFlight(NamedTuple):
    """A message handed out and not acked: when it is visible again, how many times it
    was delivered, the handle of its current delivery (0: none, it was nacked), the
    last error a consumer gave and its message group ("" for none)."""

    visible_ms: int
    deliveries: int
    handle: int
    error: str = ""
    group: str = ""


class Delivery(NamedTuple):
    """One message a `Receive` chose (its result's `items`): the offset, its delivery
    count and handle, and the record's place for the read."""

    offset: int
    deliveries: int
    handle: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index, which nothing uses)
    start: int
    size: int
    tag_hash: int
    store_ms: int


class _Slot:
    """One consumer group's state on one queue."""

    __slots__ = ("held", "inflight", "next")

    def __init__(self, nxt: int) -> None:
        self.next = nxt
        self.inflight: dict[int, InFlight] = {}
        self.held: dict[str, list[int]] = {}  # message group -> offsets waiting, in order

    def held_count(self) -> int:
        return sum(len(v) for v in self.held.values())

    def busy_groups(self) -> set[str]:
        """The message groups with a message in flight."""
        return {f.group for f in self.inflight.values() if f.group}


# ---------------------------------------------------------------------- records


def _where(cg: object, topic: object, queue: object) -> None:
    name_field(validate_group_name, cg)
    name_field(validate_topic_name, topic)
    int_field("queue", queue, 0, MAX_QUEUES - 1)


def _receipt_items(v: object) -> tuple[tuple[int, int], ...]:
    if (not isinstance(v, tuple) or not 0 < len(v) <= MAX_ACK_ITEMS
            or not all(isinstance(it, tuple) and len(it) == 2 and is_int(it[0])
                       and is_int(it[1]) and it[0] >= 0 and it[1] > 0 for it in v)):
        raise Refused(Code.MALFORMED, f"items must be 1-{MAX_ACK_ITEMS} receipts "
                      "[offset >= 0, handle > 0]")
    return v


def _scan_facts(groups: object, skip: object) -> None:
    if (not isinstance(groups, tuple) or len(groups) > MAX_SCAN
            or not all(isinstance(it, tuple) and len(it) == 2 and is_int(it[0])
                       and it[0] >= 0 and isinstance(it[1], str)
                       and 0 < len(it[1]) <= MAX_GROUP_CHARS for it in groups)):
        raise Refused(Code.MALFORMED, f"groups must be at most {MAX_SCAN} [offset >= 0, "
                      f"message group of 1-{MAX_GROUP_CHARS} characters]")
    if (not isinstance(skip, tuple) or len(skip) > MAX_SCAN
            or not all(is_int(o) and o >= 0 for o in skip)):
        raise Refused(Code.MALFORMED, f"skip must be at most {MAX_SCAN} offsets >= 0")


def _pairs(v: object) -> object:
    """A decoded list of [offset, handle] lists as a tuple of tuples (anything else as
    it is, for `validate` to refuse)."""
    if isinstance(v, list):
        return tuple(tuple(it) if isinstance(it, list) else it for it in v)
    return v


def _now(v: object) -> int:
    return int_field("now_ms", v, 0, (1 << 63) - 1)


@dataclass(frozen=True, slots=True)
class Receive(ControlRecord):
    """Consumer `consumer` of group `cg` receives up to `max` messages of `topic`/`queue`
    at the leader's time `now_ms`, each invisible to the group for `invisible_ms`."""

    op: ClassVar[str] = "receive"
    cg: str
    topic: str
    queue: int
    now_ms: int
    invisible_ms: int = DEFAULT_INVISIBLE_MS
    max: int = 32
    consumer: str = "-"
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    cap: int = DEFAULT_INFLIGHT_CAP
    retries_only: bool = False  # a push consumer's: messages sent back, never new ones
    #: The leader read the messages below `upto` (None: none read; every new message is
    #: then taken as one without a group, as before message groups). `groups`: (offset,
    #: message group) of those that carry one; `skip`: the offsets the receiver's filter
    #: leaves out. New messages at `upto` and beyond wait for a later receive.
    upto: int | None = None
    groups: tuple[tuple[int, str], ...] = ()
    skip: tuple[int, ...] = ()

    def validate(self) -> None:
        _where(self.cg, self.topic, self.queue)
        _now(self.now_ms)
        if self.upto is not None:
            int_field("upto", self.upto, 0)
        elif self.groups or self.skip:
            raise Refused(Code.MALFORMED, "groups and skip describe messages below upto")
        _scan_facts(self.groups, self.skip)
        int_field("invisible_ms", self.invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        int_field("max", self.max, 1, MAX_RECEIVE)
        name_field(validate_client_id, self.consumer)
        int_field("max_deliveries", self.max_deliveries, 1, MAX_DELIVERIES)
        int_field("cap", self.cap, 1, MAX_INFLIGHT_CAP)
        if not isinstance(self.retries_only, bool):
            raise Refused(Code.MALFORMED, "retries_only must be a boolean")

    def to_map(self) -> dict[str, Any]:
        d = {"cg": self.cg, "t": self.topic, "q": self.queue, "now": self.now_ms,
             "inv": self.invisible_ms, "max": self.max, "c": self.consumer,
             "md": self.max_deliveries, "cap": self.cap}
        if self.retries_only:
            d["ro"] = True
        if self.upto is not None:
            d["upto"] = self.upto
        if self.groups:
            d["grp"] = [list(it) for it in self.groups]
        if self.skip:
            d["skip"] = list(self.skip)
        return d

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Receive:
        skip = d.get("skip", ())
        return cls(d.get("cg"), d.get("t"), d.get("q"), d.get("now"),  # type: ignore[arg-type]
                   d.get("inv"), d.get("max"), d.get("c"),  # type: ignore[arg-type]
                   d.get("md"), d.get("cap"), d.get("ro", False),  # type: ignore[arg-type]
                   d.get("upto"), _pairs(d.get("grp", ())),  # type: ignore[arg-type]
                   tuple(skip) if isinstance(skip, list) else skip)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Ack(ControlRecord):
    """Group `cg` is done with the deliveries `items` ((offset, handle), ...) of one queue."""

    op: ClassVar[str] = "ack"
    cg: str
    topic: str
    queue: int
    items: tuple[tuple[int, int], ...]

    def validate(self) -> None:
        _where(self.cg, self.topic, self.queue)
        _receipt_items(self.items)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "q": self.queue,
                "items": [list(it) for it in self.items]}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Ack:
        return cls(d.get("cg"), d.get("t"), d.get("q"),  # type: ignore[arg-type]
                   _pairs(d.get("items")))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Nack(ControlRecord):
    """Group `cg` failed the deliveries `items` of one queue at the leader's time `now_ms`:
    visible again after `delay_ms` (None: the backoff step of their delivery count), or
    dead letters at once when `dead` or delivered `max_deliveries` times already."""

    op: ClassVar[str] = "nack"
    cg: str
    topic: str
    queue: int
    items: tuple[tuple[int, int], ...]
    now_ms: int
    delay_ms: int | None = None
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    error: str = ""
    dead: bool = False

    def validate(self) -> None:
        _where(self.cg, self.topic, self.queue)
        _receipt_items(self.items)
        _now(self.now_ms)
        if self.delay_ms is not None:
            int_field("delay_ms", self.delay_ms, 0, MAX_DELAY_MS)
        _backoff(self.backoff_ms)
        int_field("max_deliveries", self.max_deliveries, 1, MAX_DELIVERIES)
        _error(self.error)
        if not isinstance(self.dead, bool):
            raise Refused(Code.MALFORMED, "dead must be a boolean")

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "q": self.queue,
                "items": [list(it) for it in self.items], "now": self.now_ms,
                "delay": self.delay_ms, "backoff": list(self.backoff_ms),
                "md": self.max_deliveries, "err": self.error, "dead": self.dead}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Nack:
        backoff = d.get("backoff")
        return cls(d.get("cg"), d.get("t"), d.get("q"),  # type: ignore[arg-type]
                   _pairs(d.get("items")), d.get("now"), d.get("delay"),  # type: ignore[arg-type]
                   tuple(backoff) if isinstance(backoff, list) else backoff,  # type: ignore[arg-type]
                   d.get("md"), d.get("err"), d.get("dead"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ChangeInvisible(ControlRecord):
    """The current delivery `handle` of message `offset` stays invisible `invisible_ms`
    from the leader's time `now_ms`."""

    op: ClassVar[str] = "change_invisible"
    cg: str
    topic: str
    queue: int
    offset: int
    handle: int
    now_ms: int
    invisible_ms: int

    def validate(self) -> None:
        _where(self.cg, self.topic, self.queue)
        int_field("offset", self.offset, 0)
        int_field("handle", self.handle, 1)
        _now(self.now_ms)
        int_field("invisible_ms", self.invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "q": self.queue, "o": self.offset,
                "h": self.handle, "now": self.now_ms, "inv": self.invisible_ms}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> ChangeInvisible:
        return cls(d.get("cg"), d.get("t"), d.get("q"), d.get("o"),  # type: ignore[arg-type]
                   d.get("h"), d.get("now"), d.get("inv"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SendBack(ControlRecord):
    """A push consumer of `cg` failed message `offset` of `topic`/`queue` (read by offset)
    at the leader's time `now_ms`: delivered once, visible again after `backoff_ms[0]`, or
    dead letters at once when `dead` or `max_deliveries` is 1."""

    op: ClassVar[str] = "send_back"
    cg: str
    topic: str
    queue: int
    offset: int
    now_ms: int
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    error: str = ""
    dead: bool = False

    def validate(self) -> None:
        _where(self.cg, self.topic, self.queue)
        int_field("offset", self.offset, 0)
        _now(self.now_ms)
        _backoff(self.backoff_ms)
        int_field("max_deliveries", self.max_deliveries, 1, MAX_DELIVERIES)
        _error(self.error)
        if not isinstance(self.dead, bool):
            raise Refused(Code.MALFORMED, "dead must be a boolean")

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "q": self.queue, "o": self.offset,
                "now": self.now_ms, "backoff": list(self.backoff_ms),
                "md": self.max_deliveries, "err": self.error, "dead": self.dead}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> SendBack:
        backoff = d.get("backoff")
        return cls(d.get("cg"), d.get("t"), d.get("q"), d.get("o"),  # type: ignore[arg-type]
                   d.get("now"),  # type: ignore[arg-type]
                   tuple(backoff) if isinstance(backoff, list) else backoff,  # type: ignore[arg-type]
                   d.get("md"), d.get("err"), d.get("dead"))  # type: ignore[arg-type]


def _backoff(v: object) -> None:
    if (not isinstance(v, tuple) or not 0 < len(v) <= MAX_BACKOFF_STEPS
            or not all(is_int(b) and 0 <= b <= MAX_DELAY_MS for b in v)):
        raise Refused(Code.MALFORMED, f"backoff_ms must be 1-{MAX_BACKOFF_STEPS} delays "
                      f"of 0..{MAX_DELAY_MS} ms")


def _error(v: object) -> None:
    if not isinstance(v, str) or len(v) > MAX_ERROR_CHARS:
        raise Refused(Code.MALFORMED, f"error must be a string of at most "
                      f"{MAX_ERROR_CHARS} characters")


# ---------------------------------------------------------------------- the part


class Receipts(Part):
    """(cg, topic, queue) -> next offset and the messages in flight; the part's clock."""

    name = "receipts"
    version = 2
    records = (Receive, Ack, Nack, ChangeInvisible, SendBack)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        # test mutation (`broker.config`): an ack of an older delivery takes the current one
        self.ack_later_delivery = "ack-later-delivery" in getattr(state, "mutations", ())
        # test mutation: a message group's next message goes out while one is in flight
        self.fifo_ignore_inflight = "fifo-ignore-inflight" in getattr(state, "mutations", ())
        self.now_ms = 0  # the highest leader time seen in a record
        self.dropped = 0  # in-flight messages retention dropped, ever
        self.slots: dict[tuple[str, str, int], _Slot] = {}

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {Receive.op: (Receive, self._receive), Ack.op: (Ack, self._ack),
                Nack.op: (Nack, self._nack),
                ChangeInvisible.op: (ChangeInvisible, self._change_invisible),
                SendBack.op: (SendBack, self._send_back)}

    @property
    def deadletters(self) -> DeadLetters:
        return self.state.part(DeadLetters)

    # ------------------------------------------------------------------ helpers

    def _range(self, topic: str, queue: int) -> tuple[int, int]:
        """(min, end) of a hosted queue, else the refusal a read would give."""
        try:
            return self.state.queue_range(topic, queue)
        except RequestError as exc:
            raise Refused(exc.code, exc.message) from None

    def _slot(self, cg: str, topic: str, queue: int, lo: int) -> _Slot:
        slot = self.slots.get((cg, topic, queue))
        if slot is None:
            slot = self.slots[(cg, topic, queue)] = _Slot(lo)
        return slot

    def _tick(self, now_ms: int) -> int:
        self.now_ms = max(self.now_ms, now_ms)
        return self.now_ms

    def _bury(self, cg: str, topic: str, queue: int, slot: _Slot, offset: int,
              error: str, now: int) -> None:
        f = slot.inflight.pop(offset)
        entry = self.state.entry_of(topic, queue, offset)  # in flight: >= min, so held
        self.deadletters.bury(cg, topic, queue, entry, f.deliveries, error or f.error, now)

    # ------------------------------------------------------------------ apply

    def _receive(self, rec: Receive, index: int) -> ControlResult:
        lo, end = self._range(rec.topic, rec.queue)
        now = self._tick(rec.now_ms)
        slot = self._slot(rec.cg, rec.topic, rec.queue, lo)
        chosen: list[int] = []
        groups: dict[int, str] = {}  # chosen new (or held) messages' groups
        dead = 0
        for off in sorted(o for o, f in slot.inflight.items() if f.visible_ms <= now):
            if slot.inflight[off].deliveries >= rec.max_deliveries:
                self._bury(rec.cg, rec.topic, rec.queue, slot, off, "", now)
                dead += 1
            elif len(chosen) < rec.max:
                chosen.append(off)
        if not rec.retries_only:
            if rec.upto is None:
                room = min(rec.max - len(chosen),
                           rec.cap - len(slot.inflight) - slot.held_count(), end - slot.next)
                if room > 0:
                    chosen += range(slot.next, slot.next + room)
                    slot.next += room
            else:
                self._choose_new(rec, slot, min(end, rec.upto), chosen, groups)
        visible = now + rec.invisible_ms
        out = []
        for off in chosen:
            f = slot.inflight.get(off)
            if f is None:
                slot.inflight[off] = InFlight(visible, 1, index, "", groups.get(off, ""))
            else:
                slot.inflight[off] = f._replace(visible_ms=visible, deliveries=f.deliveries + 1,
                                                handle=index)
            deliveries = slot.inflight[off].deliveries
            e = self.state.entry_of(rec.topic, rec.queue, off)
            out.append(Delivery(off, deliveries, index, e.index, e.start, e.size, e.tag_hash,
                                e.store_ms))
        return ControlResult(Receive.op, len(out), dead, items=tuple(out))

    def _choose_new(self, rec: Receive, slot: _Slot, stop: int, chosen: list[int],
                    groups: dict[int, str]) -> None:
        """After the redeliveries in `chosen`: the held messages whose group is free again
        (the first of each, in offset order), then new ones from `next` up to `stop`,
        holding those of a group with one in flight (or chosen now) and passing those
        the receiver's filter leaves out. In flight and held stay within the cap."""
        busy = set() if self.fifo_ignore_inflight else slot.busy_groups()
        for head, grp in sorted((offs[0], g) for g, offs in slot.held.items()):
            if len(chosen) >= rec.max:
                break
            if grp in busy:
                continue
            offs = slot.held[grp]
            offs.pop(0)
            if not offs:
                del slot.held[grp]
            chosen.append(head)
            groups[head] = grp
            busy.add(grp)
        facts = dict(rec.groups)
        skip = set(rec.skip)
        used = len(slot.inflight) + slot.held_count() + sum(
            1 for o in chosen if o not in slot.inflight)
        off = slot.next
        while off < stop and len(chosen) < rec.max and used < rec.cap:
            fact = facts.get(off)
            if off in skip:
                pass
            elif fact is not None and fact in busy and not self.fifo_ignore_inflight:
                slot.held.setdefault(fact, []).append(off)
                used += 1
            else:
                chosen.append(off)
                used += 1
                if fact is not None:
                    groups[off] = fact
                    busy.add(fact)
            off += 1
        slot.next = max(slot.next, off)

    def _current(self, cg: str, topic: str, queue: int, offset: int, handle: int) -> bool:
        slot = self.slots.get((cg, topic, queue))
        f = None if slot is None else slot.inflight.get(offset)
        return f is not None and f.handle == handle

    def _ack(self, rec: Ack, index: int) -> ControlResult:
        self._range(rec.topic, rec.queue)
        stale = []
        done = 0
        for off, handle in rec.items:
            if self._current(rec.cg, rec.topic, rec.queue, off, handle) or (
                    self.ack_later_delivery and handle < self.inflight(
                        rec.cg, rec.topic, rec.queue).get(off, InFlight(0, 0, 0)).handle):
                del self.slots[(rec.cg, rec.topic, rec.queue)].inflight[off]
                done += 1
            else:
                stale.append((off, handle))
        return ControlResult(Ack.op, done, len(stale), items=tuple(stale))

    def _nack(self, rec: Nack, index: int) -> ControlResult:
        """`items`: ("stale", offset, handle) for each stale receipt, ("dead", offset) for
        each sent to the dead letters."""
        self._range(rec.topic, rec.queue)
        now = self._tick(rec.now_ms)
        out: list[tuple[Any, ...]] = []
        done = 0
        for off, handle in rec.items:
            if not self._current(rec.cg, rec.topic, rec.queue, off, handle):
                out.append(("stale", off, handle))
                continue
            slot = self.slots[(rec.cg, rec.topic, rec.queue)]
            f = slot.inflight[off]
            done += 1
            if rec.dead or f.deliveries >= rec.max_deliveries:
                self._bury(rec.cg, rec.topic, rec.queue, slot, off, rec.error, now)
                out.append(("dead", off))
                continue
            delay = rec.delay_ms if rec.delay_ms is not None else rec.backoff_ms[
                min(f.deliveries, len(rec.backoff_ms)) - 1]
            slot.inflight[off] = f._replace(visible_ms=now + delay, handle=0,
                                            error=rec.error or f.error)
        return ControlResult(Nack.op, done, len(rec.items) - done, items=tuple(out))

    def _change_invisible(self, rec: ChangeInvisible, index: int) -> ControlResult:
        self._range(rec.topic, rec.queue)
        if not self._current(rec.cg, rec.topic, rec.queue, rec.offset, rec.handle):
            raise Refused(Code.STALE_RECEIPT, f"delivery {rec.handle} of {rec.topic}/"
                          f"{rec.queue} offset {rec.offset} is not current for {rec.cg!r}")
        now = self._tick(rec.now_ms)
        slot = self.slots[(rec.cg, rec.topic, rec.queue)]
        f = slot.inflight[rec.offset]
        visible = now + rec.invisible_ms
        slot.inflight[rec.offset] = f._replace(visible_ms=visible)
        return ControlResult(ChangeInvisible.op, 1, items=(visible,))

    def _send_back(self, rec: SendBack, index: int) -> ControlResult:
        """`items`: ("dead", offset) when it went to the dead letters at once. A message
        already in flight for the group (sent back before) changes nothing (skipped)."""
        lo, end = self._range(rec.topic, rec.queue)
        if rec.offset < lo:
            raise Refused(Code.OFFSET_TOO_SMALL, f"offset {rec.offset} of {rec.topic}/"
                          f"{rec.queue} is below its first retained offset {lo}")
        if rec.offset >= end:
            raise Refused(Code.OFFSET_TOO_LARGE, f"offset {rec.offset} of {rec.topic}/"
                          f"{rec.queue} is beyond its end {end}")
        now = self._tick(rec.now_ms)
        slot = self._slot(rec.cg, rec.topic, rec.queue, lo)
        if rec.offset in slot.inflight:
            return ControlResult(SendBack.op, 0, 1)
        slot.next = max(slot.next, rec.offset + 1)
        slot.inflight[rec.offset] = InFlight(now + rec.backoff_ms[0], 1, 0, rec.error)
        if rec.dead or rec.max_deliveries <= 1:
            self._bury(rec.cg, rec.topic, rec.queue, slot, rec.offset, rec.error, now)
            return ControlResult(SendBack.op, 1, items=(("dead", rec.offset),))
        return ControlResult(SendBack.op, 1)

    # ------------------------------------------------------------------ hooks

    def topic_deleted(self, config: TopicConfig) -> None:
        for key in [k for k in self.slots if k[1] == config.name]:
            del self.slots[key]

    def retained(self, min_index: int) -> int:
        """In-flight messages below their queue's new first offset are gone with it
        (counted in `dropped`); `next` moves up to that offset."""
        for (_cg, topic, queue), slot in self.slots.items():
            lo = self.state.queue_range(topic, queue)[0]
            gone = [o for o in slot.inflight if o < lo]
            for o in gone:
                del slot.inflight[o]
            for grp in list(slot.held):
                kept = [o for o in slot.held[grp] if o >= lo]
                self.dropped += len(slot.held[grp]) - len(kept)
                if kept:
                    slot.held[grp] = kept
                else:
                    del slot.held[grp]
            self.dropped += len(gone)
            slot.next = max(slot.next, lo)
        return 0

    # ------------------------------------------------------------------ queries

    def inflight(self, cg: str, topic: str, queue: int) -> dict[int, InFlight]:
        """The group's messages in flight on a queue (a copy), by offset."""
        slot = self.slots.get((cg, topic, queue))
        return {} if slot is None else dict(sorted(slot.inflight.items()))

    def next_offset(self, cg: str, topic: str, queue: int) -> int:
        """The lowest offset never handed out to `cg` (the queue's first for a new group)."""
        slot = self.slots.get((cg, topic, queue))
        return self.state.queue_range(topic, queue)[0] if slot is None else slot.next

    def low_watermark(self, cg: str, topic: str, queue: int) -> int:
        """The lowest offset `cg` is not done with: everything below was acked (or dead-
        lettered, or retention took it)."""
        slot = self.slots.get((cg, topic, queue))
        if slot is None:
            return self.next_offset(cg, topic, queue)
        return min(min(slot.inflight, default=slot.next),
                   min((offs[0] for offs in slot.held.values()), default=slot.next))

    def available(self, cg: str, topic: str, queue: int, now_ms: int, cap: int,
                  retries_only: bool = False) -> bool:
        """Whether a `Receive` at `now_ms` would change anything: a message in flight is
        visible again (to deliver, or to bury), or a new one is there and the cap has room
        (what a door asks before it writes a receive to the log)."""
        now = max(now_ms, self.now_ms)
        lo, end = self.state.queue_range(topic, queue)
        slot = self.slots.get((cg, topic, queue))
        if slot is None:
            return lo < end and not retries_only
        if retries_only:
            return any(f.visible_ms <= now for f in slot.inflight.values())
        if slot.next < end and len(slot.inflight) + slot.held_count() < cap:
            return True
        if slot.held and not set(slot.held) <= slot.busy_groups():
            return True  # a held message whose group is free again
        return any(f.visible_ms <= now for f in slot.inflight.values())

    def blocked_groups(self, cg: str, topic: str, queue: int) -> set[str]:
        """The message groups whose new messages a receive holds back now: those with a
        message in flight or held (what a door estimates a receive with)."""
        slot = self.slots.get((cg, topic, queue))
        return set() if slot is None else slot.busy_groups() | set(slot.held)

    def room(self, cg: str, topic: str, queue: int, cap: int) -> int:
        """How many more messages the group may have in flight or held under `cap`."""
        slot = self.slots.get((cg, topic, queue))
        return cap if slot is None else max(cap - len(slot.inflight) - slot.held_count(), 0)

    def held(self, cg: str, topic: str, queue: int) -> dict[str, list[int]]:
        """The group's messages held back on a queue behind an earlier message of their
        message group in flight (a copy): message group -> offsets, in order."""
        slot = self.slots.get((cg, topic, queue))
        return {} if slot is None else {g: list(o) for g, o in sorted(slot.held.items())}

    def fifo_summary(self, cg: str | None = None) -> dict[tuple[str, str, int], tuple[int, int]]:
        """Per (consumer group, topic, queue) with message groups in play: how many
        message groups have a message in flight, and how many messages are held behind
        them (what STATUS shows)."""
        out = {}
        for key, slot in sorted(self.slots.items()):
            if cg is not None and key[0] != cg:
                continue
            busy = len(slot.busy_groups())
            if busy or slot.held:
                out[key] = (busy, slot.held_count())
        return out

    def next_visible_ms(self, cg: str, topic: str, queue: int) -> int | None:
        """When the first message in flight becomes visible again (None: none in flight)."""
        slot = self.slots.get((cg, topic, queue))
        if slot is None or not slot.inflight:
            return None
        return min(f.visible_ms for f in slot.inflight.values())

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {"now": self.now_ms, "dropped": self.dropped, "queues": [
            [cg, t, q, slot.next, [[o, *f] for o, f in sorted(slot.inflight.items())],
             [[g, list(offs)] for g, offs in sorted(slot.held.items())]]
            for (cg, t, q), slot in sorted(self.slots.items())]}

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):
            raise ValueError(f"unsupported receipts section version {version!r}")
        self.now_ms = int(section["now"])
        self.dropped = int(section["dropped"])
        for row in section["queues"]:
            cg, t, q, nxt, inflight = row[:5]
            held = row[5] if version >= 2 else []
            if not (isinstance(cg, str) and isinstance(t, str) and is_int(q) and is_int(nxt)):
                raise ValueError(f"bad receipts queue {[cg, t, q, nxt]!r}")
            slot = self.slots[(cg, t, q)] = _Slot(nxt)
            for o, visible, deliveries, handle, error, *group in inflight:
                grp = group[0] if group else ""
                if not (is_int(o) and is_int(visible) and is_int(deliveries) and is_int(handle)
                        and isinstance(error, str) and isinstance(grp, str)
                        and deliveries > 0 and o < nxt):
                    raise ValueError(f"bad in-flight message {o!r} of {cg!r} {t}/{q}")
                slot.inflight[o] = InFlight(visible, deliveries, handle, error, grp)
            for grp, offs in held:
                if not (isinstance(grp, str) and grp and offs
                        and all(is_int(o) and o < nxt for o in offs)):
                    raise ValueError(f"bad held messages {grp!r} of {cg!r} {t}/{q}")
                slot.held[grp] = list(offs)

    def check(self) -> None:
        for (cg, t, q), slot in self.slots.items():
            if not self.state.hosts(t, q):
                raise ValueError(f"receipts of {cg!r} on {t}/{q}, not hosted here")
            lo, end = self.state.queue_range(t, q)
            held = [o for offs in slot.held.values() for o in offs]
            if (not lo <= slot.next <= end or any(o < lo for o in slot.inflight)
                    or any(o < lo for o in held)):
                raise ValueError(f"receipts of {cg!r} on {t}/{q} outside {lo}..{end}")
