"""Times as the commands take them: an ISO 8601 time, epoch milliseconds, or a time
relative to now.

    2026-11-25T17:00:00Z   ISO 8601 (no zone means UTC)
    1764090000000          epoch milliseconds (also `@1764090000000`)
    -10m, -2h, -1d, -30s   that long before now; `now` is now

One parser, so `raftmq message query` and `raftmq group reset-offsets --to-time` read a
time the same way.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime

__all__ = ["iso_ms", "parse_time", "time_argument"]

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RELATIVE = re.compile(r"-(\d+)(ms|s|m|h|d)")


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Epoch milliseconds of `text` (see the module); ValueError naming the forms
    accepted otherwise. `now_ms` is the clock relative times count back from."""
    text = text.strip()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if text == "now":
        return now
    digits = text[1:] if text.startswith("@") else text
    if digits.isdigit():
        return int(digits)
    m = _RELATIVE.fullmatch(text)
    if m:
        return max(0, now - int(m.group(1)) * _UNITS_MS[m.group(2)])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: use an ISO 8601 time (2026-11-25T17:00:00Z), epoch "
                         "milliseconds, or a time before now (-30s, -10m, -2h, -1d)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"{text!r} is before 1970")
    return ms


def time_argument(text: str) -> int:
    """`parse_time` for argparse: a bad time is a usage error naming the forms."""
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as an ISO 8601 UTC time to the millisecond, as shown."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
