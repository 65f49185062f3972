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


class QueueCreate(QueueAttributes):
    name: QueueName
    fifo: bool | None = Field(None, description="must agree with the .fifo suffix if given")


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


class Message(BaseModel):
    id: int
    message: JsonValue
    headers: dict[str, Any] | None
    receive_count: int
    sent_at: datetime
    first_received_at: datetime | None
    visible_at: datetime
    group_id: str | None = None
    dedup_id: str | None = None


class ReceiveQuery(_Strict):
    max: Annotated[int, Field(ge=1, le=1000, description="messages to receive at most")] = 1
    vt: Annotated[int, Field(ge=0, le=43200, description="seconds to hide them; default: the queue's")] | None = None
    wait: Annotated[float, Field(ge=0, le=20, description="long-poll seconds; default: the queue's")] | None = None


class DeleteBatch(_Strict):
    ids: Annotated[list[MessageId], Field(min_length=1, max_length=10000)]


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


class ReceivedBatch(BaseModel):
    batch_id: int | None = Field(description="null when there is nothing to receive")
    events: list[Event]


class StreamReceiveQuery(_Strict):
    max: Annotated[int, Field(ge=1, le=10000, description=(
        "events to return at most; acknowledging finishes the whole batch, returned or not"))] = 1000
    wait: Annotated[float, Field(ge=0, le=20, description="long-poll seconds")] = 0


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
