"""Queen's hot path: push, pop, ack, lease renewal, transactions and traces."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.core import partitioned
from conveyor.protocols import auth, endpoints
from conveyor.protocols.queen import request as req

MAX_ITEMS = 10000
MAX_POLL_SECONDS = 30.0  # Queen's default long-poll timeout; its clients ask for it
AUTOPILOT_BATCH = 100  # what a pop gets when the client lets the broker size it


@dataclasses.dataclass(frozen=True)
class CreateOnPush:
    """Whose pushes may create the queues they name, and how many one push may create
    (CONVEYOR_QUEEN_CREATE_ON_PUSH: any caller that may push, admin only, or off; and
    CONVEYOR_QUEEN_CREATE_PER_PUSH). The bound on all queues is the broker's."""

    mode: str = "any"
    per_push: int = 10

    def creatable(self, identity: auth.Identity) -> int:
        if self.mode == "off" or (self.mode == "admin" and not identity.may("admin")):
            return 0
        return self.per_push

    def refusal(self, exc: errors.QueueLimitReached, identity: auth.Identity) -> errors.QueueLimitReached:
        """The refusal, saying why when this caller may create none at all."""
        if self.creatable(identity) > 0:
            return exc
        why = ("pushes create no queues on this server" if self.mode == "off"
               else "on this server only the admin role's pushes create queues")
        return errors.QueueLimitReached(f"{exc.message} ({why}; an admin creates it with POST /api/v1/configure)")


@contextlib.contextmanager
def _creating(request: Request) -> Iterator[int]:
    """How many queues this caller's push may create; a refusal said in full."""
    policy: CreateOnPush = request.app.state.create_on_push
    identity = endpoints.identity(request)
    try:
        yield policy.creatable(identity)
    except errors.QueueLimitReached as exc:
        raise policy.refusal(exc, identity) from None


def _stamped(request: Request, items: Any) -> list[dict[str, Any]]:
    """Push items as the client sent them, with the verified caller as producerSub (a
    client cannot set it: whatever it sent is replaced)."""
    if not isinstance(items, list) or not items:
        raise errors.InvalidInput("items array is required")
    if len(items) > MAX_ITEMS:
        raise errors.InvalidInput(f"a push holds at most {MAX_ITEMS} items")
    principal = endpoints.identity(request).principal
    stamped = []
    for item in items:
        if not isinstance(item, dict):
            raise errors.InvalidInput("each item must be a JSON object")
        if not isinstance(item.get("queue"), str):
            raise errors.InvalidInput("Queue must be a string")
        for key in ("partition", "transactionId", "traceId"):
            if key in item and item[key] is not None and not isinstance(item[key], str):
                raise errors.InvalidInput(f"{key} must be a string")
        clean = {k: item[k] for k in ("queue", "partition", "payload", "transactionId", "traceId") if k in item}
        if principal is not None:
            clean["producerSub"] = principal
        stamped.append(clean)
    return stamped


async def push(request: Request) -> Response:
    data = await req.body_object(request)
    items = _stamped(request, data.get("items"))
    with _creating(request) as creatable:
        answers = await req.broker(request).pq_push(items, creatable=creatable)
    return req.json(answers, 201)


def _pop_request(request: Request, queue: str | None, partition: str | None) -> tuple[dict[str, Any], float]:
    autopilot = req.flag(request, "autopilot")
    batch = req.integer(request, "batch", AUTOPILOT_BATCH if autopilot else 1, 1, MAX_ITEMS)
    pop: dict[str, Any] = {
        "queue": queue, "partition": partition, "batch": batch,
        "maxPartitions": req.integer(request, "partitions", 1, 1, 1000) if partition is None else 1,
        "consumerGroup": req.text(request, "consumerGroup"),
        "namespace": req.text(request, "namespace"), "task": req.text(request, "task"),
        "autoAck": req.flag(request, "autoAck"),
        "subscriptionMode": req.text(request, "subscriptionMode"),
        "subscriptionFrom": req.text(request, "subscriptionFrom"),
    }
    if queue is None and pop["namespace"] is None and pop["task"] is None:
        raise errors.InvalidInput("a pop names a queue, a namespace or a task")
    wait = 0.0
    if req.flag(request, "wait"):
        wait = min(req.integer(request, "timeout", 30000, 0, 3600000) / 1000.0, MAX_POLL_SECONDS)
    return {k: v for k, v in pop.items() if v is not None}, wait


async def _pop(request: Request, queue: str | None, partition: str | None) -> Response:
    pop, wait = _pop_request(request, queue, partition)
    got = await req.broker(request).pq_pop(pop, wait)
    messages = got.get("messages") or []
    if not messages:
        return req.json(None, 204)
    for m in messages:
        m.pop("encrypted", None)
        m.pop("seq", None)
    answer: dict[str, Any] = {"success": True, "messages": messages, "leaseId": got.get("leaseId"),
                              "queue": messages[0]["queue"], "partition": messages[0]["partition"],
                              "partitionId": messages[0]["partitionId"],
                              "consumerGroup": pop.get("consumerGroup", "__QUEUE_MODE__"),
                              "partitionsClaimed": len({m["partitionId"] for m in messages})}
    if req.flag(request, "autopilot"):
        answer["autopilot"] = {"batch": pop["batch"], "partitions": pop["maxPartitions"], "waitMs": int(wait * 1000)}
    return req.json(answer)


