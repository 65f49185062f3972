"""Streams (PgQ's model: conveyor.core.streams): a consumer's next batch, long-polled
for the ticker's next tick without holding a connection."""

from __future__ import annotations

import time

from conveyor import types
from conveyor.core import streams
from conveyor.db.pool import Database
from conveyor.server.brokers.base import Base
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import WaiterHub, stream_key
from conveyor.settings import Settings


class StreamBroker(Base):
    def __init__(self, settings: Settings, database: Database, metrics: Metrics, waiters: WaiterHub) -> None:
        super().__init__(settings, database, metrics)
        self.waiters = waiters

    async def stream_receive(self, stream: str, consumer: str, max_events: int,
                             wait: float = 0.0, after: int | None = None) -> list[types.StreamEvent]:
        """The consumer's next batch, long-polling up to ``wait`` seconds for a tick
        without holding a connection; with ``after``, the open batch's next page."""
        started = time.monotonic()
        got = await self._stream_receive_once(stream, consumer, max_events, after)
        wait = min(max(wait, 0.0), float(self.settings.max_wait_seconds))
        if got or wait <= 0 or after is not None or self.waiters.closing:
            return got
        with self.waiters.register(stream_key(stream)) as waiter:
            self.metrics.long_pollers.inc()
            try:
                while True:
                    # look (again) once registered: a tick announced between the first look
                    # and the registration woke nobody
                    got = await self._stream_receive_once(stream, consumer, max_events)
                    remaining = started + wait - time.monotonic()
                    if got or remaining <= 0 or self.waiters.closing:
                        return got
                    await waiter.wait(remaining)
            finally:
                self.metrics.long_pollers.dec()

    async def _stream_receive_once(self, stream: str, consumer: str, max_events: int,
                                   after: int | None = None) -> list[types.StreamEvent]:
        async with self.database.connection() as conn:
            return await streams.receive(conn, stream, consumer, max_events, after)
