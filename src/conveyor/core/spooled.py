"""The failover spool's replay ledger (migration 0011; the journal itself is the
server's, conveyor.server.spool): which journal records are in the database already."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.db import execute as db
from conveyor.db.execute import Connection


async def claim(conn: Connection, keys: Sequence[str]) -> set[str]:
    """Record ``keys`` as replayed in the caller's transaction; those not recorded before
    (the records to store now)."""
    return set(await db.fetch_column(conn, "spool_claim", {"keys": list(keys)}))


async def forget(conn: Connection, prefix: str) -> int:
    """Forget the keys of a segment removed from disk (``"<slot>/<segment>/"``)."""
    return int(await db.fetch_scalar(conn, "spool_forget", {"prefix": prefix}, int))
