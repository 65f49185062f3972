"""``conveyor pipeline archive``: a stream (read as its own consumer) or a queue's archive
into a Delta table partitioned by date, incrementally and exactly once across runs and
crashes.

The driver runs the micro-batches itself, with the ``conveyor`` source's streaming
readers (conveyor.spark.streaming: offsets are tick ids, or archive marks) and a
checkpoint in Spark's format (pipeline.checkpoint; default ``<table>/_checkpoint``,
beside the data, so the two travel together): before a micro-batch reads anything, its
end offset is recorded; after a crash the last unfinished micro-batch runs again with the
same offsets, hence the same rows. Its rows go from PostgreSQL straight into Parquet
files in the table's directory (pipeline.datafiles), written where they are read: by the
Spark tasks, each reading its slices of the micro-batch with its own connection (an RDD
job; the rows never cross into the JVM and never reach the driver), or, for a micro-batch
of at most ``rows_per_task`` rows, by the driver alone (a Spark job's fixed cost, about a
second, is more than writing that many rows; Spark is started only when a micro-batch
needs it). Each task returns only a description of each file; the driver commits exactly
the files of the successful task attempts as one Delta commit, with the micro-batch id as
the table's application-transaction version for this run (lake.commit_files). If that
micro-batch had reached the table before a crash, the table already holds its id and the
replay is skipped. Every reader of the table therefore sees each event once. A task gets
at least about ``rows_per_task`` rows (at most ``partitions`` tasks), so a small
micro-batch makes one file per date, not one per task.

Files that no commit lists (a failed, killed or speculative task attempt's, or those of
a micro-batch whose driver died before its commit) are invisible to every Delta reader.
Their names carry the run and the micro-batch id, and they are deleted once that
micro-batch is in the table: right after its commit, or when its replay is skipped.
Files of a run whose checkpoint was thrown away before it replayed, or finished after the
sweep by an attempt Spark had given up on, are only removed by ``lake.compact`` (delta-rs
vacuum), which deletes unlisted files past a retention period.

``once`` is Trigger.AvailableNow: everything there is when the run starts, in
micro-batches of at most ``max_events``, then stop. Otherwise a micro-batch starts every
``interval`` seconds (at once when the last one took longer) until ``stop`` is set; each
reports its rate and what is left waiting (pipeline.progress).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from conveyor import errors
from conveyor.pipeline import checkpoint, datafiles, human, lake, session
from conveyor.spark import options as source_options
from conveyor.spark import slices, streaming

RUN_FILE = "conveyor-archive.json"
# Fault injection for the crash tests, comma-separated: "kill-after-commit:<batch id>"
# SIGKILLs this process right after that micro-batch's Delta commit, before the
# checkpoint records it (and before its stray files are swept); "kill-task:<batch id>"
# SIGKILLs the Python worker of each Spark task's first attempt of that micro-batch once
# its files are written (Spark retries the task if its master allows task failures, e.g.
# local[2,3]).
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
    rows_per_task: int = 10_000

    def __post_init__(self) -> None:
        if (self.stream is None) == (self.queue is None):
            raise errors.InvalidInput("archive either a stream or a queue")
        if self.interval <= 0:
            raise errors.InvalidInput("the interval must be positive")
        if self.partitions < 1 or self.rows_per_task < 1 or (self.max_events is not None and self.max_events < 1):
            raise errors.InvalidInput("partitions, rows per task and max events must be at least 1")

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
    spark_batches: int = 0  # micro-batches written by Spark tasks (the others: by the driver)
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


def _reader(job: ArchiveJob) -> streaming.StreamReader | streaming.ArchiveReader:
    """The ``conveyor`` source's streaming reader of the job's source. An archive starts
    from the oldest event still kept unless told otherwise (a new consumer of the stream
    would otherwise start at the latest tick and archive nothing of what is already there)."""
    raw = {"dsn": job.dsn, "numPartitions": str(job.partitions),
           "startingPosition": job.starting_position or "earliest"}
    if job.stream is not None:
        options = source_options.parse({**raw, "stream": job.stream, "consumer": job.consumer, "tick": "true"})
        return streaming.StreamReader(options)
    return streaming.ArchiveReader(source_options.parse({**raw, "queue": str(job.queue), "kind": "archive"}))


def _faults(batch_id: int) -> set[str]:
    """The faults injected into micro-batch ``batch_id`` (``FAULT_ENV``, comma-separated)."""
    suffix = f":{batch_id}"
    return {f.removesuffix(suffix) for f in os.environ.get(FAULT_ENV, "").split(",") if f.endswith(suffix)}


def groups(parts: Sequence[slices.Slice], rows_per_task: int) -> list[list[slices.Slice]]:
    """The slices of a micro-batch in tasks of at least about ``rows_per_task`` rows (by
    the planner's estimates), in order; one group when the whole is that small."""
    n = max(1, min(len(parts), math.ceil(sum(p.rows for p in parts) / rows_per_task)))
    size = max(1, math.ceil(len(parts) / n))
    return [list(parts[i:i + size]) for i in range(0, len(parts), size)] or [[]]


@dataclass(frozen=True)
class _Write:
    """A Spark task (pickled to the executors): read its slices, write their rows."""

    options: source_options.Options
    task: datafiles.Task

    def __call__(self, parts: Iterator[list[slices.Slice]]) -> Iterator[datafiles.File]:
        for group in parts:
            yield from self.task.files(itertools.chain.from_iterable(slices.read(self.options, s) for s in group))


def _write_files(spark: Any, reader: Any, job: ArchiveJob, rid: str, batch_id: int, start: dict[str, Any],
                 end: dict[str, Any], kill: bool) -> tuple[list[datafiles.File], bool]:
    """The files of the micro-batch (start, end], and whether Spark tasks wrote them. A
    stream's events get ``archived_at`` (when this micro-batch ran) and their date from
    ``created_at``; a queue's archive rows have both already."""
    stream = job.stream is not None
    task = datafiles.Task(root=str(job.path.resolve()), name_prefix=datafiles.prefix(rid, batch_id),
                          date_column="created_at" if stream else "archived_at",
                          archived_at=dt.datetime.now(dt.UTC) if stream else None, kill_first_attempt=kill)
    parts = groups(reader.partitions(start, end), job.rows_per_task)
    if len(parts) == 1 and sum(p.rows for p in parts[0]) <= job.rows_per_task and not kill:
        return list(_Write(reader.options, task)(iter(parts))), False
    context = _session(spark).sparkContext
    return context.parallelize(parts, len(parts)).mapPartitions(_Write(reader.options, task)).collect(), True


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


def _session(spark: Any) -> Any:
    return spark.get() if isinstance(spark, session.Lazy) else spark


def _archive(spark: Any, reader: Any, job: ArchiveJob, rid: str, batch_id: int, start: dict[str, Any],
             end: dict[str, Any], result: ArchiveResult, progress: Callable[[str], None]) -> str | None:
    """Micro-batch ``batch_id``: its files written and committed as one Delta commit (or
    skipped, if a run before a crash had committed it). Returns what to report of it."""
    started = time.monotonic()
    done = lake.committed(job.path, rid)
    if done is not None and done >= batch_id:
        _skip(job, rid, batch_id, result, progress)
        return None
    faults = _faults(batch_id)
    files, on_spark = _write_files(spark, reader, job, rid, batch_id, start, end, kill="kill-task" in faults)
    if not files:
        return None
    if not lake.commit_files(job.path, files, rid, batch_id, {"conveyor.source": job.source}):
        _skip(job, rid, batch_id, result, progress)  # committed meanwhile: what was just written goes
        return None
    if "kill-after-commit" in faults:
        os.kill(os.getpid(), signal.SIGKILL)
    result.swept += _sweep(job, rid, batch_id, files)
    rows = sum(f.rows for f in files)
    result.batches += 1
    result.spark_batches += on_spark
    result.rows += rows
    result.files += len(files)
    took = time.monotonic() - started
    return (f"batch {batch_id}: {human.count(rows, 'row')} in {human.count(len(files), 'file')} in "
            f"{human.duration(took)} ({human.rate(rows, took)}, {'Spark tasks' if on_spark else 'the driver'}); "
            f"{human.count(result.rows, 'row')} this run")


def _skip(job: ArchiveJob, rid: str, batch_id: int, result: ArchiveResult, progress: Callable[[str], None]) -> None:
    result.skipped += 1
    result.swept += _sweep(job, rid, batch_id)
    progress(f"batch {batch_id}: already in the table (replayed after a restart), skipped")


def _resume(reader: Any, log: checkpoint.Log) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """Where the run starts: (next micro-batch id, its start offset, its end offset if it
    is a replay of one the checkpoint planned and did not finish)."""
    last = log.last()
    if last is None:
        return 0, reader.initialOffset(), None
    if last.committed:
        return last.id + 1, last.end, None
    return last.id, log.offset(last.id - 1) if last.id else reader.initialOffset(), last.end


def _waiting(reader: Any, end: dict[str, Any]) -> int:
    """About how many rows are left after ``end`` (the source's latest offset, unlimited)."""
    latest = reader.latestOffset(end, ReadAllAvailable())
    return sum(p.rows for p in reader.partitions(end, latest)) if latest != end else 0


def run(spark: Any, job: ArchiveJob, progress: Callable[[str], None] = lambda _: None,
        stop: threading.Event | None = None) -> ArchiveResult:
    """Archive until everything there was at the start is in the table (``once``) or
    ``stop`` is set. ``spark``: a session, or a session.Lazy (started only if a
    micro-batch is larger than ``rows_per_task``), or None: a local one started if
    needed and stopped at the end."""
    if spark is None:
        own = session.Lazy()
        try:
            return run(own, job, progress, stop)
        finally:
            own.stop()
    rid = run_id(job)
    result = ArchiveResult()
    started = time.monotonic()
    reader = _reader(job)
    log = checkpoint.Log(job.checkpoint_dir)
    limit = ReadMaxRows(job.max_events) if job.max_events else ReadAllAvailable()
    progress(f"archiving {job.source} into {job.path} ({'everything available now' if job.once else 'continuously'})")
    batch_id, start, replay = _resume(reader, log)
    if job.once:
        reader.prepareForTriggerAvailableNow()
    while stop is None or not stop.is_set():
        began = time.monotonic()
        end = replay if replay is not None else reader.latestOffset(start, limit)
        replay = None
        if end == start and job.once:
            break
        if end != start:
            log.plan(batch_id, end)
            line = _archive(spark, reader, job, rid, batch_id, start, end, result, progress)
            log.commit(batch_id)
            reader.commit(end)
            result.end_offset = end
            start, batch_id = end, batch_id + 1
            if line is not None:  # continuously: and how far behind the source it is
                progress(line if job.once else f"{line}; about {human.count(_waiting(reader, start), 'row')} waiting")
        if not job.once:
            _sleep(stop, job.interval - (time.monotonic() - began))
    table = lake.open_table(job.path)
    result.table_version = table.version() if table is not None else None
    result.seconds = time.monotonic() - started
    return result


def _sleep(stop: threading.Event | None, seconds: float) -> None:
    if seconds > 0:
        if stop is not None:
            stop.wait(seconds)
        else:
            time.sleep(seconds)
