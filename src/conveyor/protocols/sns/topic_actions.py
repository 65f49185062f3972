"""SNS topic actions: CreateTopic, DeleteTopic, ListTopics, GetTopicAttributes,
SetTopicAttributes."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from conveyor import errors, types
from conveyor.core import topics
from conveyor.protocols.sns import tag_actions
from conveyor.protocols.sns import topic_attributes as attrs
from conveyor.protocols.sns.context import Context, is_valid_topic_name
from conveyor.protocols.sns.errors import NO_TOPIC, invalid, not_found

PAGE = 100  # SNS lists topics and subscriptions 100 at a time


async def get_topic(ctx: Context, conn: Any, topic: str) -> types.Topic:
    """The topic, or SNS's NotFound."""
    try:
        return await topics.get(conn, topic)
    except errors.TopicNotFound:
        raise not_found(NO_TOPIC) from None


async def create_topic(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    name = p.get("Name")
    if not name or not is_valid_topic_name(name):
        raise invalid("Topic Name")
    given = p.get("Attributes") or {}
    if p.get("DataProtectionPolicy") is not None:
        given = {**given, "DataProtectionPolicy": p["DataProtectionPolicy"]}
    wanted = attrs.for_create(name, given)
    tags = tag_actions.tags_of(p.get("Tags"))
    internal = ctx.internal(name)
    async with ctx.broker.connection() as conn:
        try:
            existing = await topics.get(conn, internal)
        except errors.TopicNotFound:
            existing = None
        if existing is not None and any(existing.attributes.get(k) != v for k, v in wanted.items()):
            raise invalid("Attributes", "Topic already exists with different attributes")
        if existing is not None and any(existing.tags.get(k) != v for k, v in tags.items()):
            raise invalid("Tags", "Topic already exists with different tags")
        await topics.create(conn, internal, wanted, tags)
    return {"TopicArn": ctx.topic_arn(internal)}


async def delete_topic(ctx: Context, p: dict[str, Any]) -> None:
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    async with ctx.broker.connection() as conn:
        await topics.delete(conn, topic)  # deleting a topic that does not exist succeeds, as on SNS


async def list_topics(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    after = decode_token(p.get("NextToken"))
    found = await visible_topics(ctx, after, PAGE + 1)
    out: dict[str, Any] = {"Topics": [{"TopicArn": ctx.topic_arn(t.name)} for t in found[:PAGE]]}
    if len(found) > PAGE:
        out["NextToken"] = encode_token(found[PAGE - 1].name)
    return out


async def visible_topics(ctx: Context, after: str, wanted: int) -> list[types.Topic]:
    """Up to ``wanted`` topics of the request's region, by name, after ``after``."""
    prefix = None if ctx.region == ctx.default_region else f"{ctx.region}:"
    found: list[types.Topic] = []
    async with ctx.broker.connection() as conn:
        while len(found) < wanted:
            page = await topics.list_all(conn, prefix=prefix, after=after or None, limit=wanted * 2)
            found += [t for t in page if ctx.visible(t.name)]
            if len(page) < wanted * 2:
                break
            after = page[-1].name
    return found[:wanted]


def encode_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def decode_token(token: str | None) -> str:
    if not token:
        return ""
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid("NextToken") from None


async def get_topic_attributes(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    async with ctx.broker.connection() as conn:
        found = await get_topic(ctx, conn, topic)
        pending = 0
        if found.subscriptions:  # those waiting for their endpoint's confirmation
            pending = sum(not s.confirmed for s in await topics.subscriptions_list(conn, pattern=topic))
    return {"Attributes": attrs.render(ctx, found, pending)}


async def set_topic_attributes(ctx: Context, p: dict[str, Any]) -> None:
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    name = p.get("AttributeName")
    if not name:
        raise invalid("AttributeName")
    value = p.get("AttributeValue") or ""
    async with ctx.broker.connection() as conn:
        found = await get_topic(ctx, conn, topic)
        attrs.check(name, value, fifo=found.fifo, creating=False)
        await topics.set_attributes(conn, topic, {name: attrs.stored(name, value) if value != "" else None})
