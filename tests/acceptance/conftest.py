"""Acceptance tests: seed 001's user stories US-1 to US-10, in Conveyor's names.

Each story is self-contained: it creates what it needs in its own fresh database
(fixture ``dsn``), acts through the SQL API as a developer with psql would, verifies,
and leaves nothing behind. No server runs: the stories call the ticker and maintenance
themselves, as a pg_cron job or ``conveyor serve`` would.
"""

from __future__ import annotations

import pytest

from conveyor.db import pool


@pytest.fixture
async def sql(dsn):
    """Run SQL like psql: autocommit, rows as tuples."""
    async with pool.connect(dsn) as conn:

        async def run(query: str, *params: object) -> list[tuple]:
            cur = await conn.execute(query, params or None)
            return await cur.fetchall() if cur.description else []

        run.conn = conn  # type: ignore[attr-defined]
        yield run
