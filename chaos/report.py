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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .accounting import ERROR_KINDS
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
#failing-op,.long{display:block;max-height:5.6em;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere;
background:#f6f6f6;border-radius:3px;padding:2px 6px}
dl.why{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:4px 12px;margin:8px 0}
dl.why dt{color:#666} dl.why dd{margin:0}
.steps{max-height:260px;overflow:auto;border:1px solid #eee;display:inline-block;max-width:100%}
.steps th{position:sticky;top:0} .steps td:first-child{text-align:right}
.steps td:nth-child(-n+2){white-space:nowrap}
.timeline{display:flex;align-items:flex-start} .lanes{flex:none}
.scroll{overflow-x:auto;flex:1 1 auto;min-width:0}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg text.halo{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round;font-weight:600}
rect.op{stroke:#0003;stroke-width:.5;cursor:pointer} rect.op:hover,rect.op.sel{stroke:#000;stroke-width:1.5}
rect.op.failing{stroke:#7f0000;stroke-width:1.5}
#detail{min-height:1.4em;font-family:monospace;font-size:12px;margin-top:6px;overflow-wrap:anywhere}
.acct{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:2px 16px;margin-top:8px}
.acct .bad{color:#c62828;font-weight:600}
"""

_JS = """
document.querySelectorAll('rect.op').forEach(function(r){
  r.addEventListener('click',function(){
    document.querySelectorAll('rect.op.sel').forEach(function(s){s.classList.remove('sel');});
    r.classList.add('sel');
    document.getElementById('detail').textContent=r.dataset.d;
  });
});
var mark=document.getElementById('fail-mark');
if(mark){var sc=mark.closest('.scroll');sc.scrollLeft=Math.max(0,mark.x1.baseVal.value-sc.clientWidth/2);}
var steps=document.querySelector('.steps');
if(steps){steps.scrollTop=steps.scrollHeight;}
"""

_COLORS = {
    "linearized": "#66bb6a",
    "failing": "#e53935",
    "outside": "#bdbdbd",
    "ok": "#64b5f6",
    "unknown": "#ffb74d",
}

_MEANING = {
    "linearized": "in the longest linearizable prefix",
    "failing": "cannot take effect after that prefix",
    "outside": "not in the prefix",
    "ok": "part of a valid linearization",
    "unknown": "not decided (time limit, or checking stopped at the first failure)",
}

_FAULT = "#ab47bc"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(t: float) -> str:
    return "inf" if math.isinf(t) else f"{t:.6g}"


def _clip(text: str, limit: int = 160) -> str:
    """``text`` escaped and shortened in the middle to about ``limit`` characters."""
    if len(text) <= limit:
        return _esc(text)
    head = limit * 2 // 3
    return f"{_esc(text[:head])} … {_esc(text[-(limit - head) :])}"


def _ticks(lo: float, hi: float, count: int) -> list[tuple[float, str]]:
    """About ``count`` round tick positions in [lo, hi] with their labels."""
    span = hi - lo
    if span <= 0 or not math.isfinite(span):
        return [(lo, f"{lo:.6g}")]
    raw = span / max(1, count)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    k = 0
    while (t := first + k * step) <= hi + step * 1e-9:
        t = t + 0.0 if abs(t) > step * 1e-9 else 0.0
        out.append((t, f"{t:.{decimals}f}" if abs(t) < 1e7 else f"{t:.4g}"))
        k += 1
    return out


def _fault_rows(
    spans: Sequence[tuple[float, float, str]], max_rows: int = 3
) -> tuple[list[tuple[float, float, str, int]], int]:
    """Give each fault label (x0, x1, name) a row so that labels do not overlap."""
    ends: list[float] = []
    placed = []
    for x0, x1, name in sorted(spans, key=lambda s: s[0]):
        width = 6.5 * len(name) + 8
        row = next((r for r, end in enumerate(ends) if end <= x0), None)
        if row is None:
            if len(ends) < max_rows:
                row = len(ends)
                ends.append(0.0)
            else:
                row = min(range(len(ends)), key=ends.__getitem__)
        ends[row] = max(ends[row], x0 + width)
        placed.append((x0, x1, name, row))
    return placed, len(ends)


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
    note: str = "",
) -> str:
    """Legend, lane labels (fixed) and the operations (scrolling horizontally) as HTML."""
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
    # wide enough for bars to stay apart; the operations scroll horizontally
    width = int(min(12000, max(1100, 3 * len(ops))))
    pad, row = 16, 16

    def x(t: float) -> float:
        t = right if math.isinf(t) else t
        return pad + (t - lo) / (right - lo) * (width - 2 * pad)

    shown = sorted(
        (x(max(start, lo)), x(min(end, right)), name, start, end)
        for start, end, name in faults
        if end >= lo and start <= right
    )
    placed, label_rows = _fault_rows([(x0, x1, name) for x0, x1, name, _s, _e in shown])
    top = 8 + 13 * label_rows if label_rows else 8
    bottom = top + row * len(clients)
    height = bottom + 22

    parts: list[str] = [
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for k in range(1, len(clients), 2):
        parts.append(
            f'<rect x="0" y="{top + k * row}" width="{width}" height="{row}" fill="#f5f5f5"/>'
        )
    for (x0, x1, name, start, end), (_x0, _x1, _name, r) in zip(shown, placed, strict=True):
        parts.append(
            f'<rect x="{x0:.1f}" y="{top - 3}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{bottom - top + 3}" fill="{_FAULT}" fill-opacity=".13">'
            f"<title>{_esc(name)} [{_fmt(start)}, {_fmt(end)}]</title></rect>"
            f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="{3 + 13 * r}" y2="{top - 3}" stroke="{_FAULT}" '
            f'stroke-opacity=".5"/>'
            f'<text x="{x0 + 3:.1f}" y="{11 + 13 * r}" fill="#7b1fa2">{_esc(name)}'
            f"<title>{_esc(name)} [{_fmt(start)}, {_fmt(end)}]</title></text>"
        )
    prefixes = {id(p): set(p.linearization) for p, _i in chosen if p.result is CheckResult.ILLEGAL}
    # operations of unknown outcome first and thin, so that the client's later bars stay
    # visible; the failing operation last, on top of everything
    kinds = [_kind(p, i, prefixes.get(id(p), _EMPTY)) for p, i in chosen]
    order = sorted(range(len(ops)), key=lambda k: (kinds[k] == "failing", not ops[k].pending))
    marker = ""
    for k in order:
        (p, i), op, kind = chosen[k], ops[k], kinds[k]
        y = top + lane[op.client_id] * row + 2
        x0, x1 = x(op.call), x(op.return_)
        text = model.describe_operation(op.input, op.output)
        where = "" if p.key is None else f"partition {jsonable(p.key)!r} "
        detail = (
            f"{where}op #{i} client {op.client_id}: {text} "
            f"[{_fmt(op.call)}, {_fmt(op.return_)}] {kind}"
        )
        if op.pending:
            shape = f'y="{y + row - 9}" height="3" fill-opacity=".7"'
        else:
            shape = f'y="{y}" height="{row - 5}"'
        least = 4.0 if kind == "failing" else 1.5
        at = x0
        if x1 - x0 < least:
            x0 = max(0.0, (x0 + x1 - least) / 2)
        parts.append(
            f'<rect class="op{" failing" if kind == "failing" else ""}" x="{x0:.1f}" '
            f'width="{max(x1 - x0, least):.1f}" {shape} '
            f'fill="{_COLORS[kind]}" data-d="{_esc(detail)}"><title>{_clip(detail, 300)}</title></rect>'
        )
        if kind == "failing":
            near_end = x0 > width - 90
            anchor = ' text-anchor="end"' if near_end else ""
            tx = x0 - 4 if near_end else x0 + max(x1 - x0, least) + 4
            marker = (
                f'<line id="fail-mark" x1="{at:.1f}" x2="{at:.1f}" y1="{top - 3}" y2="{bottom}" '
                f'stroke="#e53935" stroke-dasharray="4,3"/>'
                f'<text class="halo" x="{tx:.1f}" y="{y + row - 6}" fill="#c62828"{anchor}>'
                f"fails here: #{i}</text>"
            )
    parts.append(marker)
    parts.append(f'<line x1="0" x2="{width}" y1="{bottom}" y2="{bottom}" stroke="#999"/>')
    for t, label in _ticks(lo, hi, max(4, width // 140)):
        tx = x(t)
        anchor = "start" if tx < 30 else "middle"
        parts.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#999"/>'
            f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="{anchor}">{label}</text>'
        )
    parts.append("</svg>")

    names = [f"c{c}" for c in clients]
    lanes_width = max(36, 10 + int(7 * max(len(n) for n in names)))
    lanes = [
        f'<svg class="lanes" width="{lanes_width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for k, name in enumerate(names):
        lanes.append(f'<text x="4" y="{top + k * row + 12}">{_esc(name)}</text>')
    lanes.append(f'<text x="4" y="{bottom + 16}" fill="#666">time</text></svg>')

    used = [k for k in _COLORS if k in kinds]
    legend = " ".join(
        f"<span class=badge style='background:{_COLORS[k]};color:#000' title='{_esc(_MEANING[k])}'>"
        f"{k}</span> <span class=note>{_esc(_MEANING[k])}</span>"
        for k in used
    )
    extra = ""
    if any(op.pending for op in ops):
        extra += "Thin bars: outcome unknown (may take effect any time after the call). "
    if shown:
        extra += "Purple bands: faults. "
    return (
        f"<p>{legend}</p><p class=note>{extra}Click an operation for details. {_esc(note)}</p>"
        f"<div class=timeline>{''.join(lanes)}<div class=scroll>{''.join(parts)}</div></div>"
        f"<div id=detail></div>"
    )


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
    # about ten completions per bucket on average, so that the curves are not just noise
    buckets = max(4, min(60, len(done) // 10))
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


_THROUGHPUT, _LATENCY = "#1e88e5", "#e53935"


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
    width, left, right = 1100, 64, 64

    def x(t: float) -> float:
        return left + (t - lo) / span * (width - left - right)

    shown = sorted(
        (x(max(start, lo)), x(min(end, hi)), name, start, end)
        for start, end, name in faults
        if end >= lo and start <= hi
    )
    placed, label_rows = _fault_rows([(x0, x1, name) for x0, x1, name, _s, _e in shown])
    ptop = 8 + 13 * label_rows + 6
    pbottom = ptop + 150
    height = pbottom + 22

    def path(points: Sequence[tuple[float, float]], top: float) -> str:
        top = top or 1.0
        return " ".join(
            f"{'M' if k == 0 else 'L'}{x(t):.1f},{pbottom - v / top * (pbottom - ptop):.1f}"
            for k, (t, v) in enumerate(points)
        )

    out = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for (x0, x1, name, start, end), (_x0, _x1, _name, r) in zip(shown, placed, strict=True):
        out.append(
            f'<rect x="{x0:.1f}" y="{ptop}" width="{max(x1 - x0, 1):.1f}" height="{pbottom - ptop}" '
            f'fill="{_FAULT}" fill-opacity=".13"><title>{_esc(name)} [{_fmt(start)}, {_fmt(end)}]'
            f"</title></rect>"
            f'<text x="{x0 + 3:.1f}" y="{11 + 13 * r}" fill="#7b1fa2">{_esc(name)}</text>'
        )
    for frac in (0.0, 0.5, 1.0):
        gy = pbottom - frac * (pbottom - ptop)
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{gy:.1f}" y2="{gy:.1f}" '
            f'stroke="{"#999" if frac == 0 else "#e5e5e5"}"/>'
        )
    legend = []
    for points, colour, side, name in (
        (throughput, _THROUGHPUT, "left", "throughput (operations per time unit)"),
        (latency, _LATENCY, "right", "median latency (time units)"),
    ):
        if not points:
            continue
        top = max(v for _, v in points)
        out.append(
            f'<path d="{path(points, top)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
        ax, anchor = (left - 6, "end") if side == "left" else (width - right + 6, "start")
        for frac in (0.0, 0.5, 1.0):
            gy = pbottom - frac * (pbottom - ptop)
            out.append(
                f'<text x="{ax}" y="{gy + 4:.1f}" text-anchor="{anchor}" fill="{colour}">'
                f"{top * frac:.3g}</text>"
            )
        legend.append(f"<span style='color:{colour}'>━━ {name}, {side} axis (max {top:.4g})</span>")
    for t, label in _ticks(lo, hi, 8):
        tx = x(t)
        out.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{pbottom}" y2="{pbottom + 4}" stroke="#999"/>'
            f'<text x="{tx:.1f}" y="{pbottom + 16}" text-anchor="middle">{label}</text>'
        )
    out.append("</svg>")
    return f"<p class=note>{' &nbsp; '.join(legend)}</p>{''.join(out)}"


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
        text = model.describe_operation(op.input, op.output)
        state = model.describe_state(states[k])
        rows.append(
            f"<tr><td>{k + 1}</td><td>c{_esc(op.client_id)} #{i}</td>"
            f"<td><code title='{_esc(text)}'>{_clip(text)}</code></td>"
            f"<td><code title='{_esc(state)}'>{_clip(state, 80)}</code></td></tr>"
        )
    failing = ""
    if p.failing is not None:
        op = ops[p.failing]
        before = states[-1] if states else model.init()
        text = model.describe_operation(op.input, op.output)
        failing = (
            f"<p>Fails at <b>operation #{p.failing}</b> (client {_esc(op.client_id)}, "
            f"call {_fmt(op.call)}, return {_fmt(op.return_)}, marked in red in the timeline): "
            f"it cannot take effect after the longest linearizable prefix, and no other order "
            f"gets further.</p><dl class=why>"
            f"<dt>operation</dt><dd><code id=failing-op>{_esc(text)}</code></dd>"
            f"<dt>why</dt><dd><b class=long>{_esc(model.explain(before, op.input, op.output))}</b></dd>"
            f"<dt>state there</dt><dd><code class=long>{_esc(model.describe_state(before))}</code></dd>"
            f"</dl>"
        )
        rows.append(
            f"<tr class=fail><td>✗</td><td>c{_esc(op.client_id)} #{p.failing}</td>"
            f"<td><code title='{_esc(text)}'>{_clip(text)}</code></td>"
            f"<td>not linearizable here</td></tr>"
        )
    where = "" if p.key is None else f" in partition {json.dumps(jsonable(p.key), default=str)}"
    return (
        f"<h2>Failure{_esc(where)}</h2><div class=box>{failing}"
        f"<p>Longest linearizable prefix: {len(p.linearization)} of {len(ops)} operations "
        f"(green in the timeline), step by step:</p>"
        f"<div class=steps><table><tr><th>step</th><th>op</th><th>operation</th>"
        f"<th>state after</th></tr>{''.join(rows)}</table></div></div>"
    )


_BAD = (*ERROR_KINDS, "duplicated_unretried")  # the run analysis' split adds this error


def _accounting(accounting: dict[str, Any]) -> str:
    totals = accounting.get("totals")
    if not isinstance(totals, dict):
        return f"<pre>{_esc(json.dumps(accounting, indent=1, default=str))}</pre>"
    valid = accounting.get("valid")
    head = ""
    if isinstance(valid, bool):
        head = (
            f"<span class='badge {'ok' if valid else 'illegal'}'>{'valid' if valid else 'invalid'}"
            f"</span> "
        )
    items = "".join(
        f"<div{' class=bad' if k in _BAD and v else ''}>{_esc(k)}: {_esc(v)}</div>"
        for k, v in totals.items()
    )
    return f"{head}<span class=note>message accounting over all queues</span><div class=acct>{items}</div>"


def _unavailability(table: dict[str, dict[str, Any]]) -> str:
    """One row per fault kind: how many, worst seconds to a write during and after it."""

    def secs(v: Any) -> str:
        return "none" if v is None else f"{v:.2f} s"

    rows = "".join(
        f"<tr{' class=fail' if row.get('unrecovered') else ''}><td>{_esc(kind)}</td>"
        f"<td>{_esc(row.get('faults'))}</td><td>{secs(row.get('worst_during'))}</td>"
        f"<td>{secs(row.get('worst_after_heal'))}</td><td>{_esc(row.get('unrecovered'))}</td></tr>"
        for kind, row in table.items()
    )
    return (
        "<table><tr><th>fault</th><th>count</th><th>worst time to a write, from its start</th>"
        "<th>worst time to a write after its heal</th><th>groups past the bound</th></tr>"
        f"{rows}</table>"
    )


def _transactions(tx: dict[str, Any]) -> str:
    """The transactional checker's verdict (`chaos.txcheck`)."""
    from .txcheck import VIOLATIONS

    return _checker_section("Transactions", tx, VIOLATIONS, [
        ("transactions", tx.get("transactions")), ("half messages", tx.get("halves")),
        ("check-backs", tx.get("checks")), ("pipeline", tx.get("pipeline")),
        ("undrained queues", tx.get("undrained_queues"))])


def _security(sec: dict[str, Any]) -> str:
    """The security checker's verdict (`chaos.authcheck`)."""
    from .authcheck import VIOLATIONS

    return _checker_section("Users and ACLs", sec, VIOLATIONS, [
        ("changes", sec.get("changes")), ("logins", sec.get("logins")),
        ("operations", sec.get("authz")), ("nodes read at the end", sec.get("final_nodes")),
        ("problems", sec.get("problems"))])


def _delays(d: dict[str, Any]) -> str:
    """The delayed-message checker's verdict (`chaos.delaycheck`), lateness included."""
    from .delaycheck import VIOLATIONS

    late = d.get("lateness_ms") or {}

    def ms(v: Any) -> str:
        return "none" if v is None else f"{v:,.0f} ms"

    return _checker_section("Delayed messages", d, VIOLATIONS, [
        ("messages", d.get("messages")), ("transactions", d.get("transactions")),
        ("lateness past due", f"p50 {ms(late.get('p50'))}, p99 {ms(late.get('p99'))}, "
                              f"max {ms(late.get('max'))} over {late.get('count', 0)} "
                              f"messages (late beyond {ms(d.get('late_bound_ms'))})"),
        ("undrained queues", d.get("undrained_queues"))])


def _simple(s: dict[str, Any]) -> str:
    """The simple-consumer checker's verdict (`chaos.simplecheck`)."""
    from .simplecheck import VIOLATIONS

    return _checker_section("Simple consumers", s, VIOLATIONS, [
        ("messages", s.get("messages")), ("settled", s.get("settled")),
        ("late acks", s.get("late_acks")), ("receives", s.get("receives")),
        ("receive requests without an answer", s.get("lost_requests")),
        ("dead letters read at the end", s.get("dlq_read"))])


def _fifo(f: dict[str, Any]) -> str:
    """The FIFO checker's verdict per message group (`chaos.fifocheck`)."""
    from .fifocheck import VIOLATIONS

    return _checker_section("FIFO message groups", f, VIOLATIONS, [
        ("message groups", f.get("message_groups")), ("messages", f.get("messages")),
        ("largest group", f.get("largest_group")), ("deliveries", f.get("deliveries")),
        ("dead letters read at the end", f.get("dlq_read"))])


def _ordered(o: dict[str, Any]) -> str:
    """The ordering checker's verdict (`chaos.ordercheck`)."""
    from .ordercheck import VIOLATIONS

    return _checker_section("Ordered consumption", o, VIOLATIONS, [
        ("keys", o.get("keys")), ("holders", o.get("holders")),
        ("handlings", o.get("handlings")), ("handled again", o.get("handled_again")),
        ("failed attempts", o.get("failed_attempts")),
        ("unknown handlings", o.get("unknown_handlings")),
        ("acknowledged sends", o.get("expected")), ("sends", o.get("sends"))])


def _checker_section(title: str, verdict: dict[str, Any], violations: Iterable[str],
                     facts: list[tuple[str, Any]]) -> str:
    """A checker's verdict: every violation count (red when not zero), its facts, and the
    first examples of each violation found."""
    badge = ("<span class='badge ok'>valid</span>" if verdict.get("valid")
             else "<span class='badge illegal'>invalid</span>")
    counts = "".join(
        f"<div class='{'bad' if verdict.get(kind) else ''}'>{_esc(kind)}: "
        f"{_esc(verdict.get(kind, 0))}</div>"
        for kind in violations
    )
    rows = "".join(f"<tr><td>{_esc(k)}</td><td><code>{_clip(json.dumps(v), 400)}</code></td></tr>"
                   for k, v in facts)
    examples = "".join(
        f"<tr class=fail><td>{_esc(kind)}</td><td><code class=long>"
        f"{_esc(json.dumps(items, indent=1))}</code></td></tr>"
        for kind, items in (verdict.get("examples") or {}).items()
    )
    return (
        f"<h2>{_esc(title)} {badge}</h2><div class=box><div class=acct>{counts}</div>"
        f"<table>{rows}{examples}</table></div>"
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
    unavailability: dict[str, dict[str, Any]] | None = None,
    transactions: dict[str, Any] | None = None,
    security: dict[str, Any] | None = None,
    delays: dict[str, Any] | None = None,
    simple: dict[str, Any] | None = None,
    fifo: dict[str, Any] | None = None,
    ordered: dict[str, Any] | None = None,
    max_ops: int = 4000,
) -> str:
    """The report as one HTML string; faults are (start, end, name) in the history's time unit.

    ``throughput``/``latency`` are (time, value) series; when neither is given they are
    derived from the operations themselves. ``unavailability`` is a chaos run's
    ``unavailability_by_fault`` (one row per fault kind); ``transactions`` its
    transactional verdict (`chaos.txcheck`), ``security`` that of users and ACLs
    (`chaos.authcheck`), ``delays`` that of delayed messages (`chaos.delaycheck`) and
    ``simple`` that of simple consumers (`chaos.simplecheck`), ``fifo`` that of FIFO
    message groups (`chaos.fifocheck`) and ``ordered`` that of ordered consumption
    (`chaos.ordercheck`), each shown first when it found a violation.
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
    body = [f"<h1>{_esc(title)}</h1><p>{summary}</p>"]
    if transactions is not None and not transactions.get("valid", True):
        body.append(_transactions(transactions))
    if security is not None and not security.get("valid", True):
        body.append(_security(security))
    if delays is not None and not delays.get("valid", True):
        body.append(_delays(delays))
    if simple is not None and not simple.get("valid", True):
        body.append(_simple(simple))
    if fifo is not None and not fifo.get("valid", True):
        body.append(_fifo(fifo))
    if ordered is not None and not ordered.get("valid", True):
        body.append(_ordered(ordered))
    failure = info.first_failure
    if failure is not None:
        body.append(_failure_section(model, failure))
    body.append(
        f"<h2>Timeline</h2><div class=box>{_timeline(model, info, chosen, faults, note)}</div>"
    )
    if faults:
        rows = "".join(
            f"<tr><td>{_esc(n)}</td><td>{_fmt(s)}</td><td>{_fmt(e)}</td></tr>" for s, e, n in faults
        )
        body.append(
            f"<h2>Faults</h2><div class=box><table><tr><th>fault</th><th>start</th><th>end</th></tr>{rows}</table></div>"
        )
    if unavailability:
        body.append(f"<h2>Unavailability per fault</h2><div class=box>{_unavailability(unavailability)}</div>")
    body.append(
        f"<h2>Throughput and latency</h2><div class=box>{_load_plot(throughput or (), latency or (), faults)}</div>"
    )
    if accounting is not None:
        body.append(f"<h2>Accounting</h2><div class=box>{_accounting(accounting)}</div>")
    if transactions is not None and transactions.get("valid", True):
        body.append(_transactions(transactions))
    if security is not None and security.get("valid", True):
        body.append(_security(security))
    if delays is not None and delays.get("valid", True):
        body.append(_delays(delays))
    if simple is not None and simple.get("valid", True):
        body.append(_simple(simple))
    if fifo is not None and fifo.get("valid", True):
        body.append(_fifo(fifo))
    if ordered is not None and ordered.get("valid", True):
        body.append(_ordered(ordered))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}<script>{_JS}</script></body></html>"
    )


def write_report(path: str | Path, model: Model, info: CheckInfo, **options: Any) -> Path:
    """Render the report and write it to ``path``."""
    target = Path(path)
    target.write_text(render_html(model, info, **options), encoding="utf-8")
    return target
