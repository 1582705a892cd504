"""The security workload of `raftmq chaos run --workload security`: users and ACLs changed
under faults while test users log in and publish or subscribe through every node.

The cluster runs with `authenticate` and `authorize` on and one bootstrap superuser
(`harness_superuser`), whose login every other client of the harness uses (queue and
transactional workloads, nemesis admin calls, probes, the drain: `harness_login` puts it
in the environment the SDK reads). The records are those `chaos.authcheck` describes:

- one admin process makes changes one after the other, each to the leader of the
  metadata group (found by trying the nodes in turn): a user created or given a new
  password (``user-put``; every password is new), a user removed, an ACL entry added or
  removed. Each node is first asked its STATUS on the connection the change will take,
  so a node that is down is passed over before anything is sent. A change refused
  before anything was proposed (this node does not lead, or is not reachable) is tried
  on the next node; refused by all, it is ``fail``. Any other error, timeouts included,
  is ``info``: the proposal may still be applied;
- client processes log in as a test user (or as ``mallory``, never created) with its
  current password, an older one or one never set, against a random node (``login``),
  or make a request needing publish (PRODUCE) or subscribe (FETCH) on a topic
  (``authz``), after logging in with a STATUS (a login the node could not complete is
  no authorization outcome). The node's guard answers before the request's own handler,
  so an answer only the handler gives means the ACLs allowed it (the topics need not
  exist: nothing is stored); FORBIDDEN means they did not; a code the guard shares with
  the handler (UNKNOWN_GROUP: the node holds no metadata replica) is unknown;
- after the final heal (`drain`), the admin adds one more entry (a barrier) and every
  node's users and ACLs are read until all nodes that hold a replica of the metadata group
  agree and hold it (a shard that holds none answers UNKNOWN_GROUP and is left out), so
  each has applied every change (``sec-final``, the last reads count); every user then
  logs in on every node with its last passwords. The admin gives every test user a new password, the
  nodes settle again, and every test user logs in and probes every topic through every
  node (``final``: judged against the state every node then holds).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from collections.abc import Iterator
from typing import Any

import trio

from transport.connection import ConnectionPool
from transport.errors import TransportError
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials
from wire.protocol import Code, Op, RequestError
from wire.records import encode_batch
from wire.requests.base import WireType
from wire.requests.produce import ProduceRequest
from wire.requests.security import (
    AclAddRequest,
    AclListRequest,
    AclRemoveRequest,
    UserDeleteRequest,
    UserListRequest,
    UserPutRequest,
)
from wire.security import format_verifier, make_credential

from .attackers import Attackers
from .recorder import Recorder

__all__ = ["GHOST", "SUPERUSER", "TOPICS", "USERS", "SecurityWorkload", "harness_login",
           "harness_superuser"]

SUPERUSER = "chaos-admin"
USERS = ("alice", "bob", "carol")
GHOST = "mallory"  # never created: no login of it may succeed
TOPICS = ("sec-a", "sec-b", "other")  # the ACLs name sec-a, sec-b and the prefix sec-
_REQUEST_TIMEOUT = 3.0
_UNKNOWN_CODES = frozenset({Code.TIMEOUT, Code.CONNECTION_LOST, Code.UNAVAILABLE, Code.BUSY})
# Codes the guard itself may answer besides FORBIDDEN and UNAUTHENTICATED (a node that holds
# no replica of the metadata group cannot check anyone, `broker.doors.security.Guard`), which the
# PRODUCE handler gives too: such an answer says nothing about the ACLs.
_GUARD_OR_HANDLER_CODES = frozenset({Code.UNKNOWN_GROUP, Code.MALFORMED})
#: A final read's answer from a node that holds no replica of the metadata group.
_NO_REPLICA = "no replica of the metadata group"


def harness_superuser() -> tuple[Credentials, dict[str, Any]]:
    """A fresh superuser password and the node config keys that make it the bootstrap
    superuser of a cluster with logins and ACLs on."""
    creds = Credentials(SUPERUSER, secrets.token_hex(16))
    return creds, {"authenticate": True, "authorize": True, "superusers": [SUPERUSER],
                   "superuser_scram": format_verifier(make_credential(creds.password))}


@contextlib.contextmanager
def harness_login(creds: Credentials) -> Iterator[None]:
    """Every client this process (and the workers it starts) opens logs in as `creds`
    while inside: the SDK's pools and blocking requests read RAFTMQ_USER/PASSWORD."""
    saved = {k: os.environ.get(k) for k in (USER_ENV, PASSWORD_ENV)}
    os.environ[USER_ENV], os.environ[PASSWORD_ENV] = creds.user, creds.password
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def acl_universe() -> list[list[str]]:
    """The entries the admin adds and removes: every test user and `*`, literal sec-a and
    sec-b and the prefix sec-, publish and subscribe, allow and deny."""
    out = []
    for principal in (*USERS, "*"):
        for pattern, name in (("literal", "sec-a"), ("literal", "sec-b"), ("prefix", "sec-")):
            for operation in ("publish", "subscribe"):
                for permission in ("allow", "deny"):
                    out.append([principal, "topic", pattern, name, operation, permission])
    return out


