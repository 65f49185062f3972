"""Message operations: send, receive, acknowledge, fail, change visibility."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from conveyor import errors, types
from conveyor.db import execute as db

Connection = db.Connection


async def send(conn: Connection, queue: str, message: types.OutgoingMessage) -> int:
    return int(await db.fetch_value(conn, "message_send", {
        "queue": queue,
        "body": message.body,
        "headers": message.headers,
        "delay": message.delay,
        "content_type": message.content_type,
        "group_id": message.group_id,
        "dedup_id": message.dedup_id,
    }))


async def send_batch(conn: Connection, queue: str, messages: Sequence[types.OutgoingMessage]) -> list[types.Sent]:
    """Send many messages in one SQL call; results come back in input order."""
    if any("\x00" in m.body for m in messages):
        # PostgreSQL text cannot hold NUL; say so rather than echo a JSON parser error
        raise errors.InvalidInput("message bodies cannot contain NUL characters (U+0000)")
    payload = orjson.dumps([m.to_json() for m in messages]).decode()
    return await db.fetch_all(conn, "message_send_json", {"queue": queue, "messages": payload}, row=types.Sent)


async def receive(conn: Connection, queue: str, qty: int = 1, vt: int | None = None,
                  wait: int = 0, *, lazy: bool = False) -> list[types.Message]:
    """Claim up to ``qty`` visible messages, in the order the SQL API returns them (by id;
    a FIFO queue's group by group, each group in order, as SQS answers). ``wait`` > 0 polls
    inside the database; the server never does that (see ``conveyor.server.waiters``).
    ``lazy`` (no ``wait``): the call is its own transaction (``conn`` in autocommit), whose
    claim on a standard queue commits without waiting for the WAL flush
    (``conveyor.message_receive_lazy``; docs/architecture.md, "Durability of a receive")."""
    if lazy:
        if wait:
            raise ValueError("a lazy receive does not wait in the database")
        return await db.fetch_all(conn, "message_receive_lazy", {"queue": queue, "vt": vt, "qty": qty},
                                  row=types.Message)
    return await db.fetch_all(conn, "message_receive",
                              {"queue": queue, "vt": vt, "qty": qty, "wait": wait}, row=types.Message)


async def receive_grouped(conn: Connection, queue: str, qty: int = 1, vt: int | None = None) -> list[types.Message]:
    """Claim up to ``qty`` messages in group order, from groups with nothing in flight, on
    a queue of either kind (on a standard queue, by the group ids its messages carry); they
    come group by group, each group's in order."""
    return await db.fetch_all(conn, "message_receive_fifo", {"queue": queue, "vt": vt, "qty": qty},
                              row=types.Message)


async def receive_attempt(conn: Connection, queue: str, attempt_id: str, qty: int = 1,
                          vt: int | None = None) -> list[types.Message]:
    """A FIFO receive that a retry with the same ``attempt_id`` repeats (for five minutes,
    while none of its messages changed)."""
    return await db.fetch_all(conn, "message_receive_attempt",
                              {"queue": queue, "attempt_id": attempt_id, "vt": vt, "qty": qty}, row=types.Message)


async def pop(conn: Connection, queue: str, qty: int = 1) -> list[types.Message]:
    rows = await db.fetch_all(conn, "message_pop", {"queue": queue, "qty": qty}, row=types.Message)
    return sorted(rows, key=lambda m: m.id)


async def peek(conn: Connection, queue: str, qty: int = 10, after_id: int = 0) -> list[types.Message]:
    return await db.fetch_all(conn, "message_peek", {"queue": queue, "qty": qty, "after_id": after_id},
                              row=types.Message)


def _counts(ids: Sequence[int], receive_counts: Sequence[int | None] | None) -> list[int | None]:
    if receive_counts is None:
        return [None] * len(ids)
    if len(receive_counts) != len(ids):
        raise errors.InvalidInput("one receive count per message id")
    return list(receive_counts)


async def delete(conn: Connection, queue: str, ids: Sequence[int],
                 receive_counts: Sequence[int | None] | None = None) -> list[int]:
    """Delete messages; returns the ids deleted. With ``receive_counts`` (one per id, None
    for any), only messages still at that delivery go: a consumer whose message was
    received again since cannot delete it from under the newer one."""
    return sorted(await db.fetch_column(conn, "message_delete", {
        "queue": queue, "ids": list(ids), "receive_counts": _counts(ids, receive_counts)}))


async def delete_in_flight(conn: Connection, queue: str, ids: Sequence[int],
                           receive_counts: Sequence[int | None]) -> tuple[list[int], list[int]]:
    """Delete the messages still at the given deliveries and still in flight (SQS's
    DeleteMessage on a FIFO queue). Returns the ids deleted, and those of messages still
    there whose delivery is over (visible again, or received again since)."""
    rows = await db.fetch_all(conn, "message_delete_in_flight", {
        "queue": queue, "ids": list(ids), "receive_counts": _counts(ids, receive_counts)})
    return sorted(i for i, deleted in rows if deleted), sorted(i for i, deleted in rows if not deleted)


async def archive(conn: Connection, queue: str, ids: Sequence[int],
                  receive_counts: Sequence[int | None] | None = None) -> list[int]:
    """Move messages to the archive as completed; returns the ids archived (``receive_counts``
    as for ``delete``)."""
    return sorted(await db.fetch_column(conn, "message_archive", {
        "queue": queue, "ids": list(ids), "receive_counts": _counts(ids, receive_counts)}))


async def fail(conn: Connection, queue: str, message_id: int, reason: str | None = None,
               receive_count: int | None = None) -> bool:
    """Fail a message: to the dead-letter queue, else to the archive as failed."""
    return bool(await db.fetch_value(conn, "message_fail", {
        "queue": queue, "id": message_id, "reason": reason, "receive_count": receive_count}))


async def set_vt(conn: Connection, queue: str, ids: Sequence[int], vt: int, in_flight_only: bool = False,
                 receive_counts: Sequence[int | None] | None = None) -> list[types.Message]:
    """Make messages visible again in ``vt`` seconds; returns those changed (``receive_counts``
    as for ``delete``)."""
    rows = await db.fetch_all(conn, "message_set_vt", {
        "queue": queue, "ids": list(ids), "receive_counts": _counts(ids, receive_counts), "vt": vt,
        "in_flight_only": in_flight_only}, row=types.Message)
    return sorted(rows, key=lambda m: m.id)

