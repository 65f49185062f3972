"""The SQS endpoint: authenticate, read the call (JSON or Query), run its handler, answer
in the same protocol. Handlers take typed parameters and return typed results; every
error leaves through one place, rendered as AWS renders it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.protocols.aws import service, wire
from conveyor.protocols.sqs import message_actions, move_task_actions, permission_actions, queue_actions, tag_actions
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import NO_QUEUE, NO_QUEUE_QUERY, SqsError, from_conveyor
from conveyor.protocols.sqs.shapes import INPUT, NAMESPACE, OUTPUT

log = logging.getLogger(__name__)

SERVICE = wire.Service(target_prefix="AmazonSQS", json_type_prefix="com.amazonaws.sqs#", namespace=NAMESPACE,
                       inputs=INPUT, outputs=OUTPUT, query_compatible=True)
SIGNING_NAME = "sqs"  # the service a SigV4 credential scope must name

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

# The role each action needs (conveyor.protocols.auth): as the REST API's for the same act.
_READ = {"GetQueueUrl", "GetQueueAttributes", "ListQueues", "ListDeadLetterSourceQueues", "ListQueueTags",
         "ListMessageMoveTasks"}
_WRITE = {"SendMessage", "SendMessageBatch", "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch",
          "ChangeMessageVisibility", "ChangeMessageVisibilityBatch"}
ROLES = {action: "read" if action in _READ else "write" if action in _WRITE else "admin" for action in HANDLERS}


def _context(endpoint: service.Endpoint, request: Request, caller: service.Caller, request_id: str) -> Context:
    scope = caller.scope
    account, queue = request.path_params.get("account_id"), request.path_params.get("queue_name")
    region = request.path_params.get("region")
    return Context(
        broker=endpoint.broker,
        region=service.region(endpoint, scope),
        default_region=endpoint.region,
        account_id=endpoint.account_id,
        base_url=service.base_url(endpoint, request),
        # who sent it, as verified: a JWT's sub or a verified SigV4 key, else the account (an
        # unverified scope's access key is whatever the client wrote)
        sender_id=caller.identity.principal or endpoint.account_id,
        request_id=request_id,
        path_queue_url=(f"/queue/{region}/{account}/{queue}" if region else f"/{account}/{queue}")
        if account and queue else None,
        trace_header=request.headers.get("x-amzn-trace-id") or None,
    )


# Actions that name no queue: sent to a queue's URL, AWS answers InvalidAction
_QUEUELESS = {"CreateQueue", "ListQueues"}


def _no_action(request: Request, body: bytes) -> bool:
    """A Query request that names no action at all (``GET /`` or a queue URL, no fields);
    a substring test, so that the hot path does not parse the form twice."""
    if wire.is_json(request.headers):
        return False
    return b"Action=" not in body and "Action=" not in service.query_string(request)


async def handle(endpoint: service.Endpoint, request: Request, body: bytes) -> Response:
    request_id = wire.new_request_id()
    protocol = service.protocol(request)
    if _no_action(request, body):  # AWS's front end answers this before anything else
        return Response("<UnknownOperationException/>", status_code=404, media_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})
    try:
        caller = service.authenticate(endpoint, request, body, SqsError, SIGNING_NAME)
        call = service.read(SERVICE, request, body, request_id)
        if call.action in _QUEUELESS and request.path_params.get("queue_name"):
            raise SqsError("InvalidAction", f"The action {call.action} is not valid for this endpoint.")
        service.authorize(caller, ROLES[call.action], call.action, SqsError)
        ctx = _context(endpoint, request, caller, request_id)
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
    if protocol != "json" and failure.message == NO_QUEUE:
        failure = SqsError("QueueDoesNotExist", NO_QUEUE_QUERY)  # AWS's Query wording
    return wire.error(SERVICE, protocol, failure.info(), request_id)
