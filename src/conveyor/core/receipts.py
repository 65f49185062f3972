"""Receipts: what a consumer gets with each delivery of a queue message and gives back to
acknowledge it (SQS's ReceiptHandle, the REST API's ``receipt``).

A receipt names the queue, the message and the delivery (the message's receive count
when it was received), plus a random nonce so that every receive yields a new string, as
SQS's do. It is authenticated with HMAC-SHA256 under a key kept in the database
(``conveyor.secrets``, created by the first server that needs it), so every server
process of a database accepts the receipts any other gave out, across restarts, and
nobody without the key can make one up. The receive count is what makes a receipt
single-delivery: once the message is received again its count moves on, and the old
receipt no longer matches (see ``conveyor.message_delete(queue, ids, receive_counts)``).

Form: base64url("<queue>\\0<message id>\\0<receive count>\\0<nonce>") "." base64url(tag),
the tag being the first 16 bytes of the HMAC of the part before the dot.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from conveyor.db import execute as db

SECRET_NAME = "receipts"
_TAG_BYTES = 16
_MAX_LENGTH = 1024  # a queue name is at most ~120 characters; anything longer is not ours


@dataclass(frozen=True, slots=True)
class Receipt:
    queue: str
    message_id: int
    receive_count: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_INNER_PAD = bytes(x ^ 0x36 for x in range(256))  # HMAC's pads (RFC 2104), as translate tables
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))


class Keyring:
    """Makes and checks receipts with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("a receipt key has at least 32 bytes")
        self._key = key
        # HMAC-SHA256 with its two keyed hash states made once: each receipt copies them
        # (hmac.new sets them up again per call, most of its cost on a short payload)
        block = (key if len(key) <= 64 else hashlib.sha256(key).digest()).ljust(64, b"\0")
        self._inner = hashlib.sha256(block.translate(_INNER_PAD))
        self._outer = hashlib.sha256(block.translate(_OUTER_PAD))

    def _tag(self, payload: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:_TAG_BYTES]

    def digest_hex(self, label: str, value: str, length: int) -> str:
        """A keyed digest of ``value`` for ``label`` (HMAC-SHA512 blocks), ``length`` hex
        characters long: what SNS confirmation tokens are made of."""
        out, block = "", 0
        while len(out) < length:
            out += hmac.new(self._key, f"{label}\0{block}\0{value}".encode(), hashlib.sha512).hexdigest()
            block += 1
        return out[:length]

    def encode(self, queue: str, message_id: int, receive_count: int) -> str:
        payload = f"{queue}\0{message_id}\0{receive_count}\0{secrets.token_hex(4)}".encode()
        return f"{_b64(payload)}.{_b64(self._tag(payload))}"

    def decode(self, receipt: str, queue: str) -> Receipt | None:
        """The delivery a receipt stands for, or None unless it is one this key made for
        this queue."""
        if not receipt or len(receipt) > _MAX_LENGTH:
            return None
        body, dot, tag = receipt.partition(".")
        try:
            payload = _unb64(body)
            if not dot or not hmac.compare_digest(_unb64(tag), self._tag(payload)):
                return None
            name, message_id, receive_count, _nonce = payload.decode().split("\0")
            found = Receipt(name, int(message_id), int(receive_count))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return found if found.queue == queue else None


async def load(conn: db.Connection) -> Keyring:
    """The database's receipt key (created now if it has none)."""
    key = await db.fetch_value(conn, "secret_get", {"name": SECRET_NAME, "candidate": secrets.token_bytes(32)})
    return Keyring(bytes(key))
