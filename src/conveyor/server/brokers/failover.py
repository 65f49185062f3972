"""The failover spool (conveyor.server.spool) on the request path: while the database is
unreachable, spoolable writes are journalled on local disk and acknowledged; once it
answers again they are replayed into it, oldest first, exactly once.

This module owns the journal, the decision to use it and the replay. What a spooled write
records and how it is replayed belongs to the broker that takes it: sends to
``queues.QueueBroker``, pushes to ``partitioned.PartitionedBroker``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conveyor import errors
from conveyor.core import spooled
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server.brokers.base import Base
from conveyor.server.metrics import Metrics
from conveyor.server.spool import Damage, Spool
from conveyor.settings import Settings

log = logging.getLogger(__name__)

SPOOL_PAGE = 200  # spooled records replayed per transaction
SPOOL_REPLAY_INTERVAL = 0.2
SPOOL_CATCH_UP = 5.0  # seconds a write waits for the replay once the database is back

# Replays one spooled record (its JSON body) on a connection, in a savepoint.
Replay = Callable[[Connection, dict[str, Any]], Awaitable[None]]


async def _nothing_to_replay(_conn: Connection, body: dict[str, Any]) -> None:
    raise errors.Unavailable(f"no broker replays spooled {body.get('kind')!r} writes")


class Failover(Base):
    def __init__(self, settings: Settings, database: Database, metrics: Metrics) -> None:
        super().__init__(settings, database, metrics)
        self.spool: Spool | None = None
        self._replayer: asyncio.Task[None] | None = None
        self._spool_drained = asyncio.Event()  # set while nothing waits in the spool
        self._replay_send: Replay = _nothing_to_replay
        self._replay_push: Replay = _nothing_to_replay

    def replaying(self, send: Replay, pq_push: Replay) -> None:
        """How spooled sends and pushes are replayed (by the brokers that spool them)."""
        self._replay_send, self._replay_push = send, pq_push

    # -- taking writes -----------------------------------------------------------------

    def spools(self, protocol: str) -> bool:
        """Whether writes of ``protocol`` may be acknowledged from the spool."""
        return self.spool is not None and (protocol != "sqs" or self.settings.spool_sqs)

    def spooling(self) -> bool:
        """Writes go to the spool while the database is down, and after, until the spool
        has been replayed (so they reach the database in the order they were taken)."""
        return self.spool is not None and (self.database.down or self.spool.waiting > 0)

    async def must_spool(self) -> bool:
        """Whether a spoolable write goes to the spool. Once the database is back, a write
        waits (up to SPOOL_CATCH_UP seconds) for the replay to finish rather than join the
        spool behind it: under steady load the replay would otherwise never catch up."""
        if not self.spooling():
            return False
        if self.database.down:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._spool_drained.wait(), SPOOL_CATCH_UP)
        return self.spooling()

    async def append(self, record: dict[str, Any], writes: int) -> None:
        """Journal one spooled record of ``writes`` writes (messages, items)."""
        assert self.spool is not None
        self._spool_drained.clear()
        await self.spool.append(record)
        self.metrics.spooled.inc(writes)

    # -- the replay --------------------------------------------------------------------

    async def _replay_record(self, conn: Connection, body: dict[str, Any]) -> None:
        replay = self._replay_send if body["kind"] == "send" else self._replay_push
        await replay(conn, body)

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

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Open the spool (CONVEYOR_SPOOL_DIR), replay what a server that stopped before
        replaying left in it, and replay from now on whenever the database is back."""
        if self.settings.spool_dir is None:
            return
        self.spool = Spool(self.settings.spool_dir, self.settings.spool_max_bytes)
        if self.spool.waiting:  # leftovers of a server that stopped before replaying them
            log.warning("%d writes left in the failover spool: replaying them before taking traffic",
                        self.spool.waiting)
            await self.replay_spool()
        if not self.spool.waiting:
            self._spool_drained.set()
        self._replayer = asyncio.create_task(self._replay_forever())

    async def stop(self) -> None:
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
        if self.spool is not None:
            self.spool.close()
