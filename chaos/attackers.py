"""Attackers beside the security workload: the attacks of the second security pass, made
over and over under faults while the normal clients work (`--workload security` and
`all`). Each attack is one record of process ``attacker``:

``attack`` (key = its kind; invoke value ``{"node"}``)
    ``ok {"held": why}``: the node stopped it as it must; ``fail {"through": what}``: it
    got through, a violation (`chaos.authcheck`, ``attacks_got_through``); ``info``: no
    verdict (the node was down, paused or cut off, so its silence says nothing).

- ``half-frame``: a connection that never logs in sends one request, then all but the
  last bytes of a frame of nearly 16 MiB. The node must close it (frames before a login
  are small); still open after `CLOSE_WAIT` while the node answers others is a failure.
- ``idle-flood``: `FLOOD` connections that never log in stay open; the superuser must
  still log in on that node (BUSY is a failure).
- ``forged-fence``: the superuser itself sends a PRODUCE (to a topic of the attackers'
  own, to the group hosting the queue) whose batch header claims a transactional id of
  the transactional workload at an epoch no coordinator granted; it must be refused
  (TX_UNKNOWN, or TX_FENCED): a header never raises a fence, whoever sends it.
- ``long-client-id``: a HEARTBEAT with a client id of 1,000 characters must be refused
  (MALFORMED), not kept.
- ``operator-decision``: a test user decides a half message as an operator; only cluster
  admin may (FORBIDDEN, or UNAUTHENTICATED for a user the admin removed).

``node-memory`` (key = node) every `MEMORY_EVERY` seconds: ``ok {"rss_mib"}``, the node
process's resident memory; above `MEMORY_BOUND_MIB` is a violation (``memory_over_bound``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import trio

from raftmq.client import Admin
from transport.connection import ConnectionPool
from transport.scram import Credentials
from wire.protocol import Code, Op, RequestError, encode_frame
from wire.records import OutgoingMessage, encode_batch
from wire.requests.produce import ProduceRequest
from wire.requests.transactions import HalfEndRequest

from .recorder import Recorder
from .workload import queue_groups

__all__ = ["ATTACKS", "MEMORY_BOUND_MIB", "Attackers", "node_rss_mib"]

ATTACKS = ("half-frame", "idle-flood", "forged-fence", "long-client-id", "operator-decision")
PROCESS = "attacker"
HALF = (16 << 20) - 64  # a frame of nearly 16 MiB, all but its last bytes sent
CLOSE_WAIT = 20.0  # seconds a node has to close a half frame sent before a login
CLOSE_GRACE = 5.0  # and once it is seen answering others (it may have been paused)
FLOOD = 30
MEMORY_EVERY = 10.0
MEMORY_BOUND_MIB = 1024  # no node process of a chaos run may hold more (docs/chaos.md)
NEVER_GRANTED = 2**63 - 1
_TIMEOUT = 5.0
TARGET = "attack-target"  # the topic the forged batches name
_UNKNOWN = frozenset({Code.TIMEOUT, Code.CONNECTION_LOST, Code.UNAVAILABLE, Code.BUSY,
                      Code.NOT_LEADER, Code.UNKNOWN_GROUP, Code.UNKNOWN_TOPIC,
                      Code.UNKNOWN_QUEUE})


class Attackers:
    """`nodes` are the client addresses; `credentials()` gives a test user's login of the
    moment (user, password); `rss_mib(node)` reads a node's memory (None if it is down)."""

    def __init__(self, nodes: dict[int, str], metadata_group: str, namesrv: str, groups: int,
                 *, recorder: Recorder, rng: random.Random,
                 credentials: Callable[[], Credentials],
                 rss_mib: Callable[[int], float | None] | None = None,
                 victim: str = "chaos-tx-t0") -> None:
        self.nodes = dict(sorted(nodes.items()))
        self.group = metadata_group
        self.namesrv = namesrv
        self.groups = groups
        self.recorder = recorder
        self.rng = rng
        self.credentials = credentials
        self.rss_mib = rss_mib
        self.victim = victim
        self.targets: dict[int, str] = {}  # queue of TARGET -> the group hosting it

    async def run(self, stop_at: float) -> None:
        async with trio.open_nursery() as nursery:
            if self.rss_mib is not None:
                nursery.start_soon(self._memory, stop_at)
            kinds = list(ATTACKS)
            while time.monotonic() < stop_at:
                self.rng.shuffle(kinds)  # every kind in turn, each round in a new order
                for kind in kinds:
                    if time.monotonic() >= stop_at:
                        break
                    await self.attack(kind, self.rng.choice(list(self.nodes)))
                    await trio.sleep(self.rng.uniform(0.5, 2.0))

    async def attack(self, kind: str, node: int) -> None:
        rec = self.recorder
        rec.invoke(PROCESS, "attack", kind, {"node": node})
        try:
            verdict, why = await getattr(self, "_" + kind.replace("-", "_"))(self.nodes[node])
        except BaseException:
            rec.complete(PROCESS, "info", "attack", kind, {"error": "cancelled"})
            raise
        if verdict == "ok":
            rec.complete(PROCESS, "ok", "attack", kind, {"held": why})
        elif verdict == "fail":
            rec.complete(PROCESS, "fail", "attack", kind, {"through": why})
        else:
            rec.complete(PROCESS, "info", "attack", kind, {"error": why})

    # ------------------------------------------------------------------ the attacks

    async def _half_frame(self, addr: str) -> tuple[str, str]:
        host, port = addr.rsplit(":", 1)
        try:
            stream = await trio.open_tcp_stream(host, int(port))
        except OSError as exc:
            return "info", f"cannot connect: {exc}"
        async def closed(wait: float) -> bool:
            with trio.move_on_after(wait):
                while await stream.receive_some(1 << 16):
                    pass  # the refusals; then the end of the stream
                return True
            return False

        async with stream:
            try:
                await stream.send_all(encode_frame({"op": int(Op.STATUS), "id": 1}))
                frame = encode_frame({"op": int(Op.STATUS), "id": 2}, bytes(HALF))
                with trio.move_on_after(CLOSE_WAIT):
                    await stream.send_all(memoryview(frame)[:-8])
                if await closed(CLOSE_WAIT):
                    return "ok", "closed"
                # still open: a failure only if the node answers others and, answering,
                # still keeps it open (a node paused until a moment ago, by `pause` or
                # `stale-leader`, reads the half frame only now)
                if not await self._answers(addr):
                    return "info", "the node did not answer meanwhile"
                if await closed(CLOSE_GRACE):
                    return "ok", "closed once the node ran again"
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return "ok", "closed"
        return "fail", (f"a half frame before a login held open for {CLOSE_WAIT:.0f} s, "
                        f"and {CLOSE_GRACE:.0f} s more while the node answered others")

    async def _idle_flood(self, addr: str) -> tuple[str, str]:
        host, port = addr.rsplit(":", 1)
        streams = []
        try:
            for _ in range(FLOOD):
                try:
                    streams.append(await trio.open_tcp_stream(host, int(port)))
                except OSError:
                    break
            try:
                async with ConnectionPool() as pool:  # the harness's superuser
                    await pool.request(addr, Op.STATUS, {}, timeout=_TIMEOUT)
            except RequestError as exc:
                if exc.code == Code.BUSY:
                    return "fail", f"the superuser's login got BUSY beside {len(streams)} " \
                                   f"connections that never logged in: {exc}"
                return "info", str(exc)
            return "ok", f"the superuser logged in beside {len(streams)} idle connections"
        finally:
            for s in streams:
                await s.aclose()

    async def _forged_fence(self, addr: str) -> tuple[str, str]:
        if not self.targets:
            try:
                with trio.fail_after(_TIMEOUT * 2):
                    async with Admin(self.namesrv) as admin:
                        await admin.create_topic(TARGET, self.groups, exist_ok=True)
                    found = await queue_groups(self.namesrv, TARGET)
            except (RequestError, trio.TooSlowError) as exc:
                return "info", f"no topic to forge a batch of: {exc!r}"
            self.targets = {int(k.rsplit("/", 1)[1]): g for k, g in found.items()}
        queue, group = self.rng.choice(sorted(self.targets.items()))
        batch = bytes(encode_batch(TARGET, queue, [OutgoingMessage(b"forged")],
                                   tx=(self.victim, NEVER_GRANTED, 0)))
        verdict = ("info", "no node leads the group")
        for to in [addr, *(a for a in self.nodes.values() if a != addr)]:  # to its leader
            verdict = await self._refused(to, Op.PRODUCE, ProduceRequest(g=group).header(),
                                          batch, {Code.TX_UNKNOWN, Code.TX_FENCED}, None)
            if not verdict[1].startswith("NOT_LEADER"):
                break
        return verdict

    async def _long_client_id(self, addr: str) -> tuple[str, str]:
        header = {"cg": "attackers", "client": "x" * 1000, "topics": [], "ttl_ms": 600_000}
        return await self._refused(addr, Op.HEARTBEAT, header, b"", {Code.MALFORMED}, None)

    async def _operator_decision(self, addr: str) -> tuple[str, str]:
        req = HalfEndRequest(g=self.group, txid="0" * 24, commit=True, pg="chaos-pg",
                             source="operator")
        return await self._refused(addr, req.OP, req.header(), b"",
                                   {Code.FORBIDDEN, Code.UNAUTHENTICATED}, self.credentials())

    async def _refused(self, addr: str, op: Op, header: dict[str, Any], body: bytes,
                       refusals: set[Code], who: Credentials | None) -> tuple[str, str]:
        """Make the request (as `who`, or the harness's superuser): one of `refusals`
        holds; an answer or any other refusal means the request got past what must stop
        it; a code that says nothing about it (the node down, busy) has no verdict."""
        try:
            async with ConnectionPool(credentials=who) as pool:
                await pool.request(addr, op, header, body, timeout=_TIMEOUT)
        except RequestError as exc:
            if exc.code in refusals:
                return "ok", exc.code.name
            if exc.code in _UNKNOWN:
                return "info", str(exc)
            return "fail", f"answered {exc.code.name}: {exc.message}"
        except OSError as exc:
            return "info", repr(exc)
        return "fail", "answered OK"

    async def _answers(self, addr: str) -> bool:
        try:
            async with ConnectionPool() as pool:
                await pool.request(addr, Op.STATUS, {}, timeout=_TIMEOUT)
        except (RequestError, OSError):
            return False
        return True

    # ------------------------------------------------------------------ memory

    async def _memory(self, stop_at: float) -> None:
        assert self.rss_mib is not None
        while time.monotonic() < stop_at:
            for node in self.nodes:
                rss = self.rss_mib(node)
                if rss is not None:
                    self.recorder.invoke(PROCESS + "-memory", "node-memory", node, None)
                    self.recorder.complete(PROCESS + "-memory", "ok", "node-memory", node,
                                           {"rss_mib": round(rss, 1)})
            await trio.sleep(MEMORY_EVERY)


def node_rss_mib(cluster: Any, node: int) -> float | None:
    """Resident memory of node `node` of a `raftmq.localcluster.LocalCluster` (None when it is
    not running)."""
    pid = cluster.pid(node)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
