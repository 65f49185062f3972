"""Long polling without holding database connections.

A receive that finds nothing registers a waiter and sleeps on an asyncio event. One
LISTEN connection per process hears the ``conveyor_queue`` notifications that sends
emit at commit ("<count> <queue>") and wakes up to <count> waiters of that queue, oldest
first; a woken waiter that loses the race goes back to sleep. Sends only NOTIFY while a
server has marked the queue as listened to (``conveyor.queue_listen``), because NOTIFY
serialises commits; the hub renews that mark while it has waiters.

Stream consumers wait the same way, under the key ``stream:<name>``: the ticker announces
every tick on ``conveyor_stream`` and all waiters of that stream are woken (each is a
different consumer with its own batch).

Pops of a partitioned queue wait under one key per consumer group; a push's notification
("<count> partitioned/<queue>", sent while the queue is marked with
``conveyor.pqueue_listen``) wakes up to <count> waiters of every group of that queue.

Messages can also become visible without a send (a visibility timeout or a delay runs
out, or a send raced the mark): every ``poll_fallback`` seconds the hub wakes the oldest
waiter of each queue so that it looks again. After the LISTEN connection is re-established
every waiter is woken once, since notifications may have been missed meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from conveyor import errors
from conveyor.db import listen
from conveyor.server import deadline

log = logging.getLogger(__name__)

QUEUE_CHANNEL = "conveyor_queue"
STREAM_CHANNEL = "conveyor_stream"
# Delay before reconnecting the LISTEN connection, doubled after each failed attempt.
MIN_RECONNECT_DELAY = 0.1
MAX_RECONNECT_DELAY = 5.0


def stream_key(stream: str) -> str:
    return f"stream:{stream}"


PARTITIONED = "partitioned/"  # pushes to a partitioned queue notify "<count> partitioned/<queue>"


def partitioned_key(queue: str, group: str) -> str:
    """The waiters of one consumer group of a partitioned queue: a push wakes up to
    <count> of each group's (each group reads every message)."""
    return f"{PARTITIONED}{queue}\x00{group}"


def partitioned_queue(key: str) -> str | None:
    """The partitioned queue a waiter key (or a notification's key) names, if it does."""
    if not key.startswith(PARTITIONED):
        return None
    return key[len(PARTITIONED):].partition("\x00")[0]


class Waiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """Sleep until woken or ``timeout``; True if woken."""
        try:
            with deadline.waiting(timeout):  # a long poll's wait is not the request's work
                await asyncio.wait_for(self.event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.event.clear()


class WaiterHub:
    def __init__(self, dsn: str, mark_listened: Callable[[str, int], Awaitable[object]], *,
                 listen_seconds: int = 60, poll_fallback: float = 1.0) -> None:
        self._dsn = dsn
        self._mark_listened = mark_listened
        self._listen_seconds = listen_seconds
        self._poll_fallback = poll_fallback
        self._waiters: dict[str, collections.deque[Waiter]] = {}
        self._marked_until: dict[str, float] = {}
        self._marking: dict[str, asyncio.Future[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = asyncio.Event()
        self._reconnect_delay = MIN_RECONNECT_DELAY
        self.closing = False

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, wait_connected: float = 5.0) -> None:
        self._tasks = [asyncio.create_task(self._listen_forever(), name="conveyor-listen"),
                       asyncio.create_task(self._poll_forever(), name="conveyor-poll-fallback")]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), wait_connected)

    async def stop(self) -> None:
        self.wake_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def shutting_down(self) -> None:
        """Stop new long polls from sleeping and release the ones asleep."""
        self.closing = True
        self.wake_all()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    # -- waiting ---------------------------------------------------------------------

    @contextlib.contextmanager
    def register(self, queue: str) -> Iterator[Waiter]:
        waiter = Waiter()
        self._waiters.setdefault(queue, collections.deque()).append(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(queue)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
                if not waiters:
                    del self._waiters[queue]

    async def ensure_marked(self, queue: str) -> None:
        """Make sure sends to ``queue`` NOTIFY for a while (one database call per queue
        per half ``listen_seconds``, shared by concurrent callers)."""
        if self._marked_until.get(queue, 0.0) - time.monotonic() > self._listen_seconds / 2:
            return
        pending = self._marking.get(queue)
        if pending is None:
            pending = asyncio.ensure_future(self._mark(queue))
            self._marking[queue] = pending
            pending.add_done_callback(lambda _: self._marking.pop(queue, None))
        await asyncio.shield(pending)

    async def _mark(self, queue: str) -> None:
        started = time.monotonic()
        await self._mark_listened(queue, self._listen_seconds)
        self._marked_until[queue] = started + self._listen_seconds

    # -- waking ----------------------------------------------------------------------

    def wake(self, queue: str, count: int = 1) -> None:
        for waiter in list(self._waiters.get(queue, ()))[:max(count, 1)]:
            waiter.event.set()

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()

    def _on_notification(self, channel: str, payload: str) -> None:
        if channel == STREAM_CHANNEL:
            for waiter in list(self._waiters.get(stream_key(payload), ())):
                waiter.event.set()
            return
        count, _, queue = payload.partition(" ")
        try:
            n = int(count)
        except ValueError:
            return
        if queue.startswith(PARTITIONED):
            prefix = queue + "\x00"
            for key in [k for k in self._waiters if k.startswith(prefix)]:
                self.wake(key, n)
            return
        self.wake(queue, n)

    async def _listen_forever(self) -> None:
        while True:
            try:
                async for channel, payload in listen.notifications(
                        self._dsn, (QUEUE_CHANNEL, STREAM_CHANNEL), self._on_listening):
                    self._on_notification(channel, payload)
            except errors.ConveyorError as exc:
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, self._reconnect_delay)
            self._connected.clear()
            self._marked_until.clear()  # the database may have been restored or replaced
            await asyncio.sleep(self._reconnect_delay)
            self._reconnect_delay = min(self._reconnect_delay * 2, MAX_RECONNECT_DELAY)

    async def _on_listening(self) -> None:
        # reconnected (to the same server, or through a multi-host DSN to a new primary):
        # the next loss starts again from a short delay, even if no notification came
        self._reconnect_delay = MIN_RECONNECT_DELAY
        self._connected.set()
        self.wake_all()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_fallback)
            for queue in list(self._waiters):
                self.wake(queue, 1)
