"""The options of the `raftmq` Spark source, parsed and checked, and the offset arithmetic.

Pure: no Spark, no network. Names and meanings follow Spark's Kafka source, so a user
who knows `spark.read.format("kafka")` knows this one:

- ``namesrv``: name server address(es), comma separated (Kafka's ``kafka.bootstrap.servers``);
- exactly one of ``subscribe`` (topics, comma separated), ``subscribePattern`` (a regular
  expression a whole topic name must match) or ``assign`` (JSON ``{"topic": [queues]}``);
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON
  ``{"topic": {"queue": offset}}`` where -2 means earliest and -1 latest; a queue the JSON
  leaves out starts at earliest and ends at latest (Kafka insists on every partition);
- ``failOnDataLoss`` (default true): a range retention already removed is an error, or
  with false it is skipped and the skip is logged;
- ``maxOffsetsPerTrigger``: at most this many messages per micro-batch, shared among the
  queues in proportion to what each has waiting (Kafka's rule, small queues never starved);
- ``minPartitions``: split the ranges so a read has at least this many Spark partitions;
- ``tags``: RocketMQ's tag subscription (``TagA || TagB``, ``*`` for all), filtered on the
  broker by the tag hash in the ConsumeQueue; offsets still count every message;
- ``filter``: a SQL92 filter (RocketMQ's ``MessageSelector.bySql``, `raftmq.filter`)
  decided on the broker over each message's properties (plus ``TAGS`` and ``KEYS``):
  only the rows it matches are read; with ``tags``, both must match. A bad one is an
  `OptionError` naming the line and column, when the query is defined.

- ``startingTimestamp`` / ``endingTimestamp`` (epoch ms, every queue) and
  ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` (JSON
  ``{"topic": {"queue": ms}}``): as in Kafka's source, they win over
  ``startingOffsets``/``endingOffsets`` (the single timestamp over the JSON), and are
  mapped to offsets once, when the query starts, with the nodes' time index
  (``Admin.offsets_for_times``): a queue starts at its first message stored at or after
  the time, and ends before its first one stored at or after the ending time (at its end
  when none was). A queue with no message at or after the starting time fails the query
  (``startingOffsetsByTimestampStrategy`` = ``error``, Kafka's default) or starts at its
  end (``latest``). Queues the JSON leaves out start at earliest and end at latest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raftmq.client.consumer import parse_tags
from raftmq.filter import FilterError
from raftmq.filter import compile as compile_filter

__all__ = [
    "EARLIEST",
    "LATEST",
    "Offsets",
    "OptionError",
    "QueueRange",
    "SourceOptions",
    "Times",
    "admit",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offsets_dict",
    "parse_options",
    "resolve",
    "split_ranges",
    "times_for",
]

EARLIEST = -2
LATEST = -1

Offsets = dict[str, dict[int, int]]
"""topic -> queue -> offset (the next offset to read)."""

_KNOWN = {"namesrv", "subscribe", "subscribepattern", "assign", "startingoffsets",
          "endingoffsets", "failondataloss", "maxoffsetspertrigger", "minpartitions",
          "fetchtimeout", "tags", "filter", "path", "startingtimestamp",
          "startingoffsetsbytimestamp", "endingtimestamp", "endingoffsetsbytimestamp",
          "startingoffsetsbytimestampstrategy"}

Times = int | dict[str, dict[int, int]]
"""Store times (epoch ms) to map to offsets: one for every queue, or topic -> queue -> ms."""


class OptionError(ValueError):
    """An option of the raftmq source is missing, unknown or malformed (the caller's fault)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    namesrv: tuple[str, ...]
    subscribe: tuple[str, ...] | None
    pattern: str | None
    assign: dict[str, tuple[int, ...]] | None
    starting: str | Offsets  # "earliest" | "latest" | explicit offsets (may hold -2/-1)
    ending: str | Offsets
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fetch_timeout: float
    tags: tuple[str, ...] | None = None
    sql: str | None = None  # the `filter` option
    starting_times: Times | None = None  # startingTimestamp / startingOffsetsByTimestamp
    ending_times: Times | None = None  # endingTimestamp / endingOffsetsByTimestamp
    missing_start: str = "error"  # startingOffsetsByTimestampStrategy: error | latest

    def matches(self, topic: str) -> bool:
        """Whether `topic` is one this source reads (for subscribe and subscribePattern)."""
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return self.assign is not None and topic in self.assign


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Messages [start, end) of one queue: one Spark input partition's worth."""

    topic: str
    queue: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"{name} is 'true' or 'false', not {text!r}")
    return value == "true"


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, not {text!r}") from None
    if value < 1:
        raise OptionError(f"{name} must be a positive integer, not {text!r}")
    return value


