"""JSON-lines logs, so the chaos harness can merge and search the logs of many processes.

Each record is one JSON object: ts, level, logger, node, msg, plus any structured fields
given as `logger.info("...", extra={"fields": {...}})` and the traceback as `exc`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["JsonFormatter", "configure_logging"]

_RESERVED = ("ts", "level", "logger", "node", "msg")


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON tagged with the process's node name."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                # never let a field overwrite the envelope every reader relies on
                out[f"field_{key}" if key in _RESERVED else str(key)] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure_logging(node: str, level: str | int = "INFO", stream: IO[str] | None = None) -> None:
    """Route all logging of this process to `stream` (stderr) as JSON lines.

    Replaces handlers already on the root logger, so calling it twice does not duplicate
    lines.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
