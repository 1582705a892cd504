"""The HTTP API (`/api/v1`): JSON over HTTP for producing, consuming and administering.

Each endpoint calls the SDK acting as the request's user (`raftmq.web.auth`), so it
gives the SDK's guarantees: a 200 on produce means the message is committed on a
majority of its group (the producer's `send` returned), a 200 on a commit or an ack
means it is in the Raft log. Bodies are JSON; a message body travels as base64 (`body`)
or UTF-8 text (`text`), or as the raw request body with
`Content-Type: application/octet-stream` and `X-Raftmq-*` headers for its key, tags,
properties and delay. Failures follow `raftmq.web.errors`. The OpenAPI description is
derived from the declarations here (`ENDPOINTS`) and served at `/api/v1/openapi.json`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from raftmq.client import Admin
from raftmq.client.admin import DeadLetter, GroupQueue
from raftmq.client.producer import SendResult
from raftmq.client.reads import fetch, out_of_range_offset, selector_of
from raftmq.client.simple import Receipt, ReceivedMessage
from raftmq.commands.status import gather_status
from wire.protocol import Code, RequestError, validate_group_name, validate_topic_name
from wire.records import Message, OutgoingMessage

from .auth import WebClients
from .endpoints import Endpoint, Query, RawBody, openapi, route
from .schema import BadInput, Base64, decode_base64
from .settings import WebSettings

__all__ = ["API_PREFIX", "ENDPOINTS", "api_routes", "openapi_document"]

API_PREFIX = "/api/v1"
MAX_BATCH = 1024  # messages in one batch request
MAX_FETCH = 1024
MAX_WAIT_MS = 30_000  # the longest long poll a request may ask for

# ------------------------------------------------------------------ bodies


@dataclass
class MessageIn:
    """A message to send: `body` (base64) or `text` (UTF-8), exactly one."""

    body: Base64 | None = None
    text: str | None = None
    key: str = ""
    tags: str = ""
    properties: dict[str, str] = field(default_factory=dict)


@dataclass
class ProduceIn(MessageIn):
    """One message; `delay_ms` or `deliver_at_ms` (epoch ms) delay it; `queue` pins it."""

    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    queue: int | None = None


@dataclass
class BatchIn:
    """Messages sent together (one request per queue they go to, each atomic)."""

    messages: list[MessageIn]
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    queue: int | None = None


@dataclass
class SendOut:
    """Where a message was committed (`offset` -1 for a delayed one, until due)."""

    msg_id: str | None
    topic: str
    queue: int
    offset: int
    group: str


@dataclass
class BatchOut:
    results: list[SendOut]


@dataclass
class MessageOut:
    topic: str
    queue: int
    offset: int
    body: Base64
    key: str
    tags: str
    properties: dict[str, str]
    born_ms: int
    store_ms: int
    msg_id: str


@dataclass
class FetchOut:
    """Messages read, and where to continue (`next_offset`)."""

    messages: list[MessageOut]
    next_offset: int
    min_offset: int
    end_offset: int


@dataclass
class OffsetIn:
    topic: str
    queue: int
    offset: int


@dataclass
class CommitIn:
    """Offsets to commit: each the next offset the group will consume."""

    offsets: list[OffsetIn]


@dataclass
class CountOut:
    count: int


@dataclass
class ReceiveIn:
    topic: str
    max: int = 32
    invisible_ms: int | None = None
    wait_ms: int | None = None


@dataclass
class ReceivedOut:
    """A received message; `receipt` is what ack, nack and change-invisible take."""

    message: MessageOut
    deliveries: int
    receipt: str


@dataclass
class ReceiveOut:
    messages: list[ReceivedOut]


@dataclass
class AckIn:
    receipt: str


@dataclass
class NackIn:
    receipt: str
    delay_ms: int | None = None
    error: str = ""


@dataclass
class InvisibleIn:
    receipt: str
    invisible_ms: int


@dataclass
class DoneOut:
    ok: bool


@dataclass
class TopicSummary:
    name: str
    queues: int
    hosted: dict[str, list[int]]


@dataclass
class TopicsOut:
    topics: list[TopicSummary]


@dataclass
class TopicIn:
    name: str
    queues: int = 4
    exist_ok: bool = False


@dataclass
class QueueOut:
    queue: int
    group: str | None
    leader: str | None
    min_offset: int | None
    end_offset: int | None


@dataclass
class TopicOut:
    topic: str
    total: int
    queues: list[QueueOut]
    replicas: dict[str, list[str]]


@dataclass
class GrowIn:
    """The topic's new total number of queues."""

    queues: int


