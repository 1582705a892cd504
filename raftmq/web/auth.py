"""Who a web request acts as, and the cluster clients that act for them.

HTTP Basic authentication: the request's user name and password become a `Credentials`,
and the request is served by SDK clients on a `ConnectionPool` logged in with exactly
those credentials. So the *nodes* check the password (SCRAM-SHA-256, as for any SDK
client) and the ACLs: the web application holds no user table and decides nothing about
permissions. Basic sends the password in every request: serve the API over TLS
(`raftmq console --tls-cert/--tls-key`) anywhere but loopback.

Logging in costs a SCRAM exchange per node, so each user's clients are kept (a
`UserSession`) and reused by their next requests: at most `max_sessions` users at once,
each closed after `idle_s` seconds unused (or, when the bound is reached, the one unused
the longest). A session is only kept once a node accepted its login, so a wrong password
is a 401 every time and never occupies the cache.

A request without a login acts with `WebSettings.service_credentials`, or with none at
all, which a cluster with authentication refuses (a 401 asking for a login).

`clients_for(request)` is the one way a handler reaches the cluster (the console's
actions use it too); `audit(...)` records every state-changing request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.abc
from starlette.requests import HTTPConnection

from raftmq.client import Admin, Producer, PullConsumer, SimpleConsumer
from raftmq.client.errors import UnavailableError
from transport.connection import ConnectionPool
from transport.scram import Credentials
from wire.protocol import Code, Op, RequestError

from .settings import WebSettings

__all__ = ["LoginRequired", "Sessions", "prove_login", "UserSession", "WebClients", "audit",
           "clients_for", "credentials_of"]

log = logging.getLogger("raftmq.web")
audit_log = logging.getLogger("raftmq.web.audit")

MAX_SESSIONS = 256
IDLE_S = 300.0
MAX_HELD_PER_USER = 32  # simple consumers (one per consumer group) a session keeps open
SWEEP_S = 10.0

C = TypeVar("C", bound=AbstractAsyncContextManager[Any])


class LoginRequired(RequestError):
    """The request's Authorization header is not HTTP Basic, or is malformed (a 401)."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.UNAUTHENTICATED, message)


def credentials_of(request: HTTPConnection, settings: WebSettings) -> Credentials | None:
    """The request's Basic login; without one, the service credentials (or None)."""
    header = request.headers.get("authorization")
    if header is None:
        return settings.service_credentials
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        raise LoginRequired("only HTTP Basic authentication is supported")
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise LoginRequired("the Basic credentials are not base64 of UTF-8") from None
    user, sep, password = decoded.partition(":")
    if not sep or not user:
        raise LoginRequired("the Basic credentials are not 'user:password'")
    return Credentials(user, password)


@dataclass
class WebClients:
    """The SDK clients serving one authenticated user, shared by that user's requests.

    `producer` and `admin` are open and ready; `simple_consumer(group)` opens (once per
    group, then reuses) a `SimpleConsumer`, so messages a long poll brought after its
    request ended are handed to the next `receive`; `pull_consumer(group, ...)` makes an
    unopened `PullConsumer` on the same logged-in connections (use it as
    `async with`, within the request). Everything goes over `pool`, which logged in as
    `user` (None: no login), so the nodes' ACLs apply to all of it.
    """

    user: str | None
    pool: ConnectionPool
    producer: Producer
    admin: Admin
    _session: UserSession = field(repr=False)

    async def simple_consumer(self, group: str) -> SimpleConsumer:
        namesrv = self._session.settings.namesrv
        return await self._session.held(("simple", group),
                                        lambda: SimpleConsumer(namesrv, group, pool=self.pool))

    def pull_consumer(self, group: str, **options: Any) -> PullConsumer:
        return PullConsumer(self._session.settings.namesrv, group, pool=self.pool, **options)


class UserSession:
    """One user's pool and clients, alive in a task of the `Sessions` task group until
    closed (idle, evicted, or the application stopping)."""

    def __init__(self, settings: WebSettings, credentials: Credentials | None) -> None:
        self.settings = settings
        self.credentials = credentials
        self.last_used = time.monotonic()
        self.clients: WebClients | None = None
        self._closing = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._held: dict[tuple[str, str], Any] = {}
        self._held_lock = anyio.Lock()

    async def run(self, *, task_status: anyio.abc.TaskStatus[WebClients]) -> None:
        """Open the clients, prove the login on a node, report ready, then hold them."""
        ns = list(self.settings.namesrv)
        async with (
            ConnectionPool(ssl_context=self.settings.cluster_tls, credentials=self.credentials,
                           env_credentials=False) as pool,
            Producer(ns, pool=pool) as producer,
            Admin(ns, pool=pool) as admin,
        ):
            await prove_login(admin, pool)  # (outside a task group: raised as itself)
            async with anyio.create_task_group() as tg:
                await self._serve(tg, pool, producer, admin, task_status)

    async def _serve(self, tg: anyio.abc.TaskGroup, pool: ConnectionPool, producer: Producer,
                     admin: Admin, task_status: anyio.abc.TaskStatus[WebClients]) -> None:
        self._tg = tg
        self.clients = WebClients(self.credentials.user if self.credentials else None,
                                  pool, producer, admin, self)
        task_status.started(self.clients)
        await self._closing.wait()
        tg.cancel_scope.cancel()

    def close(self) -> None:
        self._closing.set()

    async def held(self, key: tuple[str, str], factory: Callable[[], C]) -> Any:
        """The open client `key` names, opened with `factory` the first time."""
        async with self._held_lock:
            if key in self._held:
                return self._held[key]
            if len(self._held) >= MAX_HELD_PER_USER:
                raise RequestError(Code.BUSY, f"this user already holds {MAX_HELD_PER_USER} "
                                   "consumers open; use fewer consumer groups at once")
            assert self._tg is not None
            obj = await self._tg.start(_hold, factory)
            self._held[key] = obj
            return obj


