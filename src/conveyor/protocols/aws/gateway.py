"""``POST /`` and ``POST /{account_id}/{queue_name}``: where AWS clients arrive.

The request is handed to the service it is meant for. SQS is the default; SNS requests
are told apart by ``X-Amz-Target: AmazonSNS.*`` (JSON) or an SNS ``Action=`` (Query)
once Conveyor speaks SNS.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from conveyor.protocols.sqs import dispatch as sqs


async def endpoint(request: Request) -> Response:
    body = await request.body()
    return await sqs.handle(request.app.state.sqs, request, body)
