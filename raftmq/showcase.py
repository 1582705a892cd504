"""What `make run` shows once `raftmq dev` is up: a producer and a consumer at work.

It uses only the public SDK (the blocking facade), the way a plain script would: create a
topic whose queues spread over the three groups, send messages (each acknowledgement
means the batch is fsynced on a majority of its group), read them back through a consumer
group that commits its offsets through the Raft log, and resolve one message by id.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from raftmq.client.blocking import BlockingAdmin, BlockingProducer, BlockingPullConsumer

__all__ = ["run_showcase"]

TOPIC = "showcase"


def run_showcase(namesrv: str, *, messages: int = 2000, console: Console | None = None) -> bool:
    """Produce and consume `messages`; True when every acknowledged message came back."""
    console = console or Console(stderr=True)
    with BlockingAdmin(namesrv) as admin:
        placement = admin.create_topic(TOPIC, queues=6, exist_ok=True)
    console.print(f"[bold]topic[/] {TOPIC!r}: queues by group {placement}")

    sent: dict[str, bytes] = {}
    t0 = time.perf_counter()
    with BlockingProducer(namesrv, idempotent=True) as producer:
        futures = [
            (body, producer.send_async(TOPIC, body, key=f"order-{k % 50}"))
            for k in range(messages)
            for body in [f"order {k} from the showcase".encode()]
        ]
        for body, fut in futures:
            result = fut.result(timeout=30)
            sent[result.msg_id or body.decode()] = body
    produce_s = time.perf_counter() - t0
    console.print(f"[bold]producer[/] {len(sent):,} messages acknowledged in {produce_s:.2f} s "
                  f"({len(sent) / produce_s:,.0f}/s, idempotent, each fsynced on a majority)")

    received: dict[str, bytes] = {}
    per_queue: dict[int, int] = {}
    earlier = 0  # messages of earlier runs (`raftmq dev` keeps its data between runs)
    t0 = time.perf_counter()
    group = f"showcase-{int(time.time())}"
    with BlockingPullConsumer(namesrv, group) as consumer:
        consumer.assign(TOPIC)
        deadline = time.monotonic() + 30
        while not sent.keys() <= received.keys() and time.monotonic() < deadline:
            for m in consumer.poll(timeout=1.0, max_messages=256):
                if m.msg_id not in sent:
                    earlier += 1
                    continue
                received[m.msg_id] = m.body
                per_queue[m.queue] = per_queue.get(m.queue, 0) + 1
        consumer.commit_all()
    consume_s = time.perf_counter() - t0
    table = Table(title=f"consumer group {group!r}")
    table.add_column("queue", justify="right")
    table.add_column("messages", justify="right")
    for q in sorted(per_queue):
        table.add_row(str(q), f"{per_queue[q]:,}")
    console.print(table)
    missing = set(sent) - set(received)
    ok = not missing and all(received[k] == v for k, v in sent.items())
    console.print(f"[bold]consumer[/] {len(received):,} messages in {consume_s:.2f} s"
                  + (f" (and {earlier:,} of earlier runs)" if earlier else "") + "; "
                  + ("[green]every acknowledged message came back, byte for byte[/]" if ok
                     else f"[red]{len(missing)} acknowledged messages missing[/]"))
    return ok
