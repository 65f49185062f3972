"""Unsubscribe links: the capability an HTTP(S) endpoint gets to unsubscribe itself.

An SNS Notification carries ``UnsubscribeURL``, ``<base>/?Action=Unsubscribe&SubscriptionArn=
<arn>``, which SNS serves without credentials. The ARN alone is no secret: every reader
lists it (ListSubscriptionsByTopic), so a read-only caller could stop any fan-out. The link
Conveyor delivers to an endpoint therefore ends with ``&Token=<token>``, a tag only this
server can make: the first 16 bytes of HMAC-SHA256 over the subscription's id, under a key
kept in the database (``conveyor.secrets``, as the receipts' key, ``core/receipts``), so every
server process of a database makes and accepts the same links, across restarts.

The envelope is written by SQL at publish time (``conveyor._envelope_parts``) and stored in
the webhook outbox without the token; the webhook worker adds it as it POSTs
(``Links.stamp``), so the token is in no table, queue or list a reader can see: only the
endpoint gets it. Queue subscriptions get no token: a queue's messages can be browsed by
readers, and unsubscribing a queue needs credentials (``docs/sns.md``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from uuid import UUID

from conveyor.db import execute as db

SECRET_NAME = "unsubscribe"
PARAMETER = "Token"  # the query parameter of the link that carries the token
_TAG_BYTES = 16
_FIELD = '\n  "UnsubscribeURL" : "'  # as _envelope_parts writes it: a raw newline only ever starts a field
_DECODER = json.JSONDecoder()


class Links:
    """Makes and checks unsubscribe tokens with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("an unsubscribe key has at least 32 bytes")
        self._key = key

    def token(self, subscription: UUID) -> str:
        tag = hmac.new(self._key, b"unsubscribe\0" + subscription.bytes, hashlib.sha256).digest()[:_TAG_BYTES]
        return base64.urlsafe_b64encode(tag).decode().rstrip("=")

    def valid(self, subscription: UUID, token: str | None) -> bool:
        """Whether ``token`` is the one this key makes for the subscription (constant time)."""
        return token is not None and hmac.compare_digest(self.token(subscription).encode(),
                                                         token.encode("utf-8", "surrogatepass"))

    def stamp(self, envelope: str, subscription: UUID) -> str:
        """The envelope with the subscription's token at the end of its UnsubscribeURL; an
        envelope without one (published from SQL without URLs), or whose link is another
        subscription's, as it is."""
        start = envelope.find(_FIELD)
        if start < 0:
            return envelope
        try:
            url, end = _DECODER.raw_decode(envelope, start + len(_FIELD) - 1)
        except ValueError:
            return envelope
        if not isinstance(url, str) or not url.endswith(str(subscription)):
            return envelope
        return f"{envelope[:end - 1]}&{PARAMETER}={self.token(subscription)}{envelope[end - 1:]}"


async def load(conn: db.Connection) -> Links:
    """The database's unsubscribe key (created now if it has none)."""
    key = await db.fetch_value(conn, "secret_get", {"name": SECRET_NAME, "candidate": secrets.token_bytes(32)})
    return Links(bytes(key))
