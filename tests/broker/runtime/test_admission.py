"""Which client connections a node keeps (`broker.runtime.admission`): connections that have not
proved who they are are bounded apart from `max_connections` (the oldest evicted), so they
never lock out a login; a superuser always gets in; a connection logging in again is counted
once. And the delay of failed logins in a row (`broker.doors.security.LoginFailures`)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.doors.security import LoginFailures
from broker.runtime.admission import ClientAdmission
from wire.protocol import Code, RequestError


def _run(main: object) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_unidentified_connections_are_bounded_and_never_lock_out_a_login() -> None:
    async def main() -> None:
        refusals: list[str] = []
        adm = ClientAdmission(max_connections=2, max_unidentified=3, max_bytes_per_user=1024,
                              superusers=frozenset({"root"}), on_refusal=refusals.append)
        scopes = [trio.CancelScope() for _ in range(5)]
        tickets = [adm.arrive(s) for s in scopes]
        assert [s.cancel_called for s in scopes] == [True, True, False, False, False]
        assert adm.unidentified == 3 and refusals == ["unidentified_evicted"] * 2
        adm.client(tickets[2], "alice")
        adm.client(tickets[3], "alice")
        assert adm.clients == 2 and adm.pool("alice") is not None
        late = adm.arrive(trio.CancelScope())
        with pytest.raises(RequestError) as info:
            adm.client(late, "bob")
        assert info.value.code == Code.BUSY
        adm.client(tickets[4], "root")  # a superuser always gets in
        assert adm.clients == 2
        for t in (*tickets, late):
            adm.leave(t)
        assert adm.clients == 0 and adm.unidentified == 0 and adm.pool("alice") is None

    _run(main)


def test_failed_logins_in_a_row_are_slowed_and_the_bookkeeping_is_bounded() -> None:
    f = LoginFailures(free=3, max_delay=5.0, capacity=100)
    remote = "10.0.0.7:5555"
    delays = []
    for _ in range(10):
        delays.append(f.delay(remote))
        f.failed(remote)
    assert delays[:4] == [0, 0, 0, 0.1] and delays[4:7] == [0.2, 0.4, 0.8]
    assert delays[-1] == 5.0
    assert f.delay("10.0.0.7:6000") == 5.0  # the host, whatever its port
    f.succeeded(remote)
    assert f.delay(remote) == 0
    for i in range(1000):
        f.failed(f"10.1.{i // 256}.{i % 256}:1")
    assert len(f) == 100


def test_a_connection_logging_in_again_is_counted_once() -> None:
    async def main() -> None:
        adm = ClientAdmission(max_connections=1, max_unidentified=4, max_bytes_per_user=1024)
        t = adm.arrive(trio.CancelScope())
        adm.client(t, "alice")
        adm.client(t, "bob")  # alice was removed; the same connection logs in as bob
        assert adm.clients == 1 and adm.pool("alice") is None and adm.pool("bob") is not None
        adm.leave(t)
        assert adm.clients == 0 and adm.pool("bob") is None

    _run(main)
