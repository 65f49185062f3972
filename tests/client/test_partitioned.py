"""The client on partitioned queues (Queen's model, docs/queen.md) over both transports:
push and pop under a lease, settling, transactional push, and the worker holding a
partition's lease with heartbeats while a long handler runs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from conveyor.client import AsyncClient, Worker
from conveyor.core import partitioned
from conveyor.db import pool
from support.server import ServerProcess


@pytest.fixture(params=["sql", "http"])
async def client(request, module_dsn, server: ServerProcess) -> AsyncIterator[AsyncClient]:
    c = AsyncClient.sql(module_dsn) if request.param == "sql" else AsyncClient.http(server.url, "token")
    yield c
    await c.close()


def _name() -> str:
    return f"pq-{uuid.uuid4().hex[:8]}"


async def test_push_pop_and_settle(client):
    q = _name()
    answers = await client.push_batch(q, [{"n": 1}, {"n": 2}], partition="customer-7")
    assert [a["status"] for a in answers] == ["queued", "queued"]
    again = await client.push(q, {"n": 1}, partition="customer-7", transaction_id=answers[0]["transactionId"])
    assert again["status"] == "duplicate"
    got = await client.pop(q, batch=10)
    assert [m.data for m in got] == [{"n": 1}, {"n": 2}] and got[0].partition == "customer-7"
    assert await client.pop(q, batch=10) == []  # the partition is leased
    assert await client.extend(got[0], 30)
    assert await client.ack(got[0]) and await client.release(got[1])
    [back] = await client.pop(q, batch=10)  # released: comes again, no failure counted
    assert back.data == {"n": 2} and back.retry_count == 0
    assert await client.fail(back, "cannot ship")
    grouped = await client.pop(q, group="audit", batch=10)  # another group reads everything
    assert [m.data for m in grouped] == [{"n": 1}, {"n": 2}] and all(await asyncio.gather(
        *(client.ack(m) for m in grouped)))


async def test_a_push_commits_or_rolls_back_with_the_callers_transaction(module_dsn):
    q = _name()
    client = AsyncClient.sql(module_dsn)
    try:
        async with pool.connect(module_dsn) as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await client.push(q, "lost", conn=conn)
                    raise RuntimeError("the caller's transaction fails")
            async with conn.transaction():
                await client.push(q, "kept", conn=conn)
        assert [m.data for m in await client.pop(q, batch=10)] == ["kept"]
    finally:
        await client.close()


async def test_the_worker_holds_a_partition_with_heartbeats_and_retries_failures(client, module_dsn):
    q = _name()
    async with pool.connect(module_dsn) as conn:
        await partitioned.configure(conn, q, {"leaseTime": 1, "retryLimit": 1})
    await client.push(q, "long", partition="a")
    await client.push(q, "flaky", partition="b")
    worker = Worker(client, visibility_timeout=1, wait=0.3, max_attempts=5)
    seen: list[tuple[str, int]] = []

    @worker.handler(q, partitioned=True, group="billing")
    async def handle(message) -> None:
        seen.append((message.data, message.receive_count))
        if message.data == "long":
            await asyncio.sleep(3.5)  # three lease times and more
        elif message.receive_count == 1:
            raise ValueError("not yet")

    run = asyncio.create_task(worker.run(install_signals=False))
    for _ in range(100):  # the worker has the long job
        if ("long", 1) in seen:
            break
        await asyncio.sleep(0.05)
    other = []
    for _ in range(6):  # another member of the group looks while the long job runs
        other += [m.data for m in await client.pop(q, group="billing", partition="a")]
        await asyncio.sleep(0.5)
    for _ in range(50):
        if worker.stats.done == 2:
            break
        await asyncio.sleep(0.1)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert other == [] and stats.done == 2 and stats.retried == 1
    assert sorted(seen) == [("flaky", 1), ("flaky", 2), ("long", 1)]
    assert await client.pop(q, group="billing", batch=10) == []  # all acknowledged
