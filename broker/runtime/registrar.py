"""The name-server registrar: a node's groups registered with every name server.

Every `register_interval`, and at once when woken (a leader change, a topic change), the
node's registration goes to each name server in its own task, so a dead one delays no
other. A registration carries each group's role, term and replicas, and its topic table:
whole to a name server that holds none of it, else only the changes since the version it
acknowledged (`TopicTableLog`), so a heartbeat of 100,000 unchanged topics is a few
hundred bytes. A name server that lost track answers `resend` and gets the whole table.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import trio

from broker.state.statemachine import TopicConfig
from transport.framing import open_frame_stream
from wire.protocol import Code, Op, RequestError
from wire.requests.namesrv import (
    RegisterAnswer,
    RegisterAuth,
    RegisterGroup,
    RegisterRequest,
    RegisterTable,
    shapes_of,
)

__all__ = ["REGISTER_TIMEOUT", "GroupsView", "Registrar", "TopicTableLog"]

log = logging.getLogger("raftmq.node")

#: Seconds one name server gets per registration round (a whole table of 100,000 topics
#: takes it a fraction of a second; a heartbeat of changes, milliseconds).
REGISTER_TIMEOUT = 10.0

#: What the node tells about itself at each registration: its own fields (node, addr,
#: metrics, host), and per group the fields of its registration and its current topic table.
GroupsView = Callable[
    [], tuple[dict[str, Any], Mapping[str, tuple[dict[str, Any], dict[str, TopicConfig]]]]
]


class TopicTableLog:
    """One group's topic table as last registered, its version and its recent changes,
    so a registration carries only what changed since the version a name server holds
    (a heartbeat of 100,000 unchanged topics is then a few hundred bytes)."""

    KEEP = 64  # versions of changes kept; a name server further behind gets the whole table

    def __init__(self) -> None:
        self.version = 0
        self.table: dict[str, TopicConfig] = {}
        self._log: deque[tuple[int, dict[str, TopicConfig], list[str]]] = deque(maxlen=self.KEEP)

    def update(self, current: dict[str, TopicConfig]) -> int:
        """Take `current` (a copy the log may keep) as the table; a new version if it
        differs from the last. Returns the version."""
        prev = self.table
        changed = {n: c for n, c in current.items()
                   if (o := prev.get(n)) is not c and o != c}
        added = sum(1 for n in changed if n not in prev)
        # nothing was removed when the count adds up (the common case: skip the scan)
        removed = ([] if len(prev) + added == len(current)
                   else [n for n in prev if n not in current])
        if changed or removed:
            self.version += 1
            self._log.append((self.version, changed, removed))
        self.table = current
        return self.version

    def changes_since(self, base: int) -> tuple[dict[str, TopicConfig], list[str]] | None:
        """(changed or added, removed) from version `base` to now; None when the log no
        longer reaches back that far (or `base` is not a version of this log)."""
        if base == self.version:
            return {}, []
        if base > self.version or not self._log or self._log[0][0] > base + 1:
            return None
        changed: dict[str, TopicConfig] = {}
        removed: set[str] = set()
        for version, ch, rm in self._log:
            if version <= base:
                continue
            for n in rm:
                changed.pop(n, None)
                removed.add(n)
            for n, c in ch.items():
                removed.discard(n)
                changed[n] = c
        return changed, sorted(removed)


class Registrar:
    """Registers a node with its name servers; `wake` asks for a registration now."""

    def __init__(self, namesrv: Sequence[str], interval: float, view: GroupsView, *,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._namesrv = list(namesrv)
        self._ssl = ssl_context  # name servers are dialled over TLS with it
        self._interval = interval
        self._view = view
        self._now = trio.Event()
        # table versions count within this incarnation of the node
        self._incarnation = random.getrandbits(62)
        self._tables: dict[str, TopicTableLog] = {}
        self._ns_acked: dict[str, dict[str, int]] = {}  # name server -> group -> version

    def wake(self) -> None:
        self._now.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self._interval):
                await self._now.wait()
                await trio.sleep(0.02)  # coalesce a burst of changes
            self._now = trio.Event()
            request = self.request()
            async with trio.open_nursery() as nursery:  # a dead name server delays no other
                for ns in self._namesrv:
                    nursery.start_soon(self._register_with, ns, request)

    async def _register_with(self, ns: str, request: RegisterRequest) -> None:
        """REGISTER with one name server: each group's topic table changes since the version
        it acknowledged, or whole when it holds none (or asks with `resend`)."""
        acked = self._ns_acked.setdefault(ns, {})
        with trio.move_on_after(REGISTER_TIMEOUT):
            try:
                fs = await open_frame_stream(ns, ssl_context=self._ssl)
                async with fs:
                    for rid in (1, 2):  # the second round answers a `resend`
                        req, body, sent = self._registration_for(request, acked)
                        await fs.send({"op": Op.REGISTER, "id": rid, **req.header()}, body)
                        frame = await fs.receive()
                        if frame is None:
                            return
                        ok, error = frame.header.get("code") == Code.OK, frame.header.get("msg")
                        resend: tuple[str, ...] = ()
                        if ok:
                            try:
                                resend = RegisterAnswer.decode(frame.header).resend
                            except RequestError as exc:
                                ok, error = False, f"a malformed answer: {exc.message}"
                        if not ok:
                            log.warning("name server refused the registration", extra={
                                "fields": {"namesrv": ns, "error": error}})
                            acked.clear()  # start over with whole tables
                            return
                        for gid, version in sent.items():
                            if gid in resend:
                                acked.pop(gid, None)
                            else:
                                acked[gid] = version
                        if not resend:
                            return
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                log.debug("name server unreachable", extra={"fields": {"namesrv": ns}})

    def _registration_for(
        self, request: RegisterRequest, acked: dict[str, int]
    ) -> tuple[RegisterRequest, bytes, dict[str, int]]:
        """The REGISTER request and body for a name server that acknowledged the table
        versions `acked`; also returns the version of each group's table sent."""
        groups: dict[str, RegisterGroup] = {}
        tables: dict[str, RegisterTable] = {}
        sent: dict[str, int] = {}
        for gid, g in request.groups.items():
            tlog = self._tables.setdefault(gid, TopicTableLog())
            base = acked.get(gid)
            delta = tlog.changes_since(base) if base is not None else None
            if delta is None:
                groups[gid] = g
                tables[gid] = RegisterTable(set=shapes_of(tlog.table))
            else:
                groups[gid] = replace(g, base=base)
                changed, removed = delta
                if changed or removed:
                    tables[gid] = RegisterTable(set=shapes_of(changed), dels=tuple(removed))
            sent[gid] = tlog.version
        return replace(request, groups=groups), RegisterRequest.encode_body(tables), sent

    def request(self) -> RegisterRequest:
        """The REGISTER request (without topic tables: they go in the body, per name
        server) after bringing every group's table version up to date."""
        fields, view = self._view()
        groups: dict[str, RegisterGroup] = {}
        for gid, (g, table) in view.items():
            tlog = self._tables.setdefault(gid, TopicTableLog())
            groups[gid] = RegisterGroup(**g, tv=tlog.update(table))
        auth = fields.get("auth")
        return RegisterRequest(
            node=fields["node"], addr=fields["addr"], metrics=fields.get("metrics"),
            host=fields.get("host"), inc=self._incarnation, groups=groups,
            auth=None if auth is None else RegisterAuth(
                at=auth["at"], salt_key=auth["salt_key"], over=auth.get("over", False),
                users=tuple((n, salt, i, stored, server)
                            for n, salt, i, stored, server in auth["users"])))

    def registration(self) -> dict[str, Any]:
        """The REGISTER header `request` makes."""
        return self.request().header()
