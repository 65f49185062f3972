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

Kafka's source options that shape the micro-batches are taken by every reader:
``minOffsetsPerTrigger`` / ``maxTriggerDelay`` (a trigger with fewer rows waiting than
the minimum reads nothing, until the delay since the last micro-batch has passed; ignored
by Trigger.AvailableNow, which reads everything there is), and ``failOnDataLoss`` (rows
the checkpoint expects that are gone: a stream's ticks dropped by rotation, a queue's
archive marks expired, a partitioned queue's messages removed by retention or a clear;
true: the query fails saying so; false: it goes on with what is left and logs how much
was lost). Several sources in one query (a list or a pattern) are read by ``Several``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from conveyor import errors
from conveyor.db import sync
from conveyor.spark import offsets, slices, sources
from conveyor.spark.options import Options

log = logging.getLogger("conveyor.spark")


def _position(offset: dict[str, Any], kind: str, name: str, key: str) -> int:
    """The position in an offset, after checking that it is one of this source."""
    if offset.get(kind) != name or not isinstance(offset.get(key), int):
        raise errors.InvalidInput(
            f"checkpoint offset {offset} is not one of {kind} {name!r}: the checkpoint belongs to "
            "another query (use a checkpoint location of its own for each source)")
    return int(offset[key])


def data_loss(options: Options, what: str) -> None:
    """Rows the checkpoint expects are gone: fail (failOnDataLoss, the default) or log it."""
    if options.fail_on_data_loss:
        raise errors.Conflict(f"data loss: {what}. Set the option failOnDataLoss to false to go on with what is "
                              "left (logged), or start the query again with a new checkpoint location")
    log.warning("conveyor source, going on after data loss (failOnDataLoss=false): %s", what)


def _limit(options: Options) -> ReadLimit:
    most = options.max_offsets or options.max_events
    return ReadMaxRows(most) if most else ReadAllAvailable()


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """What every reader shares: its read limit, and holding a trigger back until
    minOffsetsPerTrigger rows are waiting or maxTriggerDelay has passed."""

    options: Options
    available_now = False
    last_trigger: float | None = None

    def getDefaultReadLimit(self) -> ReadLimit:
        return _limit(self.options)

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = True
        self._prepare()

    def _prepare(self) -> None:
        raise NotImplementedError

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise NotImplementedError

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        end = self._latest(start, limit)
        minimum = self.options.min_offsets
        if minimum is None or end == start or self.available_now:
            return end
        now = time.monotonic()
        if self.last_trigger is None:
            self.last_trigger = now  # the delay runs from the query's first trigger
        waiting = sum(getattr(p, "rows", 0) for p in self.partitions(start, end))
        if waiting >= minimum or now - self.last_trigger >= self.options.max_trigger_delay:
            self.last_trigger = now
            return end
        return start

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)


class StreamReader(_Reader):
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
        """The consumer's position (registered at startingPosition if new); with
        startingTimestamp, moved on to the last tick at or before it (never back)."""
        stamp = self.options.starting_timestamp
        with sync.connect(self.options.dsn) as conn:
            tick = sync.fetch_value(conn, "pipeline_stream_position", {
                "stream": self.options.stream, "consumer": self.options.consumer,
                "start": "earliest" if stamp is not None else self.options.starting_position or "latest"})
            if stamp is not None:
                at = sync.fetch_value(conn, "pipeline_stream_tick_at", {"stream": self.options.stream, "at_ms": stamp})
                if at is not None and at > tick:
                    sync.fetch_value(conn, "pipeline_stream_advance", {
                        "stream": self.options.stream, "consumer": self.options.consumer, "tick": at})
                    tick = at
        return self._offset(tick)

    def _prepare(self) -> None:
        # what is appended now belongs to this run: tick if anything arrived since the last tick
        with sync.connect(self.options.dsn) as conn:
            self.target = int(sync.fetch_value(conn, "pipeline_stream_tick", {
                "stream": self.options.stream, "force": True}))

    def _kept(self, tick: int) -> int:
        """``tick``, or the oldest tick kept if rotation dropped it (failOnDataLoss)."""
        with sync.connect(self.options.dsn) as conn:
            oldest = sync.fetch_value(conn, "pipeline_stream_oldest_tick", {"stream": self.options.stream})
        if oldest is None or tick >= oldest:
            return tick
        data_loss(self.options, f"the checkpoint has read stream {self.options.stream!r} up to tick {tick}, but its "
                                f"ticks up to {oldest} are gone (rotated: their events were dropped); the events "
                                "between them were not read")
        return int(oldest)

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = self._kept(self._tick(start))
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
        first = min(self._kept(first), last)
        with sync.connect(self.options.dsn) as conn:
            _, first_seq, _, last_seq = sync.fetch_one(conn, "pipeline_stream_range", {
                "stream": self.options.stream, "from_tick": first, "to_tick": last})
        return list(slices.event_slices(self.options, self.options.consumer, first, last, first_seq, last_seq))

    def commit(self, end: dict[str, Any]) -> None:
        with sync.connect(self.options.dsn) as conn:
            sync.fetch_value(conn, "pipeline_stream_advance", {
                "stream": self.options.stream, "consumer": self.options.consumer, "tick": self._tick(end)})


