"""SQS queue actions: CreateQueue, DeleteQueue, GetQueueUrl, GetQueueAttributes,
SetQueueAttributes, ListQueues, PurgeQueue, ListDeadLetterSourceQueues."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any

from conveyor import errors
from conveyor.core import queues
from conveyor.protocols.sqs import queue_attributes as attrs
from conveyor.protocols.sqs.context import Context, is_valid_name
from conveyor.protocols.sqs.errors import NO_QUEUE, SqsError, invalid_value, missing

PURGE_INTERVAL = dt.timedelta(seconds=60)


async def create_queue(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    name = p.get("QueueName")
    if not name:
        raise missing("QueueName")
    if not is_valid_name(name):
        raise SqsError("InvalidParameterValue", "Can only include alphanumeric characters, hyphens, or "
                       "underscores. 1 to 80 in length")
    internal = ctx.internal(name)
    fifo = name.endswith(".fifo")
    given = p.get("Attributes") or {}
    if "FifoQueue" not in given and fifo:
        raise SqsError("InvalidParameterValue", "The name of a FIFO queue can only include alphanumeric "
                       "characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length.")
    wanted = attrs.to_conveyor(ctx, given, fifo=fifo, creating=True, queue=internal)
    async with ctx.broker.connection() as conn:
        await _check_dead_letter_target(ctx, conn, internal, wanted)
        try:
            await queues.create(conn, internal, wanted)
        except errors.QueueAlreadyExists:
            raise SqsError("QueueNameExists", f"A queue already exists with the same name and a different "
                           f"value for attribute(s) {', '.join(sorted(given))}.") from None
        if p.get("tags"):
            await queues.tag(conn, internal, p["tags"])
    return {"QueueUrl": ctx.url(internal)}


async def _check_dead_letter_target(ctx: Context, conn: Any, queue: str, wanted: dict[str, Any]) -> None:
    target = wanted.get("dead_letter_queue")
    if not target:
        return
    try:
        dead_letter_queue = await queues.get(conn, target)
    except errors.QueueNotFound:
        raise invalid_value("RedrivePolicy", ctx.queue_arn(target), "Dead letter target does not exist") from None
    attrs.check_redrive_allowed(ctx, queue, dead_letter_queue)


async def delete_queue(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    async with ctx.broker.connection() as conn:
        if not await queues.drop(conn, queue):
            raise SqsError("QueueDoesNotExist", NO_QUEUE)


async def get_queue_url(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    name = p.get("QueueName")
    if not name:
        raise missing("QueueName")
    owner = p.get("QueueOwnerAWSAccountId")
    if not is_valid_name(name) or (owner and owner != ctx.account_id):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    internal = ctx.internal(name)
    async with ctx.broker.connection() as conn:
        await queues.get(conn, internal)
    return {"QueueUrl": ctx.url(internal)}


async def get_queue_attributes(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    names = p.get("AttributeNames") or []
    async with ctx.broker.connection() as conn:
        q = await queues.get(conn, queue)
        needs_counts = "All" in names or any(n in attrs.COUNTS for n in names)
        metrics = await queues.metrics(conn, queue) if needs_counts else None
    found = attrs.from_conveyor(ctx, q, metrics, names)
    return {"Attributes": found} if found else {}


async def set_queue_attributes(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    given = p.get("Attributes")
    if given is None:
        raise missing("Attribute.1.Name")
    async with ctx.broker.connection() as conn:
        q = await queues.get(conn, queue)
        wanted = attrs.to_conveyor(ctx, given, fifo=q.fifo, creating=False, queue=queue)
        await _check_dead_letter_target(ctx, conn, queue, wanted)
        await queues.alter(conn, queue, wanted)


async def list_queues(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    prefix = ctx.internal(p.get("QueueNamePrefix") or "")
    max_results = p.get("MaxResults")
    if max_results is not None and not 1 <= max_results <= 1000:
        raise invalid_value("MaxResults", max_results, "MaxResults must be an integer between 1 and 1000")
    after = _token(p.get("NextToken"))
    async with ctx.broker.connection() as conn:
        found = [q.name for q in await queues.list_all(conn, prefix) if ctx.visible(q.name)]
    page = _page(ctx, [n for n in found if n > after], max_results)
    if not page["QueueUrls"]:
        del page["QueueUrls"]  # AWS leaves the member out when no queue matches
    return page


def _page(ctx: Context, names: list[str], max_results: int | None, key: str = "QueueUrls") -> dict[str, Any]:
    limit = max_results or 1000
    out: dict[str, Any] = {key: [ctx.url(n) for n in names[:limit]]}
    if max_results is not None and len(names) > limit:
        out["NextToken"] = base64.urlsafe_b64encode(names[limit - 1].encode()).decode()
    return out


def _token(token: str | None) -> str:
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid_value("NextToken", token, "Invalid NextToken value") from None


async def purge_queue(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    async with ctx.broker.connection() as conn:
        q = await queues.get(conn, queue)
        if q.purged_at is not None and dt.datetime.now(dt.UTC) - q.purged_at < PURGE_INTERVAL:
            raise SqsError("PurgeQueueInProgress",
                           f"Only one PurgeQueue operation on {ctx.bare(queue)} is allowed every 60 seconds.")
        await queues.purge(conn, queue)


async def list_dead_letter_source_queues(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    after = _token(p.get("NextToken"))
    max_results = p.get("MaxResults")
    if max_results is not None and not 1 <= max_results <= 1000:
        raise invalid_value("MaxResults", max_results, "MaxResults must be an integer between 1 and 1000")
    async with ctx.broker.connection() as conn:
        await queues.get(conn, queue)
        sources = [q.name for q in await queues.list_all(conn) if q.dead_letter_queue == queue]
    return _page(ctx, [n for n in sources if n > after], max_results, key="queueUrls")
