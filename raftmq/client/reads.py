"""The read path every consumer shares: FETCH with its answer decoded, queue bounds, and
committed offsets (queried and committed through the Raft log).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from raftmq.filter import FilterError
from raftmq.filter import compile as compile_filter
from wire.protocol import Code, Op, RequestError
from wire.records import Message, decode_record, iter_records, message_id, tag_problem
from wire.requests import (
    CommitOffsetRequest,
    FetchRequest,
    OffsetForTimeAnswer,
    OffsetForTimeRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
)

from .errors import UnavailableError
from .routes import Routes, clock

log = logging.getLogger("raftmq.client.consumer")

LONG_POLL_MS = 15_000  # RocketMQ's broker-side hold for a pull at the end of a queue
FETCH_GRACE = 5.0  # seconds a fetch may take beyond its hold before it counts as lost
PULL_BATCH = 32
PENDING_OFFSETS_WAIT = 60.0  # seconds a committed-offset query waits for a transaction
FETCH_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PullResult:
    """Messages of one FETCH, and where to continue (`next_offset` skips filtered ones)."""

    messages: list[Message]
    next_offset: int
    min_offset: int
    end_offset: int


# ---------------------------------------------------------------- pure parts


Tags = str | Sequence[str] | None
"""A tag subscription: None or "*" (every message), "TagA", "TagA || TagB" (RocketMQ's
subscription expression) or a list of tags."""


def parse_tags(tags: Tags) -> list[str] | None:
    """The tags a subscription selects, None for all; a clear `ValueError` for anything
    that is not a subscription (a bare string is one expression, never its characters)."""
    if tags is None:
        return None
    if isinstance(tags, str):
        expr = tags.strip()
        if expr in ("", "*"):
            return None
        items = [t.strip() for t in expr.split("||")]
    elif isinstance(tags, Sequence) and not isinstance(tags, (bytes, bytearray)):
        items = list(tags)
        if any(not isinstance(t, str) for t in items):
            raise ValueError(f"tags must be strings, got {tags!r}")
        items = [t.strip() for t in items]
        if items == ["*"]:
            return None
    else:
        raise ValueError(f"tags are a string like 'TagA || TagB' or a list of strings, "
                         f"not {type(tags).__name__}")
    if not items:
        raise ValueError("an empty list of tags selects nothing: pass None or '*' for all")
    for t in items:
        problem = tag_problem(t)
        if problem is not None:
            raise ValueError(f"bad tag subscription {tags!r}: use '*', 'TagA', "
                             f"'TagA || TagB' or a list of tags ({problem})")
    return sorted(set(items))


@dataclass(frozen=True, slots=True, init=False)
class MessageSelector:
    """What a consumer reads of a topic (RocketMQ's `MessageSelector`): messages with one
    of `tags` (None: any tag, or none) that the SQL92 filter `sql` matches (None: every
    one); both must match when both are given. `MessageSelector.by_sql("a > 5")` is
    RocketMQ's `bySql`, `MessageSelector.by_tag("TagA || TagB")` its `byTag`.

    The filter is compiled here, strictly (`raftmq.filter.compile(..., strict=True)`): an
    expression RocketMQ refuses, or one with text after it, raises `FilterError` naming
    the line and column before anything is sent. The node decides it over each message's
    properties, plus `TAGS` (its tag) and `KEYS` (its key) unless the producer set a
    property of that name itself; what it leaves out is skipped, never delivered."""

    tags: tuple[str, ...] | None
    sql: str | None

    def __init__(self, tags: Tags = None, sql: str | None = None) -> None:
        parsed = parse_tags(tags)
        if sql is not None:
            compile_filter(sql, strict=True)  # FilterError, with the position
        object.__setattr__(self, "tags", tuple(parsed) if parsed is not None else None)
        object.__setattr__(self, "sql", sql)

    @classmethod
    def by_sql(cls, expression: str, *, tags: Tags = None) -> MessageSelector:
        """The messages SQL92 filter `expression` matches (of `tags`, when given)."""
        if not isinstance(expression, str):
            raise FilterError(f"a filter is a string, not {type(expression).__name__}",
                              0, 1, 1)
        return cls(tags, expression)

    @classmethod
    def by_tag(cls, tags: Tags) -> MessageSelector:
        """The messages of `tags` ("*", "TagA", "TagA || TagB" or a list)."""
        return cls(tags)

    @property
    def tag_list(self) -> list[str] | None:
        """The tags as a sorted list, None for any (what FETCH's `tags` carries)."""
        return list(self.tags) if self.tags is not None else None


Selector = Tags | MessageSelector
"""What a consumer may subscribe a topic with: a tag subscription (see `Tags`) or a
`MessageSelector` (tags and/or a SQL92 filter)."""


def selector_of(selector: Selector) -> MessageSelector:
    """`selector` as a `MessageSelector` (ValueError for bad tags, FilterError for a bad
    filter)."""
    if isinstance(selector, MessageSelector):
        return selector
    return MessageSelector(selector)


def decode_fetch(
    topic: str, queue: int, group: str, header: Mapping[str, Any], body: bytes
) -> list[Message]:
    """Messages of a FETCH answer: `msgs` rows [offset, index, start, store_ms] describe
    the records concatenated in the body, in the same order."""
    rows = header.get("msgs") or []
    spans = list(iter_records(body))
    if len(spans) != len(rows):
        raise RequestError(
            Code.MALFORMED, f"FETCH answer lists {len(rows)} messages but carries {len(spans)}"
        )
    out: list[Message] = []
    for (offset, index, start, store_ms), (pos, _size) in zip(rows, spans, strict=True):
        msg, _ = decode_record(
            body, pos, topic=topic, queue=queue, offset=int(offset), store_ms=int(store_ms),
            msg_id=message_id(group, int(index), int(start)),
        )
        out.append(msg)
    return out


# ---------------------------------------------------------------- requests


async def fetch_answer(
    routes: Routes,
    topic: str,
    queue: int,
    offset: int,
    *,
    max_messages: int = PULL_BATCH,
    max_bytes: int = FETCH_MAX_BYTES,
    wait_ms: int = LONG_POLL_MS,
    tags: Sequence[str] | None = None,
    sql: str | None = None,
    attempts: int = 3,
) -> tuple[str, Mapping[str, Any], bytes]:
    """`fetch` without decoding: (the hosting group, the answer header, the records), for
    readers that decode records in bulk (`decode_fetch` says what the answer holds).
    Tags select by hash on the broker; the exact match is the caller's. A SQL92 filter
    `sql` is decided on the broker, which sends only the messages it matches."""
    header = FetchRequest(topic=topic, queue=queue, offset=offset, max=max_messages,
                          max_bytes=max_bytes, wait_ms=int(wait_ms),
                          tags=tuple(tags or ()), sql=sql).header()
    # the group the route names goes along: only its (ready) leader answers, so a
    # replica whose state lags never calls the topic unknown
    group, frame = await routes.call_queue(
        topic, queue, Op.FETCH, lambda g: {**header, "g": g},
        timeout=wait_ms / 1000 + FETCH_GRACE, attempts=attempts,
    )
    h = frame.header
    return str(h.get("g") or group), h, frame.body


async def fetch(
    routes: Routes,
    topic: str,
    queue: int,
    offset: int,
    *,
    max_messages: int = PULL_BATCH,
    max_bytes: int = FETCH_MAX_BYTES,
    wait_ms: int = LONG_POLL_MS,
    tags: Sequence[str] | None = None,
    sql: str | None = None,
    attempts: int = 3,
) -> PullResult:
    """One FETCH from the queue's leader (retrying retriable errors).

    OFFSET_TOO_SMALL / OFFSET_TOO_LARGE are raised to the caller with `min` and `end`
    in `RequestError.extra`.
    """
    group, h, body = await fetch_answer(routes, topic, queue, offset, max_messages=max_messages,
                                        max_bytes=max_bytes, wait_ms=wait_ms, tags=tags,
                                        sql=sql, attempts=attempts)
    msgs = decode_fetch(topic, queue, group, h, body)
    if tags:
        wanted = set(tags)
        msgs = [m for m in msgs if m.tags in wanted]
    nxt = int(h.get("next", msgs[-1].offset + 1 if msgs else offset))
    return PullResult(msgs, nxt, int(h.get("min", 0)), int(h.get("end", nxt)))


async def queue_bounds(routes: Routes, topic: str, queue: int) -> tuple[int, int]:
    """(min, end) of a queue: the earliest retained offset and one past the last.

    Asked with a FETCH of one message at offset 0 that does not wait; both an answer and
    an OFFSET_TOO_SMALL error carry the bounds.
    """
    try:
        res = await fetch(routes, topic, queue, 0, max_messages=1, max_bytes=1, wait_ms=0)
    except RequestError as exc:
        if exc.code in (Code.OFFSET_TOO_SMALL, Code.OFFSET_TOO_LARGE) and "min" in exc.extra:
            return int(exc.extra["min"]), int(exc.extra.get("end", exc.extra["min"]))
        raise
    return res.min_offset, res.end_offset


async def offset_for_time(routes: Routes, topic: str, queue: int, ms: int) -> int:
    """The first offset of a queue stored at or after `ms` (epoch milliseconds), the end
    offset when none was, the earliest retained one when all were (OFFSET_FOR_TIME, one
    request to the queue's leader). MALFORMED for a negative `ms`, before anything is
    sent."""
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise RequestError(Code.MALFORMED, f"ms must be epoch milliseconds >= 0, got {ms!r}")
    header = OffsetForTimeRequest(topic=topic, queue=queue, ms=ms).header()
    _group, frame = await routes.call_queue(topic, queue, Op.OFFSET_FOR_TIME,
                                            lambda g: {**header, "g": g})
    return OffsetForTimeAnswer.decode(frame.header).offset


async def query_offset(routes: Routes, group: str, topic: str, queue: int) -> int:
    """The committed offset of a consumer group on a queue, -1 when it has none.

    While a transaction that sends offsets of that queue is undecided (TX_PENDING), its
    outcome decides the answer: asked again until it is, for up to `PENDING_OFFSETS_WAIT`
    seconds (a consume-transform-produce loop restarting after a crash so resumes where
    the last committed transaction left it, never before)."""
    deadline = anyio.current_time() + PENDING_OFFSETS_WAIT
    while True:
        try:
            _, frame = await routes.call_queue(
                topic, queue, Op.QUERY_OFFSET,
                lambda g: QueryOffsetRequest(cg=group, topic=topic, queue=queue, g=g).header(),
            )
            return QueryOffsetAnswer.decode(frame.header).offset
        except RequestError as exc:
            if exc.code != Code.TX_PENDING or anyio.current_time() > deadline:
                raise
        await anyio.sleep(0.1)


async def commit_offsets(
    routes: Routes, group: str, offsets: Mapping[tuple[str, int], int], *,
    timeout: float | None = None, client: str | None = None,
) -> None:
    """Commit offsets through the Raft log: one COMMIT_OFFSET per hosting group, sent
    concurrently, each safe to retry (it carries a request id the broker deduplicates).
    Raises the first failure after all were tried. `timeout` bounds the whole call:
    reaching it fails the groups not answered yet (`UnavailableError` when nothing of
    theirs was sent, else `OutcomeUnknownError`). `client`: the committing consumer's id,
    which the queue locks fence (a queue another client holds refuses it, LOCK_LOST)."""
    deadline = None if timeout is None else clock() + timeout
    by_group: dict[str, list[list[Any]]] = {}
    with anyio.move_on_after(math.inf if timeout is None else timeout) as lookup:
        for (topic, queue), offset in sorted(offsets.items()):
            g = await routes.group_of(topic, queue)
            by_group.setdefault(g, []).append([topic, queue, int(offset)])
    if lookup.cancelled_caught:
        assert timeout is not None
        raise UnavailableError(f"COMMIT_OFFSET for {group}: no route within {timeout:.3g} s; "
                               "nothing was committed")
    errors: list[RequestError] = []

    async def one(g: str, rows: list[list[Any]]) -> None:
        # one id for all attempts: a retry whose first copy was committed after all (by a
        # new leader) must not roll back a commit made in between
        header = CommitOffsetRequest(
            cg=group, offsets=tuple((t, q, o) for t, q, o in rows),
            req=routes.request_id(), client=client).header()
        try:
            await routes.call_group(g, Op.COMMIT_OFFSET, header, write=True, deadline=deadline)
        except RequestError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for g, rows in by_group.items():
            tg.start_soon(one, g, rows)
    if errors:
        raise errors[0]


def out_of_range_offset(exc: RequestError, topic: str, queue: int, offset: int) -> int | None:
    """Where to continue after an out-of-range fetch, or None for other errors."""
    if exc.code == Code.OFFSET_TOO_SMALL and "min" in exc.extra:
        lo = int(exc.extra["min"])
        log.warning(
            "%s:%d offset %d is below the earliest retained offset %d; skipping ahead",
            topic, queue, offset, lo,
        )
        return lo
    if exc.code == Code.OFFSET_TOO_LARGE and "end" in exc.extra:
        end = int(exc.extra["end"])
        log.warning("%s:%d offset %d is beyond the end %d; moving back", topic, queue, offset, end)
        return end
    return None


# ---------------------------------------------------------------- push consumer
