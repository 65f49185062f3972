"""Encryption at rest: message bodies sealed with AES-256-GCM under a key the server holds
(``CONVEYOR_ENCRYPTION_KEY``), so PostgreSQL stores, logs and backs up only ciphertext.

One mechanism for every protocol: the broker seals what it writes to an encrypted queue
(REST, SQS, topic fan-out, Queen pushes) and opens what it reads, whatever the queue's
flag says now, because each sealed body says so itself:

- a sealed queue message keeps its body as ``base64(nonce | ciphertext | tag)`` and its
  ``content_type`` as ``application/vnd.conveyor.sealed; kid=<key id>; type=<original
  content type>``; the marker is authenticated (GCM's associated data), so it cannot be
  altered without the body failing to open;
- a sealed Queen payload is the JSON string ``"<kid>:<base64(...)>"`` with the message's
  ``is_encrypted`` set.

Keys are ``kid:base64(32 bytes)`` entries, comma-separated; the first encrypts, all of
them decrypt, so a key is rotated by putting a new one first and running
``conveyor queues reencrypt`` (which reseals whatever an older key sealed) before the old
one is removed. Message attributes (SQS MessageAttributes, REST headers) are metadata and
stay readable, as Amazon SQS's server-side encryption leaves them, so filter policies and
MD5OfMessageAttributes work unchanged; MD5OfMessageBody is computed on the plaintext
before sealing and after opening.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from conveyor import errors
from conveyor.settings import parse_keys

SEALED = "application/vnd.conveyor.sealed"
_MARKER = re.compile(r"^application/vnd\.conveyor\.sealed; kid=([A-Za-z0-9_.-]{1,64}); type=(.*)$", re.S)
NONCE_BYTES = 12


def is_sealed(content_type: str | None) -> bool:
    return content_type is not None and content_type.startswith(SEALED)


def sealed_kid(content_type: str | None) -> str | None:
    match = _MARKER.match(content_type or "")
    return match[1] if match else None


@dataclass(frozen=True)
class Keyring:
    """The server's keys by id; ``active`` seals, all of them open."""

    keys: dict[str, AESGCM]
    active: str

    @classmethod
    def of(cls, keys: Sequence[tuple[str, bytes]]) -> Keyring:
        """From ``Settings.encryption_keys`` (checked there): the first one seals."""
        return cls({kid: AESGCM(raw) for kid, raw in keys}, keys[0][0])

    @classmethod
    def parse(cls, spec: str) -> Keyring:
        """``kid:base64key[,kid:base64key...]``; each key 32 bytes (AES-256)."""
        return cls.of(parse_keys(spec))

    @staticmethod
    def generate(kid: str) -> str:
        """A new ``kid:base64key`` entry."""
        return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"

    def _aead(self, kid: str) -> AESGCM:
        aead = self.keys.get(kid)
        if aead is None:
            raise errors.Unavailable(f"a message was sealed with encryption key {kid!r}, which this server does not "
                                     "have (CONVEYOR_ENCRYPTION_KEY)")
        return aead

    # -- queue messages: body and content type ------------------------------------------

    def seal(self, body: str, content_type: str | None) -> tuple[str, str]:
        marker = f"{SEALED}; kid={self.active}; type={content_type or ''}"
        nonce = os.urandom(NONCE_BYTES)
        sealed = self.keys[self.active].encrypt(nonce, body.encode("utf-8"), marker.encode("utf-8"))
        return base64.b64encode(nonce + sealed).decode("ascii"), marker

    def open(self, body: str, content_type: str | None) -> tuple[str, str | None]:
        """A stored body and content type as they were before sealing (unsealed ones as
        they are)."""
        marker = content_type or ""
        match = _MARKER.match(marker)
        if not match:
            return body, content_type
        raw = base64.b64decode(body)
        try:
            plain = self._aead(match[1]).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], marker.encode("utf-8"))
        except InvalidTag:
            raise errors.InternalError("a sealed message failed authentication: its stored form was altered") from None
        return plain.decode("utf-8"), match[2] or None

    # -- Queen payloads: any JSON value ---------------------------------------------------

    def seal_text(self, text: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self.keys[self.active].encrypt(nonce, text.encode("utf-8"), self.active.encode())
        return f"{self.active}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def open_text(self, sealed: str) -> str:
        kid, _, encoded = sealed.partition(":")
        raw = base64.b64decode(encoded)
        try:
            return self._aead(kid).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], kid.encode()).decode("utf-8")
        except InvalidTag:
            raise errors.InternalError("a sealed payload failed authentication: its stored form was altered") from None

    def text_kid(self, sealed: str) -> str:
        return sealed.partition(":")[0]
