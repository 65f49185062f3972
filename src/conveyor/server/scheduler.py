"""The scheduler: every poll period, fire the schedules that are due.

Each pass is ``conveyor.core.schedules.fire_due`` (one transaction: claim with SKIP
LOCKED, a savepoint per schedule, one COMMIT), so every server process runs the
scheduler and several of them share the due schedules without firing any twice. A pass
that came back full is followed at once by another, up to ``max_rounds`` per period, so
a backlog drains without waiting a period per batch. Idle, a pass costs one probe of
the partial index on next_fire_at.

The clock is this process's (UTC); schedules fire within one poll period of their time.
Topic targets are published with the server's SNS signing key and URLs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from conveyor import errors, types
from conveyor.core import schedules, signing, topics
from conveyor.db.pool import Database
from conveyor.server.metrics import Metrics
from conveyor.settings import Settings

log = logging.getLogger(__name__)

UTC = dt.UTC


@dataclass(frozen=True)
class Config:
    poll_seconds: float = 1.0
    batch_size: int = 32
    max_rounds: int = 10
    urls: types.TopicUrls = field(default_factory=types.TopicUrls)
    # the server's SNS signer (None: unsigned envelopes)
    signer: Callable[[], Awaitable[signing.Signer | None]] | None = None
    clock: Callable[[], dt.datetime] = field(default=functools.partial(dt.datetime.now, UTC))


def config_from(settings: Settings, urls: types.TopicUrls,
                signer: Callable[[], Awaitable[signing.Signer | None]] | None = None) -> Config | None:
    """The scheduler's configuration from the settings; None if it is disabled
    (CONVEYOR_SCHEDULE_ENABLED=false). ``urls`` name topics and build envelopes."""
    if not settings.schedule_enabled:
        return None
    return Config(poll_seconds=settings.schedule_poll_seconds, batch_size=settings.schedule_batch_size,
                  urls=urls, signer=signer)


def _record(metrics: Metrics, done: list[types.ScheduleFiring]) -> None:
    for firing in done:
        if firing.fired:
            metrics.schedule_fires.inc(len(firing.fired))
        if firing.error is not None:
            metrics.schedule_failures.inc()
            log.info("schedule %r failed: %s", firing.name, firing.error)
        if firing.paused:
            metrics.schedule_pauses.inc()


async def step(database: Database, metrics: Metrics, config: Config) -> list[types.ScheduleFiring]:
    """Passes until one is not full (at most ``config.max_rounds``); what they did."""
    signer = await config.signer() if config.signer is not None else None
    publish = functools.partial(topics.publish, signer=signer, urls=config.urls)
    fired: list[types.ScheduleFiring] = []
    async with database.connection() as conn:
        for _ in range(config.max_rounds):
            done = await schedules.fire_due(conn, now=config.clock(), batch_size=config.batch_size,
                                            publish=publish)
            _record(metrics, done)
            fired.extend(done)
            if len(done) < config.batch_size:
                break
    return fired


async def run(database: Database, metrics: Metrics, config: Config) -> None:
    """Step every ``config.poll_seconds`` until cancelled; failures are logged, not fatal."""
    while True:
        try:
            await step(database, metrics, config)
        except errors.ConveyorError as exc:
            log.warning("scheduler pass failed: %s", exc)
        except Exception:
            log.exception("scheduler pass failed")
        await asyncio.sleep(config.poll_seconds)