async def pop_partition(request: Request) -> Response:
    return await _pop(request, request.path_params["queue"], request.path_params["partition"])


async def pop_queue(request: Request) -> Response:
    return await _pop(request, request.path_params["queue"], None)


async def pop_any(request: Request) -> Response:
    return await _pop(request, None, None)


def _ack_item(data: Any, group: str | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise errors.InvalidInput("each acknowledgment must be a JSON object")
    if not isinstance(data.get("transactionId"), str) or not data["transactionId"]:
        raise errors.InvalidInput("Each acknowledgment must have a valid transactionId string")
    if not isinstance(data.get("partitionId"), str) or not data["partitionId"]:
        raise errors.InvalidInput("Each acknowledgment must have a valid partitionId string to ensure message "
                                  "uniqueness")
    item = {k: data[k] for k in ("transactionId", "partitionId", "leaseId", "status", "error") if data.get(k) is not None}
    consumer_group = data.get("consumerGroup") or group
    if consumer_group:
        item["consumerGroup"] = consumer_group
    return item


async def ack(request: Request) -> Response:
    data = await req.body_object(request)
    answers = await req.broker(request).pq_ack([_ack_item(data, None)])
    return req.json(answers)


async def ack_batch(request: Request) -> Response:
    data = await req.body_object(request)
    acks = data.get("acknowledgments")
    if not isinstance(acks, list):
        raise errors.InvalidInput("acknowledgments array is required")
    if len(acks) > MAX_ITEMS:
        raise errors.InvalidInput(f"a batch holds at most {MAX_ITEMS} acknowledgments")
    group = data.get("consumerGroup") if isinstance(data.get("consumerGroup"), str) else None
    if not acks:
        return req.json([])
    return req.json(await req.broker(request).pq_ack([_ack_item(a, group) for a in acks]))


async def extend_lease(request: Request) -> Response:
    lease_id = request.path_params["lease_id"]
    data = await req.body_object(request, required=False)
    lease: dict[str, Any] = {"leaseId": lease_id}
    seconds = data.get("seconds")
    if seconds is not None:
        if not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= 86400:
            raise errors.InvalidInput("seconds must be a whole number from 1 to 86400")
        lease["seconds"] = seconds
    [answer] = await req.broker(request).pq_renew([lease])
    if not answer["success"]:
        raise errors.LeaseNotHeld(f"lease {lease_id[:60]} is not held (it expired, was released or does not exist)")
    return req.json({**answer, "newExpiresAt": answer["expiresAt"]})


async def transaction(request: Request) -> Response:
    data = await req.body_object(request)
    operations = data.get("operations")
    if not isinstance(operations, list):
        raise errors.InvalidInput("operations array required")
    if not operations:
        raise errors.InvalidInput("operations array cannot be empty")
    ops: list[dict[str, Any]] = []
    for op in operations:
        if not isinstance(op, dict):
            raise errors.InvalidInput("each operation must be a JSON object")
        if op.get("type") == "push":
            ops.append({"type": "push", "items": _stamped(request, op.get("items"))})
        elif op.get("type") == "ack":
            ops.append({"type": "ack", **_ack_item(op, None)})
        else:
            raise errors.InvalidInput(f"Unknown operation type: {str(op.get('type'))[:40]}")
    leases = data.get("requiredLeases")
    if leases is not None and (not isinstance(leases, list) or not all(isinstance(x, str) for x in leases)):
        raise errors.InvalidInput("requiredLeases must be an array of lease ids")
    try:
        with _creating(request) as creatable:
            done = await req.broker(request).pq_transaction(ops, required_leases=leases or (), creatable=creatable)
    except (errors.LeaseNotHeld, errors.PartitionMessageNotFound) as exc:
        # all or nothing: nothing was kept; Queen answers the failure in the body
        return req.json({"success": False, "error": exc.message, "results": []})
    results = [{"type": "ack", **a} for a in done["acks"]] + [{"type": "push", "success": True, **p}
                                                              for p in done["pushes"]]
    return req.json({"success": True, "results": results})


async def record_trace(request: Request) -> Response:
    data = await req.body_object(request)
    if not isinstance(data.get("transactionId"), str) or not isinstance(data.get("partitionId"), str):
        raise errors.InvalidInput("a trace needs transactionId and partitionId")
    async with req.broker(request).connection() as conn:
        trace_id = await partitioned.trace(conn, data)
    if trace_id is None:
        raise errors.PartitionMessageNotFound("Message not found")
    return req.json({"success": True, "traceId": trace_id}, 201)
