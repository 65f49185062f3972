"""SNS topic tags: TagResource, UntagResource, ListTagsForResource (and CreateTopic's Tags)."""

from __future__ import annotations

import re
from typing import Any

from conveyor import errors
from conveyor.core import topics
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import NO_RESOURCE, SnsError, invalid

MAX_TAGS = 50
_KEY = re.compile(r"^[\w\s+\-=._:/@]{1,128}$", re.UNICODE)
_VALUE = re.compile(r"^[\w\s+\-=._:/@]{0,256}$", re.UNICODE)


def tags_of(given: list[dict[str, Any]] | None) -> dict[str, str]:
    """A Tags list ([{Key, Value}]) as a dict, each tag checked as SNS checks it."""
    tags: dict[str, str] = {}
    for tag in given or []:
        key, value = tag.get("Key"), tag.get("Value")
        if key is None or value is None:
            raise invalid("Tags", "Each tag needs a Key and a Value")
        if not _KEY.match(key) or key.lower().startswith("aws:"):
            raise invalid("Tags", f"Invalid tag key [{key}]: 1 to 128 letters, digits, spaces and + - = . _ : / @, "
                          "not starting with aws:")
        if not _VALUE.match(value):
            raise invalid("Tags", f"Invalid tag value for key [{key}]: up to 256 letters, digits, spaces and "
                          "+ - = . _ : / @")
        if key in tags:
            raise invalid("Duplicated keys are not allowed.")
        tags[key] = value
    if len(tags) > MAX_TAGS:
        raise _over_limit()
    return tags


def _over_limit() -> SnsError:
    return SnsError("TagLimitExceededException", "Could not complete request: tag quota of per resource exceeded")


def _resource(ctx: Context, arn: str | None) -> str:
    return ctx.topic_from_arn(arn, "ResourceArn")


async def _current(conn: Any, topic: str) -> dict[str, str]:
    try:
        return (await topics.get(conn, topic)).tags
    except errors.TopicNotFound:
        raise SnsError("ResourceNotFoundException", NO_RESOURCE) from None


async def tag_resource(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    topic = _resource(ctx, p.get("ResourceArn"))
    tags = tags_of(p.get("Tags"))
    if not tags:
        raise invalid("Tags")
    async with ctx.broker.connection() as conn:
        current = await _current(conn, topic)
        if len(set(current) | set(tags)) > MAX_TAGS:
            raise _over_limit()
        await topics.tag(conn, topic, tags)
    return {}


async def untag_resource(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    topic = _resource(ctx, p.get("ResourceArn"))
    keys = p.get("TagKeys")
    if not keys:
        raise invalid("TagKeys")
    async with ctx.broker.connection() as conn:
        await _current(conn, topic)
        await topics.untag(conn, topic, keys)
    return {}


async def list_tags_for_resource(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    topic = _resource(ctx, p.get("ResourceArn"))
    async with ctx.broker.connection() as conn:
        tags = await _current(conn, topic)
    return {"Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
