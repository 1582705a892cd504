"""Snapshot size and time of one group's broker state holding many retained messages.

    python -m bench.snapshot --json [--messages 10000000] [--before REV] [--dir DIR]

The state is built by applying MESSAGES entries of `--batch` messages of `--body` bytes,
spread round robin over `--queues` queues of one topic (the batch's walk is handed to
`apply` with the entry, as the produce path does, so building measures the state, not the walk).
Then it is snapshotted once (`first_snapshot_s`: this one writes every sealed
ConsumeQueue chunk to the chunk files, in a temporary directory under `--dir`, once; a
node spreads those writes over its history, a chunk at a time), then `--repeat` times,
and restored once from the last snapshot and the chunk files; the snapshot is measured in
its two halves: `detach` (`snapshot_later()`, run on the event loop, which blocks every
group of the node meanwhile) and `serialise` (the returned callable, run in a worker
thread: it writes the chunks sealed since the last snapshot, then makes the bytes), and
the median of the repeats is reported, with the bytes of each part's section of the
snapshot and of the chunk files.

With `--before REV` the same is measured, in the same process, with the state machine of
git revision REV (`broker/state/statemachine.py`, `broker/state/consumequeue.py`,
`broker/state/parts/queues.py` and `broker/state/cqchunks.py` as they were there, where they were,
loaded under private module names), so the two columns compare like with like.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

import msgpack

from broker.state.cqchunks import FileChunkStore
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.types import Entry, EntryType
from wire.records import STORED_PREFIX, OutgoingMessage, WalkedBatch, encode_batch, walk_batch

TOPIC = "bench"


def load_revision(rev: str) -> Any:
    """`BrokerState` of git revision `rev`, with the ConsumeQueue module and the queues
    part of that revision (when it has one)."""
    def source(path: str) -> str | None:
        done = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
        if done.returncode != 0 and path != "broker/state/statemachine.py":
            return None
        done.check_returncode()
        return done.stdout

    def load(name: str, path: str, text: str) -> types.ModuleType:
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        exec(compile(text, f"{rev}:{path}", "exec"), module.__dict__)
        return module

    tag = "".join(c for c in rev if c.isalnum())
    renames: dict[str, str] = {}
    for mod, path in (("consumequeue", "broker/state/consumequeue.py"),
                      ("cqchunks", "broker/state/cqchunks.py"),
                      ("queues", "broker/state/parts/queues.py")):
        text = source(path)
        if text is None:
            continue
        for old, new in renames.items():
            text = text.replace(f"from {old} import", f"from {new} import")
        name = f"_bench_before_{tag}_{mod}"
        load(name, path, text)
        renames[path[:-3].replace("/", ".")] = name
    text = source("broker/state/statemachine.py")
    assert text is not None
    for old, new in renames.items():
        text = text.replace(f"from {old} import", f"from {new} import")
    return load(f"_bench_before_{tag}_statemachine", "broker/state/statemachine.py", text).BrokerState


def build(make: Callable[[], Any], messages: int, batch: int, body: int, queues: int) -> Any:
    """A state holding `messages` messages; returns (state, seconds)."""
    state = make()
    state.apply(Entry(1, 1, EntryType.CONTROL,
                      control_create_topic(TOPIC, queues, range(queues))))
    payloads = []
    for q in range(queues):
        data = STORED_PREFIX.pack(1) + encode_batch(
            TOPIC, q, [OutgoingMessage(b"x" * body) for _ in range(batch)])
        header, refs = walk_batch(data, STORED_PREFIX.size, state.max_message_bytes)
        payloads.append((data, header, refs))
    index = 1
    t0 = time.perf_counter()
    for n in range(0, messages, batch):
        data, header, refs = payloads[(n // batch) % queues]
        if n + batch > messages:  # the last batch is short: only its first records count
            refs = refs[: messages - n]
        index += 1
        entry = Entry(index, 1, EntryType.MESSAGES, data)
        if hasattr(state, "prewalked"):  # a revision from before proposals carried walks
            state.prewalked(data, header, refs, state.max_message_bytes)
            state.apply(entry)
        else:
            state.apply(entry, WalkedBatch(header, refs, state.max_message_bytes))
    return state, time.perf_counter() - t0


def snapshot_once(state: Any) -> tuple[float, float, bytes]:
    """(detach seconds, serialise seconds, bytes) of one snapshot of `state`, taken as a
    node takes it: the serialiser writes the chunks it references (if the state has a
    chunk store), then, once the bytes would be durable, drops those no longer needed."""
    gc.collect()
    t0 = time.perf_counter()
    later = state.snapshot_later()
    t1 = time.perf_counter()
    data: bytes = later()
    saved = getattr(later, "saved", None)
    if saved is not None:
        saved()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, data


def _section_bytes(data: bytes) -> dict[str, int] | None:
    """Bytes of each part's section (snapshots with parts only; None for older ones)."""
    d = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if "parts" not in d:
        return None
    return {name: len(msgpack.packb(section, use_bin_type=True))
            for name, _, section in d["parts"]}


