"""History parsers: Jepsen etcd logs, EDN key/value logs and raftmq's own JSON-lines histories.

Completions are matched to the pending invoke of the same process. ``fail`` means the
operation definitely did not happen, so it is dropped; ``info`` means the outcome is unknown,
so the operation stays pending forever (return time +inf, output ``UNKNOWN``).

JSON lines (``jsonl``), written by the chaos workloads, one object per line::

    {"process": 3, "type": "invoke", "f": "append", "key": "q1", "value": "m-17", "time": 12.5}
    {"process": 3, "type": "ok",     "f": "append", "key": "q1", "value": {"offset": 4}, "time": 12.6}

- ``process``: int (or a name), the client; one operation at a time per process. An invoke
  while the previous one is still open leaves that one pending forever, as if ``info``.
- ``type``: ``invoke`` | ``ok`` | ``fail`` | ``info`` | ``attempt``. An ``attempt`` line
  (same ``f``, ``key`` and ``value`` as the open invoke of its process) says that a request
  that may take effect was sent for that operation: a plain producer's first send and
  each retry. `HistoryRecord.attempts` holds their times; an operation may take effect
  once per attempt, so a second copy of a message needs a second attempt.
- ``time``: float, monotonic seconds (optional; the line number is used when absent).
- Lines of ``"process": "nemesis"`` record faults (``invoke`` when one starts, ``info`` when
  it ends; ``f`` names the fault, ``value`` its details). They are not client operations:
  `parse_jsonl` skips them and `parse_faults` pairs them into intervals.
- ``f``/``key``/``value`` per model (``value`` of ``invoke`` is the input, of ``ok`` the result;
  JSON lists used as keys become tuples):

  - ``queue-log``: ``append`` (key = queue, value = message id; ok value = ``{"offset": n}``
    or ``n``) and ``read`` (key = queue, value = ``{"offset": o, "n": n}``; ok value = list of
    message ids).
  - ``consumer-offset``: ``commit`` (key = ``[group, queue]``, value = offset), ``delete``
    (the group deleted) and ``read`` (ok value = committed offset or null).
  - ``topic-config``: ``create`` and ``grow`` (key = the topic's key, value = queue count;
    ok value ``"ok"``, ``"exists"`` or ``"refused"``), ``delete`` (ok value ``"ok"`` or
    ``"missing"``) and ``read`` (ok value = queue count or null).
  - ``kv``: ``get`` (ok value = the string), ``put`` and ``append`` (value = the string).
  - ``cas-register``: ``read`` (ok value), ``write`` (value), ``cas`` (value = ``[old, new]``;
    ok value ``false`` when the comparison failed, anything else when it applied).

Jepsen etcd logs (``jepsen-log``): ``INFO jepsen.util - <process> <:invoke|:ok|:fail|:info>
<:read|:write|:cas> <value>``; ``:fail :cas`` completes a cas that did not apply and
``:fail :read :timed-out`` a read with an unknown result.

EDN key/value logs (``edn-kv``): ``{:process P, :type :invoke|:ok|:fail|:info, :f
:get|:put|:append, :key "k", :value v}``, one map per line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from .model import INFINITY, UNKNOWN, Event, EventKind, Operation, events_to_operations

__all__ = [
    "FORMATS",
    "NEMESIS",
    "Fault",
    "HistoryRecord",
    "Keyword",
    "load_operations",
    "parse_edn",
    "parse_edn_kv",
    "parse_jepsen_log",
    "parse_jsonl",
    "parse_numbered_jsonl",
    "parse_faults",
    "read_spec",
    "records_to_operations",
]

FORMATS = ("jepsen-log", "edn-kv", "jsonl")
NEMESIS = "nemesis"  # the process name of fault lines in a JSON-lines history


def _lines(source: str | Path | Iterable[str]) -> Iterator[tuple[int, str, str]]:
    """Non-blank, stripped lines with their number and a "line N" label for errors.

    A file is read as it is walked, never whole: a long run's history is gigabytes."""
    if isinstance(source, (str, Path)):
        with Path(source).open(encoding="utf-8") as lines:
            yield from _numbered(enumerate(lines, start=1))
    else:
        yield from _numbered(enumerate(source, start=1))


