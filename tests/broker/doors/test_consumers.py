"""The consumer-heartbeat registry: members live until their heartbeat expires."""

from __future__ import annotations

from broker.doors.consumers import MAX_TTL_MS, MIN_TTL_MS, ConsumerRegistry


def test_a_member_lives_until_its_ttl_and_is_then_forgotten() -> None:
    r = ConsumerRegistry()
    r.heartbeat("cg", "b", 1_000, now=10.0)
    r.heartbeat("cg", "a", 5_000, now=10.0)
    r.heartbeat("other", "c", 1_000, now=10.0)
    assert r.members("cg", now=11.0) == ["a", "b"]  # sorted: every member sees one order
    assert r.members("cg", now=11.5) == ["a"]
    r.heartbeat("cg", "b", 1_000, now=14.0)  # back again
    assert r.members("cg", now=14.5) == ["a", "b"]
    assert r.members("cg", now=15.5) == []
    assert r.members("other", now=10.5) == ["c"] and r.members("nobody", now=0.0) == []


def test_the_ttl_is_clamped() -> None:
    r = ConsumerRegistry()
    r.heartbeat("cg", "short", 1, now=0.0)
    r.heartbeat("cg", "long", 10**9, now=0.0)
    assert r.members("cg", now=MIN_TTL_MS / 1000) == ["long", "short"]
    assert r.members("cg", now=MIN_TTL_MS / 1000 + 0.001) == ["long"]
    assert r.members("cg", now=MAX_TTL_MS / 1000) == ["long"]
    assert r.members("cg", now=MAX_TTL_MS / 1000 + 0.001) == []


def test_client_ids_and_members_are_capped() -> None:
    """What a client chooses and the node keeps is bounded: a long or unprintable client
    id is MALFORMED; a new member over the group's or the node's cap is BUSY (and kept
    nowhere) until others expire; members already known keep beating."""
    import pytest

    from wire.protocol import Code, RequestError

    r = ConsumerRegistry(max_group_members=2, max_members=3)
    for bad in ("", "x" * 256, "tab\there", 7):
        with pytest.raises(RequestError) as info:
            r.heartbeat("cg", bad, 1_000, now=0.0)  # type: ignore[arg-type]
        assert info.value.code == Code.MALFORMED
    assert len(r) == 0
    r.heartbeat("cg", "a", 1_000, now=0.0)
    r.heartbeat("cg", "b", 5_000, now=0.0)
    with pytest.raises(RequestError) as info:
        r.heartbeat("cg", "c", 1_000, now=0.5)
    assert info.value.code == Code.BUSY and r.members("cg", now=0.5) == ["a", "b"]
    r.heartbeat("cg", "a", 1_000, now=0.5)  # a known member beats on
    r.heartbeat("other", "d", 1_000, now=0.5)
    with pytest.raises(RequestError) as info:
        r.heartbeat("third", "e", 1_000, now=0.6)  # the node's cap
    assert info.value.code == Code.BUSY and r.members("third", now=0.6) == []
    r.heartbeat("third", "e", 1_000, now=1.6)  # "a" and "d" expired meanwhile
    assert r.members("third", now=1.6) == ["e"] and len(r) == 2


def test_a_ttl_of_0_leaves_at_once_and_the_next_expiry_is_known() -> None:
    """A leaving consumer's last heartbeat (ttl 0) removes it now, so the members that
    wait for a change (CONSUMERS with `known`) learn of it at once; `next_expiry` says
    when to look again for a member that just stops beating."""
    r = ConsumerRegistry()
    r.heartbeat("cg", "a", 5_000, now=10.0)
    r.heartbeat("cg", "b", 1_000, now=10.0)
    assert r.next_expiry("cg") == 11.0 and r.next_expiry("nobody") is None
    r.heartbeat("cg", "b", 0, now=10.5)
    assert r.members("cg", now=10.5) == ["a"] and len(r) == 1
    r.heartbeat("cg", "zzz", 0, now=10.5)  # leaving without having joined: nothing
    r.leave("cg", "a")
    assert r.members("cg", now=10.5) == [] and len(r) == 0 and r.next_expiry("cg") is None


def test_members_with_manual_assignment_are_live_but_share_no_queues() -> None:
    r = ConsumerRegistry()
    r.heartbeat("cg", "push", 5_000, now=0.0)
    r.heartbeat("cg", "pull", 1_000, now=0.0, manual=True)
    assert r.members("cg", now=0.5) == ["push"]
    assert r.manual_members("cg", now=0.5) == ["pull"]
    assert r.manual_members("cg", now=1.5) == []  # expired: gone from both views
    r.heartbeat("cg", "pull", 1_000, now=2.0, manual=True)
    r.heartbeat("cg", "pull", 0, now=2.1, manual=True)  # leaving
    assert r.manual_members("cg", now=2.1) == [] and len(r) == 1
    r.heartbeat("cg", "x", 1_000, now=3.0, manual=True)
    r.heartbeat("cg", "x", 1_000, now=3.1)  # the same client now takes part
    assert r.members("cg", now=3.2) == ["push", "x"] and r.manual_members("cg", now=3.2) == []
