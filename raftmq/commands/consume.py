"""`raftmq consume`: read a topic as a member of a consumer group, from the terminal.

It is a pull consumer over every queue of the topic. Offsets are committed every second
and on the way out, and only up to the last message printed, so a second run in the same
group continues exactly where the first stopped, and `--count N` consumes exactly N (a run
killed in between sees the last second's messages again: at-least-once).

With `--orderly` it is an orderly push consumer instead (`PushConsumer(orderly=True)`):
a member of the group sharing the queues with the group's other consumers, each queue
read only while this run holds its lock on the broker, in offset order.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from typing import Any

import anyio

from raftmq.client import FilterError, MessageSelector, PullConsumer, PushConsumer
from raftmq.client.consumer import commit_offsets
from wire.records import Message

from . import (
    EXIT_FAILURE,
    EXIT_USAGE,
    add_namesrv_argument,
    namesrv_addresses,
    print_json,
    run_async,
)

__all__ = ["main", "message_json", "message_line"]

PROG = "raftmq consume"
POLL_SLICE = 1.0  # seconds one poll may wait, so the idle timeout is checked that often
COMMIT_INTERVAL = 1.0  # offsets of printed messages are committed this often and at the end
BATCH = 256  # messages per poll
TRUNCATE = 200  # characters of a body shown on a terminal without --full


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Consume a topic in a consumer group, committing offsets as it goes.",
    )
    p.add_argument("--group", required=True, help="consumer group (offsets are kept per group)")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    p.add_argument("--trace", action="store_true",
                   help="record each message's delivery and ack in the trace (raftmq trace)")
    p.add_argument("--from", dest="start_from", choices=("first", "last"), default="first",
                   help="where a group without committed offsets starts (default %(default)s)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="stop when nothing arrives for S seconds (default %(default)s)")
    p.add_argument("--tags", metavar="EXPR",
                   help="only messages with one of these tags: 'TagA', 'TagA || TagB' or "
                        "'TagA,TagB' ('*': all)")
    p.add_argument("--sql", metavar="EXPR",
                   help="only messages this SQL92 filter matches (RocketMQ's bySql, decided "
                        "on the broker), e.g. \"region = 'eu' AND amount > 100\"; with "
                        "--tags, both must match")
    p.add_argument("--orderly", action="store_true",
                   help="consume as an orderly push consumer: share the queues with the "
                        "group's other consumers, each queue read only while this run holds "
                        "its lock on the broker, one message at a time in offset order")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message (body as UTF-8 text or base64)")
    p.add_argument("--full", action="store_true",
                   help=f"print whole bodies (on a terminal, bodies are cut at {TRUNCATE} "
                        "characters unless this is given)")
    add_namesrv_argument(p)
    return p


def _body_text(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def message_json(m: Message) -> dict[str, Any]:
    """The JSON form of a message; `body_encoding` says how to read `body`."""
    text = _body_text(m.body)
    return {
        "msg_id": m.msg_id, "topic": m.topic, "queue": m.queue, "offset": m.offset,
        "key": m.key, "tags": m.tags, "properties": m.properties,
        "body": text if text is not None else base64.b64encode(m.body).decode("ascii"),
        "body_encoding": "utf-8" if text is not None else "base64",
        "born_ms": m.born_ms, "store_ms": m.store_ms,
    }


def message_line(m: Message, limit: int | None = None) -> str:
    """One line per message; a body longer than `limit` characters is cut, saying so."""
    text = _body_text(m.body)
    body = text if text is not None else repr(m.body)
    if limit is not None and len(body) > limit:
        body = f"{body[:limit]}... ({len(m.body):,} bytes; --full shows all)"
    meta = f"queue={m.queue} offset={m.offset}"
    if m.key:
        meta += f" key={m.key}"
    if m.tags:
        meta += f" tags={m.tags}"
    return f"{meta} id={m.msg_id}  {body}"


def _tags(expr: str | None) -> str | list[str] | None:
    """--tags: a subscription expression ('A || B', '*') or a comma-separated list."""
    if expr is None or "||" in expr or expr.strip() == "*":
        return expr
    return [t.strip() for t in expr.split(",")]


async def _start_positions(consumer: PullConsumer, topic: str) -> dict[tuple[str, int], int]:
    """For a group that has committed nothing on some queues: where it starts on them
    (their end, for --from last), to be committed at once, so that a message sent before
    the next run is not skipped by that run's own "last"."""
    out: dict[tuple[str, int], int] = {}
    for t, q in await consumer.assignment():
        if t == topic and await consumer.committed(t, q) < 0:
            _lo, end = await consumer.bounds(t, q)
            consumer.seek(t, q, end)
            out[(t, q)] = end
    return out


async def _commit(consumer: PullConsumer, offsets: dict[tuple[str, int], int]) -> None:
    """Commit the printed messages' queues at once (and, traced, report them acked)."""
    await commit_offsets(consumer.routes, consumer.group, offsets)
    if consumer.tracer is not None:
        consumer.tracer.committed(offsets)