def _takes_store(state_type: Any) -> bool:
    return "chunk_store" in inspect.signature(state_type).parameters


def _dir_bytes(path: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(path)) if os.path.isdir(path) else 0


def run(messages: int, batch: int, body: int, queues: int, repeat: int,
        before: str | None, workdir: str = ".",
        chunk_records: int | None = None) -> dict[str, Any]:
    """Build the state with each state machine, take a first snapshot of each (which
    writes every ConsumeQueue chunk, once: a node spreads that over the history), then
    `repeat` more in turns (so drift of the machine hits both alike), then restore each
    once. A state machine with a chunk store gets a `FileChunkStore` in a temporary
    directory under `workdir` (real files, real fsyncs) and, if given, `chunk_records`."""
    result: dict[str, Any] = {
        "benchmark": "snapshot",
        "messages": messages,
        "batch": batch,
        "body": body,
        "queues": queues,
        "repeat": repeat,
    }
    sides: dict[str, Any] = {}
    if before is not None:
        rev = subprocess.run(["git", "rev-parse", "--short", before], check=True,
                             capture_output=True, text=True).stdout.strip()
        result["before_rev"] = rev
        sides["before"] = load_revision(rev)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    result["after_rev"] = head or None
    sides["after"] = BrokerState
    with tempfile.TemporaryDirectory(prefix=".bench-snapshot-", dir=workdir) as tmp:
        stores: dict[str, Any] = {}
        for side, state_type in sides.items():
            if _takes_store(state_type):
                stores[side] = FileChunkStore(os.path.join(tmp, side, "consumequeue"))
        states, built, first = {}, {}, {}
        for side, state_type in sides.items():
            kw: dict[str, Any] = {"chunk_store": stores[side]} if side in stores else {}
            if side in stores and chunk_records is not None:
                kw["chunk_records"] = chunk_records
            states[side], built[side] = build(functools.partial(state_type, "g", **kw),
                                              messages, batch, body, queues)
            assert states[side].messages_applied == messages
            d, s, _ = snapshot_once(states[side])
            first[side] = d + s
        runs: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        last: dict[str, bytes] = {}
        for _ in range(repeat):
            for side, state in states.items():
                detach, serialise, last[side] = snapshot_once(state)
                runs[side].append((detach, serialise))
        for side, state_type in sides.items():
            del states[side]
            gc.collect()
            kw = {"chunk_store": FileChunkStore(stores[side].path)} if side in stores else {}
            if side in stores and chunk_records is not None:
                kw["chunk_records"] = chunk_records
            t0 = time.perf_counter()
            restored = state_type.restore("g", last[side], **kw)
            restore = time.perf_counter() - t0
            assert restored.messages_applied == messages
            del restored
            data = last.pop(side)
            size = len(data)
            sections = _section_bytes(data)
            del data
            gc.collect()
            result[side] = {
                "build_s": round(built[side], 3),
                "snapshot_bytes": size,
                "bytes_per_message": round(size / messages, 2),
                "detach_s": round(statistics.median(d for d, _ in runs[side]), 4),
                "serialise_s": round(statistics.median(s for _, s in runs[side]), 4),
                "snapshot_s": round(statistics.median(d + s for d, s in runs[side]), 4),
                "first_snapshot_s": round(first[side], 4),
                "chunk_file_bytes": _dir_bytes(stores[side].path) if side in stores else 0,
                "restore_s": round(restore, 4),
            }
            if sections is not None:
                result[side]["section_bytes"] = sections
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.snapshot",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--batch", type=int, default=1000, help="messages per MESSAGES entry")
    p.add_argument("--body", type=int, default=100, help="bytes per message body")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3, help="snapshots taken (median reported)")
    p.add_argument("--before", metavar="REV",
                   help="also measure the state machine of this git revision")
    p.add_argument("--chunk-records", type=int, default=None,
                   help="ConsumeQueue records per chunk file (default: the built-in size)")
    p.add_argument("--dir", default=".",
                   help="where the temporary ConsumeQueue chunk files go (a real disk)")
    args = p.parse_args(argv)
    if args.messages < 1 or args.batch < 1 or args.queues < 1 or args.repeat < 1:
        p.error("--messages, --batch, --queues and --repeat must be at least 1")
    if args.chunk_records is not None and args.chunk_records < 1:
        p.error("--chunk-records must be at least 1")
    result = run(args.messages, args.batch, args.body, args.queues, args.repeat, args.before,
                 args.dir, args.chunk_records)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for side in ("before", "after"):
            if side in result:
                r = result[side]
                print(f"{side:>6} {result.get(side + '_rev')}: {r['snapshot_bytes']:,} B, "
                      f"detach {r['detach_s']} s, serialise {r['serialise_s']} s, "
                      f"first {r['first_snapshot_s']} s, "
                      f"chunk files {r['chunk_file_bytes']:,} B, restore {r['restore_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
