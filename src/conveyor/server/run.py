"""Running the app under uvicorn: one process, or several workers sharing one port.

Server processes are stateless above PostgreSQL (docs/architecture.md), so ``workers``
> 1 is the same server N times: the parent binds the port and forks the workers, which
accept from that one socket (the kernel spreads connections across them) and each run
the whole server, pools and background workers included. The parent only supervises:
SIGTERM or SIGINT is passed on to every worker, each drains as a single server does, and
the parent returns when all have exited. The workers live and die together: if one exits
on its own (it could not start, or crashed), the others are stopped and the parent
reports failure, so a process supervisor (systemd, Kubernetes) sees one failed service
rather than a server running short-handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from types import FrameType

import uvicorn
from prometheus_client import multiprocess

from conveyor.server import connections
from conveyor.server.app import App, create_app
from conveyor.settings import Settings

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Server(uvicorn.Server):
    """On SIGTERM/SIGINT uvicorn stops accepting and waits for in-flight requests; long
    polls would hold it for up to their wait time, so they are answered first."""

    def __init__(self, config: uvicorn.Config, on_exit) -> None:  # noqa: ANN001
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)


def _config(app: App, settings: Settings) -> uvicorn.Config:
    metrics = app.state.metrics
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # httptools, with deadlines for idle connections and unfinished headers and a bound
        # on connections per process (server/connections.py); made here, so each forked
        # worker has its own table
        http=connections.protocol(settings.max_connections, settings.http_header_timeout,
                                  lambda reason: metrics.series(metrics.connections_closed, reason).inc()),
        timeout_keep_alive=settings.http_idle_timeout,  # typed int, used as a delay: a float works
        # no WebSocket route exists: an Upgrade request is served as the HTTP request it is
        # (a connection handed to a WebSocket protocol would leave the bound above)
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,  # uvicorn's records go through conveyor.logs' handler, text or JSON
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        # no limit_concurrency: it counts connections, so connections that never finish a
        # request made it answer 503 to everyone, health probes included; connections are
        # bounded above, requests by the app's admission control (in each protocol's terms)
        server_header=False,
    )


class BindError(Exception):
    """A port the server was asked to listen on cannot be had; says what to do."""


def bind(settings: Settings) -> list[socket.socket]:
    """The listening sockets, bound before anything is announced: the server's port, and
    Queen's (``queen_port``) and hq's (``hq_port``) if asked for: the same app answers on
    each (on hq's, hq's API is at the root: the app tells the ports apart)."""
    sockets: list[socket.socket] = []
    try:
        for port, setting in ((settings.port, "--port / CONVEYOR_PORT"),
                              (settings.queen_port, "--queen-port / CONVEYOR_QUEEN_PORT"),
                              (settings.hq_port, "--hq-port / CONVEYOR_HQ_PORT")):
            if port is not None:
                sockets.append(_bind_one(settings.host, port, setting))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind_one(host: str, port: int, setting: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BindError(f"{host}:{port} is already in use: is another Conveyor (or another server) running "
                            f"there? Stop it, or choose another port with {setting}") from None
        if exc.errno == errno.EACCES:
            raise BindError(f"not allowed to listen on {host}:{port} (ports below 1024 need privileges): "
                            f"choose another with {setting}") from None
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror} ({setting})") from None
    sock.set_inheritable(True)
    return sock


def _serve_one(settings: Settings, dsn: str, sockets: list[socket.socket], *, first: bool = True) -> bool:
    """Serve in this process until a signal; False if the server could not start.
    ``first``: the first (or only) worker, which also reads the database's figures (the
    queue depths of /metrics, the dashboard's history: workers.start)."""
    app = create_app(settings, dsn, first_worker=first)
    server = _Server(_config(app, settings), app.state.broker.shutting_down)
    # uvicorn re-raises the signal that stopped it once it is done; with the default
    # handlers that would kill the process before the caller's clean-up (stopping the
    # embedded cluster) and make it exit 143 instead of 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in _STOP_SIGNALS}
    try:
        server.run(sockets=sockets)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return server.started


def serve(settings: Settings, dsn: str, sockets: list[socket.socket] | None = None) -> bool:
    """Serve on ``sockets`` (``bind``'s, bound now if not given) until a signal; False if
    the server could not start (or, with several workers, if one of them failed)."""
    sockets = sockets if sockets is not None else bind(settings)
    if settings.workers == 1:
        return _serve_one(settings, dsn, sockets)
    return _serve_workers(settings, dsn, sockets)


def _die_with_parent() -> None:
    """Have the kernel stop this worker if the parent goes away, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _worker(settings: Settings, dsn: str, sockets: list[socket.socket], first: bool) -> int:
    """The body of a forked worker; its exit code."""
    os.setpgid(0, 0)  # signals come from the parent only, once (not also from the terminal)
    _die_with_parent()
    try:
        return 0 if _serve_one(settings, dsn, sockets, first=first) else 3
    except BaseException:
        log.exception("worker %d failed", os.getpid())
        return 1


def _multiprocess_metrics() -> Path | None:
    """A directory where every worker writes its Prometheus series, so that /metrics,
    answered by any one worker, counts them all (prometheus-client's multiprocess mode);
    an operator's own PROMETHEUS_MULTIPROC_DIR is used as it is."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="conveyor-metrics-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder


def _as_metrics_worker() -> None:
    """In a forked worker: its metrics go to the multiprocess directory (prometheus-client
    picked its value class when the parent imported it). The worker's pid is taken once:
    prometheus-client asks for it at every update, to notice a fork, and a worker does not
    fork again; os.getpid is a system call, about a fifth of an update's cost (docs/benchmarks.md)."""
    from prometheus_client import values

    pid = os.getpid()
    values.ValueClass = values.MultiProcessValue(lambda: pid)


def _serve_workers(settings: Settings, dsn: str, sockets: list[socket.socket]) -> bool:
    metrics_dir = _multiprocess_metrics()
    for sock in sockets:
        sock.listen(2048)  # connections queue from now on, while the workers start
    children: set[int] = set()
    stopping = False
    failed = False

    def stop_all(sig: int = signal.SIGTERM) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            log.info("stopping %d workers", len(children))
            stop_all(signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    try:
        for index in range(settings.workers):
            if stopping:
                break
            pid = os.fork()
            if pid == 0:  # the worker
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                _as_metrics_worker()
                code = 1
                try:
                    code = _worker(settings, dsn, sockets, index == 0)
                finally:
                    logging.shutdown()
                    os._exit(code)
            children.add(pid)
        log.info("started %d workers: %s", len(children), " ".join(map(str, sorted(children))))
        while children:
            pid, status = os.wait()  # retried after a signal handler has run
            children.discard(pid)
            with contextlib.suppress(OSError):
                multiprocess.mark_process_dead(pid)  # its live gauges no longer count
            code = os.waitstatus_to_exitcode(status)
            if code != 0 or not stopping:
                failed = True
                log.error("worker %d exited with %d%s", pid, code,
                          "" if stopping else "; stopping the others")
            if not stopping:
                stopping = True
                stop_all(signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_all(signal.SIGKILL)  # only those still there after an error in the parent
        for sock in sockets:
            sock.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return not failed
