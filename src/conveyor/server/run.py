"""Running the app under uvicorn, with a shutdown that first releases long-pollers."""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from conveyor.server.app import create_app
from conveyor.settings import Settings

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """On SIGTERM/SIGINT uvicorn stops accepting and waits for in-flight requests; long
    polls would hold it for up to their wait time, so they are answered first."""

    def __init__(self, config: uvicorn.Config, on_exit) -> None:  # noqa: ANN001
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)
        except RuntimeError:
            pass
        super().handle_exit(sig, frame)


def serve(settings: Settings, dsn: str) -> bool:
    """Serve until a signal; returns False if the server could not start."""
    app = create_app(settings, dsn)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        server_header=False,
    )
    server = _Server(config, app.state.broker.shutting_down)
    # uvicorn re-raises the signal that stopped it once it is done; with the default
    # handlers that would kill the process before the caller's clean-up (stopping the
    # embedded cluster) and make it exit 143 instead of 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return server.started
