"""Request and response shapes of the REST API. They validate input and are the source
of the OpenAPI document's schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, RootModel

QUEUE_NAME_PATTERN = r"^([a-z0-9-]{1,32}:)?([A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$"
QueueName = Annotated[str, Field(pattern=QUEUE_NAME_PATTERN,
                                 description="1-80 of A-Z a-z 0-9 _ -; FIFO queues end in .fifo; queues of "
                                             "another SQS region than the server's carry it as a prefix "
                                             "(eu-west-1:jobs)")]
MessageId = Annotated[int, Field(ge=1, le=2**63 - 1)]
GroupId = Annotated[str, Field(pattern=r"^[!-~]{1,128}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
