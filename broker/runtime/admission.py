"""Which client connections a node keeps: the per-node half of the connection budget.

Every accepted connection is *unidentified* until it proves who it is: a peer by its
HELLO (then the peer handshake), a client by its login when authentication is on, or
by its first request when it is off. Unidentified connections are kept in arrival order
and at most `max_unidentified` of them: one more closes the oldest. They do not count
against `max_connections`, so connections that never log in can neither crowd out a
client that does nor a peer (whose links are never counted at all); each holds at most
one small frame (`login_max_frame`) for at most `login_timeout`, so together they hold
a bounded amount of memory.

An identified client counts against `max_connections` (superusers, who must always be
able to log in and act, do not); the request bodies in flight on all the connections of
one user share one `BytePool` of `max_inflight_bytes_per_user`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable

import trio

from transport.budget import BytePool
from wire.protocol import Code, RequestError

__all__ = ["ClientAdmission", "Ticket"]


class Ticket:
    """One accepted connection, from accept to close."""

    __slots__ = ("client", "key", "scope", "user")

    def __init__(self, key: int, scope: trio.CancelScope) -> None:
        self.key = key
        self.scope = scope
        self.client = False  # counted against max_connections
        self.user: str | None = None


class ClientAdmission:
    """Counts and limits of a node's client connections (see the module's docstring)."""

    def __init__(self, *, max_connections: int, max_unidentified: int,
                 max_bytes_per_user: int, superusers: frozenset[str] = frozenset(),
                 on_refusal: Callable[[str], None] = lambda _reason: None) -> None:
        self.max_connections = max_connections
        self.max_unidentified = max_unidentified
        self.max_bytes_per_user = max_bytes_per_user
        self.superusers = superusers
        self.clients = 0  # identified client connections counted against the limit
        self._unidentified: OrderedDict[int, Ticket] = OrderedDict()
        self._users: dict[str, tuple[BytePool, int]] = {}  # user -> (pool, connections)
        self._keys = itertools.count()
        self._on_refusal = on_refusal

    @property
    def unidentified(self) -> int:
        """Connections accepted that have not yet proved who they are."""
        return len(self._unidentified)

    def arrive(self, scope: trio.CancelScope) -> Ticket:
        """A connection was accepted (`scope` ends it); the oldest unidentified one is
        closed when there are more than `max_unidentified`."""
        ticket = Ticket(next(self._keys), scope)
        self._unidentified[ticket.key] = ticket
        while len(self._unidentified) > self.max_unidentified:
            _, oldest = self._unidentified.popitem(last=False)
            self._on_refusal("unidentified_evicted")
            oldest.scope.cancel()
        return ticket

    def peer(self, ticket: Ticket) -> None:
        """It opened with a peer's HELLO: never counted, never evicted from here on."""
        self._unidentified.pop(ticket.key, None)

    def client(self, ticket: Ticket, user: str | None = None) -> None:
        """It is a client (of `user`, when logged in): counted against `max_connections`
        unless a superuser's. Raises `RequestError(BUSY)` when there is no room. A
        connection admitted before (its user was removed, it logs in again) is first
        counted out as the old user's."""
        self._count_out(ticket)
        if user not in self.superusers:
            if self.clients >= self.max_connections:
                self._on_refusal("connections")
                raise RequestError(Code.BUSY, f"this node serves at most "
                                   f"{self.max_connections} client connections")
            self.clients += 1
            ticket.client = True
        self._unidentified.pop(ticket.key, None)
        if user is not None:
            ticket.user = user
            pool, n = self._users.get(user) or (BytePool(self.max_bytes_per_user), 0)
            self._users[user] = (pool, n + 1)

    def pool(self, user: str | None) -> BytePool | None:
        """The pool of request bytes shared by `user`'s connections (None: no user)."""
        entry = self._users.get(user) if user is not None else None
        return entry[0] if entry is not None else None

    def leave(self, ticket: Ticket) -> None:
        """The connection closed: whatever it was counted in, it no longer is."""
        self._unidentified.pop(ticket.key, None)
        self._count_out(ticket)

    def _count_out(self, ticket: Ticket) -> None:
        if ticket.client:
            ticket.client = False
            self.clients -= 1
        user, ticket.user = ticket.user, None
        if user is not None:
            pool, n = self._users[user]
            if n > 1:
                self._users[user] = (pool, n - 1)
            else:
                del self._users[user]