def _numbered(pairs: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str, str]]:
    for number, line in pairs:
        line = line.strip()
        if line:
            yield number, f"line {number}", line


class _Pending:
    """Builds an event history, matching completions to each process's open invoke."""

    def __init__(self) -> None:
        self.slots: list[tuple[EventKind, int, int, Any]] = []  # kind, id, client, value
        self.dropped: set[int] = set()
        self.open: dict[Any, int] = {}
        self.next_id = 0

    def invoke(self, process: Any, client: int, value: Any) -> None:
        op_id = self.next_id
        self.next_id += 1
        self.open[process] = op_id
        self.slots.append((EventKind.CALL, op_id, client, value))

    def complete(self, process: Any, client: int, value: Any, where: str) -> None:
        op_id = self._take(process, where)
        self.slots.append((EventKind.RETURN, op_id, client, value))

    def drop(self, process: Any, where: str) -> None:
        self.dropped.add(self._take(process, where))

    def abandon(self, process: Any, where: str) -> None:
        self._take(process, where)  # stays pending forever: no return event

    def _take(self, process: Any, where: str) -> int:
        try:
            return self.open.pop(process)
        except KeyError:
            raise ValueError(
                f"{where}: completion for process {process!r} with no pending invoke"
            ) from None

    def events(self) -> list[Event]:
        return [
            Event(client, kind, value, op_id)
            for kind, op_id, client, value in self.slots
            if op_id not in self.dropped
        ]


_JEPSEN = re.compile(
    r"^INFO\s+jepsen\.util\s+-\s+(\d+)\s+:(invoke|ok|fail|info)\s+:(read|write|cas)\s+(.*?)\s*$"
)


def _jepsen_value(text: str, where: str) -> Any:
    if text == "nil":
        return None
    if text == ":timed-out":
        return UNKNOWN
    if text.startswith("["):
        parts = text.strip("[]").split()
        if len(parts) != 2:
            raise ValueError(f"{where}: expected [old new], got {text!r}")
        return (_jepsen_value(parts[0], where), _jepsen_value(parts[1], where))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{where}: cannot parse value {text!r}") from None


def parse_jepsen_log(source: str | Path | Iterable[str]) -> list[Event]:
    """Events of a Jepsen etcd CAS-register log; inputs are the CAS model's tuples."""
    pending = _Pending()
    kinds: dict[int, str] = {}
    for _number, where, line in _lines(source):
        found = _JEPSEN.match(line)
        if not found:
            raise ValueError(f"{where}: not a jepsen.util history line: {line!r}")
        process = int(found.group(1))
        kind, f = found.group(2), found.group(3)
        value = _jepsen_value(found.group(4), where)
        if kind == "invoke":
            if f == "read":
                inp: tuple = ("read",)
            elif f == "write":
                inp = ("write", value)
            else:
                inp = ("cas", value[0], value[1])
            kinds[process] = f
            pending.invoke(process, process, inp)
        elif kind == "ok":
            output = value if f == "read" else (True if f == "cas" else None)
            pending.complete(process, process, output, where)
        elif kind == "fail":
            if f == "cas" and value is not UNKNOWN:
                pending.complete(process, process, False, where)
            elif f == "read" and value is UNKNOWN:
                pending.complete(process, process, UNKNOWN, where)
            else:
                pending.drop(process, where)
        else:
            pending.abandon(process, where)
    return pending.events()


class Keyword(str):
    """An EDN keyword such as ``:invoke``, held without its colon."""

    __slots__ = ()

    def __repr__(self) -> str:
        return ":" + str(self)


