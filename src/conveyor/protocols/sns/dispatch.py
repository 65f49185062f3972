"""The SNS endpoint: authenticate, read the call (JSON or Query), run its handler, answer
in the same protocol. Handlers take typed parameters and return typed results; every error
leaves through one place, rendered as AWS renders SNS errors.

An unsubscribe link, ``GET /?Action=Unsubscribe&SubscriptionArn=...&Token=...`` — the
``UnsubscribeURL`` of a notification delivered to an HTTP(S) endpoint — needs no
credentials, as on AWS; its capability is the token (``core.unsubscribe_links``), not the
ARN, which readers list. Only a bare link qualifies (a GET with no body, no target header
and no credentials, whose query string's action is Unsubscribe), and only where the server
does not serve anyone anyway (mode none without AWS keys, where it is an ordinary call);
anything else is authenticated as every other request.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.core import unsubscribe_links
from conveyor.protocols.aws import service, sigv4, wire
from conveyor.protocols.sns import (
    permission_actions,
    publish_actions,
    subscription_actions,
    tag_actions,
    topic_actions,
)
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import INTERNAL, SnsError, from_conveyor, invalid
from conveyor.protocols.sns.shapes import INPUT, NAMESPACE, OUTPUT

log = logging.getLogger(__name__)

SERVICE = wire.Service(target_prefix="AmazonSNS", json_type_prefix="com.amazonaws.sns#", namespace=NAMESPACE,
                       inputs=INPUT, outputs=OUTPUT, query_compatible=True, error_detail=False)
SIGNING_NAME = "sns"  # the service a SigV4 credential scope must name

Handler = Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any] | None]]

HANDLERS: dict[str, Handler] = {
    "CreateTopic": topic_actions.create_topic,
    "DeleteTopic": topic_actions.delete_topic,
    "ListTopics": topic_actions.list_topics,
    "GetTopicAttributes": topic_actions.get_topic_attributes,
    "SetTopicAttributes": topic_actions.set_topic_attributes,
    "AddPermission": permission_actions.add_permission,
    "RemovePermission": permission_actions.remove_permission,
    "Subscribe": subscription_actions.subscribe,
    "Unsubscribe": subscription_actions.unsubscribe,
    "ConfirmSubscription": subscription_actions.confirm_subscription,
    "ListSubscriptions": subscription_actions.list_subscriptions,
    "ListSubscriptionsByTopic": subscription_actions.list_subscriptions_by_topic,
    "GetSubscriptionAttributes": subscription_actions.get_subscription_attributes,
    "SetSubscriptionAttributes": subscription_actions.set_subscription_attributes,
    "Publish": publish_actions.publish,
    "PublishBatch": publish_actions.publish_batch,
    "TagResource": tag_actions.tag_resource,
    "UntagResource": tag_actions.untag_resource,
    "ListTagsForResource": tag_actions.list_tags_for_resource,
}
assert set(HANDLERS) == set(INPUT), "every SNS action has a handler"

# The role each action needs (conveyor.protocols.auth): as the REST API's for the same act.
_READ = {"ListTopics", "GetTopicAttributes", "ListSubscriptions", "ListSubscriptionsByTopic",
         "GetSubscriptionAttributes", "ListTagsForResource"}
_WRITE = {"Publish", "PublishBatch", "ConfirmSubscription"}
ROLES = {action: "read" if action in _READ else "write" if action in _WRITE else "admin" for action in HANDLERS}

# the links SNS puts in what it sends, which work without credentials: the subscription's
# random id (UnsubscribeURL) or the confirmation token (SubscribeURL) is the capability
_LINK_ACTIONS = ("Unsubscribe", "ConfirmSubscription")

_SHAPE_MESSAGE = re.compile(r"^Value for parameter (.+) is invalid\. Reason: (.+)\.$")


def _is_unsubscribe_link(endpoint: service.Endpoint, request: Request, body: bytes) -> bool:
    """A bare unsubscribe link: nothing but the query string can name the action."""
    headers = request.headers
    return (request.method == "GET" and not body and not endpoint.policy.admits_anyone
            and "x-amz-target" not in headers
            and "authorization" not in headers and not wire.is_json(headers)
            and sigv4.parse_query_scope(service.query_string(request)) is None
            and request.query_params.get("Action") in _LINK_ACTIONS)


def _context(endpoint: service.Endpoint, request: Request, caller: service.Caller, call: wire.Call) -> Context:
    scope = caller.scope
    return Context(
        broker=endpoint.broker,
        action=call.action,
        region=service.region(endpoint, scope),
        default_region=endpoint.region,
        account_id=endpoint.account_id,
        base_url=service.base_url(endpoint, request),
        request_id=call.request_id,
        trace_header=request.headers.get("x-amzn-trace-id") or None,
    )


def _wire_failure(exc: wire.WireError) -> SnsError:
    match = _SHAPE_MESSAGE.match(exc.message)
    if exc.kind == "InvalidParameterValue" and match:
        return invalid(match[1], match[2])
    return SnsError(exc.kind, exc.message)


async def _answer(endpoint: service.Endpoint, request: Request, body: bytes, request_id: str) -> Response:
    if _is_unsubscribe_link(endpoint, request, body):
        return await _unsubscribe_link(endpoint, request, body, request_id)
    caller = service.authenticate(endpoint, request, body, SnsError, SIGNING_NAME)
    call = service.read(SERVICE, request, body, request_id)
    service.authorize(caller, ROLES[call.action], call.action, SnsError)
    return wire.result(call, await HANDLERS[call.action](_context(endpoint, request, caller, call), call.params))


async def _unsubscribe_link(endpoint: service.Endpoint, request: Request, body: bytes, request_id: str) -> Response:
    """A bare link, without credentials: its token is all it has. An UnsubscribeURL's is
    checked by subscription_actions; a SubscribeURL's is ConfirmSubscription's own Token."""
    call = service.read(SERVICE, request, body, request_id)
    ctx = _context(endpoint, request, service.ANONYMOUS, call)
    if call.action == "ConfirmSubscription":
        return wire.result(call, await HANDLERS[call.action](ctx, call.params))
    if call.action != "Unsubscribe":  # cannot happen (the link's only field is its query)
        raise SnsError("AuthorizationErrorException", "Only Unsubscribe may be called without credentials.")
    token = request.query_params.get(unsubscribe_links.PARAMETER)
    await subscription_actions.unsubscribe_by_link(ctx, call.params, token)
    return wire.result(call, None)


async def handle(endpoint: service.Endpoint, request: Request, body: bytes) -> Response:
    request_id = wire.new_request_id()
    protocol = service.protocol(request)
    try:
        return await _answer(endpoint, request, body, request_id)
    except wire.WireError as exc:
        failure = _wire_failure(exc)
    except SnsError as exc:
        failure = exc
    except errors.ConveyorError as exc:
        failure = from_conveyor(exc)
    except Exception:
        log.exception("SNS request failed")
        failure = SnsError("InternalErrorException", INTERNAL)
    return wire.error(SERVICE, protocol, failure.info(), request_id)
