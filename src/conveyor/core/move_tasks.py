"""Move tasks: messages of a dead-letter queue moved back to where they came from."""

from __future__ import annotations

from uuid import UUID

from conveyor import types
from conveyor.db import execute as db

Connection = db.Connection


async def start(conn: Connection, source: str, destination: str | None = None,
                max_per_second: int | None = None) -> types.MoveTask:
    return await db.fetch_row(conn, "move_task_start", {
        "source": source, "destination": destination, "max_per_second": max_per_second}, row=types.MoveTask)


async def cancel(conn: Connection, handle: UUID) -> types.MoveTask:
    return await db.fetch_row(conn, "move_task_cancel", {"handle": handle}, row=types.MoveTask)


async def list_for(conn: Connection, source: str, max_results: int = 1) -> list[types.MoveTask]:
    return await db.fetch_all(conn, "move_task_list", {"source": source, "max_results": max_results},
                              row=types.MoveTask)


async def step(conn: Connection, max_rows: int = 1000) -> int:
    """One round of moving for every running task (the server calls it every second)."""
    return int(await db.fetch_value(conn, "move_task_step", {"max_rows": max_rows}) or 0)



