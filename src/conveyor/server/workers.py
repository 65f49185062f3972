"""Background workers of a server process: retention clean-up, the depth scrape and
message move tasks. All are safe to run in every process at once (the SQL uses SKIP
LOCKED)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from conveyor import errors
from conveyor.core import move_tasks, queues
from conveyor.db.pool import Database
from conveyor.server.metrics import Metrics

log = logging.getLogger(__name__)


async def every(interval: float, name: str, job: Callable[[], Awaitable[object]]) -> None:
    """Run ``job`` now and then every ``interval`` seconds; failures are logged, not fatal."""
    while True:
        try:
            await job()
        except errors.ConveyorError as exc:
            log.warning("%s failed: %s", name, exc)
        except Exception:
            log.exception("%s failed", name)
        await asyncio.sleep(interval)


async def maintenance(database: Database, max_rounds: int = 10) -> None:
    """Retention clean-up until a round removes nothing (at most ``max_rounds``)."""
    for _ in range(max_rounds):
        async with database.connection() as conn:
            removed = await queues.maintenance(conn)
        if not any(removed.values()):
            return


async def depth_scrape(database: Database, metrics: Metrics) -> None:
    async with database.connection() as conn:
        metrics.set_depths(await queues.metrics_all(conn))


async def move_dead_letters(database: Database) -> None:
    async with database.connection() as conn:
        await move_tasks.step(conn)


def start(database: Database, metrics: Metrics, *, maintenance_interval: float,
          depth_interval: float, move_interval: float = 1.0) -> list[asyncio.Task[None]]:
    return [
        asyncio.create_task(every(move_interval, "message move tasks", lambda: move_dead_letters(database)),
                            name="conveyor-move-tasks"),
        asyncio.create_task(every(maintenance_interval, "maintenance", lambda: maintenance(database)),
                            name="conveyor-maintenance"),
        asyncio.create_task(every(depth_interval, "depth scrape", lambda: depth_scrape(database, metrics)),
                            name="conveyor-depth-scrape"),
    ]
