"""SCRAM-SHA-256 authentication (see `broker.doors.security` for why SCRAM): on the client side,
credentials, where they come from, and the two AUTH round trips over any request
function, so the async pool and the blocking client share one exchange; on the server
side (`ServerLogins`), the two steps a node and the name server answer alike."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import scramp

from wire.protocol import Code, Op, RequestError
from wire.security import MECHANISM

__all__ = ["PASSWORD_ENV", "USER_ENV", "Credentials", "LoginFailed", "Lookup", "ServerLogins",
           "credentials_from_env", "exchange"]

USER_ENV = "RAFTMQ_USER"
PASSWORD_ENV = "RAFTMQ_PASSWORD"


@dataclass(frozen=True)
class Credentials:
    """A user name and password a client logs in with (the password never leaves it)."""

    user: str
    password: str = field(repr=False)


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials | None:
    """RAFTMQ_USER and RAFTMQ_PASSWORD, or None when the user is unset."""
    env = os.environ if env is None else env
    user = env.get(USER_ENV, "")
    return Credentials(user, env.get(PASSWORD_ENV, "")) if user else None


class Exchange:
    """One client's side of the exchange; `first()`, then `final(server_first)`, then
    `check(server_final)` (which raises unless the server proved it knows the verifier)."""

    def __init__(self, creds: Credentials) -> None:
        self._client = scramp.ScramClient([MECHANISM], creds.user, creds.password)

    def first(self) -> dict[str, Any]:
        return {"op": int(Op.AUTH), "step": "first", "msg": self._client.get_client_first()}

    def final(self, server_first: object) -> dict[str, Any]:
        try:
            self._client.set_server_first(str(server_first))
        except scramp.ScramException as exc:
            raise RequestError(Code.UNAUTHENTICATED, f"the server's SCRAM answer: {exc}") from None
        return {"op": int(Op.AUTH), "step": "final", "msg": self._client.get_client_final()}

    def check(self, server_final: object) -> None:
        try:
            self._client.set_server_final(str(server_final))
        except scramp.ScramException as exc:
            raise RequestError(Code.UNAUTHENTICATED, "the server did not prove it knows the "
                               f"user's verifier: {exc}") from None


def exchange(creds: Credentials, ask: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """Run the exchange with a blocking `ask(header) -> answer header` (raising
    RequestError on an error answer). False when the server does not authenticate at all
    (a name server: UNKNOWN_OP); RequestError(UNAUTHENTICATED) when refused."""
    ex = Exchange(creds)
    try:
        h = ask(ex.first())
    except RequestError as exc:
        if exc.code == Code.UNKNOWN_OP:
            return False
        raise
    ex.check(ask(ex.final(h.get("msg")))["msg"])
    return True


Lookup = Callable[[str], tuple[bytes, bytes, bytes, int]]
"""A user's (salt, stored key, server key, iterations), as scramp asks for them."""


class LoginFailed(Exception):
    """The client's proof did not match: an unknown user or a wrong password."""

    def __init__(self, user: str) -> None:
        super().__init__(user)
        self.user = user


class ServerLogins:
    """The server side of the two AUTH round trips, for every connection of a server (a
    node, the name server): each connection's exchange waits between its two steps here,
    held weakly by the connection's caller. What a failure costs (a delay, a hang-up, a
    count) is the server's own policy."""

    def __init__(self) -> None:
        self._pending: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = (
            weakref.WeakKeyDictionary())

    @staticmethod
    def step(caller: Any, h: Mapping[str, Any]) -> tuple[str, str]:
        """The request's step ("first" or "final") and message; MALFORMED for anything
        else, or when the connection is logged in already."""
        step, msg = h.get("step"), h.get("msg")
        if not isinstance(msg, str) or step not in ("first", "final"):
            raise RequestError(Code.MALFORMED, "AUTH needs step 'first' or 'final' and msg")
        if caller.principal is not None:
            raise RequestError(Code.MALFORMED, f"already authenticated as {caller.principal!r}")
        return step, msg

    def first(self, caller: Any, msg: str, lookup: Lookup) -> str:
        """Answer the client's first message (the server's first); a RequestError the
        lookup raises (this server cannot check users now) is raised as itself."""
        found: dict[str, str] = {}
        cannot: list[RequestError] = []  # scramp would wrap it

        def looked_up(name: str) -> tuple[bytes, bytes, bytes, int]:
            found["user"] = name
            try:
                return lookup(name)
            except RequestError as exc:
                cannot.append(exc)
                raise

        server = _MECHANISM.make_server(looked_up)
        try:
            server.set_client_first(msg)
            first = server.get_server_first()
        except scramp.ScramException as exc:
            if cannot:
                raise cannot[0] from None
            raise RequestError(Code.MALFORMED, f"AUTH: {exc}") from None
        self._pending[caller] = (server, found.get("user", ""))
        return str(first)

    def final(self, caller: Any, msg: str) -> tuple[str, str]:
        """Check the client's proof: (user, the server's final message), or LoginFailed."""
        pending = self._pending.pop(caller, None)
        if pending is None:
            raise RequestError(Code.MALFORMED, "AUTH step 'final' without a 'first'")
        server, user = pending
        try:
            server.set_client_final(msg)
            return user, str(server.get_server_final())
        except scramp.ScramException:
            raise LoginFailed(user) from None


_MECHANISM = scramp.ScramMechanism(MECHANISM)