def offsets_from_json(text: str, name: str = "offsets") -> Offsets:
    """`{"topic": {"queue": offset}}` (queue ids as strings, as JSON keys are) -> Offsets."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name} is 'earliest', 'latest' or JSON like "
                          f'{{"topic": {{"0": 23}}}}: {exc.msg} in {text!r}') from None
    if not isinstance(raw, dict):
        raise OptionError(f"{name} JSON must be an object of topics, got {text!r}")
    out: Offsets = {}
    for topic, queues in raw.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{name}: topic {topic!r} must map queues to offsets, got "
                              f"{queues!r}")
        per: dict[int, int] = {}
        for q, off in queues.items():
            try:
                queue = int(q)
            except (TypeError, ValueError):
                raise OptionError(f"{name}: queue {q!r} of {topic!r} is not a number") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST or queue < 0:
                raise OptionError(f"{name}: {topic!r} queue {q}: offset must be an integer >= 0, "
                                  f"or -2 (earliest) / -1 (latest), got {off!r}")
            per[queue] = off
        out[str(topic)] = per
    return out


def offsets_to_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Offsets as the JSON-able dict Spark checkpoints (sorted, queue ids as strings)."""
    return {t: {str(q): int(o) for q, o in sorted(qs.items())} for t, qs in sorted(offsets.items())}


def _offset_spec(name: str, text: str | None, default: str, *, batch: bool, ending: bool
                 ) -> str | Offsets:
    if text is None:
        return default
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        if batch and not ending and word == "latest":
            raise OptionError("startingOffsets='latest' is not allowed in a batch query "
                              "(it would read nothing)")
        if ending and word == "earliest":
            raise OptionError("endingOffsets='earliest' is not allowed (it would read nothing)")
        return word
    offsets = offsets_from_json(text, name)
    for topic, queues in offsets.items():
        for q, off in queues.items():
            if batch and not ending and off == LATEST:
                raise OptionError(f"startingOffsets: latest (-1) for {topic!r} queue {q} is "
                                  "not allowed in a batch query")
            if ending and off == EARLIEST:
                raise OptionError(f"endingOffsets: earliest (-2) for {topic!r} queue {q} is "
                                  "not allowed")
    return offsets


