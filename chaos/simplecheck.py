"""The simple-consumer checker of a chaos run: what a `--workload simple` history proves.

Pure: `check_lines` takes the JSON lines of a history (lines of other workloads are
skipped, so a run of `--workload all` is checked in the same pass) and returns a JSON-able
dict; `check_file` streams a history file. One pass keeps a small entry per delivery and
per settling call (a short run's worth), then judges each message at the end.

Times
-----
What the receipts part decides by (when a delivery's invisible time runs out) is the
leader's wall clock, carried in its records; the records below carry the wall clock (ms
since the epoch) of the machine that runs the nodes, taken by the clients. A delivery
was made by a `Receive` record whose leader time lies between the ``since_ms`` of the
receive that returned it (when the consumer began asking: see ``simple-receive``) and the
``ms`` it was in the consumer's hands, and its invisible time runs out at least
``invisible_ms`` after the former. `CLOCK_SLACK_MS` covers clock reads rounded to the
millisecond in two processes of one machine. The history's own ``time`` is not used.

History records
---------------
Written with `chaos.recorder.Recorder` (or forwarded from a worker process): an
``invoke`` line, perhaps ``attempt`` lines, then one completion (``ok``, ``fail`` or
``info``) of the same process; an operation still open at the end of the history counts
as ``info``. ``"topic/queue"`` names a queue; bodies are run-unique. A *delivery* is
named by its consumer group, queue, offset and *handle* (the Raft index of the receive
that made it: unique, and growing with each delivery of a message).

``simple-send`` (key = ``"topic/queue"``)
    A producer's send: invoke ``{"body", "producer": "plain" | "idempotent",
    "always_fail"}``, plus ``"group"`` and ``"seq"`` for a message of a FIFO message
    group (`chaos.fifocheck` reads those); ``attempt`` lines (plain producers, one per request);
    ``ok {"offset"}`` (acknowledged), ``fail {"error"}`` (certainly never stored),
    ``info {"error"}`` (unknown).

``simple-receive`` (key = topic)
    One `SimpleConsumer.receive`: invoke ``{"cg", "consumer", "max", "invisible_ms",
    "max_deliveries", "since_ms"}``, ``since_ms`` no later than any receive request whose
    messages this call may return (a long poll started by an earlier call of the same
    consumer may hand its messages to this one) and ``invisible_ms`` the shortest
    invisible time any of those asked for; ``ok {"ms", "messages": [[queue, offset,
    body, deliveries, handle], ...]}``; ``info {"error"}``: it raised, and any delivery of
    the topic's queues it made may be lost (the SDK drops what a sweep had got when a
    later queue of the sweep fails).

``simple-lost`` (key = ``"topic/queue"``)
    A RECEIVE request of group ``cg`` that got no answer, or an error one (the consumer
    retried it, or its long poll went on): invoke ``{"cg", "sent_ms"}``, ``info {"error",
    "ms"}``. Its `Receive` may have been applied, each message it chose delivered once
    and never seen.

``simple-ack`` / ``simple-nack`` / ``simple-dead`` / ``simple-change`` (key = ``"topic/queue"``)
    `ack`, `nack`, `dead_letter` and `change_invisible` of one delivery: invoke ``{"cg",
    "offset", "handle", "body", "sent_ms"}`` plus, for an ack, ``"late"`` (sent after the
    delivery's invisible time ran out), for a nack ``"delay_ms"`` (null: the backoff)
    and ``"backoff_ms"``, for a nack or dead letter ``"error"``, for a change
    ``"invisible_ms"``; ``ok {"ms"}``, ``fail {"error", "stale": true}`` (refused as
    stale: not applied), ``fail {"error"}`` (certainly not applied), ``info {"error"}``
    (unknown).

``simple-dlq`` (key = consumer group)
    The dead letters read after the drain (`Admin.dlq_list`, each shown with
    `Admin.dlq_show`): invoke ``{"cg", "max_deliveries"}``, ``ok {"ms", "entries": [[id,
    "topic/queue", offset, body, deliveries, error], ...]}``; ``info {"error"}`` when
    they could not all be read (then nothing is judged lost or missing from them).

What is checked
---------------
Per message (consumer group, queue, offset), its deliveries seen in handle order
(`VIOLATIONS`):

- ``lost``: acknowledged (a send ``ok``) and, at the end, neither acked ``ok`` by any
  consumer (any copy, any delivery) nor in the dead letters; an ack of its last delivery
  seen with an unknown outcome may have taken it, so it is not counted;
- ``acked_then_delivered``: delivered again after an ack of an earlier delivery was
  answered ``ok`` (the later receive began after that answer came);
- ``stale_acks_accepted``: an ack answered ``ok`` for a delivery that a later delivery
  of the message superseded, where the later receive may have come first: either way
  one of the two is wrong, since an applied ack leaves nothing to deliver and a
  superseded receipt's ack must be refused;
- ``double_holding``: a delivery made while an earlier delivery of the message was still
  invisible: its earliest possible deadline (the earlier receive's ``since_ms`` plus its
  ``invisible_ms``; a ``change_invisible`` or ``nack`` of it that may have been applied
  re-times it from its own ``sent_ms``, so the earliest of them counts) is later, by more
  than `CLOCK_SLACK_MS`, than the latest time the later delivery could have been made;
- ``delivery_counts``: the delivery counts seen must go 1, 2, 3 ... with the handles,
  never repeating or going back. A count may skip only where a delivery was made and
  never seen: each ``simple-lost`` request of the group on that queue sent before the
  later delivery was in hand explains one missing delivery of each message of the
  queue (one `Receive` delivers a message at most once), an ``info`` (or unfinished)
  ``simple-receive`` of the group on the topic any number. Everything else missing is a
  skip;
- ``dead_letters_wrong``: a dead letter whose delivery count is not the group's
  ``max_deliveries`` unless a ``dead_letter`` call (not refused) poisoned that very
  delivery; one whose message an ack answered ``ok`` took; one listed twice; a message
  delivered ``max_deliveries`` times that is neither acked nor a dead letter at the end
  (an ack of its last delivery with an unknown outcome excuses it); a message delivered
  after a ``dead_letter`` of an earlier delivery was answered ``ok``, or more than
  ``max_deliveries`` times;
- ``phantoms``: a delivered or dead-lettered body that no producer sent to that queue,
  or whose send failed for certain;
- ``offset_conflicts``: two bodies delivered at one offset of a queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import entrychecks

__all__ = ["CLOCK_SLACK_MS", "SIMPLE_OPS", "VIOLATIONS", "Checker", "check_file",
           "check_lines", "check_records"]

SIMPLE_OPS = frozenset({"simple-send", "simple-receive", "simple-lost", "simple-ack",
                        "simple-nack", "simple-dead", "simple-change", "simple-dlq"})
SETTLE_OPS = {"simple-ack": "ack", "simple-nack": "nack", "simple-dead": "dead",
              "simple-change": "change"}
VIOLATIONS = ("lost", "acked_then_delivered", "stale_acks_accepted", "double_holding",
              "delivery_counts", "dead_letters_wrong", "phantoms", "offset_conflicts")
CLOCK_SLACK_MS = 10
"""Clock reads in ms on one machine, in the client and in a node: rounding only."""
_EXAMPLES = 20

Msg = tuple[str, str, int]  # (consumer group, "topic/queue", offset)


@dataclass(slots=True)
class _Send:
    body: str
    queue: str
    status: str = "open"  # ok | fail | info | open
    always_fail: bool = False
    group: str = ""  # its FIFO message group, if any, and its number in the group
    seq: int = 0
    offset: int | None = None  # where an ok answer said it was stored


@dataclass(slots=True)
class _Delivery:
    msg: Msg
    body: str
    count: int
    handle: int
    since_ms: float  # the leader made it no earlier than this
    got_ms: float  # ... and no later than this
    invisible_ms: int
    consumer: str


@dataclass(slots=True)
class _Settle:
    kind: str  # ack | nack | dead | change
    sent_ms: float
    value: dict[str, Any]
    outcome: str = "open"  # ok | stale | fail | info | open
    ms: float = math.inf  # when an ok answer came

    @property
    def may_apply(self) -> bool:
        return self.outcome in ("ok", "info", "open")


@dataclass(slots=True)
class _Op:
    f: str
    key: Any
    value: Any
    attempts: int = 0


@dataclass(slots=True)
class _Dead:
    id: str
    msg: Msg
    body: str
    deliveries: int
    error: str


class Checker:
    """Fed one history entry at a time (`chaos.entrychecks`), judged by `result`."""

    def __init__(self, *, clock_slack_ms: int = CLOCK_SLACK_MS) -> None:
        self.clock_slack_ms = clock_slack_ms
        self.open: dict[Any, _Op] = {}
        self.sends: dict[str, _Send] = {}
        self.send_outcomes: dict[str, int] = {}
        self.deliveries: dict[Msg, list[_Delivery]] = {}
        self.settles: dict[tuple[Msg, int], list[_Settle]] = {}
        self.lost_requests: dict[tuple[str, str], list[float]] = {}  # (cg, queue) -> sent
        self.unknown_receives: dict[tuple[str, str], list[float]] = {}  # (cg, topic) -> since
        self.max_deliveries: dict[str, int] = {}
        self.dlq: dict[str, list[_Dead]] = {}  # cg -> its dead letters as read at the end
        self.dlq_unread: set[str] = set()
        self.receives: dict[str, int] = {}
        self.malformed: list[str] = []

    # ------------------------------------------------------------ intake

    def line(self, entry: Any, where: str) -> None:
        head = entrychecks.entry_head(entry)
        if head is None:
            return
        process, kind, f = head
        if kind == "invoke":
            self.open.pop(process, None)  # an op left open by a new invoke stays unknown
            if f in SIMPLE_OPS:
                new = self.open[process] = _Op(f, entry.get("key"), entry.get("value"))
                try:
                    self._invoked(new)
                except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
                    self.malformed.append(f"{where}: {f} {exc}")
                    self.open.pop(process, None)
            return
        op = self.open.get(process)
        if op is None or op.f != f:
            return
        if kind == "attempt":
            op.attempts += 1
            return
        if kind not in ("ok", "fail", "info"):
            return
        del self.open[process]
        try:
            self._completed(op, kind, entry.get("value"))
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            self.malformed.append(f"{where}: {f} {exc}")

    def _invoked(self, op: _Op) -> None:
        v = op.value
        if op.f == "simple-send":
            body = str(v["body"])
            if body in self.sends:
                raise ValueError(f"body {body!r} sent twice")
            op.value = self.sends[body] = _Send(
                body, str(op.key), always_fail=bool(v.get("always_fail")),
                group=str(v.get("group") or ""), seq=int(v.get("seq") or 0))
        elif op.f == "simple-receive":
            cg, md = str(v["cg"]), int(v["max_deliveries"])
            if self.max_deliveries.setdefault(cg, md) != md:
                raise ValueError(f"consumer group {cg!r} receives with max_deliveries "
                                 f"{self.max_deliveries[cg]} and {md}")
            _ = (float(v["since_ms"]), int(v["invisible_ms"]), str(v["consumer"]))
        elif op.f == "simple-lost":
            _ = (str(v["cg"]), float(v["sent_ms"]))
        elif op.f in SETTLE_OPS:
            msg = (str(v["cg"]), str(op.key), int(v["offset"]))
            settle = _Settle(SETTLE_OPS[op.f], float(v["sent_ms"]), dict(v))
            self.settles.setdefault((msg, int(v["handle"])), []).append(settle)
            op.value = settle
        else:  # simple-dlq
            cg = str(v["cg"])
            if v.get("max_deliveries") is not None:
                self.max_deliveries.setdefault(cg, int(v["max_deliveries"]))
            self.dlq_unread.add(cg)

    def _completed(self, op: _Op, kind: str, result: Any) -> None:
        if op.f == "simple-send":
            send: _Send = op.value
            send.status = kind
            if kind == "ok" and isinstance(result, dict) and result.get("offset") is not None:
                send.offset = int(result["offset"])
            self.send_outcomes[kind] = self.send_outcomes.get(kind, 0) + 1
        elif op.f == "simple-receive":
            self.receives[kind] = self.receives.get(kind, 0) + 1
            if kind == "ok":
                self._received(op, result)
            else:
                self._unknown_receive(op)
        elif op.f == "simple-lost":
            self.lost_requests.setdefault((str(op.value["cg"]), str(op.key)), []).append(
                float(op.value["sent_ms"]))
        elif op.f in SETTLE_OPS:
            settle: _Settle = op.value
            if kind == "ok":
                settle.outcome, settle.ms = "ok", float(result["ms"])
            elif kind == "fail":
                stale = isinstance(result, dict) and result.get("stale")
                settle.outcome = "stale" if stale else "fail"
            else:
                settle.outcome = "info"
        elif kind == "ok":  # simple-dlq
            cg = str(op.value["cg"])
            entries = []
            for did, queue, offset, body, deliveries, error in result["entries"]:
                entries.append(_Dead(str(did), (cg, str(queue), int(offset)), str(body),
                                     int(deliveries), str(error)))
            self.dlq[cg] = entries
            self.dlq_unread.discard(cg)

    def _received(self, op: _Op, result: Any) -> None:
        v, topic = op.value, str(op.key)
        got = float(result["ms"])
        for queue, offset, body, count, handle in result["messages"]:
            msg = (str(v["cg"]), f"{topic}/{int(queue)}", int(offset))
            self.deliveries.setdefault(msg, []).append(_Delivery(
                msg, str(body), int(count), int(handle), float(v["since_ms"]), got,
                int(v["invisible_ms"]), str(v["consumer"])))

    def _unknown_receive(self, op: _Op) -> None:
        v = op.value
        self.unknown_receives.setdefault((str(v["cg"]), str(op.key)), []).append(
            float(v["since_ms"]))

    def finish(self) -> None:
        for op in list(self.open.values()):  # never completed: unknown
            if op.f == "simple-receive":
                self._unknown_receive(op)
            elif op.f == "simple-send":
                self._completed(op, "info", None)
            elif op.f in SETTLE_OPS:
                op.value.outcome = "info"
        self.open.clear()

    # ------------------------------------------------------------ verdict

    def deadline(self, d: _Delivery) -> float:
        """The earliest the delivery `d`'s invisible time could have run out: from its
        receive, or from a nack or change_invisible of it that may have been applied."""
        earliest = d.since_ms + d.invisible_ms
        for s in self.settles.get((d.msg, d.handle), []):
            if not s.may_apply:
                continue
            if s.kind == "change":
                earliest = min(earliest, s.sent_ms + int(s.value["invisible_ms"]))
            elif s.kind == "nack":
                delay = s.value.get("delay_ms")
                if delay is None:
                    backoff = list(s.value.get("backoff_ms") or [0])
                    delay = backoff[min(d.count, len(backoff)) - 1]
                earliest = min(earliest, s.sent_ms + int(delay))
        return earliest

    def _explained(self, msg: Msg, seen: list[_Delivery]) -> list[dict[str, Any]]:
        """The skips of one message's delivery counts no lost answer explains."""
        cg, queue, _offset = msg
        topic = queue.rsplit("/", 1)[0]
        unknown = sorted(self.unknown_receives.get((cg, topic), []))
        lost = sorted(self.lost_requests.get((cg, queue), []))
        out = []
        missing = 0
        prev = 0
        for d in seen:
            gap = d.count - prev - 1
            prev = max(prev, d.count)
            if gap <= 0:
                continue
            if unknown and unknown[0] <= d.got_ms + self.clock_slack_ms:
                continue  # a receive whose messages may all be lost came before it
            missing += gap
            available = sum(1 for s in lost if s <= d.got_ms + self.clock_slack_ms)
            if missing > available:
                out.append({"deliveries": d.count, "handle": d.handle, "missing": gap,
                            "lost_requests_before": available})
        return out

    def result(self) -> dict[str, Any]:
        self.finish()
        found: dict[str, list[Any]] = {kind: [] for kind in VIOLATIONS}
        slack = self.clock_slack_ms
        acked_bodies: set[str] = set()
        maybe_acked: set[str] = set()  # bodies whose last delivery's ack is unknown
        dead_bodies: set[str] = set()
        dead_msgs: dict[Msg, _Dead] = {}
        for entries in self.dlq.values():
            for dead in entries:
                dead_bodies.add(dead.body)
                if dead.msg in dead_msgs:
                    found["dead_letters_wrong"].append({
                        "why": "listed twice", "queue": dead.msg[1], "offset": dead.msg[2],
                        "ids": [dead_msgs[dead.msg].id, dead.id]})
                dead_msgs[dead.msg] = dead
        bodies_at: dict[tuple[str, int], str] = {}
        counts = {"deliveries": 0, "redeliveries": 0, "max_deliveries_reached": 0}
        settled: dict[str, dict[str, int]] = {}
        late: dict[str, int] = {}
        for (_msg, _h), ss in self.settles.items():
            for s in ss:
                by = settled.setdefault(s.kind, {})
                by[s.outcome] = by.get(s.outcome, 0) + 1
                if s.kind == "ack" and s.value.get("late"):
                    late[s.outcome] = late.get(s.outcome, 0) + 1
        acks = settled.get("ack", {})
        for msg, seen in self.deliveries.items():
            cg, queue, offset = msg
            seen.sort(key=lambda d: d.handle)
            md = self.max_deliveries.get(cg)
            counts["deliveries"] += len(seen)
            counts["redeliveries"] += sum(1 for d in seen if d.count > 1)
            name = {"cg": cg, "queue": queue, "offset": offset, "body": seen[0].body}
            for d in seen:  # offsets, bodies
                first = bodies_at.setdefault((queue, offset), d.body)
                if first != d.body:
                    found["offset_conflicts"].append({**name, "bodies": [first, d.body]})
                    break
            # counts repeat or go back
            for a, b in zip(seen, seen[1:], strict=False):
                if b.count <= a.count:
                    found["delivery_counts"].append({
                        **name, "why": "repeated" if b.count == a.count else "went back",
                        "counts": [a.count, b.count], "handles": [a.handle, b.handle]})
                    break
            for skip in self._explained(msg, seen):
                found["delivery_counts"].append({**name, "why": "skipped", **skip})
                break
            if md is not None and any(d.count >= md for d in seen):
                counts["max_deliveries_reached"] += 1
            if md is not None and seen[-1].count > md:
                found["dead_letters_wrong"].append({
                    **name, "why": "delivered more than max_deliveries",
                    "deliveries": seen[-1].count, "max_deliveries": md})
            # holding, acks and dead letters of earlier deliveries against later ones
            latest_deadline = -math.inf
            holder: _Delivery | None = None
            acked: _Settle | None = None
            poisoned: _Settle | None = None
            for d in seen:
                if latest_deadline > d.got_ms + slack and holder is not None:
                    found["double_holding"].append({
                        **name, "handles": [holder.handle, d.handle],
                        "consumers": [holder.consumer, d.consumer],
                        "early_ms": round(latest_deadline - d.got_ms, 1)})
                if acked is not None:
                    kind = ("acked_then_delivered" if acked.ms + slack < d.since_ms
                            else "stale_acks_accepted")
                    found[kind].append({**name, "acked_handle": acked.value["handle"],
                                        "later_handle": d.handle, "later_count": d.count,
                                        "ack_ms": acked.ms, "later_since_ms": d.since_ms})
                    acked = None  # once per ack
                if poisoned is not None and poisoned.ms + slack < d.since_ms:
                    found["dead_letters_wrong"].append({
                        **name, "why": "delivered after dead_letter", "handle": d.handle})
                    poisoned = None
                deadline = self.deadline(d)
                if deadline > latest_deadline:
                    latest_deadline, holder = deadline, d
                for s in self.settles.get((msg, d.handle), []):
                    if s.kind == "ack" and s.outcome == "ok":
                        acked = s
                    elif s.kind == "dead" and s.outcome == "ok":
                        poisoned = s
            last_acks = self.settles.get((msg, seen[-1].handle), [])
            acked_ok = any(s.kind == "ack" and s.outcome == "ok"
                           for d in seen for s in self.settles.get((msg, d.handle), []))
            maybe = any(s.kind == "ack" and s.outcome in ("info", "open") for s in last_acks)
            if acked_ok:
                acked_bodies.add(seen[-1].body)
            elif maybe:
                maybe_acked.add(seen[-1].body)
            buried = dead_msgs.get(msg)
            if buried is not None and acked_ok:
                found["dead_letters_wrong"].append({**name, "why": "acked and dead",
                                                    "id": buried.id})
            if (md is not None and cg in self.dlq and seen[-1].count >= md
                    and not acked_ok and not maybe and buried is None):
                found["dead_letters_wrong"].append({
                    **name, "why": "delivered max_deliveries times, neither acked nor dead",
                    "deliveries": seen[-1].count})
        for msg, dead in dead_msgs.items():
            cg = msg[0]
            md = self.max_deliveries.get(cg)
            poison = any(
                s.kind == "dead" and s.may_apply and d.count == dead.deliveries
                for d in self.deliveries.get(msg, [])
                for s in self.settles.get((msg, d.handle), []))
            if dead.deliveries != md and not poison:
                found["dead_letters_wrong"].append({
                    "cg": cg, "queue": msg[1], "offset": msg[2], "body": dead.body,
                    "why": "deliveries", "deliveries": dead.deliveries,
                    "max_deliveries": md, "id": dead.id})
            first = bodies_at.setdefault((msg[1], msg[2]), dead.body)
            if first != dead.body:
                found["offset_conflicts"].append({"cg": cg, "queue": msg[1], "offset": msg[2],
                                                  "bodies": [first, dead.body]})
        # phantoms: what was handed out or buried that nobody sent there
        strangers = set()
        for (queue, offset), body in sorted(bodies_at.items()):
            send = self.sends.get(body)
            if send is None or send.queue != queue or send.status == "fail":
                if (queue, body) not in strangers:
                    strangers.add((queue, body))
                    found["phantoms"].append({
                        "queue": queue, "offset": offset, "body": body,
                        "send": "none" if send is None else
                        send.status if send.queue == queue else f"to {send.queue}"})
        read = not self.dlq_unread and bool(self.dlq)
        acknowledged = [m for m in self.sends.values() if m.status == "ok"]
        if read:
            done = acked_bodies | dead_bodies | maybe_acked
            delivered = set(bodies_at.values())
            for m in acknowledged:
                if m.body not in done:
                    found["lost"].append({"body": m.body, "queue": m.queue,
                                          "delivered": m.body in delivered})
        counts_by_kind = {kind: len(items) for kind, items in found.items()}
        problems = [f"{kind}: {n}" for kind, n in counts_by_kind.items() if n]
        problems += [f"malformed simple-consumer record: {m}"
                     for m in self.malformed[:_EXAMPLES]]
        return {
            "valid": not problems,
            "problems": problems,
            **counts_by_kind,
            "messages": {
                "sent": len(self.sends),
                "sends": dict(sorted(self.send_outcomes.items())),
                "acknowledged": len(acknowledged),
                "always_fail": sum(1 for s in self.sends.values() if s.always_fail),
                "delivered": len(self.deliveries),
                **counts,
                "acked": len(acked_bodies),
                "dead_letters": sum(len(e) for e in self.dlq.values()),
            },
            "receives": dict(sorted(self.receives.items())),
            "lost_requests": sum(len(v) for v in self.lost_requests.values()),
            "unknown_receives": sum(len(v) for v in self.unknown_receives.values()),
            "settled": {k: dict(sorted(v.items())) for k, v in sorted(settled.items())},
            "acks": dict(sorted(acks.items())),
            "late_acks": dict(sorted(late.items())),
            "max_deliveries": dict(sorted(self.max_deliveries.items())),
            "dlq_read": read,
            "clock_slack_ms": slack,
            "malformed": len(self.malformed),
            "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
        }


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history; lines that are not JSON, or name
    none of `SIMPLE_OPS`, are skipped."""
    return entrychecks.check_lines(Checker(), lines, SIMPLE_OPS)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path, SIMPLE_OPS)

