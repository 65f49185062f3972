"""Request and response shapes of the REST API. They validate input and are the source
of the OpenAPI document's schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, RootModel

QUEUE_NAME_PATTERN = r"^([a-z0-9-]{1,32}:)?([A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$"
QueueName = Annotated[str, Field(pattern=QUEUE_NAME_PATTERN,
                                 description="1-80 of A-Z a-z 0-9 _ -; FIFO queues end in .fifo; queues of "
                                             "another SQS region than the server's carry it as a prefix "
                                             "(eu-west-1:jobs)")]
MessageId = Annotated[int, Field(ge=1, le=2**63 - 1)]
GroupId = Annotated[str, Field(pattern=r"^[!-~]{1,128}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _StrictBody(BaseModel):
    """A JSON body: no unknown fields, and JSON types as declared (no "5" for 5, no true
    for 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class QueueAttributes(_Strict):
    visibility_timeout: Annotated[int, Field(ge=0, le=43200)] | None = None
    delay_seconds: Annotated[int, Field(ge=0, le=900)] | None = None
    retention_seconds: Annotated[int, Field(ge=60, le=1209600)] | None = None
    max_message_size: Annotated[int, Field(ge=1024, le=1048576)] | None = None
    receive_wait_seconds: Annotated[int, Field(ge=0, le=20)] | None = None
    max_receive_count: Annotated[int, Field(ge=1, le=1000,
                                            description="hq's max_attempts: deliveries before the message is dead-lettered")] | None = None
    dead_letter_queue: QueueName | None = None
    content_based_deduplication: bool | None = None
    encrypted: bool | None = Field(None, description=(
        "seal message bodies with the server's key (AES-256-GCM, CONVEYOR_ENCRYPTION_KEY) before they are "
        "stored; messages already stored keep their form"))


PartitionSpan = Annotated[int, Field(ge=1)] | str


class QueueCreate(QueueAttributes):
    name: QueueName
    fifo: bool | None = Field(None, description=(
        "true creates a FIFO queue: a name without the .fifo suffix gets it (orders -> orders.fifo, the "
        "queue's one name in REST paths, SQS and SQL); false refuses a name ending in .fifo"))
    storage: Literal["logged", "unlogged", "partitioned"] | None = Field(None, description=(
        "where the messages are kept, chosen once: logged (default, the shared tables), unlogged (a table "
        "of its own without WAL: faster, emptied by a crash, not on replicas) or partitioned (tables of its "
        "own partitioned by id or time, old partitions dropped whole); docs/rest-api.md"))
    partition_interval: PartitionSpan | None = Field(None, description=(
        "partitioned: a number of message ids per partition (default 10000), or a time interval such as "
        "'1 day' (at least a minute; whole months when it has months)"))
    partition_retention: PartitionSpan | None = Field(None, description=(
        "partitioned: partitions this many ids behind the newest, or older than this interval, are dropped "
        "with their messages by maintenance (default: kept)"))
    partition_premake: Annotated[int, Field(ge=1, le=100)] | None = Field(None, description=(
        "partitioned: partitions made ahead of the current one (default 4)"))


class Queue(BaseModel):
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
    encrypted: bool
    is_partitioned: bool = Field(description="stored in partitions of its own (storage partitioned)")
    is_unlogged: bool = Field(description="stored unlogged: faster, emptied by a crash (storage unlogged)")
    storage: Literal["logged", "unlogged", "partitioned"]
    partitioning: dict[str, Any] | None = Field(description=(
        "partitioned: by (id or time), interval, retention (null: none) and premake"))
    created_at: datetime
    updated_at: datetime


class QueueDetail(Queue):
    queue_length: int
    in_flight: int
    delayed: int
    newest_msg_age_sec: int | None
    oldest_msg_age_sec: int | None
    total_messages: int
    dead_letter_length: int
    scrape_time: datetime


class MessageIn(_Strict):
    message: JsonValue = Field(description="a string is stored as is; any other JSON value as its JSON text")
    headers: dict[str, JsonValue] | None = None
    delay: Annotated[int, Field(ge=0, le=900)] | None = None
    group_id: GroupId | None = Field(None, description="FIFO queues: the message group")
    dedup_id: GroupId | None = Field(None, description="FIFO queues: the deduplication id")


class SendBatch(RootModel[Annotated[list[MessageIn], Field(min_length=1, max_length=10000)]]):
    pass


class Sent(BaseModel):
    id: int


class SentBatch(BaseModel):
    ids: list[int]


Receipt = Annotated[str, Field(min_length=1, max_length=1024, description=(
    "the receipt of one delivery, from the receive; only the newest delivery's receipt acts"))]


class Message(BaseModel):
    id: int
    receipt: str = Field(description="give it back to delete, complete, fail or change the visibility of "
                                     "this delivery; stale once the message is received again")
    message: JsonValue
    headers: dict[str, Any] | None
    receive_count: int
    sent_at: datetime
    first_received_at: datetime | None
    visible_at: datetime
    group_id: str | None = None
    dedup_id: str | None = None
    sender_id: str | None = Field(None, description="who sent it, as the server verified (a JWT's sub, an "
                                                    "AWS access key id); clients cannot set it")


class ReceiveQuery(_Strict):
    max: Annotated[int, Field(ge=1, le=1000, description="messages to receive at most")] = 1
    vt: Annotated[int, Field(ge=0, le=43200, description="seconds to hide them; default: the queue's")] | None = None
    wait: Annotated[float, Field(ge=0, le=20, description="long-poll seconds; default: the queue's")] | None = None
    fifo: bool = Field(False, description=(
        "read in group order, one message group to one consumer at a time (seed 000's receive_fifo): on a "
        "standard queue by the group_id its messages carry, messages without one forming one group; a FIFO "
        "queue is always read this way"))


class DeleteBatch(_Strict):
    ids: Annotated[list[MessageId], Field(min_length=1, max_length=10000, description=(
        "delete by id, whatever delivery is current (an administrative act)"))] | None = None
    receipts: Annotated[list[Receipt], Field(min_length=1, max_length=10000, description=(
        "delete these deliveries: a message received again since is left alone"))] | None = None


class ReceiptQuery(_Strict):
    receipt: Receipt | None = Field(None, description=(
        "act only while this delivery is current (409 StaleReceipt once the message was received again); "
        "without it the message is acted on by id, whatever delivery is current"))


class Deleted(BaseModel):
    deleted: list[int]


class Purged(BaseModel):
    deleted: int


class Visibility(_Strict):
    vt: Annotated[int, Field(ge=0, le=43200, description="seconds from now until visible again")]


class VisibilityChanged(BaseModel):
    id: int
    visible_at: datetime


class Fail(_Strict):
    error: Annotated[str, Field(max_length=10000)] | None = None


class Error(BaseModel):
    error: str
    code: str


# -- streams -----------------------------------------------------------------------------

STREAM_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,80}$"
# The SQL's consumer names (^[A-Za-z0-9_.:-]{1,80}$) except "." and "..", which a URL path
# cannot carry (clients collapse them as dot segments).
CONSUMER_NAME_PATTERN = (r"^([A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,79}|\.[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,78}"
                         r"|\.\.[A-Za-z0-9_.:-]{1,78})$")
