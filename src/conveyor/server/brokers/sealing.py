"""Encryption at rest (conveyor.crypto) for every broker: what is written to an encrypted
queue or partitioned queue is sealed with the server's key, what is read is opened,
whatever the queue's flag is now. No database access: the brokers say which queues are
encrypted."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import orjson

from conveyor import crypto, errors, types


class Sealing:
    def __init__(self, keyring: crypto.Keyring | None) -> None:
        self.keyring = keyring

    def can_encrypt(self) -> bool:
        return self.keyring is not None

    def keyring_for(self, what: str) -> crypto.Keyring:
        """The key, or a clear refusal naming ``what`` is encrypted."""
        if self.keyring is None:
            raise errors.Unavailable(f"{what} is encrypted and this server has no encryption key "
                                     "(CONVEYOR_ENCRYPTION_KEY)")
        return self.keyring

    # -- queues ------------------------------------------------------------------------

    def seal(self, q: types.Queue, batch: Sequence[types.OutgoingMessage]) -> list[types.OutgoingMessage]:
        """``batch`` as stored in the encrypted queue ``q``."""
        keyring = self.keyring_for(f"queue {q.name!r}")
        out = []
        for m in batch:
            dedup = m.dedup_id
            if q.fifo and dedup is None and q.content_based_deduplication:
                # the database would hash the sealed body, which differs on every send
                dedup = hashlib.sha256(m.body.encode("utf-8")).hexdigest()
            body, content_type = keyring.seal(m.body, m.content_type)
            out.append(dataclasses.replace(m, body=body, content_type=content_type, dedup_id=dedup))
        return out

    def opened(self, got: list[types.Message]) -> list[types.Message]:
        """Messages as they were sent: sealed bodies opened, whatever the queue's flag is now."""
        if not any(crypto.is_sealed(m.content_type) for m in got):
            return got
        keyring = self.keyring_for("a message")
        out = []
        for m in got:
            if crypto.is_sealed(m.content_type):
                body, content_type = keyring.open(m.body, m.content_type)
                m = dataclasses.replace(m, body=body, content_type=content_type)
            out.append(m)
        return out

    # -- partitioned queues ------------------------------------------------------------

    def seal_items(self, items: Sequence[dict[str, Any]], encrypted: AbstractSet[str | None]) -> list[dict[str, Any]]:
        """Pushed items with the payloads bound for the ``encrypted`` queues sealed."""
        keyring = self.keyring_for(f"queue {sorted(str(n) for n in encrypted)[0]!r}")
        return [{**i, "payload": keyring.seal_text(orjson.dumps(i.get("payload")).decode()), "encrypted": True}
                if i.get("queue") in encrypted else i for i in items]

    def pq_opened(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Partitioned-queue messages (pops, dead letters, lookups) with sealed payloads
        (``encrypted``/``isEncrypted``) opened, under ``data`` or ``payload``."""
        out = []
        for doc in docs:
            if doc.get("encrypted") or doc.get("isEncrypted"):
                keyring = self.keyring_for("a message")
                key = "data" if "data" in doc else "payload"
                doc = {**doc, key: orjson.loads(keyring.open_text(doc[key]))}
            out.append(doc)
        return out
