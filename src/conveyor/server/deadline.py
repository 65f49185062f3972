"""Request deadlines: a request still running after ``CONVEYOR_REQUEST_TIMEOUT`` seconds
is cancelled and answered 408 in its protocol's terms (seed 000's TimeoutLayer; the edge,
``server.middleware.Edge``, starts and ends each request's deadline).

No timer is armed per request. A request's deadline is an entry in a table of the
requests in progress (``start``, ``end``), and a sweep on the event loop, every tenth of
the timeout (at most every second) while requests are in progress, cancels those past
theirs. A request is cancelled at most one sweep interval late. (An ``asyncio.timeout``
per request, armed and cancelled, with a context variable for ``waiting`` to find it,
cost 27k instructions of a send's ~700k: docs/benchmarks.md.)

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
from typing import Any

Task = asyncio.Task[Any]

_ends: dict[Task, float] = {}  # the requests in progress: the loop time each one's deadline falls
_expired: set[Task] = set()  # those the sweep cancelled, until their request ends
_sweeping: asyncio.AbstractEventLoop | None = None  # the loop whose sweep runs


def start(seconds: float) -> Task:
    """The current task's request has ``seconds`` from now; returns the task for ``end``."""
    global _sweeping
    task = asyncio.current_task()
    assert task is not None, "a request runs in a task"
    loop = task.get_loop()
    _ends[task] = loop.time() + seconds
    if _sweeping is not loop:
        _sweeping = loop
        interval = min(1.0, seconds / 10)
        loop.call_later(interval, _sweep, loop, interval)
    return task


def end(task: Task, cancelling: int) -> bool:
    """The request of ``task`` is over (a second call does nothing). Returns whether its
    deadline cancelled it: then that cancellation is withdrawn (``Task.uncancel``) and the
    caller answers in its place, unless another cancellation (``cancelling``: the task's
    count when the request started) is still pending, which the caller lets through."""
    _ends.pop(task, None)
    if task not in _expired:
        return False
    _expired.discard(task)
    return task.uncancel() <= cancelling


def _sweep(loop: asyncio.AbstractEventLoop, interval: float) -> None:
    global _sweeping
    if _sweeping is not loop:
        return  # another loop took the sweep over (tests run apps on loops of their own)
    if not _ends:
        _sweeping = None  # the next request starts it again
        return
    now = loop.time()
    for task, ends in list(_ends.items()):
        if ends <= now and task not in _expired and task.get_loop() is loop:
            _expired.add(task)
            task.cancel()
    loop.call_later(interval, _sweep, loop, interval)


@contextlib.contextmanager
def waiting(seconds: float) -> Iterator[None]:
    """Waiting up to ``seconds`` inside does not count against the request's deadline."""
    task = asyncio.current_task()
    ends = None if task is None else _ends.get(task)
    if task is None or ends is None or task in _expired:
        yield
        return
    loop = task.get_loop()
    started = loop.time()
    _ends[task] = ends + seconds
    try:
        yield
    finally:
        if task in _ends and task not in _expired:
            _ends[task] = ends + (loop.time() - started)
