"""The server's implementation of ``conveyor.protocols.broker.Broker``: the concept
brokers (``conveyor.server.brokers``) under the one object every protocol is given.

Each operation of the interface is the concept broker's own bound method, set on this
object once, so that a request goes from the protocol straight to its concept's broker
(no call in between). This object owns only what spans the concepts: the composition,
the database's keys (receipts, unsubscribe links), the waiters' hub and the lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from conveyor import crypto, errors
from conveyor.core import receipts, unsubscribe_links
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.protocols import broker
from conveyor.server.brokers import failover, partitioned, queues, sealing, streams, topics
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import WaiterHub, partitioned_queue
from conveyor.settings import Settings


class ServerBroker:
    def __init__(self, settings: Settings, database: Database, metrics: Metrics) -> None:
        self.settings = settings
        self.database = database
        self.waiters = WaiterHub(database.dsn, self._mark_listened, listen_seconds=settings.listen_seconds,
                                 poll_fallback=settings.poll_fallback_seconds)
        self.sealing = sealing.Sealing(
            crypto.Keyring.of(settings.encryption_keys) if settings.encryption_keys else None)
        self.failover = failover.Failover(settings, database, metrics)
        self.queues = queues.QueueBroker(settings, database, metrics, self.waiters, self.sealing, self.failover)
        self.partitioned = partitioned.PartitionedBroker(settings, database, metrics, self.waiters, self.sealing,
                                                         self.failover)
        self.streams = streams.StreamBroker(settings, database, metrics, self.waiters)
        self.topics = topics.TopicBroker(settings, database, metrics, self.sealing)
        self.failover.replaying(send=self.queues.replay_send, pq_push=self.partitioned.replay_push)
        self._receipts: receipts.Keyring | None = None
        self._unsubscribe_links: unsubscribe_links.Links | None = None

        # the Broker interface, concept by concept (conveyor.protocols.broker)
        self.queue = self.queues.queue
        self.send = self.queues.send
        self.receive = self.queues.receive
        self.delete = self.queues.delete
        self.delete_in_flight = self.queues.delete_in_flight
        self.archive = self.queues.archive
        self.fail = self.queues.fail
        self.set_vt = self.queues.set_vt
        self.pq_push = self.partitioned.pq_push
        self.pq_pop = self.partitioned.pq_pop
        self.pq_ack = self.partitioned.pq_ack
        self.pq_renew = self.partitioned.pq_renew
        self.pq_transaction = self.partitioned.pq_transaction
        self.stream_receive = self.streams.stream_receive
        self.signer = self.topics.signer
        self.topic_urls = self.topics.topic_urls
        self.publish = self.topics.publish
        self.spools = self.failover.spools
        self.can_encrypt = self.sealing.can_encrypt
        self.opened = self.sealing.opened
        self.pq_opened = self.sealing.pq_opened

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.database.connection() as conn:
            yield conn

    async def _mark_listened(self, key: str, seconds: int) -> None:
        """The waiters' hub wants ``key``'s writes to NOTIFY: a queue's sends, or a
        partitioned queue's pushes."""
        pqueue = partitioned_queue(key)
        if pqueue is not None:
            await self.partitioned.mark_listened(pqueue, seconds)
        else:
            await self.queues.mark_listened(key, seconds)

    # -- the database's keys: receipts, unsubscribe links ---------------------------------

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

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self._load_keys()
        await self.failover.start()
        await self.waiters.start()
        with contextlib.suppress(errors.ConveyorError):
            await self.signer()  # load (or create) the SNS key now rather than on the first publish

    def shutting_down(self) -> None:
        self.waiters.shutting_down()

    async def stop(self) -> None:
        self.waiters.shutting_down()
        await self.queues.drain()
        await self.partitioned.drain()
        await self.failover.stop()
        await self.waiters.stop()
        await asyncio.sleep(0)


if TYPE_CHECKING:  # mypy (strict here) checks that each piece implements its part of the interface
    _queues: type[broker.Queues] = queues.QueueBroker
    _partitioned: type[broker.PartitionedQueues] = partitioned.PartitionedBroker
    _streams: type[broker.Streams] = streams.StreamBroker
    _topics: type[broker.Topics] = topics.TopicBroker
    _failover: type[broker.Failover] = failover.Failover
    _sealing: type[broker.Sealing] = sealing.Sealing
    _all: type[broker.Broker] = ServerBroker
