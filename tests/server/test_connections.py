"""Slow-loris against a real ``conveyor serve``: connections that never finish their request
headers (or never send one) are closed after the configured deadlines, a process holds a
bounded number of connections, and health probes and real requests keep being answered
meanwhile (server/connections.py)."""

from __future__ import annotations

import select
import socket
import time

import httpx
import pytest

from conveyor.settings import Settings
from support.server import ServerProcess

PARTIAL = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow"


def _open(port: int, count: int, first: bytes = b"") -> list[socket.socket]:
    """``count`` loopback connections, each having sent ``first`` (maybe nothing)."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first:
            s.sendall(first)
        s.setblocking(False)
        socks.append(s)
    return socks


def _closed(s: socket.socket) -> bool:
    """Whether the server has closed ``s`` (end of stream, or a reset)."""
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:  # ECONNRESET: the server aborted it
        return True


def _wait_closed(socks: list[socket.socket], timeout: float) -> list[socket.socket]:
    """Waits up to ``timeout`` for the server to close every socket; those still open."""
    still = list(socks)
    deadline = time.monotonic() + timeout
    while still and time.monotonic() < deadline:
        ready, _, _ = select.select(still, [], [], min(0.2, max(0.0, deadline - time.monotonic())))
        still = [s for s in still if not (s in ready and _closed(s))]
    return still


def _answers(server: ServerProcess, queue: str, i: int) -> None:
    """Health and a real request (a send and a receive), each on a new connection."""
    fresh = {"Connection": "close"}
    assert httpx.get(server.url + "/livez", headers=fresh, timeout=5).status_code == 200
    assert httpx.get(server.url + "/readyz", headers=fresh, timeout=5).status_code == 200
    with httpx.Client(base_url=server.url, headers={"Authorization": "t", **fresh}, timeout=5) as c:
        assert c.post(f"/v1/queues/{queue}/messages", json={"message": {"n": i}}).status_code == 201
        got = c.get(f"/v1/queues/{queue}/messages").json()
        assert [m["message"] for m in got] == [{"n": i}]
        assert c.delete(f"/v1/queues/{queue}/messages/{got[0]['id']}").status_code in (200, 204)


def _closed_count(server: ServerProcess, reason: str) -> float:
    text = httpx.get(server.url + "/metrics", headers={"Connection": "close"}, timeout=5).text
    prefix = f'conveyor_connections_closed_total{{reason="{reason}"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


@pytest.fixture
def loris_server(dsn):
    server = ServerProcess(dsn, env={"CONVEYOR_HTTP_HEADER_TIMEOUT": "4", "CONVEYOR_HTTP_IDLE_TIMEOUT": "4"}).start()
    yield server
    server.kill()


def test_unfinished_headers_and_silent_connections_are_closed_after_their_deadline(loris_server, queue_name):
    server = loris_server
    with server.client() as c:
        assert c.post("/v1/queues", json={"name": queue_name}).status_code == 201
    partial = _open(server.port, 250, PARTIAL)
    silent = _open(server.port, 250)
    trickling = _open(server.port, 20, b"G")
    started = time.monotonic()
    every = partial + silent + trickling
    try:
        for i in range(3):  # answered while all of them are held
            _answers(server, queue_name, i)
        for n in range(4):  # a byte at a time does not move the headers' deadline
            time.sleep(0.25)
            for s in trickling:
                s.send(b"ET /livez HTTP/1.1\r\n"[n:n + 1])
        if time.monotonic() - started < 2:  # half the deadline (a busy machine may take longer to get here)
            assert not any(_closed(s) for s in every), "closed before the deadline"
        left = _wait_closed(every, timeout=4 - (time.monotonic() - started) + 6)
        assert not left, f"{len(left)} of {len(every)} connections still open {time.monotonic() - started:.1f}s in"
        assert _closed_count(server, "headers") >= 270 and _closed_count(server, "idle") >= 250
        _answers(server, queue_name, 99)
    finally:
        _close_all(partial + silent + trickling)


def test_a_keep_alive_connection_is_closed_once_idle_and_not_while_in_use(loris_server):
    with httpx.Client(base_url=loris_server.url, timeout=5) as c:
        for _ in range(6):  # in use: 6 requests over 6 s, past the 4 s idle deadline
            assert c.get("/livez").status_code == 200
            time.sleep(1.0)
    s = socket.create_connection(("127.0.0.1", loris_server.port), timeout=5)
    try:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.setblocking(False)
        assert _wait_closed([s], timeout=1.5), "closed too soon"
        assert not _wait_closed([s], timeout=8), "an idle keep-alive connection was kept"
    finally:
        s.close()


def test_a_flood_past_the_connection_bound_pushes_out_the_oldest_idle_ones(dsn, queue_name):
    # deadlines far away: only the bound can close anything here
    server = ServerProcess(dsn, env={"CONVEYOR_MAX_CONNECTIONS": "100", "CONVEYOR_HTTP_HEADER_TIMEOUT": "120",
                                     "CONVEYOR_HTTP_IDLE_TIMEOUT": "120"}).start()
    socks: list[socket.socket] = []
    try:
        with server.client() as c:
            assert c.post("/v1/queues", json={"name": queue_name}).status_code == 201
        for i in range(4):
            socks += _open(server.port, 100, PARTIAL)
            _answers(server, queue_name, i)  # each on a new connection, past the bound
        time.sleep(1.0)
        open_now = [s for s in socks if not _closed(s)]
        assert len(open_now) <= 100, f"{len(open_now)} connections held, beyond the bound of 100"
        assert all(s in open_now for s in socks[-50:]), "the newest were pushed out rather than the oldest"
        assert _closed_count(server, "pushed_out") >= 300
    finally:
        _close_all(socks)
        server.kill()


@pytest.mark.parametrize("env", [{"CONVEYOR_HTTP_HEADER_TIMEOUT": "0"}, {"CONVEYOR_HTTP_IDLE_TIMEOUT": "-1"},
                                 {"CONVEYOR_MAX_CONNECTIONS": "3"}])
def test_connection_settings_out_of_range_are_refused(env):
    with pytest.raises(ValueError):
        Settings.from_env(env)


def test_upgrade_requests_do_not_leak_places_in_the_bound(dsn):
    """Conveyor serves no WebSocket: an Upgrade request is an ordinary request, and its
    connection leaves the bound when it closes (a connection handed to a WebSocket
    protocol used to stay counted for ever, so 100 of them shut everyone out)."""
    server = ServerProcess(dsn, env={"CONVEYOR_MAX_CONNECTIONS": "20"}).start()
    try:
        upgrade = (b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                   b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(upgrade)
                s.recv(4096)
        for _ in range(5):
            assert httpx.get(server.url + "/livez", headers={"Connection": "close"}, timeout=5).status_code == 200
    finally:
        server.kill()


# -- an answer's head and body go out in one write (server/connections.py, _OneWrite) --------

class _Recorder:
    """A transport that records what it is asked to write and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    pause_reading = resume_reading = abort = lambda self: None

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


