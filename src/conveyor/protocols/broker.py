"""What protocol handlers need from the running server, as an interface.

The server implements it (``conveyor.server.broker``, composing one broker per concept
from ``conveyor.server.brokers``: request fusion, long-poll waiters and metrics);
protocols depend only on this shape, never on the server. The interface is split by
concept the same way; ``Broker`` is all of them together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from conveyor import types
from conveyor.core import receipts, signing, unsubscribe_links


class Queues(Protocol):
    """Queues, standard and FIFO (the server's ``brokers.queues``)."""

    async def queue(self, name: str) -> types.Queue:
        """A queue's configuration, possibly a couple of seconds old."""

    async def send(self, queue: str, messages: Sequence[types.OutgoingMessage], *,
                   spool: bool = False) -> list[types.Sent]:
        """Send; answers once committed (possibly fused with other requests), or, with
        ``spool`` while the database is unreachable, once journalled by the failover
        spool (``Sent.spooled``)."""

    async def receive(self, queue: str, params: types.ReceiveParams) -> list[types.Message]:
        """Receive, long-polling up to ``params.wait`` without holding a connection."""

    # Acknowledgements act on deliveries: a message at the receive count its receipt names
    # (None: whichever delivery is current). Each returns what it acted on.
    async def delete(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]: ...

    async def delete_in_flight(self, queue: str,
                               deliveries: Sequence[types.MessageRef]) -> tuple[list[int], list[int]]:
        """Delete the deliveries still in flight: the ids deleted, and those whose delivery
        is over (the message visible again, or received again since)."""

    async def archive(self, queue: str, deliveries: Sequence[types.MessageRef]) -> list[int]: ...

    async def fail(self, queue: str, delivery: types.MessageRef, reason: str | None) -> bool: ...

    async def set_vt(self, queue: str, deliveries: Sequence[types.MessageRef], vt: int,
                     in_flight_only: bool = False) -> list[types.Message]: ...


class PartitionedQueues(Protocol):
    """Partitioned queues (seed 004's model; the server's ``brokers.partitioned``): JSON
    documents in Queen's field names, see conveyor.core.partitioned. Pushes, pops, acks
    and renewals may be fused with other requests."""

    async def pq_push(self, items: Sequence[dict[str, Any]], *, creatable: int) -> list[dict[str, Any]]:
        """Push; of the queues the items name that do not exist, create at most
        ``creatable`` (and none past the server's bound on all queues), else
        ``errors.QueueLimitReached`` and nothing is done."""

    async def pq_pop(self, request: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        """One pop, long-polling up to ``wait`` seconds without holding a connection."""

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...

    async def pq_renew(self, leases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...

    async def pq_transaction(self, operations: Sequence[dict[str, Any]], *, required_leases: Sequence[str] = (),
                             creatable: int) -> dict[str, Any]:
        """Acks and pushes, all or nothing; ``required_leases`` must all still be held (acks
        naming no lease act under them); queues created as ``pq_push`` does."""


class Streams(Protocol):
    """Streams (the server's ``brokers.streams``)."""

    async def stream_receive(self, stream: str, consumer: str, max_events: int,
                             wait: float = 0.0, after: int | None = None) -> list[types.StreamEvent]:
        """A stream consumer's next batch, long-polling up to ``wait`` seconds; with
        ``after``, the next page of the open batch."""


class Topics(Protocol):
    """Topics (the server's ``brokers.topics``)."""

    async def signer(self) -> signing.Signer | None:
        """The SNS signing key (None: this database role may not read it)."""

    def topic_urls(self, base_url: str | None = None) -> types.TopicUrls:
        """ARN region/account and URLs for SNS envelopes; ``base_url`` (what the client
        used) counts unless the server has a configured base URL."""

    async def publish(self, routing_key: str, publication: types.Publication,
                      urls: types.TopicUrls, *, topic: str | None = None) -> types.Published:
        """Fan a message out to the routing key's subscriptions (signed with the server's
        SNS key); answers once committed. ``topic`` names an existing SNS topic for the
        metrics; routing keys (any string a client writes) share one series."""


class Failover(Protocol):
    """The failover spool (the server's ``brokers.failover``)."""

    def spools(self, protocol: str) -> bool:
        """Whether this server may acknowledge writes of ``protocol`` from its spool."""


class Sealing(Protocol):
    """Encryption at rest, conveyor.crypto (the server's ``brokers.sealing``)."""

    def opened(self, got: list[types.Message]) -> list[types.Message]:
        """Queue messages read from the database with sealed bodies opened."""

    def pq_opened(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Partitioned-queue messages read from the database with sealed payloads opened."""

    def can_encrypt(self) -> bool:
        """Whether this server holds an encryption key (CONVEYOR_ENCRYPTION_KEY)."""


class Broker(Queues, PartitionedQueues, Streams, Topics, Failover, Sealing, Protocol):
    """Everything a protocol handler is given: each concept's operations, plus a pooled
    connection for core ops and the database's keys."""

    def connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A pooled autocommit connection for core ops."""

    @property
    def receipts(self) -> receipts.Keyring:
        """Makes and checks the receipts of queue deliveries (one key per database)."""

    @property
    def unsubscribe_links(self) -> unsubscribe_links.Links:
        """Checks the tokens of SNS unsubscribe links (one key per database)."""
