"""Keeps the server's background workers running.

Each worker is a coroutine meant to run until the server stops. One that ends anyway,
by an exception nobody expected or by returning, is logged with its traceback and
started again after a pause that doubles up to ``MAX_BACKOFF`` (and resets once it has
run for a while). Whether each worker is running shows in ``/readyz`` and in the metrics
``conveyor_worker_up{worker}`` and ``conveyor_worker_restarts_total{worker}``, so a
worker that keeps failing is seen, not silent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conveyor.server.metrics import Metrics

log = logging.getLogger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 60.0  # seconds of running that reset the backoff
STOP_RETRY_SECONDS = 1.0  # stop(): how long a cancelled worker has before it is cancelled again


@dataclass(slots=True)
class WorkerState:
    running: bool = False
    restarts: int = 0
    last_error: str | None = None


class Supervisor:
    def __init__(self, metrics: Metrics, *, first_backoff: float = FIRST_BACKOFF) -> None:
        self._metrics = metrics
        self._first_backoff = first_backoff
        self._tasks: list[asyncio.Task[None]] = []
        self.states: dict[str, WorkerState] = {}

    def start(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        self.states[name] = WorkerState()
        self._metrics.worker_restarts.labels(name)  # the series exists from the start, at zero
        self._tasks.append(asyncio.create_task(self._keep_running(name, work), name=f"conveyor-{name}"))

    async def _keep_running(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        state, backoff = self.states[name], self._first_backoff
        while True:
            self._set(name, state, running=True)
            started = time.monotonic()
            try:
                await work()
                state.last_error = "returned"
                log.error("background worker %s returned; starting it again", name)
            except asyncio.CancelledError:
                self._set(name, state, running=False)
                raise
            except Exception as exc:
                state.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("background worker %s failed; starting it again in %.0f s", name, backoff)
            self._set(name, state, running=False)
            state.restarts += 1
            self._metrics.worker_restarts.labels(name).inc()
            if time.monotonic() - started >= HEALTHY_AFTER:
                backoff = self._first_backoff
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _set(self, name: str, state: WorkerState, *, running: bool) -> None:
        state.running = running
        self._metrics.worker_up.labels(name).set(1 if running else 0)

    def healthy(self) -> bool:
        return all(s.running for s in self.states.values())

    def report(self) -> dict[str, dict[str, object]]:
        return {name: {"running": s.running, "restarts": s.restarts, "last_error": s.last_error}
                for name, s in sorted(self.states.items())}

    async def stop(self) -> None:
        """Cancel every worker and wait until all have ended. A cancellation can be lost
        (Python 3.11's ``asyncio.wait_for`` drops one that races the awaited result, and a
        library may swallow one), so workers still running are cancelled again."""
        pending = {t for t in self._tasks if not t.done()}
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=STOP_RETRY_SECONDS)
            for task in pending:
                log.warning("background worker %s is still running after a cancellation; cancelling it again",
                            task.get_name())
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
