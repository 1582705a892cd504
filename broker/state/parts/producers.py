"""Producers' idempotence: batches of a producer id (pid != 0) are deduplicated per
(pid, topic, queue) by sequence, remembering the outcomes of the last `DEDUP_WINDOW`
batches as Kafka does, so a retry after a leader change never stores a batch twice.

Each batch is judged alone, also inside an entry holding several: a duplicate is skipped
and answered with the outcome remembered for it (base offset, count, entry index and its
shift in that entry, which its message ids need), the others of the entry are stored.
Section version 2 keeps the shift; version 1 had none (its entries held one batch each,
so it is 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.state.parts.base import Part, ProduceResult, Refused, TopicConfig
from wire.protocol import Code
from wire.records import BatchHeader

__all__ = ["DEDUP_WINDOW", "Producers"]

DEDUP_WINDOW = 5  # idempotent batches remembered per (pid, topic, queue), as Kafka does


@dataclass(slots=True)
class _Producer:
    """Dedup state of one (pid, topic, queue): last sequence and the recent outcomes."""

    last_seq: int
    # (seq, base_offset, count, index, shift in the entry), oldest first
    recent: list[tuple[int, int, int, int, int]]


class Producers(Part):
    """Per (pid, topic, queue): the last sequence and the recent outcomes."""

    name = "producers"
    version = 2

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self._producers: dict[tuple[int, str, int], _Producer] = {}

    @staticmethod
    def validate(header: BatchHeader) -> None:
        """Refused(MALFORMED) for an idempotent batch without a sequence (checked before
        anything else about the batch)."""
        if header.pid and header.seq < 0:
            raise Refused(Code.MALFORMED, "an idempotent batch (pid != 0) needs a sequence")

    def check_batch(self, header: BatchHeader, count: int) -> ProduceResult | None:
        """Before a batch is stored: the remembered result if it is a duplicate, None if it
        is new; Refused(SEQUENCE_GAP) if sequences went missing before it."""
        if not header.pid:
            return None
        pstate = self._producers.get((header.pid, header.topic, header.queue))
        if pstate is None:
            return None
        for seq, base, n, index, shift in pstate.recent:
            if seq == header.seq:
                return ProduceResult(base, n, index, dup=True, shift=shift)
        if header.seq <= pstate.last_seq:
            return ProduceResult(-1, count, -1, dup=True)
        if header.seq > pstate.last_seq + 1:
            raise Refused(
                Code.SEQUENCE_GAP,
                f"sequence {header.seq} after {pstate.last_seq} for producer "
                f"{header.pid} on {header.topic}/{header.queue}",
            )
        return None

    def stored(self, header: BatchHeader, base: int, count: int, index: int,
               shift: int) -> None:
        """The batch `check_batch` passed was stored at `base` by the entry at `index`,
        `shift` bytes beyond the place of the entry's first batch."""
        if not header.pid:
            return
        key = (header.pid, header.topic, header.queue)
        outcome = (header.seq, base, count, index, shift)
        pstate = self._producers.get(key)
        if pstate is None:
            self._producers[key] = _Producer(header.seq, [outcome])
        else:
            pstate.last_seq = header.seq
            pstate.recent.append(outcome)
            if len(pstate.recent) > DEDUP_WINDOW:
                del pstate.recent[0]

    def topic_deleted(self, config: TopicConfig) -> None:
        for p in [p for p in self._producers if p[1] == config.name]:
            del self._producers[p]

    def retained(self, min_index: int) -> int:
        # Producers silent since before the horizon are forgotten, which bounds the table;
        # a retry of a batch that old could no longer be told apart anyway.
        for p in [p for p, st in self._producers.items() if st.recent[-1][3] < min_index]:
            del self._producers[p]
        return 0

    def section(self) -> Any:
        return [
            [pid, t, q, st.last_seq, [list(r) for r in st.recent]]
            for (pid, t, q), st in sorted(self._producers.items())
        ]

    def load(self, version: int, section: Any) -> None:
        if version == 1:
            section = [[pid, t, q, last, [[*r, 0] for r in recent]]
                       for pid, t, q, last, recent in section]
        elif version != 2:
            raise ValueError(f"unsupported producers section version {version!r}")
        for pid, t, q, last, recent in section:
            self._producers[(pid, t, q)] = _Producer(
                last, [(seq, base, n, index, shift) for seq, base, n, index, shift in recent]
            )
