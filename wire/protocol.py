"""The wire protocol every raftmq process speaks: clients, nodes and name servers.

One frame format for everything, so one sans-I/O decoder (in the style of h11) serves
the client SDK, the node and the name server alike::

    u32 frame_len     bytes after this field, at most the receiver's max_frame
    u32 header_len
    header            msgpack map (control fields, small)
    body              frame_len - 4 - header_len raw bytes (message batches, records)

Bulk data never goes through msgpack: a producer batch travels in the body exactly as the
client framed it and is stored that way, and a fetch answer's body is the stored records
concatenated. Only the small header is encoded per request.

Header fields (short keys on purpose, they are on every frame):

    op    request type (`Op`), on requests only
    id    request id chosen by the sender, echoed in the response
    code  status (`Code`) on responses; 0 is OK
    msg   human-readable error text when code != 0
    leader  on NOT_LEADER: the address of the leader the node believes in (or None)
    unknown on NOT_LEADER: true when the write was appended before leadership was lost;
            the next leader may still commit it (`client.errors.may_have_applied`)
    ready   on NOT_LEADER: false when the node named in `leader` is this very node, elected
            a moment ago and still applying what its predecessor committed: retry it

Requests and their fields are listed on `Op`; a response to request `id` carries the
same `id` and no `op`. Raft traffic between nodes (`Op.RAFT`) is one-way. A server may
also send requests to a client on the client's connection (a broker checking back a
transaction with its producer); those carry negative ids, the client's own are positive
(`transport.framing.Caller`). A connection that opens with `HELLO` runs the peer
handshake (`transport.peerauth`); only then may it carry Raft traffic or READ_RAW.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol, TypeGuard

import msgpack

__all__ = [
    "host_name_problem",
    "DEFAULT_MAX_FRAME",
    "DEFAULT_NAMESRV",
    "NAMESRV_ENV",
    "MAX_MESSAGE_BYTES",
    "Code",
    "Frame",
    "FrameDecoder",
    "HeaderTooLarge",
    "MAX_CLIENT_CHARS",
    "Op",
    "ProtocolError",
    "RaftMQError",
    "REQUEST_ID_RULE",
    "RequestError",
    "check_request_id",
    "encode_frame",
    "error_header",
    "frame_limit",
    "is_int",
    "ok_header",
    "parse_address",
    "request_id_field",
    "topic_shapes",
    "validate_client_id",
    "validate_group_name",
    "validate_topic_name",
    "valid_request_id",
]

MAX_MESSAGE_BYTES = 4 << 20  # RocketMQ's default maximum message body
DEFAULT_MAX_FRAME = 16 << 20  # a few maximal messages plus headers
_PREFIX = struct.Struct(">II")
_FRAME_LEN = struct.Struct(">I")  # the prefix's first half, readable before the second
MAX_HEADER = 1 << 20
# Where every tool looks for a name server unless told: `raftmq namesrv` listens there and
# `raftmq dev` puts its name server there (port base 7100 + 76); the first of these
# environment variables that is set overrides it for the `raftmq` commands.
DEFAULT_NAMESRV = "127.0.0.1:7176"
NAMESRV_ENV = ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")


def frame_limit(max_message_bytes: int) -> int:
    """The frame size a process accepts when messages may be `max_message_bytes` long:
    room for two such messages and headers, never below `DEFAULT_MAX_FRAME`."""
    return max(DEFAULT_MAX_FRAME, max_message_bytes * 2 + (1 << 20))


class Op(IntEnum):
    """Request types. Fields in parentheses are header keys; "body" is the raw body."""

    HELLO = 1  # peer handshake, first frame only (node, nonce, purpose); see transport.peerauth
    AUTH = 4  # client authentication, SCRAM-SHA-256 (RFC 5802/7677) in two rounds: (step:
    #   "first", msg: client-first) -> (msg: server-first); (step: "final", msg:
    #   client-final) -> (msg: server-final, user); see broker.doors.security
    RAFT = 2  # (g: group, m: message fields) body: stored entries; one-way
    READ_RAW = 3  # node to node, for repairing corrupt entries: (g, index, hi?) -> (term)
    #   body: the stored bytes of entries [index, index + n), 1 <= n <= hi - index (hi
    #   defaults to index + 1; the answer ends before the answering replica's own next
    #   unreadable entry, and within broker.doors.reads.READ_RAW_MAX_BYTES); NOT_FOUND (gone: retention removed
    #   entry `index`)
    PRODUCE = 10  # (g) body: a batch (wire.records) -> (base, n, index, dup); or
    #   (g, sizes) body: batches back to back -> (results: an outcome per batch); see
    #   wire.produce
    FETCH = 11  # (topic, queue, offset, max, max_bytes, wait_ms, g?) -> (next, min, end, msgs)
    #   body; g: the group the client's route names (answered by its ready leader only)
    COMMIT_OFFSET = 12  # (cg, offsets: [[topic, queue, offset]...], req?: [client, seq]) -> (dup)
    QUERY_OFFSET = 13  # (cg, topic, queue, g?) -> (offset: int, -1 when none)
    CREATE_TOPIC = 20  # (g, topic, queues: total, hosted: [queue ids]) -> ()
    TOPICS = 21  # (g?) -> (topics: {name: {queues, hosted: {group: [q...]}}}); g: leader, linearizable
    STATUS = 22  # () -> (node, groups: {group: {...}})
    GET_MESSAGE = 23  # (msg_id) -> (msgs) body
    QUERY_KEY = 24  # (topic, key, max) -> (msgs) body
    TRANSFER_LEADER = 25  # (g, to: node id, prefer?: bool) -> (voters); `prefer` logs `to`
    #   as the group's preferred leader first (broker.state.parts.leadership)
    DELETE_TOPIC = 26  # (g, topic) -> (): the topic, its queues, offsets and keys, in group g
    GROW_TOPIC = 27  # (g, topic, queues: new total, hosted: [queue ids]) -> (); see
    #   BrokerState._grow_topic: existing queues stay, a new group may join
    OFFSETS = 32  # (cg?: one group) -> (rows: [[g, cg, topic, queue, offset]...]) for the
    #   groups this node leads
    DELETE_GROUP = 33  # (g, cg) -> (deleted: n): forget cg's committed offsets in group g
    OFFSET_FOR_TIME = 34  # (topic, queue, ms, g?) -> (offset, min, end): the first offset
    #   stored at or after ms (end when none); see wire.requests.reads
    HEARTBEAT = 30  # (cg, client, topics: [...], ttl_ms, manual?) -> ()
    CONSUMERS = 31  # (cg, known?, wait_ms?) -> (clients, manual): held while clients == known
    MEMBERSHIP = 50  # (g, action: show|add-learner|promote|remove, node?) at the leader ->
    #   (leader, voters, learners, matches: {node: match index}, active: [nodes heard from
    #   lately], commit, last, preferred,
    #   addresses: {node: addr}); changes are single-server (thesis §4.1), one at a time
    HOST_GROUP = 51  # (g, voters: [node ids]) -> (created: bool): start hosting an empty
    #   replica of g, caught up by its leader once added as a learner
    DROP_GROUP = 52  # (g) -> (dropped: bool): stop hosting g (removed from it), delete its data
    # Transactions (see broker.doors.transactions and broker.duties.transactions): g is the group asked. Kafka's
    # model: tid = transactional id, epoch fences older producers of it, n numbers the
    # transactions of one epoch (0, 1, ...). RocketMQ's: txid names one half message,
    # pg its producer group.
    TX_INIT = 60  # (g: coordinator, tid, timeout_ms) -> (epoch); a previous epoch's open
    #   transaction is aborted (fenced) first; NOT_COORDINATOR (coordinator) if g is not
    TX_ADD = 61  # (g: coordinator, tid, epoch, n, groups: [gid...]) -> (): participants
    #   of transaction n (sent beside the first send to them); starts it
    TX_OFFSETS = 62  # (g: participant hosting those queues, tid, epoch, n, cg,
    #   offsets: [[topic, queue, offset]...]) -> (): consumer offsets committed with it
    TX_END = 63  # (g: coordinator, tid, epoch, n, commit: bool, groups?: [gid...],
    #   wait?: bool) -> (state, dup): the commit point; groups (those sent to) join the
    #   participants; state complete_commit|complete_abort once every participant applied
    #   its marker, or prepare_* when markers still go out after 5 s (at once: wait=false)
    TX_MARKER = 64  # node to node only: (g: participant, tid, epoch, n, commit, fence, or
    #   markers: [[tid, epoch, n, commit, fence]...]) -> (dup): the coordinator's
    #   decisions applied in a participant
    TX_STATUS = 65  # (g: coordinator, tid) -> (epoch, n, state, participants, timeout_ms,
    #   unfinished: [[epoch, n, state]...] earlier transactions still writing markers)
    HALF_END = 66  # (g, txid, commit: bool, pg, source?: client|operator) -> (dup): commit
    #   or roll back a half message
    TX_LIST = 67  # (g?, tx?: a tid or txid, limit?) -> (halves, txns, decided, done, led,
    #   limit, truncated): rows (maps) of the groups this node leads, at most `limit` per
    #   list and group; `truncated` when the answer's size made the node cut that lower
    TX_CHECK = 68  # node to client, on a producer's connection: (g, txid, topic, queue,
    #   msg_id, pg, checks) -> (state: commit|rollback|unknown)
    PRODUCER_HEARTBEAT = 69  # (pg, client, ttl_ms?) -> (): this connection is a live
    #   member of producer group pg on this node (asked TX_CHECK)
    # the simple consumer (per-message acks) and its dead letters; see wire.requests.simple
    RECEIVE = 70  # (cg, topic, queue, g?, max, invisible_ms, wait_ms, ...) -> (msgs) body
    ACK = 71  # (cg, topic, queue, g?, items: [[offset, handle]...], req?) -> (acked, stale)
    NACK = 72  # (cg, topic, queue, g?, items, delay_ms?, backoff_ms?, error?, dead?, req?)
    #   -> (nacked, dead, stale)
    CHANGE_INVISIBLE = 73  # (cg, topic, queue, g?, offset, handle, invisible_ms) -> (visible_ms)
    DLQ = 74  # (action: list|show|resend|purge, cg, g?, ids?, req?) -> (rows, led, done)
    SEND_BACK = 75  # (cg, topic, queue, g?, offset, backoff_ms?, max_deliveries, error?,
    #   dead?, req?) -> (parked, dead, dup): a push consumer failed a message it read by
    #   offset; the group's receipts deliver it again (RECEIVE retries) after the backoff
    LOCK = 76  # (cg, topic, queues: [q...], client, lease_ms?, g?) -> (held: [q...],
    #   expiry_ms): take or renew queue locks (broker.state.parts.queuelocks)
    UNLOCK = 77  # (cg, topic, queues, client, g?) -> (freed: [q...]): only the client's own
    LOCKS = 78  # (cg?) -> (rows: [[g, cg, topic, queue, client, expiry_ms, live]...], led)
    REGISTER = 40  # name server: (node, addr, inc, groups: {gid: {..., tv, base?}}) + body
    #   of topic tables (whole, or changes since `base`) -> (resend: [gid]); see
    #   wire.requests.namesrv
    ROUTE = 41  # name server: (topic) -> (total, queues: [[queue, group, leader_addr]...])
    CLUSTER = 42  # name server: (topics: bool) -> (nodes, groups) + topic listing in the body
    # users and ACLs, kept in the metadata group (see broker.doors.security)
    USER_PUT = 80  # (user, salt, iterations, stored_key, server_key): create a user or
    #   replace its SCRAM verifier, in the metadata group -> ()
    USER_DELETE = 81  # (user) -> (deleted: bool)
    USER_LIST = 82  # () -> (users: [names])
    ACL_ADD = 83  # (principal, kind, pattern, name, operation, permission) -> (added: bool);
    #   see broker.state.parts.acls
    ACL_REMOVE = 84  # (the same fields) -> (removed: bool)
    ACL_LIST = 85  # () -> (acls: [[principal, kind, pattern, name, operation, permission]])
    # message trace (see broker.doors.trace): what traced clients report, appended to the
    # trace topic of the group that stores the messages by that group's leader
    TRACE = 86  # (g, topic, role: producer|consumer, client, cg?, slot, slots, events:
    #   [[kind, queue, offset, ms, committed]...]) -> (written, missing)


class Code(IntEnum):
    OK = 0
    NOT_LEADER = 1  # retriable: refresh the route, `leader` header is a hint
    UNKNOWN_TOPIC = 2
    UNKNOWN_QUEUE = 3
    INVALID_NAME = 4
    MESSAGE_TOO_LARGE = 5
    MALFORMED = 6  # the request could not be decoded or its fields are wrong
    UNKNOWN_OP = 7
    OFFSET_TOO_SMALL = 8  # below the earliest retained offset
    OFFSET_TOO_LARGE = 9  # beyond the end of the queue
    TIMEOUT = 10  # retriable: outcome unknown
    TOPIC_EXISTS = 11
    BUSY = 12  # retriable: back-pressure, the group is behind
    UNKNOWN_GROUP = 13
    PROPOSAL_DROPPED = 14  # retriable: leadership moving, nothing was written
    INTERNAL = 15
    FRAME_TOO_LARGE = 16
    NOT_FOUND = 17
    SEQUENCE_GAP = 18  # idempotent batch arrived before an earlier one: resend in order
    STALE_REQUEST = 19  # a retried request too old to tell whether it took effect
    # Client side only (never on the wire): what a client concludes about a request.
    UNAVAILABLE = 20  # retriable: no node could be reached or none leads; nothing was written
    CONNECTION_LOST = 21  # retriable: the connection failed after the request left
    # On the wire again:
    FORBIDDEN = 22  # the caller may not make this request (peer-only ops from a client)
    UNAUTHENTICATED = 23  # authenticate first (AUTH), or the credentials were wrong
    NOT_A_MEMBER = 40  # the node named is not a member (or voter) of the group as asked
    MEMBERSHIP_REFUSED = 41  # the membership change would lose quorum, or one is under way
    TX_FENCED = 42  # a newer producer (higher epoch) holds this transactional id
    TX_UNKNOWN = 43  # no such transaction, or it finished long ago
    TX_DECIDED = 44  # the transaction was already committed or aborted (the other way)
    TX_LIMIT = 45  # too many messages/bytes/participants/open transactions, or timeout too long
    NOT_COORDINATOR = 46  # this group is not the coordinator of that transactional id
    TX_PENDING = 47  # retriable: that queue's offsets are part of an undecided transaction
    STALE_RECEIPT = 48  # a simple consumer's receipt names a delivery that is no longer
    #                     current: the message was delivered again (its invisible time ran
    #                     out), acked, or dead-lettered; nothing was changed for it
    LOCK_LOST = 49  # the queue is locked in that consumer group by another client's live
    #                 lease (orderly consumption): its offsets are that client's to commit

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset({Code.NOT_LEADER, Code.TIMEOUT, Code.BUSY, Code.PROPOSAL_DROPPED,
                        Code.SEQUENCE_GAP, Code.UNAVAILABLE, Code.CONNECTION_LOST,
                        Code.TX_PENDING})


class ProtocolError(Exception):
    """The byte stream itself is broken; the connection must be closed."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


