"""The consume-transform-produce worker of the txn chaos workload, run as its own process.

``python -m chaos.pipeline --namesrv ADDR --input IN --output OUT --queues N
--out-queues M --group CG --tid TID``: round the input queues, each time reading from the
consumer group's committed offset (asked afresh every time, so what an aborted or
unknown transaction read is read again), and in one transaction write one output per
input (``o:<input>@<transaction>``, to output queue ``queue % M``) and commit the
offsets after those inputs (`Transaction.send_offsets`). The harness kills it with
SIGKILL at any moment and starts another with the same transactional id, whose init
fences whatever the dead one left open.

It prints its history records as JSON lines on stdout (``tx-init`` and ``txn`` records
of `chaos.txcheck`, without ``process``: the harness adds it), each stamped with
`time.monotonic()`, the machine's clock the harness uses too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio

from raftmq.client import Producer, PullConsumer
from raftmq.client.consumer import fetch, query_offset
from raftmq.client.errors import ProducerFencedError, TransactionAbortedError
from wire.protocol import Code, RequestError

BATCH = 5  # inputs per transaction, at most


def _emit(kind: str, f: str, key: Any, value: Any = None) -> None:
    line = {"type": kind, "f": f, "key": key, "value": value, "time": time.monotonic()}
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _committed(consumer: PullConsumer, group: str, topic: str, queue: int) -> int | None:
    try:
        got = await query_offset(consumer.routes, group, topic, queue)
    except RequestError:  # TX_PENDING (a commit still completing), no leader...: later
        return None
    return max(0, got)


async def work(args: argparse.Namespace) -> None:
    tid = args.tid
    async with Producer(args.namesrv, transactional_id=tid, send_timeout=args.send_timeout,
                        transaction_timeout_ms=args.transaction_timeout_ms) as producer, \
            PullConsumer(args.namesrv, args.group) as consumer:
        owner = producer._txn
        assert owner is not None
        number = 0
        queue = -1
        while True:
            queue = (queue + 1) % args.queues
            start = await _committed(consumer, args.group, args.input, queue)
            if start is None:
                await anyio.sleep(0.1)
                continue
            try:
                res = await fetch(consumer.routes, args.input, queue, start,
                                  max_messages=BATCH, wait_ms=0)
            except RequestError as exc:
                if exc.code != Code.OFFSET_TOO_LARGE:
                    await anyio.sleep(0.1)
                continue
            if not res.messages:
                await anyio.sleep(0.05)
                continue
            if owner.epoch < 0:
                _emit("invoke", "tx-init", tid)
                try:
                    await owner.init()
                except Exception as exc:  # noqa: BLE001
                    _emit("info", "tx-init", tid, {"error": repr(exc)})
                    await anyio.sleep(0.1)
                    continue
                _emit("ok", "tx-init", tid, {"epoch": owner.epoch})
            try:
                tx = await producer.begin()
            except Exception:  # noqa: BLE001 - no transaction: nothing recorded
                await anyio.sleep(0.1)
                continue
            number += 1
            name = f"w{tx.epoch}-{tx.n}-{number}"
            inputs = [[args.input, queue, start + i, m.body.decode()]
                      for i, m in enumerate(res.messages)]
            out_queue = queue % args.out_queues
            sends = [[args.output, out_queue, f"o:{body}@{name}"] for *_x, body in inputs]
            end = start + len(inputs)
            _emit("invoke", "txn", tid, {
                "id": name, "epoch": tx.epoch, "n": tx.n, "plan": "commit", "sends": sends,
                "inputs": inputs,
                "offsets": {args.group: {f"{args.input}/{queue}": end}}})
            try:
                for _t, q, body in sends:
                    await tx.send(args.output, body, queue=q)
                await tx.send_offsets(args.group, {(args.input, queue): end})
            except Exception as exc:  # noqa: BLE001 - no commit asked: it cannot commit
                _emit("fail", "txn", tid, {"error": repr(exc)})
                try:
                    await tx.abort()
                except Exception:  # noqa: BLE001, S110 - its timeout aborts it
                    pass
                continue
            _emit("attempt", "txn", tid, {"commit": True})
            try:
                await tx.commit()
            except (TransactionAbortedError, ProducerFencedError) as exc:
                _emit("fail", "txn", tid, {"error": repr(exc)})
            except Exception as exc:  # noqa: BLE001 - decided or not: unknown
                _emit("info", "txn", tid, {"error": repr(exc)})
            else:
                _emit("ok", "txn", tid, {"outcome": "commit"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.pipeline", description=__doc__)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--queues", type=int, required=True)
    parser.add_argument("--out-queues", type=int, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--tid", required=True)
    parser.add_argument("--send-timeout", type=float, default=3.0)
    parser.add_argument("--transaction-timeout-ms", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.queues < 1 or args.out_queues < 1:
        parser.error("--queues and --out-queues must be at least 1")
    anyio.run(work, args)


if __name__ == "__main__":
    main()
