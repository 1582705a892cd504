"""Raft messages on the wire: small fields in a list, entries as their stored bytes.

Entries cross the network exactly as the CommitLog stores them (`encode_entry`), with
both CRCs, so a follower verifies what it received before it stores it and a bit flipped
in transit can never be acknowledged.
"""

from __future__ import annotations

from typing import Any

from raftlog.commitlog import decode_entries, encode_entry
from raftlog.types import Message, MsgType

__all__ = ["WireError", "message_from_wire", "message_to_wire"]


class WireError(ValueError):
    """A peer sent a message we cannot decode; the link is reset."""


def message_to_wire(m: Message) -> tuple[list[int], bytes]:
    fields = [
        int(m.type), m.src, m.dst, m.term, m.log_index, m.log_term, m.commit,
        int(m.reject), m.hint_index, m.hint_term, m.context,
    ]
    body = b"".join(encode_entry(e) for e in m.entries) if m.entries else b""
    return fields, body


def message_from_wire(fields: Any, body: bytes) -> Message:
    if not isinstance(fields, list) or len(fields) != 11:
        raise WireError("raft message fields must be a list of 11 integers")
    if not all(isinstance(f, int) for f in fields):
        raise WireError("raft message fields must be integers")
    t, src, dst, term, li, lt, commit, reject, hi, ht, ctx = fields
    try:
        mtype = MsgType(t)
        entries = tuple(decode_entries(body, source="peer message")) if body else ()
    except Exception as exc:  # bad enum value or a CRC failure
        raise WireError(f"undecodable raft message: {exc}") from exc
    return Message(mtype, src, dst, term, li, lt, entries, commit, bool(reject), hi, ht, ctx)
