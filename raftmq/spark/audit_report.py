"""The audit's HTML page: verdict, counts per queue, latency percentiles, and plots (latency
distributions, events over time with the faults) as inline SVG. Pure: a result in, text out."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

__all__ = ["render_html"]

_W, _H = 640, 180


def _bars(points: Sequence[Sequence[float]], *, label: str, log_x: bool = False) -> str:
    """A bar chart of (x, y) points, one bar per point, x labels under a few bars."""
    if not points:
        return f"<p>{html.escape(label)}: no data</p>"
    top = max(p[1] for p in points) or 1
    bw = _W / len(points)
    bars = []
    for i, (x, y) in enumerate(points):
        h = (_H - 20) * y / top
        bars.append(f'<rect x="{i * bw:.1f}" y="{_H - 20 - h:.1f}" width="{max(bw - 1, 1):.1f}" '
                    f'height="{h:.1f}" fill="#4a7ab5"><title>{x:g}: {y:g}</title></rect>')
    step = max(1, len(points) // 8)
    for i in range(0, len(points), step):
        x = points[i][0]
        text = f"≤{x:g}" if log_x else f"{x:g}"
        bars.append(f'<text x="{i * bw:.1f}" y="{_H - 5}" font-size="10">{text}</text>')
    return (f"<h3>{html.escape(label)}</h3><svg width='{_W}' height='{_H}' "
            f"xmlns='http://www.w3.org/2000/svg'>{''.join(bars)}</svg>")


def _events(result: dict[str, Any]) -> str:
    rows = result.get("events_per_second") or []
    if not rows:
        return "<p>no appends in the history</p>"
    last = max(r[0] for r in rows) + 1
    top = max(max(r[1], r[2]) for r in rows) or 1

    def line(col: int, color: str) -> str:
        pts = " ".join(f"{_W * r[0] / last:.1f},{(_H - 20) * (1 - r[col] / top):.1f}"
                       for r in rows)
        return f'<polyline points="{pts}" fill="none" stroke="{color}"/>'

    faults = []
    for kind, f, t in result.get("faults") or []:
        x = _W * max(0.0, t) / last
        color = "#c0392b" if kind == "invoke" else "#27ae60"
        faults.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{_H - 20}" stroke="{color}" '
                      f'stroke-dasharray="3,3"><title>{html.escape(str(f))} '
                      f'{"starts" if kind == "invoke" else "ends"} at {t:g} s</title></line>')
    return ("<h3>Appends per second (blue sent, orange acknowledged; red dashes: a fault "
            f"starts, green: it ends) over {last} s</h3><svg width='{_W}' height='{_H}' "
            f"xmlns='http://www.w3.org/2000/svg'>{line(1, '#4a7ab5')}{line(2, '#e67e22')}"
            f"{''.join(faults)}</svg>")


def render_html(result: dict[str, Any]) -> str:
    from .audit import COUNTS, ERROR_COUNTS

    verdict = "valid" if result["valid"] else "INVALID"
    head = "".join(f"<th>{c}</th>" for c in COUNTS)

    def row(name: str, counts: dict[str, int]) -> str:
        cells = "".join(
            f"<td class='{'bad' if c in ERROR_COUNTS and counts[c] else ''}'>{counts[c]}</td>"
            for c in COUNTS)
        return f"<tr><th>{html.escape(name)}</th>{cells}</tr>"

    table = "".join(row(k, v) for k, v in result["queues"].items()) + row("total",
                                                                        result["totals"])
    lat_rows = "".join(
        f"<tr><th>{html.escape(name)}</th>"
        + "".join(f"<td>{v.get(p, '')}</td>" for p in ("count", "p50", "p90", "p99", "p99.9",
                                                        "max"))
        + "</tr>"
        for name, v in result["latency_ms"].items())
    hist = "".join(_bars(points, label=f"{name} (ms, power-of-two buckets)", log_x=True)
                   for name, points in result.get("histograms_ms", {}).items())
    inputs = html.escape(str(result.get("inputs")))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>raftmq audit</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}
.bad{{background:#f5b7b1}}h1 .v{{color:{'#27ae60' if result['valid'] else '#c0392b'}}}</style>
</head><body><h1>raftmq audit: <span class="v">{verdict}</span></h1>
<p>{inputs}; {result.get('seconds')} s on Spark</p>
<h2>Messages per queue</h2><table><tr><th>queue</th>{head}</tr>{table}</table>
<h2>Latency (ms)</h2><table><tr><th></th><th>count</th><th>p50</th><th>p90</th><th>p99</th>
<th>p99.9</th><th>max</th></tr>{lat_rows}</table>
<h2>Plots</h2>{hist}{_events(result)}
</body></html>
"""
