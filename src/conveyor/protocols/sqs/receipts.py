"""Receipt handles: opaque to clients, they name the queue, the message and the receive.

A handle is base64url of ``<queue>\\0<message id>\\0<receive count>\\0<nonce>\\0<check>``:
every receive yields a new handle (as SQS does), a handle from one queue is refused by
another, and the check (a digest of the rest) refuses truncated or made-up handles.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from dataclasses import dataclass

from conveyor.protocols.sqs.errors import SqsError


@dataclass(frozen=True, slots=True)
class Receipt:
    queue: str
    message_id: int
    receive_count: int


def _check(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def encode(queue: str, message_id: int, receive_count: int) -> str:
    payload = f"{queue}\0{message_id}\0{receive_count}\0{secrets.token_hex(4)}"
    raw = f"{payload}\0{_check(payload)}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(handle: str | None, queue: str) -> Receipt:
    """The receipt a handle stands for; ReceiptHandleIsInvalid unless it is one of this queue's."""
    if not handle:
        raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        payload, _, check = raw.rpartition("\0")
        name, message_id, receive_count, _nonce = payload.split("\0")
        receipt = Receipt(name, int(message_id), int(receive_count))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid(handle) from None
    if check != _check(payload):
        raise invalid(handle)
    if receipt.queue != queue:
        raise invalid(handle)
    return receipt


def invalid(handle: str) -> SqsError:
    return SqsError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.')
