"""SQS queue attributes <-> Conveyor queue attributes, with AWS's validation.

Attributes Conveyor acts on map to its own (VisibilityTimeout -> visibility_timeout,
RedrivePolicy -> dead_letter_queue + max_receive_count ...). Attributes it keeps without
acting on them (Policy, KMS settings, FifoThroughputLimit) are stored verbatim in the
queue's ``extra_attributes`` and returned as given; so are the SSE settings and
DeduplicationScope, beside the engine's own keys they set there (``encrypted``,
``dedup_scope``: "group" deduplicates per message group, migration 0024).
"""

from __future__ import annotations

import json
from typing import Any

from conveyor import json_input, types
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import SqsError, invalid_value

INTEGERS = {  # SQS name: (Conveyor attribute, lowest, highest)
    "DelaySeconds": ("delay_seconds", 0, 900),
    "MaximumMessageSize": ("max_message_size", 1024, 1048576),
    "MessageRetentionPeriod": ("retention_seconds", 60, 1209600),
    "ReceiveMessageWaitTimeSeconds": ("receive_wait_seconds", 0, 20),
    "VisibilityTimeout": ("visibility_timeout", 0, 43200),
}
KEPT = ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled", "DeduplicationScope", "FifoThroughputLimit")
FIFO_ONLY = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")
READ_ONLY = (*COUNTS, "CreatedTimestamp", "LastModifiedTimestamp", "QueueArn")
SETTABLE = tuple(INTEGERS) + KEPT + ("RedrivePolicy", "FifoQueue", "ContentBasedDeduplication")
ALL = SETTABLE + READ_ONLY
CHOICES = {
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
    "SqsManagedSseEnabled": ("true", "false"),
}


