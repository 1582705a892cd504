"""One worker thread per group for its group commits: the fsync hop, made cheap.

Every acknowledged entry waits for an fsync on the leader and on a follower, each run off
the event loop. `trio.to_thread.run_sync` does that through a general thread pool (a
capacity limiter, a thread renamed for every call, a copied context), which costs more
CPU and wall time than the fdatasync it carries (~0.2 ms here). A group never has two
syncs in flight (its sync loop awaits each), so one dedicated thread fed through a queue
does the same job: the loop hands it the plan, the thread runs it and wakes the loop with
`run_sync_soon`.

Like `trio.to_thread.run_sync` (without `abandon_on_cancel`), a call is never abandoned:
a cancelled caller still waits for the thread to finish and gets its result (the plan's
descriptors are closed only afterwards); the cancellation reaches it at its next
checkpoint.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

__all__ = ["SyncThread"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], Callable[[Any], object]]


class SyncThread:
    """A daemon thread running one blocking call at a time for a trio task."""

    def __init__(self, name: str) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        jobs, deliver_soon = self._jobs, self._token.run_sync_soon
        while (job := jobs.get()) is not None:
            fn, deliver = job
            result = outcome.capture(fn)
            del fn, job
            try:
                deliver_soon(deliver, result)
            except trio.RunFinishedError:
                return  # nobody is left to tell

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn()` in the thread and return its result (or raise its exception)."""
        done = trio.Event()
        box: list[outcome.Outcome[T]] = []

        def deliver(result: outcome.Outcome[T]) -> None:
            box.append(result)
            done.set()

        self._jobs.put((fn, deliver))
        with trio.CancelScope(shield=True):  # never abandon the call (see the docstring)
            await done.wait()
        return box[0].unwrap()

    def stop(self) -> None:
        """Let the thread end once it has finished what it was given."""
        self._jobs.put(None)
