"""The Parquet files of a lake table, written where the rows are: in the Spark tasks.

Each task attempt of a micro-batch (:class:`Task`: a Spark task, or the driver itself
for a small micro-batch; pipeline.archive) writes its rows into the table's directory, Hive style (``date=YYYY-MM-DD/``, one file
for each date it meets), under a name no other attempt can take —
``part-<run>-<micro-batch>-<uuid>.snappy.parquet`` — and hands back one small
:class:`File` per file (path, size, partition value, rows, Delta statistics, the file's
schema): never the rows. A task holds at most ``ROW_GROUP_ROWS`` rows per date in memory,
however large the micro-batch.

Which files readers see is the Delta log's business alone (``lake.commit_files``): a file
no commit lists is never read, so the files of a failed, killed or speculative attempt
are invisible from the start. :func:`sweep` deletes them once their micro-batch is in the
table (or found there when Spark replays it).

Runs on the executors: this module needs pyarrow and PySpark, not deltalake.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

PARTITION = "date"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's (and delta-rs's) directory for a null date
ROW_GROUP_ROWS = 50_000
STRING_STATS_CHARS = 32  # as Delta's writers: longer values get a min prefix and no max

@dataclass(frozen=True)
class File:
    """One Parquet file a task attempt wrote: enough for a Delta ``add`` action."""

    path: str  # relative to the table's root, e.g. date=2026-11-25/part-....parquet
    size: int
    date: str | None  # the partition value (None: a null date)
    rows: int
    modified_ms: int
    stats: str  # Delta's per-file statistics (JSON)
    arrow_schema: bytes  # the file's Arrow schema (IPC), the same for every file of a batch

    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.arrow_schema))


def prefix(run_id: str, batch_id: int) -> str:
    """The name every file of micro-batch ``batch_id`` of ``run_id`` starts with."""
    return f"part-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}-{batch_id:010d}-"


def with_date(data: pa.RecordBatch, column: str) -> pa.RecordBatch:
    """Adds the partition column ``date``: the UTC day of ``column``."""
    return data.append_column(PARTITION, pc.cast(data.column(column), pa.date32()))


def _by_date(batch: pa.RecordBatch) -> Iterator[tuple[str | None, pa.RecordBatch]]:
    dates = batch.column(PARTITION)
    rest = batch.drop_columns([PARTITION])
    days = pc.unique(dates).to_pylist()
    if len(days) == 1:  # the usual case: no copy
        yield (None if days[0] is None else days[0].isoformat()), rest
        return
    for day in days:
        mask = pc.is_null(dates) if day is None else pc.equal(dates, pa.scalar(day, pa.date32()))
        yield (None if day is None else day.isoformat()), rest.filter(mask)


def _iso_ms(micros: int) -> str:
    stamp = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


@dataclass
class _Stats:
    """Delta statistics of one file, kept up to date batch by batch: row and null
    counts, and min/max of integer, timestamp and string columns. Timestamps are written
    to the millisecond (as delta-rs does), the min rounded down and the max up, so that
    no reader ever skips a file that holds a matching row."""

    rows: int = 0
    nulls: dict[str, int] = field(default_factory=dict)
    low: dict[str, Any] = field(default_factory=dict)
    high: dict[str, Any] = field(default_factory=dict)

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            kind = column.type
            if pa.types.is_nested(kind):
                continue
            self.nulls[name] = self.nulls.get(name, 0) + column.null_count
            if pa.types.is_integer(kind) or pa.types.is_timestamp(kind) or pa.types.is_string(kind):
                extremes = pc.min_max(column)
                low, high = extremes["min"], extremes["max"]
                if low.is_valid:
                    low_v, high_v = (low.value, high.value) if pa.types.is_timestamp(kind) else (low.as_py(), high.as_py())
                    self.low[name] = low_v if name not in self.low else min(self.low[name], low_v)
                    self.high[name] = high_v if name not in self.high else max(self.high[name], high_v)

    def json(self, schema: pa.Schema) -> str:
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        for name, value in self.low.items():
            kind = schema.field(name).type
            if pa.types.is_timestamp(kind):
                low[name], high[name] = _iso_ms(value - value % 1000), _iso_ms(-(-self.high[name] // 1000) * 1000)
            elif pa.types.is_string(kind):
                low[name] = value[:STRING_STATS_CHARS]
                if len(self.high[name]) <= STRING_STATS_CHARS:
                    high[name] = self.high[name]
            else:
                low[name], high[name] = value, self.high[name]
        return json.dumps({"numRecords": self.rows, "minValues": low, "maxValues": high, "nullCount": self.nulls})


class _Open:
    """A file being written for one date: rows are buffered up to ``ROW_GROUP_ROWS`` and
    written as one row group."""

    def __init__(self, root: Path, name: str, date: str | None, schema: pa.Schema) -> None:
        self.date = date
        self.path = f"{PARTITION}={date or NULL_PARTITION}/{name}"
        (root / self.path).parent.mkdir(parents=True, exist_ok=True)
        self.full = root / self.path
        self.writer = pq.ParquetWriter(self.full, schema, compression="snappy")
        self.pending: list[pa.RecordBatch] = []
        self.buffered = 0
        self.stats = _Stats()

    def write(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.buffered += batch.num_rows
        self.stats.add(batch)
        if self.buffered >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending), row_group_size=max(self.buffered, 1))
            self.pending, self.buffered = [], 0

    def close(self) -> File:
        self.flush()
        self.writer.close()
        info = self.full.stat()
        return File(path=self.path, size=info.st_size, date=self.date, rows=self.stats.rows,
                    modified_ms=info.st_mtime_ns // 1_000_000, stats=self.stats.json(self.writer.schema),
                    arrow_schema=self.writer.schema.serialize().to_pybytes())


def write(root: str | Path, name_prefix: str, batches: Iterable[pa.RecordBatch]) -> list[File]:
    """Writes ``batches`` (with a ``date`` column) into ``root``'s date directories, one
    file per date, each named ``name_prefix`` + a new uuid."""
    attempt = uuid.uuid4()
    files: dict[str | None, _Open] = {}
    try:
        for batch in batches:
            for date, part in _by_date(batch):
                if part.num_rows:
                    if date not in files:
                        files[date] = _Open(Path(root), f"{name_prefix}{attempt}-c000.snappy.parquet", date, part.schema)
                    files[date].write(part)
    except BaseException:
        for open_file in files.values():
            open_file.writer.close()
        raise
    return [open_file.close() for open_file in files.values()]


@dataclass(frozen=True)
class Task:
    """What each task of a micro-batch runs (pickled to the executors): write the task's
    rows under ``root``, partitioned by the UTC day of ``date_column``; return the
    descriptions. With ``archived_at``, every row gets that column (a stream's events:
    when the micro-batch ran). ``kill_first_attempt`` is fault injection for the crash
    tests: the first attempt of each task SIGKILLs its Python worker once its files are
    written."""

    root: str
    name_prefix: str
    date_column: str
    archived_at: dt.datetime | None = None
    kill_first_attempt: bool = False

    def _prepare(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.archived_at is not None:
            stamp = pa.array([self.archived_at] * batch.num_rows, pa.timestamp("us", tz="UTC"))
            batch = batch.append_column("archived_at", stamp)
        return with_date(batch, self.date_column)

    def files(self, batches: Iterable[pa.RecordBatch]) -> list[File]:
        files = write(self.root, self.name_prefix, (self._prepare(b) for b in batches if b.num_rows))
        if self.kill_first_attempt:
            from pyspark import TaskContext

            context = TaskContext.get()
            if context is not None and context.attemptNumber() == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        return files


def sweep(root: str | Path, name_prefix: str, keep: Iterable[str], dates: Iterable[str | None] | None = None) -> list[str]:
    """Deletes the files named ``name_prefix``... that are not in ``keep`` (paths relative
    to ``root``): what failed attempts of a micro-batch left. Looks in the directories of
    ``dates`` (None: every date directory). Returns the paths deleted."""
    base = Path(root)
    kept = set(keep)
    if dates is None:
        folders = [p for p in base.glob(f"{PARTITION}=*") if p.is_dir()] if base.is_dir() else []
    else:
        folders = [base / f"{PARTITION}={d or NULL_PARTITION}" for d in set(dates)]
    gone: list[str] = []
    for folder in folders:
        for path in folder.glob(f"{name_prefix}*"):
            relative = path.relative_to(base).as_posix()
            if relative not in kept:
                path.unlink(missing_ok=True)
                gone.append(relative)
    return gone