class ArchiveReader(_Reader):
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

    def _prepare(self) -> None:
        self.target = self._new_mark(False)

    def _kept(self, mark: int) -> int:
        """``mark``, or the oldest mark kept if it expired (failOnDataLoss)."""
        if mark == 0:
            return 0
        with sync.connect(self.options.dsn) as conn:
            oldest = sync.fetch_value(conn, "pipeline_archive_oldest_mark", {"queue": self.options.queue, "mark": mark})
        if oldest is None or oldest == mark:
            return mark
        data_loss(self.options, f"the checkpoint has read the archive of queue {self.options.queue!r} up to mark "
                                f"{mark}, which expired (marks are kept 7 days); the rows archived between it and "
                                f"mark {oldest} were not read")
        return int(oldest)

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = self._kept(self._mark(start))
        latest = self.target if self.target is not None else self._new_mark(False)
        return self._offset(max(latest, after))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = self._mark(start), self._mark(end)
        return [] if first == last else list(slices.archive_slices(self.options, min(self._kept(first), last), last))

    def commit(self, end: dict[str, Any]) -> None:
        """Marks are shared by every reader of the archive and expire by age: nothing to do."""


class PartitionedReader(_Reader):
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
        with sync.connect(self.options.dsn) as conn:
            parts = slices.pqueue_partitions(conn, self.queue)
            if self.options.starting_timestamp is not None or self.options.timestamps is not None:
                return offsets.offset(self.queue, slices.pqueue_positions_at(conn, self.options, parts))
        spec = self.options.starting_offsets or offsets.Spec(offsets.LATEST)
        return offsets.offset(self.queue, offsets.resolve(spec, {n: p.head for n, p in parts.items()}, self.queue,
                                                          "startingOffsets"))

    def _prepare(self) -> None:
        self.target = self._heads()

    def reportLatestOffset(self) -> dict[str, Any]:
        return offsets.offset(self.queue, self._heads())

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
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
            lost = slices.pqueue_lost(conn, parts, first, last)
        if lost:
            data_loss(self.options, f"{sum(lost.values())} message(s) of partitioned queue {self.queue!r} that the "
                                    f"checkpoint had not read are gone (retention, or a clear), in partition(s) "
                                    f"{', '.join(sorted(lost))}")
        return list(slices.pqueue_slices(self.options, parts, first, last))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: reading is side-effect free (Spark's checkpoint holds the
        positions; no consumer group is moved)."""


class Several(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Several sources of one kind in one query (a list, or a pattern: Kafka's subscribe
    and subscribePattern): ``{"sources": {name: that source's offset}}``, each source read
    by its own reader with the same options. A source that matches the pattern later is
    read from its beginning (as Kafka reads a new topic's partitions); one that is gone
    keeps its last offset. Limits (maxEventsPerTrigger, maxOffsetsPerTrigger,
    minOffsetsPerTrigger) apply to each source."""

    def __init__(self, options: Options, make: Callable[[Options], _Reader]) -> None:
        self.options = options
        self.make = make
        self.readers: dict[str, _Reader] = {}
        self.frozen: list[str] | None = None  # Trigger.AvailableNow: the sources there were at its start

    def _reader(self, name: str, new: bool = False) -> _Reader:
        key = f"{name}\0new" if new else name
        if key not in self.readers:
            self.readers[key] = self.make(sources.one(self.options, name, from_start=new))
        return self.readers[key]

    def _start(self, offset: dict[str, Any], name: str) -> dict[str, Any]:
        """A source's start in ``offset`` (one found since: its beginning)."""
        inner = sources.inner(offset)
        return inner[name] if name in inner else self._reader(name, new=True).initialOffset()

    def initialOffset(self) -> dict[str, Any]:
        return sources.offset({name: self._reader(name).initialOffset() for name in sources.names(self.options)})

    def getDefaultReadLimit(self) -> ReadLimit:
        return _limit(self.options)

    def prepareForTriggerAvailableNow(self) -> None:
        self.frozen = sources.names(self.options)
        for name in self.frozen:
            self._reader(name).prepareForTriggerAvailableNow()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ends = dict(sources.inner(start))
        for name in self.frozen if self.frozen is not None else sources.names(self.options):
            ends[name] = self._reader(name).latestOffset(self._start(start, name), limit)
        return sources.offset(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for name, last in sources.inner(end).items():
            first = self._start(start, name)
            if first != last:
                parts.extend(self._reader(name).partitions(first, last))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        for name, last in sources.inner(end).items():
            self._reader(name).commit(last)
