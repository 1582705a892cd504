"""The FIFO checker of a chaos run: what a `--workload fifo` history proves about message
groups, per message group.

It reads the records `chaos.simplecheck` reads (its docstring is the format and says
why times are wall-clock milliseconds), in the same pass and with the same intake: a
send carrying ``"group"`` and ``"seq"`` names a message of a FIFO message group. Lost,
phantom, double-held (one message) and the rest are `chaos.simplecheck`'s to judge;
this one judges the order of each message group of a consumer group.

The order of a group is that of its messages' offsets in their queue (all of a group go
to one queue): what the receipts part promises. The workload numbers them too (``seq``),
and a producer sends a group's next message only once the last one was answered, so
offsets follow the numbers; a plain producer's retry may store one twice, each copy a
message of the group in its own right.

Handles are the Raft indexes of the receives that made the deliveries, so in one queue
they order deliveries exactly; when an ack or dead letter was applied is known only
between the client's clock readings around it (`CLOCK_SLACK_MS` covers their rounding).

What is checked (`VIOLATIONS`)
------------------------------
- ``out_of_order``: a message handed out before every earlier message of its group was
  acked or dead-lettered: either an earlier one was delivered again by a later receive
  (a later handle), or the earliest an earlier one could have been settled (an ack or
  ``dead_letter`` call that may have been applied, a ``nack`` of its last allowed
  delivery, or, for a dead letter, the earliest its last delivery could time out) is
  later, by more than the slack, than the delivery was in hand; an earlier message never
  settled at all (not acked, not a dead letter with the dead letters read) counts as
  settled never;
- ``group_double_holding``: a message of a group handed out (to any consumer) while a
  delivery of another message of the group was still in flight: made by the same receive,
  or by an earlier one whose delivery could neither have been settled nor have timed out
  (`chaos.simplecheck.Checker.deadline`) by the time the later delivery was in hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import entrychecks, simplecheck
from .simplecheck import SIMPLE_OPS, Msg, _Delivery

__all__ = ["VIOLATIONS", "Checker", "check_file", "check_lines", "check_records"]

VIOLATIONS = ("out_of_order", "group_double_holding")
_EXAMPLES = 20

Group = tuple[str, str, str]  # (consumer group, "topic/queue", message group)


class Checker(simplecheck.Checker):
    """`chaos.simplecheck.Checker`'s intake, judged per message group by `result`."""

    def __init__(self) -> None:
        super().__init__()
        self._dead: set[Msg] = set()  # the dead letters read at the end

    def _members(self) -> dict[Group, dict[int, tuple[str, int]]]:
        """Each message group's messages known to be stored: offset -> (body, seq), from
        sends answered ok, deliveries and dead letters."""
        groups: dict[Group, dict[int, tuple[str, int]]] = {}
        cgs: dict[str, set[str]] = {}  # queue -> the consumer groups that received from it
        for cg, queue, _offset in self.deliveries:
            cgs.setdefault(queue, set()).add(cg)
        for send in self.sends.values():
            if send.group and send.offset is not None:
                for cg in cgs.get(send.queue, ()):
                    groups.setdefault((cg, send.queue, send.group), {})[send.offset] = (
                        send.body, send.seq)
        found = [(msg, ds[0].body) for msg, ds in self.deliveries.items()]
        found += [(dead.msg, dead.body) for entries in self.dlq.values() for dead in entries]
        for (cg, queue, offset), body in found:
            sender = self.sends.get(body)
            if sender is not None and sender.group and sender.queue == queue:
                groups.setdefault((cg, queue, sender.group), {})[offset] = (body, sender.seq)
        return groups

    def _settled_from(self, msg: Msg) -> float:
        """The earliest the message could have been acked or dead-lettered (inf: never)."""
        cg = msg[0]
        md = self.max_deliveries.get(cg, math.inf)
        seen = sorted(self.deliveries.get(msg, []), key=lambda d: d.handle)
        earliest = math.inf
        for d in seen:
            for s in self.settles.get((msg, d.handle), []):
                if s.may_apply and (s.kind in ("ack", "dead")
                                    or (s.kind == "nack" and d.count >= md)):
                    earliest = min(earliest, s.sent_ms)
        dead = cg in self.dlq_unread or cg not in self.dlq or msg in self._dead
        if dead:  # buried by a receive once its last delivery timed out, or unknown
            earliest = min(earliest, self.deadline(seen[-1]) if seen else -math.inf)
        return earliest

    def _hold_end(self, d: _Delivery) -> float:
        """The earliest the delivery `d` stopped being in flight: timed out, or settled."""
        end = self.deadline(d)
        md = self.max_deliveries.get(d.msg[0], math.inf)
        for s in self.settles.get((d.msg, d.handle), []):
            if s.may_apply and (s.kind in ("ack", "dead") or (s.kind == "nack"
                                                              and d.count >= md)):
                end = min(end, s.sent_ms)
        return end

    def _judge(self, key: Group, members: dict[int, tuple[str, int]],
               found: dict[str, list[Any]]) -> int:
        """Append one message group's violations to `found`; its deliveries' count."""
        cg, queue, group = key
        slack = self.clock_slack_ms
        offsets = sorted(members)
        # before each message, in offset order: the latest settling and the latest handle
        # of the earlier messages, each with its offset
        settled_by: dict[int, tuple[float, int]] = {}
        handle_by: dict[int, tuple[float, int]] = {}
        latest: tuple[float, int] = (-math.inf, -1)
        last: tuple[float, int] = (-math.inf, -1)
        for off in offsets:
            settled_by[off], handle_by[off] = latest, last
            msg = (cg, queue, off)
            latest = max(latest, (self._settled_from(msg), off))
            seen = self.deliveries.get(msg)
            if seen:
                last = max(last, (max(d.handle for d in seen), off))
        deliveries = sorted((d for off in offsets for d in self.deliveries.get(
            (cg, queue, off), [])), key=lambda d: d.handle)
        name = {"cg": cg, "queue": queue, "group": group}

        def told(off: int) -> dict[str, Any]:
            body, seq = members[off]
            return {"offset": off, "seq": seq, "body": body}

        for d in deliveries:
            (settle, s_off), (handle, h_off) = settled_by[d.msg[2]], handle_by[d.msg[2]]
            if handle > d.handle:
                found["out_of_order"].append({
                    **name, "delivered": told(d.msg[2]), "handle": d.handle,
                    "earlier": told(h_off), "why": "delivered after it",
                    "earlier_handle": int(handle)})
            elif settle > d.got_ms + slack:
                found["out_of_order"].append({
                    **name, "delivered": told(d.msg[2]), "handle": d.handle,
                    "earlier": told(s_off), "why": "settled later" if settle < math.inf
                    else "never settled",
                    "early_ms": None if settle == math.inf else round(settle - d.got_ms, 1)})
        # sweep in handle order, keeping the latest-held delivery of the two messages
        # held longest, so the one for another message is at hand
        top: list[tuple[float, _Delivery]] = []
        i = 0
        while i < len(deliveries):
            h = deliveries[i].handle
            batch = []
            while i < len(deliveries) and deliveries[i].handle == h:
                batch.append(deliveries[i])
                i += 1
            for n, d in enumerate(batch):
                other = next((t for t in top if t[1].msg != d.msg), None)
                same = next((b for b in batch[:n] if b.msg != d.msg), None)
                if same is not None or (other is not None and other[0] > d.got_ms + slack):
                    holder = same if same is not None else other[1]  # type: ignore[index]
                    found["group_double_holding"].append({
                        **name, "held": told(holder.msg[2]), "handed": told(d.msg[2]),
                        "handles": [holder.handle, d.handle],
                        "consumers": [holder.consumer, d.consumer],
                        "early_ms": None if same is not None
                        else round(other[0] - d.got_ms, 1)})  # type: ignore[index]
            for d in batch:
                end = self._hold_end(d)
                kept = {t[1].msg: t for t in top}
                if d.msg not in kept or kept[d.msg][0] < end:
                    kept[d.msg] = (end, d)
                top = sorted(kept.values(), key=lambda t: t[0], reverse=True)[:2]
        return len(deliveries)

    def result(self) -> dict[str, Any]:
        self.finish()
        found: dict[str, list[Any]] = {kind: [] for kind in VIOLATIONS}
        groups = self._members()
        self._dead = {e.msg for entries in self.dlq.values() for e in entries}
        deliveries = 0
        for key in sorted(groups):
            deliveries += self._judge(key, groups[key], found)
        counts = {kind: len(items) for kind, items in found.items()}
        # (a malformed record is `chaos.simplecheck`'s problem: the same intake)
        problems = [f"{kind}: {n}" for kind, n in counts.items() if n]
        sizes = [len(m) for m in groups.values()]
        return {
            "valid": not problems,
            "problems": problems,
            **counts,
            "message_groups": len(groups),
            "messages": sum(sizes),
            "largest_group": max(sizes, default=0),
            "deliveries": deliveries,
            "sent": sum(1 for s in self.sends.values() if s.group),
            "dlq_read": not self.dlq_unread and bool(self.dlq),
            "clock_slack_ms": self.clock_slack_ms,
            "malformed": len(self.malformed),
            "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
        }


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history (lines naming none of the simple
    consumer's operations are skipped)."""
    return entrychecks.check_lines(Checker(), lines, SIMPLE_OPS)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path, SIMPLE_OPS)
