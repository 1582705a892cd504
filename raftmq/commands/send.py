"""`raftmq send`: one message from the command line, or N generated ones as a quick load.

One message is sent synchronously and its id, queue and offset printed: enough to find it
again. The body is the MESSAGE argument, or read from stdin (`-`) or a file (`--file`),
whole (any bytes, any size up to the message limit: no "argument list too long") or one
message per line (`--lines`). With `--count` the messages go through `send_async` so the
producer batches them per queue the way an application would, and only a summary is
printed. `--delay`, `--delay-level` or `--deliver-at` make them delayed messages: stored
now, in their queue when due. `--message-group` puts them in a FIFO message group: a
simple consumer group receives a group's messages one at a time, in order.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime
from typing import Any

from raftmq.client import Producer, SendFuture, SendResult
from raftmq.client.delays import DELAY_LEVELS, due_fields
from wire.records import message_group_problem

from . import add_namesrv_argument, namesrv_addresses, print_json, run_async

__all__ = ["generated_body", "main", "parse_duration"]

PROG = "raftmq send"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Send one message, or --count generated messages.",
    )
    p.add_argument("message", nargs="?",
                   help="the message body (UTF-8 text); '-' reads it from stdin")
    p.add_argument("--file", metavar="PATH",
                   help="read the body from this file ('-': stdin)")
    p.add_argument("--lines", action="store_true",
                   help="with stdin or --file: one message per line (empty lines skipped)")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", help="message key; messages with one key stay on one queue")
    p.add_argument("--tags", help="message tags (consumers can filter on them)")
    p.add_argument("--message-group", metavar="GROUP",
                   help="FIFO message group (1-255 characters): simple consumers receive a "
                        "group's messages one at a time, in order")
    p.add_argument("--count", type=int, metavar="N", help="send N generated messages")
    p.add_argument("--size", type=int, default=100, metavar="B",
                   help="body bytes of generated messages (default %(default)s)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=parse_duration, metavar="DURATION",
                      help="deliver this long after it is stored: 250ms, 10s, 5m, 2h, 1d "
                           "(plain numbers are seconds)")
    when.add_argument("--delay-level", type=int, metavar="N",
                      help=f"RocketMQ's delay level 1..{len(DELAY_LEVELS)} "
                           "(1s 5s 10s 30s 1m 2m ... 2h)")
    when.add_argument("--deliver-at", type=_parse_time, metavar="TIME",
                      help="deliver at this ISO 8601 time (without a zone: local time)")
    p.add_argument("--idempotent", action="store_true",
                   help="producer id + sequence numbers: a retried batch is stored once")
    p.add_argument("--trace", action="store_true",
                   help="record the messages' sends in the trace (raftmq trace MSG_ID)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_namesrv_argument(p)
    return p


def generated_body(i: int, size: int) -> bytes:
    """Body `i` of a generated run: its sequence number padded to `size` bytes, so every
    message is distinct and a consumer can check for loss or duplicates."""
    head = f"{i:010d}".encode()
    return head[:size] if size <= len(head) else head + b"x" * (size - len(head))


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'250ms', '10s', '1.5m', '2h', '1d' or plain seconds, as seconds (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a number with ms, s, m, h or d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _parse_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text).astimezone()  # a naive time is local time
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None


def _delays(args: argparse.Namespace) -> dict[str, Any]:
    """The send keywords of --delay, --delay-level or --deliver-at, and --message-group."""
    return {"delay": args.delay, "delay_level": args.delay_level,
            "deliver_at": args.deliver_at, "message_group": args.message_group}


def _result_dict(r: SendResult) -> dict[str, Any]:
    return {"msg_id": r.msg_id, "topic": r.topic, "queue": r.queue, "offset": r.offset,
            "group": r.group, "dup": r.dup}


def _producer(args: argparse.Namespace, namesrv: list[str]) -> Producer:
    """With --key the key picks the queue (the SDK's default rule), so messages of one
    key stay in order."""
    return Producer(namesrv, idempotent=args.idempotent, trace=args.trace)


def _read_bodies(args: argparse.Namespace) -> list[bytes | str]:
    """The bodies to send: the MESSAGE text, or stdin / --file whole or by line."""
    source = args.file if args.file is not None else (
        "-" if args.message == "-" else None)
    if source is None:
        return [args.message]
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(source, "rb") as f:
            data = f.read()
    if not args.lines:
        return [data]
    return [line for line in data.splitlines() if line]


def _print_result(args: argparse.Namespace, result: SendResult) -> None:
    if args.json:
        print_json(_result_dict(result))
    else:
        where = (f"offset {result.offset}" if result.offset >= 0
                 else "delayed: it gets its offset when due")
        print(f"sent {result.msg_id} to {result.topic} queue {result.queue} "
              f"{where} (group {result.group})")


async def _send_one(args: argparse.Namespace, namesrv: list[str]) -> int:
    bodies = _read_bodies(args)
    if not bodies:
        print(f"{PROG}: no message to send (the input has no non-empty line)", file=sys.stderr)
        return 1
    async with _producer(args, namesrv) as producer:
        if len(bodies) == 1:
            _print_result(args, await producer.send(args.topic, bodies[0], key=args.key,
                                                    tags=args.tags, **_delays(args)))
            return 0
        futures = [await producer.send_async(args.topic, b, key=args.key, tags=args.tags,
                                             **_delays(args))
                   for b in bodies]
        for fut in futures:  # in input order; the first failure ends the command
            _print_result(args, await fut)
    return 0


async def _send_many(args: argparse.Namespace, namesrv: list[str]) -> int:
    acked = 0
    errors: list[str] = []
    queues: dict[int, int] = {}

    def done(fut: SendFuture[SendResult]) -> None:
        nonlocal acked
        exc = fut.exception()
        if exc is not None:
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        acked += 1
        q = fut.result().queue
        queues[q] = queues.get(q, 0) + 1

    started = time.perf_counter()
    async with _producer(args, namesrv) as producer:
        for i in range(args.count):
            await producer.send_async(args.topic, generated_body(i, args.size), key=args.key,
                                      tags=args.tags, callback=done, **_delays(args))
        await producer.flush()
    seconds = time.perf_counter() - started
    summary = {
        "topic": args.topic, "sent": args.count, "acked": acked, "errors": len(errors),
        "first_error": errors[0] if errors else None, "size_bytes": args.size,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(acked / seconds, 1) if seconds > 0 else None,
        "per_queue": dict(sorted(queues.items())),
    }
    if args.json:
        print_json(summary)
    else:
        rate = summary["msgs_per_s"]
        rate_text = f"{rate:,.0f} msgs/s" if rate is not None else "- msgs/s"
        print(f"acked {acked}/{args.count} messages of {args.size} B to {args.topic} in "
              f"{seconds:.2f} s ({rate_text}), {len(errors)} errors")
        if errors:
            print(f"{PROG}: first error: {errors[0]}", file=sys.stderr)
    return 0 if not errors else 1


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.file is not None and args.message is not None:
        parser.error("give either a MESSAGE or --file PATH, not both")
    if (args.message is None and args.file is None) == (args.count is None):
        parser.error("give either a MESSAGE (or - for stdin, or --file PATH) or --count N")
    if args.lines and args.file is None and args.message != "-":
        parser.error("--lines reads stdin (MESSAGE '-') or --file")
    if args.file not in (None, "-") and not os.path.isfile(args.file):
        parser.error(f"--file: no such file {args.file!r}")
    if args.count is not None and args.count < 1:
        parser.error("--count must be at least 1")
    if args.size < 0:
        parser.error("--size must not be negative")
    try:
        due_fields(args.delay, args.deliver_at, args.delay_level)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.message_group is not None and (
            problem := message_group_problem(args.message_group)) is not None:
        parser.error(f"--message-group: {problem}")
    namesrv = namesrv_addresses(parser, args.namesrv)
    action = _send_one if args.count is None else _send_many

    async def run() -> int:
        return await action(args, namesrv)

    return run_async(run, namesrv)
