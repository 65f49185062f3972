"""Partitioned queues (seed 004's model, Queen's API: conveyor.core.partitioned): push
(creating the queues it names), pop (long-polled), ack, renew and transactions; their
fusion lanes and waiters, the cache of which queues exist and are encrypted, and the
pushes the failover spool takes while the database is away."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from conveyor import errors, types
from conveyor.core import partitioned
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server.brokers.base import QUEUE_CACHE_SECONDS, QUEUE_CACHE_SIZE, Base, split
from conveyor.server.brokers.failover import Failover
from conveyor.server.brokers.sealing import Sealing
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import Waiter, WaiterHub, partitioned_key
from conveyor.settings import Settings


async def _first_woken(waiters: Sequence[Waiter], timeout: float) -> None:
    """Sleep until one of ``waiters`` is woken, or ``timeout``."""
    if len(waiters) == 1:
        await waiters[0].wait(timeout)
        return
    tasks = [asyncio.ensure_future(w.wait(timeout)) for w in waiters]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


class PartitionedBroker(Base):
    def __init__(self, settings: Settings, database: Database, metrics: Metrics, waiters: WaiterHub,
                 sealing: Sealing, failover: Failover) -> None:
        super().__init__(settings, database, metrics)
        self.waiters = waiters
        self.sealing = sealing
        self.failover = failover
        self._pq_cache: dict[str, tuple[bool | None, float]] = {}  # queue: (encrypted, None if missing; until)
        # seed 004's operation types
        self._push_lane = self._lane("push", self._pq_push_fused, settings.fusion_max_batch, len)
        self._pop_lane = self._lane("pop", self._pq_pop_fused, 100, lambda _: 1)
        self._ack_lane = self._lane("ack", self._pq_ack_fused, settings.fusion_max_batch, len)
        self._renew_lane = self._lane("renew", self._pq_renew_fused, settings.fusion_max_batch, len)

    async def mark_listened(self, queue: str, seconds: int) -> None:
        """Make pushes to ``queue`` NOTIFY for ``seconds`` (the waiters' hub asks)."""
        async with self.database.connection() as conn:
            await partitioned.listen(conn, queue, seconds)

    # -- which queues exist, which are encrypted ------------------------------------------

    @staticmethod
    def _pq_named(items: Sequence[dict[str, Any]]) -> set[str]:
        return {i["queue"] for i in items if isinstance(i.get("queue"), str)}

    def _pq_remember(self, name: str, encrypted: bool | None) -> None:
        """Cache what a partitioned queue is: encrypted or not, None if it does not exist."""
        if len(self._pq_cache) > QUEUE_CACHE_SIZE:
            self._pq_cache.clear()
        self._pq_cache[name] = (encrypted, time.monotonic() + QUEUE_CACHE_SECONDS)

    def _pq_stale(self, names: set[str]) -> list[str]:
        now = time.monotonic()
        return sorted(n for n in names if (c := self._pq_cache.get(n)) is None or c[1] <= now)

    async def _pq_lookup(self, names: set[str], conn: Connection | None = None) -> dict[str, bool | None]:
        """What these partitioned queues are (encrypted or not, None if missing): cached like
        queues, those not known looked up in one query."""
        stale = self._pq_stale(names)
        found: dict[str, bool | None] = {n: c[0] for n in names - set(stale) if (c := self._pq_cache.get(n))}
        if stale:
            async with contextlib.AsyncExitStack() as stack:
                if conn is None:
                    conn = await stack.enter_async_context(self.database.connection())
                there = {q.name: q.encryption_enabled for q in await partitioned.get_many(conn, stale)}
            for name in stale:
                found[name] = there.get(name)
                self._pq_remember(name, found[name])
        return found

    def _pq_unknown(self, items: Sequence[dict[str, Any]]) -> list[str]:
        """The queues ``items`` name that this process does not know to exist, however old
        its knowledge (for the failover spool, when the database cannot be asked)."""
        return sorted(n for n in self._pq_named(items) if (c := self._pq_cache.get(n)) is None or c[0] is None)

    async def _pq_create_missing(self, items: Sequence[dict[str, Any]], creatable: int | None,
                                 conn: Connection | None = None) -> list[str]:
        """Create the queues ``items`` name that do not exist: at most ``creatable`` (None:
        any number), and none past CONVEYOR_QUEEN_CREATE_MAX_QUEUES queues in all
        (``errors.QueueLimitReached``, nothing created). The names created; the caller
        reports them with ``_pq_created`` once committed."""
        known = await self._pq_lookup(self._pq_named(items), conn)
        missing = sorted(n for n, encrypted in known.items() if encrypted is None)
        if not missing:
            return []
        async with contextlib.AsyncExitStack() as stack:
            if conn is None:
                conn = await stack.enter_async_context(self.database.connection())
            return await partitioned.create_missing(conn, missing, max_new=creatable,
                                                    max_total=self.settings.queen_create_max_queues or None)

    def _pq_created(self, names: Sequence[str]) -> None:
        for name in names:
            self._pq_remember(name, False)  # a new queue: not encrypted
        if names:
            self.metrics.pqueues_created.inc(len(names))

    async def _pq_encrypted(self, names: set[str]) -> set[str]:
        """Which of these partitioned queues have encryptionEnabled (a new queue has not)."""
        return {n for n, encrypted in (await self._pq_lookup(names)).items() if encrypted}

    async def _pq_sealed(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        encrypted = await self._pq_encrypted(self._pq_named(items))
        if not encrypted:
            return items
        return self.sealing.seal_items(items, encrypted)

    # -- push --------------------------------------------------------------------------

    async def pq_push(self, items: Sequence[dict[str, Any]], *, creatable: int) -> list[dict[str, Any]]:
        """Push items (any queues, any partitions): one answer each, in order (while the
        database is down, taken by the failover spool: status ``buffered``). The queues
        they name that do not exist are created first, at most ``creatable`` of them."""
        if await self.failover.must_spool():
            return await self._spool_push(items, creatable)
        try:
            self._pq_created(await self._pq_create_missing(items, creatable))
            sealed = await self._pq_sealed(items)
            if self._push_lane is not None:
                return await self._fused(self._push_lane, None, sealed)
            return await self._pq_push_db(sealed)
        except errors.DatabaseUnreachable:  # never reached the database: safe to take it here
            if self.failover.spooling():
                return await self._spool_push(items, creatable)
            raise

    async def _pq_push_db(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.push(conn, items)

    async def _pq_push_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return split(await self._pq_push_db([i for r in requests for i in r]), [len(r) for r in requests])

    # -- pushes in the failover spool --------------------------------------------------

    async def _spool_push(self, items: Sequence[dict[str, Any]], creatable: int) -> list[dict[str, Any]]:
        unknown = self._pq_unknown(items)
        if len(unknown) > creatable:  # the database cannot tell whether they exist: the replay could create them
            raise errors.Unavailable(f"queue {unknown[0][:100]!r} is not known to this server, and whether this "
                                     f"push may create it cannot be checked while the database is unreachable; "
                                     f"retry later")
        stamped = [{**i, "transactionId": i.get("transactionId") or str(uuid.uuid4())} for i in items]
        # the database cannot be asked (a name that is not a string is not found in the cache either)
        flags = {i.get("queue"): self._pq_cache.get(cast(str, i.get("queue"))) for i in stamped}
        sealed = all(flag is not None for flag in flags.values())  # else sealed when replayed
        encrypted = {name for name, flag in flags.items() if flag is not None and flag[0]}
        if sealed and encrypted:
            stamped = self.sealing.seal_items(stamped, encrypted)
        await self.failover.append({"kind": "pq_push", "sealed": sealed, "items": stamped, "create": creatable},
                                   len(stamped))
        return [{"index": n, "status": "buffered", "transactionId": i["transactionId"], "queue": i.get("queue"),
                 "partition": i.get("partition") or "Default"} for n, i in enumerate(stamped)]

    async def replay_push(self, conn: Connection, body: dict[str, Any]) -> None:
        """Store a push the failover spool took (sealed now if it could not be then)."""
        # the bounds of create-on-push hold at replay (records spooled before them had none)
        created = await self._pq_create_missing(body["items"], body.get("create"), conn)
        items = body["items"] if body["sealed"] else await self._pq_sealed(body["items"])
        await partitioned.push(conn, items)
        self._pq_created(created)

    # -- pop ---------------------------------------------------------------------------

    async def pq_pop(self, request: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        """One pop; with ``wait`` > 0, long-polls without holding a connection until a push
        to one of the queues asked for (in any server process) or the time is up."""
        got = await self._pq_pop_waiting(request, wait)
        if got.get("messages"):
            got = {**got, "messages": self.sealing.pq_opened(got["messages"])}
        return got

    async def _pq_pop_waiting(self, request: dict[str, Any], wait: float) -> dict[str, Any]:
        started = time.monotonic()
        got = await self._pq_pop_db(request)
        wait = min(max(wait, 0.0), float(self.settings.max_wait_seconds))
        if got["messages"] or wait <= 0 or self.waiters.closing:
            return got
        names = await self._pq_names(request)
        group = request.get("consumerGroup") or types.QUEUE_MODE_GROUP
        with contextlib.ExitStack() as stack:
            waiters = [stack.enter_context(self.waiters.register(partitioned_key(n, group))) for n in names]
            if not waiters:
                return got
            self.metrics.long_pollers.inc()
            stack.callback(self.metrics.long_pollers.dec)
            for name in names:
                await self.waiters.ensure_marked(partitioned_key(name, group))
            while True:
                got = await self._pq_pop_db(request)
                remaining = started + wait - time.monotonic()
                if got["messages"] or remaining <= 0 or self.waiters.closing:
                    return got
                await _first_woken(waiters, remaining)

    async def _pq_pop_db(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._pop_lane is not None:
            return await self._fused(self._pop_lane, None, request)
        [got] = await self._pq_pop_fused(None, [request])
        return got

    async def _pq_pop_fused(self, _key: None, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:  # autocommit: the call is its own transaction
            return await partitioned.pop_many(conn, requests, lazy=True)

    async def _pq_names(self, request: dict[str, Any]) -> list[str]:
        """The queues a pop reads: the one it names, or those of its namespace/task."""
        if request.get("queue"):
            return [request["queue"]]
        async with self.database.connection() as conn:
            found = await partitioned.list_all(conn)
        return [q.name for q in found
                if (request.get("namespace") is None or q.namespace == request["namespace"])
                and (request.get("task") is None or q.task == request["task"])]

    # -- ack, renew, transactions ------------------------------------------------------

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._ack_lane is not None:
            return await self._fused(self._ack_lane, None, acks)
        return await self._pq_ack_db(acks)

    async def _pq_ack_db(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.ack(conn, acks)

    async def _pq_ack_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return split(await self._pq_ack_db([a for r in requests for a in r]), [len(r) for r in requests])

    async def pq_renew(self, leases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._renew_lane is not None:
            return await self._fused(self._renew_lane, None, leases)
        return await self._pq_renew_db(leases)

    async def _pq_renew_db(self, leases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.renew(conn, leases)

    async def _pq_renew_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return split(await self._pq_renew_db([x for r in requests for x in r]), [len(r) for r in requests])

    async def pq_transaction(self, operations: Sequence[dict[str, Any]], *, required_leases: Sequence[str] = (),
                             creatable: int) -> dict[str, Any]:
        """Acks and pushes in one transaction, never fused (all or nothing on its own,
        the queues its pushes create included)."""
        pushed = [i for op in operations if op.get("type") == "push" for i in op["items"]]
        operations = [{**op, "items": await self._pq_sealed(op["items"])} if op.get("type") == "push" else op
                      for op in operations]
        async with self.database.connection() as conn:
            async with conn.transaction():
                created = await self._pq_create_missing(pushed, creatable, conn)
                done = await partitioned.transaction(conn, operations, required_leases)
            self._pq_created(created)
            return done
