"""``POST /`` and ``POST /{account_id}/{queue_name}``: where AWS clients arrive.

The request is handed to the service it is meant for, as seed 000's gateway does:

1. ``X-Amz-Target: AmazonSNS.<Action>`` -> SNS (JSON protocol);
2. otherwise, a request that is not JSON and whose ``Action`` (form body or query string)
   is an SNS action -> SNS (Query protocol: SNS Query requests carry no target header),
   except for the actions both services have (AddPermission, RemovePermission): those
   are SNS's when they name a topic (a ``TopicArn`` field) or were signed for the ``sns``
   service (the SigV4 credential scope), and SQS's otherwise;
3. anything else -> SQS, the default.

Path-style SQS URLs (``/{account_id}/{queue_name}``) always go to SQS.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from conveyor.protocols.aws import service, sigv4, wire
from conveyor.protocols.sns import dispatch as sns
from conveyor.protocols.sns.errors import SnsError
from conveyor.protocols.sns.shapes import ACTIONS as SNS_ACTIONS
from conveyor.protocols.sqs import dispatch as sqs
from conveyor.protocols.sqs.errors import SqsError
from conveyor.protocols.sqs.shapes import ACTIONS as SQS_ACTIONS

_ACTION = re.compile(rb"(?:^|&)Action=([^&]*)")
_TOPIC_ARN = re.compile(rb"(?:^|&)TopicArn=")
_SHARED_ACTIONS = SNS_ACTIONS & SQS_ACTIONS  # AddPermission, RemovePermission


def _query_action(body: bytes, query_string: bytes) -> str | None:
    """The ``Action`` field of a Query request (the body wins, as in ``wire.form_fields``)."""
    for source in (body, query_string):
        match = _ACTION.search(source)
        if match:
            return unquote_plus(match[1].decode("latin-1"))
    return None


def is_sns(request: Request, body: bytes) -> bool:
    if request.path_params.get("queue_name"):
        return False
    if request.headers.get("x-amz-target", "").startswith("AmazonSNS."):
        return True
    if wire.is_json(request.headers):
        return False
    query: bytes = request.scope.get("query_string", b"")
    action = _query_action(body, query)
    if action not in SNS_ACTIONS:
        return False
    return action not in _SHARED_ACTIONS or _is_sns_call(request, body, query)


def _is_sns_call(request: Request, body: bytes, query: bytes) -> bool:
    """Whether a Query call of an action both services have is meant for SNS."""
    if _TOPIC_ARN.search(body) or _TOPIC_ARN.search(query):
        return True
    scope = (sigv4.parse_scope(request.headers.get("authorization"))
             or sigv4.parse_query_scope(query.decode("latin-1")))
    return scope is not None and scope.service == "sns"


async def endpoint(request: Request) -> Response:
    try:
        body = await request.body()
    except HTTPException as exc:  # over the server's body limit (see server.middleware.Edge)
        return unread(request, "RequestEntityTooLarge", exc.detail)
    if is_sns(request, body):
        return await sns.handle(request.app.state.aws, request, body)
    return await sqs.handle(request.app.state.aws, request, body)


# Errors answered before the body is read, in each service's name for them
_UNREAD = {"RequestEntityTooLarge": ("RequestEntityTooLarge", "RequestEntityTooLarge"),
           "Throttled": ("RequestThrottled", "ThrottledException"),
           "RequestTimeout": ("RequestTimeout", "RequestTimeout")}


def unread(request: Request, kind: str, message: str) -> Response:
    """An AWS error for a request whose body was not read (too large, refused by admission
    control) or whose answer is not the handler's (cut by the request deadline): SNS's when the target header names SNS; otherwise SQS's, since a
    Query request's action is in the body that was not read."""
    sqs_name, sns_name = _UNREAD[kind]
    error: service.AwsError
    if request.headers.get("x-amz-target", "").startswith("AmazonSNS."):
        target, error = sns.SERVICE, SnsError(sns_name, message)
    else:
        target, error = sqs.SERVICE, SqsError(sqs_name, message)
    return wire.error(target, service.protocol(request), error.info(), wire.new_request_id())
