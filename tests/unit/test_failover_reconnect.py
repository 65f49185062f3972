"""How the server's connections follow a PostgreSQL failover (docs/operations.md,
"PostgreSQL failover"), against the real PostgreSQL: a write refused as read-only (a
demoted primary) is "unavailable" and replaces every pooled connection; the pool and the
LISTEN connection come back soon after an outage, however long it was. An outage is a
loopback TCP proxy in front of PostgreSQL that drops every connection and refuses new
ones until it is restored; tests/faults/test_failover.py does the whole thing with a
real pg_auto_failover formation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from psycopg import conninfo

from conveyor import errors
from conveyor.core import queues
from conveyor.db import pool
from conveyor.server import waiters
from support.server import free_port


class Outage:
    """A TCP proxy to PostgreSQL that can go away (every connection dropped, new ones
    refused) and come back on the same port."""

    def __init__(self, dsn: str) -> None:
        params = conninfo.conninfo_to_dict(dsn)
        self.upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.port = free_port()
        self.dsn = conninfo.make_conninfo(dsn, host="127.0.0.1", port=self.port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._writers.discard(writer)


@pytest.fixture
async def outage(dsn: str) -> AsyncIterator[Outage]:
    proxy = Outage(dsn)
    await proxy.restore()
    yield proxy
    if proxy._server is not None:
        await proxy.cut()


async def backend_pids(db: pool.Database, n: int) -> set[int]:
    """The server process ids behind ``n`` pooled connections held at once."""
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(db.connection()) for _ in range(n)]
        return {(await (await c.execute("SELECT pg_backend_pid()")).fetchone())[0] for c in conns}


async def test_a_write_refused_as_read_only_is_unavailable(conn):
    await conn.execute("SET default_transaction_read_only = on")  # what a demoted primary says
    with pytest.raises(errors.Unavailable):
        await queues.create(conn, "refused")


async def test_a_read_only_refusal_replaces_every_pooled_connection(dsn):
    db = pool.Database(dsn, min_size=3, max_size=3)
    await db.open(wait=True)
    try:
        async with contextlib.AsyncExitStack() as stack:  # the server turns read-only under them
            for _ in range(3):
                c = await stack.enter_async_context(db.connection())
                await c.execute("SET default_transaction_read_only = on")
        before = await backend_pids(db, 3)
        with pytest.raises(errors.Unavailable):
            async with db.connection() as c:
                await queues.create(c, "refused")
        for _ in range(50):  # the pool reopens its connections in the background
            await asyncio.sleep(0.1)
            if not (await backend_pids(db, 3)) & before:
                break
        assert not (await backend_pids(db, 3)) & before, "every connection was replaced"
        async with db.connection() as c:  # and the new ones write
            await queues.create(c, "accepted")
        assert db.down is False
    finally:
        await db.close()


async def test_the_pool_is_back_soon_after_a_long_outage(outage):
    db = pool.Database(outage.dsn, min_size=2, max_size=2)
    await db.open(wait=True)
    try:
        await outage.cut()
        with pytest.raises(errors.Unavailable):  # the pool learns of it from a call
            async with db.connection() as c:
                await c.execute("SELECT 1")
        # psycopg_pool alone would next retry at ~15 s: 1, 2, 4, 8 s apart
        await asyncio.sleep(8.0)
        await outage.restore()
        restored = time.monotonic()
        while True:
            with contextlib.suppress(errors.Unavailable):
                async with db.connection(timeout=0.5) as c:
                    await c.execute("SELECT 1")
                    break
            assert time.monotonic() - restored < 4.0, "a connection within 4 s of the database's return"
            await asyncio.sleep(0.05)
    finally:
        await db.close()


async def test_listen_reconnects_quickly_after_a_second_outage(outage):
    """A long outage grows the LISTEN reconnect delay; once reconnected, the next outage
    starts again from a short delay even though no notification came in between."""

    async def mark(queue: str, seconds: int) -> None:
        pass

    hub = waiters.WaiterHub(outage.dsn, mark, poll_fallback=100.0)
    await hub.start()
    try:
        with hub.register("q") as waiter:  # every waiter is woken when LISTEN is back
            await outage.cut()
            await asyncio.sleep(3.0)  # retries 0.1, 0.2, 0.4, 0.8, 1.6 s apart: the next one 3.2 s later
            await outage.restore()
            assert await waiter.wait(5.0), "LISTEN re-established after the first outage"
            await outage.cut()
            await asyncio.sleep(0.3)
            await outage.restore()
            restored = time.monotonic()
            assert await waiter.wait(5.0), "LISTEN re-established after the second outage"
            assert time.monotonic() - restored < 1.5, "without the first outage's long delay"
    finally:
        await hub.stop()


def test_a_refusal_by_admission_control_is_not_an_outage():
    """psycopg_pool's TooManyRequests (max_waiting reached) is an OperationalError without
    a SQLSTATE, like a lost connection: it must not trip the fail-fast (a test under
    overload saw SQS answer ServiceUnavailable for it)."""
    import psycopg_pool

    from conveyor.db.pool import _unreachable

    assert not _unreachable(psycopg_pool.TooManyRequests("the pool has 4 requests queued"))
    assert _unreachable(psycopg_pool.PoolTimeout("couldn't get a connection"))
