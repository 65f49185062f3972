"""SNS subscription confirmation for HTTP(S) endpoints, as SNS does it.

Subscribe creates an HTTP(S) subscription unconfirmed (it receives nothing) and sends its
endpoint a signed ``SubscriptionConfirmation`` through the webhook outbox, with a Token
and a SubscribeURL (``{base}/?Action=ConfirmSubscription&TopicArn=...&Token=...``).
The endpoint confirms by fetching that URL (no credentials needed: the token is the
capability, as on AWS) or its owner calls ConfirmSubscription with the token.

A token is 288 hex characters, as SNS's are: the subscription's id (32) and a keyed digest
of it (256) made with the database's receipt key, so any server process of the database
checks any other's tokens and nothing needs storing.
"""

from __future__ import annotations

import json
import re
import uuid
from urllib.parse import quote

from conveyor import types
from conveyor.core import topics
from conveyor.protocols.sns import topic_attributes as attrs
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import SnsError, invalid

TOKEN_LENGTH = 288
_TOKEN = re.compile(r"^[0-9a-f]{288}$")
_LABEL = "sns-subscription-confirmation"


def token(ctx: Context, subscription: uuid.UUID) -> str:
    return subscription.hex + ctx.broker.receipts.digest_hex(_LABEL, subscription.hex, TOKEN_LENGTH - 32)


def subscription_of(ctx: Context, given: str) -> uuid.UUID:
    """The subscription a token names; SNS's errors for a malformed or made-up one."""
    if not _TOKEN.match(given):
        raise SnsError("InvalidParameterException", "Invalid token")
    key = given[:32]
    if token(ctx, uuid.UUID(key)) != given:
        raise invalid("Token")
    return uuid.UUID(key)


async def send(ctx: Context, topic: types.Topic, subscription: types.Subscription) -> None:
    """Queue the SubscriptionConfirmation for the subscription's endpoint."""
    arn = ctx.topic_arn(topic.name)
    secret = token(ctx, subscription.uuid)
    message_id = uuid.uuid4()
    fields = {
        "Type": "SubscriptionConfirmation",
        "MessageId": str(message_id),
        "Token": secret,
        "TopicArn": arn,
        "Message": f"You have chosen to subscribe to the topic {arn}.\n"
                   "To confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": f"{ctx.base_url}/?Action=ConfirmSubscription&TopicArn={quote(arn, safe=':')}&Token={secret}",
        "Timestamp": topics.timestamp(),
    }
    signer = await ctx.broker.signer()
    if signer is not None:
        version = attrs.signature_version(topic)
        fields |= {"SignatureVersion": version, "Signature": signer.sign(fields, version),
                   "SigningCertURL": ctx.urls.signing_cert_url(signer.digest)}
    headers = {"Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "SubscriptionConfirmation",
               "x-amz-sns-message-id": str(message_id), "x-amz-sns-topic-arn": arn}
    async with ctx.broker.connection() as conn:
        await topics.send_to_endpoint(conn, subscription.uuid, json.dumps(fields, indent=2), headers, message_id)
