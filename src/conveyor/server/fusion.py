"""Request fusion: concurrent requests of one kind on one key become one SQL call.

Each key (a queue, for sends; a queue and visibility timeout, for receives) has a small
pipeline of at most ``max_inflight`` SQL calls. A request joins the key's pending list;
if a pipeline slot is free it is flushed at once (no added latency when the server is
idle), otherwise it waits for the next free slot and leaves with everything that piled
up meanwhile. So batches grow with load by themselves: there is no timer to tune. Each
caller is answered with its own share of the result after the call's COMMIT, never
before.

A batch that fails because of bad input is re-run request by request, so that only the
culprit sees the error.

Admission control: at most ``max_pending`` units (messages, receive slots) wait in a
fuser, over all its keys; a request that would go beyond is refused at once with
``errors.Throttled`` rather than queued, so overload costs the client a retry, not the
server memory and every other client latency.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from conveyor import errors

K = TypeVar("K", bound=Hashable)
Req = TypeVar("Req")
Res = TypeVar("Res")

# Runs one fused call: the key and the requests, in arrival order -> one result each.
Run = Callable[[K, Sequence[Req]], Awaitable[Sequence[Res]]]


@dataclasses.dataclass(slots=True)
class _Pending(Generic[Req, Res]):
    request: Req
    future: asyncio.Future[Res]


@dataclasses.dataclass(slots=True)
class _Lane(Generic[Req, Res]):
    pending: collections.deque[_Pending[Req, Res]] = dataclasses.field(default_factory=collections.deque)
    inflight: int = 0


class Fuser(Generic[K, Req, Res]):
    def __init__(self, run: Run, *, max_batch: int = 500, max_inflight: int = 2, max_pending: int = 10000,
                 size: Callable[[Req], int] = lambda _: 1,
                 on_flush: Callable[[int], None] | None = None) -> None:
        self._run_batch = run
        self._max_pending = max_pending
        self._pending = 0  # units waiting in every lane
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._size = size
        self._on_flush = on_flush
        self._lanes: dict[K, _Lane[Req, Res]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, key: K, request: Req) -> Res:
        lane = self._lanes.setdefault(key, _Lane())
        if not lane.pending and lane.inflight < self._max_inflight:
            return await self._alone(key, lane, request)
        units = self._size(request)
        if self._pending + units > self._max_pending:
            if not lane.pending and lane.inflight == 0:
                del self._lanes[key]
            raise errors.Throttled(f"{self._pending} requests are already waiting to be written")
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        lane.pending.append(_Pending(request, future))
        self._pending += units
        self._kick(key, lane)
        return await asyncio.shield(future)  # a cancelled client does not cancel the batch

    async def _alone(self, key: K, lane: _Lane[Req, Res], request: Req) -> Res:
        """A free slot and nobody waiting: run in the caller's task, with no hand-off."""
        lane.inflight += 1
        try:
            if self._on_flush:
                self._on_flush(self._size(request))
            [result] = await self._run_batch(key, [request])
            return result
        finally:
            self._settle(key, lane)

    def _kick(self, key: K, lane: _Lane[Req, Res]) -> None:
        while lane.pending and lane.inflight < self._max_inflight:
            batch = self._take(lane)
            lane.inflight += 1
            task = asyncio.create_task(self._flush(key, lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self, lane: _Lane[Req, Res]) -> list[_Pending[Req, Res]]:
        batch: list[_Pending[Req, Res]] = []
        size = 0
        while lane.pending and (not batch or size + self._size(lane.pending[0].request) <= self._max_batch):
            item = lane.pending.popleft()
            batch.append(item)
            units = self._size(item.request)
            size += units
            self._pending -= units
        return batch

    async def _flush(self, key: K, lane: _Lane[Req, Res], batch: list[_Pending[Req, Res]]) -> None:
        try:
            await self._run(key, batch)
        finally:
            self._settle(key, lane)

    def _settle(self, key: K, lane: _Lane[Req, Res]) -> None:
        """A call finished: start the next batch, or forget an idle lane."""
        lane.inflight -= 1
        if lane.pending:
            self._kick(key, lane)
        elif lane.inflight == 0 and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _run(self, key: K, batch: list[_Pending[Req, Res]]) -> None:
        if self._on_flush:
            self._on_flush(sum(self._size(p.request) for p in batch))
        try:
            results = await self._run_batch(key, [p.request for p in batch])
        except errors.InvalidInput as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
            else:
                await asyncio.gather(*(self._run(key, [p]) for p in batch))
            return
        except Exception as exc:  # noqa: BLE001 - handed to every waiting caller, who reports it
            for p in batch:
                _fail(p, exc)
            return
        except BaseException:
            for p in batch:
                _fail(p, errors.Unavailable("the server is shutting down"))
            raise
        for p, result in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(result)

    async def drain(self, timeout: float) -> None:
        """Wait for every accepted request to be flushed (graceful shutdown)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._lanes or self._tasks:
                    if self._tasks:
                        await asyncio.gather(*list(self._tasks), return_exceptions=True)
                    else:  # only inline calls are running; they start the next batches
                        await asyncio.sleep(0.005)


def _fail(pending: _Pending[Req, Res], exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)
