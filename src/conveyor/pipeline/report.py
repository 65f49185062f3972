"""``conveyor pipeline report``: Spark SQL over the archived data.

Spark reads exactly the Parquet files of each Delta table's current version (the Delta
log lists them; no Delta jars needed), as two views: ``queue_archive`` (the archives of
queues) and ``stream_events`` (archived stream events). Per queue or stream it computes
throughput per minute (minutes without any count as zero), latency percentiles,
retries and dead letters.

Latency: a queue's messages are archived when their consumer deletes (acknowledges) them,
so ``latency_ms`` is enqueue to acknowledgement, and ``first_delivery_ms`` enqueue to
first delivery (the wait in the queue). A stream's events are archived by the archive
job, so its ``latency_ms`` (append to archive) mostly measures when the job ran: it is
not a delivery latency, and the report says so (``latency_measures``).

Dead letters: a queue's messages that failed are in its own archive with outcome
``failed`` (no dead-letter queue) or, once archived there, in its dead-letter queue's
archive with ``source_queue`` naming it. A stream's dead letters are per consumer and
stay in the database: they are counted there (distinct events) when a DSN is given.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conveyor import errors
from conveyor.db import sync
from conveyor.pipeline import lake

PERCENTILES = (0.5, 0.95, 0.99)
SMALL_LAKE_BYTES = 64 * 2**20  # a lake this small is a job of seconds: session.Lazy's ``short``

_QUEUE_SQL = """
WITH finished AS (
    SELECT queue AS source, sent_at, archived_at, first_received_at, receive_count,
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
       percentile((unix_micros(f.first_received_at) - unix_micros(f.sent_at)) / 1000.0, array({pcts}))
           AS first_delivery,
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

_PER_MINUTE_SQL = {  # a SELECT per kind, UNION ALL of those with tables
    "queue": "SELECT 'queue' AS kind, queue AS source, date_trunc('minute', archived_at) AS minute, count(*) AS n "
             "FROM queue_archive GROUP BY 1, 2, 3",
    "stream": "SELECT 'stream' AS kind, stream AS source, date_trunc('minute', created_at) AS minute, count(*) AS n "
              "FROM stream_events GROUP BY 1, 2, 3",
}


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
    latency_measures: str = ""
    first_delivery_ms: dict[str, float] = field(default_factory=dict)
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
    """Registers queue_archive and stream_events over the tables' live files. Spark is
    given the columns' types (no job to infer them from the files' footers)."""
    by_kind: dict[str, list[Path]] = {"queue": [], "stream": []}
    for table in tables:
        by_kind[_kind(table)].append(table)
    for kind, view, schema in (("queue", "queue_archive", _QUEUE_SCHEMA), ("stream", "stream_events", _STREAM_SCHEMA)):
        frame = None
        for table in by_kind[kind]:
            files = lake.live_files(table)
            if files:
                read = spark.read.schema(schema).option("basePath", str(table)).parquet(*files)
                read = read.select(*(f.split()[0] for f in schema.split(", ")))
                frame = read if frame is None else frame.unionByName(read)
        if frame is None:  # no rows of this kind: its figures are skipped, not computed over nothing
            by_kind[kind] = []
        else:
            frame.createOrReplaceTempView(view)
    return by_kind


_QUEUE_SCHEMA = ("queue string, sent_at timestamp, archived_at timestamp, first_received_at timestamp, "
                 "receive_count int, source_queue string, outcome string")
_STREAM_SCHEMA = "stream string, created_at timestamp, archived_at timestamp, retry_count int"


def _latency(values: Sequence[float] | None) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{round(p * 100)}": round(float(v), 3) for p, v in zip(PERCENTILES, values, strict=False)}


def _rate(part: int | None, whole: int) -> float | None:
    return None if part is None else (round(part / whole, 6) if whole else 0.0)


def _stream_dead_letters(dsn: str, stream: str) -> int | None:
    """The stream's events dead-lettered by any consumer (None: the stream is gone)."""
    with sync.connect(dsn) as conn:
        count = sync.fetch_value(conn, "pipeline_stream_dead_letter_events", {"stream": stream})
    return None if count is None else int(count)


def _minutes(points: list[dict[str, Any]]) -> int:
    """The minutes from the first with a count to the last, both included."""
    return int((points[-1]["minute"] - points[0]["minute"]).total_seconds() // 60) + 1 if points else 0


QUEUE_LATENCY = "enqueue to acknowledgement (archived when its consumer deleted it)"
STREAM_LATENCY = ("append to archive: when the archive job ran, not a delivery latency (run `pipeline archive` "
                  "continuously for it to come close)")


def small(paths: Sequence[str | Path]) -> bool:
    """Whether the tables under ``paths`` hold at most SMALL_LAKE_BYTES of data files."""
    return sum(lake.size(t) for t in lake.tables(list(paths))) <= SMALL_LAKE_BYTES


def build(spark: Any, paths: Sequence[str | Path], dsn: str | None = None,
          progress: Callable[[str], None] = lambda _: None) -> Report:
    """The figures of every table under ``paths`` (tables, or directories of tables)."""
    tables = lake.tables(list(paths))
    if not tables:
        raise errors.InvalidInput(f"no Delta tables found in {', '.join(map(str, paths))}")
    progress(f"reading {len(tables)} table(s)")
    kinds = _views(spark, tables)
    pcts = ", ".join(str(p) for p in PERCENTILES)
    sources: list[SourceFigures] = []
    if kinds["queue"]:
        progress("computing queue figures")
    for r in spark.sql(_QUEUE_SQL.format(pcts=pcts)).collect() if kinds["queue"] else []:
        sources.append(SourceFigures(
            kind="queue", name=r.source, messages=r.messages, latency_ms=_latency(r.latency),
            retried=r.retried, retries=r.retries, retry_rate=_rate(r.retried, r.messages) or 0.0,
            dead_lettered=r.dead_lettered, dead_letter_rate=_rate(r.dead_lettered, r.messages + r.via_dead_letter_queue),
            first_at=r.first_at, last_at=r.last_at, latency_measures=QUEUE_LATENCY,
            first_delivery_ms=_latency(r.first_delivery)))
    if kinds["stream"]:
        progress("computing stream figures")
    for r in spark.sql(_STREAM_SQL.format(pcts=pcts)).collect() if kinds["stream"] else []:
        dead = _stream_dead_letters(dsn, r.source) if dsn else None
        figures = SourceFigures(
            kind="stream", name=r.source, messages=r.messages, latency_ms=_latency(r.latency),
            retried=r.retried, retries=r.retries, retry_rate=_rate(r.retried, r.messages) or 0.0,
            dead_lettered=dead, dead_letter_rate=_rate(dead, r.messages), first_at=r.first_at, last_at=r.last_at,
            latency_measures=STREAM_LATENCY)
        if dsn is None:
            figures.notes.append("dead letters not counted: run with --dead-letters to count them in the database")
        elif dead is None:
            figures.notes.append("dead letters not counted: the stream no longer exists in the database")
        sources.append(figures)
    progress("computing throughput per minute")
    per_minute: dict[tuple[str, str], list[dict[str, Any]]] = {}
    selects = [_PER_MINUTE_SQL[kind] for kind in ("queue", "stream") if kinds[kind]]
    for r in spark.sql(" UNION ALL ".join(selects) + " ORDER BY 1, 2, 3").collect() if selects else []:
        per_minute.setdefault((r.kind, r.source), []).append({"minute": r.minute, "count": r.n})
    for s in sources:
        s.throughput_per_minute = per_minute.get((s.kind, s.name), [])
        counts = [m["count"] for m in s.throughput_per_minute]
        s.peak_per_minute = max(counts, default=0)
        span = _minutes(s.throughput_per_minute)  # the minutes without any count too
        s.mean_per_minute = round(sum(counts) / span, 3) if span else 0.0
    return Report(generated_at=dt.datetime.now(dt.UTC), tables=[str(t) for t in tables], sources=sources)