async def test_an_answers_head_is_written_with_its_body():
    import asyncio

    from conveyor.server.connections import _OneWrite

    raw = _Recorder()
    t = _OneWrite(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    t.write(head)
    assert raw.writes == [] and t.get_write_buffer_size() == len(head)
    t.write(memoryview(b"ok"))
    assert raw.writes == [head + b"ok"]
    await asyncio.sleep(0)
    assert raw.writes == [head + b"ok"]  # nothing more at the end of the pass

    # a head alone (an answer without a body yet, 100 Continue) goes at the end of the pass
    t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await asyncio.sleep(0)
    assert raw.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
    # anything else is written at once, and a held head goes before a close
    t.write(b"more")
    assert raw.writes[-1] == b"more"
    t.write(head)
    t.close()
    assert raw.writes[-1] == head and raw.closed


def test_answers_on_one_connection_stay_whole(server):
    """Keep-alive, pipelined requests, HEAD and 100-continue through the real server."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\nHEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        deadline = time.monotonic() + 5
        while data.count(b"HTTP/1.1 200") < 3 and time.monotonic() < deadline:
            data += s.recv(65536)
        answers = data.split(b"HTTP/1.1 ")[1:]
        assert len(answers) == 3 and all(a.startswith(b"200 OK") for a in answers)
        assert answers[0].endswith(b"}") and b"\r\n\r\n{" in answers[0] and answers[1].endswith(b"\r\n\r\n")
        assert answers[2].endswith(b"}")

        body = b'{"name": "one-write"}'
        s.sendall(b"POST /v1/queues HTTP/1.1\r\nHost: x\r\nAuthorization: t\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        data = b""
        while b"one-write" not in data and time.monotonic() < deadline + 5:
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 201 ")
