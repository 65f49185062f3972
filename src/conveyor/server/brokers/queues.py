"""Queues, standard and FIFO: send, receive (long-polled), delete, archive, fail and
change visibility; their fusion lanes and waiters, the cache of queues' settings, their
per-queue metrics, and the sends the failover spool takes while the database is away."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from conveyor import errors, tracing, types
from conveyor.core import messages, queues
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server.brokers.base import QUEUE_CACHE_SECONDS, QUEUE_CACHE_SIZE, Base, split
from conveyor.server.brokers.failover import Failover
from conveyor.server.brokers.sealing import Sealing
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import WaiterHub
from conveyor.settings import Settings

MAX_RECEIVE = 1000  # the SQL API's largest qty

T = TypeVar("T")


def _traced(batch: Sequence[types.OutgoingMessage]) -> Sequence[types.OutgoingMessage]:
    """Messages carrying the trace of the request that sends them (conveyor.tracing): an
    AWSTraceHeader the client set is theirs already; others get the request's traceparent."""
    traceparent = tracing.current_traceparent()
    if traceparent is None:
        return batch
    stamp = {"traceparent": {"DataType": "String", "StringValue": traceparent}}
    return [m if m.system_attributes and ("AWSTraceHeader" in m.system_attributes
                                          or "traceparent" in m.system_attributes)
            else dataclasses.replace(m, system_attributes={**(m.system_attributes or {}), **stamp})
            for m in batch]


