"""``conveyor pipeline archive``: a stream (read as its own consumer) or a queue's archive
into a Delta table partitioned by date, incrementally and exactly once across runs and
crashes.

A Structured Streaming query reads the ``conveyor`` source (offsets: tick ids, or archive
marks) and hands each micro-batch to ``_sink`` on the driver, which commits it to the
Delta table with the micro-batch id as the table's application-transaction version for
this run (lake.commit). Spark's checkpoint (default: ``<table>/_checkpoint``, beside the
data, so the two travel together) records which offsets each micro-batch covers, and
replays the last one after a crash with the same offsets, hence the same rows; if that
micro-batch had reached the table before the crash, the table already holds its id and
the replay is skipped. Every reader of the table therefore sees each event once.

``once`` runs Trigger.AvailableNow (everything there is now, in micro-batches of at most
``max_events``, then stop); otherwise a micro-batch every ``interval`` seconds until
``stop`` is set.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from conveyor import errors
from conveyor.db import sync
from conveyor.pipeline import lake

RUN_FILE = "conveyor-archive.json"
# Fault injection for the crash tests: "kill-after-commit:<batch id>" SIGKILLs this
# process right after that micro-batch's Delta commit, before Spark records it.
FAULT_ENV = "CONVEYOR_PIPELINE_FAULT"


@dataclass(frozen=True)
class ArchiveJob:
    dsn: str
    path: Path
    stream: str | None = None
    queue: str | None = None
    consumer: str = "conveyor-archive"
    checkpoint: Path | None = None
    once: bool = True
    interval: float = 10.0
    starting_position: str | None = None
    max_events: int | None = 100_000
    partitions: int = 4

    def __post_init__(self) -> None:
        if (self.stream is None) == (self.queue is None):
            raise errors.InvalidInput("archive either a stream or a queue")
        if self.interval <= 0:
            raise errors.InvalidInput("the interval must be positive")

    @property
    def source(self) -> str:
        return f"stream:{self.stream}" if self.stream is not None else f"queue:{self.queue}"

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint or self.path / "_checkpoint"


@dataclass
class ArchiveResult:
    batches: int = 0
    rows: int = 0
    skipped: int = 0
    seconds: float = 0.0
    table_version: int | None = None
    end_offset: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def run_id(job: ArchiveJob) -> str:
    """This checkpoint's run id (made on first use): the Delta application id, so that a
    new checkpoint over an old table starts its own sequence of micro-batch ids."""
    folder = job.checkpoint_dir
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / RUN_FILE
    if marker.exists():
        saved = json.loads(marker.read_text())
        if saved.get("source") != job.source:
            raise errors.InvalidInput(
                f"checkpoint {folder} archives {saved.get('source')}, not {job.source}: give each source a "
                "table (and checkpoint) of its own")
        return str(saved["run_id"])
    rid = f"conveyor-archive-{uuid.uuid4()}"
    marker.write_text(json.dumps({"run_id": rid, "source": job.source,
                                  "created_at": dt.datetime.now(dt.UTC).isoformat()}))
    return rid


def _reader(spark: Any, job: ArchiveJob) -> Any:
    reader = (spark.readStream.format("conveyor").option("dsn", job.dsn)
              .option("numPartitions", str(job.partitions)))
    if job.max_events:
        reader = reader.option("maxEventsPerTrigger", str(job.max_events))
    # an archive starts from the oldest event still kept unless told otherwise (a new
    # consumer of the stream would otherwise start at the latest tick and archive nothing
    # of what is already there)
    reader = reader.option("startingPosition", job.starting_position or "earliest")
    if job.stream is not None:
        return reader.option("stream", job.stream).option("consumer", job.consumer).option("tick", "true").load()
    return reader.option("queue", job.queue).option("kind", "archive").load()


def _prepare(data: pa.Table, job: ArchiveJob, now: dt.datetime) -> pa.Table:
    if job.stream is not None:
        stamp = pa.array([now] * data.num_rows, pa.timestamp("us", tz="UTC"))
        return lake.with_date(data.append_column("archived_at", stamp), "created_at")
    return lake.with_date(data, "archived_at")


def _fault(batch_id: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec == f"kill-after-commit:{batch_id}":
        os.kill(os.getpid(), signal.SIGKILL)


def _sink(job: ArchiveJob, rid: str, result: ArchiveResult, progress: Callable[[str], None]) -> Callable[[Any, int], None]:
    def write(frame: Any, batch_id: int) -> None:
        started = time.monotonic()
        done = lake.committed(job.path, rid)
        if done is not None and done >= batch_id:
            result.skipped += 1
            progress(f"batch {batch_id}: already in the table (replayed after a restart), skipped")
            return
        data = frame.toArrow()
        if data.num_rows == 0:
            return
        metadata = {"conveyor.source": job.source}
        if lake.commit(job.path, _prepare(data, job, dt.datetime.now(dt.UTC)), rid, batch_id, metadata):
            _fault(batch_id)
            result.batches += 1
            result.rows += data.num_rows
            took = time.monotonic() - started
            progress(f"batch {batch_id}: {data.num_rows:,} rows in {took:.1f}s "
                     f"({data.num_rows / max(took, 1e-6):,.0f} rows/s); {result.rows:,} rows this run")

    return write


def run(spark: Any, job: ArchiveJob, progress: Callable[[str], None] = lambda _: None,
        stop: threading.Event | None = None) -> ArchiveResult:
    """Run the archive query until it has archived everything (``once``) or ``stop`` is set."""
    rid = run_id(job)
    result = ArchiveResult()
    started = time.monotonic()
    writer = (_reader(spark, job).writeStream.queryName(f"conveyor_archive_{uuid.uuid4().hex[:8]}")
              .option("checkpointLocation", str(job.checkpoint_dir))
              .foreachBatch(_sink(job, rid, result, progress)))
    writer = writer.trigger(availableNow=True) if job.once else writer.trigger(processingTime=f"{job.interval} seconds")
    progress(f"archiving {job.source} into {job.path} ({'everything available now' if job.once else 'continuously'})")
    query = writer.start()
    try:
        while not query.awaitTermination(1.0):
            if stop is not None and stop.is_set():
                query.stop()
                break
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise errors.InternalError(f"the archive query failed: {query.exception()}")
    result.end_offset = _end_offset(query)
    if job.stream is not None and result.end_offset:
        _advance(job, result.end_offset)
    table = lake.open_table(job.path)
    result.table_version = table.version() if table is not None else None
    result.seconds = time.monotonic() - started
    return result


def _end_offset(query: Any) -> dict[str, Any] | None:
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return None
    end = progress["sources"][0].get("endOffset")
    return json.loads(end) if isinstance(end, str) else end


def _advance(job: ArchiveJob, end: dict[str, Any]) -> None:
    """Spark commits a source's offsets one micro-batch late and never at stop: move the
    consumer to what the table now holds, so its lag reads true."""
    if end.get("stream") == job.stream and isinstance(end.get("tick"), int):
        with sync.connect(job.dsn) as conn:
            sync.fetch_value(conn, "pipeline_stream_advance",
                             {"stream": job.stream, "consumer": job.consumer, "tick": end["tick"]})
