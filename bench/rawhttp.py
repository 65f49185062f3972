"""A cheap HTTP/1.1 client for load generation: keep-alive connections, requests built as
bytes once per call site, responses read with nothing but the status line, Content-Length
and Connection headers looked at. Costs a fraction of aiohttp's client CPU per request, so
the machine's cores go to the server being measured.

    client = RawHttp("127.0.0.1", 9324)
    status, body = await client.post("/", payload, {"Content-Type": "..."})
    await client.close()

Connections are pooled: a call takes an idle connection or opens one, and gives it back
when the response is complete (a server that closes, or answers without Content-Length,
gets its connection dropped after the body). So N concurrent callers use N connections.
An idle connection the server closed (its keep-alive timeout) is replaced once, as
browsers and HTTP libraries do: the request is sent again on a new connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping


class HttpError(Exception):
    """The connection failed or the response could not be read."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one request; the response's status, body and whether to keep the connection."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        keep = b"\r\nconnection: close" not in lower and not head.startswith(b"HTTP/1.0")
        if status in (204, 304):  # no body, and often no Content-Length either
            return status, b"", keep
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            return status, await self.reader.read(), False  # body until the server closes
        end = head.index(b"\r\n", at + 2)
        body = await self.reader.readexactly(int(head[at + 17:end]))
        return status, body, keep

    def close(self) -> None:
        self.writer.close()


class RawHttp:
    def __init__(self, host: str, port: int, *, timeout: float = 60.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[_Connection] = []

    def request(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        """The request's bytes (build once, send many times)."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {f'[{self.host}]' if ':' in self.host else self.host}:{self.port}",
                 *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}", "", ""]
        return "\r\n".join(lines).encode("latin-1") + body

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Send prepared request bytes; returns (status, body). Raises HttpError."""
        conn = self._idle.pop() if self._idle else None
        try:
            async with asyncio.timeout(self.timeout):
                if conn is not None:
                    try:
                        status, body, keep = await conn.exchange(request)
                    except (ConnectionResetError, asyncio.IncompleteReadError) as exc:
                        # the server closed the idle connection (its keep-alive timeout)
                        # before it read this request: send it again on a new one
                        if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                            raise
                        conn.close()
                        conn = None
                if conn is None:
                    conn = _Connection(*await asyncio.open_connection(self.host, self.port))
                    status, body, keep = await conn.exchange(request)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if conn is not None:
                conn.close()
            raise HttpError(repr(exc)) from exc
        if keep:
            self._idle.append(conn)
        else:
            conn.close()
        return status, body

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        return await self.send(self.request("POST", path, body, headers))

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