class RaftMQError(Exception):
    """The base of every error raftmq raises to a caller (see `raftmq.client.errors`)."""


class RequestError(RaftMQError):
    """One request failed with `code`; its connection stays usable."""

    def __init__(self, code: Code, message: str, **extra: Any) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.extra = extra

    @property
    def retriable(self) -> bool:
        return self.code.retriable


@dataclass(slots=True)
class Frame:
    header: dict[str, Any]
    body: bytes = b""
    size: int = field(default=0)  # bytes on the wire, for metrics


class HeaderTooLarge(ValueError):
    """A frame whose header is over `MAX_HEADER`: every reader would refuse it and close
    the connection, so it is never sent (the sender answers with an error instead)."""


def encode_frame(header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    if len(h) > MAX_HEADER:
        raise HeaderTooLarge(f"frame header of {len(h)} bytes exceeds the limit {MAX_HEADER}")
    return b"".join((_PREFIX.pack(4 + len(h) + len(body), len(h)), h, body))


def ok_header(req_id: int, **fields: Any) -> dict[str, Any]:
    return {"id": req_id, "code": 0, **fields}


def error_header(req_id: int, code: Code, message: str, **fields: Any) -> dict[str, Any]:
    return {"id": req_id, "code": int(code), "msg": message, **fields}


def header_field(h: Mapping[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    """Field `name` of a request header, checked to be a `kind` (an int is never a bool):
    a header comes from an untrusted peer, and a missing or mistyped field is answered
    MALFORMED with its name rather than failing deep inside a handler."""
    v = h.get(name, default)
    if v is ...:
        raise RequestError(Code.MALFORMED, f"missing field {name!r}")
    if kind is int and not is_int(v):
        raise RequestError(Code.MALFORMED, f"field {name!r} must be an integer")
    if kind is not int and not isinstance(v, kind):
        raise RequestError(Code.MALFORMED, f"field {name!r} must be {kind.__name__}")
    return v


# ---------------------------------------------------------------------- field rules
# Here, at the bottom, so the typed requests (`wire.requests`), the doors and the state
# machine's records apply one rule each, not copies that could drift apart.


def is_int(v: object) -> TypeGuard[int]:
    """An integer field as msgpack decodes one: Python's bool is an int, a client's
    ``true`` is not."""
    return isinstance(v, int) and not isinstance(v, bool)


REQUEST_ID_RULE = "req must be [client id > 0, sequence >= 0]"


def valid_request_id(req: object) -> tuple[int, int] | None:
    """A request id ([client id, sequence] of a write the client may retry, which the
    state machine applies once however often it arrives) as (client id > 0,
    sequence >= 0), both under 2**64; None when `req` is not one."""
    if (isinstance(req, list | tuple) and len(req) == 2 and is_int(req[0]) and is_int(req[1])
            and 0 < req[0] < 1 << 64 and 0 <= req[1] < 1 << 64):
        return int(req[0]), int(req[1])
    return None


def check_request_id(req: object) -> tuple[int, int]:
    """`req` as a request id (`valid_request_id`), or MALFORMED."""
    valid = valid_request_id(req)
    if valid is None:
        raise RequestError(Code.MALFORMED, REQUEST_ID_RULE)
    return valid


def request_id_field(h: Mapping[str, Any]) -> tuple[int, int] | None:
    """A request header's optional "req" field: None when it is left out, MALFORMED when
    it is there and not a request id (a null included)."""
    if "req" not in h:
        return None
    return check_request_id(h["req"])


class FrameDecoder:
    """Incremental frame parser: `feed()` bytes, then take frames with `next_frame()`.

    Raises `ProtocolError` for a frame over `max_frame`, a header length that does not fit
    the frame, or a header that is not a msgpack map. After an error the stream cannot be
    resynchronised; the caller closes the connection (other connections are unaffected).
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, *, small_frame: int | None = None,
                 large_ok: Callable[[dict[Any, Any]], bool] | None = None) -> None:
        self.max_frame = max_frame
        # with `large_ok`: a frame over `small_frame` bytes must have a header it accepts,
        # checked as soon as the header is in (a request type that is always small cannot
        # make the reader buffer a large frame)
        self.small_frame = small_frame
        self.large_ok = large_ok
        self._checked = -1  # the position of the large frame whose header was accepted
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._checked = 0 if self._checked == self._pos else -1
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def discard(self) -> None:
        """Drop whatever is buffered (the connection is closing): its memory goes now,
        not when the last reference to the decoder does."""
        self._buf = bytearray()
        self._pos = 0
        self._checked = -1

    def pending_frame(self) -> int | None:
        """The size on the wire of the frame begun in the buffer, once its length prefix
        is in (so a reader can set memory aside for it before reading its body)."""
        if self.buffered < 4:
            return None
        return 4 + int(_FRAME_LEN.unpack_from(self._buf, self._pos)[0])

    def next_frame(self) -> Frame | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 8:
            return None
        frame_len, header_len = _PREFIX.unpack_from(buf, pos)
        if frame_len > self.max_frame:
            raise ProtocolError(
                Code.FRAME_TOO_LARGE, f"frame of {frame_len} bytes exceeds the limit {self.max_frame}"
            )
        if header_len > MAX_HEADER:
            raise ProtocolError(
                Code.MALFORMED, f"header length {header_len} exceeds the limit {MAX_HEADER}"
            )
        if header_len > frame_len - 4 or header_len == 0:
            raise ProtocolError(
                Code.MALFORMED, f"header length {header_len} does not fit frame length {frame_len}"
            )
        end = pos + 4 + frame_len
        hstart = pos + 8
        gated = (self.large_ok is not None and self.small_frame is not None
                 and frame_len > self.small_frame and self._checked != pos)
        if len(buf) < end and not (gated and len(buf) >= hstart + header_len):
            return None
        try:
            header = msgpack.unpackb(
                bytes(buf[hstart : hstart + header_len]), raw=False, strict_map_key=False
            )
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError(Code.MALFORMED, f"undecodable frame header: {exc}") from exc
        if not isinstance(header, dict):
            raise ProtocolError(Code.MALFORMED, "frame header is not a map")
        if gated:
            assert self.large_ok is not None
            if not self.large_ok(header):
                raise ProtocolError(
                    Code.FRAME_TOO_LARGE, f"frame of {frame_len} bytes exceeds the limit "
                    f"{self.small_frame} for this request (op {header.get('op')!r})")
            self._checked = pos
            if len(buf) < end:
                return None
        body = bytes(buf[hstart + header_len : end])
        self._pos = end
        self._checked = -1
        return Frame(header, body, 4 + frame_len)


# ---------------------------------------------------------------------- names

_NAME = re.compile(r"[A-Za-z0-9_\-%|.]{1,127}")


def _validate_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestError(
            Code.INVALID_NAME,
            f"invalid {kind} name {name!r}: use 1-127 characters from A-Z a-z 0-9 _ - % | .",
        )
    return name


def validate_topic_name(name: object) -> str:
    """RocketMQ's rule: 1..127 characters of letters, digits, `_ - % | .`."""
    return _validate_name("topic", name)


def validate_group_name(name: object) -> str:
    """The same rule as for topics."""
    return _validate_name("group", name)


MAX_HOST_NAME = 64
_HOST_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def host_name_problem(name: object) -> str | None:
    """What is wrong with a host name (a machine of shards: a config's `[hosts]`, a
    REGISTER's `host`), or None: 1-64 letters, digits, '-', '_' or '.'."""
    if isinstance(name, str) and 0 < len(name) <= MAX_HOST_NAME and set(name) <= _HOST_NAME_CHARS:
        return None
    return (f"a host name is 1-{MAX_HOST_NAME} letters, digits, '-', '_' or '.'; "
            f"got {name!r}")


MAX_CLIENT_CHARS = 255  # a client id a node keeps (HEARTBEAT, PRODUCER_HEARTBEAT)


def validate_client_id(client: object) -> str:
    """A client id the broker keeps for a while (a heartbeat's): 1-255 printable
    characters, so one client cannot make a node hold (or a CONSUMERS answer carry)
    megabytes of id; MALFORMED otherwise."""
    if not (isinstance(client, str) and 0 < len(client) <= MAX_CLIENT_CHARS
            and client.isprintable()):
        shown = repr(client)[:40] if isinstance(client, str) else type(client).__name__
        raise RequestError(Code.MALFORMED, f"a client id is 1-{MAX_CLIENT_CHARS} printable "
                           f"characters; got {shown}"
                           + (f" ({len(client)} characters)" if isinstance(client, str) else ""))
    return client


def parse_address(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port), with a clear error for anything else."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {addr!r}: expected host:port")
    return host, int(port)


class _TopicShape(Protocol):
    @property
    def queues(self) -> int: ...
    @property
    def hosted(self) -> Iterable[int]: ...


def topic_shapes(topics: Mapping[str, _TopicShape]) -> list[list[Any]]:
    """A topic table on the wire (a REGISTER body's `set`, the CLUSTER body):
    `[[queues, [hosted], [names]], ...]`, topics grouped by (queues, hosted), which
    thousands share, so the table costs little beyond its names."""
    shapes: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for name, t in topics.items():
        shapes.setdefault((t.queues, tuple(t.hosted)), []).append(name)
    return [[q, list(h), names] for (q, h), names in shapes.items()]
