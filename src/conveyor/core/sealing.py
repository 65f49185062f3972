"""Re-sealing stored messages (``conveyor queues reencrypt``): after a new key is put
first in ``CONVEYOR_ENCRYPTION_KEY``, every body sealed with an older key is opened and
sealed again with the new one, and messages of queues that turned encryption on after
they were stored are sealed; then the old key can be removed. Queue messages, their
archive and partitioned-queue messages with their dead letters, a page per transaction,
skipping rows another transaction holds (run it again to finish those)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from conveyor import crypto
from conveyor.db import execute as db
from conveyor.db.execute import Connection

PAGE = 500


@dataclass
class Resealed:
    messages: int = 0
    archived: int = 0
    partitioned: int = 0
    dead_letters: int = 0

    @property
    def total(self) -> int:
        return self.messages + self.archived + self.partitioned + self.dead_letters


def _queue_row(keyring: crypto.Keyring, row: tuple[Any, ...]) -> dict[str, Any]:
    queue_id, message_id, body, content_type = row
    plain, original_type = keyring.open(body, content_type)
    sealed, marker = keyring.seal(plain, original_type)
    return {"queue_id": queue_id, "id": message_id, "body": sealed, "content_type": marker}


def _payload(keyring: crypto.Keyring, payload: Any, is_encrypted: bool) -> Any:
    text = keyring.open_text(payload) if is_encrypted else orjson.dumps(payload).decode()
    return keyring.seal_text(text)


def _partition_row(keyring: crypto.Keyring, row: tuple[Any, ...]) -> dict[str, Any]:
    partition_id, seq, payload, is_encrypted = row
    return {"partition_id": partition_id, "seq": seq, "payload": _payload(keyring, payload, is_encrypted)}


def _dead_letter_row(keyring: crypto.Keyring, row: tuple[Any, ...]) -> dict[str, Any]:
    dead_letter_id, payload, is_encrypted = row
    return {"id": dead_letter_id, "payload": _payload(keyring, payload, is_encrypted)}


async def _pages(conn: Connection, keyring: crypto.Keyring, pending: str, update: str,
                 convert: Callable[[crypto.Keyring, tuple[Any, ...]], dict[str, Any]],
                 progress: Callable[[int], None] | None) -> int:
    done = 0
    while True:
        async with conn.transaction():
            rows = await db.fetch_all(conn, pending, {"kid": keyring.active, "limit": PAGE})
            if not rows:
                return done
            await db.fetch_all(conn, update, {"rows": db.jsonb([convert(keyring, r) for r in rows])})
        done += len(rows)
        if progress is not None:
            progress(len(rows))


async def reseal(conn: Connection, keyring: crypto.Keyring,
                 progress: Callable[[int], None] | None = None) -> Resealed:
    """Seal with the active key whatever is sealed with another one or should be sealed
    and is not. ``progress`` is called with each page's count."""
    return Resealed(
        messages=await _pages(conn, keyring, "message_seal_pending", "message_seal_update", _queue_row, progress),
        archived=await _pages(conn, keyring, "message_seal_archive_pending", "message_seal_archive_update",
                              _queue_row, progress),
        partitioned=await _pages(conn, keyring, "pqueue_seal_pending", "pqueue_seal_update", _partition_row,
                                 progress),
        dead_letters=await _pages(conn, keyring, "pqueue_seal_dead_letter_pending", "pqueue_seal_dead_letter_update",
                                  _dead_letter_row, progress),
    )
