"""Splitting a read into Spark partitions, and reading one partition.

A ``Slice`` is one input partition: a named query (or a stream cursor) over an id range
``[min_id, max_id)``. The first slice of a read is open below and the last open above,
so the slices cover every row whatever the split; the split only spreads the work.
A partitioned queue's slice is a list of position ranges ``(partition, after, through]``
instead: the ranges of a read are packed into about ``numPartitions`` slices by message
count, a large partition cut into several, many small ones sharing one (a queue may have
thousands of partitions; a Spark task each would cost more than their rows).
Slices are planned on the driver and read on executors, each with its own connection.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from conveyor import errors
from conveyor.db import sync
from conveyor.spark import offsets, rows, sources
from conveyor.spark.options import Options


class Slice(InputPartition):
    """One partition: ``query`` (a named query, or ``"events"`` for the stream cursor)
    with its parameters, read as the rows of ``name`` (the queue or stream column).
    ``rows``: about how many rows it holds, as planned (the archive sizes its tasks by it)."""

    def __init__(self, query: str, name: str, params: Mapping[str, Any], rows: int = 0) -> None:
        super().__init__(dict(params))
        self.query = query
        self.name = name
        self.params = dict(params)
        self.rows = rows

    def __repr__(self) -> str:
        return f"Slice({self.query}, {self.name}, {self.params})"


def split(low: int | None, high: int | None, n: int) -> list[tuple[int | None, int | None]]:
    """``n`` ranges over [low, high] (fewer when it is small), the first open below and the
    last open above."""
    if low is None or high is None or high < low:
        return [(None, None)]
    n = max(1, min(n, high - low + 1))
    step = math.ceil((high - low + 1) / n)
    edges: list[int | None] = [None, *(low + i * step for i in range(1, n)), None]
    return list(itertools.pairwise(edges))


def _slices(query: str, name: str, params: Mapping[str, Any], low: int | None, high: int | None,
            n: int, rows: int) -> list[Slice]:
    """``rows`` (about how many there are in all) shared evenly over the slices."""
    ranges = split(low, high, n)
    return [Slice(query, name, {**params, "min_id": a, "max_id": b}, rows=math.ceil(rows / len(ranges)))
            for a, b in ranges]


def event_slices(options: Options, consumer: str | None, from_tick: int, to_tick: int,
                 first_seq: int, last_seq: int) -> list[Slice]:
    """The events between two ticks. Their ids lie mostly in (first_seq, last_seq]: a
    transaction in progress at the first tick may commit a smaller id later, which the
    open first slice takes."""
    if from_tick == to_tick:
        return []
    params = {"stream": options.stream, "consumer": consumer, "from_tick": from_tick, "to_tick": to_tick}
    return _slices("events", str(options.stream), params, first_seq + 1, last_seq, options.partitions,
                   max(last_seq - first_seq, 0))


def archive_slices(options: Options, from_mark: int, to_mark: int) -> list[Slice]:
    """The archive rows of a queue between two marks (mark 0: the beginning)."""
    if from_mark == to_mark:
        return []
    params = {"queue": options.queue, "from_mark": from_mark, "to_mark": to_mark}
    with sync.connect(options.dsn) as conn:
        low, high, rows = sync.fetch_one(conn, "pipeline_archive_bounds", params) or (None, None, 0)
    return _slices("pipeline_archive_range", str(options.queue), params, low, high, options.partitions, rows or 0)


def pack(ranges: Sequence[tuple[int, int, int]], n: int) -> list[list[tuple[int, int, int]]]:
    """Ranges ``(partition id, after, through)`` in about ``n`` groups of about equal
    message counts (``through - after``), in their order, cutting ranges where needed."""
    total = sum(through - after for _, after, through in ranges)
    if total <= 0:
        return []
    per = math.ceil(total / n)
    groups: list[list[tuple[int, int, int]]] = [[]]
    room = per
    for partition_id, after, through in ranges:
        while after < through:
            if room == 0:
                groups.append([])
                room = per
            take = min(through - after, room)
            groups[-1].append((partition_id, after, after + take))
            after, room = after + take, room - take
    return groups


def pqueue_partitions(conn: sync.Connection, queue: str) -> dict[str, offsets.Partition]:
    """The partitions of a partitioned queue now, by name (PartitionedQueueNotFound)."""
    found = sync.fetch_all(conn, "pipeline_pqueue_partitions", {"queue": queue})
    if not found:
        raise errors.PartitionedQueueNotFound(f"partitioned queue {queue!r} does not exist")
    return {name: offsets.Partition(int(pid), int(head)) for _, pid, name, head in found if pid is not None}


def pqueue_positions_at(conn: sync.Connection, options: Options, parts: Mapping[str, offsets.Partition]) -> dict[str, int]:
    """Per partition, the position before its first message created at or after the
    time asked (startingOffsetsByTimestamp for the partitions it names, else
    startingTimestamp; neither: the beginning)."""
    named = dict(options.timestamps.positions) if options.timestamps is not None else {}
    unknown = sorted(set(named) - set(parts))
    if unknown:
        raise errors.InvalidInput(f"option startingOffsetsByTimestamp names partition {unknown[0]!r}, which the "
                                  f"partitioned queue {options.partitioned_queue!r} does not have")
    ats = {name: named.get(name, options.starting_timestamp) for name in parts}
    asked = {name: at for name, at in ats.items() if at is not None}
    found = dict(sync.fetch_all(conn, "pipeline_pqueue_positions_at", {
        "partition_ids": [parts[n].id for n in asked], "ats": list(asked.values())})) if asked else {}
    return {name: int(found[p.id]) if name in asked else 0 for name, p in parts.items()}


def pqueue_lost(conn: sync.Connection, parts: Mapping[str, offsets.Partition], start: Mapping[str, int],
                end: Mapping[str, int]) -> dict[str, int]:
    """Per partition, the messages of (start, end] that are gone from its beginning
    (removed by retention or a clear before they were read); none: {}."""
    ranges = {name: (start.get(name, 0), through) for name, through in end.items()
              if through > start.get(name, 0) and name in parts}
    if not ranges:
        return {}
    kept = dict(sync.fetch_all(conn, "pipeline_pqueue_first_kept", {
        "partition_ids": [parts[n].id for n in ranges], "afters": [r[0] for r in ranges.values()]}))
    lost: dict[str, int] = {}
    for name, (after, through) in ranges.items():
        first = kept.get(parts[name].id)
        gone = (through if first is None else min(int(first) - 1, through)) - after
        if gone > 0:
            lost[name] = gone
    return lost


def pqueue_slices(options: Options, parts: Mapping[str, offsets.Partition], start: Mapping[str, int],
                  end: Mapping[str, int]) -> list[Slice]:
    """The messages of each partition after its ``start`` position through its ``end``."""
    ranges = [(parts[name].id, start.get(name, 0), through) for name, through in sorted(end.items())
              if through > start.get(name, 0)]
    return [Slice("pipeline_pqueue_range", str(options.partitioned_queue), {
                "partition_ids": [r[0] for r in group], "afters": [r[1] for r in group],
                "throughs": [r[2] for r in group]}, rows=sum(r[2] - r[1] for r in group))
            for group in pack(ranges, options.partitions)]


def plan(options: Options) -> list[Slice]:
    """The partitions of a batch read (the whole of what the options name; several
    sources: theirs, one after the other)."""
    if options.several:
        return [part for name in sources.names(options) for part in plan(sources.one(options, name))]
    with sync.connect(options.dsn) as conn:
        if options.partitioned_queue is not None:
            return _plan_pqueue(conn, options)
        if options.stream is not None:
            return _plan_stream(conn, options)
        return _plan_queue(conn, options)


def _plan_stream(conn: sync.Connection, options: Options) -> list[Slice]:
    stream = str(options.stream)
    sync.fetch_one(conn, "stream_get", {"name": stream})  # StreamNotFound
    if options.kind == "dead_letters":
        low, high, rows = sync.fetch_one(conn, "pipeline_stream_dead_letters_bounds", {"stream": stream})
        return _slices("pipeline_stream_dead_letters_range", stream, {"stream": stream}, low, high,
                       options.partitions, rows)
    first_tick, first_seq, last_tick, last_seq = sync.fetch_one(conn, "pipeline_stream_range", {
        "stream": stream, "from_tick": options.from_tick, "to_tick": options.to_tick})
    return event_slices(options, options.consumer, first_tick, last_tick, first_seq, last_seq)


def _plan_queue(conn: sync.Connection, options: Options) -> list[Slice]:
    queue = str(options.queue)
    info = sync.fetch_record(conn, "queue_get", {"name": queue})  # QueueNotFound
    assert info is not None
    if options.kind == "archive":
        low, high, rows = sync.fetch_one(conn, "pipeline_archive_all_bounds", {"queue": queue})
        return _slices("pipeline_archive_all_range", queue, {"queue": queue}, low, high, options.partitions, rows)
    name, source = queue, None
    if options.kind == "dead_letters":
        if info["dead_letter_queue"] is None:
            raise errors.InvalidInput(
                f"queue {queue!r} has no dead-letter queue: its failed messages are in its archive "
                "(kind=archive, outcome 'failed')")
        name, source = info["dead_letter_queue"], queue
    params = {"queue": name, "source": source}
    low, high, rows = sync.fetch_one(conn, "pipeline_messages_bounds", params)
    return _slices("pipeline_messages_range", name, params, low, high, options.partitions, rows)


def _plan_pqueue(conn: sync.Connection, options: Options) -> list[Slice]:
    """Kafka's batch read: from startingOffsets (default earliest) to endingOffsets
    (default latest), both resolved against the heads of one snapshot."""
    queue = str(options.partitioned_queue)
    start_spec = options.starting_offsets or offsets.Spec(offsets.EARLIEST)
    if offsets.LATEST in (start_spec.default, *dict(start_spec.positions).values()):
        raise errors.InvalidInput("option startingOffsets cannot be latest (-1) in a batch read: it would read nothing")
    parts = pqueue_partitions(conn, queue)
    heads = {name: p.head for name, p in parts.items()}
    if options.starting_timestamp is not None or options.timestamps is not None:
        start = pqueue_positions_at(conn, options, parts)
    else:
        start = offsets.resolve(start_spec, heads, queue, "startingOffsets")
    end = offsets.resolve(options.ending_offsets or offsets.Spec(offsets.LATEST), heads, queue, "endingOffsets")
    backwards = sorted(name for name in heads if end[name] < start[name])
    if backwards:
        raise errors.InvalidInput(f"partition {backwards[0]!r}: endingOffsets ({end[backwards[0]]}) is before "
                                  f"startingOffsets ({start[backwards[0]]})")
    return pqueue_slices(options, parts, start, end)


def read(options: Options, part: Slice) -> Iterator[pa.RecordBatch]:
    """The rows of one partition as Arrow record batches (a connection of its own)."""
    with sync.connect(options.dsn) as conn:
        if part.query == "events":
            batches = sync.cursor_batches(conn, "pipeline_stream_open", "pipeline_stream_fetch", part.params)
        else:
            batches = sync.fetch_batches(conn, part.query, part.params)
        for chunk in batches:
            got = chunk if options.partitioned_queue is None else rows.opened(options.row_fields, chunk,
                                                                               options.encryption_keys)
            yield rows.to_batch(options.row_fields, part.name, got, options.fields)
