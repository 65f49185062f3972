"""The connection pool: its admission bound (beyond max_waiting requests waiting for a
connection, the next one is refused at once, errors.Throttled), and which failures prove
a statement never reached the database (errors.DatabaseUnreachable)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from psycopg import conninfo

from conveyor import errors
from conveyor.db import pool
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


# -- which failures prove the statement never ran (issue 25, item 11) ---------------------
# DatabaseUnreachable lets the failover spool take a write: only for failures that prove
# the database never ran it. A connection lost after the query was sent stays Unavailable.


class Proxy:
    """A loopback TCP proxy in front of the real PostgreSQL that can cut every connection
    (the client sees the server hang up, without any message from PostgreSQL)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.close()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()


def _via(dsn: str, proxy: Proxy) -> str:
    return conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port, sslmode="disable")


async def test_a_connection_terminated_by_the_server_is_unreachable_not_ambiguous(empty_dsn):
    """57P01 (pg_ctl stop -m fast, pg_terminate_backend): the server ends the backend at an
    interrupt check, which aborts whatever it was doing; nothing of the statement is kept."""
    db = Database(empty_dsn, min_size=1, max_size=1)
    await db.open(wait=True)
    try:
        with pytest.raises(errors.DatabaseUnreachable):
            async with db.connection() as conn:
                pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
                async with pool.connect(empty_dsn) as other:
                    await other.execute("SELECT pg_terminate_backend(%s)", (pid,))
                await asyncio.sleep(0.2)  # the FATAL is on its way before the next statement
                await conn.execute("SELECT 1")
        assert db.down
    finally:
        await db.close()


async def test_an_idle_connection_the_server_terminated_is_found_before_anything_is_sent(empty_dsn):
    """What ``pg_ctl stop -m fast`` leaves in the pool: the server's 57P01 and the end of the
    stream, unread. The next checkout reads them (no query is sent on that connection) and,
    the server still refusing nothing, replaces the connection."""
    db = Database(empty_dsn, min_size=1, max_size=1)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
        async with pool.connect(empty_dsn) as other:
            await other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await asyncio.sleep(0.2)
        async with db.connection() as conn:
            assert (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0] != pid
        assert not db.down
    finally:
        await db.close()


async def test_idle_connections_cut_while_the_database_is_up_are_replaced_unnoticed(empty_dsn):
    """A proxy's idle cut (or idle_session_timeout) closes pooled connections while the
    database is fine: the requests that find them get other, working ones."""
    port = int(conninfo.conninfo_to_dict(empty_dsn).get("port") or 5432)
    proxy = await Proxy(port).start()
    db = Database(_via(empty_dsn, proxy), min_size=2, max_size=2)
    await db.open(wait=True)
    try:
        async with db.connection() as a, db.connection() as b:
            await a.execute("SELECT 1")
            await b.execute("SELECT 1")
        proxy.cut()
        await asyncio.sleep(0.2)
        async with db.connection() as a, db.connection() as b:  # both idle ones were cut
            await a.execute("SELECT 1")
            await b.execute("SELECT 1")
        assert not db.down
    finally:
        await db.close()
        await proxy.close()


async def test_idle_connections_found_closed_while_the_database_is_gone_are_unreachable(empty_dsn):
    """Every idle connection closed and no new one to be had (a server shut down): the
    request fails within REPLACE_TIMEOUT as unreachable, nothing having been sent."""
    port = int(conninfo.conninfo_to_dict(empty_dsn).get("port") or 5432)
    proxy = await Proxy(port).start()
    db = Database(_via(empty_dsn, proxy), min_size=1, max_size=1)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await conn.execute("SELECT 1")
        await proxy.close()  # no new connections either
        await asyncio.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(errors.DatabaseUnreachable, match="closed"):
            async with db.connection() as conn:
                await conn.execute("SELECT 1")
        assert time.monotonic() - started < pool.REPLACE_TIMEOUT + 1
        assert db.down
    finally:
        await db.close()


async def test_a_connection_lost_after_the_query_was_sent_stays_ambiguous(empty_dsn):
    """The link drops while the statement runs: it may have committed, so the failure is
    Unavailable (refused, 503) and never DatabaseUnreachable (which may be spooled)."""
    port = int(conninfo.conninfo_to_dict(empty_dsn).get("port") or 5432)
    proxy = await Proxy(port).start()
    db = Database(_via(empty_dsn, proxy), min_size=1, max_size=1)
    await db.open(wait=True)
    try:
        with pytest.raises(errors.Unavailable) as raised:
            async with db.connection() as conn:
                asyncio.get_running_loop().call_later(0.3, proxy.cut)
                await conn.execute("SELECT pg_sleep(2)")
        assert not isinstance(raised.value, errors.DatabaseUnreachable)
    finally:
        await db.close()
        await proxy.close()
