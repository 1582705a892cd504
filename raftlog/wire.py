"""Raft messages on the wire: small fields in a list, entries as their stored bytes.

Entries cross the network exactly as the CommitLog stores them, with both CRCs: the
frame the leader sealed when it proposed the entry (`raftlog.commitlog.EntryDraft`). A
follower verifies what it received once, before it stores it (as received), so a bit
flipped in transit can never be acknowledged.

Fields: the 11 integers of every message (type, src, dst, term, log_index, log_term,
commit, reject, hint_index, hint_term, context). A SNAPSHOT adds two more, the sorted
voters and learners of its membership, and its body is the state machine's bytes
instead of entries. Messages of every other type keep the 11-field shape.
"""

from __future__ import annotations

from typing import Any

from raftlog.commitlog import decode_entries, encode_entry
from raftlog.types import Membership, Message, MsgType

__all__ = ["WireError", "message_from_wire", "message_to_wire"]


class WireError(ValueError):
    """A peer sent a message we cannot decode; the link is reset."""


def message_to_wire(m: Message) -> tuple[list[Any], bytes | memoryview]:
    fields: list[Any] = [
        int(m.type), m.src, m.dst, m.term, m.log_index, m.log_term, m.commit,
        int(m.reject), m.hint_index, m.hint_term, m.context,
    ]
    if m.type == MsgType.SNAPSHOT:
        if m.membership is None or m.entries:
            raise ValueError("a snapshot message carries a membership and no entries")
        fields += [sorted(m.membership.voters), sorted(m.membership.learners)]
        return fields, m.snapshot
    if not m.entries:
        return fields, b""
    # An entry the leader proposed carries the stored frame it sealed then (received
    # ones carry the frame as received): those bytes go out, no CRC is computed here.
    frames = [encode_entry(e) for e in m.entries]
    return fields, frames[0] if len(frames) == 1 else b"".join(frames)


def message_from_wire(fields: Any, body: bytes) -> Message:
    if not isinstance(fields, list) or len(fields) not in (11, 13):
        raise WireError("raft message fields must be a list of 11 integers (13 for a snapshot)")
    head = fields[:11]
    if not all(isinstance(f, int) for f in head):
        raise WireError("raft message fields must be integers")
    t, src, dst, term, li, lt, commit, reject, hi, ht, ctx = head
    try:
        mtype = MsgType(t)
    except ValueError as exc:
        raise WireError(f"undecodable raft message: {exc}") from exc
    if (mtype == MsgType.SNAPSHOT) != (len(fields) == 13):
        raise WireError(f"a {mtype.name} message with {len(fields)} fields")
    if mtype == MsgType.SNAPSHOT:
        voters, learners = fields[11], fields[12]
        try:
            if not all(
                isinstance(ids, list) and all(isinstance(i, int) for i in ids)
                for ids in (voters, learners)
            ):
                raise ValueError("membership ids must be lists of integers")
            membership = Membership(frozenset(voters), frozenset(learners))
        except ValueError as exc:
            raise WireError(f"bad snapshot membership: {exc}") from exc
        return Message(mtype, src, dst, term, li, lt, (), commit, bool(reject), hi, ht, ctx,
                       snapshot=bytes(body), membership=membership)
    try:
        entries = tuple(decode_entries(body, source="peer message")) if body else ()
    except Exception as exc:  # a CRC failure
        raise WireError(f"undecodable raft message: {exc}") from exc
    return Message(mtype, src, dst, term, li, lt, entries, commit, bool(reject), hi, ht, ctx)
