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
    # where its messages are (migration 0016): "logged" (the shared tables), "unlogged" (a
    # table of its own, emptied by a crash) or "partitioned" (its own tables, partitioned
    # by id or time as ``partitioning`` says: by, interval, retention, premake)
    storage: str = "logged"
    partitioning: dict[str, Any] | None = None

    def attributes(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in QUEUE_ATTRIBUTES}

    @property
    def partitioned(self) -> bool:
        """Seed 000's ``is_partitioned``."""
        return self.storage == "partitioned"

    @property
    def unlogged(self) -> bool:
        """Seed 000's ``is_unlogged``."""
        return self.storage == "unlogged"

    @property
    def encrypted(self) -> bool:
        """Bodies are sealed with the server's key before they are stored (conveyor.crypto)."""
        return self.extra_attributes.get("encrypted") is True


@dataclass(frozen=True, slots=True)
class QueueTable:
    """A table holding a queue's messages or archive (``conveyor.queue_storage``): a shared
    table, the queue's unlogged table, or one partition of its partitioned tables (bounds
    as text, None for the DEFAULT partition)."""

    table_name: str
    holds: str  # "messages" or "archive"
    unlogged: bool
    range_from: str | None
    range_to: str | None
    is_default: bool
    est_rows: int  # the planner's estimate


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
class QueueDepth:
    """A queue's gauges as the dashboard's history last sampled them (history_latest_queues)."""

    queue_name: str
    queue_length: int
    in_flight: int
    delayed: int
    sampled_at: datetime


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
    message_uuid: UUID | None = None  # given when promised before the send (the failover spool)

    def to_json(self) -> dict[str, Any]:
        """The message as the SQL API's JSON message object (absent keys are omitted)."""
        return {k: v for k in _OUTGOING_KEYS if (v := getattr(self, k)) is not None}


_OUTGOING_KEYS = ("body", "headers", "delay", "content_type", "group_id", "dedup_id", "sender_id",
                  "system_attributes", "message_uuid")


@dataclass(frozen=True, slots=True)
class Sent:
    """What a send returns for one message; a message taken by the failover spool
    (``spooled``) has its UUID but no id yet (0)."""

    id: int
    message_uuid: UUID
    spooled: bool = False


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
    traceparent: str | None = None  # the W3C trace it is appended under (conveyor.tracing)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k in ("type", "payload", "extra1", "extra2", "extra3", "extra4", "traceparent")
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
    traceparent: str | None = None  # its producer's trace, for the consumer to continue


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
    ev_traceparent: str | None = None


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
    # FIFO queues: a repeatable receive (SQS ReceiveRequestAttemptId); a retry with the same
    # id gets the same messages again for five minutes, long poll or not
    attempt_id: str | None = None
    # in group order, one group to one consumer at a time, whatever the queue's kind (a
    # FIFO queue is always read so): seed 000's receive_fifo, REST ?fifo=true
    grouped: bool = False


@dataclass(frozen=True, slots=True)
class MessageRef:
    """A message at one delivery, as a consumer acknowledges it: ``receive_count`` is the
    count it was received at (from its receipt), None for whichever delivery is current."""

    id: int
    receive_count: int | None = None


# -- schedules (docs/schedules.md) ------------------------------------------------------------

SCHEDULE_TARGET_KINDS = ("queue", "topic")
SCHEDULE_STATUSES = ("active", "paused")


