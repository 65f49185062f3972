"""Request deadlines: a request still running after ``CONVEYOR_REQUEST_TIMEOUT`` seconds
is cancelled and answered 408 in its protocol's terms (seed 000's TimeoutLayer).

Long polls are not cut short: time spent waiting for messages or a tick
(``server.waiters.Waiter.wait``) moves the deadline on by as long as it waited, so only
the work around the wait counts. A cancelled request may have done its database write
already (the commit raced the deadline), as with any lost answer: clients retry with
their idempotency keys (SQS FIFO deduplication ids, Queen transaction ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.server.metrics import Metrics
from conveyor.server.middleware import OPEN_PATHS, Refuse, reply

log = logging.getLogger(__name__)

_current: ContextVar[asyncio.Timeout | None] = ContextVar("conveyor_request_deadline", default=None)


@contextlib.contextmanager
def waiting(seconds: float) -> Iterator[None]:
    """Waiting up to ``seconds`` inside does not count against the request's deadline."""
    timeout = _current.get()
    when = None if timeout is None else timeout.when()
    if timeout is None or when is None or timeout.expired():
        yield
        return
    loop = asyncio.get_running_loop()
    started = loop.time()
    timeout.reschedule(when + seconds)
    try:
        yield
    finally:
        if not timeout.expired():
            timeout.reschedule(when + (loop.time() - started))


class Deadline:
    """Cancels a request after ``seconds`` (long-poll waits excepted) and answers it with
    ``answer`` (the protocol's 408), unless its answer had already begun."""

    def __init__(self, app: ASGIApp, seconds: float, answer: Refuse, metrics: Metrics) -> None:
        self.app = app
        self.seconds = seconds
        self.answer = answer
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.seconds <= 0 or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        timeout = asyncio.timeout(self.seconds)
        token = _current.set(timeout)
        try:
            async with timeout:
                await self.app(scope, receive, send_wrapper)
        except TimeoutError:
            if not timeout.expired():
                raise  # a timeout of the request's own, not the deadline
            self.metrics.request_timeouts.inc()
            log.warning("%s %s cancelled after %ss (CONVEYOR_REQUEST_TIMEOUT)", scope["method"], scope["path"],
                        self.seconds)
            if not started:
                await self.answer(scope, receive, send)
        finally:
            _current.reset(token)


async def answer_rest(scope: Scope, receive: Receive, send: Send) -> None:
    await reply(send, 408, "the request took longer than the server's request timeout; retry it", "RequestTimeout")
