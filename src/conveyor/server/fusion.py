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

Two knobs per fuser (one fuser per operation type), as seed 004's libqueen has them:

- a batch policy (``BatchPolicy``): by default a batch goes as soon as a slot is free;
  with ``preferred`` > 1 a lane holds its requests until that many units wait or the
  oldest has waited ``max_hold`` seconds (bigger batches for a bounded added latency);
- a concurrency controller: ``Static`` (``max_inflight`` calls per key) or ``Vegas``,
  which moves the limit per key like TCP Vegas moves a window: it remembers the fastest
  call seen (the database's base round trip) and, from each call's round trip, estimates
  how many calls are queueing in PostgreSQL rather than running; fewer than ``alpha``
  and the limit grows by one, more than ``beta`` and it shrinks by one.

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
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeVar

from conveyor import errors

K = TypeVar("K", bound=Hashable)
Req = TypeVar("Req")
Res = TypeVar("Res")

# Runs one fused call: the key and the requests, in arrival order -> one result each.
Run = Callable[[K, Sequence[Req]], Awaitable[Sequence[Res]]]


@dataclasses.dataclass(frozen=True, slots=True)
class BatchPolicy:
    """When a lane's waiting requests go: at once (``preferred`` 1), or once ``preferred``
    units wait or the oldest has waited ``max_hold`` seconds."""

    preferred: int = 1
    max_hold: float = 0.0


class Concurrency(Protocol):
    """How many calls a key may have in flight."""

    def limit(self) -> int: ...

    def observe(self, rtt: float) -> None: ...


@dataclasses.dataclass(slots=True)
class Static:
    fixed: int = 1

    def limit(self) -> int:
        return self.fixed

    def observe(self, rtt: float) -> None:
        pass


@dataclasses.dataclass(slots=True)
class Vegas:
    """TCP Vegas' rule over database calls: queued = limit x (1 - base_rtt / rtt) calls wait
    in PostgreSQL instead of running; keep it between ``alpha`` and ``beta``. The base round
    trip is the fastest seen in the last ``window`` calls (so it follows a database that got
    slower for good)."""

    current: float = 2.0
    lowest: int = 1
    highest: int = 32
    alpha: float = 1.0
    beta: float = 3.0
    window: int = 500
    _base: float = float("inf")
    _next_base: float = float("inf")
    _seen: int = 0

    def limit(self) -> int:
        return max(self.lowest, int(self.current))

    def observe(self, rtt: float) -> None:
        if rtt <= 0:
            return
        self._seen += 1
        self._next_base = min(self._next_base, rtt)
        if self._seen >= self.window:  # start a new window: forget an old, faster base
            self._base, self._next_base, self._seen = self._next_base, float("inf"), 0
        self._base = min(self._base, rtt)
        queued = self.current * (1.0 - self._base / rtt)
        if queued < self.alpha:
            self.current = min(float(self.highest), self.current + 1.0)
        elif queued > self.beta:
            self.current = max(float(self.lowest), self.current - 1.0)


@dataclasses.dataclass(slots=True)
class _Pending(Generic[Req, Res]):
    request: Req
    future: asyncio.Future[Res]
    since: float = 0.0


@dataclasses.dataclass(slots=True)
class _Lane(Generic[Req, Res]):
    pending: collections.deque[_Pending[Req, Res]] = dataclasses.field(default_factory=collections.deque)
    inflight: int = 0
    units: int = 0  # waiting in ``pending``
    timer: asyncio.TimerHandle | None = None


class Fuser(Generic[K, Req, Res]):
    def __init__(self, run: Run, *, max_batch: int = 500, max_inflight: int = 1, max_pending: int = 10000,
                 size: Callable[[Req], int] = lambda _: 1,
                 on_flush: Callable[[int], None] | None = None,
                 policy: BatchPolicy = BatchPolicy(),
                 concurrency: Callable[[], Concurrency] | None = None) -> None:
        """``concurrency`` makes each key's controller (default: ``Static(max_inflight)``)."""
        self._run_batch = run
        self._max_pending = max_pending
        self._pending = 0  # units waiting in every lane
        self._max_batch = max_batch
        self._size = size
        self._on_flush = on_flush
        self._policy = policy
        self._new_concurrency = concurrency or (lambda: Static(max_inflight))
        self._controllers: dict[K, Concurrency] = {}
        self._lanes: dict[K, _Lane[Req, Res]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def controller(self, key: K) -> Concurrency:
        found = self._controllers.get(key)
        if found is None:
            if len(self._controllers) > 10000:  # keys come and go (queues): keep this bounded
                self._controllers.clear()
            found = self._controllers[key] = self._new_concurrency()
        return found

    async def submit(self, key: K, request: Req) -> Res:
        lane = self._lanes.setdefault(key, _Lane())
        if not lane.pending and self._policy.preferred <= 1 and lane.inflight < self.controller(key).limit():
            return await self._alone(key, lane, request)
        units = self._size(request)
        if self._pending + units > self._max_pending:
            if not lane.pending and lane.inflight == 0:
                del self._lanes[key]
            raise errors.Throttled(f"{self._pending} requests are already waiting to be written")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Res] = loop.create_future()
        lane.pending.append(_Pending(request, future, loop.time()))
        lane.units += units
        self._pending += units
        self._kick(key, lane)
        return await asyncio.shield(future)  # a cancelled client does not cancel the batch

    async def _alone(self, key: K, lane: _Lane[Req, Res], request: Req) -> Res:
        """A free slot and nobody waiting: run in the caller's task, with no hand-off."""
        lane.inflight += 1
        try:
            if self._on_flush:
                self._on_flush(self._size(request))
            started = time.perf_counter()
            [result] = await self._run_batch(key, [request])
            self.controller(key).observe(time.perf_counter() - started)
            return result
        finally:
            self._settle(key, lane)

    def _due(self, key: K, lane: _Lane[Req, Res]) -> bool:
        """Whether the lane's waiting requests should go now (the batch policy); if not,
        a timer kicks the lane when its oldest request has waited long enough."""
        policy = self._policy
        if policy.preferred <= 1 or lane.units >= policy.preferred:
            return True
        loop = asyncio.get_running_loop()
        wait = lane.pending[0].since + policy.max_hold - loop.time()
        if wait <= 0:
            return True
        if lane.timer is None:
            def fire() -> None:
                lane.timer = None
                self._kick(key, lane)
            lane.timer = loop.call_later(wait, fire)
        return False

    def _kick(self, key: K, lane: _Lane[Req, Res]) -> None:
        limit = self.controller(key).limit()
        while lane.pending and lane.inflight < limit and self._due(key, lane):
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
            lane.units -= units
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
            if lane.timer is not None:
                lane.timer.cancel()
            del self._lanes[key]

    async def _run(self, key: K, batch: list[_Pending[Req, Res]]) -> None:
        if self._on_flush:
            self._on_flush(sum(self._size(p.request) for p in batch))
        try:
            started = time.perf_counter()
            results = await self._run_batch(key, [p.request for p in batch])
            self.controller(key).observe(time.perf_counter() - started)
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
