"""SQS queue tags: TagQueue, UntagQueue, ListQueueTags."""

from __future__ import annotations

from typing import Any

from conveyor.core import queues
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import SqsError, missing

MAX_TAGS = 50


def _check(tags: dict[str, str]) -> None:
    for key, value in tags.items():
        if not 1 <= len(key) <= 128 or len(value) > 256:
            raise SqsError("InvalidParameterValue", "Tag keys must be 1 to 128 characters and values at most "
                           "256 characters.")


async def tag_queue(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    tags = p.get("Tags")
    if not tags:
        raise missing("Tags")
    _check(tags)
    async with ctx.broker.connection() as conn:
        current = (await queues.get(conn, queue)).tags
        if len(set(current) | set(tags)) > MAX_TAGS:
            raise SqsError("InvalidParameterValue", f"Too many tags added for queue {ctx.bare(queue)}: "
                           f"a queue has at most {MAX_TAGS} tags.")
        await queues.tag(conn, queue, tags)


async def untag_queue(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    keys = p.get("TagKeys")
    if not keys:
        raise missing("TagKeys")
    async with ctx.broker.connection() as conn:
        await queues.untag(conn, queue, keys)


async def list_queue_tags(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    async with ctx.broker.connection() as conn:
        tags = (await queues.get(conn, queue)).tags
    return {"Tags": tags} if tags else {}
