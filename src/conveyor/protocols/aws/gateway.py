"""``POST /`` and ``POST /{account_id}/{queue_name}``: where AWS clients arrive.

The request is handed to the service it is meant for, as seed 000's gateway does:

1. ``X-Amz-Target: AmazonSNS.<Action>`` -> SNS (JSON protocol);
2. otherwise, a request that is not JSON and whose ``Action`` (form body or query string)
   is an SNS action -> SNS (Query protocol: SNS Query requests carry no target header);
3. anything else -> SQS, the default.

Path-style SQS URLs (``/{account_id}/{queue_name}``) always go to SQS.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from conveyor.protocols.aws import service, wire
from conveyor.protocols.sns import dispatch as sns
from conveyor.protocols.sns.errors import SnsError
from conveyor.protocols.sns.shapes import ACTIONS as SNS_ACTIONS
from conveyor.protocols.sqs import dispatch as sqs
from conveyor.protocols.sqs.errors import SqsError

_ACTION = re.compile(rb"(?:^|&)Action=([^&]*)")


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
    return _query_action(body, request.scope.get("query_string", b"")) in SNS_ACTIONS


async def endpoint(request: Request) -> Response:
    try:
        body = await request.body()
    except HTTPException as exc:  # over the server's body limit (see server.middleware.BodyLimit)
        return unread(request, "RequestEntityTooLarge", exc.detail)
    if is_sns(request, body):
        return await sns.handle(request.app.state.aws, request, body)
    return await sqs.handle(request.app.state.aws, request, body)


# Errors answered before the body is read, in each service's name for them
_UNREAD = {"RequestEntityTooLarge": ("RequestEntityTooLarge", "RequestEntityTooLarge"),
           "Throttled": ("RequestThrottled", "ThrottledException")}


def unread(request: Request, kind: str, message: str) -> Response:
    """An AWS error for a request whose body was not read (too large, or refused by
    admission control): SNS's when the target header names SNS; otherwise SQS's, since a
    Query request's action is in the body that was not read."""
    sqs_name, sns_name = _UNREAD[kind]
    error: service.AwsError
    if request.headers.get("x-amz-target", "").startswith("AmazonSNS."):
        target, error = sns.SERVICE, SnsError(sns_name, message)
    else:
        target, error = sqs.SERVICE, SqsError(sqs_name, message)
    return wire.error(target, service.protocol(request), error.info(), wire.new_request_id())