class QueueBroker(Base):
    def __init__(self, settings: Settings, database: Database, metrics: Metrics, waiters: WaiterHub,
                 sealing: Sealing, failover: Failover) -> None:
        super().__init__(settings, database, metrics)
        self.waiters = waiters
        self.sealing = sealing
        self.failover = failover
        self._queue_cache: dict[str, tuple[types.Queue, float]] = {}
        self._send_lane = self._lane("send", self._send_fused, settings.fusion_max_batch, len,
                                     on_flush=metrics.fusion_batch.observe)
        self._receive_lane = self._lane("receive", self._receive_fused, MAX_RECEIVE, lambda qty: qty)
        self._delete_lane = self._lane("delete", self._delete_fused, settings.fusion_max_batch, len)

    async def _timed(self, histogram: Any, queue: str, coro: Awaitable[T]) -> T:
        """Await ``coro``, timing it under the queue's label only if it succeeds: a queue
        that does not exist (any name a client makes up) gets no series."""
        started = time.perf_counter()
        result = await coro
        self.metrics.series(histogram, queue).observe(time.perf_counter() - started)
        return result

    # -- settings ----------------------------------------------------------------------

    async def queue(self, name: str) -> types.Queue:
        """A queue's configuration, cached for a couple of seconds: protocols validate
        against it on every send, and the database enforces the limits anyway."""
        cached = self._queue_cache.get(name)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            async with self.database.connection() as conn:
                q = await queues.get(conn, name)
        except errors.Unavailable:
            if cached is not None:  # the database is away: what was known of the queue still holds
                return cached[0]
            raise
        if len(self._queue_cache) > QUEUE_CACHE_SIZE:
            self._queue_cache.clear()
        self._queue_cache[name] = (q, time.monotonic() + QUEUE_CACHE_SECONDS)
        return q

    async def mark_listened(self, queue: str, seconds: int) -> None:
        """Make sends to ``queue`` NOTIFY for ``seconds`` (the waiters' hub asks)."""
        async with self.database.connection() as conn:
            await queues.listen(conn, queue, seconds)

    # -- send --------------------------------------------------------------------------

    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage], *,
                   spool: bool = False) -> list[types.Sent]:
        batch = _traced(batch)
        if spool and await self.failover.must_spool():
            return await self._spool_send(queue, batch)
        try:
            sealed = await self._sealed(queue, batch)
            if self._send_lane is not None:
                return await self._fused(self._send_lane, queue, sealed)
            return await self._send_batch(queue, sealed)
        except errors.DatabaseUnreachable:  # never reached the database: safe to take it here
            if spool and self.failover.spooling():
                return await self._spool_send(queue, batch)
            raise

    async def _sealed(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> Sequence[types.OutgoingMessage]:
        q = await self.queue(queue)
        return self.sealing.seal(q, batch) if q.encrypted else batch

    async def _send_batch(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[types.Sent]:
        async with self.database.connection() as conn:
            sent = await self._timed(self.metrics.send_duration, queue, messages.send_batch(conn, queue, batch))
        self.metrics.series(self.metrics.sent, queue).inc(len(sent))
        return sent

    async def _send_fused(self, queue: str,
                          requests: Sequence[Sequence[types.OutgoingMessage]]) -> list[list[types.Sent]]:
        sent = await self._send_batch(queue, [m for r in requests for m in r])
        return split(sent, [len(r) for r in requests])

    # -- sends in the failover spool ---------------------------------------------------

    async def _spool_send(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[types.Sent]:
        cached = self._queue_cache.get(queue)  # the database cannot be asked
        sealed = cached is not None and cached[0].encrypted
        if sealed:
            assert cached is not None
            batch = self.sealing.seal(cached[0], batch)
        promised = [dataclasses.replace(m, message_uuid=m.message_uuid or uuid.uuid4()) for m in batch]
        await self.failover.append({"kind": "send", "queue": queue, "sealed": sealed,
                                    "messages": [m.to_json() for m in promised]}, len(promised))
        return [types.Sent(id=0, message_uuid=m.message_uuid, spooled=True)
                for m in promised if m.message_uuid is not None]

    async def replay_send(self, conn: Connection, body: dict[str, Any]) -> None:
        """Store a send the failover spool took (sealed now if it could not be then)."""
        batch: Sequence[types.OutgoingMessage] = [
            types.OutgoingMessage(**{**m, "message_uuid": uuid.UUID(m["message_uuid"])}) for m in body["messages"]]
        if not body["sealed"]:
            batch = await self._sealed(body["queue"], batch)
        await messages.send_batch(conn, body["queue"], batch)

    # -- receive -----------------------------------------------------------------------

    async def receive(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        started = time.monotonic()
        if (await self.queue(queue)).encrypted:
            self.sealing.keyring_for(f"queue {queue!r}")  # refused before anything is claimed
        got = await self._receive_once(queue, params)
        if got or (params.wait is not None and params.wait <= 0) or self.waiters.closing:
            return got
        wait = params.wait if params.wait is not None else await self._default_wait(queue)
        wait = min(wait, float(self.settings.max_wait_seconds))
        if wait <= 0:
            return got
        deadline = started + wait
        with self.waiters.register(queue) as waiter:
            self.metrics.long_pollers.inc()
            try:
                await self.waiters.ensure_marked(queue)
                # look again: a send may have committed before the waiter was registered
                while True:
                    got = await self._receive_once(queue, params)
                    remaining = deadline - time.monotonic()
                    if got or remaining <= 0 or self.waiters.closing:
                        return got
                    await waiter.wait(remaining)
            finally:
                self.metrics.long_pollers.dec()

    async def _default_wait(self, queue: str) -> float:
        return float((await self.queue(queue)).receive_wait_seconds)

    async def _receive_once(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        # FIFO (and grouped) receives are never fused: one call may return several messages
        # of a group, and a group must go to one consumer at a time
        if self._receive_lane is not None and not queue.endswith(".fifo") and not params.grouped:
            return await self._fused(self._receive_lane, (queue, params.vt), params.qty)
        return await self._receive_db(queue, params.qty, params.vt, params.attempt_id, params.grouped)

    async def _receive_db(self, queue: str, qty: int, vt: int | None,
                          attempt_id: str | None = None, grouped: bool = False) -> list[types.Message]:
        async with self.database.connection() as conn:
            if attempt_id is not None:  # recorded under the attempt id, whichever turn of a long poll gets them
                ask = messages.receive_attempt(conn, queue, attempt_id, qty=qty, vt=vt)
            elif grouped:
                ask = messages.receive_grouped(conn, queue, qty=qty, vt=vt)
            else:  # (autocommit: the call is its own transaction)
                ask = messages.receive(conn, queue, qty=qty, vt=vt, lazy=True)
            got = await self._timed(self.metrics.receive_duration, queue, ask)
        self.metrics.record_received(queue, got)
        return self.sealing.opened(got)

    async def _receive_fused(self, key: tuple[str, int | None], qtys: Sequence[int]) -> list[list[types.Message]]:
        queue, vt = key
        return split(await self._receive_db(queue, sum(qtys), vt), qtys)

    # -- acknowledge -------------------------------------------------------------------

    async def delete(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]:
        if self._delete_lane is not None:
            return await self._fused(self._delete_lane, queue, deliveries)
        return await self._delete_db(queue, deliveries)

    async def _delete_db(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]:
        async with self.database.connection() as conn:
            done = await self._timed(self.metrics.delete_duration, queue, messages.delete(
                conn, queue, [d.id for d in deliveries], [d.receive_count for d in deliveries]))
        self.metrics.series(self.metrics.deleted, queue).inc(len(done))
        return done

    async def _delete_fused(self, queue: str, requests: Sequence[Sequence[types.MessageRef]]) -> list[list[int]]:
        remaining = set(await self._delete_db(queue, [d for r in requests for d in r]))
        answers = []
        for r in requests:  # an id asked for twice counts for the first asker only
            mine = [d.id for d in r if d.id in remaining]
            remaining.difference_update(mine)
            answers.append(mine)
        return answers

    async def delete_in_flight(self, queue: str,
                               deliveries: Sequence[types.MessageRef]) -> tuple[list[int], list[int]]:
        """Delete deliveries still in flight (SQS FIFO queues: a handle acts only while its
        visibility lasts); the ids deleted, and those whose delivery is over. Never fused:
        FIFO receives are not either."""
        async with self.database.connection() as conn:
            deleted, over = await self._timed(self.metrics.delete_duration, queue, messages.delete_in_flight(
                conn, queue, [d.id for d in deliveries], [d.receive_count for d in deliveries]))
        self.metrics.series(self.metrics.deleted, queue).inc(len(deleted))
        return deleted, over

    async def archive(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]:
        async with self.database.connection() as conn:
            done = await self._timed(self.metrics.delete_duration, queue, messages.archive(
                conn, queue, [d.id for d in deliveries], [d.receive_count for d in deliveries]))
        self.metrics.series(self.metrics.deleted, queue).inc(len(done))
        return done

    async def fail(self, queue: str, delivery: types.MessageRef, reason: str | None) -> bool:
        async with self.database.connection() as conn:
            return await messages.fail(conn, queue, delivery.id, reason, delivery.receive_count)

    async def set_vt(self, queue: str, deliveries: Sequence[types.MessageRef], vt: int,
                     in_flight_only: bool = False) -> list[types.Message]:
        async with self.database.connection() as conn:
            return await messages.set_vt(conn, queue, [d.id for d in deliveries], vt, in_flight_only,
                                         [d.receive_count for d in deliveries])
