"""LISTEN on channels: one dedicated connection per process, notifications as
(channel, payload) pairs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import psycopg

from conveyor.db import execute


async def notifications(dsn: str, channels: Sequence[str],
                        on_listening: Callable[[], Awaitable[None]] | None = None
                        ) -> AsyncIterator[tuple[str, str]]:
    """Yield (channel, payload) for notifications on ``channels`` until the connection
    breaks (then raise ``conveyor.errors.Unavailable``). ``on_listening`` runs once LISTEN
    is in effect."""
    with execute.translated():
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     application_name="conveyor-listen")
    try:
        with execute.translated():
            for channel in channels:
                await conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        if on_listening is not None:
            await on_listening()
        with execute.translated():
            async for note in conn.notifies():
                yield note.channel, note.payload
        raise execute.translate(psycopg.OperationalError("LISTEN connection closed"))
    finally:
        await conn.close()
