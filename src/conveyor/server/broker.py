"""The server's implementation of ``conveyor.protocols.broker.Broker``: core ops plus
fusion, long-poll waiters and per-queue metrics. Every protocol goes through here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from conveyor import crypto, errors, tracing, types
from conveyor.core import messages, partitioned, queues, receipts, signing, spooled, streams, topics, unsubscribe_links
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server.fusion import BatchPolicy, Fuser, Static, Vegas
from conveyor.server.metrics import Metrics
from conveyor.server.spool import Damage, Spool
from conveyor.server.waiters import WaiterHub, partitioned_key, partitioned_queue, stream_key
from conveyor.settings import Settings

log = logging.getLogger(__name__)

MAX_RECEIVE = 1000  # the SQL API's largest qty
QUEUE_CACHE_SECONDS = 2.0
SPOOL_PAGE = 200  # spooled records replayed per transaction
SPOOL_REPLAY_INTERVAL = 0.2
SPOOL_CATCH_UP = 5.0  # seconds a write waits for the replay once the database is back
QUEUE_CACHE_SIZE = 10000


async def _first_woken(waiters: Sequence[Any], timeout: float) -> None:
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


def _split(items: Sequence, sizes: Sequence[int]) -> list[list]:
    """Hand out ``items`` in order: the first ``sizes[0]`` to the first asker, and so on."""
    out, start = [], 0
    for n in sizes:
        out.append(list(items[start:start + n]))
        start += n
    return out


class ServerBroker:
    def __init__(self, settings: Settings, database: Database, metrics: Metrics) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics
        self.fusers: dict[str, Fuser] = {}
        if settings.fusion:
            options = {"max_inflight": settings.fusion_max_inflight, "max_pending": settings.fusion_max_pending}
            policy = {op: BatchPolicy(*p) for op, p in settings.fusion_policies.items()}

            def fuser(kind: str, run: Any, max_batch: int, size: Any) -> Fuser:
                return Fuser(run, max_batch=max_batch, size=size, policy=policy.get(kind, BatchPolicy()),
                             concurrency=self._concurrency(settings), **options)

            self.fusers = {
                "send": Fuser(self._send_fused, max_batch=settings.fusion_max_batch, size=len,
                              on_flush=metrics.fusion_batch.observe, policy=policy.get("send", BatchPolicy()),
                              concurrency=self._concurrency(settings), **options),
                "receive": fuser("receive", self._receive_fused, MAX_RECEIVE, lambda qty: qty),
                "delete": fuser("delete", self._delete_fused, settings.fusion_max_batch, len),
                # partitioned queues: seed 004's operation types
                "pq_push": fuser("push", self._pq_push_fused, settings.fusion_max_batch, len),
                "pq_pop": fuser("pop", self._pq_pop_fused, 100, lambda _: 1),
                "pq_ack": fuser("ack", self._pq_ack_fused, settings.fusion_max_batch, len),
                "pq_renew": fuser("renew", self._pq_renew_fused, settings.fusion_max_batch, len),
            }
        self._queue_cache: dict[str, tuple[types.Queue, float]] = {}
        self._pq_cache: dict[str, tuple[bool | None, float]] = {}  # queue: (encrypted, None if missing; until)
        self.keyring = crypto.Keyring.of(settings.encryption_keys) if settings.encryption_keys else None
        self.spool: Spool | None = None
        self._replayer: asyncio.Task[None] | None = None
        self._spool_drained = asyncio.Event()  # set while nothing waits in the spool  # partitioned queue: encryptionEnabled
        self.waiters = WaiterHub(database.dsn, self._mark_listened, listen_seconds=settings.listen_seconds,
                                 poll_fallback=settings.poll_fallback_seconds)
        self._signer: signing.Signer | None = None
        self._receipts: receipts.Keyring | None = None
        self._unsubscribe_links: unsubscribe_links.Links | None = None
        self._signer_lock = asyncio.Lock()

    @staticmethod
    def _concurrency(settings: Settings) -> Any:
        """Each fused key's concurrency controller (CONVEYOR_FUSION_CONCURRENCY)."""
        if settings.fusion_concurrency == "vegas":
            return lambda: Vegas(current=float(settings.fusion_max_inflight), highest=settings.fusion_vegas_max)
        return lambda: Static(settings.fusion_max_inflight)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.database.connection() as conn:
            yield conn

    async def _timed(self, histogram, queue, coro):  # noqa: ANN001, ANN202 - internal helper
        """Await ``coro``, timing it under the queue's label only if it succeeds: a queue
        that does not exist (any name a client makes up) gets no series."""
        started = time.perf_counter()
        result = await coro
        self.metrics.series(histogram, queue).observe(time.perf_counter() - started)
        return result

    # -- send ------------------------------------------------------------------------

    async def _send_batch(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[types.Sent]:
        async with self.database.connection() as conn:
            sent = await self._timed(self.metrics.send_duration, queue, messages.send_batch(conn, queue, batch))
        self.metrics.series(self.metrics.sent, queue).inc(len(sent))
        return sent

    async def _send_fused(self, queue: str,
                          requests: Sequence[Sequence[types.OutgoingMessage]]) -> list[list[types.Sent]]:
        sent = await self._send_batch(queue, [m for r in requests for m in r])
        return _split(sent, [len(r) for r in requests])

    async def _fused(self, kind: str, key: Any, request: Any) -> Any:
        try:
            return await self.fusers[kind].submit(key, request)
        except errors.Throttled:
            self.metrics.series(self.metrics.admission_refused, "fusion").inc()
            raise

    # -- encryption at rest (conveyor.crypto) ------------------------------------------

    def can_encrypt(self) -> bool:
        return self.keyring is not None

    def _keyring(self, what: str) -> crypto.Keyring:
        if self.keyring is None:
            raise errors.Unavailable(f"{what} is encrypted and this server has no encryption key "
                                     "(CONVEYOR_ENCRYPTION_KEY)")
        return self.keyring

    async def _sealed(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> Sequence[types.OutgoingMessage]:
        q = await self.queue(queue)
        return self._seal_for(q, batch) if q.encrypted else batch

    def _seal_for(self, q: types.Queue, batch: Sequence[types.OutgoingMessage]) -> list[types.OutgoingMessage]:
        keyring = self._keyring(f"queue {q.name!r}")
        out = []
        for m in batch:
            dedup = m.dedup_id
            if q.fifo and dedup is None and q.content_based_deduplication:
                # the database would hash the sealed body, which differs on every send
                dedup = hashlib.sha256(m.body.encode("utf-8")).hexdigest()
            body, content_type = keyring.seal(m.body, m.content_type)
            out.append(dataclasses.replace(m, body=body, content_type=content_type, dedup_id=dedup))
        return out

    def opened(self, got: list[types.Message]) -> list[types.Message]:
        """Messages as they were sent: sealed bodies opened, whatever the queue's flag is now."""
        if not any(crypto.is_sealed(m.content_type) for m in got):
            return got
        keyring = self._keyring("a message")
        out = []
        for m in got:
            if crypto.is_sealed(m.content_type):
                body, content_type = keyring.open(m.body, m.content_type)
                m = dataclasses.replace(m, body=body, content_type=content_type)
            out.append(m)
        return out

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
        keyring = self._keyring(f"queue {sorted(encrypted)[0]!r}")
        return [{**i, "payload": keyring.seal_text(orjson.dumps(i.get("payload")).decode()), "encrypted": True}
                if i.get("queue") in encrypted else i for i in items]

    def pq_opened(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Partitioned-queue messages (pops, dead letters, lookups) with sealed payloads
        (``encrypted``/``isEncrypted``) opened, under ``data`` or ``payload``."""
        out = []
        for doc in docs:
            if doc.get("encrypted") or doc.get("isEncrypted"):
                keyring = self._keyring("a message")
                key = "data" if "data" in doc else "payload"
                doc = {**doc, key: orjson.loads(keyring.open_text(doc[key]))}
            out.append(doc)
        return out

    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage], *,
                   spool: bool = False) -> list[types.Sent]:
        batch = _traced(batch)
        if spool and await self._must_spool():
            return await self._spool_send(queue, batch)
        try:
            sealed = await self._sealed(queue, batch)
            if "send" in self.fusers:
                return await self._fused("send", queue, sealed)
            return await self._send_batch(queue, sealed)
        except errors.DatabaseUnreachable:  # never reached the database: safe to take it here
            if spool and self._spooling():
                return await self._spool_send(queue, batch)
            raise

    # -- the failover spool (conveyor.server.spool) -----------------------------------

    def spools(self, protocol: str) -> bool:
        """Whether writes of ``protocol`` may be acknowledged from the spool."""
        return self.spool is not None and (protocol != "sqs" or self.settings.spool_sqs)

    def _spooling(self) -> bool:
        """Writes go to the spool while the database is down, and after, until the spool
        has been replayed (so they reach the database in the order they were taken)."""
        return self.spool is not None and (self.database.down or self.spool.waiting > 0)

    async def _must_spool(self) -> bool:
        """Whether a spoolable write goes to the spool. Once the database is back, a write
        waits (up to SPOOL_CATCH_UP seconds) for the replay to finish rather than join the
        spool behind it: under steady load the replay would otherwise never catch up."""
        if not self._spooling():
            return False
        if self.database.down:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._spool_drained.wait(), SPOOL_CATCH_UP)
        return self._spooling()

    async def _spool_send(self, queue: str, batch: Sequence[types.OutgoingMessage]) -> list[types.Sent]:
        assert self.spool is not None
        cached = self._queue_cache.get(queue)  # the database cannot be asked
        sealed = cached is not None and cached[0].encrypted
        if sealed:
            assert cached is not None
            batch = self._seal_for(cached[0], batch)
        promised = [dataclasses.replace(m, message_uuid=m.message_uuid or uuid.uuid4()) for m in batch]
        self._spool_drained.clear()
        await self.spool.append({"kind": "send", "queue": queue, "sealed": sealed,
                                 "messages": [m.to_json() for m in promised]})
        self.metrics.spooled.inc(len(promised))
        return [types.Sent(id=0, message_uuid=m.message_uuid, spooled=True)
                for m in promised if m.message_uuid is not None]

    async def _spool_push(self, items: Sequence[dict[str, Any]], creatable: int) -> list[dict[str, Any]]:
        assert self.spool is not None
        unknown = self._pq_unknown(items)
        if len(unknown) > creatable:  # the database cannot tell whether they exist: the replay could create them
            raise errors.Unavailable(f"queue {unknown[0][:100]!r} is not known to this server, and whether this "
                                     f"push may create it cannot be checked while the database is unreachable; "
                                     f"retry later")
        stamped = [{**i, "transactionId": i.get("transactionId") or str(uuid.uuid4())} for i in items]
        flags = {i.get("queue"): self._pq_cache.get(i.get("queue")) for i in stamped}  # the database cannot be asked
        sealed = all(flag is not None for flag in flags.values())  # else sealed when replayed
        encrypted = {name for name, flag in flags.items() if flag is not None and flag[0]}
        if sealed and encrypted:
            keyring = self._keyring(f"queue {sorted(str(n) for n in encrypted)[0]!r}")
            stamped = [{**i, "payload": keyring.seal_text(orjson.dumps(i.get("payload")).decode()), "encrypted": True}
                       if i.get("queue") in encrypted else i for i in stamped]
        self._spool_drained.clear()
        await self.spool.append({"kind": "pq_push", "sealed": sealed, "items": stamped, "create": creatable})
        self.metrics.spooled.inc(len(stamped))
        return [{"index": n, "status": "buffered", "transactionId": i["transactionId"], "queue": i.get("queue"),
                 "partition": i.get("partition") or "Default"} for n, i in enumerate(stamped)]

    async def _replay_record(self, conn: Connection, body: dict[str, Any]) -> None:
        if body["kind"] == "send":
            batch: Sequence[types.OutgoingMessage] = [
                types.OutgoingMessage(**{**m, "message_uuid": uuid.UUID(m["message_uuid"])}) for m in body["messages"]]
            if not body["sealed"]:
                batch = await self._sealed(body["queue"], batch)
            await messages.send_batch(conn, body["queue"], batch)
        else:
            # the bounds of create-on-push hold at replay (records spooled before them had none)
            created = await self._pq_create_missing(body["items"], body.get("create"), conn)
            items = body["items"] if body["sealed"] else await self._pq_sealed(body["items"])
            await partitioned.push(conn, items)
            self._pq_created(created)

    async def replay_spool(self) -> int:
        """Replay every record waiting in the spool, oldest first, exactly once; how many."""
        assert self.spool is not None
        done = 0
        self.spool.seal_segment()  # appends from now on go to a segment of their own
        for segment in self.spool.sealed_segments():
            contents = self.spool.read(segment)
            for at in range(0, len(contents.records), SPOOL_PAGE):
                page = contents.records[at:at + SPOOL_PAGE]
                async with self.database.connection() as conn, conn.transaction():
                    fresh = await spooled.claim(conn, [r.key for r in page])
                    for record in page:
                        if record.key in fresh:
                            await self._replay_one(conn, record)
                self.spool.replayed(len(page))
                done += len(page)
            if contents.damage:
                self._keep_damaged(segment, contents.damage)
            else:
                self.spool.remove(segment)
            # only once the segment is gone: forgotten keys of a segment still there would
            # let a crash here replay it again
            async with self.database.connection() as conn:
                await spooled.forget(conn, self.spool.prefix(segment))
        if done:
            log.warning("replayed %d spooled writes", done)
            self.metrics.spool_replayed.inc(done)
        if self.spool.waiting <= 0:
            self._spool_drained.set()
        return done

    def _keep_damaged(self, segment: Path, damage: list[Damage]) -> None:
        """A segment with damage: its readable records are replayed; the damaged stretches
        are set aside in ``rejected.jsonl``, logged and counted, and the segment is kept."""
        assert self.spool is not None
        kept = self.spool.keep_damaged(segment, damage)
        self.metrics.spool_damaged.inc(len(damage))
        for d in damage:
            log.error("the failover spool's segment %s is damaged at byte %d (%d bytes: %s): the rest of it is "
                      "replayed, the damage set aside in rejected.jsonl (%s) and the segment kept as %s",
                      segment.name, d.offset, d.length, d.reason, d.key, kept.name)

    async def _replay_one(self, conn: Connection, record: Any) -> None:
        """One record in a savepoint: one the database refuses (its queue is gone, a
        message is too large for it) is set aside in the slot's rejects file, logged and
        counted; the database going away again ends the replay (it resumes later)."""
        try:
            async with conn.transaction():
                await self._replay_record(conn, record.body)
        except errors.Unavailable:
            raise
        except errors.ConveyorError as exc:
            self._reject_spooled(record, exc.message)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # framed whole, but not a write of ours
            self._reject_spooled(record, f"malformed record ({type(exc).__name__}: {exc})")

    def _reject_spooled(self, record: Any, reason: str) -> None:
        assert self.spool is not None
        self.spool.reject(record, reason)
        self.metrics.spool_rejected.inc()
        log.error("spooled write %s set aside: %s", record.key, reason)

    async def _replay_forever(self) -> None:
        while True:
            await asyncio.sleep(SPOOL_REPLAY_INTERVAL)
            if self.spool is not None and self.spool.waiting > 0 and not self.database.down:
                try:
                    await self.replay_spool()
                except errors.Unavailable:
                    pass  # down again: next round
                except Exception:
                    log.exception("replaying the spool failed; trying again")

    # -- receive ---------------------------------------------------------------------

    async def _receive_db(self, queue: str, qty: int, vt: int | None,
                          attempt_id: str | None = None, grouped: bool = False) -> list[types.Message]:
        async with self.database.connection() as conn:
            if attempt_id is not None:  # recorded under the attempt id, whichever turn of a long poll gets them
                ask = messages.receive_attempt(conn, queue, attempt_id, qty=qty, vt=vt)
            elif grouped:
                ask = messages.receive_grouped(conn, queue, qty=qty, vt=vt)
            else:
                ask = messages.receive(conn, queue, qty=qty, vt=vt)
            got = await self._timed(self.metrics.receive_duration, queue, ask)
        self.metrics.record_received(queue, got)
        return self.opened(got)

    async def _receive_fused(self, key: tuple[str, int | None], qtys: Sequence[int]) -> list[list[types.Message]]:
        queue, vt = key
        return _split(await self._receive_db(queue, sum(qtys), vt), qtys)

    async def _receive_once(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        # FIFO (and grouped) receives are never fused: one call may return several messages
        # of a group, and a group must go to one consumer at a time
        if "receive" in self.fusers and not queue.endswith(".fifo") and not params.grouped:
            return await self._fused("receive", (queue, params.vt), params.qty)
        return await self._receive_db(queue, params.qty, params.vt, params.attempt_id, params.grouped)

    async def receive(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        started = time.monotonic()
        if (await self.queue(queue)).encrypted:
            self._keyring(f"queue {queue!r}")  # refused before anything is claimed
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

    async def _mark_listened(self, key: str, seconds: int) -> None:
        async with self.database.connection() as conn:
            pqueue = partitioned_queue(key)
            if pqueue is not None:
                await partitioned.listen(conn, pqueue, seconds)
            else:
                await queues.listen(conn, key, seconds)

    # -- streams -----------------------------------------------------------------------

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
                    remaining = started + wait - time.monotonic()
                    if remaining <= 0 or self.waiters.closing:
                        return got
                    await waiter.wait(remaining)
                    got = await self._stream_receive_once(stream, consumer, max_events)
                    if got:
                        return got
            finally:
                self.metrics.long_pollers.dec()

    async def _stream_receive_once(self, stream: str, consumer: str, max_events: int,
                                   after: int | None = None) -> list[types.StreamEvent]:
        async with self.database.connection() as conn:
            return await streams.receive(conn, stream, consumer, max_events, after)

    # -- partitioned queues --------------------------------------------------------------

    async def pq_push(self, items: Sequence[dict[str, Any]], *, creatable: int) -> list[dict[str, Any]]:
        """Push items (any queues, any partitions): one answer each, in order (while the
        database is down, taken by the failover spool: status ``buffered``). The queues
        they name that do not exist are created first, at most ``creatable`` of them."""
        if await self._must_spool():
            return await self._spool_push(items, creatable)
        try:
            self._pq_created(await self._pq_create_missing(items, creatable))
            sealed = await self._pq_sealed(items)
            if "pq_push" in self.fusers:
                return await self._fused("pq_push", None, sealed)
            return await self._pq_push_db(sealed)
        except errors.DatabaseUnreachable:  # never reached the database: safe to take it here
            if self._spooling():
                return await self._spool_push(items, creatable)
            raise

    async def _pq_push_db(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.push(conn, items)

    async def _pq_push_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return _split(await self._pq_push_db([i for r in requests for i in r]), [len(r) for r in requests])

    async def pq_pop(self, request: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        """One pop; with ``wait`` > 0, long-polls without holding a connection until a push
        to one of the queues asked for (in any server process) or the time is up."""
        got = await self._pq_pop_waiting(request, wait)
        if got.get("messages"):
            got = {**got, "messages": self.pq_opened(got["messages"])}
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
        if "pq_pop" in self.fusers:
            return await self._fused("pq_pop", None, request)
        async with self.database.connection() as conn:
            return await partitioned.pop(conn, request)

    async def _pq_pop_fused(self, _key: None, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.pop_many(conn, requests)

    async def _pq_names(self, request: dict[str, Any]) -> list[str]:
        """The queues a pop reads: the one it names, or those of its namespace/task."""
        if request.get("queue"):
            return [request["queue"]]
        async with self.database.connection() as conn:
            found = await partitioned.list_all(conn)
        return [q.name for q in found
                if (request.get("namespace") is None or q.namespace == request["namespace"])
                and (request.get("task") is None or q.task == request["task"])]

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if "pq_ack" in self.fusers:
            return await self._fused("pq_ack", None, acks)
        return await self._pq_ack_db(acks)

    async def _pq_ack_db(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.ack(conn, acks)

    async def _pq_ack_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return _split(await self._pq_ack_db([a for r in requests for a in r]), [len(r) for r in requests])

    async def pq_renew(self, leases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if "pq_renew" in self.fusers:
            return await self._fused("pq_renew", None, leases)
        return await self._pq_renew_db(leases)

    async def _pq_renew_db(self, leases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.database.connection() as conn:
            return await partitioned.renew(conn, leases)

    async def _pq_renew_fused(self, _key: None, requests: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return _split(await self._pq_renew_db([x for r in requests for x in r]), [len(r) for r in requests])

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

    # -- topics ----------------------------------------------------------------------

    async def signer(self) -> signing.Signer | None:
        """The stored SNS signing key, loaded (or created) once; None if this database
        role may not read it (conveyor_admin can), in which case envelopes go unsigned."""
        if self._signer is None:
            async with self._signer_lock:
                if self._signer is None:
                    try:
                        async with self.database.connection() as conn:
                            self._signer = await signing.load_or_create(conn)
                    except errors.PermissionDenied:
                        log.warning("cannot read the SNS signing key (needs conveyor_admin): envelopes go unsigned")
                        return None
        return self._signer

    def topic_urls(self, base_url: str | None = None) -> types.TopicUrls:
        return topics.urls(self.settings, base_url)

    async def publish(self, routing_key: str, publication: types.Publication,
                      urls: types.TopicUrls, *, topic: str | None = None) -> types.Published:
        signer = await self.signer()
        async with self.database.connection() as conn:
            published = await topics.publish(conn, routing_key, publication, signer=signer, urls=urls,
                                             keyring=self.keyring)
        self.metrics.record_published(topic, published)
        for queue in published.queues:
            self.metrics.series(self.metrics.sent, queue).inc()
        return published

    # -- acknowledge -----------------------------------------------------------------

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

    async def delete(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]:
        if "delete" in self.fusers:
            return await self._fused("delete", queue, deliveries)
        return await self._delete_db(queue, deliveries)

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

    # -- keys: receipts, unsubscribe links -----------------------------------------------

    @property
    def receipts(self) -> receipts.Keyring:
        """The database's receipt key, loaded when the server started."""
        if self._receipts is None:
            raise errors.Unavailable("the server has not loaded its receipt key yet")
        return self._receipts

    @property
    def unsubscribe_links(self) -> unsubscribe_links.Links:
        """The database's unsubscribe-link key, loaded when the server started."""
        if self._unsubscribe_links is None:
            raise errors.Unavailable("the server has not loaded its unsubscribe key yet")
        return self._unsubscribe_links

    async def _load_keys(self) -> None:
        async with self.database.connection() as conn:
            self._receipts = await receipts.load(conn)
            self._unsubscribe_links = await unsubscribe_links.load(conn)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self._load_keys()
        if self.settings.spool_dir is not None:
            self.spool = Spool(self.settings.spool_dir, self.settings.spool_max_bytes)
            if self.spool.waiting:  # leftovers of a server that stopped before replaying them
                log.warning("%d writes left in the failover spool: replaying them before taking traffic",
                            self.spool.waiting)
                await self.replay_spool()
            if not self.spool.waiting:
                self._spool_drained.set()
            self._replayer = asyncio.create_task(self._replay_forever())
        await self.waiters.start()
        with contextlib.suppress(errors.ConveyorError):
            await self.signer()  # load (or create) the SNS key now rather than on the first publish

    def shutting_down(self) -> None:
        self.waiters.shutting_down()

    async def stop(self) -> None:
        self.waiters.shutting_down()
        for fuser in self.fusers.values():
            await fuser.drain(self.settings.shutdown_timeout)
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
        if self.spool is not None:
            self.spool.close()
        await self.waiters.stop()
        await asyncio.sleep(0)
