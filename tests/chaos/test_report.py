"""HTML report: self-contained, marks the failing operation, copes with large histories."""

from __future__ import annotations

import html
import re

from chaos.linearizability import check_operations
from chaos.model import INFINITY, UNKNOWN, Operation
from chaos.models import CasRegisterModel, KeyValueModel, QueueLogModel
from chaos.report import _fault_rows, _ticks, render_html, write_report


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
    assert "<span class='badge ok'>linearizable</span>" in page, page[:2000]
    assert "not-linearizable" not in page and "Window of 500 operations" in page
    assert page.count('class="op"') == 500


def test_failing_operation_is_marked_in_the_timeline() -> None:
    model = QueueLogModel()
    info = check_operations(model, _illegal_queue_history())
    failure = info.first_failure
    assert failure is not None and failure.failing is not None
    page = render_html(model, info, faults=[(0.4, 2.5, "partition {n1} {n2 n3}")])
    assert page.count('class="op failing"') == 1
    assert 'id="fail-mark"' in page
    assert f"fails here: #{failure.failing}" in page
    assert "Failure in partition &quot;q&quot;" in page
    # lane labels sit outside the horizontally scrolling part, so they stay visible
    lanes, rest = page.split('<svg class="lanes"', 1)[1].split("<div class=scroll>", 1)
    assert ">c0<" in lanes and 'class="op' not in lanes and 'class="op' in rest
    # the legend lists only the kinds of operations drawn
    assert "in the longest linearizable prefix" in page
    assert "part of a valid linearization" not in page


def test_unpartitioned_failure_and_long_descriptions() -> None:
    model = CasRegisterModel()
    ops = [Operation(0, ("write", i), 2.0 * i, None, 2.0 * i + 1) for i in range(3)]
    ops.append(Operation(1, ("read",), 10.0, 7, 11.0))
    info = check_operations(model, ops)
    page = render_html(model, info)
    assert "<h2>Failure</h2>" in page and "partition None" not in page

    queue = QueueLogModel()
    many = tuple(f"message-{i}" for i in range(200))
    history = [
        Operation(k, ("append", "q", m), float(k), k, k + 0.5) for k, m in enumerate(many[:5])
    ]
    history.append(Operation(9, ("read", "q", 0, 500), 10.0, many, 11.0))
    info = check_operations(queue, history)
    failure = info.first_failure
    assert failure is not None and failure.failing == 5
    page = render_html(queue, info)
    text = queue.describe_operation(history[5].input, many)
    # the failing operation in full, but clipped in the step table (with the full text on hover)
    assert f"<code id=failing-op>{html.escape(text)}</code>" in page
    assert " … " in page and f"title='{html.escape(text)}'" in page


def test_faults_labels_ticks_and_accounting() -> None:
    placed, rows = _fault_rows([(10.0, 50.0, "partition {n1}"), (20.0, 40.0, "kill n2")])
    assert rows == 2 and {r for *_rest, r in placed} == {0, 1}
    placed, rows = _fault_rows([(10.0, 50.0, "a"), (500.0, 600.0, "b")])
    assert rows == 1
    assert [label for _t, label in _ticks(0.3, 9.7, 5)] == ["2", "4", "6", "8"]
    assert [label for _t, label in _ticks(0.0, 1.0, 5)] == [
        "0.0",
        "0.2",
        "0.4",
        "0.6",
        "0.8",
        "1.0",
    ]

    model = QueueLogModel()
    info = check_operations(model, _illegal_queue_history())
    page = render_html(
        model,
        info,
        faults=[(0.4, 2.5, "partition {n1} {n2 n3}"), (0.5, 1.0, "kill n1")],
        accounting={"valid": False, "totals": {"lost": 2, "unread": 1}},
    )
    assert "<div class=bad>lost: 2</div>" in page and "<div>unread: 1</div>" in page
    assert "invalid</span>" in page
    assert "median latency" in page and "throughput" in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)
