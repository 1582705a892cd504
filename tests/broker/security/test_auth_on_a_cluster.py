"""Client authentication on a real three-node cluster: SCRAM-SHA-256 before any request,
users stored as verifiers in the metadata group's log (every node agrees), a bootstrap
superuser from the node config, `raftmq user add|remove|list`; refusals are clear,
change nothing and are counted."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from raftmq.client import Admin
from raftmq.commands import user as user_cmd
from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders
from tests.live_cluster import scrape_metrics
from transport.blocking import Connection, request
from transport.connection import ConnectionPool
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live

ADMIN = Credentials("admin", "the admin's long password")
ALICE = Credentials("alice", "alice's password")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    verifier = format_verifier(make_credential(ADMIN.password))
    keys = {"authenticate": True, "superusers": ["admin"], "superuser_scram": verifier}
    with LocalCluster(tmp_path_factory.mktemp("auth"), nodes=3, groups=2, tick_ms=50,
                      node_overrides=keys, credentials=ADMIN) as c:
        steady_leaders(c)  # `raftmq user` below meets no hand-over
        yield c


def refused(c: LocalCluster, node: int, reason: str) -> float:
    addr = c.configs[node - 1].metrics
    assert addr is not None
    return scrape_metrics(addr).get(f'raftmq_connections_refused_total{{reason="{reason}"}}', 0)


def as_user(monkeypatch: pytest.MonkeyPatch, creds: Credentials) -> None:
    monkeypatch.setenv(USER_ENV, creds.user)
    monkeypatch.setenv(PASSWORD_ENV, creds.password)


def run_user(monkeypatch: pytest.MonkeyPatch, c: LocalCluster, tmp_path: Path, *args: str,
             password: str | None = None) -> int:
    as_user(monkeypatch, ADMIN)
    extra: list[str] = []
    if password is not None:
        f = tmp_path / "pw"
        f.write_text(password + "\n")
        extra = ["--password-file", str(f)]
    return user_cmd.main([*args, *extra, "--namesrv", c.namesrv_addr])


def test_a_request_before_authenticating_is_refused(cluster: LocalCluster) -> None:
    before = refused(cluster, 1, "unauthenticated")
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(1), {"op": int(Op.STATUS)})
    assert info.value.code == Code.UNAUTHENTICATED and "authenticate first" in info.value.message
    assert refused(cluster, 1, "unauthenticated") == before + 1


@pytest.mark.parametrize("creds", [Credentials("admin", "a guess"), Credentials("mallory", "x")])
def test_a_wrong_password_or_unknown_user_is_refused_alike(cluster: LocalCluster,
                                                           creds: Credentials) -> None:
    before = refused(cluster, 2, "auth")
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(2), {"op": int(Op.STATUS)}, credentials=creds)
    assert info.value.code == Code.UNAUTHENTICATED
    assert info.value.message == "authentication failed: unknown user or wrong password"
    assert refused(cluster, 2, "auth") == before + 1


def test_a_failed_login_ends_the_connection(cluster: LocalCluster) -> None:
    """One guess per connection: after the refusal the node closes it."""
    import scramp

    from wire.protocol import FrameDecoder, encode_frame

    host, port = cluster.node_addr(1).rsplit(":", 1)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "admin", "a guess")
    dec = FrameDecoder(1 << 20)

    with socket.create_connection((host, int(port)), timeout=10) as s:
        def ask(header: dict[str, object]) -> dict[str, object]:
            s.sendall(encode_frame(header))
            while (frame := dec.next_frame()) is None:
                data = s.recv(65536)
                assert data, "closed before answering"
                dec.feed(data)
            return frame.header

        first = ask({"op": int(Op.AUTH), "id": 1, "step": "first",
                     "msg": client.get_client_first()})
        client.set_server_first(str(first["msg"]))
        final = ask({"op": int(Op.AUTH), "id": 2, "step": "final",
                     "msg": client.get_client_final()})
        assert final["code"] == Code.UNAUTHENTICATED
        assert s.recv(65536) == b""  # then the node hangs up


def test_users_are_added_replicated_used_and_removed(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_user(monkeypatch, cluster, tmp_path, "add", "alice", password=ALICE.password) == 0
    assert run_user(monkeypatch, cluster, tmp_path, "list") == 0
    assert "alice" in capsys.readouterr().out.split()
    deadline = time.monotonic() + 20
    for node in cluster.node_ids:  # each node checks the proof against its own replica
        while True:
            try:
                h, _ = request(cluster.node_addr(node), {"op": int(Op.STATUS)},
                               credentials=ALICE)
                break
            except RequestError:
                assert time.monotonic() < deadline, f"node {node} never knew alice"
                time.sleep(0.1)
        assert h["node"] == node
    # stored as a verifier only: the password is nowhere in any node's files
    for path in cluster.base_dir.rglob("*"):
        if path.is_file() and path.suffix != ".log":
            assert ALICE.password.encode() not in path.read_bytes(), path
    # a user who is not a superuser may not manage users
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(1), {"op": int(Op.USER_LIST)}, credentials=ALICE)
    assert info.value.code == Code.FORBIDDEN

    async def produce() -> None:  # the SDK logs every connection in
        async with ConnectionPool(credentials=ALICE) as pool, \
                Admin(cluster.namesrv_addr, pool=pool) as admin:
            await admin.create_topic("authed", queues=1)

    trio.run(produce)
    assert run_user(monkeypatch, cluster, tmp_path, "remove", "alice") == 0
    leader = cluster.leaders()["g0"]  # the metadata group: applied there before the answer
    assert leader is not None
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(leader), {"op": int(Op.STATUS)}, credentials=ALICE)
    assert info.value.code == Code.UNAUTHENTICATED


def test_user_commands_need_a_superuser_and_valid_names(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_user(monkeypatch, cluster, tmp_path, "add", "bad name!", password="x") == 2
    assert "user name" in capsys.readouterr().err
    monkeypatch.delenv(USER_ENV)
    assert user_cmd.main(["list", "--namesrv", cluster.namesrv_addr]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_status_without_a_login_says_one_is_needed_not_that_nodes_are_down(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from raftmq.commands import status as status_cmd

    monkeypatch.delenv(USER_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # the status cell on one line, whatever the terminal
    for json_flag in ([], ["--json"]):  # the name server itself answers nothing without one
        assert status_cmd.main([*json_flag, "--namesrv", cluster.namesrv_addr]) == 1
        out, err = capsys.readouterr()
        assert out == "" and "down" not in err, (out, err)
        assert "needs a login" in err and "raftmq --user NAME" in err, err
    as_user(monkeypatch, ADMIN)  # logged in: every node is up
    assert status_cmd.main(["--json", "--namesrv", cluster.namesrv_addr]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert all(n["reachable"] and not n["login_needed"] for n in nodes.values())
    monkeypatch.setenv(PASSWORD_ENV, "not the password")  # a wrong password says so
    assert status_cmd.main(["--namesrv", cluster.namesrv_addr]) == 1
    assert "login as 'admin' was refused" in capsys.readouterr().err


def test_a_removed_users_open_connection_is_closed_and_new_ones_are_refused(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the README's guarantees say: a node closes the open connections of a user as
    it applies the user's removal, and a request that comes first is refused, since every
    request checks that its connection's user still exists in the node's own replica."""
    bob = Credentials("bob", "bob's password")
    assert run_user(monkeypatch, cluster, tmp_path, "add", "bob", password=bob.password) == 0
    leader = cluster.leaders()["g0"]  # the metadata group: applied there before the answer
    assert leader is not None
    with Connection(cluster.node_addr(leader), credentials=bob, timeout=10) as conn:
        assert conn.request({"op": int(Op.STATUS)})[0]["node"] == leader
        assert run_user(monkeypatch, cluster, tmp_path, "remove", "bob") == 0
        with pytest.raises(RequestError) as info:
            request(cluster.node_addr(leader), {"op": int(Op.STATUS)}, credentials=bob)
        assert info.value.code == Code.UNAUTHENTICATED
        for _ in range(2):  # refused while it lasts (the close may come first), then closed
            try:
                conn.request({"op": int(Op.STATUS)})
            except RequestError as exc:
                assert exc.code == Code.UNAUTHENTICATED and "was removed" in exc.message
            except OSError:
                break
        else:  # not closed yet: it is, without another request
            sock = conn._sock
            assert sock is not None
            sock.settimeout(30)
            with contextlib.suppress(ConnectionError):
                assert sock.recv(1) == b""


