"""Who holds a session advisory lock: the server's one-process-per-database jobs (the
stream ticker, the vacuum) are told apart by the key they hold."""

from __future__ import annotations


async def advisory_lock_holders(conn, key: int) -> list[int]:
    """Backends holding the advisory lock ``key`` in this database (a bigint key is stored
    as classid = high 32 bits, objid = low 32 bits, objsubid = 1)."""
    cur = await conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND classid = %s AND objid = %s"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (key >> 32, key & 0xFFFFFFFF))
    return [pid for (pid,) in await cur.fetchall()]
