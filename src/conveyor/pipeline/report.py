"""``conveyor pipeline report``: Spark SQL over the archived data.

Spark reads exactly the Parquet files of each Delta table's current version (the Delta
log lists them; no Delta jars needed), as two views: ``queue_archive`` (the archives of
queues) and ``stream_events`` (archived stream events). Per queue or stream it computes
throughput per minute, end-to-end latency percentiles (queues: sent to archived, i.e.
enqueue to acknowledgement; streams: appended to archived), retries and dead letters.

Dead letters: a queue's messages that failed are in its own archive with outcome
``failed`` (no dead-letter queue) or, once archived there, in its dead-letter queue's
archive with ``source_queue`` naming it. A stream's dead letters are per consumer and
stay in the database: with a DSN, they are read through the ``conveyor`` data source.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conveyor import errors
from conveyor.pipeline import lake

PERCENTILES = (0.5, 0.95, 0.99)

_QUEUE_SQL = """
WITH finished AS (
    SELECT queue AS source, sent_at, archived_at, receive_count,
           outcome = 'failed' AND source_queue IS NULL AS failed_here
      FROM queue_archive
), dead AS (
    SELECT source_queue AS source, count(*) AS n FROM queue_archive
     WHERE source_queue IS NOT NULL GROUP BY source_queue
)
SELECT f.source,
       count(*) AS messages,
       sum(CASE WHEN f.failed_here THEN 1 ELSE 0 END) + coalesce(max(d.n), 0) AS dead_lettered,
       coalesce(max(d.n), 0) AS via_dead_letter_queue,
       sum(CASE WHEN f.receive_count > 1 THEN 1 ELSE 0 END) AS retried,
       sum(greatest(f.receive_count - 1, 0)) AS retries,
       percentile((unix_micros(f.archived_at) - unix_micros(f.sent_at)) / 1000.0, array({pcts})) AS latency,
       min(f.archived_at) AS first_at, max(f.archived_at) AS last_at
  FROM finished f LEFT JOIN dead d ON d.source = f.source
 GROUP BY f.source ORDER BY f.source
"""

_STREAM_SQL = """
SELECT stream AS source, count(*) AS messages,
       sum(CASE WHEN retry_count > 0 THEN 1 ELSE 0 END) AS retried,
       sum(coalesce(retry_count, 0)) AS retries,
       percentile((unix_micros(archived_at) - unix_micros(created_at)) / 1000.0, array({pcts})) AS latency,
       min(created_at) AS first_at, max(created_at) AS last_at
  FROM stream_events GROUP BY stream ORDER BY stream
"""

_PER_MINUTE_SQL = """
SELECT 'queue' AS kind, queue AS source, date_trunc('minute', archived_at) AS minute, count(*) AS n
  FROM queue_archive GROUP BY 1, 2, 3
UNION ALL
SELECT 'stream', stream, date_trunc('minute', created_at), count(*) FROM stream_events GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
"""


@dataclass
class SourceFigures:
    kind: str  # queue | stream
    name: str
    messages: int
    latency_ms: dict[str, float]
    retried: int
    retries: int
    retry_rate: float
    dead_lettered: int | None
    dead_letter_rate: float | None
    first_at: dt.datetime | None
    last_at: dt.datetime | None
    throughput_per_minute: list[dict[str, Any]] = field(default_factory=list)
    peak_per_minute: int = 0
    mean_per_minute: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    generated_at: dt.datetime
    tables: list[str]
    sources: list[SourceFigures]

    @property
    def window(self) -> tuple[dt.datetime, dt.datetime] | None:
        """The time the figures cover: the first message or event to the last, over every
        source (None when there is none)."""
        firsts = [s.first_at for s in self.sources if s.first_at is not None]
        lasts = [s.last_at for s in self.sources if s.last_at is not None]
        return (min(firsts), max(lasts)) if firsts and lasts else None

    def to_json(self) -> dict[str, Any]:
        window = self.window
        return _plain({**asdict(self), "window": {"start": window[0], "end": window[1]} if window else None})


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    return value


def _kind(table: Path) -> str:
    names = set(lake.open_table(table).schema().to_arrow().names)  # type: ignore[union-attr]
    if "stream" in names:
        return "stream"
    if "queue" in names and "outcome" in names:
        return "queue"
    raise errors.InvalidInput(f"{table} is not a table written by conveyor pipeline archive")


def _views(spark: Any, tables: Sequence[Path]) -> dict[str, list[Path]]:
    """Registers queue_archive and stream_events over the tables' live files."""
    by_kind: dict[str, list[Path]] = {"queue": [], "stream": []}
    for table in tables:
        by_kind[_kind(table)].append(table)
    for kind, view, schema in (("queue", "queue_archive", _QUEUE_SCHEMA), ("stream", "stream_events", _STREAM_SCHEMA)):
        frames = [spark.read.option("basePath", str(t)).parquet(*lake.live_files(t))
                  for t in by_kind[kind] if lake.live_files(t)]
        frame = spark.createDataFrame([], schema)
        for f in frames:
            frame = frame.unionByName(f.select(*frame.columns))
        frame.createOrReplaceTempView(view)
    return by_kind


