"""The benches' shared helpers that the peers comparison rests on: a server's CPU counted
over its whole process tree (LocalStack's, Conveyor's workers), and the raw HTTP client
reaching a server that listens on IPv6 loopback only (LocalStack's)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import sqs_bench
from rawhttp import RawHttp

# a process whose child starts a grandchild that burns 0.4 s of CPU, says so, then sleeps
TREE = """
import subprocess, sys
burn = "import sys, time\\nwhile time.process_time() < 0.4: pass\\nprint('burnt', flush=True)\\ntime.sleep(60)"
child = "import subprocess, sys\\nsubprocess.run([sys.executable, '-c', %r])" % burn
subprocess.run([sys.executable, "-c", child])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_process_cpu_counts_every_descendant() -> None:
    top = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        assert top.stdout is not None
        assert top.stdout.readline().strip() == "burnt"  # bounded: the grandchild burns 0.4 s of CPU
        # the grandchild's 0.4 s, live, two levels down (the top and its child only waited)
        assert sqs_bench._process_cpu(top.pid) >= 0.35
    finally:
        os.killpg(top.pid, signal.SIGKILL)
        top.wait(10)


def test_free_port_and_raw_http_on_ipv6_loopback() -> None:
    port = sqs_bench.free_port("::1")
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def main() -> tuple[int, bytes]:
        server = await asyncio.start_server(handle, "::1", port)
        client = RawHttp("::1", port, timeout=5)
        try:
            return await client.send(client.request("GET", "/x", b"", {}))
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    started = time.monotonic()
    assert asyncio.run(main()) == (200, b"ok")
    assert time.monotonic() - started < 5
    assert f"Host: [::1]:{port}\r\n".encode() in seen[0]  # RFC 9110: an IPv6 literal in brackets


BURN = "import sys, time\nwhile time.process_time() < 0.2: pass\nprint('burnt', flush=True)\nsys.stdin.read()"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_meter_keeps_a_backend_that_exited_and_counts_one_that_appeared() -> None:
    """A pool closing a connection during a cell must not take the backend's past CPU off
    the cell; one opened during the cell brings all of its CPU into it."""
    gone = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    listed = [gone.pid]
    meter = sqs_bench.Meter(lambda: [], backends=lambda: listed)
    try:
        assert gone.stdout is not None and gone.stdout.readline().strip() == "burnt"
        before = meter.sample()["postgres"]
        assert before >= 0.15
        gone.communicate(timeout=10)  # it exits and is reaped: its /proc entry is gone
        listed = []
        assert meter.sample()["postgres"] == pytest.approx(before)

        new = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert new.stdout is not None and new.stdout.readline().strip() == "burnt"
            listed = [new.pid]
            assert meter.sample()["postgres"] - before >= 0.15
        finally:
            new.communicate(timeout=10)
    finally:
        if gone.poll() is None:
            gone.kill()
            gone.wait(10)
