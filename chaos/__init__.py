"""Chaos testing for raftmq: histories, models and the linearizability checker.

The checker is a port of Porcupine (Wing & Gong / Lowe search with P-compositionality);
``chaos.accounting`` adds linear-time message accounting and ``chaos.report`` an HTML report.
"""

from .accounting import account_queue_history
from .histories import load_operations, parse_jsonl
from .linearizability import CheckInfo, CheckResult, PartitionResult, check_events, check_operations
from .model import INFINITY, UNKNOWN, Event, EventKind, Model, Operation, events_to_operations
from .models import CasRegisterModel, ConsumerOffsetModel, KeyValueModel, QueueLogModel, make_model
from .report import render_html, write_report

__all__ = [
    "INFINITY",
    "UNKNOWN",
    "CasRegisterModel",
    "CheckInfo",
    "CheckResult",
    "ConsumerOffsetModel",
    "Event",
    "EventKind",
    "KeyValueModel",
    "Model",
    "Operation",
    "PartitionResult",
    "QueueLogModel",
    "account_queue_history",
    "check_events",
    "check_operations",
    "events_to_operations",
    "load_operations",
    "make_model",
    "parse_jsonl",
    "render_html",
    "write_report",
]
