"""One worker thread per group for its group commits: the fsync hop, made cheap.

Every acknowledged entry waits for an fsync on the leader and on a follower, each run off
the event loop. `trio.to_thread.run_sync` does that through a general thread pool (a
capacity limiter, a thread renamed for every call, a copied context, the result handed
back through trio's entry queue), which costs more CPU and wall time than the fdatasync
it carries (~0.2 ms here). A group never has two syncs in flight (its sync loop awaits
each), so one dedicated thread does the same job: the loop hands it the plan through a
queue, the thread runs it and writes a byte to a pipe, and the waiting task, parked on
that pipe, is the one the event loop wakes.

Like `trio.to_thread.run_sync` (without `abandon_on_cancel`), a call is never abandoned:
a cancelled caller still waits for the thread to finish and gets its result (the plan's
descriptors are closed only afterwards); the cancellation reaches it at its next
checkpoint.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

__all__ = ["SyncThread"]

T = TypeVar("T")


class SyncThread:
    """A daemon thread running one blocking call at a time for a trio task."""

    def __init__(self, name: str) -> None:
        self._done_r, self._done_w = os.pipe()  # one byte per finished call
        os.set_blocking(self._done_r, False)
        self._jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._result: outcome.Outcome[Any] | None = None
        self._busy = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        jobs = self._jobs
        while (fn := jobs.get()) is not None:
            self._result = outcome.capture(fn)
            del fn
            os.write(self._done_w, b"\0")

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn()` in the thread and return its result (or raise its exception). One
        call at a time."""
        if self._busy:
            raise RuntimeError("SyncThread.run is already waiting for a call")
        self._busy = True
        try:
            self._jobs.put(fn)
            try:
                await self._wait_done()
            except trio.Cancelled:
                # never abandon the call (see the docstring): wait for it shielded and
                # return its result; trio's cancellation is level-triggered, so it reaches
                # the caller at its next checkpoint. Only this rare path pays for a
                # shielded scope: one per fsync was a measurable share of a follower's CPU
                # at one message in flight.
                with trio.CancelScope(shield=True):
                    await self._wait_done()
            result, self._result = self._result, None
        finally:
            self._busy = False
        assert result is not None
        return result.unwrap()

    async def _wait_done(self) -> None:
        """Wait for the thread's byte on the pipe and take it. Cancelled only before the
        byte is taken (a wait that raises took nothing)."""
        # wait first: the call (an fdatasync) is never done by now, and a read that fails
        # costs a syscall; the pipe stays readable until the byte is read
        while True:
            await trio.lowlevel.wait_readable(self._done_r)
            try:
                os.read(self._done_r, 1)
                return
            except BlockingIOError:
                continue

    def stop(self) -> None:
        """Let the thread end (no call may be in flight: `run` waits for each)."""
        self._jobs.put(None)
        os.close(self._done_r)
        os.close(self._done_w)
