"""Graceful shutdown: SIGTERM answers long-pollers, flushes fused sends, exits 0."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from conveyor.core import messages
from conveyor.db import pool
from support.server import ServerProcess


async def test_sigterm_finishes_in_flight_work_and_exits_0(dsn, queue_name):
    server = ServerProcess(dsn).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=30,
                                     limits=httpx.Limits(max_connections=300)) as c:
            await c.post("/v1/queues", json={"name": queue_name})
            await c.post("/v1/queues", json={"name": queue_name + "-idle"})
            poller = asyncio.create_task(c.get(f"/v1/queues/{queue_name}-idle/messages", params={"wait": 20}))

            async def send(i: int) -> int | None:
                try:
                    r = await c.post(f"/v1/queues/{queue_name}/messages", json={"message": str(i)})
                except httpx.HTTPError:
                    return None
                return r.json()["id"] if r.status_code == 201 else None

            sends = [asyncio.create_task(send(i)) for i in range(300)]
            deadline = time.monotonic() + 10
            while not any(s.done() for s in sends) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # the first answers (later on a busy machine), the rest in flight
            stopped_at = time.monotonic()
            server.proc.terminate()
            acked = [i for i in await asyncio.gather(*sends) if i is not None]
            r = await poller
            assert r.status_code == 200 and r.json() == []
            assert time.monotonic() - stopped_at < 5, "the long poll was answered at shutdown"
        assert await asyncio.to_thread(server.proc.wait, 30) == 0
    finally:
        server.kill()
    assert acked, "some sends were answered before the shutdown"
    async with pool.connect(dsn) as conn:
        stored = {m.id for m in await messages.peek(conn, queue_name, qty=1000)}
    assert set(acked) <= stored


def _postmaster_running(data_dir: Path) -> bool:
    return (data_dir / "pgdata" / "postmaster.pid").exists()


def test_embedded_cluster_is_reused_and_stopped_cleanly(queue_name):
    data_dir = Path(tempfile.mkdtemp(prefix="conveyor-embedded-", dir="/tmp"))
    os.chmod(data_dir, 0o755)
    env = {"CONVEYOR_DATA_DIR": str(data_dir)}
    try:
        for round_ in range(2):
            server = ServerProcess("", env=env)
            server.env.pop("DATABASE_URL")
            server.start(timeout=120)
            with server.client() as http:
                if round_ == 0:
                    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
                    assert http.post(f"/v1/queues/{queue_name}/messages", json={"message": "kept"}).status_code == 201
                else:
                    assert http.get(f"/v1/queues/{queue_name}").json()["queue_length"] == 1
            assert _postmaster_running(data_dir)
            assert server.terminate() == 0
            assert not _postmaster_running(data_dir), "the embedded cluster stopped with the server"
    finally:
        pidfile = data_dir / "pgdata" / "postmaster.pid"
        if pidfile.exists():
            subprocess.run(["pg_ctl", "stop", "-D", str(data_dir / "pgdata"), "-m", "immediate"],
                           user="postgres" if os.geteuid() == 0 else None, check=False)
        subprocess.run(["rm", "-rf", str(data_dir)], check=False)