def parse_options(options: Mapping[str, str], *, batch: bool) -> SourceOptions:
    """Check the source's options (names are case-insensitive, as Spark passes them)."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise OptionError(f"unknown option(s) {unknown} of the raftmq source (known: "
                          f"{sorted(_KNOWN - {'path'})})")
    namesrv = tuple(a.strip() for a in opts.get("namesrv", "").split(",") if a.strip())
    if not namesrv:
        raise OptionError("option 'namesrv' is required: the name server address(es), "
                          "e.g. 127.0.0.1:9876")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise OptionError("exactly one of 'subscribe', 'subscribePattern' or 'assign' is "
                          f"required, got {chosen or 'none'}")
    subscribe = pattern = assign = None
    if "subscribe" in opts:
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise OptionError("subscribe names no topic")
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"subscribePattern {pattern!r} is not a regular expression: "
                              f"{exc}") from None
    else:
        try:
            raw = json.loads(opts["assign"])
            assign = {str(t): tuple(sorted({int(q) for q in qs})) for t, qs in raw.items()
                      if isinstance(qs, list)
                      and all(isinstance(q, int) and not isinstance(q, bool) and q >= 0
                              for q in qs)}
            if not raw or len(assign) != len(raw):
                raise ValueError
        except (ValueError, AttributeError, TypeError):
            raise OptionError(f"assign must be JSON like {{\"topic\": [0, 1]}}, got "
                              f"{opts['assign']!r}") from None
    starting = _offset_spec("startingOffsets", opts.get("startingoffsets"),
                            "earliest" if batch else "latest", batch=batch, ending=False)
    if not batch and "endingoffsets" in opts:
        raise OptionError("endingOffsets is for batch queries only (a stream has no end)")
    ending = _offset_spec("endingOffsets", opts.get("endingoffsets"), "latest", batch=batch,
                          ending=True)
    starting_times = _times("startingTimestamp", "startingOffsetsByTimestamp", opts)
    ending_times = _times("endingTimestamp", "endingOffsetsByTimestamp", opts)
    if not batch and ending_times is not None:
        raise OptionError("endingTimestamp is for batch queries only (a stream has no end)")
    missing_start = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if missing_start not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy is 'error' or 'latest', not "
                          f"{opts['startingoffsetsbytimestampstrategy']!r}")
    max_per_trigger = (_positive("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
                       if "maxoffsetspertrigger" in opts else None)
    min_partitions = (_positive("minPartitions", opts["minpartitions"])
                      if "minpartitions" in opts else None)
    try:
        fetch_timeout = float(opts.get("fetchtimeout", "60"))
        if not fetch_timeout > 0:
            raise ValueError
    except ValueError:
        raise OptionError(f"fetchTimeout is a positive number of seconds, not "
                          f"{opts['fetchtimeout']!r}") from None
    try:
        tags = parse_tags(opts["tags"]) if "tags" in opts else None
    except ValueError as exc:
        raise OptionError(f"tags: {exc}") from None
    sql = opts.get("filter")
    if sql is not None:
        try:  # strict, as the node compiles it: a mistake is the caller's, named here
            compile_filter(sql, strict=True)
        except FilterError as exc:
            raise OptionError(f"filter: {exc}") from None
    return SourceOptions(
        tags=tuple(tags) if tags else None, sql=sql,
        namesrv=namesrv, subscribe=subscribe, pattern=pattern, assign=assign,
        starting=starting, ending=ending, starting_times=starting_times,
        ending_times=ending_times, missing_start=missing_start,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        max_offsets_per_trigger=max_per_trigger, min_partitions=min_partitions,
        fetch_timeout=fetch_timeout,
    )


def _times(single: str, by_queue: str, opts: Mapping[str, str]) -> Times | None:
    """The store times of `single` (epoch ms for every queue, which wins, as in Kafka)
    or `by_queue` (JSON {"topic": {"queue": ms}}); None when neither is given."""
    if single.lower() in opts:
        text = opts[single.lower()].strip()
        if not text.isdigit():
            raise OptionError(f"{single} is epoch milliseconds (an integer >= 0), not "
                              f"{opts[single.lower()]!r}")
        return int(text)
    if by_queue.lower() not in opts:
        return None
    per = offsets_from_json(opts[by_queue.lower()], by_queue)
    for topic, queues in per.items():
        for q, ms in queues.items():
            if ms < 0:
                raise OptionError(f"{by_queue}: {topic!r} queue {q}: a time is epoch "
                                  f"milliseconds >= 0, not {ms}")
    return per


def times_for(times: Times, queues: Iterable[tuple[str, int]], name: str
              ) -> dict[tuple[str, int], int]:
    """The store time of each of `queues` that `times` gives one; a queue named in
    `times` that is not read is an OptionError."""
    queues = list(queues)
    if isinstance(times, int):
        return {tq: times for tq in queues}
    read = set(queues)
    for topic, per in times.items():
        for q in per:
            if (topic, q) not in read:
                raise OptionError(f"{name} names {topic!r} queue {q}, which this query does "
                                  "not read (not subscribed or no such queue)")
    return {(t, q): times[t][q] for t, q in queues if q in times.get(t, {})}


def resolve(spec: str | Offsets, bounds: Mapping[tuple[str, int], tuple[int, int]],
            name: str) -> Offsets:
    """Concrete offsets of `spec` for the queues of `bounds` ((topic, queue) -> (min, end)):
    earliest is a queue's min, latest its end, and an explicit offset must name a queue that
    is read. Offsets outside [min, end] are kept: the caller decides what they mean."""
    out: Offsets = {}
    explicit = spec if isinstance(spec, dict) else {}
    for topic, queues in explicit.items():
        for q in queues:
            if (topic, q) not in bounds:
                raise OptionError(f"{name} names {topic!r} queue {q}, which this query does "
                                  "not read (not subscribed or no such queue)")
    for (topic, q), (lo, end) in sorted(bounds.items()):
        if isinstance(spec, str):
            off = lo if spec == "earliest" else end
        else:
            off = explicit.get(topic, {}).get(q, EARLIEST if name.startswith("start") else LATEST)
            off = lo if off == EARLIEST else end if off == LATEST else off
        out.setdefault(topic, {})[q] = off
    return out


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """The non-empty ranges, cut into pieces of at most ceil(total / min_partitions)
    messages when fewer ranges than `min_partitions` hold data (Kafka's minPartitions)."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    piece = max(1, math.ceil(total / min_partitions))
    out: list[QueueRange] = []
    for r in ranges:
        for start in range(r.start, r.end, piece):
            out.append(QueueRange(r.topic, r.queue, start, min(r.end, start + piece)))
    return out


def admit(start: Mapping[str, Mapping[int, int]], latest: Mapping[str, Mapping[int, int]],
          limit: int | None) -> Offsets:
    """The end offsets of the next micro-batch: `latest`, or with `limit` at most that many
    messages in all, each queue taking its share of what waits in proportion to its backlog
    (a share below one rounds up, so no queue starves). Queues absent from `start` are new
    and start from their `latest` entry's own start, which the caller puts there."""
    if limit is None:
        return {t: dict(qs) for t, qs in latest.items()}
    sizes = {(t, q): max(0, end - start.get(t, {}).get(q, end))
             for t, qs in latest.items() for q, end in qs.items()}
    total = sum(sizes.values())
    out: Offsets = {}
    for t, qs in latest.items():
        for q, end in qs.items():
            begin = start.get(t, {}).get(q, end)
            size = sizes[(t, q)]
            if total <= limit or size == 0:
                out.setdefault(t, {})[q] = max(begin, end)
                continue
            share = limit * size / total
            take = math.ceil(share) if share < 1 else math.floor(share)
            out.setdefault(t, {})[q] = min(end, begin + take)
    return out


def parse_offsets_dict(raw: Any, name: str) -> Offsets:
    """Offsets from a checkpointed dict (queue keys as strings)."""
    return offsets_from_json(json.dumps(raw), name)
