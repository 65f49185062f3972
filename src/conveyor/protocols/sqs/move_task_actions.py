"""SQS message move tasks: StartMessageMoveTask, CancelMessageMoveTask, ListMessageMoveTasks.

A TaskHandle has AWS's form, base64 of ``{"taskId":"<uuid>","sourceArn":"<arn>"}``, so code
that decodes it (to find the source queue of a task) works; the task id is Conveyor's
handle of the task.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from typing import Any

from conveyor import errors, types
from conveyor.core import move_tasks, queues
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import SqsError, invalid_value, missing

# what ListMessageMoveTasks says of a task whose destination queue was deleted, as AWS does
_DESTINATION_GONE = "AWS.SimpleQueueService.NonExistentQueue"


def task_handle(ctx: Context, task: types.MoveTask) -> str:
    doc = json.dumps({"taskId": str(task.handle), "sourceArn": ctx.queue_arn(task.source_queue)},
                     separators=(",", ":"))
    return base64.b64encode(doc.encode()).decode()


def _read_handle(raw: str) -> tuple[uuid.UUID, str]:
    """The task id and source ARN a TaskHandle carries."""
    try:
        doc = json.loads(base64.b64decode(raw.encode(), validate=True))
        return uuid.UUID(doc["taskId"]), str(doc["sourceArn"])
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.") from None


def _no_task() -> SqsError:
    return SqsError("ResourceNotFoundException", "Task does not exist.")


async def start_message_move_task(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    source_arn = p.get("SourceArn")
    if not source_arn:
        raise missing("SourceArn")
    source = ctx.queue_from_arn(source_arn, "SourceArn")
    destination = ctx.queue_from_arn(p["DestinationArn"], "DestinationArn") if p.get("DestinationArn") else None
    rate = p.get("MaxNumberOfMessagesPerSecond")
    if rate is not None and not 1 <= rate <= 500:
        raise invalid_value("MaxNumberOfMessagesPerSecond", rate, "Must be between 1 and 500")
    async with ctx.broker.connection() as conn:
        try:
            task = await move_tasks.start(conn, source, destination, rate)
        except errors.QueueNotFound:
            raise SqsError("ResourceNotFoundException", "The resource that you specified for the SourceArn "
                           "or DestinationArn parameter doesn't exist.") from None
        except errors.InvalidInput as exc:
            if "already running" in exc.message:
                raise SqsError("InvalidParameterValue", "There is already a task running. Only one active task "
                               "is allowed for a source queue arn at a given time.") from None
            raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter "
                           "Queue.") from None
    return {"TaskHandle": task_handle(ctx, task)}


async def cancel_message_move_task(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    raw = p.get("TaskHandle")
    if not raw:
        raise missing("TaskHandle")
    handle, source_arn = _read_handle(raw)
    try:
        source = ctx.queue_from_arn(source_arn, "SourceArn")
    except SqsError:
        source = None  # names no queue of ours: answered below as a queue that does not exist
    async with ctx.broker.connection() as conn:
        try:
            if source is None:
                raise errors.QueueNotFound(source_arn)
            await queues.get(conn, source)
        except errors.QueueNotFound:
            raise SqsError("ResourceNotFoundException", "The resource that you specified for the SourceArn "
                           "parameter doesn't exist.") from None
        # only a running task can be cancelled, and a source queue has at most one
        if not any(t.handle == handle for t in await move_tasks.list_for(conn, source, 10)):
            raise _no_task()
        try:
            task = await move_tasks.cancel(conn, handle)
        except errors.MoveTaskNotFound:
            raise _no_task() from None
        except errors.InvalidInput:
            raise SqsError("UnsupportedOperation", "Only a running task can be cancelled.") from None
    return {"ApproximateNumberOfMessagesMoved": task.moved}


async def list_message_move_tasks(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    source_arn = p.get("SourceArn")
    if not source_arn:
        raise missing("SourceArn")
    max_results = p.get("MaxResults", 1)
    if not 1 <= max_results <= 10:
        raise invalid_value("MaxResults", max_results, "Must be between 1 and 10")
    source = ctx.queue_from_arn(source_arn, "SourceArn")
    async with ctx.broker.connection() as conn:
        try:
            tasks = await move_tasks.list_for(conn, source, max_results)
        except errors.QueueNotFound:
            raise SqsError("ResourceNotFoundException", "The resource that you specified for the SourceArn "
                           "parameter doesn't exist.") from None
    return {"Results": [_entry(ctx, t) for t in tasks]}


def _entry(ctx: Context, t: types.MoveTask) -> dict[str, Any]:
    out: dict[str, Any] = {
        "Status": t.status,
        "SourceArn": ctx.queue_arn(t.source_queue),
        "ApproximateNumberOfMessagesMoved": t.moved,
        "ApproximateNumberOfMessagesToMove": t.to_move,
        "StartedTimestamp": int(t.started_at.timestamp() * 1000),
    }
    if t.status == "RUNNING":
        out["TaskHandle"] = task_handle(ctx, t)
    if t.destination_queue:
        out["DestinationArn"] = ctx.queue_arn(t.destination_queue)
    if t.max_per_second:
        out["MaxNumberOfMessagesPerSecond"] = t.max_per_second
    if t.failure_reason:
        gone = t.status == "FAILED" and t.failure_reason.startswith("the destination queue ")
        out["FailureReason"] = _DESTINATION_GONE if gone else t.failure_reason
    return out