StreamName = Annotated[str, Field(pattern=STREAM_NAME_PATTERN,
                                  description="1-80 of A-Z a-z 0-9 _ -")]
ConsumerName = Annotated[str, Field(pattern=CONSUMER_NAME_PATTERN,
                                    description="1-80 of A-Z a-z 0-9 _ . : - (not . or ..)")]


def _integral(value: Any) -> Any:
    """JSON has numbers, not integers: 2.0 is the integer 2 (as JSON Schema has it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# in strict bodies: no "2", no true, but 2.0 (after the constraints, which then stay
# JSON Schema's minimum and maximum in the document)
Integral = BeforeValidator(_integral)
EventId = Annotated[int, Field(ge=1, le=2**63 - 1), Integral]
MAX_SECONDS = 315_360_000  # ten years: the longest interval the REST API takes


def _no_nul(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("PostgreSQL text cannot hold NUL (\\u0000) characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": "^[^\\u0000]*$"})]
Reason = Annotated[Text, Field(max_length=10000)]


# The default of options that may be left out but not set to null (None, typed Any so
# that a non-optional annotation may have it; pydantic does not validate defaults).
UNSET: Any = None


def _no_null_default(schema: dict[str, Any]) -> None:
    """Options that may be left out but not set to null: the document says so (no
    ``"default": null`` on a non-nullable property)."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop and prop["default"] is None and "anyOf" not in prop:
            del prop["default"]


