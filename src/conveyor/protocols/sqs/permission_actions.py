"""SQS AddPermission and RemovePermission: statements in the queue's Policy document.

Conveyor keeps the policy (and returns it from GetQueueAttributes) but does not enforce
IAM; access is governed by the server's authentication settings.
"""

from __future__ import annotations

import json
import re
from typing import Any

from conveyor.core import queues
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import SqsError, invalid_value, missing

ACTIONS = {"*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes", "GetQueueUrl",
           "ListDeadLetterSourceQueues", "PurgeQueue", "ReceiveMessage", "SendMessage"}
OWNER_ONLY = {"AddPermission", "CreateQueue", "DeleteQueue", "ListQueues", "RemovePermission", "SetQueueAttributes"}
MAX_ACTIONS = 7
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def _one_or_many(items: list[str]) -> str | list[str]:
    return items[0] if len(items) == 1 else items


async def _policy(ctx: Context, conn: Any, queue: str) -> dict[str, Any]:
    raw = (await queues.get(conn, queue)).extra_attributes.get("Policy")
    if raw:
        policy: dict[str, Any] = json.loads(raw)
        return policy
    return {"Version": "2008-10-17", "Id": f"{ctx.queue_arn(queue)}/SQSDefaultPolicy", "Statement": []}


async def _save(conn: Any, queue: str, policy: dict[str, Any]) -> None:
    value = json.dumps(policy, separators=(",", ":")) if policy["Statement"] else None
    await queues.alter(conn, queue, {"extra_attributes": {"Policy": value}})


async def add_permission(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    label, accounts, actions = p.get("Label"), p.get("AWSAccountIds"), p.get("Actions")
    if not label:
        raise missing("Label")
    if not accounts:
        raise missing("AWSAccountIds")
    if not actions:
        raise missing("Actions")
    if not _LABEL.match(label):
        raise invalid_value("Label", label, "Label can contain up to 80 alphanumeric characters, hyphens and "
                            "underscores")
    if len(actions) > MAX_ACTIONS:
        raise SqsError("OverLimit", f"{len(actions)} Actions were found, maximum allowed is {MAX_ACTIONS}.")
    for action in actions:
        if action in OWNER_ONLY:
            raise invalid_value("ActionName", f"SQS:{action}", "Only the queue owner is allowed to invoke this action")
        if action not in ACTIONS:
            raise invalid_value("ActionName", f"SQS:{action}",
                                "Please refer to the appropriate WSDL for a list of valid actions")
    for account in accounts:
        if not re.fullmatch(r"\d{12}", account):
            raise invalid_value("AWSAccountId", account, "An AWS account id is 12 digits")
    async with ctx.broker.connection() as conn:
        policy = await _policy(ctx, conn, queue)
        if any(s.get("Sid") == label for s in policy["Statement"]):
            raise invalid_value("Label", label, "Already exists")
        policy["Statement"].append({
            "Sid": label,
            "Effect": "Allow",
            "Principal": {"AWS": _one_or_many([f"arn:aws:iam::{a}:root" for a in accounts])},
            "Action": _one_or_many([f"SQS:{a}" for a in actions]),
            "Resource": ctx.queue_arn(queue),
        })
        await _save(conn, queue, policy)


async def remove_permission(ctx: Context, p: dict[str, Any]) -> None:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    label = p.get("Label")
    if not label:
        raise missing("Label")
    async with ctx.broker.connection() as conn:
        policy = await _policy(ctx, conn, queue)
        kept = [s for s in policy["Statement"] if s.get("Sid") != label]
        if len(kept) == len(policy["Statement"]):
            raise invalid_value("Label", label, "can't find label on existing policy")
        policy["Statement"] = kept
        await _save(conn, queue, policy)



