"""What every concept broker shares: the server's settings, pool and metrics, how its
fusion lanes are made and drained, and the helpers of fused calls."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from conveyor import errors
from conveyor.db.pool import Database
from conveyor.server.fusion import BatchPolicy, Concurrency, Fuser, Run, Static, Vegas
from conveyor.server.metrics import Metrics
from conveyor.settings import Settings

QUEUE_CACHE_SECONDS = 2.0  # how long a queue's settings (queues, partitioned queues) are trusted
QUEUE_CACHE_SIZE = 10000

K = TypeVar("K", bound=Hashable)
Req = TypeVar("Req")
Res = TypeVar("Res")
T = TypeVar("T")


def split(items: Sequence[T], sizes: Sequence[int]) -> list[list[T]]:
    """Hand out ``items`` in order: the first ``sizes[0]`` to the first asker, and so on."""
    out, start = [], 0
    for n in sizes:
        out.append(list(items[start:start + n]))
        start += n
    return out


def _concurrency(settings: Settings) -> Callable[[], Concurrency]:
    """Each fused key's concurrency controller (CONVEYOR_FUSION_CONCURRENCY)."""
    if settings.fusion_concurrency == "vegas":
        return lambda: Vegas(current=float(settings.fusion_max_inflight), highest=settings.fusion_vegas_max)
    return lambda: Static(settings.fusion_max_inflight)


class Base:
    """A concept broker's share of the server: settings, database, metrics, and the
    fusion lanes it owns (one ``Fuser`` per operation type)."""

    def __init__(self, settings: Settings, database: Database, metrics: Metrics) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics
        self.lanes: list[Fuser[Any, Any, Any]] = []  # drained when the server stops

    def _lane(self, kind: str, run: Run[K, Req, Res], max_batch: int, size: Callable[[Req], int],
              on_flush: Callable[[int], None] | None = None) -> Fuser[K, Req, Res] | None:
        """The fusion lane of operation ``kind`` (its CONVEYOR_FUSION_POLICY name), or None
        when fusion is off (CONVEYOR_FUSION)."""
        settings = self.settings
        if not settings.fusion:
            return None
        policy = settings.fusion_policies.get(kind)
        fuser: Fuser[K, Req, Res] = Fuser(
            run, max_batch=max_batch, size=size, on_flush=on_flush,
            policy=BatchPolicy(*policy) if policy is not None else BatchPolicy(),
            concurrency=_concurrency(settings), max_inflight=settings.fusion_max_inflight,
            max_pending=settings.fusion_max_pending)
        self.lanes.append(fuser)
        return fuser

    async def _fused(self, fuser: Fuser[K, Req, Res], key: K, request: Req) -> Res:
        try:
            return await fuser.submit(key, request)
        except errors.Throttled:
            self.metrics.series(self.metrics.admission_refused, "fusion").inc()
            raise

    async def drain(self) -> None:
        """Let the requests waiting in this concept's lanes finish (server shutdown)."""
        for fuser in self.lanes:
            await fuser.drain(self.settings.shutdown_timeout)
