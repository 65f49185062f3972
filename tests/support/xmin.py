"""Waiting for the oldest running transaction to pass a point: the Queen API's pops move
their group's mark only below it. It is the cluster's: the tests that wait for it run on
their worker's own cluster (``@pytest.mark.own_cluster``), where no other test's
transaction holds it back, only the harness's own chores for a moment."""

from __future__ import annotations

import asyncio


async def past_pushes(conn, *, seconds: float = 15.0) -> None:
    """Until the oldest running transaction is past every partition's push mark. A push
    marks its partitions with its transaction id rounded up to a multiple of 1024 (their
    updates stay HOT), so 1,100 transaction ids are spent first."""
    for _ in range(1100):
        await conn.execute("SELECT pg_current_xact_id()")
    await past(conn, "SELECT max(p.head_xid) FROM conveyor.partitions p", seconds=seconds)


async def past(conn, query: str, *, seconds: float = 15.0) -> None:
    """Until the oldest running transaction is past the xid8 that ``query`` reads (one
    transaction id is spent first, so that there is a newer one)."""
    await conn.execute("SELECT pg_current_xact_id()")
    for _ in range(int(seconds / 0.05)):
        cur = await conn.execute(f"SELECT pg_snapshot_xmin(pg_current_snapshot()) > ({query})")
        if (await cur.fetchone())[0]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the oldest running transaction stayed at or below {query} for {seconds:g} s")