async def _hold(factory: Callable[[], C], *,
                task_status: anyio.abc.TaskStatus[Any]) -> None:
    async with factory() as obj:
        task_status.started(obj)
        await anyio.sleep_forever()


async def prove_login(admin: Admin, pool: ConnectionPool) -> None:
    """Ask one reachable node for its STATUS (any logged-in user may): the connection's
    SCRAM exchange succeeds or the request fails UNAUTHENTICATED."""
    cluster = await admin.describe_cluster(topics=False)
    addrs = sorted({str(n["addr"]) for n in (cluster.get("nodes") or {}).values()
                    if isinstance(n, dict) and n.get("addr")})
    last: RequestError | None = None
    for addr in addrs:
        try:
            await pool.request(addr, Op.STATUS, {}, timeout=admin.timeout)
            return
        except RequestError as exc:
            if exc.code in (Code.UNAUTHENTICATED, Code.FORBIDDEN):
                raise
            last = exc
    raise UnavailableError(f"no node answered to check the login"
                           f"{f' (last: {last})' if last else ''}")


class Sessions:
    """The cache of `UserSession`s, keyed by user and a hash of the password (a request
    with another password for a known user logs in afresh)."""

    def __init__(self, settings: WebSettings, tg: anyio.abc.TaskGroup, *,
                 max_sessions: int = MAX_SESSIONS, idle_s: float = IDLE_S) -> None:
        self.settings = settings
        self._tg = tg
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._sessions: dict[tuple[str, str], UserSession] = {}
        self._starting: dict[tuple[str, str], anyio.Lock] = {}

    @staticmethod
    def _key(creds: Credentials | None) -> tuple[str, str]:
        if creds is None:
            return ("", "")
        return (creds.user, hashlib.sha256(creds.password.encode()).hexdigest())

    async def clients(self, creds: Credentials | None) -> WebClients:
        key = self._key(creds)
        session = self._sessions.get(key)
        if session is None:
            lock = self._starting.setdefault(key, anyio.Lock())
            async with lock:
                session = self._sessions.get(key)
                if session is None:
                    session = await self._start(key, creds)
            if not lock.locked():
                self._starting.pop(key, None)
        session.last_used = time.monotonic()
        assert session.clients is not None
        return session.clients

    async def _start(self, key: tuple[str, str], creds: Credentials | None) -> UserSession:
        while len(self._sessions) >= self.max_sessions:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_used)
            self._sessions.pop(oldest).close()
        session = UserSession(self.settings, creds)
        await self._tg.start(session.run)
        self._sessions[key] = session
        return session

    async def sweep(self) -> None:
        """Close sessions unused for `idle_s`, forever (run in the application's tasks)."""
        while True:
            await anyio.sleep(min(SWEEP_S, self.idle_s) if math.isfinite(self.idle_s)
                              else SWEEP_S)
            now = time.monotonic()
            for key, s in list(self._sessions.items()):
                if now - s.last_used > self.idle_s:
                    self._sessions.pop(key).close()

    def close_all(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()


async def clients_for(request: HTTPConnection) -> WebClients:
    """The cluster clients acting as the user `request` authenticated as (HTTP Basic;
    no login: the service credentials, or none).

    Raises `RequestError(UNAUTHENTICATED)` when the login is malformed or a node refused
    it (the API answers 401 with `WWW-Authenticate`), and the SDK's errors when the
    cluster cannot be reached. Every request the returned clients make is checked by the
    nodes against that user's ACLs; the console's actions should call this for each
    request rather than keep clients of their own. Records the user in
    `request.state.user` for `audit`."""
    app_state = request.app.state
    settings: WebSettings = app_state.settings
    creds = credentials_of(request, settings)
    request.state.user = creds.user if creds is not None else None
    sessions: Sessions = app_state.sessions
    return await sessions.clients(creds)


def audit(request: HTTPConnection, action: str, target: str, result: str,
          **details: Any) -> None:
    """One JSON line per state-changing request: to the audit log file
    (`WebSettings.audit_log`, appended) and to the `raftmq.web.audit` logger."""
    settings: WebSettings = request.app.state.settings
    user = getattr(request.state, "user", None)
    line = json.dumps({"ts": round(time.time(), 3), "user": user, "action": action,
                       "target": target, "result": result, **details},
                      separators=(",", ":"), default=str)
    audit_log.info("%s", line)
    if settings.audit_log is not None:
        with open(settings.audit_log, "a", encoding="utf-8") as f:
            f.write(line + "\n")
