"""Writing a report: ``report.json`` (the figures), ``throughput.png`` and ``latency.png``
(matplotlib, Agg backend: no display needed), and ``report.html``, self-contained (the
charts are embedded as data URIs, so the one file can be mailed or archived)."""

from __future__ import annotations

import base64
import datetime as dt
import html
import itertools
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt

from conveyor.pipeline.report import Report, SourceFigures


def _label(s: SourceFigures) -> str:
    return f"{s.kind} {s.name}"


def with_zeros(points: list[dict[str, Any]]) -> list[tuple[dt.datetime, int]]:
    """The per-minute counts with a zero in the minute after and the minute before each
    run of minutes without events, so the line drops to zero there instead of joining the
    counts on either side (one point per gap edge: a month-long gap costs two points)."""
    minute = dt.timedelta(minutes=1)
    out: list[tuple[dt.datetime, int]] = []
    for before, after in itertools.zip_longest(points, points[1:]):
        out.append((before["minute"], before["count"]))
        if after is not None and after["minute"] - before["minute"] > minute:
            out.append((before["minute"] + minute, 0))
            if after["minute"] - before["minute"] > 2 * minute:
                out.append((after["minute"] - minute, 0))
    return out


def throughput_chart(report: Report, target: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    for s in report.sources:
        points = with_zeros(s.throughput_per_minute)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=_label(s))
    ax.set_title("Throughput per minute")
    ax.set_ylabel("messages / events per minute")
    if any(s.throughput_per_minute for s in report.sources):
        ax.legend(loc="upper left", fontsize="small")
    minutes = [p["minute"] for s in report.sources for p in s.throughput_per_minute]
    if minutes:  # the axis spans the data (a lone minute would otherwise get years around it)
        start, end = min(minutes), max(minutes)
        pad = max((end - start) / 20, dt.timedelta(minutes=1))
        ax.set_xlim(start - pad, end + pad)
        locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(target, format="png")
    plt.close(fig)
    return target


def latency_chart(report: Report, target: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    keys = ("p50", "p95", "p99")
    width = 0.8 / len(keys)
    names = [_label(s) for s in report.sources]
    for i, key in enumerate(keys):
        ax.bar([x + i * width for x in range(len(names))],
               [s.latency_ms.get(key, 0.0) for s in report.sources], width=width, label=key)
    ax.set_xticks([x + width for x in range(len(names))], names, rotation=15, ha="right")
    ax.set_title("Latency: queues enqueue to acknowledgement; streams append to archive (when the job ran)")
    ax.set_ylabel("milliseconds")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(target, format="png")
    plt.close(fig)
    return target


def _covers(report: Report) -> str:
    window = report.window
    if window is None:
        return "The tables hold no messages or events yet."
    start, end = window
    span = end - start
    length = (f"{span.days} d {span.seconds // 3600} h" if span.days else
              f"{span.seconds // 3600} h {span.seconds % 3600 // 60} min" if span.seconds >= 3600 else
              f"{span.seconds // 60} min {span.seconds % 60} s")
    return (f"Covers {start.isoformat(sep=' ', timespec='seconds')} to {end.isoformat(sep=' ', timespec='seconds')} "
            f"({length}).")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _row(s: SourceFigures) -> str:
    cells = [s.kind, s.name, f"{s.messages:,}", f"{s.mean_per_minute:,.1f}", f"{s.peak_per_minute:,}",
             *(f"{s.latency_ms[k]:,.1f}" if k in s.latency_ms else "-" for k in ("p50", "p95", "p99")),
             *(f"{s.first_delivery_ms[k]:,.1f}" if k in s.first_delivery_ms else "-" for k in ("p50", "p99")),
             f"{s.retried:,} ({_percent(s.retry_rate)})",
             "-" if s.dead_lettered is None else f"{s.dead_lettered:,} ({_percent(s.dead_letter_rate)})"]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write(report: Report, out: Path) -> dict[str, Path]:
    """Writes the report's files into ``out``; returns them by name."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": out / "report.json", "throughput": out / "throughput.png",
             "latency": out / "latency.png", "html": out / "report.html"}
    files["json"].write_text(json.dumps(report.to_json(), indent=2) + "\n")
    throughput_chart(report, files["throughput"])
    latency_chart(report, files["latency"])
    notes = [f"<li>{html.escape(_label(s))}: {html.escape(n)}</li>" for s in report.sources for n in s.notes]
    headers = ["kind", "name", "total", "mean/min", "peak/min", "latency p50 ms", "p95 ms", "p99 ms",
               "first delivery p50 ms", "p99 ms", "retried", "dead-lettered"]
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Conveyor pipeline report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
th {{ background: #f3f3f3; }} td:nth-child(-n+2) {{ text-align: left; }}
img {{ display: block; margin: 1em 0; max-width: 100%; }}
</style></head><body>
<h1>Conveyor pipeline report</h1>
<p>Generated {html.escape(report.generated_at.isoformat(timespec="seconds"))} from {len(report.tables)} table(s):
{html.escape(", ".join(report.tables))}.</p>
<p>{html.escape(_covers(report))}</p>
<table><thead><tr>{"".join(f"<th>{h}</th>" for h in headers)}</tr></thead>
<tbody>{"".join(_row(s) for s in report.sources)}</tbody></table>
{"<ul>" + "".join(notes) + "</ul>" if notes else ""}
<h2>Throughput</h2>{_image(files["throughput"], "throughput per minute")}
<h2>Latency</h2>{_image(files["latency"], "latency percentiles")}
<p>Latency: for a queue, from send to acknowledgement (a message is archived when its consumer deletes
it); first delivery: from send to the first receive, the wait in the queue. For a stream, from append
to archive: the archive job writes the archived time, so this measures when the job ran, not how fast
consumers were (run <code>conveyor pipeline archive</code> continuously and it comes close to the
job's interval). Mean per minute counts the minutes without events as zero, as the chart does.
Retried: messages received more than once (queues), events delivered again (streams).
The same figures are in report.json.</p>
</body></html>
"""
    files["html"].write_text(page)
    return files
