"""The SQS endpoint: authenticate, read the call (JSON or Query), run its handler, answer
in the same protocol. Handlers take typed parameters and return typed results; every
error leaves through one place, rendered as AWS renders it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.protocols.aws import sigv4, wire
from conveyor.protocols.broker import Broker
from conveyor.protocols.sqs import message_actions, move_task_actions, permission_actions, queue_actions
from conveyor.protocols.sqs import tag_actions
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import KINDS, SqsError, from_conveyor
from conveyor.protocols.sqs.shapes import INPUT, NAMESPACE, OUTPUT

log = logging.getLogger(__name__)

SERVICE = wire.Service(target_prefix="AmazonSQS", json_type_prefix="com.amazonaws.sqs#", namespace=NAMESPACE,
                       inputs=INPUT, outputs=OUTPUT, query_compatible=True)

Handler = Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any] | None]]

HANDLERS: dict[str, Handler] = {
    "CreateQueue": queue_actions.create_queue,
    "DeleteQueue": queue_actions.delete_queue,
    "GetQueueUrl": queue_actions.get_queue_url,
    "GetQueueAttributes": queue_actions.get_queue_attributes,
    "SetQueueAttributes": queue_actions.set_queue_attributes,
    "ListQueues": queue_actions.list_queues,
    "PurgeQueue": queue_actions.purge_queue,
    "ListDeadLetterSourceQueues": queue_actions.list_dead_letter_source_queues,
    "SendMessage": message_actions.send_message,
    "SendMessageBatch": message_actions.send_message_batch,
    "ReceiveMessage": message_actions.receive_message,
    "DeleteMessage": message_actions.delete_message,
    "DeleteMessageBatch": message_actions.delete_message_batch,
    "ChangeMessageVisibility": message_actions.change_message_visibility,
    "ChangeMessageVisibilityBatch": message_actions.change_message_visibility_batch,
    "TagQueue": tag_actions.tag_queue,
    "UntagQueue": tag_actions.untag_queue,
    "ListQueueTags": tag_actions.list_queue_tags,
    "StartMessageMoveTask": move_task_actions.start_message_move_task,
    "CancelMessageMoveTask": move_task_actions.cancel_message_move_task,
    "ListMessageMoveTasks": move_task_actions.list_message_move_tasks,
    "AddPermission": permission_actions.add_permission,
    "RemovePermission": permission_actions.remove_permission,
}
assert set(HANDLERS) == set(INPUT), "every SQS action has a handler"


@dataclass(frozen=True)
class Endpoint:
    """What the server tells the SQS endpoint about itself."""

    broker: Broker
    region: str
    account_id: str
    base_url: str | None
    auth_mode: str  # none | header | token (presence of a header) ...
    credentials: dict[str, str]  # ... or SigV4 against these, when any are configured


def _info(exc: SqsError) -> wire.ErrorInfo:
    return wire.ErrorInfo(exc.kind.name, exc.kind.query_code, exc.kind.status, exc.kind.sender, exc.message)


def _authenticate(endpoint: Endpoint, request: Request, body: bytes) -> sigv4.Scope | None:
    authorization = request.headers.get("authorization")
    scope = sigv4.parse_scope(authorization) or sigv4.parse_query_scope(request.url.query)
    if endpoint.credentials:
        try:
            sigv4.verify(request.method, request.scope.get("raw_path", b"/").decode("latin-1"),
                         request.url.query, [(k, v) for k, v in request.headers.items()], body,
                         endpoint.credentials)
        except sigv4.SignatureError as exc:
            raise SqsError(exc.code if exc.code in KINDS else "AccessDenied", exc.message) from None
    elif endpoint.auth_mode != "none" and authorization is None and scope is None:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    return scope


def _context(endpoint: Endpoint, request: Request, scope: sigv4.Scope | None, request_id: str) -> Context:
    base = endpoint.base_url or f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"
    account, queue = request.path_params.get("account_id"), request.path_params.get("queue_name")
    return Context(
        broker=endpoint.broker,
        region=scope.region if scope and scope.region else endpoint.region,
        default_region=endpoint.region,
        account_id=endpoint.account_id,
        base_url=base,
        sender_id=scope.access_key if scope else endpoint.account_id,
        request_id=request_id,
        path_queue_url=f"/{account}/{queue}" if account and queue else None,
    )


def _read(request: Request, body: bytes, request_id: str) -> wire.Call:
    if wire.is_json(request.headers):
        return wire.parse_json(SERVICE, request.headers.get("x-amz-target", ""), body, request_id)
    return wire.parse_query(SERVICE, wire.form_fields(body, request.url.query), request_id)


async def handle(endpoint: Endpoint, request: Request, body: bytes) -> Response:
    request_id = wire.new_request_id()
    protocol = "json" if wire.is_json(request.headers) else "query"
    try:
        scope = _authenticate(endpoint, request, body)
        call = _read(request, body, request_id)
        ctx = _context(endpoint, request, scope, request_id)
        return wire.result(call, await HANDLERS[call.action](ctx, call.params))
    except wire.WireError as exc:
        failure = SqsError(exc.kind, exc.message)
    except SqsError as exc:
        failure = exc
    except errors.ConveyorError as exc:
        failure = from_conveyor(exc)
    except Exception:
        log.exception("SQS request failed")
        failure = SqsError("InternalError", "We encountered an internal error. Please try again.")
    return wire.error(SERVICE, protocol, _info(failure), request_id)
