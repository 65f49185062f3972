"""What the ``conveyor`` data source reads: one schema per kind of data, as Spark DDL and
as the Arrow schema its readers produce (the two are built from one list).

Every schema starts with the name of the queue or stream read, so that reads of several
can be unioned. ``attributes`` is a map of strings: a queue message's headers (SQS
message attributes; values that are not strings are kept as their JSON text), or a
stream event's extra1..extra4. A partitioned queue's message (migration 0009) has its
partition's name and id, its position ``seq`` in the partition (what offsets count), its
Queen ids, and its payload as JSON text, opened if it was stored sealed (``encrypted``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

_ARROW = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,string>": pa.map_(pa.string(), pa.string()),
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # Spark SQL type

    @property
    def arrow(self) -> pa.DataType:
        return _ARROW[self.type]


def _fields(spec: str) -> tuple[Field, ...]:
    # commas inside map<...> do not separate fields
    return tuple(Field(*item.split()) for item in re.split(r",(?![^<]*>)", spec))


QUEUE_MESSAGES = _fields(
    "queue string, id bigint, message_uuid string, sent_at timestamp, visible_at timestamp, receive_count int,"
    "first_received_at timestamp, body string, content_type string, attributes map<string,string>,"
    "group_id string, dedup_id string, sender_id string, source_queue string")

QUEUE_ARCHIVE = _fields(
    "queue string, id bigint, message_uuid string, sent_at timestamp, archived_at timestamp, receive_count int,"
    "first_received_at timestamp, body string, content_type string, attributes map<string,string>,"
    "group_id string, dedup_id string, sender_id string, source_queue string, outcome string, error string")

STREAM_EVENTS = _fields(
    "stream string, id bigint, type string, payload string, created_at timestamp, retry_count int,"
    "attributes map<string,string>")

STREAM_DEAD_LETTERS = _fields(
    "stream string, id bigint, event_id bigint, consumer string, dead_at timestamp, reason string, type string,"
    "payload string, created_at timestamp, retry_count int, attributes map<string,string>")

PARTITIONED_MESSAGES = _fields(
    "queue string, partition string, partition_id string, seq bigint, message_id string, transaction_id string,"
    "trace_id string, payload string, encrypted boolean, producer_sub string, created_at timestamp")


def ddl(fields: Sequence[Field]) -> str:
    """The schema as Spark DDL (``queue string, id bigint, ...``)."""
    return ", ".join(f"{f.name} {f.type}" for f in fields)


def arrow(fields: Sequence[Field]) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.arrow) for f in fields])
