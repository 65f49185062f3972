"""SNS AddPermission and RemovePermission: statements in the topic's Policy attribute.

The policy is the one GetTopicAttributes answers — the stored Policy, or SNS's default
policy of the topic — with a statement added (Sid: the label; Principal: the accounts'
root ARNs; Action: ``SNS:<ActionName>``; Resource: the topic) or the statements of a
label removed, then stored as the topic's Policy. As for SQS, Conveyor keeps the policy
but does not enforce it: access is governed by the server's authentication settings.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.core import topics
from conveyor.protocols.sns import topic_actions
from conveyor.protocols.sns import topic_attributes as attrs
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import invalid

# the actions a topic policy statement may name (SNS's service scope)
ACTIONS = frozenset({"GetTopicAttributes", "SetTopicAttributes", "AddPermission", "RemovePermission",
                     "DeleteTopic", "Subscribe", "ListSubscriptionsByTopic", "Publish", "Receive"})


def _one_or_many(items: list[str]) -> str | list[str]:
    return items[0] if len(items) == 1 else items


async def _policy(ctx: Context, conn: Any, topic: str) -> dict[str, Any]:
    found = await topic_actions.get_topic(ctx, conn, topic)
    policy: dict[str, Any] = json.loads(attrs.render(ctx, found)["Policy"])
    if not isinstance(policy.get("Statement"), list):  # a stored policy of a single statement
        policy["Statement"] = [policy["Statement"]] if "Statement" in policy else []
    return policy


async def _save(conn: Any, topic: str, policy: dict[str, Any]) -> None:
    await topics.set_attributes(conn, topic, {"Policy": json.dumps(policy, separators=(",", ":"))})


async def add_permission(ctx: Context, p: dict[str, Any]) -> None:
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    label, accounts, actions = p.get("Label"), p.get("AWSAccountId"), p.get("ActionName")
    if not label:
        raise invalid("Label")
    if not accounts or not all(accounts):
        raise invalid("AWSAccountId")
    if not actions:
        raise invalid("ActionName")
    async with ctx.broker.connection() as conn:
        policy = await _policy(ctx, conn, topic)
        if any(isinstance(s, dict) and s.get("Sid") == label for s in policy["Statement"]):
            raise invalid("Statement already exists")
        if any(action not in ACTIONS for action in actions):
            raise invalid("Policy statement action out of service scope!")
        policy["Statement"].append({
            "Sid": label,
            "Effect": "Allow",
            "Principal": {"AWS": _one_or_many([f"arn:aws:iam::{a}:root" for a in accounts])},
            "Action": _one_or_many([f"SNS:{a}" for a in actions]),
            "Resource": ctx.topic_arn(topic),
        })
        await _save(conn, topic, policy)


async def remove_permission(ctx: Context, p: dict[str, Any]) -> None:
    """Removes the label's statements; a label the policy does not have changes nothing."""
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    label = p.get("Label")
    if not label:
        raise invalid("Label")
    async with ctx.broker.connection() as conn:
        policy = await _policy(ctx, conn, topic)
        kept = [s for s in policy["Statement"] if not (isinstance(s, dict) and s.get("Sid") == label)]
        if len(kept) != len(policy["Statement"]):
            policy["Statement"] = kept
            await _save(conn, topic, policy)