@dataclass
class PlacedOut:
    """New queues by broker group."""

    placed: dict[str, list[int]]


@dataclass
class GroupOffsetsOut:
    group: str
    offsets: list[OffsetIn]


@dataclass
class GroupsOut:
    groups: list[GroupOffsetsOut]


@dataclass
class GroupQueueOut:
    topic: str
    queue: int
    committed: int
    min_offset: int | None
    end_offset: int | None
    lag: int | None


@dataclass
class GroupOut:
    group: str
    members: list[str]
    queues: list[GroupQueueOut]


@dataclass
class ResetIn:
    """`to`: "earliest", "latest", an offset, or "@<epoch ms>"."""

    topic: str
    to: str
    dry_run: bool = False


@dataclass
class ResetRow:
    queue: int
    old: int
    new: int


@dataclass
class ResetOut:
    changes: list[ResetRow]


@dataclass
class TxListOut:
    """The lists `raftmq tx list` shows: halves, prepared, txns, decided, done."""

    lists: dict[str, list[dict[str, Any]]]
    truncated: bool


@dataclass
class TxEndOut:
    """`already`: the half message had been decided this way before."""

    already: bool


@dataclass
class StatusOut:
    """What `raftmq status --json` prints: ok, nodes, groups."""

    status: dict[str, Any]


@dataclass
class DeadLetterOut:
    id: str
    group: str
    consumer_group: str
    topic: str
    queue: int
    offset: int
    msg_id: str
    store_ms: int
    deliveries: int
    error: str
    dead_ms: int


@dataclass
class DlqOut:
    dead_letters: list[DeadLetterOut]


@dataclass
class ResendIn:
    """Dead-letter ids to resend (as listed), or `all`."""

    ids: list[str] = field(default_factory=list)
    all: bool = False


# ------------------------------------------------------------------ conversions


def _message_out(m: Message) -> MessageOut:
    return MessageOut(m.topic, m.queue, m.offset, Base64(base64.b64encode(m.body).decode()),
                      m.key, m.tags, dict(m.properties), m.born_ms, m.store_ms, m.msg_id)


def _send_out(r: SendResult) -> SendOut:
    return SendOut(r.msg_id, r.topic, r.queue, r.offset, r.group)


def _outgoing(m: MessageIn, where: str) -> OutgoingMessage:
    if (m.body is None) == (m.text is None):
        raise BadInput(f"{where}: give exactly one of body (base64) and text")
    data = decode_base64(m.body, f"{where}.body") if m.body is not None else \
        str(m.text).encode()
    return OutgoingMessage(data, m.key, m.tags, dict(m.properties))


def _delay(delay_ms: int | None, deliver_at_ms: int | None) -> dict[str, Any]:
    if delay_ms is not None and deliver_at_ms is not None:
        raise BadInput("give delay_ms or deliver_at_ms, not both")
    if delay_ms is not None:
        if delay_ms < 0:
            raise BadInput("delay_ms must not be negative")
        return {"delay": delay_ms / 1000}
    if deliver_at_ms is not None:
        return {"deliver_at": deliver_at_ms / 1000}
    return {}


def _raw_message(raw: RawBody) -> tuple[OutgoingMessage, dict[str, Any]]:
    h = raw.headers
    props: dict[str, str] = {}
    if "x-raftmq-properties" in h:
        try:
            parsed = json.loads(h["x-raftmq-properties"])
        except ValueError:
            raise BadInput("X-Raftmq-Properties: not a JSON object") from None
        if not isinstance(parsed, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()):
            raise BadInput("X-Raftmq-Properties: a JSON object of strings")
        props = parsed
    extra: dict[str, Any] = {}
    for name, arg in (("x-raftmq-delay-ms", "delay_ms"), ("x-raftmq-queue", "queue")):
        if name in h:
            try:
                extra[arg] = int(h[name])
            except ValueError:
                raise BadInput(f"{name}: expected an integer") from None
    return OutgoingMessage(raw.data, h.get("x-raftmq-key", ""), h.get("x-raftmq-tags", ""),
                           props), extra


_RECEIPT_FIELDS = 6