class StreamOptions(_StrictBody):
    """A stream's options; intervals are seconds (JSON numbers, fractions allowed).
    Left out: unchanged (or the default, on create); null is only meaningful for event_ttl."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_no_null_default)

    rotation_period: Annotated[float, Field(ge=1, le=MAX_SECONDS, description=(
        "seconds between rotations of the event tables (default 7200)"))] = UNSET
    ticker_max_count: Annotated[int, Field(ge=1, le=1000000, description=(
        "tick once this many events arrived (default 500)")), Integral] = UNSET
    ticker_max_lag: Annotated[float, Field(ge=0, le=MAX_SECONDS, description=(
        "seconds: tick when events arrived and the last tick is this old (default 3)"))] = UNSET
    ticker_idle_period: Annotated[float, Field(ge=0, le=MAX_SECONDS, description=(
        "seconds: tick anyway after this long (default 60)"))] = UNSET
    max_retries: Annotated[int, Field(ge=0, le=1000, description=(
        "nacks of an event before it is dead-lettered (default 5)")), Integral] = UNSET
    event_ttl: Annotated[float, Field(gt=0, le=MAX_SECONDS, description=(
        "seconds: older events are skipped by consumers; null: no limit (the default)"))] | None = None
    ticker_paused: Annotated[bool, Field(description="stop ticking: no new batches")] = UNSET


class StreamCreate(StreamOptions):
    name: StreamName


class Stream(BaseModel):
    name: str
    rotation_period: float = Field(description="seconds")
    ticker_max_count: int
    ticker_max_lag: float = Field(description="seconds")
    ticker_idle_period: float = Field(description="seconds")
    ticker_paused: bool
    max_retries: int
    event_ttl: float | None = Field(description="seconds; null: events never expire")
    cur_table: int
    switch_time: datetime
    created_at: datetime
    consumers: int = Field(description="how many consumers are subscribed")
    channel: str = Field(description="PostgreSQL LISTEN channel announcing this stream's ticks")


class StreamStats(BaseModel):
    stream: str
    depth: int = Field(description="events not yet consumed by the slowest consumer")
    oldest_event_age: float | None = Field(description="seconds")
    consumers: int
    events_per_sec: float | None
    cur_table: int
    rotation_age: float = Field(description="seconds since the last rotation")
    rotation_period: float = Field(description="seconds")
    ticker_paused: bool
    last_tick_time: datetime | None
    last_tick_id: int | None
    dead_letters: int
    pending_retries: int
    delayed: int


class ConsumerStats(BaseModel):
    name: str
    lag: float | None = Field(description="seconds behind the stream's latest tick")
    pending_events: int
    last_seen: datetime
    batch_active: bool
    batch_id: int | None
    batch_age: float | None = Field(description="seconds the open batch has been open")


class StreamDetail(Stream):
    stats: StreamStats
    consumer_stats: list[ConsumerStats]


class HealthCheck(BaseModel):
    check: str
    status: str = Field(description="ok, warning or critical")
    detail: str | None


class StreamStatsReport(StreamStats):
    health: list[HealthCheck]


class EventIn(_StrictBody):
    payload: Annotated[JsonValue, AfterValidator(_no_nul)] = Field(
        description="a string is stored as is; any other JSON value as its compact JSON text")
    type: Annotated[Text, Field(min_length=1, max_length=1000)] = "default"
    extra1: Text | None = None
    extra2: Text | None = None
    extra3: Text | None = None
    extra4: Text | None = None


class EventBatch(RootModel[Annotated[list[EventIn], Field(min_length=1, max_length=10000)]]):
    pass


class Event(BaseModel):
    id: int
    type: str | None
    payload: str | None = Field(description="the stored text: a string as it was appended; "
                                            "any other JSON value as its compact JSON text")
    retry_count: int | None = Field(description="null on first delivery; n on the n-th retry")
    created_at: datetime
    extra1: str | None
    extra2: str | None
    extra3: str | None
    extra4: str | None
    traceparent: str | None = Field(None, description="the W3C trace context the event was appended under "
                                                      "(present when the producer was traced)")


class ReceivedBatch(BaseModel):
    batch_id: int | None = Field(description="null when there is nothing to receive")
    events: list[Event]
    complete: bool = Field(description=(
        "false while the batch has more events than were returned: receive the rest with "
        "after=<the last event's id>; the batch cannot be acknowledged before (409 BatchPartlyReceived)"))


class StreamReceiveQuery(_Strict):
    max: Annotated[int, Field(ge=1, le=10000, description=(
        "events to return at most (a page of the batch)"))] = 1000
    wait: Annotated[float, Field(ge=0, le=20, description="long-poll seconds")] = 0
    after: Annotated[int, Field(ge=0, le=2**63 - 1, description=(
        "the open batch's events after this event id (its next page)"))] | None = None


class Subscription(_StrictBody):
    name: ConsumerName


class Consumer(BaseModel):
    stream: str
    name: str


class Nack(_StrictBody):
    event_id: EventId
    retry_after: Annotated[int, Field(ge=0, le=MAX_SECONDS, description="seconds until the retry"), Integral] = 60
    reason: Reason | None = Field(None, description="kept with the dead letter if this nack dead-letters it")


class Nacked(BaseModel):
    outcome: Literal["retry", "dead"]


class DeadLetterRequest(_StrictBody):
    event_id: EventId
    reason: Reason | None = None


class DeadLetter(BaseModel):
    id: int
    consumer: str
    dead_at: datetime
    reason: str | None
    event: Event


class DeadLettersQuery(_Strict):
    max: Annotated[int, Field(ge=1, le=10000, description="dead letters to list at most (oldest first)")] = 100


class PurgeQuery(_Strict):
    older_than: Annotated[float, Field(ge=0, le=MAX_SECONDS, description=(
        "seconds: purge dead letters older than this; 0 (the default) purges all"))] = 0


class Replayed(BaseModel):
    event_id: int


class ReplayedAll(BaseModel):
    replayed: int


class DeadLettersPurged(BaseModel):
    purged: int


# -- events (topics) ------------------------------------------------------------------------

FilterPolicyScope = Literal["MessageAttributes", "MessageBody"]
# Dot-separated segments of [A-Za-z0-9_-] (a pattern's may also be * or #), up to 256
# characters after an optional region prefix; the SQL API checks the length.
ROUTING_KEY_PATTERN = r"^([a-z0-9-]{1,32}:)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
ROUTING_PATTERN_PATTERN = r"^([a-z0-9-]{1,32}:)?([A-Za-z0-9_-]+|\*|#)(\.([A-Za-z0-9_-]+|\*|#))*$"


class PublishIn(_StrictBody):
    message: JsonValue = Field(description="a string is published as is; any other JSON value as its JSON text")
    headers: dict[str, JsonValue] | None = Field(None, description=(
        "message attributes: a string becomes a String attribute, a number a Number, a list of "
        "strings and numbers a String.Array, anything else its JSON text; filter policies match them"))
    subject: Annotated[str, Field(min_length=1, max_length=100)] | None = Field(
        None, description="the envelope's Subject")
    delay: Annotated[int, Field(ge=0, le=900)] | None = Field(
        None, description="seconds before the queue copies become visible (standard queues)")
    group_id: GroupId | None = Field(None, description="FIFO routing keys (ending in .fifo): the message group")
    dedup_id: GroupId | None = Field(None, description="FIFO routing keys: the deduplication id")


class StoredCopy(BaseModel):
    queue: str
    id: int = Field(description="the message's id in that queue (for GET, DELETE and PATCH of messages)")
    message_id: str


class Published(BaseModel):
    message_id: str
    queues_matched: int
    endpoints_matched: int
    queues: list[str]
    sequence_number: str | None = None
    messages: list[StoredCopy] = Field(description="the message stored in each matched queue")


class EventSubscriptionIn(_StrictBody):
    queue_name: QueueName | None = Field(None, description="deliver into this queue (protocol sqs)")
    protocol: Literal["sqs", "http", "https"] | None = Field(
        None, description="sqs (the default with queue_name), http or https (with endpoint)")
    endpoint: Annotated[str, Field(min_length=8, max_length=2048)] | None = Field(
        None, description="the URL deliveries are POSTed to (protocol http or https)")
    envelope: bool = Field(False, description="deliver the signed SNS envelope instead of the raw message")
    filter_policy: dict[str, JsonValue] | None = Field(None, description="an SNS subscription filter policy")
    filter_policy_scope: FilterPolicyScope = "MessageAttributes"


class SubscriptionsQuery(_Strict):
    after: Annotated[int, Field(ge=0, le=2**63 - 1, description="list subscriptions with a greater id")] = 0
    max: Annotated[int, Field(ge=1, le=1000, description="subscriptions to list at most")] = 1000


class EventSubscription(BaseModel):
    id: int
    uuid: str
    pattern: str
    protocol: str
    queue: str | None
    endpoint: str | None
    envelope: bool
    filter_policy: dict[str, Any] | None
    filter_policy_scope: str
    confirmed: bool
    created_at: datetime


# -- schedules ------------------------------------------------------------------------------

SCHEDULE_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}$"
ScheduleName = Annotated[str, Field(pattern=SCHEDULE_NAME_PATTERN,
                                    description="1-128 of A-Z a-z 0-9 _ - . : (not starting with a dot)")]
ScheduleStatus = Literal["active", "paused"]
ScheduleTargetKind = Literal["queue", "topic"]


class _ScheduleExpressionIn(_StrictBody):
    """Exactly one of cron, every, when and fire_at (docs/schedules.md)."""

    cron: Annotated[Text, Field(max_length=200, description=(
        "five fields: minute hour day-of-month month day-of-week, or @hourly, @daily, @weekly, @monthly, "
        "@yearly"))] | None = None
    every: Annotated[Text, Field(max_length=40, description=(
        "an interval cron can repeat: 30m, 2h, 1d, 1w (minutes dividing an hour, hours dividing a day)"))] | None = None
    when: Annotated[Text, Field(max_length=200, description=(
        "a small English form: hourly, daily, every 15 minutes, every day at 09:00, every monday at 8am, "
        "every weekday at 17:30"))] | None = None
    fire_at: Annotated[Text, Field(max_length=64, description=(
        "one ISO 8601 instant (a one-shot schedule); without an offset it is read in timezone"))] | None = None
    timezone: Annotated[Text, Field(max_length=64, description="an IANA time zone (default UTC)")] | None = None


class ScheduleIn(_ScheduleExpressionIn):
    """A whole schedule configuration (PUT replaces every field; left out: the default)."""

    target_kind: ScheduleTargetKind = Field("queue", description="where fired messages go")
    target: Annotated[Text, Field(min_length=1, max_length=256, description=(
        "the queue's name, or the topic's routing key"))]
    message: JsonValue = Field(default_factory=dict, description=(
        "the body of every fired message: a string as is, any other JSON value as its JSON text (default {})"))
    headers: dict[str, JsonValue] | None = Field(None, description=(
        "headers of every fired message (topic targets: message attributes); _schedule is added"))
    group_id: GroupId | None = Field(None, description="FIFO targets: the message group (default: the schedule's name)")
    status: ScheduleStatus | None = Field(None, description=(
        "active or paused; left out: active for a new schedule, unchanged for an existing one"))
    catchup: bool = Field(False, description="after downtime, fire missed occurrences (up to catchup_limit)")
    catchup_limit: Annotated[int, Field(ge=1, le=1000), Integral] = Field(10, description=(
        "the most missed occurrences one pass fires (the latest ones)"))
    failure_threshold: Annotated[int, Field(ge=1, le=1000), Integral] = Field(5, description=(
        "consecutive failed fires after which the schedule is paused"))


class ScheduleCreate(ScheduleIn):
    name: ScheduleName


class SchedulePatch(_ScheduleExpressionIn):
    """Fields to change; left out: unchanged. A new expression or a resume restarts the
    schedule from now. headers null clears the headers."""

    target_kind: ScheduleTargetKind | None = None
    target: Annotated[Text, Field(min_length=1, max_length=256)] | None = None
    message: JsonValue = None
    headers: dict[str, JsonValue] | None = None
    group_id: GroupId | None = None
    status: ScheduleStatus | None = Field(None, description="paused pauses it; active resumes it")
    catchup: bool | None = None
    catchup_limit: Annotated[int, Field(ge=1, le=1000), Integral] | None = None
    failure_threshold: Annotated[int, Field(ge=1, le=1000), Integral] | None = None


class Schedule(BaseModel):
    name: str
    kind: str = Field(description="cron, or once (a one-shot, deleted after it fires)")
    expression: dict[str, str] = Field(description="what the schedule was written as")
    cron: str | None = Field(description="the canonical cron expression (kind cron)")
    timezone: str
    fire_at: datetime | None = Field(description="the instant of a one-shot")
    human_readable: str
    target_kind: str
    target: str
    message: JsonValue
    headers: dict[str, Any] | None
    group_id: str | None
    status: str
    catchup: bool
    catchup_limit: int
    failure_threshold: int
    consecutive_failures: int
    last_error: str | None
    last_error_at: datetime | None
    last_fired_at: datetime | None = Field(description="the intended time of the latest fire")
    fire_count: int
    next_fire_at: datetime | None = Field(description="null: computed by the scheduler's next pass")
    next_fires: list[datetime] = Field(description="the next intended fire times (none while paused)")
    created_at: datetime
    updated_at: datetime


class ScheduleList(RootModel[list[Schedule]]):
    pass


class ScheduleListQuery(_Strict):
    status: ScheduleStatus | None = None
    target_kind: ScheduleTargetKind | None = None
    name_prefix: Annotated[str, Field(max_length=128)] | None = None
    limit: Annotated[int, Field(ge=1, le=1000, description="at most this many (the hard cap is 1000)")] = 1000


class ScheduleRun(BaseModel):
    schedule: str
    scheduled_for: datetime
    out_of_band: bool
    target_kind: str
    target: str
    message_id: str = Field(description="the fired message's UUID (topic targets: the publication's)")
    msg_ids: list[int] = Field(description="queue targets: the message id in the queue")
    queues: list[str] = Field(description="the queues the message landed in")


class PreviewIn(_ScheduleExpressionIn):
    count: Annotated[int, Field(ge=0, le=100), Integral] = Field(5, description="how many fire times to list")
    after: Annotated[Text, Field(max_length=64)] | None = Field(None, description=(
        "list fire times after this ISO 8601 instant (default: now)"))


class Preview(BaseModel):
    kind: str = Field(description="cron, or once")
    cron: str | None
    timezone: str
    fire_at: datetime | None
    human_readable: str
    next_fires: list[datetime]
