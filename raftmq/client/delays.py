"""Delayed sends: what `delay=`, `deliver_at=` and `delay_level=` become in a batch header.

A delayed message is stored when sent, fsynced on a majority like any other, and enters
its queue when due (`broker.state.parts.timers`): never before, by the clock of the
group's leader. A relative `delay` is counted from the time the leader stores the message
(so a send that waited in the producer or was retried is not due earlier for it); an
absolute `deliver_at` is the time itself, and one already past is due at once. The
cluster refuses a message due further ahead than its `max_delay_s` (30 days by default).
"""

from __future__ import annotations

import math
from datetime import datetime

__all__ = ["DELAY_LEVELS", "NO_DUE", "Due", "due_fields"]

#: RocketMQ's delay levels 1..18, in seconds: `delay_level=3` is 10 s.
DELAY_LEVELS: tuple[int, ...] = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540,
                                 600, 1200, 1800, 3600, 7200)

Due = tuple[int, int]  # (delay ms after the store time, or deliver-at ms since the epoch)
NO_DUE: Due = (0, 0)


def due_fields(delay: float | None = None, deliver_at: datetime | float | None = None,
               delay_level: int | None = None) -> Due:
    """The header fields of a send given at most one of: `delay` (seconds after the
    message is stored), `deliver_at` (a timezone-aware datetime, or seconds since the
    epoch) or `delay_level` (1..18, `DELAY_LEVELS`). ValueError or TypeError for
    anything else: a bad delay never turns into "deliver now"."""
    if delay is None and deliver_at is None and delay_level is None:
        return NO_DUE  # a plain send, per message: nothing to check
    given = [n for n, v in (("delay", delay), ("deliver_at", deliver_at),
                            ("delay_level", delay_level)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one of delay, deliver_at and delay_level, not {given}")
    if delay_level is not None:
        if type(delay_level) is not int:
            raise TypeError(f"delay_level is an int 1..{len(DELAY_LEVELS)}, "
                            f"not {type(delay_level).__name__}")
        if not 1 <= delay_level <= len(DELAY_LEVELS):
            raise ValueError(f"delay_level must be 1..{len(DELAY_LEVELS)}, got {delay_level}")
        return (DELAY_LEVELS[delay_level - 1] * 1000, 0)
    if delay is not None:
        seconds = _seconds("delay", delay)
        if seconds < 0:
            raise ValueError(f"delay must not be negative, got {delay!r}")
        ms = math.ceil(seconds * 1000)  # rounded up: never due before the delay asked
        return (ms, 0) if ms else NO_DUE
    if deliver_at is not None:
        if isinstance(deliver_at, datetime):
            if deliver_at.tzinfo is None:
                raise ValueError("deliver_at must be timezone-aware (a naive datetime's "
                                 "zone is a guess)")
            at = deliver_at.timestamp()
        else:
            at = _seconds("deliver_at", deliver_at)
            if at < 0:
                raise ValueError(f"deliver_at must be a time after the epoch, got {at!r}")
        return (0, max(1, math.ceil(at * 1000)))
    return NO_DUE


def _seconds(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"{name} is a number of seconds, not {type(v).__name__}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number of seconds, got {v!r}")
    return float(v)
