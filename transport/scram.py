"""The client side of SCRAM-SHA-256 authentication (see `broker.security` for the server
and why SCRAM): credentials, where they come from, and the two AUTH round trips over any
request function, so the async pool and the blocking client share one exchange."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import scramp

from broker.protocol import Code, Op, RequestError

__all__ = ["PASSWORD_ENV", "USER_ENV", "Credentials", "credentials_from_env", "exchange"]

USER_ENV = "RAFTMQ_USER"
PASSWORD_ENV = "RAFTMQ_PASSWORD"
MECHANISM = "SCRAM-SHA-256"


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