_QUEUE_SCHEMA = ("queue string, sent_at timestamp, archived_at timestamp, receive_count int, "
                 "source_queue string, outcome string")
_STREAM_SCHEMA = "stream string, created_at timestamp, archived_at timestamp, retry_count int"


def _latency(values: Sequence[float] | None) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{round(p * 100)}": round(float(v), 3) for p, v in zip(PERCENTILES, values, strict=False)}


def _rate(part: int | None, whole: int) -> float | None:
    return None if part is None else (round(part / whole, 6) if whole else 0.0)


def _stream_dead_letters(spark: Any, dsn: str, stream: str) -> int:
    frame = (spark.read.format("conveyor").option("dsn", dsn).option("stream", stream)
             .option("kind", "dead_letters").load())
    return int(frame.select("event_id").distinct().count())


def build(spark: Any, paths: Sequence[str | Path], dsn: str | None = None,
          progress: Callable[[str], None] = lambda _: None) -> Report:
    """The figures of every table under ``paths`` (tables, or directories of tables)."""
    tables = lake.tables(list(paths))
    if not tables:
        raise errors.InvalidInput(f"no Delta tables found in {', '.join(map(str, paths))}")
    progress(f"reading {len(tables)} table(s)")
    _views(spark, tables)
    pcts = ", ".join(str(p) for p in PERCENTILES)
    sources: list[SourceFigures] = []
    progress("computing queue figures")
    for r in spark.sql(_QUEUE_SQL.format(pcts=pcts)).collect():
        sources.append(SourceFigures(
            kind="queue", name=r.source, messages=r.messages, latency_ms=_latency(r.latency),
            retried=r.retried, retries=r.retries, retry_rate=_rate(r.retried, r.messages) or 0.0,
            dead_lettered=r.dead_lettered, dead_letter_rate=_rate(r.dead_lettered, r.messages + r.via_dead_letter_queue),
            first_at=r.first_at, last_at=r.last_at))
    progress("computing stream figures")
    for r in spark.sql(_STREAM_SQL.format(pcts=pcts)).collect():
        dead = _stream_dead_letters(spark, dsn, r.source) if dsn else None
        figures = SourceFigures(
            kind="stream", name=r.source, messages=r.messages, latency_ms=_latency(r.latency),
            retried=r.retried, retries=r.retries, retry_rate=_rate(r.retried, r.messages) or 0.0,
            dead_lettered=dead, dead_letter_rate=_rate(dead, r.messages), first_at=r.first_at, last_at=r.last_at)
        if dsn is None:
            figures.notes.append("dead letters not counted: they are in the database (give a database URL)")
        sources.append(figures)
    progress("computing throughput per minute")
    per_minute: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in spark.sql(_PER_MINUTE_SQL).collect():
        per_minute.setdefault((r.kind, r.source), []).append({"minute": r.minute, "count": r.n})
    for s in sources:
        s.throughput_per_minute = per_minute.get((s.kind, s.name), [])
        counts = [m["count"] for m in s.throughput_per_minute]
        s.peak_per_minute = max(counts, default=0)
        s.mean_per_minute = round(sum(counts) / len(counts), 3) if counts else 0.0
    return Report(generated_at=dt.datetime.now(dt.UTC), tables=[str(t) for t in tables], sources=sources)
