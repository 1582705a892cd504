"""A node that holds no replica of the metadata group (a membership change moved it away)
still takes the configured superuser's login, checked against its own config, so an
operator can host the group there again; every other login is refused with
UNKNOWN_GROUP, as before, since only that group's replica knows the users.

Found by `raftmq chaos run --workload all --nemesis membership`: with logins on, a node
removed from the metadata group could not be added back (its HOST_GROUP needs a login
there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import scramp
import trio

from broker.config import NodeConfig
from broker.doors.security import MECHANISM, Guard, make_credential
from broker.state.parts.users import format_verifier
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError


class Bare:
    """A node hosting no group at all (so no metadata replica)."""

    def __init__(self, tmp: Path, *, bootstrap: bool) -> None:
        keys: dict[str, Any] = {"authenticate": True, "authorize": True, "superusers": ["root"],
                                "cluster_secret": "this test node's own secret"}
        if bootstrap:
            keys["superuser_scram"] = format_verifier(make_credential("root-pw"))
        self.config = NodeConfig.from_dict({
            "node_id": 1, "listen": "127.0.0.1:7101", "data": str(tmp),
            "peers": {1: "127.0.0.1:7101"}, "groups": [{"id": "g0", "replicas": [1]}], **keys})
        self.groups: dict[str, Any] = {}
        self.refusals: list[str] = []

    def peer_addr(self, node: int | None) -> str | None:
        return None

    def count_refusal(self, reason: str) -> None:
        self.refusals.append(reason)


def login(guard: Guard, user: str, password: str) -> Caller:
    """The whole SCRAM exchange against `guard`; the caller, logged in (or RequestError)."""
    caller = Caller("test")
    client = scramp.ScramClient([MECHANISM], user, password)

    async def ask(header: dict[str, Any]) -> dict[str, Any]:
        async def unreachable(_c: Caller, _f: Any) -> None:
            raise AssertionError("AUTH is answered by the guard")
        from wire.protocol import Frame
        answered = await guard.wrap(unreachable)(caller, Frame({**header, "id": 1}, b""))
        assert answered is not None
        return answered[0]

    async def main() -> None:
        first = await ask({"op": int(Op.AUTH), "step": "first", "msg": client.get_client_first()})
        client.set_server_first(first["msg"])
        final = await ask({"op": int(Op.AUTH), "step": "final", "msg": client.get_client_final()})
        client.set_server_final(final["msg"])

    trio.run(main)
    return caller


def test_the_configured_superuser_logs_in_where_no_metadata_replica_is(tmp_path: Path) -> None:
    guard = Guard(Bare(tmp_path, bootstrap=True))
    assert login(guard, "root", "root-pw").principal == "root"
    with pytest.raises(RequestError) as wrong:
        login(guard, "root", "guess")
    assert wrong.value.code == Code.UNAUTHENTICATED
    with pytest.raises(RequestError) as other:  # a stored user: only the group knows it
        login(guard, "alice", "alice-pw")
    assert other.value.code == Code.UNKNOWN_GROUP and "metadata group" in other.value.message


def test_without_a_configured_verifier_nobody_logs_in_there(tmp_path: Path) -> None:
    guard = Guard(Bare(tmp_path, bootstrap=False))
    for user in ("root", "alice"):
        with pytest.raises(RequestError) as refused:
            login(guard, user, "pw")
        assert refused.value.code == Code.UNKNOWN_GROUP
