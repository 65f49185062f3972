"""Topics (SNS, REST events: conveyor.core.topics): publish (fan-out into queues,
envelopes signed with the server's SNS key), the signing key, and topic URLs."""

from __future__ import annotations

import asyncio
import logging

from conveyor import errors, types
from conveyor.core import signing, topics
from conveyor.db.pool import Database
from conveyor.server.brokers.base import Base
from conveyor.server.brokers.sealing import Sealing
from conveyor.server.metrics import Metrics
from conveyor.settings import Settings

log = logging.getLogger(__name__)


class TopicBroker(Base):
    def __init__(self, settings: Settings, database: Database, metrics: Metrics, sealing: Sealing) -> None:
        super().__init__(settings, database, metrics)
        self.sealing = sealing  # fan-out seals what goes into encrypted queues
        self._signer: signing.Signer | None = None
        self._signer_lock = asyncio.Lock()

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
                                             keyring=self.sealing.keyring)
        self.metrics.record_published(topic, published)
        for queue in published.queues:
            self.metrics.series(self.metrics.sent, queue).inc()
        return published
