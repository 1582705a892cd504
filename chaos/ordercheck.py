"""The ordering checker of a chaos run: whatever hands keyed, sequenced messages to
holders one at a time (orderly push consumers holding queue locks, simple consumers'
FIFO message groups) handled each key in order and never handed a message to a second
holder while the first still held it.

The model is generic: `check_order` takes *handlings* (`Handling`: a holder, a key, a
sequence number, when it started and ended, whether the handler succeeded) and holder
*lives* (`Life`: when a holder began and stopped holding), and optionally the
(key, seq) pairs that must be handled. A holder is whatever may hand a key's messages
to a handler for a while: for queue locks, one consumer's tenure of one queue (from
the lock taken to its release, or the consumer's death). A handling that failed (the
handler raised and the message is tried again) handled nothing; one of unknown outcome
(its holder died in it) may have.

What is checked, per key, over the handlings that handled (or may have), in the order
they started (`VIOLATIONS`):

- ``out_of_order``: a seq handled after a higher one of the key was handled by a holder
  that still held then (the same holder going back, or another one starting over while
  the previous one lived on). A holder that stopped (died, or let go uncommitted) may
  have its messages handled again from an earlier point: that is not a finding;
- ``handled_twice``: a (key, seq) handled again while a holder that had handled it
  still held;
- ``skipped``: a seq handled while a lower one that must be handled had not been yet;
- ``lost``: a (key, seq) that must be handled and never was.

Times are wall-clock milliseconds (floats) of one machine, stamped by the processes
that handled and held; causality (a holder records its end before it lets go, the next
one records its start after it took over) orders them without slack.

History records (`chaos.orderedworkload`) read by `Checker`
----------------------------------------------------------
An ``invoke`` line, then one completion (``ok``, ``fail`` or ``info``) of the same
process; an operation still open at the end of the history counts as ``info``.

``order-send`` (key = the order key)
    A producer's send of ``{"seq", "queue"}``: ``ok {"offset"}`` (acknowledged: must be
    handled), ``fail`` (certainly not stored), ``info`` (unknown: neither).
``order-holder`` (key = the holder)
    A holder's life: invoke ``{"ms", "client", "queue"}`` when it starts holding,
    completion ``{"ms"}`` when it stopped (``ok``: let go; ``info``: its process died
    then). Still open at the end: it held until the end.
``order-handle`` (key = the order key)
    One handler call: invoke ``{"holder", "seq", "offset", "ms"}``; ``ok {"ms"}``
    handled; ``fail {"ms", "error"}`` the handler failed, it is tried again; ``info`` or
    still open: unknown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import entrychecks

__all__ = ["ORDER_OPS", "VIOLATIONS", "Checker", "Handling", "Life", "check_file",
           "check_lines", "check_order", "check_records"]

ORDER_OPS = frozenset({"order-send", "order-holder", "order-handle"})
VIOLATIONS = ("out_of_order", "handled_twice", "skipped", "lost")
_EXAMPLES = 20


@dataclass(frozen=True, slots=True)
class Handling:
    """One handler call of holder `holder` on (key, seq), from `start` to `end` (None:
    never seen to end); `ok` True handled, False failed (nothing handled), None unknown.
    `detail` is shown in examples (an offset, say)."""

    holder: str
    key: str
    seq: int
    start: float
    end: float | None = None
    ok: bool | None = True
    detail: Any = None


@dataclass(frozen=True, slots=True)
class Life:
    """Holder `holder` held from `start` until `end` (None: until the end of the run)."""

    holder: str
    start: float
    end: float | None = None


@dataclass(slots=True)
class _Held:
    """What one still-holding holder handled of one key."""

    top: int
    seqs: set[int] = field(default_factory=set)
    last: Handling | None = None


def _example(h: Handling) -> dict[str, Any]:
    out = {"holder": h.holder, "seq": h.seq, "start": h.start, "end": h.end, "ok": h.ok}
    if h.detail is not None:
        out["detail"] = h.detail
    return out


def check_order(handlings: Iterable[Handling], lives: Iterable[Life], *,
                expected: Iterable[tuple[str, int]] = ()) -> dict[str, Any]:
    """The verdict (module docstring) over `handlings` and holder `lives`; `expected`:
    the (key, seq) pairs that must be handled. A holder without a life is taken to hold
    from the first to the end (the strictest reading)."""
    ends: dict[str, float | None] = {}
    for life in lives:
        ends[life.holder] = life.end
    must: dict[str, list[int]] = {}
    for key, seq in expected:
        must.setdefault(key, []).append(seq)
    by_key: dict[str, list[Handling]] = {}
    failed = unknown = 0
    for h in handlings:
        if h.ok is False:
            failed += 1
            continue
        if h.ok is None:
            unknown += 1
        by_key.setdefault(h.key, []).append(h)
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in VIOLATIONS}
    counted = again = 0
    for key in sorted(set(by_key) | set(must)):
        events = sorted(by_key.get(key, []), key=lambda h: (h.start, h.seq))
        needed = sorted(set(must.get(key, [])))
        handled: set[int] = set()
        at = 0  # needed[at] is the lowest needed seq not handled yet
        holding: dict[str, _Held] = {}
        for e in events:
            counted += 1
            for holder in [h for h in holding if h != e.holder]:
                end = ends.get(holder)
                if end is not None and end <= e.start:
                    del holding[holder]  # it stopped: what it handled may be redone
            if e.seq in handled:
                again += 1
            for holder, held in holding.items():
                if held.top < e.seq:
                    continue
                assert held.last is not None
                kind = "handled_twice" if e.seq in held.seqs else "out_of_order"
                found[kind].append({
                    "key": key, "seq": e.seq, "holder": e.holder, "start": e.start,
                    "detail": e.detail, "earlier_holder": holder, "earlier_top": held.top,
                    "earlier_holder_end": ends.get(holder), "earlier": _example(held.last)})
            while at < len(needed) and needed[at] in handled:
                at += 1
            if at < len(needed) and needed[at] < e.seq:
                found["skipped"].append({
                    "key": key, "seq": e.seq, "missing": needed[at], "holder": e.holder,
                    "start": e.start, "detail": e.detail})
            handled.add(e.seq)
            held = holding.setdefault(e.holder, _Held(e.seq))
            held.top = max(held.top, e.seq)
            held.seqs.add(e.seq)
            held.last = e
        for seq in needed:
            if seq not in handled:
                found["lost"].append({"key": key, "seq": seq})
    problems = [f"{kind}: {len(found[kind])}" for kind in VIOLATIONS if found[kind]]
    return {
        "valid": not problems,
        "problems": problems,
        **{kind: len(found[kind]) for kind in VIOLATIONS},
        "keys": len(set(by_key) | set(must)),
        "holders": len(ends),
        "handlings": counted,
        "handled_again": again,
        "failed_attempts": failed,
        "unknown_handlings": unknown,
        "expected": sum(len(set(v)) for v in must.values()),
        "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
    }


@dataclass(slots=True)
class _Op:
    f: str
    key: Any
    value: Any


class Checker:
    """Reads the ``order-*`` records of a history (module docstring), one entry at a
    time (`chaos.entrychecks`); `result` is `check_order`'s verdict over them."""

    def __init__(self) -> None:
        self.open: dict[Any, _Op] = {}
        self.handlings: list[Handling] = []
        self.lives: dict[str, Life] = {}
        self.sends: dict[str, int] = {}
        self.expected: list[tuple[str, int]] = []
        self.malformed: list[str] = []

    def line(self, entry: Any, where: str) -> None:
        head = entrychecks.entry_head(entry)
        if head is None:
            return
        process, kind, f = head
        if kind == "invoke":
            stale = self.open.pop(process, None)
            if stale is not None:
                self._finish(stale, "info", None, where)
            if f in ORDER_OPS:
                op = _Op(str(f), entry.get("key"), entry.get("value"))
                try:
                    self._check_invoke(op)
                except (TypeError, ValueError, KeyError) as exc:
                    self.malformed.append(f"{where}: {f} {exc!r}")
                    return
                self.open[process] = op
            return
        done = self.open.get(process)
        if done is None or done.f != f or kind not in ("ok", "fail", "info"):
            return
        del self.open[process]
        self._finish(done, str(kind), entry.get("value"), where)

    @staticmethod
    def _check_invoke(op: _Op) -> None:
        v = op.value
        if not isinstance(v, dict) or not isinstance(op.key, str):
            raise ValueError("needs a key and a value object")
        if op.f == "order-send":
            int(v["seq"])
        elif op.f == "order-holder":
            float(v["ms"])
        else:
            str(v["holder"])
            int(v["seq"])
            float(v["ms"])

    def _finish(self, op: _Op, kind: str, result: Any, where: str) -> None:
        v = op.value
        done = result.get("ms") if isinstance(result, dict) else None
        try:
            if op.f == "order-send":
                self.sends[kind] = self.sends.get(kind, 0) + 1
                if kind == "ok":
                    self.expected.append((op.key, int(v["seq"])))
            elif op.f == "order-holder":
                self.lives[op.key] = Life(op.key, float(v["ms"]),
                                          None if done is None else float(done))
            else:
                ok = {"ok": True, "fail": False}.get(kind)
                self.handlings.append(Handling(
                    str(v["holder"]), op.key, int(v["seq"]), float(v["ms"]),
                    None if done is None else float(done), ok,
                    {"offset": v.get("offset")} if "offset" in v else None))
        except (TypeError, ValueError, KeyError) as exc:
            self.malformed.append(f"{where}: {op.f} {exc!r}")

    def result(self) -> dict[str, Any]:
        for process, op in list(self.open.items()):  # open at the end: unknown
            del self.open[process]
            self._finish(op, "info", None, "end")
        for h in self.handlings:  # a holder seen only in its handlings holds throughout
            if h.holder not in self.lives:
                self.lives[h.holder] = Life(h.holder, h.start, None)
        out = check_order(self.handlings, self.lives.values(), expected=self.expected)
        out["sends"] = dict(sorted(self.sends.items()))
        out["malformed"] = len(self.malformed)
        if self.malformed:
            out["valid"] = False
            out["problems"].append(f"malformed: {len(self.malformed)}")
            out["examples"]["malformed"] = self.malformed[:_EXAMPLES]
        return out


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history; lines naming none of `ORDER_OPS`
    are skipped."""
    return entrychecks.check_lines(Checker(), lines, ORDER_OPS)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path, ORDER_OPS)
