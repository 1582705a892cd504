"""HTML report: self-contained, marks the failing operation, copes with large histories."""

from __future__ import annotations

import html
import re

from chaos.linearizability import check_operations
from chaos.model import INFINITY, UNKNOWN, Operation
from chaos.models import KeyValueModel, QueueLogModel
from chaos.report import render_html, write_report


def _illegal_queue_history() -> list[Operation]:
    return [
        Operation(0, ("append", "q", "a"), 0.0, 0, 1.0),
        Operation(1, ("append", "q", "b"), 0.5, 1, 2.0),
        Operation(2, ("append", "q", "t"), 0.2, UNKNOWN, INFINITY),
        Operation(3, ("read", "q", 0, 5), 3.0, ("b", "a"), 4.0),
    ]


def test_report_marks_failing_operation(tmp_path) -> None:
    model = QueueLogModel()
    info = check_operations(model, _illegal_queue_history())
    failure = info.first_failure
    assert failure is not None and failure.failing is not None
    failing = failure.operations[failure.failing]
    text = model.describe_operation(failing.input, failing.output)
    out = write_report(
        tmp_path / "r.html",
        model,
        info,
        faults=[(0.4, 2.5, "partition {n1} {n2 n3}")],
        throughput=[(0.0, 10.0), (2.0, 12.0)],
        latency=[(0.0, 0.1), (2.0, 0.3)],
    )
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "not-linearizable" in page
    assert f"<code id=failing-op>{html.escape(text)}</code>" in page
    assert "partition {n1} {n2 n3}" in page
    assert 'fill="#e53935"' in page  # the failing bar
    assert 'height="3"' in page  # the pending append, drawn thin
    assert "fails here" in page
    # no external assets
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_report_for_linearizable_history_and_window() -> None:
    model = KeyValueModel()
    ops = [
        Operation(i % 7, ("put", f"k{i % 3}", str(i)), float(i), None, i + 0.5) for i in range(3000)
    ]
    info = check_operations(model, ops)
    page = render_html(model, info, max_ops=500)
    assert "linearizable" in page and "Window of 500 operations" in page
    assert page.count('class="op"') == 500
