"""Self-contained HTML report of a checked history: timeline, linearization, faults, load.

Everything (CSS, SVG, a few lines of JS) is inline so the file can be attached to an issue or
opened from a CI artefact. Operations are drawn per client as bars from call to return;
the longest linearizable prefix is green, the operation where the search got stuck is red,
operations of unknown outcome run to the right edge as thin bars. Large histories
are cut to a window of ``max_ops`` operations around the failure.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .linearizability import CheckInfo, CheckResult, PartitionResult, jsonable
from .model import Model, Operation

__all__ = ["render_html", "write_report"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:24px 0 8px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.ok{background:#2e7d32}.illegal{background:#c62828}.unknown{background:#ef8f00}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#eee} .fail td{background:#fdecea;font-weight:600}
.box{background:#fff;border:1px solid #ddd;border-radius:6px;padding:12px;margin:8px 0;overflow-x:auto}
.note{color:#666;font-size:12px} code{font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#333}
rect.op{stroke:#0003;stroke-width:.5} rect.op:hover{stroke:#000;stroke-width:1.5}
#detail{min-height:1.4em;font-family:monospace;font-size:12px}
"""

_JS = """
document.querySelectorAll('rect.op').forEach(function(r){
  r.addEventListener('click',function(){document.getElementById('detail').textContent=r.dataset.d;});
});
var mark=document.getElementById('fail-mark');
if(mark){var box=mark.closest('.box');box.scrollLeft=Math.max(0,mark.x1.baseVal.value-box.clientWidth/2);}
"""

_COLORS = {
    "linearized": "#66bb6a",
    "failing": "#e53935",
    "outside": "#bdbdbd",
    "ok": "#64b5f6",
    "unknown": "#ffb74d",
}


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(t: float) -> str:
    return "inf" if math.isinf(t) else f"{t:.6g}"


def _tick(t: float) -> str:
    return f"{t:.4g}"


