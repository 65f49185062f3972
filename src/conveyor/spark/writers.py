"""Writes into a queue or a stream, batch and streaming, without duplicates on retries.

Each task attempt COPYs its rows into ``conveyor.pipeline_stage`` under its own key
(writer, Spark stage, partition, task attempt id) in transactions of ``batchSize`` rows,
and tells the driver how many it staged. The driver's ``commit`` publishes the rows of
exactly the attempts Spark reports as successful, in one transaction
(``conveyor.pipeline_publish``), and drops the rest: a failed, retried or speculative
attempt never publishes anything. A streaming writer's commit also records
(commit key, batch id) in that transaction, so a micro-batch that Spark replays after a
driver crash is published once.

Columns taken (others are ignored): ``body`` or ``payload`` (required), ``type`` or
``content_type``, ``attributes`` (map of strings: a message's headers; for a stream
extra1..extra4 may come from it), ``group_id``, ``dedup_id``, ``delay`` (queues),
``extra1``..``extra4`` (streams).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from conveyor import errors
from conveyor.db import sync
from conveyor.spark.options import Options

_BODY = ("body", "payload")
_EXTRAS = ("extra1", "extra2", "extra3", "extra4")


@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    """What one task attempt staged (and under which writer: Spark may rebuild the writer
    object on the driver for commit, so its id travels with the messages)."""

    writer_id: str
    stage_id: int
    partition_id: int
    attempt_id: int
    rows: int


def check_schema(schema: StructType, options: Options) -> None:
    """On the driver, before any task runs: a body column, and a target that exists."""
    names = {f.name.lower() for f in schema.fields}
    if not names & set(_BODY):
        raise errors.InvalidInput("writing into a queue or stream needs a column body (or payload)")
    with sync.connect(options.dsn) as conn:
        if options.queue is not None:
            sync.fetch_one(conn, "queue_get", {"name": options.queue})
        else:
            sync.fetch_one(conn, "stream_get", {"name": options.stream})


def _column(batch: pa.RecordBatch, *names: str) -> list[Any]:
    for name in names:
        index = batch.schema.get_field_index(name)
        if index >= 0:
            return batch.column(index).to_pylist()
    return [None] * batch.num_rows


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _stage_rows(batch: pa.RecordBatch, key: tuple[uuid.UUID, int, int, int], first: int) -> Iterator[tuple[Any, ...]]:
    bodies = _column(batch, *_BODY)
    types = _column(batch, "type", "content_type")
    attributes = [dict(a) if a is not None else None for a in _column(batch, "attributes")]
    groups, dedups, delays = _column(batch, "group_id"), _column(batch, "dedup_id"), _column(batch, "delay")
    extras = [_column(batch, e) for e in _EXTRAS]
    for i in range(batch.num_rows):
        attrs = attributes[i]
        extra = [_text(extras[j][i] if extras[j][i] is not None else (attrs or {}).get(e))
                 for j, e in enumerate(_EXTRAS)]
        yield (*key, first + i, _text(bodies[i]), _text(types[i]), attrs, _text(groups[i]), _text(dedups[i]),
               delays[i], *extra)


def _chunks(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[list[pa.RecordBatch]]:
    """Record batches grouped into chunks of about ``size`` rows."""
    chunk: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        while batch.num_rows:
            take = batch.slice(0, size - rows)
            chunk.append(take)
            rows += take.num_rows
            batch = batch.slice(take.num_rows)
            if rows >= size:
                yield chunk
                chunk, rows = [], 0
    if chunk:
        yield chunk


def stage(options: Options, writer_id: uuid.UUID, batches: Iterator[pa.RecordBatch]) -> Staged:
    """Run in a task: stage every row under this attempt's key, ``batchSize`` rows per
    transaction (bounded memory; a failure leaves the attempt's rows unpublished)."""
    context = TaskContext.get()
    assert context is not None, "stage() runs inside a Spark task"
    key = (writer_id, context.stageId(), context.partitionId(), context.taskAttemptId())
    n = 0
    with sync.connect(options.dsn) as conn:
        for chunk in _chunks(batches, options.batch_size):
            with sync.transaction(conn):
                for batch in chunk:
                    n += sync.copy_rows(conn, "pipeline_stage_copy", _stage_rows(batch, key, n))
    return Staged(writer_id=str(writer_id), stage_id=key[1], partition_id=key[2], attempt_id=key[3], rows=n)


def publish(options: Options, messages: Sequence[WriterCommitMessage | None], batch_id: int | None = None) -> int:
    """On the driver: publish the staged rows of the successful attempts in one
    transaction. Returns the rows published (-1: this micro-batch was published before)."""
    done = [m for m in messages if isinstance(m, Staged)]
    if not done:
        return 0
    keys = {(m.writer_id, m.stage_id) for m in done}
    if len(keys) != 1:
        raise errors.InternalError(f"one job's tasks came from several writers or stages: {sorted(keys)}")
    writer_id, stage_id = keys.pop()
    with sync.connect(options.dsn) as conn:
        return int(sync.fetch_value(conn, "pipeline_publish", {
            "writer_id": writer_id, "stage_id": stage_id,
            "target_kind": "queue" if options.queue is not None else "stream", "target": options.target,
            "partitions": [m.partition_id for m in done], "attempts": [m.attempt_id for m in done],
            "counts": [m.rows for m in done],
            "commit_key": options.commit_key if batch_id is not None else None, "batch_id": batch_id}))


def discard(options: Options, writer_id: uuid.UUID, messages: Sequence[WriterCommitMessage | None]) -> None:
    """Drops what the job staged: the tasks that reported, and anything else staged under
    this writer object (tasks that failed before reporting)."""
    keys = {(m.writer_id, m.stage_id) for m in messages if isinstance(m, Staged)}
    keys.add((str(writer_id), None))
    with sync.connect(options.dsn) as conn:
        for writer, stage_id in keys:
            sync.fetch_value(conn, "pipeline_discard", {"writer_id": writer, "stage_id": stage_id})


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.writer_id = uuid.uuid4()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return stage(self.options, self.writer_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        publish(self.options, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        discard(self.options, self.writer_id, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options) -> None:
        if not options.commit_key:
            raise errors.InvalidInput("a streaming write needs a checkpointLocation (or the option commitKey): "
                                      "it is how a replayed micro-batch is recognised")
        self.options = options
        self.writer_id = uuid.uuid4()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return stage(self.options, self.writer_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        publish(self.options, messages, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        discard(self.options, self.writer_id, messages)