def _receipt_token(r: Receipt) -> str:
    raw = json.dumps([r.group, r.consumer_group, r.topic, r.queue, r.offset, r.handle],
                     separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _receipt_of(token: str, consumer_group: str) -> Receipt:
    """A receipt token back; refused (400) unless it is one this API gave out for
    `consumer_group`."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        g, cg, topic, queue, offset, handle = json.loads(raw)
        ok = all(isinstance(v, str) for v in (g, cg, topic)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in (queue, offset, handle))
    except (binascii.Error, ValueError, TypeError):
        ok = False
    if not ok:
        raise BadInput("receipt: not a receipt this API gave out")
    if cg != consumer_group:
        raise BadInput(f"receipt: it is of consumer group {cg!r}, not {consumer_group!r}")
    return Receipt(g, cg, topic, queue, offset, handle)


def _topic(topic: str) -> str:
    return validate_topic_name(topic)


def _group(group: str) -> str:
    return validate_group_name(group)


def _int(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"{what}: expected an integer, got {value!r}") from None


# ------------------------------------------------------------------ handlers


async def produce(request: Request, c: WebClients, *, body: ProduceIn | RawBody,
                  topic: str) -> SendOut:
    _topic(topic)
    if isinstance(body, RawBody):
        msg, extra = _raw_message(body)
        delay = _delay(extra.get("delay_ms"), None)
        queue = extra.get("queue")
    else:
        msg = _outgoing(body, "body")
        delay = _delay(body.delay_ms, body.deliver_at_ms)
        queue = body.queue
    return _send_out(await c.producer.send(topic, msg, queue=queue, **delay))


async def produce_batch(request: Request, c: WebClients, *, body: BatchIn,
                        topic: str) -> BatchOut:
    _topic(topic)
    if not 1 <= len(body.messages) <= MAX_BATCH:
        raise BadInput(f"messages: 1..{MAX_BATCH} of them")
    msgs = [_outgoing(m, f"body.messages[{i}]") for i, m in enumerate(body.messages)]
    results = await c.producer.send_batch(topic, msgs, queue=body.queue,
                                          **_delay(body.delay_ms, body.deliver_at_ms))
    return BatchOut([_send_out(r) for r in results])


async def fetch_messages(request: Request, c: WebClients, *, body: None, topic: str,
                         queue: str, offset: int | None, max: int | None,
                         wait_ms: int | None, group: str | None, tags: str | None) -> FetchOut:
    _topic(topic)
    q = _int(queue, "queue")
    if offset is None:
        offset = 0
        if group is not None:
            committed = await c.admin.committed_offset(_group(group), topic, q)
            offset = max_(committed, 0)
    selector = selector_of(tags)
    for _ in range(3):
        try:
            res = await fetch(c.admin.routes, topic, q, offset, max_messages=max or 32,
                              wait_ms=wait_ms or 0, tags=selector.tag_list, sql=selector.sql)
            return FetchOut([_message_out(m) for m in res.messages], res.next_offset,
                            res.min_offset, res.end_offset)
        except RequestError as exc:
            jump = out_of_range_offset(exc, topic, q, offset)
            if jump is None:
                raise
            offset = jump
    raise RequestError(Code.BUSY, f"{topic}/{q}: the offset kept moving out of range")


def max_(a: int, b: int) -> int:
    return a if a > b else b


async def commit_offsets(request: Request, c: WebClients, *, body: CommitIn,
                         group: str) -> CountOut:
    from raftmq.client.reads import commit_offsets as commit

    _group(group)
    if not body.offsets:
        raise BadInput("offsets: at least one")
    offsets: dict[tuple[str, int], int] = {}
    for i, o in enumerate(body.offsets):
        _topic(o.topic)
        if o.queue < 0 or o.offset < 0:
            raise BadInput(f"body.offsets[{i}]: queue and offset are >= 0")
        offsets[(o.topic, o.queue)] = o.offset
    await commit(c.admin.routes, group, offsets, timeout=c.admin.call_timeout)
    return CountOut(len(offsets))


async def receive(request: Request, c: WebClients, *, body: ReceiveIn,
                  group: str) -> ReceiveOut:
    _group(group)
    _topic(body.topic)
    if body.wait_ms is not None and not 0 <= body.wait_ms <= MAX_WAIT_MS:
        raise BadInput(f"wait_ms: 0..{MAX_WAIT_MS}")
    consumer = await c.simple_consumer(group)
    got: list[ReceivedMessage] = await consumer.receive(
        body.topic, body.max,
        invisible=None if body.invisible_ms is None else body.invisible_ms / 1000,
        wait=None if body.wait_ms is None else body.wait_ms / 1000)
    return ReceiveOut([ReceivedOut(_message_out(m), m.deliveries, _receipt_token(m.receipt))
                       for m in got])


async def ack(request: Request, c: WebClients, *, body: AckIn, group: str) -> DoneOut:
    receipt = _receipt_of(body.receipt, _group(group))
    await (await c.simple_consumer(group)).ack(receipt)
    return DoneOut(True)


async def nack(request: Request, c: WebClients, *, body: NackIn, group: str) -> DoneOut:
    receipt = _receipt_of(body.receipt, _group(group))
    delay = None if body.delay_ms is None else body.delay_ms / 1000
    await (await c.simple_consumer(group)).nack(receipt, delay=delay, error=body.error)
    return DoneOut(True)


async def change_invisible(request: Request, c: WebClients, *, body: InvisibleIn,
                           group: str) -> DoneOut:
    receipt = _receipt_of(body.receipt, _group(group))
    await (await c.simple_consumer(group)).change_invisible(receipt, body.invisible_ms / 1000)
    return DoneOut(True)


async def list_topics(request: Request, c: WebClients, *, body: None) -> TopicsOut:
    topics = await c.admin.list_topics()
    return TopicsOut([TopicSummary(name, int(info.get("queues", 0)),
                                   {str(g): [int(q) for q in qs]
                                    for g, qs in (info.get("hosted") or {}).items()})
                      for name, info in topics.items()])


async def describe_topic(request: Request, c: WebClients, *, body: None,
                         topic: str) -> TopicOut:
    info = await c.admin.describe_topic(_topic(topic))
    return TopicOut(info.topic, info.total,
                    [QueueOut(q.queue, q.group, q.leader, q.min_offset, q.end_offset)
                     for q in info.queues], {k: list(v) for k, v in info.replicas.items()})


async def create_topic(request: Request, c: WebClients, *, body: TopicIn) -> TopicOut:
    _topic(body.name)
    if not 1 <= body.queues <= 1024:
        raise BadInput("queues: 1..1024")
    await c.admin.create_topic(body.name, body.queues, exist_ok=body.exist_ok)
    return await describe_topic(request, c, body=None, topic=body.name)


async def delete_topic(request: Request, c: WebClients, *, body: None,
                       topic: str) -> PlacedOut:
    groups = await c.admin.delete_topic(_topic(topic))
    return PlacedOut({g: [] for g in groups})


async def grow_topic(request: Request, c: WebClients, *, body: GrowIn,
                     topic: str) -> PlacedOut:
    placed = await c.admin.add_queues(_topic(topic), body.queues)
    return PlacedOut({g: list(qs) for g, qs in placed.items()})


async def list_groups(request: Request, c: WebClients, *, body: None) -> GroupsOut:
    offsets = await c.admin.group_offsets()
    return GroupsOut([GroupOffsetsOut(cg, [OffsetIn(t, q, o) for (t, q), o in sorted(rows.items())])
                      for cg, rows in sorted(offsets.items())])


async def describe_group(request: Request, c: WebClients, *, body: None,
                         group: str) -> GroupOut:
    members, rows = await c.admin.describe_group(_group(group))
    return GroupOut(group, list(members), [_group_queue(r) for r in rows])


def _group_queue(r: GroupQueue) -> GroupQueueOut:
    return GroupQueueOut(r.topic, r.queue, r.committed, r.min_offset, r.end_offset, r.lag)


async def reset_offsets(request: Request, c: WebClients, *, body: ResetIn,
                        group: str) -> ResetOut:
    _group(group)
    _topic(body.topic)
    to: str | int = int(body.to) if body.to.isdigit() else body.to
    if isinstance(to, str) and to not in ("earliest", "latest") and not (
            to.startswith("@") and to[1:].isdigit()):
        raise BadInput('to: "earliest", "latest", an offset or "@<epoch ms>"')
    plan = await c.admin.reset_offsets(group, body.topic, to, dry_run=body.dry_run)
    return ResetOut([ResetRow(q, old, new) for q, (old, new) in sorted(plan.items())])


async def delete_group(request: Request, c: WebClients, *, body: None,
                       group: str) -> CountOut:
    return CountOut(await c.admin.delete_group(_group(group)))


async def list_transactions(request: Request, c: WebClients, *, body: None,
                            id: str | None, group: str | None) -> TxListOut:
    listing = await c.admin.tx_list(id, group=group)
    return TxListOut({k: list(v) for k, v in listing.items()}, listing.truncated)


async def commit_half(request: Request, c: WebClients, *, body: None, txid: str) -> TxEndOut:
    return TxEndOut(await c.admin.tx_commit(txid))


async def rollback_half(request: Request, c: WebClients, *, body: None,
                        txid: str) -> TxEndOut:
    return TxEndOut(await c.admin.tx_rollback(txid))


async def cluster_status(request: Request, c: WebClients, *, body: None) -> StatusOut:
    admin: Admin = c.admin
    status = await gather_status(admin)
    return StatusOut(json.loads(json.dumps(status, default=str)))


def _dead(d: DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(d.id, d.group, d.consumer_group, d.topic, d.queue, d.offset,
                         d.msg_id, d.store_ms, d.deliveries, d.error, d.dead_ms)


async def dlq_list(request: Request, c: WebClients, *, body: None, group: str,
                   limit: int | None) -> DlqOut:
    return DlqOut([_dead(d) for d in await c.admin.dlq_list(_group(group),
                                                            limit=limit or 1000)])


async def dlq_resend(request: Request, c: WebClients, *, body: ResendIn,
                     group: str) -> CountOut:
    if body.all == bool(body.ids):
        raise BadInput("give ids, or all: true")
    return CountOut(await c.admin.dlq_resend(_group(group), "all" if body.all else body.ids))


# ------------------------------------------------------------------ the table

_RAW = (("X-Raftmq-Key", "the message key"), ("X-Raftmq-Tags", "the message tag"),
        ("X-Raftmq-Properties", "a JSON object of string properties"),
        ("X-Raftmq-Delay-Ms", "deliver after this many milliseconds"),
        ("X-Raftmq-Queue", "send to this queue"))

ENDPOINTS: list[Endpoint] = [
    Endpoint("POST", "/topics/{topic}/messages", "produce",
             "Send one message; 200 once committed on a majority", produce, SendOut,
             ProduceIn, writes=True, raw_headers=_RAW, tag="messages",
             statuses=(400, 401, 403, 404, 413, 503, 504)),
    Endpoint("POST", "/topics/{topic}/messages/batch", "produce_batch",
             "Send messages together; 200 once all are committed", produce_batch, BatchOut,
             BatchIn, writes=True, tag="messages", statuses=(400, 401, 403, 404, 413, 503, 504)),
    Endpoint("GET", "/topics/{topic}/queues/{queue}/messages", "fetch",
             "Read a queue from an offset, waiting up to wait_ms for messages (long poll)",
             fetch_messages, FetchOut, query=(
                 Query("offset", "int", "first offset (default: the group's committed "
                       "offset, else the first retained)", 0),
                 Query("max", "int", "at most this many messages", 1, MAX_FETCH),
                 Query("wait_ms", "int", "long poll: wait this long for a message",
                       0, MAX_WAIT_MS),
                 Query("group", "str", "consumer group whose committed offset to start at"),
                 Query("tags", "str", "tag filter, 'TagA || TagB'")), tag="messages",
             statuses=(400, 401, 403, 404, 416, 503)),
    Endpoint("POST", "/groups/{group}/offsets", "commit_offsets",
             "Commit a consumer group's offsets (the next offset to consume)",
             commit_offsets, CountOut, CommitIn, writes=True, tag="groups"),
    Endpoint("POST", "/simple/{group}/receive", "receive",
             "Simple consumer: receive messages, invisible to the group until settled",
             receive, ReceiveOut, ReceiveIn, writes=True, tag="simple"),
    Endpoint("POST", "/simple/{group}/ack", "ack", "Simple consumer: done with a message",
             ack, DoneOut, AckIn, writes=True, tag="simple",
             statuses=(400, 401, 403, 404, 409, 503, 504)),
    Endpoint("POST", "/simple/{group}/nack", "nack",
             "Simple consumer: failed, deliver it again later", nack, DoneOut, NackIn,
             writes=True, tag="simple", statuses=(400, 401, 403, 404, 409, 503)),
    Endpoint("POST", "/simple/{group}/change-invisible", "change_invisible",
             "Simple consumer: keep a message invisible longer", change_invisible, DoneOut,
             InvisibleIn, writes=True, tag="simple", statuses=(400, 401, 403, 404, 409, 503)),
    Endpoint("GET", "/topics", "list_topics", "Every topic and where its queues are",
             list_topics, TopicsOut, tag="topics"),
    Endpoint("POST", "/topics", "create_topic", "Create a topic", create_topic, TopicOut,
             TopicIn, writes=True, tag="topics", statuses=(400, 401, 403, 409, 503, 504)),
    Endpoint("GET", "/topics/{topic}", "describe_topic",
             "A topic's queues: group, leader, offsets", describe_topic, TopicOut,
             tag="topics"),
    Endpoint("DELETE", "/topics/{topic}", "delete_topic", "Delete a topic", delete_topic,
             PlacedOut, writes=True, tag="topics"),
    Endpoint("POST", "/topics/{topic}/queues", "grow_topic",
             "Grow a topic to a new total of queues", grow_topic, PlacedOut, GrowIn,
             writes=True, tag="topics"),
    Endpoint("GET", "/groups", "list_groups", "Every consumer group's committed offsets",
             list_groups, GroupsOut, tag="groups"),
    Endpoint("GET", "/groups/{group}", "describe_group",
             "A consumer group's members, offsets and lag", describe_group, GroupOut,
             tag="groups"),
    Endpoint("POST", "/groups/{group}/reset-offsets", "reset_offsets",
             "Move a group's offsets on a topic (only while it has no live members)",
             reset_offsets, ResetOut, ResetIn, writes=True, tag="groups",
             statuses=(400, 401, 403, 404, 409, 503)),
    Endpoint("DELETE", "/groups/{group}", "delete_group",
             "Forget a consumer group's offsets", delete_group, CountOut, writes=True,
             tag="groups", statuses=(400, 401, 403, 404, 409, 503)),
    Endpoint("GET", "/transactions", "list_transactions",
             "Half messages and transactions the cluster holds", list_transactions,
             TxListOut, query=(Query("id", "str", "one transactional id or half message"),
                               Query("group", "str", "one broker group")),
             tag="transactions"),
    Endpoint("POST", "/transactions/{txid}/commit", "commit_half",
             "Commit a half message no producer decided", commit_half, TxEndOut,
             writes=True, tag="transactions", statuses=(400, 401, 403, 404, 409, 503, 504)),
    Endpoint("POST", "/transactions/{txid}/rollback", "rollback_half",
             "Roll back a half message no producer decided", rollback_half, TxEndOut,
             writes=True, tag="transactions", statuses=(400, 401, 403, 404, 409, 503, 504)),
    Endpoint("GET", "/cluster/status", "cluster_status",
             "Nodes, groups, leaders, terms and indexes (what `raftmq status` shows)",
             cluster_status, StatusOut, tag="cluster"),
    Endpoint("GET", "/dlq/{group}", "dlq_list", "A simple consumer group's dead letters",
             dlq_list, DlqOut, query=(Query("limit", "int", "at most this many per broker group",
                                            1, 10_000),), tag="dlq"),
    Endpoint("POST", "/dlq/{group}/resend", "dlq_resend",
             "Put dead letters back into their queues", dlq_resend, CountOut, ResendIn,
             writes=True, tag="dlq"),
]


def openapi_document() -> dict[str, Any]:
    doc = openapi(ENDPOINTS, prefix=API_PREFIX, title="raftmq HTTP API", version="1")
    doc["paths"][API_PREFIX + "/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This description", "tags": ["api"],
        "security": [{}],
        "responses": {"200": {"description": "the OpenAPI document",
                              "content": {"application/json": {"schema": {
                                  "type": "object"}}}}}}}
    return doc


def api_routes(settings: WebSettings) -> list[Route]:
    """The API's routes, relative to where they are mounted (`API_PREFIX`)."""
    document = openapi_document()

    async def serve_openapi(request: Request) -> JSONResponse:
        return JSONResponse(document)

    return [Route("/openapi.json", serve_openapi, methods=["GET"], name="openapi"),
            *(route(ep, settings) for ep in ENDPOINTS)]
