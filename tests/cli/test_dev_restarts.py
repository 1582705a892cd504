"""`raftmq dev`'s restart schedule: a backoff that doubles while a child keeps dying soon
after starting, and starts over once it ran for a while."""

from __future__ import annotations

from raftmq.dev import RESTART_DELAYS, STABLE_AFTER, Restarts


def test_backoff_doubles_for_quick_deaths_and_resets_after_a_stable_run() -> None:
    r = Restarts()
    now = 100.0
    delays = []
    for _ in range(8):
        delays.append(r.exited("n2", now))
        now += delays[-1]
        assert r.take_due(now - 0.01) == []
        assert r.take_due(now) == ["n2"]
        r.restarted("n2", now)
        now += 1.0  # dies a second after each start
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert max(delays) == RESTART_DELAYS[-1]
    now += STABLE_AFTER
    assert r.exited("n2", now) == 1.0  # it ran long enough: back to the first delay


def test_children_are_scheduled_independently() -> None:
    r = Restarts()
    assert r.exited("n1", 0.0) == 1.0
    assert r.exited("namesrv", 0.5) == 1.0
    assert r.take_due(1.0) == ["n1"]
    assert r.take_due(1.5) == ["namesrv"]
    assert r.due == {}
