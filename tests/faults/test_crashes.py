"""Fault tests: nothing acknowledged is lost when the server is killed, and the server
recovers by itself when PostgreSQL restarts under load."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conveyor.core import messages, queues
from conveyor.db import pool
from support.server import ServerProcess


async def _load(url: str, queue: str, stop: asyncio.Event, clients: int = 16,
                max_per_client: int = 3000, acked: list[int] | None = None) -> list[int]:
    """Concurrent single sends until ``stop`` (bounded in count); the ids answered 201
    (appended to ``acked`` as they come, when given)."""
    acked = [] if acked is None else acked

    async def client(n: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": "t"}, timeout=5) as c:
            for i in range(max_per_client):
                if stop.is_set():
                    return
                try:
                    r = await c.post(f"/v1/queues/{queue}/messages", json={"message": f"{n}-{i}"})
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)
                    continue
                if r.status_code == 201:
                    acked.append(r.json()["id"])
                else:
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(client(n) for n in range(clients)))
    return acked


async def _stored(dsn: str, queue: str) -> set[int]:
    async with pool.connect(dsn) as conn:
        return {m.id for m in await messages.peek(conn, queue, qty=10000)}


@pytest.mark.parametrize("fusion", ["true", "false"])
async def test_sigkill_loses_nothing_acknowledged(dsn, queue_name, fusion):
    async with pool.connect(dsn) as conn:
        await queues.create(conn, queue_name)
    server = ServerProcess(dsn, env={"CONVEYOR_FUSION": fusion}).start()
    stop = asyncio.Event()
    sent: list[int] = []
    load = asyncio.create_task(_load(server.url, queue_name, stop, acked=sent))
    # the load is well under way (waited for, not slept on: a busy machine is slower)
    for _ in range(300):  # bounded: 30 s
        if len(sent) > 200:
            break
        await asyncio.sleep(0.1)
    server.proc.kill()  # SIGKILL: no shutdown, no flush
    await asyncio.to_thread(server.proc.wait, 10)
    await asyncio.sleep(0.5)
    stop.set()
    acked = await asyncio.wait_for(load, 30)
    assert len(acked) > 100, "the load was running when the server died"
    missing = set(acked) - await _stored(dsn, queue_name)
    assert not missing, f"{len(missing)} acknowledged messages lost"


async def _readiness(url: str, stop: asyncio.Event) -> list[tuple[float, int]]:
    seen = []
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        while not stop.is_set():
            try:
                seen.append((time.monotonic(), (await c.get("/readyz")).status_code))
            except httpx.HTTPError:
                seen.append((time.monotonic(), 0))
            await asyncio.sleep(0.1)
    return seen


async def test_postgres_restart_mid_load_recovers_by_itself(cluster, queue_name):
    dsn = cluster.dsn
    server = ServerProcess(dsn).start()
    try:
        async with pool.connect(dsn) as conn:
            await queues.create(conn, queue_name)
        stop = asyncio.Event()
        ready = asyncio.create_task(_readiness(server.url, stop))
        load = asyncio.create_task(_load(server.url, queue_name, stop, clients=8))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(cluster.stop)  # the outage
        await asyncio.sleep(2.0)
        await asyncio.to_thread(cluster.start)
        restarted = time.monotonic()
        recovered = None
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}) as c:
            for _ in range(100):  # bounded: 10 s
                r = await c.post(f"/v1/queues/{queue_name}/messages", json={"message": "after"})
                if r.status_code == 201:
                    recovered = time.monotonic()
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        stop.set()
        acked = await asyncio.wait_for(load, 30)
        statuses = await ready
    finally:
        server.kill()
    assert recovered is not None and recovered - restarted < 10, "sends work again after the restart"
    codes = [code for _, code in statuses]
    assert 503 in codes, "readyz reported the outage"
    first_503 = codes.index(503)
    assert 200 in codes[first_503:], "readyz reported the recovery"
    assert codes[-1] == 200
    missing = set(acked) - await _stored(dsn, queue_name)
    assert not missing, f"{len(missing)} acknowledged messages lost"
