"""Linear-time message accounting for queue histories, after Jepsen's total-queue and Kafka checkers.

Linearizability says whether one order explains everything; accounting says what went wrong
with which message, and stays cheap on histories too large to search. Per queue it reports:

- ``lost``: acknowledged appends never seen by any read, when either the queue was drained
  (below) or some read covered the acknowledged offset and found another message there.
- ``unread``: acknowledged appends never seen where no read could have seen them, and those
  read elsewhere whose acknowledged offset no read covered (a retry may have stored a second
  copy there, or the ack named the wrong offset: unknown until a read covers it). Not an error.
- ``duplicated``: messages seen at two or more different offsets.
- ``unexpected``: messages read that were never appended to that queue.
- ``recovered``: appends whose outcome was unknown (``info``) but that were read (not an error).
- ``failed_but_read``: appends that definitely failed (``fail``) yet were read.
- ``offset_conflicts``: one offset read as different messages by different reads.
- ``ack_mismatches``: a message acknowledged at one offset but read at another, where a read
  saw another message at the acknowledged offset or a read called after the acknowledgement
  ended below it (the log did not reach it).
- ``ack_conflicts``: two messages acknowledged at the same offset.
- ``reordered``: for a process's successive acknowledged appends to a queue (each sent after
  the previous one was acknowledged), a later message at a lower offset than an earlier one.

A queue counts as drained when a successful read, invoked after every definite append to the
queue had returned, came back short (it reached the end of the log) and the reads together
covered every offset below where it stopped.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .histories import HistoryRecord

__all__ = ["ERROR_KINDS", "account_queue_history", "combine_accounts"]

ERROR_KINDS = (
    "lost",
    "duplicated",
    "unexpected",
    "failed_but_read",
    "offset_conflicts",
    "ack_mismatches",
    "ack_conflicts",
    "reordered",
)


@dataclass
class _Queue:
    appends: dict[Any, list[HistoryRecord]] = field(default_factory=dict)
    acked_at: dict[int, Any] = field(default_factory=dict)
    ack_conflicts: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[int, Any] = field(default_factory=dict)  # offset -> first message read there
    conflicts: dict[int, set[Any]] = field(default_factory=dict)
    positions: dict[Any, set[int]] = field(default_factory=dict)  # message -> offsets read at
    reads: list[HistoryRecord] = field(default_factory=list)
    last_definite_return: float = float("-inf")


def _ack_offset(result: Any) -> int | None:
    if isinstance(result, dict):
        result = result.get("offset")
    return result if isinstance(result, int) and not isinstance(result, bool) else None


def _msg(value: Any) -> Any:
    return tuple(_msg(v) for v in value) if isinstance(value, list) else value


def _sorted(items: Iterable[Any]) -> list[Any]:
    return sorted(items, key=lambda v: (str(type(v)), str(v)))


def account_queue_history(records: Iterable[HistoryRecord]) -> dict[str, Any]:
    """Account for every message of a queue-log history; returns a JSON-able dict."""
    queues: dict[Any, _Queue] = {}
    sends: dict[tuple[int, Any], list[HistoryRecord]] = {}
    for r in records:
        if r.f not in ("append", "read"):
            continue
        q = queues.setdefault(r.key, _Queue())
        if r.f == "append":
            msg = _msg(r.value)
            q.appends.setdefault(msg, []).append(r)
            if r.status != "info":
                q.last_definite_return = max(q.last_definite_return, r.return_)
            if r.status == "ok":
                sends.setdefault((r.process, r.key), []).append(r)
                offset = _ack_offset(r.result)
                if offset is not None:
                    other = q.acked_at.setdefault(offset, msg)
                    if other != msg:
                        q.ack_conflicts.append(
                            {"offset": offset, "messages": _sorted({other, msg})}
                        )
        elif r.f == "read" and r.status == "ok":
            q.reads.append(r)
            start = int((r.value or {}).get("offset", 0))
            for i, raw in enumerate(r.result or ()):
                msg = _msg(raw)
                at = start + i
                first = q.seen.setdefault(at, msg)
                if first != msg:
                    q.conflicts.setdefault(at, {first}).add(msg)
                q.positions.setdefault(msg, set()).add(at)

    per_queue: dict[str, Any] = {}
    for key in _sorted(queues):
        per_queue[str(key)] = _account(queues[key], {k: v for k, v in sends.items() if k[1] == key})
    return combine_accounts(per_queue)


def combine_accounts(per_queue: dict[str, Any]) -> dict[str, Any]:
    """The accounting of several queues' reports (each `account_queue_history`'s
    ``queues`` entry): totals over them and the verdict. Queues share nothing, so a long
    history can be accounted one queue at a time and combined."""
    totals: dict[str, int] = {}
    for report in per_queue.values():
        for name, value in report.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
            elif isinstance(value, (list, dict)):
                totals[name] = totals.get(name, 0) + len(value)
    valid = all(totals.get(kind, 0) == 0 for kind in ERROR_KINDS)
    return {"valid": valid, "totals": totals, "queues": per_queue}


def _short_reads(q: _Queue) -> list[tuple[float, int]]:
    """(call time, end of the log it saw) of each read that came back short."""
    short = []
    for r in q.reads:
        spec = r.value or {}
        n = spec.get("n")
        got = len(r.result or ())
        if n is not None and got < int(n):
            short.append((r.call, int(spec.get("offset", 0)) + got))
    return short


def _drained(q: _Queue) -> bool:
    ends = [end for call, end in _short_reads(q) if call >= q.last_definite_return]
    if not ends:
        return False
    end = max(ends)
    covered = bytearray(end)
    for r in q.reads:
        start = int((r.value or {}).get("offset", 0))
        stop = min(end, start + len(r.result or ()))
        if stop > start:
            covered[start:stop] = b"\x01" * (stop - start)
    return all(covered)


def _short_read_ends(q: _Queue) -> Callable[[float], float]:
    """A function of time t: the lowest offset at which a read called at or after t came
    back short (the end of the log it saw, which only grows), or +inf if none did."""
    short = sorted(_short_reads(q))
    calls = [call for call, _end in short]
    lowest = [math.inf] * (len(short) + 1)  # lowest[i]: min end of short[i:]
    for i in range(len(short) - 1, -1, -1):
        lowest[i] = min(lowest[i + 1], short[i][1])

    def after(t: float) -> float:
        return lowest[bisect.bisect_left(calls, t)]

    return after


def _account(q: _Queue, sends: dict[tuple[int, Any], list[HistoryRecord]]) -> dict[str, Any]:
    drained = _drained(q)
    status: dict[Any, str] = {}
    acked_offset: dict[Any, int] = {}
    acked_when: dict[Any, float] = {}
    for msg, attempts in q.appends.items():
        kinds = {a.status for a in attempts}
        status[msg] = "ok" if "ok" in kinds else ("info" if "info" in kinds else "fail")
        for a in attempts:
            offset = _ack_offset(a.result) if a.status == "ok" else None
            if offset is not None and msg not in acked_offset:
                acked_offset[msg] = offset
                acked_when[msg] = a.return_
    short_end_after = _short_read_ends(q)

    lost: list = []
    unread: list = []
    recovered: list = []
    failed_but_read: list = []
    mismatches: list = []
    for msg, state in status.items():
        read_at = q.positions.get(msg)
        if state == "ok":
            offset = acked_offset.get(msg)
            if not read_at:
                if drained or (offset is not None and offset in q.seen):
                    lost.append(msg)
                else:
                    unread.append(msg)
            elif offset is not None and offset not in read_at:
                if offset in q.seen or short_end_after(acked_when[msg]) <= offset:
                    mismatches.append(
                        {"message": msg, "acked": offset, "read_at": sorted(read_at)})
                else:  # the acknowledged copy was never read: a retry's second copy, or not
                    unread.append(msg)
        elif read_at:
            (recovered if state == "info" else failed_but_read).append(msg)

    duplicated = {str(m): sorted(at) for m, at in q.positions.items() if len(at) > 1}
    unexpected = [m for m in q.positions if m not in status]
    conflicts = [{"offset": o, "messages": _sorted(ms)} for o, ms in sorted(q.conflicts.items())]

    reordered = []
    for (process, _queue), acked in sorted(sends.items(), key=lambda kv: str(kv[0])):
        acked.sort(key=lambda r: r.call)
        prev_msg, prev_at, prev_ret = None, None, None
        for r in acked:
            msg = _msg(r.value)
            read_at = q.positions.get(msg)
            at = min(read_at) if read_at else acked_offset.get(msg)
            if at is None:
                continue
            if prev_at is not None and prev_ret is not None and r.call >= prev_ret and at < prev_at:
                reordered.append(
                    {
                        "process": process,
                        "earlier": prev_msg,
                        "earlier_offset": prev_at,
                        "later": msg,
                        "later_offset": at,
                    }
                )
            prev_msg, prev_at, prev_ret = msg, at, r.return_

    return {
        "drained": drained,
        "attempted": len(status),
        "acknowledged": sum(1 for s in status.values() if s == "ok"),
        "failed": sum(1 for s in status.values() if s == "fail"),
        "indeterminate": sum(1 for s in status.values() if s == "info"),
        "read": len(q.positions),
        "lost": _sorted(lost),
        "unread": len(unread),
        "duplicated": duplicated,
        "unexpected": _sorted(unexpected),
        "recovered": _sorted(recovered),
        "failed_but_read": _sorted(failed_but_read),
        "offset_conflicts": conflicts,
        "ack_mismatches": mismatches,
        "ack_conflicts": q.ack_conflicts,
        "reordered": reordered,
    }
