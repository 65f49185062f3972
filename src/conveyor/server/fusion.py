"""Request fusion for sends: concurrent sends to one queue become one SQL call.

Each queue has a small pipeline of at most ``max_inflight`` SQL calls. A send joins the
queue's pending list; if a pipeline slot is free it is flushed at once (no added latency
when the server is idle), otherwise it waits for the next free slot and leaves with
everything that piled up meanwhile. So the batch grows with load by itself: no timer to
tune. Each caller is answered with its own ids after the batch's COMMIT, never before.

A batch that fails because of one bad message (invalid input) is re-run request by
request, so only the culprit sees the error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from conveyor import errors, types

log = logging.getLogger(__name__)

SendBatch = Callable[[str, Sequence[types.OutgoingMessage]], Awaitable[list[int]]]


@dataclasses.dataclass(slots=True)
class _Request:
    messages: Sequence[types.OutgoingMessage]
    future: asyncio.Future[list[int]]


@dataclasses.dataclass(slots=True)
class _QueueState:
    pending: collections.deque[_Request] = dataclasses.field(default_factory=collections.deque)
    inflight: int = 0


class SendFuser:
    def __init__(self, send_batch: SendBatch, *, max_batch: int = 500, max_inflight: int = 2,
                 on_flush: Callable[[int], None] | None = None) -> None:
        self._send_batch = send_batch
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._on_flush = on_flush
        self._queues: dict[str, _QueueState] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, queue: str, messages: Sequence[types.OutgoingMessage]) -> list[int]:
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        state = self._queues.setdefault(queue, _QueueState())
        state.pending.append(_Request(messages, future))
        self._kick(queue, state)
        return await asyncio.shield(future)  # a cancelled client does not cancel the batch

    def _kick(self, queue: str, state: _QueueState) -> None:
        while state.pending and state.inflight < self._max_inflight:
            batch = self._take(state)
            state.inflight += 1
            task = asyncio.create_task(self._flush(queue, state, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self, state: _QueueState) -> list[_Request]:
        batch, size = [], 0
        while state.pending and (not batch or size + len(state.pending[0].messages) <= self._max_batch):
            request = state.pending.popleft()
            batch.append(request)
            size += len(request.messages)
        return batch

    async def _flush(self, queue: str, state: _QueueState, batch: list[_Request]) -> None:
        try:
            await self._run(queue, batch)
        finally:
            state.inflight -= 1
            if state.pending:
                self._kick(queue, state)
            elif state.inflight == 0 and self._queues.get(queue) is state:
                del self._queues[queue]

    async def _run(self, queue: str, batch: list[_Request]) -> None:
        messages = [m for r in batch for m in r.messages]
        if self._on_flush:
            self._on_flush(len(messages))
        try:
            ids = await self._send_batch(queue, messages)
        except errors.InvalidInput as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
            else:
                await asyncio.gather(*(self._run(queue, [r]) for r in batch))
            return
        except BaseException as exc:
            for request in batch:
                _fail(request, exc if isinstance(exc, Exception) else errors.Unavailable("shutting down"))
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for request in batch:
            end = start + len(request.messages)
            if not request.future.done():
                request.future.set_result(ids[start:end])
            start = end

    async def drain(self, timeout: float) -> None:
        """Wait for every accepted send to be flushed (graceful shutdown)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._tasks:
                    await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _fail(request: _Request, exc: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(exc)
