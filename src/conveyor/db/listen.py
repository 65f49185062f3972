"""LISTEN on a channel: one dedicated connection per process, notifications as strings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg

from conveyor.db import execute


async def notifications(dsn: str, channel: str,
                        on_listening: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[str]:
    """Yield payloads sent to ``channel`` until the connection breaks (then raise
    ``conveyor.errors.Unavailable``). ``on_listening`` runs once LISTEN is in effect."""
    with execute.translated():
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     application_name="conveyor-listen")
    try:
        with execute.translated():
            await conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        if on_listening is not None:
            await on_listening()
        with execute.translated():
            async for note in conn.notifies():
                yield note.payload
        raise execute.translate(psycopg.OperationalError("LISTEN connection closed"))
    finally:
        await conn.close()
