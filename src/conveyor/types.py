"""Value types that cross layer boundaries: frozen, typed, and free of any driver."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

QUEUE_ATTRIBUTES = (
    "visibility_timeout",
    "delay_seconds",
    "retention_seconds",
    "max_message_size",
    "receive_wait_seconds",
    "max_receive_count",
    "dead_letter_queue",
    "content_based_deduplication",
)

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue's configuration (the SQL view ``conveyor.queue_info``)."""

    name: str
    fifo: bool
    visibility_timeout: int
    delay_seconds: int
    retention_seconds: int
    max_message_size: int
    receive_wait_seconds: int
    max_receive_count: int | None
    dead_letter_queue: str | None
    content_based_deduplication: bool
    created_at: datetime
    updated_at: datetime
    extra_attributes: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    purged_at: datetime | None = None

    def attributes(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in QUEUE_ATTRIBUTES}


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    queue_name: str
    queue_length: int
    in_flight: int
    delayed: int
    newest_msg_age_sec: int | None
    oldest_msg_age_sec: int | None
    total_messages: int
    dead_letter_queue: str | None
    dead_letter_length: int
    scrape_time: datetime


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message to send. ``delay`` None means the queue's delay_seconds."""

    body: str
    headers: dict[str, Any] | None = None
    delay: int | None = None
    content_type: str | None = None
    group_id: str | None = None
    dedup_id: str | None = None
    sender_id: str | None = None
    system_attributes: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The message as the SQL API's JSON message object (absent keys are omitted)."""
        return {k: v for k in _OUTGOING_KEYS if (v := getattr(self, k)) is not None}


_OUTGOING_KEYS = ("body", "headers", "delay", "content_type", "group_id", "dedup_id", "sender_id",
                  "system_attributes")


@dataclass(frozen=True, slots=True)
class Sent:
    """What a send returns for one message."""

    id: int
    message_uuid: UUID


@dataclass(frozen=True, slots=True)
class Message:
    """A stored message as the SQL API returns it (a row of ``conveyor.messages``)."""

    queue_id: int
    id: int
    vt: datetime
    sent_at: datetime
    receive_count: int
    first_received_at: datetime | None
    body: str
    content_type: str | None = None
    headers: dict[str, Any] | None = None
    group_id: str | None = None
    dedup_id: str | None = None
    source_queue_id: int | None = None
    message_uuid: UUID | None = None
    sender_id: str | None = None
    system_attributes: dict[str, Any] | None = None

    @property
    def is_json(self) -> bool:
        return self.content_type == JSON_CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class MoveTask:
    """A task moving a dead-letter queue's messages back (``conveyor.move_task_info``)."""

    handle: UUID
    source_queue: str
    destination_queue: str | None
    max_per_second: int | None
    status: str
    moved: int
    to_move: int
    failure_reason: str | None
    started_at: datetime


@dataclass(frozen=True, slots=True)
class Stream:
    """A stream's configuration (``conveyor.stream_info``)."""

    name: str
    rotation_period: timedelta
    ticker_max_count: int
    ticker_max_lag: timedelta
    ticker_idle_period: timedelta
    ticker_paused: bool
    max_retries: int
    event_ttl: timedelta | None
    cur_table: int
    switch_time: datetime
    created_at: datetime
    consumers: int
    channel: str  # LISTEN here for this stream's ticks (payload: the tick id)


@dataclass(frozen=True, slots=True)
class StreamEventIn:
    """An event to append. The payload is stored as given (text)."""

    payload: str
    type: str = "default"
    extra1: str | None = None
    extra2: str | None = None
    extra3: str | None = None
    extra4: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k in ("type", "payload", "extra1", "extra2", "extra3", "extra4")
                if (v := getattr(self, k)) is not None}


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """An event as a consumer receives it (``conveyor.stream_event``)."""

    id: int
    batch_id: int
    type: str
    payload: str | None
    retry_count: int | None
    created_at: datetime
    extra1: str | None = None
    extra2: str | None = None
    extra3: str | None = None
    extra4: str | None = None


@dataclass(frozen=True, slots=True)
class StreamDeadLetter:
    id: int
    stream_id: int
    consumer: str
    dead_at: datetime
    reason: str | None
    ev_id: int
    ev_time: datetime
    ev_retry: int | None
    ev_type: str | None
    ev_data: str | None
    ev_extra1: str | None = None
    ev_extra2: str | None = None
    ev_extra3: str | None = None
    ev_extra4: str | None = None


@dataclass(frozen=True, slots=True)
class StreamStats:
    stream: str
    depth: int
    oldest_event_age: timedelta | None
    consumers: int
    events_per_sec: Any
    cur_table: int
    rotation_age: timedelta
    rotation_period: timedelta
    ticker_paused: bool
    last_tick_time: datetime | None
    last_tick_id: int | None
    dead_letters: int
    pending_retries: int
    delayed: int


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    stream: str
    consumer: str
    lag: timedelta | None
    pending_events: int
    last_seen: datetime
    batch_active: bool
    batch_id: int | None
    batch_age: timedelta | None


@dataclass(frozen=True, slots=True)
class ReceiveParams:
    """What a receive asks for: ``vt`` None means the queue's visibility timeout,
    ``wait`` None means the queue's receive_wait_seconds."""

    qty: int = 1
    vt: int | None = None
    wait: float | None = None


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    removed: dict[str, int] = field(default_factory=dict)


def field_names(cls: type) -> tuple[str, ...]:
    """Names of a dataclass's fields (used to map rows onto value types)."""
    return tuple(f.name for f in dataclasses.fields(cls))
