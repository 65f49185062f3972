"""A stream consumer: handlers per event type, one batch at a time, acknowledged as a whole.

Each batch is received, every event is handed to the handler for its type, failures are
retried (``nack``) or dead-lettered, and the batch is acknowledged. With
``transactional=True`` all of that, and the handlers' own writes on ``ctx.conn``, is one
transaction per batch. The consumer waits on LISTEN ``conveyor_stream`` (the ticker's
announcement) with a poll fallback, and reconnects after losing the database.
See docs/client.md for the semantics.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from conveyor import errors, tracing
from conveyor.core import streams
from conveyor.db import execute, listen, pool
from conveyor.types import StreamEvent

log = logging.getLogger("conveyor.client")

STREAM_CHANNEL = "conveyor_stream"  # the ticker NOTIFYs it with the stream's name on every tick
FALLBACK = "*"
MAX_REASON_CHARS = 1000
RECONNECT_FIRST_DELAY = 0.2  # seconds; doubles up to RECONNECT_MAX_DELAY, with jitter
RECONNECT_MAX_DELAY = 10.0

Connection = execute.Connection
Handler = Callable[[StreamEvent, "Context"], Awaitable[None] | None]
H = TypeVar("H", bound=Handler)


class DeadLetter(Exception):
    """Raise from a handler to dead-letter the event at once (no retries)."""

    def __init__(self, reason: str = "dead-lettered by handler") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler gets besides the event."""

    conn: Connection | None  # the batch's transaction (transactional mode), else None
    batch_id: int
    consumer: str  # the consumer's name
    stream: str


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one batch came to: ``batch_id`` None when there was nothing to receive."""

    batch_id: int | None
    events: int = 0
    retried: int = 0
    dead_lettered: int = 0


class _TransactionSpoiled(Exception):
    """A handler left the batch's transaction aborted (it swallowed a database error):
    the batch must be rolled back and run again with that event failed."""

    def __init__(self, event_id: int, reason: str) -> None:
        super().__init__(reason)
        self.event_id = event_id
        self.reason = reason


class _Backoff:
    def __init__(self, first: float = RECONNECT_FIRST_DELAY, cap: float = RECONNECT_MAX_DELAY) -> None:
        self.first, self.cap, self.attempts = first, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.first * 2 ** self.attempts) * random.uniform(0.5, 1.0)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0


def _reason(exc: BaseException) -> str:
    text = repr(exc)
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def _is_async(fn: Callable[..., Any]) -> bool:
    # a callable object whose __call__ is a coroutine function counts too
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class Consumer:
    """A named consumer of one stream.

    ``batch_size`` events are fetched in the first round trip of a batch; a batch is
    always processed whole (the acknowledgement finishes all of it), so a bigger batch is
    fetched entirely. ``retry_after`` is how long a failed event waits before it is
    redelivered (whole seconds). ``subscribe`` subscribes the consumer on start (events
    from then on); otherwise it must already be subscribed.
    """

    def __init__(self, dsn: str, stream: str, name: str, *, batch_size: int = 1000,
                 poll_interval: float = 1.0, retry_after: timedelta = timedelta(seconds=60),
                 transactional: bool = False, subscribe: bool = True) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        self.dsn = dsn
        self.stream = stream
        self.name = name
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.retry_after = retry_after
        self.transactional = transactional
        self.subscribe = subscribe
        self._handlers: dict[str, Handler] = {}
        self._spoiled: dict[int, str] = {}  # event id -> reason, for a batch run again
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listening = False

    # -- handlers -------------------------------------------------------------------------

    def handler(self, *event_types: Any) -> Any:
        """Register a handler: ``@consumer.handler("order.created")`` for one type (or
        several), ``@consumer.handler()``, ``@consumer.handler("*")`` or plain
        ``@consumer.handler`` for the fallback. Sync and async callables are accepted."""
        if len(event_types) == 1 and callable(event_types[0]):
            fn = event_types[0]
            self.add_handler(FALLBACK, fn)
            return fn

        def register(fn: H) -> H:
            for event_type in event_types or (FALLBACK,):
                self.add_handler(event_type, fn)
            return fn

        return register

    def add_handler(self, event_type: str, fn: Handler) -> None:
        if not isinstance(event_type, str) or not event_type:
            raise TypeError(f"event type must be a non-empty string, got {event_type!r}")
        if not callable(fn):
            raise TypeError(f"handler must be callable, got {fn!r}")
        if event_type in self._handlers:
            raise ValueError(f"a handler for {event_type!r} is already registered")
        self._handlers[event_type] = fn

    # -- running --------------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether LISTEN is in effect (a tick wakes the consumer at once)."""
        return self._listening

    def stop(self) -> None:
        """Ask the consumer to stop: the current batch is finished, then ``run()`` returns.
        Safe from a handler, a signal handler or another thread."""
        self._stopping = True
        loop = self._loop
        if loop is None:  # not running: the next run() returns at once
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._set_stop_events()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._set_stop_events)

    def _set_stop_events(self) -> None:
        self._stop_event.set()
        self._wake.set()

    def run_sync(self, *, install_signal_handlers: bool = True) -> None:
        """``asyncio.run(self.run())``."""
        asyncio.run(self.run(install_signal_handlers=install_signal_handlers))

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until ``stop()`` (or SIGTERM/SIGINT, when running in the main thread).
        Returns after the current batch is finished; raises on errors that waiting will
        not cure (the stream does not exist, the consumer is not subscribed, ...)."""
        if not self._handlers:
            raise ValueError("no handlers registered: every event would be dead-lettered")
        if self._loop is not None:
            raise RuntimeError("this consumer is already running")
        loop = asyncio.get_running_loop()
        self._stop_event, self._wake = asyncio.Event(), asyncio.Event()  # bound to this loop
        self._loop = loop
        if self._stopping:
            self._set_stop_events()
        signals = self._install_signal_handlers(loop) if install_signal_handlers else []
        listener = loop.create_task(self._listen(), name=f"conveyor-listen-{self.stream}-{self.name}")
        try:
            await self._consume()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            self._restore_signal_handlers(loop, signals)
            self._loop = None
            self._listening = False
            self._stopping = False

    async def process_batch(self) -> BatchResult:
        """Receive and process one batch on a connection of its own (subscribing first if
        configured); ``BatchResult(None)`` when there was none. For scripts, cron jobs
        and tests; ``run()`` is the long-running loop."""
        async with pool.connect(self.dsn) as conn:
            if self.subscribe:
                await streams.subscribe(conn, self.stream, self.name)
            return await self._process(conn)

    async def _consume(self) -> None:
        backoff = _Backoff()
        while not self._stopping:
            try:
                async with pool.connect(self.dsn) as conn:
                    if self.subscribe:
                        await streams.subscribe(conn, self.stream, self.name)
                    backoff.reset()
                    while not self._stopping:
                        self._wake.clear()
                        result = await self._process(conn)
                        if result.batch_id is None:
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            except errors.Unavailable as exc:
                if self._stopping:
                    return
                delay = backoff.next()
                log.warning("consumer %s of stream %s: %s; reconnecting in %.1f s",
                            self.name, self.stream, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_event.wait(), delay)

    async def _listen(self) -> None:
        """Set the wake event on every tick of this stream; reconnect with backoff."""
        backoff = _Backoff()

        async def listening() -> None:
            self._listening = True
            backoff.reset()
            self._wake.set()  # ticks made before LISTEN took effect: look once

        while True:
            try:
                async with contextlib.aclosing(
                        listen.notifications(self.dsn, [STREAM_CHANNEL], on_listening=listening)) as notes:
                    async for _channel, payload in notes:
                        if payload == self.stream:
                            self._wake.set()
            except Exception as exc:  # noqa: BLE001 - the listener must outlive any failure
                self._listening = False
                delay = backoff.next()
                log.info("consumer %s: LISTEN %s lost (%s); polling, reconnecting in %.1f s",
                         self.name, STREAM_CHANNEL, exc, delay)
                await asyncio.sleep(delay)

    # -- one batch ------------------------------------------------------------------------

    async def _process(self, conn: Connection) -> BatchResult:
        try:
            if not self.transactional:
                return await self._handle_batch(conn, transactional=False)
            while True:
                try:
                    with execute.translated():
                        async with conn.transaction():
                            result = await self._handle_batch(conn, transactional=True)
                    self._spoiled.clear()
                    return result
                except _TransactionSpoiled as spoiled:  # rolled back: run the batch again
                    if spoiled.event_id in self._spoiled:
                        raise RuntimeError(f"event {spoiled.event_id} spoiled the transaction twice") from spoiled
                    log.warning("consumer %s: a handler left the transaction aborted at event %s; "
                                "running the batch again with that event failed", self.name, spoiled.event_id)
                    self._spoiled[spoiled.event_id] = spoiled.reason
        except errors.BatchNotFound as exc:
            # finished elsewhere: another process runs under the same consumer name
            log.warning("consumer %s of stream %s: %s", self.name, self.stream, exc)
            return BatchResult(None)

    async def _handle_batch(self, conn: Connection, *, transactional: bool) -> BatchResult:
        events = await streams.receive(conn, self.stream, self.name, self.batch_size)
        if not events:
            return BatchResult(None)
        batch_id = events[0].batch_id
        page = events
        while len(page) >= self.batch_size:  # the ack finishes all of it: take all of it
            page = await streams.receive(conn, self.stream, self.name, self.batch_size, after=page[-1].id)
            events += page
        ctx = Context(conn if transactional else None, batch_id, self.name, self.stream)
        retried = dead = 0
        for event in events:
            outcome = await self._handle_event(conn, event, ctx, transactional)
            retried += outcome == "retry"
            dead += outcome == "dead"
        await streams.ack(conn, batch_id)
        log.debug("consumer %s: batch %s done (%d events, %d retried, %d dead-lettered)",
                  self.name, batch_id, len(events), retried, dead)
        return BatchResult(batch_id, len(events), retried, dead)

    async def _handle_event(self, conn: Connection, event: StreamEvent, ctx: Context,
                            transactional: bool) -> str:
        """Run the event's handler: "ok", or "retry"/"dead" for what was done with it."""
        batch_id = ctx.batch_id
        if event.id in self._spoiled:
            return await streams.nack(conn, batch_id, event.id, self.retry_after, self._spoiled[event.id])
        fn = self._handlers.get(event.type) or self._handlers.get(FALLBACK)
        if fn is None:
            await streams.dead_letter(conn, batch_id, event.id, f"no handler for type {event.type}")
            return "dead"
        try:
            if transactional:
                async with conn.transaction():  # a savepoint: a failure undoes this event's writes only
                    await self._call(fn, event, ctx)
            else:
                await self._call(fn, event, ctx)
        except DeadLetter as exc:
            self._check_transaction(conn, event, exc, transactional)
            await streams.dead_letter(conn, batch_id, event.id, exc.reason)
            return "dead"
        except Exception as exc:
            self._check_transaction(conn, event, exc, transactional)
            log.warning("consumer %s: handler for %s failed on event %s (retry %s)", self.name,
                        event.type, event.id, event.retry_count or 0, exc_info=True)
            return await streams.nack(conn, batch_id, event.id, self.retry_after, _reason(exc))
        return "ok"

    @staticmethod
    async def _call(fn: Handler, event: StreamEvent, ctx: Context) -> None:
        with tracing.consumer_span(f"process {ctx.stream}", event.traceparent):  # continues the producer's trace
            if _is_async(fn):
                await fn(event, ctx)
                return
            result = await asyncio.to_thread(fn, event, ctx)  # keeps the loop (LISTEN, signals) alive; copies the span
            if inspect.isawaitable(result):
                await result

    @staticmethod
    def _check_transaction(conn: Connection, event: StreamEvent, exc: Exception, transactional: bool) -> None:
        if not transactional:
            return
        if conn.closed or conn.broken:
            raise errors.Unavailable("the database connection was lost during a handler") from exc
        if conn.info.transaction_status.name == "INERROR":
            raise _TransactionSpoiled(event.id, _reason(exc)) from exc

    # -- signals --------------------------------------------------------------------------

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # e.g. Windows
                continue
            installed.append((sig, previous))
        return installed

    @staticmethod
    def _restore_signal_handlers(loop: asyncio.AbstractEventLoop, installed: list[tuple[int, Any]]) -> None:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stopping:
            log.warning("consumer %s: %s again; still finishing the current batch", self.name, name)
        else:
            log.info("consumer %s: %s, stopping after the current batch", self.name, name)
        self.stop()

