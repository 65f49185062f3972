"""Streaming reads: a stream as a named consumer (offsets are tick ids), a queue's
archive (offsets are archive marks, the archive's ticks; migration 0006) and a
partitioned queue (offsets are a position per partition, as Spark keeps Kafka's;
conveyor.spark.offsets).

A micro-batch is the rows between two offsets; both exist before Spark plans the batch,
so replaying it after a crash reads the same rows. Spark's checkpoint, not ``commit()``,
is what makes a restarted query go on exactly where it stopped: ``commit()`` comes one
micro-batch late and never at stop. For a stream it moves the consumer's position, which
keeps rotation from dropping events the query may still replay and shows the query's
lag in ``conveyor status``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from conveyor import errors
from conveyor.db import sync
from conveyor.spark import offsets, slices
from conveyor.spark.options import Options


def _position(offset: dict[str, Any], kind: str, name: str, key: str) -> int:
    """The position in an offset, after checking that it is one of this source."""
    if offset.get(kind) != name or not isinstance(offset.get(key), int):
        raise errors.InvalidInput(
            f"checkpoint offset {offset} is not one of {kind} {name!r}: the checkpoint belongs to "
            "another query (use a checkpoint location of its own for each source)")
    return int(offset[key])


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream read as consumer ``options.consumer``: {"stream": name, "tick": id}."""

    def __init__(self, options: Options) -> None:
        if not options.consumer:
            raise errors.InvalidInput("a streaming read of a stream needs the option consumer (its position "
                                      "is where the query starts and what commit moves)")
        if options.kind != "events":
            raise errors.InvalidInput("streaming reads of a stream read its events (kind=events)")
        self.options = options
        self.target: int | None = None  # Trigger.AvailableNow: the last tick to read

    def _offset(self, tick: int) -> dict[str, Any]:
        return {"stream": self.options.stream, "tick": int(tick)}

    def _tick(self, offset: dict[str, Any]) -> int:
        return _position(offset, "stream", str(self.options.stream), "tick")

    def initialOffset(self) -> dict[str, Any]:
        with sync.connect(self.options.dsn) as conn:
            tick = sync.fetch_value(conn, "pipeline_stream_position", {
                "stream": self.options.stream, "consumer": self.options.consumer,
                "start": self.options.starting_position or "latest"})
        return self._offset(tick)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events:
            return ReadMaxRows(self.options.max_events)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # what is appended now belongs to this run: tick if anything arrived since the last tick
        with sync.connect(self.options.dsn) as conn:
            self.target = int(sync.fetch_value(conn, "pipeline_stream_tick", {
                "stream": self.options.stream, "force": True}))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = self._tick(start)
        max_events = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        with sync.connect(self.options.dsn) as conn:
            if self.options.tick and self.target is None:
                sync.fetch_value(conn, "pipeline_stream_tick", {"stream": self.options.stream, "force": False})
            end = sync.fetch_value(conn, "pipeline_stream_next_tick", {
                "stream": self.options.stream, "after_tick": after, "max_events": max_events, "up_to": self.target})
        return self._offset(max(int(end), after))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = self._tick(start), self._tick(end)
        if first == last:
            return []
        with sync.connect(self.options.dsn) as conn:
            _, first_seq, _, last_seq = sync.fetch_one(conn, "pipeline_stream_range", {
                "stream": self.options.stream, "from_tick": first, "to_tick": last})
        return list(slices.event_slices(self.options, self.options.consumer, first, last, first_seq, last_seq))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        with sync.connect(self.options.dsn) as conn:
            sync.fetch_value(conn, "pipeline_stream_advance", {
                "stream": self.options.stream, "consumer": self.options.consumer, "tick": self._tick(end)})


class ArchiveReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A queue's archive, incrementally: {"queue": name, "mark": id}; mark 0 is the start."""

    def __init__(self, options: Options) -> None:
        if options.kind != "archive":
            raise errors.InvalidInput("streaming reads of a queue read its archive (kind=archive): live "
                                      "messages have no order in which they are final")
        self.options = options
        self.target: int | None = None

    def _offset(self, mark: int) -> dict[str, Any]:
        return {"queue": self.options.queue, "mark": int(mark)}

    def _mark(self, offset: dict[str, Any]) -> int:
        return _position(offset, "queue", str(self.options.queue), "mark")

    def _new_mark(self, force: bool) -> int:
        with sync.connect(self.options.dsn) as conn:
            return int(sync.fetch_value(conn, "pipeline_archive_mark", {"queue": self.options.queue, "force": force}))

    def initialOffset(self) -> dict[str, Any]:
        if (self.options.starting_position or "earliest") == "latest":
            return self._offset(self._new_mark(True))
        with sync.connect(self.options.dsn) as conn:
            sync.fetch_one(conn, "queue_get", {"name": self.options.queue})  # QueueNotFound
        return self._offset(0)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._new_mark(False)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = self._mark(start)
        latest = self.target if self.target is not None else self._new_mark(False)
        return self._offset(max(latest, after))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return list(slices.archive_slices(self.options, self._mark(start), self._mark(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Marks are shared by every reader of the archive and expire by age: nothing to do."""


class PartitionedReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A partitioned queue, read the way Spark reads a Kafka topic:
    ``{queue: {partition: position}}``. Partitions created after the query started are
    read from their first message. Reading consumes nothing: no consumer group's cursor
    or lease is touched, so the query is invisible to the queue's consumers."""

    def __init__(self, options: Options) -> None:
        if options.ending_offsets is not None:
            raise errors.InvalidInput("option endingOffsets is for batch reads: a streaming query reads on and on")
        self.options = options
        self.queue = str(options.partitioned_queue)
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: the heads to read up to

    def _heads(self) -> dict[str, int]:
        with sync.connect(self.options.dsn) as conn:
            return {name: p.head for name, p in slices.pqueue_partitions(conn, self.queue).items()}

    def initialOffset(self) -> dict[str, Any]:
        spec = self.options.starting_offsets or offsets.Spec(offsets.LATEST)
        return offsets.offset(self.queue, offsets.resolve(spec, self._heads(), self.queue, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets:
            return ReadMaxRows(self.options.max_offsets)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._heads()

    def reportLatestOffset(self) -> dict[str, Any]:
        return offsets.offset(self.queue, self._heads())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = offsets.positions(start, self.queue)
        heads = self._heads()
        offsets.check(after, heads, self.queue)
        if self.target is not None:  # nothing pushed after the run began, not even to new partitions
            heads = {name: min(head, self.target.get(name, 0)) for name, head in heads.items()}
        end = {name: max(head, after.get(name, 0)) for name, head in heads.items()}
        end = offsets.limit(after, end, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        # a partition enters the offset once there is something of it to read
        return offsets.offset(self.queue, {name: p for name, p in end.items() if name in after or p > 0})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = offsets.positions(start, self.queue), offsets.positions(end, self.queue)
        if first == last:
            return []
        with sync.connect(self.options.dsn) as conn:
            parts = slices.pqueue_partitions(conn, self.queue)
        offsets.check(last, {name: p.head for name, p in parts.items()}, self.queue)
        return list(slices.pqueue_slices(self.options, parts, first, last))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: reading is side-effect free (Spark's checkpoint holds the
        positions; no consumer group is moved)."""