@dataclass(frozen=True, slots=True)
class ScheduleExpression:
    """A schedule expression in canonical form: a 5-field cron read in an IANA time zone
    (kind 'cron'), or one UTC instant (kind 'once'). ``source`` is what was written, e.g.
    ``{"every": "5m"}`` or ``{"when": "every monday at 8am", "timezone": "Europe/Paris"}``."""

    kind: str
    cron: str | None = None
    timezone: str = "UTC"
    fire_at: datetime | None = None
    source: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule's whole configuration (create, upsert). ``body`` is stored text; with
    ``content_type`` application/json it is JSON text."""

    expression: ScheduleExpression
    target: str
    target_kind: str = "queue"
    body: str = "{}"
    content_type: str | None = JSON_CONTENT_TYPE
    headers: dict[str, Any] | None = None
    group_id: str | None = None
    status: str | None = "active"  # None (upsert): active if new, else unchanged
    catchup: bool = False
    catchup_limit: int = 10
    failure_threshold: int = 5


@dataclass(frozen=True, slots=True)
class ScheduleChanges:
    """A partial update: None leaves a field as it is (``headers={}`` clears the headers,
    ``content_type=""`` the content type)."""

    expression: ScheduleExpression | None = None
    target: str | None = None
    target_kind: str | None = None
    body: str | None = None
    content_type: str | None = None
    headers: dict[str, Any] | None = None
    group_id: str | None = None
    status: str | None = None
    catchup: bool | None = None
    catchup_limit: int | None = None
    failure_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule (a row of ``conveyor.schedules``). ``next_fire_at`` None: the
    scheduler computes it on its next pass (a cron schedule created from SQL alone)."""

    name: str
    expression: dict[str, Any]
    cron: str | None
    timezone: str
    fire_at: datetime | None
    target_kind: str
    target: str
    body: str
    content_type: str | None
    headers: dict[str, Any] | None
    group_id: str | None
    status: str
    catchup: bool
    catchup_limit: int
    failure_threshold: int
    consecutive_failures: int
    last_error: str | None
    last_error_at: datetime | None
    last_fired_at: datetime | None
    fire_count: int
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @property
    def canonical(self) -> ScheduleExpression:
        kind = "once" if self.fire_at is not None else "cron"
        return ScheduleExpression(kind=kind, cron=self.cron, timezone=self.timezone, fire_at=self.fire_at,
                                  source={k: str(v) for k, v in (self.expression or {}).items()})


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    """What one scheduler pass did with one due schedule: the intended times it fired
    for (oldest first), where it goes next (None: a one-shot, deleted), or the error that
    made this pass fail it (and whether that paused it)."""

    name: str
    fired: tuple[datetime, ...]
    next_fire_at: datetime | None
    error: str | None = None
    paused: bool = False


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """A manual, out-of-band run: the message's id(s) and the queues it landed in (the
    target queue, or every queue subscribed to the target topic)."""

    schedule: str
    scheduled_for: datetime
    target_kind: str
    target: str
    message_id: str
    ids: tuple[int, ...] = ()
    queues: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    removed: dict[str, int] = field(default_factory=dict)


# -- topics (docs/topics.md) ---------------------------------------------------------------

SUBSCRIPTION_PROTOCOLS = ("sqs", "http", "https")
FILTER_POLICY_SCOPES = ("MessageAttributes", "MessageBody")


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic object (``conveyor.topic_info``). Its name is also the routing key an SNS
    Publish uses and the pattern an SNS Subscribe binds."""

    name: str
    fifo: bool
    attributes: dict[str, Any]
    tags: dict[str, str]
    created_at: datetime
    subscriptions: int = 0  # subscriptions whose pattern is exactly this name


@dataclass(frozen=True, slots=True)
class NewSubscription:
    """What a subscribe asks for. ``queue`` for protocol 'sqs', ``endpoint`` for
    'http'/'https'. ``filter_policy`` (a dict, or its JSON text) is validated by
    ``core.topics.subscribe`` against ``filter_policy_scope``."""

    pattern: str
    protocol: str = "sqs"
    queue: str | None = None
    endpoint: str | None = None
    raw_delivery: bool = False
    filter_policy: dict[str, Any] | str | None = None
    filter_policy_scope: str = "MessageAttributes"
    attributes: dict[str, Any] | None = None  # other SNS attributes, kept as given
    confirmed: bool = True
    queue_must_exist: bool = True  # False: an sqs subscription may name a queue yet to be created


@dataclass(frozen=True, slots=True)
class Subscription:
    """A binding of a routing-key pattern to a queue or an HTTP(S) endpoint
    (``conveyor.subscription_info``)."""

    id: int
    uuid: UUID
    pattern: str
    protocol: str
    queue: str | None
    endpoint: str | None
    raw_delivery: bool
    filter_policy: dict[str, Any] | None
    filter_policy_scope: str
    attributes: dict[str, Any]
    confirmed: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Publication:
    """A message to publish to a routing key. ``attributes`` are SNS-typed:
    ``{"name": {"DataType": "String"|"Number"|"Binary"|"String.Array"|..., "StringValue": ...}}``
    (``BinaryValue`` as base64 text). ``message_id`` None: a new UUID is generated.
    ``bodies`` optionally overrides the body per subscription protocol ('sqs', 'http',
    'https'), as SNS's MessageStructure=json does."""

    body: str
    subject: str | None = None
    attributes: dict[str, dict[str, Any]] | None = None
    group_id: str | None = None
    dedup_id: str | None = None
    delay: int | None = None
    message_id: UUID | None = None
    bodies: dict[str, str] | None = None
    content_type: str | None = None  # of the raw body, for raw deliveries into queues
    signature_version: str = "2"  # of the envelopes' signatures: "1" (SHA1) or "2" (SHA256)
    signed: bool = True  # False: envelopes carry no signature (SNS's FIFO topics)
    system_attributes: dict[str, dict[str, str]] | None = None  # given to queue copies (AWSTraceHeader)


