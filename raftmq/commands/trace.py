"""`raftmq trace`: the life of one traced message, from its trace records.

    raftmq trace MSG_ID [--json]

Shows every step the trace topic holds for the message: sent (by which producer, its
born time), stored (Raft index, queue, offset, store time: written by the leader that
stored it), delivered (to which consumer of which group, when) and acked (the committed
offset that covers it, or a simple consumer's ack). Only messages sent or read by traced
clients (`trace=True`) have records; the exit status is 1 when the message has none.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftmq.client import Admin
from wire.protocol import RequestError
from wire.records import parse_message_id
from wire.trace import TraceRecord

from . import (
    add_namesrv_argument,
    make_table,
    namesrv_addresses,
    print_json,
    run_async,
    table_console,
)
from .when import iso_ms

__all__ = ["main"]

PROG = "raftmq trace"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Show the life of one traced message.")
    p.add_argument("msg_id", help="the message id (GROUP:INDEX:START, as sends print it)")
    p.add_argument("--json", action="store_true", help="one JSON object per step")
    add_namesrv_argument(p)
    return p


def _row(r: TraceRecord) -> dict[str, Any]:
    return {**r.as_row(), "time": iso_ms(r.ms)}


def step_detail(r: TraceRecord) -> str:
    """What the step says beyond its time, in words (the CLI's table and the console's)."""
    if r.kind == "sent":
        return f"by producer {r.client}"
    if r.kind == "stored":
        return f"group {r.group}, Raft index {r.index}"
    if r.kind == "delivered":
        return f"to {r.client} of group {r.cg}"
    if r.committed >= 0:
        return f"by {r.client} of group {r.cg}: offset {r.committed} committed"
    return f"by {r.client} of group {r.cg}"


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        parse_message_id(args.msg_id)
    except RequestError as exc:
        parser.error(exc.message)
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        async with Admin(namesrv) as admin:
            records = await admin.trace(args.msg_id)
        if not records:
            print(f"{PROG}: no trace records for {args.msg_id} (only messages sent or read "
                  "by clients with trace=True have them)", file=sys.stderr)
            return 1
        if args.json:
            for r in records:
                print_json(_row(r))
            return 0
        first = records[0]
        table_console().print(make_table(
            ("step", "time", "queue", "offset", "detail"),
            [(r.kind, iso_ms(r.ms), r.queue, r.offset, step_detail(r)) for r in records],
            title=f"{args.msg_id}: {first.topic}, queue {first.queue}, offset {first.offset}",
            right=("queue", "offset")))
        return 0

    return run_async(run, namesrv, PROG)
