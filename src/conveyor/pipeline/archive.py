"""``conveyor pipeline archive``: a stream (read as its own consumer) or a queue's archive
into a Delta table partitioned by date, incrementally and exactly once across runs and
crashes.

A Structured Streaming query reads the ``conveyor`` source (offsets: tick ids, or archive
marks) and hands each micro-batch to ``_sink`` (foreachBatch, on the driver). The rows
never come to the driver: each Spark task writes its own Parquet files into the table's
directory (``DataFrame.mapInArrow`` running pipeline.datafiles.Task) and returns only a
description of each file; the driver collects those of the successful task attempts and
commits exactly these files as one Delta commit, with the micro-batch id as the table's
application-transaction version for this run (lake.commit_files). Spark's checkpoint
(default: ``<table>/_checkpoint``, beside the data, so the two travel together) records
which offsets each micro-batch covers, and replays the last one after a crash with the
same offsets, hence the same rows; if that micro-batch had reached the table before the
crash, the table already holds its id and the replay is skipped. Every reader of the
table therefore sees each event once.

Files that no commit lists (a failed, killed or speculative task attempt's, or those of
a micro-batch whose driver died before its commit) are invisible to every Delta reader.
Their names carry the run and the micro-batch id, and they are deleted once that
micro-batch is in the table: right after its commit, or when its replay is skipped.
Files of a run whose checkpoint was thrown away before it replayed, or finished after the
sweep by an attempt Spark had given up on, are only removed by
``DeltaTable.vacuum(full=True)`` (delta-rs), which deletes unlisted files past a
retention period.

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

from conveyor import errors
from conveyor.db import sync
from conveyor.pipeline import datafiles, lake

RUN_FILE = "conveyor-archive.json"
# Fault injection for the crash tests, comma-separated: "kill-after-commit:<batch id>"
# SIGKILLs this process right after that micro-batch's Delta commit, before Spark records
# it (and before its stray files are swept); "kill-task:<batch id>" SIGKILLs the Python
# worker of each task's first attempt of that micro-batch once its files are written
# (Spark retries the task if its master allows task failures, e.g. local[2,3]).
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
    files: int = 0
    swept: int = 0  # files of failed task attempts deleted
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


def _faults(batch_id: int) -> set[str]:
    """The faults injected into micro-batch ``batch_id`` (``FAULT_ENV``, comma-separated)."""
    suffix = f":{batch_id}"
    return {f.removesuffix(suffix) for f in os.environ.get(FAULT_ENV, "").split(",") if f.endswith(suffix)}


def _write_files(frame: Any, job: ArchiveJob, rid: str, batch_id: int, kill: bool) -> list[datafiles.File]:
    """Every task writes its rows into the table's directory; the driver collects only
    the files' descriptions, those of the successful attempts (Spark keeps one result per
    task). A stream's events get ``archived_at`` (when this micro-batch ran) and their
    date from ``created_at``; a queue's archive rows have both already."""
    stream = job.stream is not None
    task = datafiles.Task(root=str(job.path.resolve()), name_prefix=datafiles.prefix(rid, batch_id),
                          date_column="created_at" if stream else "archived_at",
                          archived_at=dt.datetime.now(dt.UTC) if stream else None, kill_first_attempt=kill)
    return datafiles.from_rows(frame.mapInArrow(task, datafiles.DESCRIPTION).collect())


def _sweep(job: ArchiveJob, rid: str, batch_id: int, files: list[datafiles.File] | None = None) -> int:
    """Deletes the files of micro-batch ``batch_id`` that its commit does not list: those
    of failed task attempts. ``files``: the ones just committed (their date directories
    are where the failed attempts of the same rows wrote); None: the batch was committed
    before (a replay), so every date directory is looked at, against the table's files."""
    name = datafiles.prefix(rid, batch_id)
    if files is not None:
        return len(datafiles.sweep(job.path, name, {f.path for f in files}, {f.date for f in files}))
    table = lake.open_table(job.path)
    return len(datafiles.sweep(job.path, name, lake.files(table) if table is not None else set()))


def _sink(job: ArchiveJob, rid: str, result: ArchiveResult, progress: Callable[[str], None],
          failures: list[errors.ConveyorError]) -> Callable[[Any, int], None]:
    def skip(batch_id: int) -> None:
        result.skipped += 1
        result.swept += _sweep(job, rid, batch_id)
        progress(f"batch {batch_id}: already in the table (replayed after a restart), skipped")

    def write(frame: Any, batch_id: int) -> None:
        try:
            archive(frame, batch_id)
        except errors.ConveyorError as exc:  # Spark wraps it; run() raises it as it is
            failures.append(exc)
            raise

    def archive(frame: Any, batch_id: int) -> None:
        started = time.monotonic()
        done = lake.committed(job.path, rid)
        if done is not None and done >= batch_id:
            skip(batch_id)
            return
        faults = _faults(batch_id)
        files = _write_files(frame, job, rid, batch_id, kill="kill-task" in faults)
        if not files:
            return
        if not lake.commit_files(job.path, files, rid, batch_id, {"conveyor.source": job.source}):
            skip(batch_id)  # committed meanwhile: what was just written goes
            return
        if "kill-after-commit" in faults:
            os.kill(os.getpid(), signal.SIGKILL)
        result.swept += _sweep(job, rid, batch_id, files)
        rows = sum(f.rows for f in files)
        result.batches += 1
        result.rows += rows
        result.files += len(files)
        took = time.monotonic() - started
        progress(f"batch {batch_id}: {rows:,} rows in {len(files)} file(s) in {took:.1f}s "
                 f"({rows / max(took, 1e-6):,.0f} rows/s); {result.rows:,} rows this run")

    return write


def run(spark: Any, job: ArchiveJob, progress: Callable[[str], None] = lambda _: None,
        stop: threading.Event | None = None) -> ArchiveResult:
    """Run the archive query until it has archived everything (``once``) or ``stop`` is set."""
    rid = run_id(job)
    result = ArchiveResult()
    failures: list[errors.ConveyorError] = []
    started = time.monotonic()
    writer = (_reader(spark, job).writeStream.queryName(f"conveyor_archive_{uuid.uuid4().hex[:8]}")
              .option("checkpointLocation", str(job.checkpoint_dir))
              .foreachBatch(_sink(job, rid, result, progress, failures)))
    writer = writer.trigger(availableNow=True) if job.once else writer.trigger(processingTime=f"{job.interval} seconds")
    progress(f"archiving {job.source} into {job.path} ({'everything available now' if job.once else 'continuously'})")
    query = writer.start()
    try:
        while not query.awaitTermination(1.0):
            if stop is not None and stop.is_set():
                query.stop()
                break
    except Exception as exc:  # the query failed (pyspark's StreamingQueryException)
        if failures:
            raise failures[0] from exc
        raise errors.InternalError(f"the archive query failed: {exc}") from exc
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