@dataclass(frozen=True, slots=True)
class TopicUrls:
    """Where ARNs and URLs in SNS envelopes point. A routing key with a region prefix
    (``eu-west-1:orders``) gets that region in its ARN."""

    region: str = "us-east-1"
    account_id: str = "000000000000"
    base_url: str = "http://127.0.0.1:9324"

    def topic_arn(self, routing_key: str) -> str:
        region, sep, name = routing_key.rpartition(":")
        return f"arn:aws:sns:{region if sep else self.region}:{self.account_id}:{name}"

    def subscription_arn(self, pattern: str, subscription_uuid: UUID | str) -> str:
        return f"{self.topic_arn(pattern)}:{subscription_uuid}"

    def signing_cert_url(self, digest: str) -> str:
        """Where the certificate of the key whose digest this is is served, as AWS names it."""
        return f"{self.base_url}/SimpleNotificationService-{digest}.pem"

    @property
    def unsubscribe_url_prefix(self) -> str:
        """Followed by the URL-encoded subscription ARN."""
        return f"{self.base_url}/?Action=Unsubscribe&SubscriptionArn="


@dataclass(frozen=True, slots=True)
class StoredCopy:
    """The message a publish stored in one queue (a FIFO queue that dropped it as a
    duplicate: the one it kept)."""

    queue: str
    id: int
    message_uuid: UUID


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish delivered: the message id, the queues it landed in (a FIFO queue
    that dropped it as a duplicate still counts), the message stored in each, and how
    many webhook deliveries were queued."""

    message_id: UUID
    timestamp: str
    queues: tuple[str, ...]
    endpoints: int
    sequence_number: str | None = None
    messages: tuple[StoredCopy, ...] = ()

    @property
    def queues_matched(self) -> int:
        return len(self.queues)


DELIVERY_STATES = ("pending", "held", "exhausted")


@dataclass(frozen=True, slots=True)
class Delivery:
    """A webhook outbox row (``conveyor.http_deliveries``). ``subscription_arn`` and the
    SNS headers are in ``headers``; ``payload`` is the exact body to POST."""

    id: int
    subscription_id: int
    endpoint: str
    payload: str
    headers: dict[str, str]
    message_id: UUID
    attempt: int
    max_attempts: int
    next_attempt_at: datetime
    last_error: str | None
    held_reason: str | None
    created_at: datetime
    state: str = "pending"  # pending | held | exhausted

    @property
    def exhausted(self) -> bool:
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class DeliveryStats:
    pending: int
    due: int
    held: int
    exhausted: int
    oldest_pending_age: timedelta | None


def field_names(cls: type) -> tuple[str, ...]:
    """Names of a dataclass's fields (used to map rows onto value types)."""
    return tuple(f.name for f in dataclasses.fields(cls))


# -- partitioned queues (seed 004's model; migration 0009) ----------------------------------

QUEUE_MODE_GROUP = "__QUEUE_MODE__"  # the consumer group of pops that name none (queue mode)


@dataclass(frozen=True, slots=True)
class PartitionedQueue:
    """A partitioned queue's configuration (``conveyor.pqueues``)."""

    id: int
    name: str
    namespace: str | None
    task: str | None
    lease_time: int
    retry_limit: int
    priority: int
    delayed_processing: int
    window_buffer: int
    max_wait_time_seconds: int
    retention_seconds: int
    completed_retention_seconds: int
    encryption_enabled: bool
    dlq_after_max_retries: bool
    options: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A consumer group of a partitioned queue and where it starts."""

    queue_id: int
    name: str
    mode: str
    start_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ConsumerGroupLag:
    """A group's backlog on one queue (``conveyor.consumer_group_lag``)."""

    queue: str
    consumer_group: str
    mode: str
    start_at: datetime | None
    created_at: datetime
    lag: int
    partitions_behind: int
    leases: int
    oldest_pending_at: datetime | None
    last_consumed_at: datetime | None