def unknown(name: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")


def bad_value(name: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")


# -- SQS -> Conveyor -------------------------------------------------------------------------

def to_conveyor(ctx: Context, attributes: dict[str, str] | None, *, fifo: bool, creating: bool,
                queue: str) -> dict[str, Any]:
    """Validate SQS attributes and translate them into queue_create/queue_alter attributes."""
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in (attributes or {}).items():
        if name not in SETTABLE:
            raise unknown(name)
        if name in FIFO_ONLY and not fifo and name != "FifoQueue":
            raise _fifo_only(name)
        if name in INTEGERS:
            key, lo, hi = INTEGERS[name]
            out[key] = _integer(name, value, lo, hi)
        elif name == "FifoQueue":
            _fifo_flag(value, fifo, creating)
        elif name == "ContentBasedDeduplication":
            out["content_based_deduplication"] = _boolean(name, value)
        elif name == "RedrivePolicy":
            out.update(_redrive(ctx, value, queue))
        else:
            extra[name] = _kept(name, value)
    if "DeduplicationScope" in extra:  # the engine's own key, as for encryption below
        extra["dedup_scope"] = "group" if extra["DeduplicationScope"] == "messageGroup" else "queue"
    encrypted = _encrypted(extra) if ctx.broker.can_encrypt() else None
    if encrypted is not None:
        extra["encrypted"] = encrypted
    if extra:
        out["extra_attributes"] = extra
    return out


def _encrypted(extra: dict[str, Any]) -> bool | None:
    """The queue's ``encrypted`` flag (conveyor.crypto) from the SSE attributes a request
    sets: SqsManagedSseEnabled=true or a KmsMasterKeyId seals bodies with the server's
    key; SqsManagedSseEnabled=false (or removing the KMS key) stops sealing new ones.
    None: the request says nothing about it."""
    if extra.get("KmsMasterKeyId"):
        return True
    if "SqsManagedSseEnabled" in extra:
        return bool(extra["SqsManagedSseEnabled"] == "true")
    if "KmsMasterKeyId" in extra:  # removed
        return False
    return None


def _integer(name: str, value: str, lo: int, hi: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise bad_value(name) from None
    if not lo <= number <= hi:
        raise bad_value(name)
    return number


def _boolean(name: str, value: str) -> bool:
    if str(value).lower() not in ("true", "false"):
        raise bad_value(name)
    return str(value).lower() == "true"


def _fifo_only(name: str) -> SqsError:
    """An attribute only FIFO queues have, given for a standard queue, as AWS words it."""
    if name in ("DeduplicationScope", "FifoThroughputLimit"):
        return SqsError("InvalidAttributeName", f"You can specify the {name} only when FifoQueue is set to true.")
    return unknown(name)


def _fifo_flag(value: str, fifo: bool, creating: bool) -> None:
    """FifoQueue: a standard queue has no such attribute (not even ``false``); a FIFO queue
    may be told it is one again, never that it is not."""
    wanted = _boolean("FifoQueue", value)
    if not fifo and not wanted:
        raise unknown("FifoQueue")
    if creating and wanted != fifo:
        raise SqsError("InvalidParameterValue", "The name of a FIFO queue can only include alphanumeric "
                       "characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length.")
    if not creating and not fifo:
        raise unknown("FifoQueue")
    if not creating and not wanted:
        raise SqsError("InvalidAttributeValue",
                       "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.")


def _kept(name: str, value: str) -> str | None:
    if value == "" and name in ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId"):
        return None  # an empty value removes it
    if name in CHOICES and value not in CHOICES[name]:
        raise bad_value(name)
    if name == "KmsDataKeyReusePeriodSeconds":
        _integer(name, value, 60, 86400)
    if name == "Policy":
        _json_object(name, value)
    if name == "RedriveAllowPolicy":
        _redrive_allow(value)
    return value


def _json_object(name: str, value: str) -> dict[str, Any]:
    try:
        parsed = json_input.loads(value, big_integers=True)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid_value(name, value, f"{name} is not a valid JSON map")
    return parsed


def _redrive(ctx: Context, value: str, queue: str) -> dict[str, Any]:
    if value == "":
        return {"dead_letter_queue": None, "max_receive_count": None}
    policy = _json_object("RedrivePolicy", value)
    arn, count = policy.get("deadLetterTargetArn"), policy.get("maxReceiveCount")
    if not arn or count is None:
        raise invalid_value("RedrivePolicy", value,
                            "Redrive policy does not contain mandatory attribute: "
                            + ("deadLetterTargetArn" if not arn else "maxReceiveCount"))
    try:
        count = int(count)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 1000:
        raise invalid_value("RedrivePolicy", value,
                            f"Invalid value for maxReceiveCount: {policy.get('maxReceiveCount')}, "
                            "valid values are from 1 to 1000 both inclusive")
    target = ctx.queue_from_arn(arn, "RedrivePolicy")
    return {"dead_letter_queue": target, "max_receive_count": count}


def _redrive_allow(value: str) -> None:
    policy = _json_object("RedriveAllowPolicy", value)
    permission = policy.get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue"):
        raise invalid_value("RedriveAllowPolicy", value, "Invalid value for redrivePermission")
    sources = policy.get("sourceQueueArns")
    if permission == "byQueue" and (not isinstance(sources, list) or not 1 <= len(sources) <= 10):
        raise invalid_value("RedriveAllowPolicy", value,
                            "sourceQueueArns must list 1 to 10 queue ARNs when redrivePermission is byQueue")
    if permission != "byQueue" and sources:
        raise invalid_value("RedriveAllowPolicy", value,
                            "sourceQueueArns is only allowed when redrivePermission is byQueue")


def check_redrive_allowed(ctx: Context, source: str, dead_letter_queue: types.Queue) -> None:
    """The dead-letter queue's RedriveAllowPolicy must let ``source`` use it."""
    raw = dead_letter_queue.extra_attributes.get("RedriveAllowPolicy")
    if not raw:
        return
    policy = json_input.loads(raw, big_integers=True)
    permission = policy.get("redrivePermission")
    allowed = permission == "allowAll" or (
        permission == "byQueue" and ctx.queue_arn(source) in policy.get("sourceQueueArns", []))
    if not allowed:
        raise invalid_value("RedrivePolicy", ctx.queue_arn(dead_letter_queue.name),
                            f"Queue {ctx.queue_arn(dead_letter_queue.name)} does not allow this queue to use it "
                            "as a dead-letter queue")


# -- Conveyor -> SQS -------------------------------------------------------------------------

def from_conveyor(ctx: Context, queue: types.Queue, metrics: types.QueueMetrics | None,
                  names: list[str] | None) -> dict[str, str]:
    """The attributes GetQueueAttributes returns for ``names`` (``All`` for every one)."""
    wanted = list(names or [])
    for name in wanted:
        if name != "All" and name not in ALL:
            raise unknown(name)
    every = _all(ctx, queue, metrics)
    if "All" in wanted:
        return every
    return {name: every[name] for name in wanted if name in every}


def _all(ctx: Context, q: types.Queue, m: types.QueueMetrics | None) -> dict[str, str]:
    out = {
        "QueueArn": ctx.queue_arn(q.name),
        "CreatedTimestamp": str(int(q.created_at.timestamp())),
        "LastModifiedTimestamp": str(int(q.updated_at.timestamp())),
        "VisibilityTimeout": str(q.visibility_timeout),
        "DelaySeconds": str(q.delay_seconds),
        "MaximumMessageSize": str(q.max_message_size),
        "MessageRetentionPeriod": str(q.retention_seconds),
        "ReceiveMessageWaitTimeSeconds": str(q.receive_wait_seconds),
    }
    if m is not None:
        out["ApproximateNumberOfMessages"] = str(m.queue_length)
        out["ApproximateNumberOfMessagesNotVisible"] = str(m.in_flight)
        out["ApproximateNumberOfMessagesDelayed"] = str(m.delayed)
    if q.dead_letter_queue and q.max_receive_count:
        out["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": ctx.queue_arn(q.dead_letter_queue),
                                           "maxReceiveCount": q.max_receive_count}, separators=(",", ":"))
    extra = dict(q.extra_attributes)
    out.update({k: str(v) for k, v in extra.items() if k in KEPT and v is not None})
    if not extra.get("KmsMasterKeyId"):
        out.pop("KmsDataKeyReusePeriodSeconds", None)  # AWS states it only while a KMS key is set
    out.setdefault("SqsManagedSseEnabled", "false" if "KmsMasterKeyId" in extra else "true")
    if q.fifo:
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = "true" if q.content_based_deduplication else "false"
        out.setdefault("DeduplicationScope", "queue")
        out.setdefault("FifoThroughputLimit", "perQueue")
    return out
