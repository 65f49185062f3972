"""Request deadlines: a request still running after ``CONVEYOR_REQUEST_TIMEOUT`` seconds
is cancelled and answered 408 in its protocol's terms (seed 000's TimeoutLayer; the edge,
``server.middleware.Edge``, sets it for each request).

Long polls are not cut short: time spent waiting for messages or a tick
(``server.waiters.Waiter.wait``) moves the deadline on by as long as it waited, so only
the work around the wait counts. A cancelled request may have done its database write
already (the commit raced the deadline), as with any lost answer: clients retry with
their idempotency keys (SQS FIFO deduplication ids, Queen transaction ids).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

current: ContextVar[asyncio.Timeout | None] = ContextVar("conveyor_request_deadline", default=None)


@contextlib.contextmanager
def waiting(seconds: float) -> Iterator[None]:
    """Waiting up to ``seconds`` inside does not count against the request's deadline."""
    timeout = current.get()
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
