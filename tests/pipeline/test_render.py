"""The report as a person reads it (issue 18, item 4): the throughput chart's time axis
spans the data, however short the run, and the report says which window it covers."""

from __future__ import annotations

import datetime as dt
import json

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pytest

from conveyor.pipeline import render
from conveyor.pipeline.report import Report, SourceFigures

T0 = dt.datetime(2026, 11, 25, 17, 0, tzinfo=dt.UTC)


def _source(minutes: list[dt.datetime]) -> SourceFigures:
    return SourceFigures(kind="queue", name="jobs", messages=10 * len(minutes), latency_ms={"p50": 1.0},
                         retried=0, retries=0, retry_rate=0.0, dead_lettered=None, dead_letter_rate=None,
                         first_at=minutes[0], last_at=minutes[-1] + dt.timedelta(seconds=42),
                         throughput_per_minute=[{"minute": m, "count": 10} for m in minutes])


@pytest.mark.parametrize("minutes, widest", [
    ([T0], dt.timedelta(minutes=3)),  # one minute of data: a few minutes of axis, not years
    ([T0 + dt.timedelta(minutes=i) for i in range(30)], dt.timedelta(minutes=40)),
    ([T0 + dt.timedelta(hours=i) for i in range(48)], dt.timedelta(hours=60)),
])
def test_the_time_axis_spans_the_data(tmp_path, monkeypatch, minutes, widest):
    seen = {}
    original = plt.Figure.savefig

    def capture(fig, *args, **kwargs):
        low, high = fig.axes[0].get_xlim()
        seen["span"] = mdates.num2date(high) - mdates.num2date(low)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", capture)
    report = Report(generated_at=T0, tables=["lake/jobs"], sources=[_source(minutes)])
    render.throughput_chart(report, tmp_path / "t.png")
    data = minutes[-1] - minutes[0]
    assert data <= seen["span"] <= widest


def test_the_report_says_which_window_it_covers(tmp_path):
    report = Report(generated_at=T0, tables=["lake/jobs"], sources=[_source([T0, T0 + dt.timedelta(minutes=1)])])
    files = render.write(report, tmp_path)
    page = files["html"].read_text()
    assert "Covers 2026-11-25 17:00:00+00:00 to 2026-11-25 17:01:42+00:00 (1 min 42 s)." in page
    window = json.loads(files["json"].read_text())["window"]
    assert window["start"].startswith("2026-11-25T17:00:00") and window["end"].startswith("2026-11-25T17:01:42")
    empty = render.write(Report(generated_at=T0, tables=[], sources=[]), tmp_path / "empty")
    assert "hold no messages or events yet" in empty["html"].read_text()


def test_minutes_without_events_are_drawn_as_zeros():
    """A line through minutes with no events (issue 29, item 14) drops to zero at each
    gap's edges instead, one point per edge whatever the gap's length."""
    minute = dt.timedelta(minutes=1)
    points = [{"minute": T0, "count": 5}, {"minute": T0 + minute, "count": 7},
              {"minute": T0 + 3 * minute, "count": 2}, {"minute": T0 + 30 * 24 * 60 * minute, "count": 4}]
    assert render.with_zeros(points) == [
        (T0, 5), (T0 + minute, 7), (T0 + 2 * minute, 0), (T0 + 3 * minute, 2), (T0 + 4 * minute, 0),
        (T0 + (30 * 24 * 60 - 1) * minute, 0), (T0 + 30 * 24 * 60 * minute, 4)]
    assert render.with_zeros([]) == []
