"""What hq's API needs beyond the message ops: finding a message by its UUID alone (the
hq dialect's ``hq.message_locate``, sql/dialects/hq)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from conveyor.db import execute as db

Connection = db.Connection


@dataclass(frozen=True, slots=True)
class Located:
    """A live message found by UUID, at its current delivery."""

    queue_name: str
    id: int
    receive_count: int
    in_flight: bool  # received and still invisible (hq: locked)


async def locate(conn: Connection, message_uuid: UUID) -> Located | None:
    """The live message with this UUID, None if there is none (never sent, or already
    completed, failed or deleted)."""
    return await db.fetch_one(conn, "message_hq_locate", {"message_uuid": message_uuid}, row=Located)
