"""The group-commit thread (`raftlog.syncthread.SyncThread`): results, errors, and calls
that are never abandoned."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from raftlog.syncthread import SyncThread


def test_runs_the_call_in_its_thread_and_returns_its_result() -> None:
    async def main() -> None:
        syncer = SyncThread("test-sync")
        try:
            ident = await syncer.run(threading.get_ident)
            assert ident != threading.get_ident()
            assert await syncer.run(lambda: 41 + 1) == 42
            assert await syncer.run(threading.get_ident) == ident  # one thread, reused
        finally:
            syncer.stop()

    trio.run(main)


def test_the_calls_exception_is_raised_in_the_caller() -> None:
    def fail() -> None:
        raise OSError(5, "disk gone")

    async def main() -> None:
        syncer = SyncThread("test-sync")
        try:
            with pytest.raises(OSError, match="disk gone"):
                await syncer.run(fail)
            assert await syncer.run(lambda: "still serving") == "still serving"
        finally:
            syncer.stop()

    trio.run(main)


def test_a_cancelled_caller_waits_for_the_call_and_gets_its_result() -> None:
    """The caller closes the plan's descriptors after the call: it must never go on
    while the thread still uses them."""
    release = threading.Event()
    finished: list[str] = []

    def blocking() -> str:
        release.wait()
        finished.append("call")
        return "synced"

    async def main() -> None:
        syncer = SyncThread("test-sync")
        returned: list[str] = []
        try:
            async with trio.open_nursery() as nursery:
                async def caller() -> None:
                    with trio.CancelScope() as scope:
                        scope.cancel()
                        returned.append(await syncer.run(blocking))
                nursery.start_soon(caller)
                await trio.testing.wait_all_tasks_blocked()
                assert returned == [] and finished == []  # still waiting for the thread
                release.set()
            assert finished == ["call"] and returned == ["synced"]
        finally:
            syncer.stop()

    trio.run(main)


def test_stop_ends_the_thread() -> None:
    async def main() -> threading.Thread:
        syncer = SyncThread("test-sync-stop")
        await syncer.run(lambda: None)
        syncer.stop()
        return syncer._thread

    thread = trio.run(main)
    thread.join(10)  # a guard against hanging, not a timing claim
    assert not thread.is_alive()
