"""Counts, durations and rates written for people: ``4 rows``, ``13.2 s``, ``0.3 rows/s``,
``2 min 21 s`` (what the pipeline's commands print; the JSON keeps plain numbers)."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 row``, ``1,234 rows``; ``plural`` where adding an s will not do."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def duration(seconds: float) -> str:
    """``85 ms``, ``13.2 s``, ``2 min 21 s``, ``3 h 05 min``, ``2 d 4 h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def rate(n: int, seconds: float, noun: str = "rows") -> str:
    """``12,345 rows/s``, ``3.4 rows/s``, ``0.08 rows/s``: never a rate that rounds to 0
    when something was done."""
    per = n / seconds if seconds > 0 else 0.0
    if per >= 100 or per == 0:
        return f"{per:,.0f} {noun}/s"
    return f"{per:.{1 if per >= 1 else 2}f} {noun}/s"


def milliseconds(ms: float) -> str:
    """A latency: ``12 ms``, ``1.4 s``, ``2 min 20 s`` (``140768.078`` ms is the last)."""
    if ms < 1000:
        return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
    return duration(ms / 1000)
