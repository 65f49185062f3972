"""The connection pool's admission bound: beyond max_waiting requests waiting for a
connection, the next one is refused at once (errors.Throttled), not queued."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import errors
from conveyor.db.pool import Database


async def test_waiting_for_a_connection_is_bounded(dsn):
    db = Database(dsn, min_size=1, max_size=1, max_waiting=1, timeout=5)
    await db.open(wait=True)
    try:
        async with db.connection():
            async def wait_for_one() -> None:
                async with db.connection():
                    pass

            waiter = asyncio.create_task(wait_for_one())
            await asyncio.sleep(0.1)  # the waiter is queued
            with pytest.raises(errors.Throttled):
                async with db.connection():
                    pass
        await waiter  # served once the connection came back
    finally:
        await db.close()
