"""The offsets a push consumer may commit while its handlers finish out of order."""

from __future__ import annotations


class OffsetWindow:
    """The offset a concurrently consuming queue may commit: its lowest unfinished one.

    Offsets are `add`ed in increasing order as messages are handed out and marked
    `done` in any order; `advance` moves past offsets that were never handed out
    (filtered by tag). Committing `committable()` never skips an unfinished message.
    """

    def __init__(self, start: int) -> None:
        self._start = start
        self._high = start  # one past the last offset added or advanced over
        self._pending: dict[int, bool] = {}  # offset -> done, in increasing order
        self._unfinished = 0

    def add(self, offset: int) -> None:
        if offset < self._high:
            raise ValueError(f"offset {offset} is below the window's end {self._high}")
        self._pending[offset] = False
        self._unfinished += 1
        self._high = offset + 1

    def advance(self, next_offset: int) -> None:
        self._high = max(self._high, next_offset)

    def done(self, offset: int) -> None:
        if self._pending.get(offset) is False:
            self._pending[offset] = True
            self._unfinished -= 1

    def committable(self) -> int:
        pending = self._pending
        for offset in list(pending):
            if not pending[offset]:
                return offset
            del pending[offset]
        return self._high

    def reset(self, offset: int) -> None:
        """Forget everything (after a jump forced by OFFSET_TOO_SMALL/LARGE)."""
        self._pending.clear()
        self._unfinished = 0
        self._high = offset

    def __len__(self) -> int:
        """Messages handed out and not finished yet (the flow-control measure)."""
        return self._unfinished

    @property
    def end(self) -> int:
        return self._high
