"""Long polling: woken at commit, holding no database connection while waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from support.server import ServerProcess


async def _client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=60,
                             limits=httpx.Limits(max_connections=1000, max_keepalive_connections=1000))


@pytest.fixture(scope="module")
def unpolled_server(module_dsn: str) -> Iterator[ServerProcess]:
    """A server whose poll fallback is far longer than the test: only a notification can
    wake its long pollers in time."""
    proc = ServerProcess(module_dsn, env={"CONVEYOR_POLL_FALLBACK_SECONDS": "60"}).start()
    yield proc
    proc.kill()


async def test_a_send_wakes_a_waiting_receive_quickly(unpolled_server, queue_name):
    async with await _client(unpolled_server) as c:
        await c.post("/v1/queues", json={"name": queue_name})
        waiting = asyncio.create_task(c.get(f"/v1/queues/{queue_name}/messages", params={"wait": 20}))
        await asyncio.sleep(0.5)
        sent = time.monotonic()
        await c.post(f"/v1/queues/{queue_name}/messages", json={"message": "wake"})
        r = await waiting
        assert time.monotonic() - sent < 10, "woken by the notification, not by a poll"
        assert [m["message"] for m in r.json()] == ["wake"]


async def test_wait_times_out_empty(server, queue_name):
    async with await _client(server) as c:
        await c.post("/v1/queues", json={"name": queue_name})
        started = time.monotonic()
        r = await c.get(f"/v1/queues/{queue_name}/messages", params={"wait": 1.5})
        assert r.json() == [] and 1.4 <= time.monotonic() - started < 4


async def test_queue_receive_wait_seconds_is_the_default_wait(server, queue_name):
    async with await _client(server) as c:
        await c.post("/v1/queues", json={"name": queue_name, "receive_wait_seconds": 1})
        started = time.monotonic()
        assert (await c.get(f"/v1/queues/{queue_name}/messages")).json() == []
        assert time.monotonic() - started >= 0.9


async def test_expired_visibility_reaches_a_long_poller(server, queue_name):
    async with await _client(server) as c:
        await c.post("/v1/queues", json={"name": queue_name})
        await c.post(f"/v1/queues/{queue_name}/messages", json={"message": "again"})
        await c.get(f"/v1/queues/{queue_name}/messages", params={"vt": 1})
        r = await c.get(f"/v1/queues/{queue_name}/messages", params={"wait": 5})
        assert [m["receive_count"] for m in r.json()] == [2]


async def test_far_more_long_pollers_than_pool_connections_are_all_served(server, queue_name):
    pollers = 200  # the server's pool holds at most 16 connections
    async with await _client(server) as c:
        await c.post("/v1/queues", json={"name": queue_name})
        tasks = [asyncio.create_task(c.get(f"/v1/queues/{queue_name}/messages", params={"wait": 20}))
                 for _ in range(pollers)]
        deadline = time.monotonic() + 10  # every request reaches the server (slower on a busy machine)
        while True:
            await asyncio.sleep(0.25)
            metrics = (await c.get("/metrics")).text
            waiting = _metric(metrics, "queue_long_pollers")
            if waiting == pollers or time.monotonic() > deadline:
                break
        assert waiting == pollers, "every poller is parked, none holds a connection"
        assert _metric(metrics, "db_pool_active") <= 2
        health = await c.get("/readyz")
        assert health.status_code == 200, "the pool is free while they wait"
        for start in range(0, pollers, 50):
            await c.post(f"/v1/queues/{queue_name}/messages",
                         json=[{"message": str(i)} for i in range(start, start + 50)])
        results = await asyncio.gather(*tasks)
        got = [m["message"] for r in results for m in r.json()]
        assert sorted(got, key=int) == [str(i) for i in range(pollers)]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    pytest.fail(f"metric {name} not found")
