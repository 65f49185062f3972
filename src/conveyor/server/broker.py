"""The server's implementation of ``conveyor.protocols.broker.Broker``: core ops plus
fusion, long-poll waiters and per-queue metrics. Every protocol goes through here."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server.fusion import SendFuser
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import WaiterHub
from conveyor.settings import Settings


class ServerBroker:
    def __init__(self, settings: Settings, database: Database, metrics: Metrics) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics
        self.fuser = SendFuser(self._send_batch, max_batch=settings.fusion_max_batch,
                               max_inflight=settings.fusion_max_inflight,
                               on_flush=metrics.fusion_batch.observe) if settings.fusion else None
        self.waiters = WaiterHub(database.dsn, self._mark_listened, listen_seconds=settings.listen_seconds,
                                 poll_fallback=settings.poll_fallback_seconds)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.database.connection() as conn:
            yield conn

    async def _timed(self, histogram, queue, coro):  # noqa: ANN001, ANN202 - internal helper
        started = time.perf_counter()
        try:
            return await coro
        finally:
            histogram.labels(queue).observe(time.perf_counter() - started)

    # -- send ------------------------------------------------------------------------

    async def _send_batch(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[int]:
        async with self.database.connection() as conn:
            ids = await self._timed(self.metrics.send_duration, queue, messages.send_batch(conn, queue, batch))
        self.metrics.sent.labels(queue).inc(len(ids))
        return ids

    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[int]:
        if self.fuser is not None:
            return await self.fuser.send(queue, batch)
        return await self._send_batch(queue, batch)

    # -- receive ---------------------------------------------------------------------

    async def _receive_once(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        async with self.database.connection() as conn:
            got = await self._timed(self.metrics.receive_duration, queue,
                                    messages.receive(conn, queue, qty=params.qty, vt=params.vt))
        self.metrics.record_received(queue, got)
        return got

    async def receive(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        wait = params.wait
        if wait is None:
            async with self.database.connection() as conn:
                wait = (await queues.get(conn, queue)).receive_wait_seconds
        wait = min(max(wait, 0.0), float(self.settings.max_wait_seconds))
        if wait <= 0 or self.waiters.closing:
            return await self._receive_once(queue, params)
        deadline = time.monotonic() + wait
        with self.waiters.register(queue) as waiter:
            self.metrics.long_pollers.inc()
            try:
                await self.waiters.ensure_marked(queue)
                while True:
                    got = await self._receive_once(queue, params)
                    remaining = deadline - time.monotonic()
                    if got or remaining <= 0 or self.waiters.closing:
                        return got
                    await waiter.wait(remaining)
            finally:
                self.metrics.long_pollers.dec()

    async def _mark_listened(self, queue: str, seconds: int) -> None:
        async with self.database.connection() as conn:
            await queues.listen(conn, queue, seconds)

    # -- acknowledge -----------------------------------------------------------------

    async def delete(self, queue: str, ids: Sequence[int]) -> list[int]:
        async with self.database.connection() as conn:
            done = await self._timed(self.metrics.delete_duration, queue, messages.delete(conn, queue, ids))
        self.metrics.deleted.labels(queue).inc(len(done))
        return done

    async def archive(self, queue: str, ids: Sequence[int]) -> list[int]:
        async with self.database.connection() as conn:
            done = await self._timed(self.metrics.delete_duration, queue, messages.archive(conn, queue, ids))
        self.metrics.deleted.labels(queue).inc(len(done))
        return done

    async def fail(self, queue: str, message_id: int, reason: str | None) -> bool:
        async with self.database.connection() as conn:
            return await messages.fail(conn, queue, message_id, reason)

    async def set_vt(self, queue: str, ids: Sequence[int], vt: int,
                     in_flight_only: bool = False) -> list[types.Message]:
        async with self.database.connection() as conn:
            return await messages.set_vt(conn, queue, ids, vt, in_flight_only)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self.waiters.start()

    def shutting_down(self) -> None:
        self.waiters.shutting_down()

    async def stop(self) -> None:
        self.waiters.shutting_down()
        if self.fuser is not None:
            await self.fuser.drain(self.settings.shutdown_timeout)
        await self.waiters.stop()
        await asyncio.sleep(0)
