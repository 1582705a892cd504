"""Peer links: what is queued for a peer, and what is too large to send at all."""

from __future__ import annotations

from typing import Any

from broker.peers import PeerLinks
from raftlog.types import Membership, Message, MsgType


def test_a_message_over_the_peer_frame_limit_is_not_queued() -> None:
    links = PeerLinks(1, {1: "127.0.0.1:1", 2: "127.0.0.1:2"}, lambda g, m: None,
                      max_frame=4096)
    link: Any = links._links[2]
    link.stream = object()  # connected, as far as queueing goes
    small = Message(MsgType.HEARTBEAT, 1, 2, 3, commit=4)
    links.send("g", small)
    assert len(link.queue) == 1
    members = Membership(frozenset({1, 2}))
    links.send("g", Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3,
                            snapshot=b"x" * 1000, membership=members))
    assert len(link.queue) == 2  # a snapshot that fits travels like any message
    links.send("g", Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3,
                            snapshot=b"x" * 5000, membership=members))
    assert len(link.queue) == 2  # one that does not is dropped (and logged), not sent
