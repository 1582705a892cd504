"""The consumer-heartbeat registry: members live until their heartbeat expires."""

from __future__ import annotations

from broker.consumers import MAX_TTL_MS, MIN_TTL_MS, ConsumerRegistry


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
    r.heartbeat("cg", "short", 0, now=0.0)
    r.heartbeat("cg", "long", 10**9, now=0.0)
    assert r.members("cg", now=MIN_TTL_MS / 1000) == ["long", "short"]
    assert r.members("cg", now=MIN_TTL_MS / 1000 + 0.001) == ["long"]
    assert r.members("cg", now=MAX_TTL_MS / 1000) == ["long"]
    assert r.members("cg", now=MAX_TTL_MS / 1000 + 0.001) == []