def _definite_refusal(exc: BaseException) -> bool:
    """Whether a change's request certainly proposed nothing: this node does not lead
    (NOT_LEADER without ``unknown``: a proposal appended before leadership was lost is
    answered with it set), holds no metadata replica, or the connection never opened."""
    if isinstance(exc, TransportError):
        return not exc.sent
    if isinstance(exc, RequestError):
        return (exc.code == Code.UNKNOWN_GROUP
                or (exc.code == Code.NOT_LEADER and not exc.extra.get("unknown")))
    return False


class SecurityWorkload:
    """See the module docstring; `run` then `drain`, like `chaos.workload.Workload`."""

    def __init__(self, nodes: dict[int, str], metadata_group: str, *, recorder: Recorder,
                 rng: random.Random, clients: int = 2) -> None:
        self.nodes = dict(sorted(nodes.items()))
        self.metadata_group = metadata_group
        self.recorder = recorder
        self.rng = rng
        self.clients = clients
        self.acls = acl_universe()
        self.current: dict[str, str | None] = {}  # user -> acknowledged password (None: removed)
        self.passwords: dict[str, list[str]] = {}  # user -> every password ever put
        self.present: set[tuple[str, ...]] = set()  # entries whose add was acknowledged
        self.converged: bool | None = None  # whether the final reads agreed (after drain)
        self._leader = 0  # index into the node list of the last node that took a change
        self.attackers: Attackers | None = None  # `chaos.attackers`, beside the clients
        self._seq = 0

    # ------------------------------------------------------------------ run

    async def run(self, stop_at: float) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._admin, stop_at)
            if self.attackers is not None:
                nursery.start_soon(self.attackers.run, stop_at)
            for i in range(self.clients):
                nursery.start_soon(self._client, f"sec-client-{i + 1}", stop_at)

    async def _admin(self, stop_at: float) -> None:
        rng = self.rng
        async with ConnectionPool() as pool:  # the harness's superuser (`harness_login`)
            while time.monotonic() < stop_at:
                roll = rng.random()
                user = rng.choice(USERS)
                if roll < 0.3:
                    await self._user_put(pool, user)
                elif roll < 0.38:
                    await self._change(pool, "user-remove", user, None,
                                       UserDeleteRequest(user=user))
                elif roll < 0.72:
                    # mostly allows: deny wins, so a few denies already refuse most requests
                    wanted = "allow" if rng.random() < 0.8 else "deny"
                    await self._acl(pool, "add", rng.choice(
                        [a for a in self.acls if a[5] == wanted]))
                else:
                    known = sorted(self.present)
                    acl = list(rng.choice(known)) if known and rng.random() < 0.8 else (
                        rng.choice(self.acls))
                    await self._acl(pool, "remove", acl)
                await trio.sleep(rng.uniform(0.0, 0.05))

    async def _user_put(self, pool: ConnectionPool, user: str) -> None:
        self._seq += 1
        password = f"{user}-{self._seq}-{self.rng.getrandbits(32):08x}"
        self.passwords.setdefault(user, []).append(password)
        c = make_credential(password)
        await self._change(pool, "user-put", user, {"password": password},
                           UserPutRequest.of(user, c))

    async def _acl(self, pool: ConnectionPool, what: str, acl: list[str]) -> None:
        kind = AclAddRequest if what == "add" else AclRemoveRequest
        await self._change(pool, f"acl-{what}", "/".join(acl), acl, kind.of(acl))

    async def _change(self, pool: ConnectionPool, f: str, key: str, value: Any,
                      req: WireType) -> None:
        rec = self.recorder
        process = "sec-admin"
        rec.invoke(process, f, key, value)
        addrs = list(self.nodes.values())
        last: BaseException | None = None
        for i in range(len(addrs)):
            at = (self._leader + i) % len(addrs)
            try:  # a link that is up and logged in first: a dead node is a definite no
                await pool.request(addrs[at], Op.STATUS, {}, timeout=_REQUEST_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - the change was not sent
                last = exc
                continue
            try:
                frame = await pool.request(addrs[at], req.OP, req.header(),
                                           timeout=_REQUEST_TIMEOUT)
            except (RequestError, TransportError) as exc:
                if _definite_refusal(exc):
                    last = exc
                    continue
                self._leader = at + 1  # next time, another node first
                rec.complete(process, "info", f, key, {"error": str(exc)})
                return
            except Exception as exc:  # noqa: BLE001 - a proposal may have been made
                self._leader = at + 1
                rec.complete(process, "info", f, key, {"error": repr(exc)})
                return
            except BaseException:
                rec.complete(process, "info", f, key, {"error": "cancelled"})
                raise
            self._leader = at
            fields = {k: v for k, v in frame.header.items() if k not in ("id", "code")}
            rec.complete(process, "ok", f, key, fields)
            self._acknowledged(f, key, value)
            return
        rec.complete(process, "fail", f, key, {"error": str(last)})

    def _acknowledged(self, f: str, key: str, value: Any) -> None:
        if f == "user-put":
            self.current[key] = value["password"]
        elif f == "user-remove":
            self.current[key] = None
        elif f == "acl-add":
            self.present.add(tuple(value))
        else:
            self.present.discard(tuple(value))

    async def _client(self, process: str, stop_at: float) -> None:
        rng = self.rng
        while time.monotonic() < stop_at:
            node = rng.choice(list(self.nodes))
            if rng.random() < 0.4:
                user = GHOST if rng.random() < 0.2 else rng.choice(USERS)
                await self.login(process, user, self._pick_password(user), node)
            else:
                user = rng.choice(USERS)
                await self.authz(process, user, self._password(user), node,
                                 rng.choice(TOPICS), rng.choice(("publish", "subscribe")))
            await trio.sleep(rng.uniform(0.02, 0.1))

    def some_login(self) -> Credentials:
        """A test user's login as the workload knows it now (it may have been removed)."""
        user = self.rng.choice(USERS)
        return Credentials(user, self._password(user))

    def _password(self, user: str) -> str:
        """The user's acknowledged password, else the last one asked for, else a guess."""
        return self.current.get(user) or (self.passwords.get(user) or ["never-set"])[-1]

    def _pick_password(self, user: str) -> str:
        roll = self.rng.random()
        if roll < 0.5:
            return self._password(user)
        if roll < 0.75 and self.passwords.get(user):
            return self.rng.choice(self.passwords[user])
        self._seq += 1
        return f"wrong-{self._seq}"

    # ------------------------------------------------------------------ probes

    async def login(self, process: str, user: str, password: str, node: int, *,
                    final: bool = False) -> None:
        """Log in as `user` on `node` (then ask its STATUS, which any user may)."""
        rec = self.recorder
        rec.invoke(process, "login", user, {"node": node, "password": password, "final": final})
        try:
            async with ConnectionPool(credentials=Credentials(user, password)) as pool:
                await pool.request(self.nodes[node], Op.STATUS, {}, timeout=_REQUEST_TIMEOUT)
        except RequestError as exc:
            kind = "fail" if exc.code == Code.UNAUTHENTICATED else "info"
            rec.complete(process, kind, "login", user, {"error": str(exc)})
            return
        except Exception as exc:  # noqa: BLE001 - whether it logged in is unknown
            rec.complete(process, "info", "login", user, {"error": repr(exc)})
            return
        except BaseException:
            rec.complete(process, "info", "login", user, {"error": "cancelled"})
            raise
        rec.complete(process, "ok", "login", user)

    async def authz(self, process: str, user: str, password: str, node: int, topic: str,
                    operation: str, *, final: bool = False) -> None:
        """As `user`, a request needing `operation` on `topic`, made on `node`."""
        rec = self.recorder
        rec.invoke(process, "authz", user, {"node": node, "topic": topic,
                                            "operation": operation, "final": final})
        header: dict[str, Any]
        if operation == "publish":
            op, header = Op.PRODUCE, ProduceRequest(g=self.metadata_group).header()
            body = bytes(encode_batch(topic, 0, [b"security probe"]))
        else:
            op, header, body = Op.FETCH, {"topic": topic, "queue": 0, "offset": 0, "max": 1,
                                          "max_bytes": 1 << 16, "wait_ms": 0}, b""
        logged_in = False
        try:
            async with ConnectionPool(credentials=Credentials(user, password)) as pool:
                # Log in first, with a request any user may make: a login refused for any
                # reason (UNKNOWN_GROUP from a node whose metadata replica was just moved
                # away, among others) is then never mistaken for the guard letting the
                # operation through.
                await pool.request(self.nodes[node], Op.STATUS, {}, timeout=_REQUEST_TIMEOUT)
                logged_in = True
                await pool.request(self.nodes[node], op, header, body, timeout=_REQUEST_TIMEOUT)
        except RequestError as exc:
            if not logged_in:
                kind = "fail" if exc.code == Code.UNAUTHENTICATED else "info"
                rec.complete(process, kind, "authz", user, {"error": str(exc)})
            elif exc.code == Code.FORBIDDEN:
                rec.complete(process, "fail", "authz", user, {"denied": True, "error": str(exc)})
            elif exc.code == Code.UNAUTHENTICATED:
                rec.complete(process, "fail", "authz", user, {"error": str(exc)})
            elif exc.code in _UNKNOWN_CODES or exc.code in _GUARD_OR_HANDLER_CODES:
                rec.complete(process, "info", "authz", user, {"error": str(exc)})
            else:  # only the handler gives this code: the guard let the request through
                rec.complete(process, "ok", "authz", user, {"code": int(exc.code)})
            return
        except Exception as exc:  # noqa: BLE001 - no answer: unknown
            rec.complete(process, "info", "authz", user, {"error": repr(exc)})
            return
        except BaseException:
            rec.complete(process, "info", "authz", user, {"error": "cancelled"})
            raise
        rec.complete(process, "ok", "authz", user, {"code": "OK"})

    # ------------------------------------------------------------------ after the heal

    async def drain(self, timeout: float) -> bool:
        """After the heal: settle (below), log in as every user (and `mallory`) on every
        node with its last passwords, judged against the state the run left; then give
        every test user a new password, settle again, and log in and probe every topic
        on every node (so the probes have users to log in as). Returns True: reading
        queues to their end is not this workload's part; `converged` says whether the
        nodes settled both times (the checker judges what they hold).

        To settle is to add a barrier (one more ACL entry: `admin` on a topic nobody
        probes) and read every node's users and ACLs until all agree and hold it: a node
        that applied it applied every change before it, password changes included, which
        the lists cannot show."""
        deadline = time.monotonic() + timeout
        process = "sec-final"
        async with ConnectionPool() as pool:
            settled = await self._settle(pool, deadline)
            await self._final_logins(process)
            for user in USERS:  # every test user exists again, with a new password
                await self._user_put(pool, user)
            settled = await self._settle(pool, deadline) and settled
        await self._final_logins(process)
        for node in self.nodes:
            for user in USERS:
                for topic in TOPICS:
                    for operation in ("publish", "subscribe"):
                        await self.authz(process, user, self._password(user), node, topic,
                                         operation, final=True)
        self.converged = settled
        return True

    async def _final_logins(self, process: str) -> None:
        for node in self.nodes:
            for user in (*USERS, GHOST):
                tried = {self._password(user), *self.passwords.get(user, [])[-2:]}
                for password in sorted(tried):
                    await self.login(process, user, password, node, final=True)

    async def _settle(self, pool: ConnectionPool, deadline: float) -> bool:
        """Add a barrier and read every node until the nodes that hold a replica of the
        metadata group all hold it and agree. A node that holds none (a shard of a host
        that the group's replicas are not on) is left out: it has nothing to settle."""
        barrier = await self._barrier(pool, deadline)
        while True:
            reads = [await self._final_read(pool, node) for node in self.nodes]
            held = [r for r in reads if r is not _NO_REPLICA]
            if (held and all(isinstance(r, dict) and (barrier is None or barrier in r["acls"])
                             for r in held)
                    and all(r == held[0] for r in held)):
                return barrier is not None
            if time.monotonic() >= deadline:
                return False
            await trio.sleep(0.5)

    async def _barrier(self, pool: ConnectionPool, deadline: float) -> list[str] | None:
        """An ACL entry of its own, added until an add is acknowledged (None: not
        before `deadline`)."""
        while time.monotonic() < deadline:
            self._seq += 1
            acl = ["*", "topic", "literal", f"sec-barrier-{self._seq}", "admin", "allow"]
            await self._acl(pool, "add", acl)
            if tuple(acl) in self.present:
                return acl
            await trio.sleep(0.5)
        return None

    async def _final_read(self, pool: ConnectionPool, node: int
                          ) -> dict[str, Any] | str | None:
        """The node's users and ACLs; `_NO_REPLICA` when it holds no replica of the
        metadata group, None when the read failed otherwise."""
        rec = self.recorder
        rec.invoke("sec-final", "sec-final", node, None)
        try:
            users = await pool.request(self.nodes[node], Op.USER_LIST,
                                       UserListRequest().header(), timeout=_REQUEST_TIMEOUT)
            acls = await pool.request(self.nodes[node], Op.ACL_LIST,
                                      AclListRequest().header(), timeout=_REQUEST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a read that failed says nothing
            rec.complete("sec-final", "fail", "sec-final", node, {"error": str(exc)})
            if isinstance(exc, RequestError) and exc.code == Code.UNKNOWN_GROUP:
                return _NO_REPLICA
            return None
        read = {"users": users.header.get("users"), "acls": acls.header.get("acls")}
        rec.complete("sec-final", "ok", "sec-final", node, read)
        return read
