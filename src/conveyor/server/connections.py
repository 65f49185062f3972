"""Connections: how long one may take to start and to finish a request's headers, and how
many one server process holds (docs/operations.md, "Connections").

uvicorn arms no timer on a new connection and cancels its keep-alive timer at the first
byte received, so a client that connects and then sends nothing, or part of a request
line and headers and then nothing (slow-loris), holds its connection for ever; enough of
them (uvicorn counts connections against ``limit_concurrency``) and every request,
``/livez`` and ``/readyz`` included, is answered 503. Here, on uvicorn's httptools
protocol:

- **idle**: a connection with no request started (a new one, or a keep-alive one after
  its last answer) is closed after ``idle_timeout`` seconds;
- **headers**: from the first byte of a request, its request line and headers must be
  complete within ``header_timeout`` seconds (more bytes do not move the deadline), or
  the connection is closed. Bodies are bounded by the request timeout (server/deadline.py)
  and the body limit, since a request whose headers are complete is the app's;
- **a bound per process**: at most ``limit`` connections. A new one beyond it closes the
  connection that has waited longest without a request in progress (idle, or still
  sending its headers), so a flood of connections that never finish a request churns
  through itself while a client that sends its request at once (a health probe, a real
  call) gets in and is answered. Only when every connection holds a request in progress
  is the newcomer closed instead.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# file descriptors kept for everything but client connections (the database pool, the
# LISTEN connection, log and spool files, the listening sockets)
RESERVED_FDS = 256


class Table:
    """The connections of one server process; those without a request in progress, oldest
    first, are the ones a newcomer beyond ``limit`` may push out."""

    def __init__(self, limit: int, closed: Callable[[str], None]) -> None:
        self.limit = limit
        self.closed = closed  # counts a connection the server closed, by reason
        self.count = 0
        self.waiting: dict[GuardedProtocol, None] = {}  # insertion-ordered: oldest first

    def admit(self, conn: GuardedProtocol) -> bool:
        """Make room for ``conn``; False if there is none (every connection is busy)."""
        if self.count >= self.limit:
            if not self.waiting:
                self.closed("refused")
                return False
            next(iter(self.waiting)).drop("pushed_out")
        self.count += 1
        self.waiting[conn] = None
        return True

    def wait(self, conn: GuardedProtocol) -> None:
        """``conn`` has no request in progress from now on (newest in line)."""
        self.waiting.pop(conn, None)
        self.waiting[conn] = None

    def leave(self, conn: GuardedProtocol) -> None:
        self.count -= 1
        self.waiting.pop(conn, None)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the idle and header deadlines and the table above
    (set on the subclass made by ``protocol``)."""

    table: Table
    header_timeout: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._member = False
        self._reading_headers = False
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneWrite(transport, self.loop))  # type: ignore[arg-type]
        if not self.table.admit(self):
            transport.abort()
            return
        self._member = True
        # the idle deadline of a connection that has sent nothing yet: uvicorn's keep-alive
        # timer, which its data_received cancels at the first byte
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if not self._reading_headers and (self.cycle is None or self.cycle.response_complete):
            # the first bytes of a request (even bytes the parser skips, such as blank lines
            # between requests)
            self._reading_headers = True
        super().data_received(data)
        if self._reading_headers and self._header_deadline is None and not self.transport.is_closing():
            # still incomplete after its first read: its headers are due within
            # header_timeout from now (a whole request in one read, the usual case, costs
            # no timer; later reads do not move the deadline)
            self._header_deadline = self.loop.call_later(self.header_timeout, self.drop, "headers")

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        self.table.waiting.pop(self, None)  # busy: not to be pushed out (a no-op if not a member)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._member and not self.pipeline and not self.transport.is_closing():
            self.table.wait(self)  # idle: uvicorn armed its keep-alive timer (idle_timeout)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.table.closed("idle")
        super().timeout_keep_alive_handler()

    def _unsupported_upgrade_warning(self) -> None:
        """Conveyor serves no WebSocket (run.py: ``ws="none"``): an Upgrade request is served
        as the HTTP request it is, without uvicorn's two warnings for each (one advising to
        install a WebSocket library), which anyone could fill the log with."""

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def drop(self, reason: str) -> None:
        """Close the connection now (its header deadline passed, or it is pushed out)."""
        self._forget()
        if not self.transport.is_closing():
            self.table.closed(reason)
            self.transport.close()  # nothing is being written on such a connection: a FIN, at once

    def _forget(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        if self._member:
            self._member = False
            self.table.leave(self)


class _OneWrite:
    """A connection's transport that sends an answer's status line and headers together with
    its body: uvicorn writes them in two calls, each a send() to the socket, and wakes the
    client twice. The head is held until the next write (the body, in the same step of the
    request's task) or, at the latest, the end of the event loop's current pass; whatever
    is held goes before anything else the transport is asked to do."""

    __slots__ = ("_held", "_loop", "_transport", "abort", "get_extra_info", "is_closing", "pause_reading",
                 "resume_reading")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held = b""
        # what the protocol calls on every request, bound once (the rest: __getattr__)
        self.is_closing, self.pause_reading, self.resume_reading = (transport.is_closing, transport.pause_reading,
                                                                    transport.resume_reading)
        self.get_extra_info, self.abort = transport.get_extra_info, transport.abort

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n":  # an answer's head
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._held:
            data, self._held = self._held, b""
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return len(self._held) + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol(limit: int, header_timeout: float, closed: Callable[[str], None]) -> type[GuardedProtocol]:
    """The protocol class of one server process: its own table of at most ``limit``
    connections (lowered to what the process's file descriptor limit allows); ``closed``
    counts the connections it closes, by reason."""
    return type("GuardedProtocol", (GuardedProtocol,),
                {"table": Table(_fd_bound(limit), closed), "header_timeout": header_timeout})


def _fd_bound(limit: int) -> int:
    """``limit``, or fewer if the process may not open that many files: the soft limit is
    raised towards the hard one first (as Go's runtime does), then what stays out of reach
    is logged. Past the descriptor limit accept() fails and the event loop stops accepting
    anyone for a while, health probes included; below it, the table pushes out instead."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limit + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return limit
    bound = max(16, soft - RESERVED_FDS)
    log.warning("CONVEYOR_MAX_CONNECTIONS %d is beyond this process's file descriptor limit (%d): holding at "
                "most %d connections; raise the limit (ulimit -n) to hold more", limit, soft, bound)
    return bound