def _focus(info: CheckInfo, max_ops: int) -> tuple[list[tuple[PartitionResult, int]], str]:
    """Operations to draw, as (partition, index) pairs, and a note on what was left out."""
    failure = info.first_failure
    parts = [failure] if failure is not None else info.partitions
    chosen = [(p, i) for p in parts for i in range(len(p.operations))]
    total = len(chosen)
    chosen.sort(key=lambda pi: pi[0].operations[pi[1]].call)
    note = ""
    if failure is not None and len(info.partitions) > 1:
        note = f"Showing the failing partition only ({total} of {info.operations} operations). "
    if total > max_ops:
        centre = 0
        if failure is not None and failure.failing is not None:
            centre = next(k for k, (p, i) in enumerate(chosen) if i == failure.failing)
        start = max(0, min(centre - max_ops // 2, total - max_ops))
        chosen = chosen[start : start + max_ops]
        note += f"Window of {max_ops} operations (#{start}–#{start + max_ops - 1} by call time) of {total}."
    return chosen, note


def _timeline(
    model: Model,
    info: CheckInfo,
    chosen: list[tuple[PartitionResult, int]],
    faults: Sequence[tuple[float, float, str]],
) -> str:
    ops = [p.operations[i] for p, i in chosen]
    if not ops:
        return "<p class=note>No operations.</p>"
    finite = [t for op in ops for t in (op.call, op.return_) if not math.isinf(t)]
    lo, hi = min(finite), max(finite)
    for start, end, _name in faults:
        if end >= lo and start <= hi:
            lo, hi = min(lo, start), max(hi, end)
    span = (hi - lo) or 1.0
    right = hi + span * 0.03
    clients = sorted({op.client_id for op in ops})
    lane = {c: k for k, c in enumerate(clients)}
    # wide enough for bars to stay apart; the box scrolls horizontally
    width = int(min(12000, max(1100, 3 * len(ops))))
    left, row = 60, 16
    height = 24 + row * len(clients) + 20

    def x(t: float) -> float:
        t = right if math.isinf(t) else t
        return left + (t - lo) / (right - lo) * (width - left - 10)

    parts: list[str] = [
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for start, end, name in faults:
        if end < lo or start > right:
            continue
        x0, x1 = x(max(start, lo)), x(min(end, right))
        parts.append(
            f'<rect x="{x0:.1f}" y="14" width="{max(x1 - x0, 1):.1f}" height="{height - 34}" '
            f'fill="#ab47bc" fill-opacity=".13"><title>{_esc(name)} [{_fmt(start)}, {_fmt(end)}]</title></rect>'
            f'<text x="{x0 + 2:.1f}" y="11" fill="#7b1fa2">{_esc(name)}</text>'
        )
    for c, k in lane.items():
        y = 24 + k * row
        parts.append(
            f'<text x="4" y="{y + 11}">c{_esc(c)}</text>'
            f'<line x1="{left}" x2="{width - 10}" y1="{y + row - 1}" y2="{y + row - 1}" stroke="#eee"/>'
        )
    prefixes = {id(p): set(p.linearization) for p, _i in chosen if p.result is CheckResult.ILLEGAL}
    # operations of unknown outcome first and thin, so that the client's later bars stay visible
    order = sorted(range(len(ops)), key=lambda k: not ops[k].pending)
    marker = ""
    for k in order:
        (p, i), op = chosen[k], ops[k]
        kind = _kind(p, i, prefixes.get(id(p), _EMPTY))
        y = 24 + lane[op.client_id] * row + 2
        x0, x1 = x(op.call), x(op.return_)
        text = model.describe_operation(op.input, op.output)
        detail = (
            f"partition {jsonable(p.key)!r} op #{i} client {op.client_id}: {text} "
            f"[{_fmt(op.call)}, {_fmt(op.return_)}] {kind}"
        )
        if op.pending:
            shape = f'y="{y + row - 9}" height="3" fill-opacity=".7"'
        else:
            shape = f'y="{y}" height="{row - 5}"'
        parts.append(
            f'<rect class="op" x="{x0:.1f}" width="{max(x1 - x0, 1.5):.1f}" {shape} '
            f'fill="{_COLORS[kind]}" data-d="{_esc(detail)}"><title>{_esc(detail)}</title></rect>'
        )
        if kind == "failing":
            marker = (
                f'<line id="fail-mark" x1="{x0:.1f}" x2="{x0:.1f}" y1="14" y2="{height - 20}" '
                f'stroke="#e53935" stroke-dasharray="4,3"/>'
                f'<text x="{x0 + 3:.1f}" y="{y - 1}" fill="#c62828">fails here</text>'
            )
    parts.append(marker)
    axis_y = height - 8
    for k in range(6):
        t = lo + (right - lo) * k / 5
        parts.append(f'<text x="{x(t) - 10:.1f}" y="{axis_y}">{_tick(t)}</text>')
    parts.append("</svg>")
    return "".join(parts)


_EMPTY: set[int] = set()


def _kind(p: PartitionResult, i: int, prefix: set[int]) -> str:
    if p.result is CheckResult.ILLEGAL:
        if i == p.failing:
            return "failing"
        return "linearized" if i in prefix else "outside"
    if p.result is CheckResult.OK:
        return "ok"
    return "unknown"


def _derive_load(
    ops: Sequence[Operation],
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    done = [op for op in ops if not op.pending]
    if not done:
        return [], []
    lo = min(op.call for op in done)
    hi = max(op.return_ for op in done)
    buckets = 60
    width = (hi - lo) / buckets or 1.0
    counts = [0] * buckets
    lat: list[list[float]] = [[] for _ in range(buckets)]
    for op in done:
        b = min(buckets - 1, int((op.return_ - lo) / width))
        counts[b] += 1
        lat[b].append(op.return_ - op.call)
    throughput = [(lo + (b + 0.5) * width, counts[b] / width) for b in range(buckets)]
    latency = [(lo + (b + 0.5) * width, sorted(v)[len(v) // 2]) for b, v in enumerate(lat) if v]
    return throughput, latency


def _load_plot(
    throughput: Sequence[tuple[float, float]],
    latency: Sequence[tuple[float, float]],
    faults: Sequence[tuple[float, float, str]],
) -> str:
    series = [s for s in (throughput, latency) if s]
    if not series:
        return "<p class=note>No load data.</p>"
    lo = min(t for s in series for t, _ in s)
    hi = max(t for s in series for t, _ in s)
    span = (hi - lo) or 1.0
    width, height, left = 1100, 180, 60

    def x(t: float) -> float:
        return left + (t - lo) / span * (width - left - 60)

    def path(points: Sequence[tuple[float, float]], top: float) -> str:
        top = top or 1.0
        return " ".join(
            f"{'M' if k == 0 else 'L'}{x(t):.1f},{height - 20 - v / top * (height - 40):.1f}"
            for k, (t, v) in enumerate(points)
        )

    out = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for start, end, name in faults:
        if end < lo or start > hi:
            continue
        x0, x1 = x(max(start, lo)), x(min(end, hi))
        out.append(
            f'<rect x="{x0:.1f}" y="10" width="{max(x1 - x0, 1):.1f}" height="{height - 30}" '
            f'fill="#ab47bc" fill-opacity=".13"><title>{_esc(name)}</title></rect>'
        )
    if throughput:
        top = max(v for _, v in throughput)
        out.append(
            f'<path d="{path(throughput, top)}" fill="none" stroke="#1e88e5" stroke-width="1.5"/>'
            f'<text x="4" y="14" fill="#1e88e5">ops/s (max {top:.4g})</text>'
        )
    if latency:
        top = max(v for _, v in latency)
        out.append(
            f'<path d="{path(latency, top)}" fill="none" stroke="#e53935" stroke-width="1.5"/>'
            f'<text x="{width - 200}" y="14" fill="#e53935">latency (max {top:.4g})</text>'
        )
    for k in range(6):
        t = lo + span * k / 5
        out.append(f'<text x="{x(t) - 10:.1f}" y="{height - 4}">{_tick(t)}</text>')
    out.append("</svg>")
    return "".join(out)


def _failure_section(model: Model, p: PartitionResult, tail: int = 60) -> str:
    ops = p.operations
    states = p.states(model)
    rows = []
    start = max(0, len(p.linearization) - tail)
    if start:
        rows.append(f"<tr><td colspan=4 class=note>… {start} earlier steps omitted</td></tr>")
    for k in range(start, len(p.linearization)):
        i = p.linearization[k]
        op = ops[i]
        rows.append(
            f"<tr><td>{k + 1}</td><td>c{_esc(op.client_id)} #{i}</td>"
            f"<td><code>{_esc(model.describe_operation(op.input, op.output))}</code></td>"
            f"<td><code>{_esc(model.describe_state(states[k]))}</code></td></tr>"
        )
    failing = ""
    if p.failing is not None:
        op = ops[p.failing]
        before = states[-1] if states else model.init()
        failing = (
            f"<p>Fails at <b>operation #{p.failing}</b> (client {_esc(op.client_id)}, "
            f"call {_fmt(op.call)}, return {_fmt(op.return_)}): "
            f"<code id=failing-op>{_esc(model.describe_operation(op.input, op.output))}</code> "
            f"cannot take effect after the longest linearizable prefix, and no other order "
            f"gets further: <b>{_esc(model.explain(before, op.input, op.output))}</b>.</p>"
            f"<p>State there: <code>{_esc(model.describe_state(before))}</code></p>"
        )
        rows.append(
            f"<tr class=fail><td>✗</td><td>c{_esc(op.client_id)} #{p.failing}</td>"
            f"<td><code>{_esc(model.describe_operation(op.input, op.output))}</code></td>"
            f"<td>not linearizable here</td></tr>"
        )
    return (
        f"<h2>Failure in partition {_esc(jsonable(p.key))}</h2><div class=box>{failing}"
        f"<p>Longest linearizable prefix: {len(p.linearization)} of {len(ops)} operations.</p>"
        f"<table><tr><th>step</th><th>op</th><th>operation</th><th>state after</th></tr>"
        f"{''.join(rows)}</table></div>"
    )


def render_html(
    model: Model,
    info: CheckInfo,
    *,
    title: str = "raftmq linearizability report",
    faults: Sequence[tuple[float, float, str]] = (),
    throughput: Sequence[tuple[float, float]] | None = None,
    latency: Sequence[tuple[float, float]] | None = None,
    accounting: dict[str, Any] | None = None,
    max_ops: int = 4000,
) -> str:
    """The report as one HTML string; faults are (start, end, name) in the history's time unit.

    ``throughput``/``latency`` are (time, value) series; when neither is given they are
    derived from the operations themselves.
    """
    chosen, note = _focus(info, max_ops)
    if throughput is None and latency is None:
        throughput, latency = _derive_load([op for p in info.partitions for op in p.operations])
    verdict = info.result
    summary = (
        f"<span class='badge {verdict.value}'>{_esc(verdict.verdict)}</span> "
        f"{info.operations} operations in {len(info.partitions)} partition(s), model "
        f"<code>{_esc(model.name)}</code>, checked in {info.elapsed:.3f} s"
        f"{' (timed out)' if info.timed_out else ''}."
    )
    legend = " ".join(
        f"<span class=badge style='background:{c};color:#000'>{k}</span>"
        for k, c in _COLORS.items()
    )
    body = [f"<h1>{_esc(title)}</h1><p>{summary}</p>"]
    failure = info.first_failure
    if failure is not None:
        body.append(_failure_section(model, failure))
    body.append(
        f"<h2>Timeline</h2><div class=box><p class=note>{legend} Thin bars: outcome unknown (may take effect any time after the call). "
        f"Purple bands: faults. Click an operation for details. {_esc(note)}</p>"
        f"{_timeline(model, info, chosen, faults)}<div id=detail></div></div>"
    )
    if faults:
        rows = "".join(
            f"<tr><td>{_esc(n)}</td><td>{_fmt(s)}</td><td>{_fmt(e)}</td></tr>" for s, e, n in faults
        )
        body.append(
            f"<h2>Faults</h2><div class=box><table><tr><th>fault</th><th>start</th><th>end</th></tr>{rows}</table></div>"
        )
    body.append(
        f"<h2>Throughput and latency</h2><div class=box>{_load_plot(throughput or (), latency or (), faults)}</div>"
    )
    if accounting is not None:
        body.append(
            "<h2>Accounting</h2><div class=box><pre>"
            f"{_esc(json.dumps(accounting.get('totals', accounting), indent=1, default=str))}</pre></div>"
        )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}<script>{_JS}</script></body></html>"
    )


def write_report(path: str | Path, model: Model, info: CheckInfo, **options: Any) -> Path:
    """Render the report and write it to ``path``."""
    target = Path(path)
    target.write_text(render_html(model, info, **options), encoding="utf-8")
    return target