@pytest.mark.parametrize("change", ["remove and add again", "new password"])
def test_a_login_holds_only_while_its_user_keeps_the_password_it_proved(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        change: str) -> None:
    """A user removed and added again (even in one batch, with the same password) is a
    new user, and a changed password revokes what the old one let in: the open
    connection's requests are refused or it is closed; a new login works."""
    carol = Credentials(f"carol-{len(change)}", "carol's password")
    assert run_user(monkeypatch, cluster, tmp_path, "add", carol.user,
                    password=carol.password) == 0
    leader = cluster.leaders()["g0"]
    assert leader is not None
    with Connection(cluster.node_addr(leader), credentials=carol, timeout=10) as conn:
        assert conn.request({"op": int(Op.STATUS)})[0]["node"] == leader
        new = carol
        if change == "new password":
            new = Credentials(carol.user, "carol's new password")
        else:
            assert run_user(monkeypatch, cluster, tmp_path, "remove", carol.user) == 0
        assert run_user(monkeypatch, cluster, tmp_path, "add", carol.user,
                        password=new.password) == 0
        try:
            conn.request({"op": int(Op.STATUS)})
        except RequestError as exc:
            assert exc.code == Code.UNAUTHENTICATED and "password changed" in exc.message
        except OSError:
            pass  # closed as the change was applied
        else:
            raise AssertionError("the old login still held")
    assert request(cluster.node_addr(leader), {"op": int(Op.STATUS)},
                   credentials=new)[0]["node"] == leader