async def _consume(args: argparse.Namespace, namesrv: list[str]) -> int:
    consumed = 0
    reason = f"nothing new for {args.timeout:g} s"
    limit = None if args.full or args.json or not sys.stdout.isatty() else TRUNCATE
    async with PullConsumer(namesrv, args.group, start_from=args.start_from,
                            trace=args.trace) as consumer:
        try:
            consumer.assign(args.topic, tags=_tags(args.tags), sql=args.sql)
        except FilterError as exc:
            print(f"{PROG}: --sql: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ValueError as exc:
            print(f"{PROG}: --tags: {exc}", file=sys.stderr)
            return EXIT_USAGE
        await consumer.assignment()  # an unknown topic fails here, before any waiting
        if args.start_from == "last":
            started = await _start_positions(consumer, args.topic)
            if started:
                await commit_offsets(consumer.routes, consumer.group, started)
        idle_until = time.monotonic() + args.timeout
        polled = False  # --timeout 0 still looks once
        pending: dict[tuple[str, int], int] = {}  # printed, not yet committed
        commit_at = time.monotonic() + COMMIT_INTERVAL
        while True:
            if args.count is not None and consumed >= args.count:
                reason = f"{args.count} messages"
                break
            left = idle_until - time.monotonic()
            if left <= 0 and polled and not consumer.silent():
                break  # (a queue that has not answered yet is waited for until it is
                #          read or unreadable: "nothing new" must be true of every queue)
            polled = True
            want = BATCH if args.count is None else min(BATCH, args.count - consumed)
            batch = await consumer.poll(max(0.0, min(left, POLL_SLICE)), max_messages=want)
            if not batch:
                continue
            printed = batch if args.count is None else batch[: args.count - consumed]
            offsets: dict[tuple[str, int], int] = {}
            for m in printed:
                if args.json:
                    print_json(message_json(m))
                else:
                    print(message_line(m, limit), flush=True)
                offsets[(m.topic, m.queue)] = m.offset + 1
            consumed += len(printed)
            cut = {(m.topic, m.queue) for m in batch[len(printed):]}
            for key in offsets:
                # a queue printed to the end of its batch may also skip filtered messages
                pos = consumer.position(*key)
                if key not in cut and pos is not None:
                    offsets[key] = max(offsets[key], pos)
            pending.update(offsets)
            if time.monotonic() >= commit_at:  # through the Raft log: not per batch
                await _commit(consumer, pending)
                pending.clear()
                commit_at = time.monotonic() + COMMIT_INTERVAL
            idle_until = time.monotonic() + args.timeout
        if pending:
            await _commit(consumer, pending)
        unreadable = dict(sorted(consumer.unreadable.items()))
    print(f"{PROG}: {consumed} message(s) from {args.topic} in group {args.group} "
          f"(stopped: {reason})", file=sys.stderr)
    if unreadable:
        names = ", ".join(f"{t}/{q}" for t, q in unreadable)
        first = next(iter(unreadable.values()))
        print(f"{PROG}: could not read {len(unreadable)} queue(s): {names} "
              f"({first.code.name}: {first.message}); their messages were not consumed",
              file=sys.stderr)
        return EXIT_FAILURE
    return 0


async def _consume_orderly(args: argparse.Namespace, namesrv: list[str]) -> int:
    """--orderly: an orderly push consumer printing each message it is handed; a message
    beyond --count is refused (left for the next run, uncommitted) and the consumer
    paused, so exactly N are printed and committed."""
    consumed = 0
    limit = None if args.full or args.json or not sys.stdout.isatty() else TRUNCATE
    last = time.monotonic()
    enough = anyio.Event()
    consumer: PushConsumer | None = None

    async def handle(msgs: list[Message]) -> bool:
        nonlocal consumed, last
        if args.count is not None and consumed >= args.count:
            return False
        for m in msgs:
            if args.json:
                print_json(message_json(m))
            else:
                print(message_line(m, limit), flush=True)
        consumed += len(msgs)
        last = time.monotonic()
        if args.count is not None and consumed >= args.count:
            assert consumer is not None
            consumer.pause()
            enough.set()
        return True

    try:
        selector = MessageSelector(tags=_tags(args.tags), sql=args.sql)
        consumer = PushConsumer(namesrv, args.group, {args.topic: selector}, handle,
                                orderly=True, start_from=args.start_from,
                                commit_interval=COMMIT_INTERVAL)
    except ValueError as exc:
        print(f"{PROG}: --tags: {exc}", file=sys.stderr)
        return EXIT_USAGE
    reason = f"nothing new for {args.timeout:g} s"
    async with consumer:
        while not enough.is_set():
            left = last + args.timeout - time.monotonic()
            if left <= 0:
                break
            with anyio.move_on_after(min(left, POLL_SLICE)):
                await enough.wait()
        if enough.is_set():
            reason = f"{args.count} messages"
    print(f"{PROG}: {consumed} message(s) from {args.topic} in group {args.group} "
          f"(orderly; stopped: {reason})", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.count is not None and args.count < 1:
        parser.error("--count must be at least 1")
    if args.timeout < 0:
        parser.error("--timeout must not be negative")
    if args.sql is not None:
        try:  # before any connection: the position of the mistake, at once
            MessageSelector.by_sql(args.sql)
        except FilterError as exc:
            parser.error(f"--sql: {exc}")
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        if args.orderly:
            return await _consume_orderly(args, namesrv)
        return await _consume(args, namesrv)

    return run_async(run, namesrv)