_EDN_TOKEN = re.compile(
    r"""[\s,]*(?:
        (?P<open>[\[{(]) | (?P<close>[\]})]) |
        "(?P<string>(?:[^"\\]|\\.)*)" |
        :(?P<keyword>[^\s,\[\]{}()"]+) |
        (?P<atom>[^\s,\[\]{}()"]+)
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def parse_edn(text: str) -> Any:
    """Parse one EDN value: maps, vectors, lists, strings, keywords, numbers, nil, booleans."""
    tokens = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip(" \t\r\n,"):
            break
        found = _EDN_TOKEN.match(text, pos)
        if not found:
            raise ValueError(f"cannot parse EDN near {text[pos : pos + 20]!r}")
        tokens.append(found)
        pos = found.end()
    value, used = _edn_value(tokens, 0)
    if used != len(tokens):
        raise ValueError("trailing data after EDN value")
    return value


def _edn_value(tokens: list[re.Match[str]], i: int) -> tuple[Any, int]:
    if i >= len(tokens):
        raise ValueError("unexpected end of EDN value")
    tok = tokens[i]
    if tok.group("open"):
        closer = {"[": "]", "{": "}", "(": ")"}[tok.group("open")]
        items = []
        i += 1
        while i < len(tokens) and tokens[i].group("close") is None:
            item, i = _edn_value(tokens, i)
            items.append(item)
        if i >= len(tokens) or tokens[i].group("close") != closer:
            raise ValueError(f"unbalanced EDN, expected {closer!r}")
        if closer == "}":
            if len(items) % 2:
                raise ValueError("EDN map with an odd number of forms")
            return {_hashable(items[k]): items[k + 1] for k in range(0, len(items), 2)}, i + 1
        return (tuple(items) if closer == ")" else items), i + 1
    if tok.group("close"):
        raise ValueError(f"unexpected {tok.group('close')!r} in EDN")
    if tok.group("string") is not None:
        raw = tok.group("string")
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), raw), i + 1
    if tok.group("keyword") is not None:
        return Keyword(tok.group("keyword")), i + 1
    atom = tok.group("atom")
    if atom == "nil":
        return None, i + 1
    if atom in ("true", "false"):
        return atom == "true", i + 1
    for convert in (int, float):
        try:
            return convert(atom), i + 1
        except ValueError:
            pass
    return atom, i + 1  # a bare symbol


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _client_id(process: Any, names: dict[Any, int]) -> int:
    """Integer client id; named processes (``:nemesis``) get stable negative numbers."""
    if isinstance(process, int) and not isinstance(process, bool):
        return process
    return names.setdefault(process, -1 - len(names))


def parse_edn_kv(source: str | Path | Iterable[str]) -> list[Event]:
    """Events of an EDN get/put/append log; inputs are the key/value model's tuples."""
    pending = _Pending()
    names: dict[Any, int] = {}
    for _number, where, line in _lines(source):
        try:
            entry = parse_edn(line)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an EDN map")
        try:
            process, kind, f = entry["process"], entry["type"], entry["f"]
        except KeyError as exc:
            raise ValueError(f"{where}: missing {exc.args[0]}") from None
        client = _client_id(process, names)
        key = entry.get("key")
        value = entry.get("value")
        if kind == "invoke":
            inp: tuple = ("get", key) if f == "get" else (str(f), key, value)
            pending.invoke(process, client, inp)
        elif kind == "ok":
            pending.complete(process, client, value if f == "get" else None, where)
        elif kind == "fail":
            pending.drop(process, where)
        elif kind == "info":
            pending.abandon(process, where)
        else:
            raise ValueError(f"{where}: unknown :type {kind!r}")
    return pending.events()


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One operation of a JSON-lines history with its raw completion, before modelling."""

    process: int
    f: str
    key: Any
    value: Any
    status: str  # "ok" | "fail" | "info" ("info" also for an invoke never completed)
    result: Any
    call: float
    return_: float
    attempts: tuple[float, ...] = ()
    """Times of the operation's ``attempt`` lines (requests that may have taken effect)."""
    line: int = 0
    """Line number of the invoke, for error messages."""


def _key(value: Any) -> Any:
    return tuple(_key(v) for v in value) if isinstance(value, list) else value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_hashable(value: Any) -> bool:
    """A JSON value usable as a key or an id: scalars and lists of them (not objects)."""
    if isinstance(value, list):
        return all(_is_hashable(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _time(entry: dict[str, Any], number: int, where: str) -> float:
    at = entry.get("time", number)
    if not _is_number(at) or at != at or at in (INFINITY, -INFINITY):
        raise ValueError(f"{where}: 'time' must be a finite number, got {at!r}")
    return float(at)


_KINDS = ("invoke", "ok", "fail", "info", "attempt")


def is_process(process: Any) -> TypeGuard[int | str]:
    """A history line's `process`: an int (a client) or a name (a worker), never a bool."""
    return isinstance(process, (int, str)) and not isinstance(process, bool)


def parse_jsonl(source: str | Path | Iterable[str]) -> list[HistoryRecord]:
    """Pair the invoke/ok/fail/info lines of a raftmq chaos history into records.

    Lines that are not what the format says (not an object, a process that is neither an
    int nor a name, an unknown type, a key that is an object, a time that is not a
    number, a completion or attempt with no open invoke) raise ValueError naming the line.
    """
    return parse_numbered_jsonl(_lines(source))


def parse_numbered_jsonl(lines: Iterable[tuple[int, str, str]]) -> list[HistoryRecord]:
    """`parse_jsonl` over (number, "line N", text) triples: some lines of a history with
    their own line numbers (one queue's, say), so errors and times name the original line.
    Message ids and keys are shared between records (one string per distinct id), since a
    long history repeats each id in many reads."""
    open_ops: dict[Any, tuple[int, dict[str, Any], float, list[float]]] = {}
    names: dict[Any, int] = {}
    done: list[tuple[int, HistoryRecord]] = []
    shared: dict[str, str] = {}
    for number, where, line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(entry, dict) or "process" not in entry or "type" not in entry:
            raise ValueError(f"{where}: needs 'process' and 'type'")
        process, kind = entry["process"], entry["type"]
        if process == NEMESIS:
            continue
        _share(entry, shared)
        if not is_process(process):
            raise ValueError(f"{where}: 'process' must be an int or a name, got {process!r}")
        if kind not in _KINDS:
            raise ValueError(f"{where}: unknown type {kind!r}")
        at = _time(entry, number, where)
        if kind == "invoke":
            if not isinstance(entry.get("f"), str):
                raise ValueError(f"{where}: invoke without 'f' (a string)")
            if not _is_hashable(entry.get("key")):
                raise ValueError(f"{where}: 'key' must be a string, a number or a list of them")
            if process in open_ops:
                seq, first, call, tries = open_ops.pop(process)
                done.append((seq, _record(first, "info", UNKNOWN, call, INFINITY, names, tries, seq)))
            open_ops[process] = (number, entry, at, [])
            continue
        if process not in open_ops:
            raise ValueError(f"{where}: {kind} for process {process!r} with no pending invoke")
        seq, first, call, tries = open_ops[process]
        if at < call:
            raise ValueError(f"{where}: {kind} time {at} precedes its invoke at {call}")
        if tries and at < tries[-1]:
            raise ValueError(f"{where}: {kind} time {at} precedes an attempt at {tries[-1]}")
        if kind == "attempt":
            if any(entry.get(k) != first.get(k) for k in ("f", "key", "value")):
                raise ValueError(
                    f"{where}: attempt does not match the open {first.get('f')!r} of process "
                    f"{process!r} (line {seq})"
                )
            tries.append(at)
            continue
        del open_ops[process]
        if kind == "info":
            done.append((seq, _record(first, "info", UNKNOWN, call, INFINITY, names, tries, seq)))
        else:
            done.append((seq, _record(first, kind, entry.get("value"), call, at, names, tries, seq)))
    for seq, first, call, tries in open_ops.values():
        done.append((seq, _record(first, "info", UNKNOWN, call, INFINITY, names, tries, seq)))
    done.sort(key=lambda item: item[0])
    return [record for _seq, record in done]


def _share(entry: dict[str, Any], shared: dict[str, str]) -> None:
    """Replace the strings of an entry's key and value (or list value) by shared copies."""
    for field in ("key", "value"):
        value = entry.get(field)
        if isinstance(value, str):
            entry[field] = shared.setdefault(value, value)
        elif isinstance(value, list):
            entry[field] = [shared.setdefault(v, v) if isinstance(v, str) else v for v in value]


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault a nemesis injected: from `start` until `end` (+inf if never healed).

    `value` is the fault's final description (the end line's, when it gave one);
    `start_value` the one recorded when it began, e.g. the leaders it was about to take.
    """

    f: str
    value: Any
    start: float
    end: float
    start_value: Any = None


def parse_faults(source: str | Path | Iterable[str]) -> list[Fault]:
    """The nemesis intervals of a JSON-lines history, in start order.

    Each fault is an ``invoke`` followed by an ``info`` with the same ``f`` (several faults
    may overlap; an end closes the earliest open fault of its ``f``). The info's ``value``,
    when present, replaces the invoke's; the invoke's stays as ``start_value``. Lines that
    cannot be nemesis lines are skipped before decoding: a history is mostly operations.
    """
    open_faults: dict[str, list[tuple[int, dict[str, Any], float]]] = {}
    done: list[tuple[int, Fault]] = []
    for number, where, line in _lines(source):
        if NEMESIS not in line:
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(entry, dict) or entry.get("process") != NEMESIS:
            continue
        f, kind = str(entry.get("f")), entry.get("type")
        at = _time(entry, number, where)
        if kind == "invoke":
            open_faults.setdefault(f, []).append((number, entry, at))
        elif kind in ("info", "ok", "fail"):
            pending = open_faults.get(f)
            if not pending:
                raise ValueError(f"{where}: end of fault {f!r} that never started")
            seq, first, start = pending.pop(0)
            value = entry.get("value", first.get("value"))
            done.append((seq, Fault(f, value, start, at, first.get("value"))))
        else:
            raise ValueError(f"{where}: unknown type {kind!r}")
    for pending in open_faults.values():
        for seq, first, start in pending:
            value = first.get("value")
            done.append((seq, Fault(str(first.get("f")), value, start, INFINITY, value)))
    done.sort(key=lambda item: item[0])
    return [fault for _seq, fault in done]


def _record(
    invoke: dict[str, Any], status: str, result: Any, call: float, ret: float,
    names: dict[Any, int], attempts: list[float], line: int,
) -> HistoryRecord:
    return HistoryRecord(
        process=_client_id(invoke["process"], names),
        f=str(invoke["f"]),
        key=_key(invoke.get("key")),
        value=invoke.get("value"),
        status=status,
        result=result,
        call=call,
        return_=ret,
        attempts=tuple(attempts),
        line=line,
    )


_UNBOUNDED = 1 << 62  # a read without "n" returns everything from its offset


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(r: HistoryRecord, what: str, got: Any) -> ValueError:
    where = f"line {r.line}: " if r.line else ""
    return ValueError(f"{where}{r.f} of process {r.process} on {r.key!r}: {what}, got {got!r}")


def _append_offset(r: HistoryRecord) -> Any:
    """The offset an acknowledged append reports: ``{"offset": n}`` or ``n``; a dict without
    an offset (an acknowledgement that did not say where) is ``UNKNOWN``."""
    result = r.result
    if isinstance(result, dict):
        if "offset" not in result:
            return UNKNOWN
        result = result["offset"]
    if not _count(result):
        raise _bad(r, "an acknowledged append's value must be {\"offset\": n} or n >= 0", r.result)
    return result


def read_spec(r: HistoryRecord) -> tuple[int, int | None]:
    """(offset, n) of a queue read's invoke value ``{"offset": o, "n": n}`` (both optional;
    n None: no limit); raises ValueError for anything else."""
    spec = {} if r.value is None else r.value
    if not isinstance(spec, dict):
        raise _bad(r, 'a read\'s value must be {"offset": o, "n": n}', r.value)
    offset, n = spec.get("offset", 0), spec.get("n")
    if not _count(offset) or not (n is None or _count(n)):
        raise _bad(r, "a read's offset and n must be integers >= 0", r.value)
    return offset, n


def _read_ids(r: HistoryRecord) -> tuple:
    """The message ids an ok queue read returned (a list of strings, numbers or lists)."""
    if not isinstance(r.result, list) or not all(
        _is_hashable(m) and m is not None for m in r.result
    ):
        raise _bad(r, "a read's result must be a list of message ids", r.result)
    return tuple(_key(m) for m in r.result)


def _message(r: HistoryRecord) -> Any:
    if r.value is None or not _is_hashable(r.value):
        raise _bad(r, "a message id must be a string, a number or a list of them", r.value)
    return _key(r.value)


def _scalar(r: HistoryRecord, value: Any, what: str) -> Any:
    if not _is_hashable(value):
        raise _bad(r, f"{what} must be a string, a number, null or a list of them", value)
    return _key(value)


_TOPIC_OUTPUTS = {"create": ("ok", "exists"), "grow": ("ok", "refused"),
                  "delete": ("ok", "missing")}


def _topic_op(r: HistoryRecord, result: Any) -> tuple[tuple, Any]:
    """A topic-config record as (input, output); see `chaos.models.TopicConfigModel`."""
    if r.f == "read":
        if result is not UNKNOWN and not (result is None or _count(result)):
            raise _bad(r, "a topic read's result must be a queue count or null", result)
        return ("read", r.key), result
    if r.f not in _TOPIC_OUTPUTS:
        raise ValueError(f"topic-config has no operation {r.f!r}")
    if result is not UNKNOWN and result not in _TOPIC_OUTPUTS[r.f]:
        raise _bad(r, f"a topic {r.f}'s result must be one of {_TOPIC_OUTPUTS[r.f]}", result)
    if r.f == "delete":
        return ("delete", r.key), result
    if not _count(r.value) or r.value < 1:
        raise _bad(r, f"a topic {r.f}'s value must be a queue count >= 1", r.value)
    return (r.f, r.key, r.value), result


def records_to_operations(records: Iterable[HistoryRecord], model: str) -> list[Operation]:
    """Operations for ``model`` from JSON-lines records; failed operations are dropped.

    Values that do not have the shape the model's operations need (see the module
    docstring) raise ValueError naming the line, rather than reaching the checker."""
    ops: list[Operation] = []
    for r in records:
        if r.status == "fail":
            if model == "queue-log" and r.f == "append":
                _message(r)  # the accounting still reads it
            continue
        known = r.status == "ok"
        result = r.result if known else UNKNOWN
        if model == "queue-log":
            if r.f == "append":
                inp: tuple = ("append", r.key, _message(r))
                out = _append_offset(r) if known else UNKNOWN
            elif r.f == "read":
                offset, n = read_spec(r)
                inp = ("read", r.key, offset, _UNBOUNDED if n is None else n)
                out = _read_ids(r) if known else UNKNOWN
            else:
                raise ValueError(f"queue-log has no operation {r.f!r}")
        elif model == "consumer-offset":
            if r.f == "commit":
                inp, out = ("commit", r.key, _scalar(r, r.value, "an offset")), None
            elif r.f == "delete":
                inp, out = ("delete", r.key), None
            elif r.f == "read":
                inp = ("read", r.key)
                out = _scalar(r, result, "an offset read") if known else UNKNOWN
            else:
                raise ValueError(f"consumer-offset has no operation {r.f!r}")
        elif model == "topic-config":
            inp, out = _topic_op(r, result if known else UNKNOWN)
        elif model == "kv":
            if r.f == "get":
                inp = ("get", r.key)
                out = _scalar(r, result, "a get's result") if known else UNKNOWN
            elif r.f in ("put", "append"):
                if not isinstance(r.value, str):
                    raise _bad(r, "a put or append writes a string", r.value)
                inp, out = (r.f, r.key, r.value), None
            else:
                raise ValueError(f"kv has no operation {r.f!r}")
        elif model == "cas-register":
            if r.f == "read":
                inp = ("read",)
                out = _scalar(r, result, "a read's result") if known else UNKNOWN
            elif r.f == "write":
                inp, out = ("write", _scalar(r, r.value, "a written value")), None
            elif r.f == "cas":
                if not (isinstance(r.value, list) and len(r.value) == 2
                        and all(_is_hashable(v) for v in r.value)):
                    raise _bad(r, "a cas's value must be [old, new]", r.value)
                old, new = (_key(v) for v in r.value)
                inp = ("cas", old, new)
                out = UNKNOWN if not known else result is not False
            else:
                raise ValueError(f"cas-register has no operation {r.f!r}")
        else:
            raise ValueError(f"no JSON-lines mapping for model {model!r}")
        ops.append(Operation(r.process, inp, r.call, out, r.return_))
    return ops


def load_operations(path: str | Path, fmt: str, model: str) -> list[Operation]:
    """Read a history file in ``fmt`` as operations for ``model``."""
    if fmt == "jepsen-log":
        if model != "cas-register":
            raise ValueError("jepsen-log histories are cas-register histories")
        return events_to_operations(parse_jepsen_log(path))
    if fmt == "edn-kv":
        if model != "kv":
            raise ValueError("edn-kv histories are kv histories")
        return events_to_operations(parse_edn_kv(path))
    if fmt == "jsonl":
        return records_to_operations(parse_jsonl(path), model)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
