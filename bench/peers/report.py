"""One report for a run: our row, every peer's row, our ratio to each; as JSON and as a table.

Ratios are ours ÷ theirs for both throughput (above 1: we acknowledge more per second) and
p99 latency (below 1: our tail is shorter). A ratio is only given between two rows that
both measured something; skipped and failed peers get none.

We have up to two rows, both `bench.produce` under the same window: `ours`, one
`send_async` call per message like every peer's client, and `ours_batch`, `send_batch`
calls of a few messages each (RocketMQ's batch send). Each peer row gets a ratio to each
(`ours_ratio`, `ours_batch_ratio`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from bench.peers.common import LoadSpec

__all__ = ["build_report", "ours_label", "ours_row", "ratio", "render", "render_notes",
           "render_table"]

OURS_DURABILITY = "acks once the message's batch is fsynced on a majority of its group"


def ours_label(batch: int | None = None) -> str:
    """How our row is named: the producer call it measured."""
    return "raftmq (send_async)" if batch is None else f"raftmq (send_batch {batch})"


def ours_row(produce: dict[str, Any]) -> dict[str, Any]:
    """Our `bench.produce` result in the shape of a peer row (the raw result kept inside).

    Its latencies are the in-flight ones (a message's place in the window to its ack):
    each peer's worker times one request to its answer, and our call-to-ack time would
    add the wait for room in the window (about a second round trip at one in flight)."""
    lat = produce.get("in_flight_latency_ms") or produce.get("latency_ms", {})
    fsync = produce.get("fsync", "always")
    durability, detail = ("fsync, majority", OURS_DURABILITY) if fsync == "always" else (
        "NO fsync", "fsync=interval: acks once a majority has the batch in its page cache")
    acked = produce.get("acknowledged", 0)
    layout = ", ".join(f"{k}={produce[k]}" for k in ("groups", "queues", "batch_max_messages",
                                                     "linger_ms") if k in produce)
    batched = produce.get("api") == "batch"
    how = (f"--api batch: send_batch calls of {produce.get('batch_messages')} messages to one "
           f"queue each, {produce.get('concurrent_batches')} in flight" if batched else
           "send_async, one message per call")
    return {
        "peer": "ours",
        "system": ours_label(produce.get("batch_messages") if batched else None),
        "api": "batch" if batched else "single",
        "nodes": produce.get("nodes", 3),
        "version": "",
        "status": "ok" if acked and not produce.get("errors") else "error",
        "messages": produce.get("messages"),
        "size_bytes": produce.get("size_bytes"),
        "in_flight": produce.get("in_flight"),
        "acknowledged": acked,
        "errors": produce.get("errors", 0),
        "first_error": produce.get("first_error"),
        "seconds": produce.get("seconds"),
        "msgs_per_s": produce.get("msgs_per_s", 0.0),
        "mb_per_s": produce.get("mb_per_s", 0.0),
        "p50_ms": lat.get("p50"),
        "p99_ms": lat.get("p99"),
        "p999_ms": lat.get("p999"),
        "durability": durability,
        "durability_detail": detail,
        "notes": f"bench.produce with the same messages, size, in-flight; {how}; {layout}",
        "produce": produce,
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours ÷ theirs, rounded; None when either side has no figure."""
    if not ours or not theirs:
        return None
    return round(ours / theirs, 2)


def _ratios(ours: dict[str, Any] | None, row: dict[str, Any]) -> dict[str, float | None] | None:
    """Our row's ratios to a peer row; None unless both measured something."""
    if ours is None or ours.get("status") != "ok" or row.get("status") != "ok":
        return None
    return {"msgs_per_s": ratio(ours.get("msgs_per_s"), row.get("msgs_per_s")),
            "p99_ms": ratio(ours.get("p99_ms"), row.get("p99_ms"))}


def build_report(spec: LoadSpec, ours: dict[str, Any] | None, peers: list[dict[str, Any]],
                 machine: dict[str, Any] | None = None,
                 ours_batch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON object of a run; each peer row gains `ours_ratio` (our `send_async`
    row ÷ the peer's) and `ours_batch_ratio` (our `send_batch` row ÷ the peer's)."""
    rows = []
    for row in peers:
        row = dict(row)
        row["ours_ratio"] = _ratios(ours, row)
        row["ours_batch_ratio"] = _ratios(ours_batch, row)
        rows.append(row)
    return {
        "benchmark": "peers",
        "messages": spec.messages,
        "size_bytes": spec.size,
        "in_flight": spec.in_flight,
        "machine": machine or {},
        "ours": ours,
        "ours_batch": ours_batch,
        "peers": rows,
    }


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _label(row: dict[str, Any]) -> Text:
    name = Text(row.get("system", row.get("peer", "?")), style="bold" if row.get("peer") ==
                "ours" else "")
    if row.get("version"):
        name.append(f" {row['version']}", style="dim")
    return name


def render_table(report: dict[str, Any]) -> Table:
    """The figures: one row per system, ours first; durability as a short label."""
    title = (f"produce, side by side: {report['messages']:,} msgs × {report['size_bytes']} B, "
             f"{report['in_flight']:,} in flight, 3 nodes each on loopback")
    t = Table(title=title)
    t.add_column("system", no_wrap=True)  # the label says what was measured: keep it whole
    t.add_column("durability", no_wrap=True)
    ratio_keys = [k for k, present in (("ours_ratio", report.get("ours")),
                                       ("ours_batch_ratio", report.get("ours_batch")))
                  if present]
    cols = ["msgs/s", "MB/s", "p50 ms", "p99 ms", "p99.9 ms"]
    for key in ratio_keys:
        cols += [f"{RATIO_NAMES[key]}/peer msgs/s", f"{RATIO_NAMES[key]}/peer p99"]
    for col in cols:
        t.add_column(col, justify="right")
    for row in _rows(report):
        status = row.get("status")
        is_ours = row.get("peer") == "ours"
        if status == "ok":
            durability = row.get("durability", "")
            ratios = []
            for key in ratio_keys:
                r = row.get(key) or {}
                ratios += ["" if is_ours else _times(r.get("msgs_per_s")),
                           "" if is_ours else _times(r.get("p99_ms"))]
            t.add_row(_label(row), Text(durability, style="yellow" if "NO" in durability else ""),
                      _num(row.get("msgs_per_s"), ",.0f"), _num(row.get("mb_per_s"), ".2f"),
                      _num(row.get("p50_ms"), ".1f"), _num(row.get("p99_ms"), ".1f"),
                      _num(row.get("p999_ms"), ".1f"), *ratios)
        else:
            t.add_row(_label(row), row.get("durability", ""),
                      Text(str(status), style="yellow" if status == "skipped" else "red"),
                      *[""] * (len(cols) - 1))
    return t


def render_notes(report: dict[str, Any]) -> list[Text]:
    """What the table's cells cannot hold: durability in words, notes, errors, installs."""
    lines = []
    for row in _rows(report):
        line = _label(row)
        line.append(": ")
        status = row.get("status")
        if status == "skipped":
            line.append(f"skipped ({row.get('reason')}); install: {row.get('install')}",
                        style="yellow")
            if "apt-get" in str(row.get("install")):
                line.append(" (`make bench-peers-deps` installs every peer's server)",
                            style="dim")
        elif status != "ok":
            error = str(row.get("error") or row.get("first_error") or "failed")
            line.append("\n".join(error.splitlines()[:6]), style="red")
        else:
            parts = [row.get("durability_detail", ""), row.get("notes", "")]
            if row.get("errors"):
                parts.append(f"{row['errors']} errors, first: {row.get('first_error')}")
            line.append("; ".join(p for p in parts if p))
        lines.append(line)
    machine = report.get("machine") or {}
    footer = Text("ours/peer: msgs/s above 1 = we acknowledge more per second; p99 below 1 "
                  "= our tail is shorter.", style="dim")
    if report.get("ours_batch"):
        footer.append(" ours/peer is our send_async row, batch/peer our send_batch row; every "
                      "peer's client sends one message per call, as our send_async row does.")
    if machine:
        footer.append(f" Machine: {machine.get('cpus')} CPUs, 1-min load average "
                      f"{machine.get('loadavg_1m')} at the start.")
    lines.append(footer)
    return lines


def render(report: dict[str, Any]) -> Group:
    """Table and notes, ready for `Console.print`."""
    return Group(render_table(report), *render_notes(report))


#: the table's name for our row behind each ratio
RATIO_NAMES = {"ours_ratio": "ours", "ours_batch_ratio": "batch"}


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    ours = [report[k] for k in ("ours", "ours_batch") if report.get(k)]
    return ours + list(report["peers"])
