"""A queue worker: handlers per queue, concurrency, heartbeats, retries, dead letters and a
graceful stop.

    client = AsyncClient.http("http://127.0.0.1:9324", token)
    worker = Worker(client, concurrency=4, visibility_timeout=30)

    @worker.handler("emails")
    async def send_email(message: Received) -> None:
        ...

    await worker.run()          # until SIGTERM/SIGINT (or worker.stop())

- **Heartbeats.** While a handler runs, its message's visibility timeout is extended
  every third of it, so a job longer than the timeout is not handed to another worker
  mid-flight (the complaint users of every queue make). A heartbeat that finds the
  delivery gone (another worker has it) cancels the handler: its work is no longer ours.
- **Retries.** A handler that raises gets its message back after a backoff
  (``retry_delay`` x 2^(attempt-1), capped by ``max_retry_delay``); after
  ``max_attempts`` deliveries, or when it raises ``DeadLetter``, the message is failed:
  to the queue's dead-letter queue, else its archive as failed, with the error.
- **Graceful stop.** SIGTERM (or ``stop()``) stops receiving; handlers running get
  ``shutdown_timeout`` seconds to finish and are then cancelled and their messages
  released at once (visible to other workers again), so nothing waits out a timeout.
- **Reconnects.** A receive that fails (server or database away) is retried with
  backoff; the worker keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor import errors, tracing
from conveyor.client.consumer import DeadLetter, _Backoff  # one exception and one backoff for both clients
from conveyor.client.queues import AsyncClient, Leased, Received

log = logging.getLogger("conveyor.client.worker")

Message = Received | Leased
QueueHandler = Callable[[Message], Awaitable[Any] | Any]


@dataclass
class WorkerStats:
    done: int = 0
    retried: int = 0
    dead_lettered: int = 0
    released: int = 0
    lost: int = 0  # deliveries another worker took over while the handler ran
    errors: list[str] = field(default_factory=list)


class Worker:
    def __init__(self, client: AsyncClient, *, concurrency: int = 1, visibility_timeout: int = 30,
                 max_attempts: int = 5, retry_delay: float = 1.0, max_retry_delay: float = 300.0,
                 shutdown_timeout: float = 10.0, wait: float = 5.0) -> None:
        if concurrency < 1 or visibility_timeout < 1 or max_attempts < 1:
            raise ValueError("concurrency, visibility_timeout (seconds) and max_attempts must be at least 1")
        self.client = client
        self.concurrency = concurrency
        self.visibility_timeout = visibility_timeout
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.shutdown_timeout = shutdown_timeout
        self.wait = wait
        self.handlers: dict[str, QueueHandler] = {}
        self._groups: dict[str, str | None] = {}  # partitioned queues: their consumer group
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._free, self._freed = concurrency, asyncio.Event()

    def handler(self, queue: str, *, partitioned: bool = False,
                group: str | None = None) -> Callable[[QueueHandler], QueueHandler]:
        """Register the handler of ``queue``: a queue, or with ``partitioned`` a
        partitioned queue (docs/queen.md) read by consumer ``group`` (queue mode when None):
        its messages come a partition at a time under a lease, which heartbeats renew."""
        def register(fn: QueueHandler) -> QueueHandler:
            if queue in self.handlers:
                raise ValueError(f"queue {queue!r} has a handler already")
            self.handlers[queue] = fn
            if partitioned:
                self._groups[queue] = group
            return fn

        return register

    def stop(self) -> None:
        """Stop receiving; running handlers get ``shutdown_timeout`` to finish."""
        self._stopping.set()
        self._freed.set()  # a receive loop waiting for a free slot looks again

    async def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Work until ``stop()`` (or SIGTERM/SIGINT), then let running handlers finish
        for ``shutdown_timeout`` and release what is left. The stats of the run."""
        if not self.handlers:
            raise ValueError("no handlers: register one with @worker.handler(queue)")
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.stop)
        self._free, self._freed = self.concurrency, asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        try:
            await asyncio.gather(*(self._receive_loop(queue, running) for queue in self.handlers))
            if running:
                _, late = await asyncio.wait(set(running), timeout=self.shutdown_timeout)
                for task in late:
                    task.cancel()  # _handle releases its message
                if late:
                    await asyncio.wait(late)
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.remove_signal_handler(sig)
        return self.stats

    async def _take_slots(self) -> int:
        """Every free handler slot (at least one, waiting for it): a receive asks for as
        many messages as can be worked on now."""
        while self._free == 0 and not self._stopping.is_set():
            self._freed.clear()
            await self._freed.wait()
        taken, self._free = self._free, 0
        return taken

    def _give_slots(self, n: int = 1) -> None:
        self._free += n
        self._freed.set()

    async def _receive_loop(self, queue: str, running: set[asyncio.Task[None]]) -> None:
        backoff = _Backoff()  # the stream consumer's reconnect backoff: 0.2 s doubling to 10 s, jittered
        while not self._stopping.is_set():
            free = await self._take_slots()
            if self._stopping.is_set():
                self._give_slots(free)
                return
            try:
                got = await self._receive(queue, free)
                backoff.reset()
            except (errors.Unavailable, errors.Throttled) as exc:
                got = []
                delay = backoff.next()
                log.warning("receiving from %s failed (%s); again in %.1f s", queue, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
            self._give_slots(free - len(got))
            for message in got:
                task = asyncio.create_task(self._handle(message))
                running.add(task)
                task.add_done_callback(running.discard)

    async def _receive(self, queue: str, qty: int) -> list[Any]:
        """A long poll that ends early when the worker is told to stop."""
        asking: Awaitable[list[Any]] = (
            self.client.pop(queue, group=self._groups[queue], batch=qty, wait=self.wait) if queue in self._groups
            else self.client.receive(queue, max=qty, vt=self.visibility_timeout, wait=self.wait))
        receive = asyncio.ensure_future(asking)
        stopping = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait({receive, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if receive in done:
            return receive.result()
        receive.cancel()
        with contextlib.suppress(asyncio.CancelledError, errors.ConveyorError):
            got = await receive
            for message in got:  # received as the stop came: give them straight back
                await self.client.release(message)
        return []

    async def _handle(self, message: Message) -> None:
        with tracing.consumer_span(f"process {message.queue}", message.traceparent):  # continues the sender's trace
            await self._work_on(message)

    async def _work_on(self, message: Message) -> None:
        work = asyncio.create_task(_call(self.handlers[message.queue], message))
        lost = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(message, work, lost))
        try:
            await work
        except asyncio.CancelledError:
            work.cancel()
            current = asyncio.current_task()
            if lost.is_set() and not (current is not None and current.cancelling()):
                self.stats.lost += 1  # the delivery is another worker's now: nothing to settle
                return
            await self._settle(self.client.release(message), "release")  # stopping: back at once
            self.stats.released += 1
            raise
        except DeadLetter as exc:
            await self._settle(self.client.fail(message, str(exc) or "dead-lettered by the handler"), "fail")
            self.stats.dead_lettered += 1
        except Exception as exc:  # noqa: BLE001 - whatever the handler raised: retry later, or dead-letter
            reason = f"{type(exc).__name__}: {exc}"
            self.stats.errors.append(reason)
            if message.receive_count >= self.max_attempts:
                await self._settle(self.client.fail(message, reason), "fail")
                self.stats.dead_lettered += 1
            else:
                await self._settle(self.client.retry(message, self._backoff(message.receive_count), reason), "retry")
                self.stats.retried += 1
        else:
            await self._settle(self.client.ack(message), "ack")
            self.stats.done += 1
        finally:
            beat.cancel()
            self._give_slots()

    def _backoff(self, attempt: int) -> int:
        return int(min(self.max_retry_delay, self.retry_delay * 2 ** max(attempt - 1, 0)))

    async def _heartbeat(self, message: Message, work: asyncio.Task[Any], lost: asyncio.Event) -> None:
        """Extend the message's visibility every third of the timeout while ``work`` runs;
        once the delivery is no longer ours, set ``lost`` and cancel ``work``."""
        interval = self.visibility_timeout / 3
        while not work.done():
            await asyncio.sleep(interval)
            if work.done():
                return
            try:
                held = await self.client.extend(message, self.visibility_timeout)
            except errors.ConveyorError as exc:
                log.warning("heartbeat for message %s failed: %s", message.id, exc)
                continue
            if not held:
                log.warning("message %s of %s was delivered to another worker: its handler is cancelled",
                            message.id, message.queue)
                lost.set()
                work.cancel()
                return

    async def _settle(self, call: Awaitable[bool], what: str) -> None:
        try:
            await call
        except errors.ConveyorError as exc:  # the visibility timeout will bring it back
            log.warning("%s failed: %s", what, exc)


async def _call(fn: QueueHandler, message: Message) -> Any:
    """An async handler in the worker's loop; a plain function in a thread (so heartbeats
    keep beating while it blocks; a thread cannot be cancelled, so a stop waits for it)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return await fn(message)  # type: ignore[misc]
    result = await asyncio.to_thread(fn, message)
    if inspect.isawaitable(result):
        return await result
    return result
