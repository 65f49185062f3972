"""The queue client and worker (conveyor.client.queues / worker) over both transports,
against a real server and database: sends and receives, transactional enqueue, heartbeats
that keep a long job from being redelivered, retries and dead letters, a SIGTERM in the
middle of a job, and a delivery lost to another worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.client import AsyncClient, Client, DeadLetter, Message, Worker, send_in
from conveyor.core import messages, queues
from conveyor.db import pool
from support.server import ServerProcess


@pytest.fixture(params=["sql", "http"])
async def client(request, module_dsn, server: ServerProcess) -> AsyncIterator[AsyncClient]:
    c = AsyncClient.sql(module_dsn) if request.param == "sql" else AsyncClient.http(server.url, "token")
    yield c
    await c.close()


async def _queue(dsn: str, name: str, **attributes) -> str:
    async with pool.connect(dsn) as conn:
        await queues.create(conn, name, attributes)
    return name


async def test_send_receive_and_settle(client, module_dsn, queue_name):
    q = await _queue(module_dsn, queue_name)
    first = await client.send(q, {"order": 1}, headers={"kind": "new"})
    ids = await client.send_batch(q, ["two", Message({"n": 3}, delay=0)])
    assert first > 0 and len(ids) == 2
    got = await client.receive(q, max=10, vt=30)
    assert [m.id for m in got] == [first, *ids]
    assert got[0].json() == {"order": 1} and got[0].headers == {"kind": "new"} and got[1].body == "two"
    assert await client.ack(got[0]) and not await client.ack(got[0])  # settled once
    assert await client.release(got[1])
    [again] = await client.receive(q, max=1, vt=30)
    assert again.id == got[1].id and again.receive_count == 2
    assert not await client.extend(got[1], 30)  # the old delivery settles nothing
    assert await client.fail(again, "boom") and await client.ack(got[2])
    assert await client.receive(q, max=10, wait=0.3) == []


async def test_transactional_enqueue_commits_or_rolls_back_with_the_callers_writes(module_dsn, queue_name):
    q = await _queue(module_dsn, queue_name)
    client = AsyncClient.sql(module_dsn)
    try:
        async with pool.connect(module_dsn) as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await client.send(q, "rolled back", conn=conn)
                    raise RuntimeError("the caller's transaction fails")
            async with conn.transaction():
                await client.send(q, "committed", conn=conn)
        with psycopg.connect(module_dsn) as sync_conn:  # a blocking connection, not autocommit
            send_in(sync_conn, q, "rolled back too")
            sync_conn.rollback()
            send_in(sync_conn, q, {"committed": 2})
            sync_conn.commit()
        got = await client.receive(q, max=10)
        assert [m.body for m in got] == ["committed", '{"committed":2}']
    finally:
        await client.close()


def test_the_blocking_client(server, module_dsn, queue_name):
    asyncio.run(_queue(module_dsn, queue_name))
    with Client.http(server.url, "t") as c:
        c.send(queue_name, "from a script")
        [m] = c.receive(queue_name, max=1)
        assert m.body == "from a script" and c.ack(m)


async def test_a_heartbeat_keeps_a_job_three_timeouts_long_from_being_redelivered(client, module_dsn, queue_name):
    q = await _queue(module_dsn, queue_name)
    await client.send(q, "long job")
    worker = Worker(client, visibility_timeout=1, wait=0.5)
    seen = []

    @worker.handler(q)
    async def slow(message) -> None:
        seen.append(message.receive_count)
        await asyncio.sleep(3.2)  # more than three visibility timeouts

    run = asyncio.create_task(worker.run(install_signals=False))
    await asyncio.sleep(0.5)
    other = []
    for _ in range(6):  # another consumer looks while the job runs
        other += await client.receive(q, max=1, vt=30)
        await asyncio.sleep(0.5)
    await asyncio.sleep(0.8)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert other == [] and seen == [1] and stats.done == 1
    async with pool.connect(module_dsn) as conn:
        assert await messages.peek(conn, q) == []  # acknowledged


async def test_retries_with_backoff_then_dead_letters(client, module_dsn, queue_name):
    q = await _queue(module_dsn, queue_name)
    await client.send(q, "flaky")
    await client.send(q, "poison")
    worker = Worker(client, max_attempts=3, retry_delay=0, wait=0.3)
    attempts: dict[str, int] = {}

    @worker.handler(q)
    def handle(message) -> None:  # a plain function: run in a thread
        attempts[message.body] = message.receive_count
        if message.body == "poison":
            raise DeadLetter("cannot parse")
        if message.receive_count < 3:
            raise ValueError("not yet")

    run = asyncio.create_task(worker.run(install_signals=False))
    for _ in range(100):
        if worker.stats.done == 1 and worker.stats.dead_lettered == 1:
            break
        await asyncio.sleep(0.1)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert attempts == {"flaky": 3, "poison": 1} and stats.retried == 2 and stats.dead_lettered == 1
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        [(outcome,)] = conn.execute("SELECT a.outcome FROM conveyor.archive a JOIN conveyor.queues q ON q.id = "
                                    "a.queue_id WHERE q.name = %s AND a.body = 'poison'", (q,)).fetchall()
    assert outcome == "failed"


async def test_a_delivery_taken_over_cancels_the_handler(module_dsn, server, queue_name):
    q = await _queue(module_dsn, queue_name)
    client = AsyncClient.http(server.url, "t")
    try:
        await client.send(q, "contested")
        worker = Worker(client, visibility_timeout=3, wait=0.3)
        cancelled = asyncio.Event()

        @worker.handler(q)
        async def stuck(message) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        run = asyncio.create_task(worker.run(install_signals=False))
        await asyncio.sleep(0.5)
        async with pool.connect(module_dsn) as conn:  # the message is made visible behind the worker's back
            [m] = await messages.peek(conn, q)
            await messages.set_vt(conn, q, [m.id], 0)
        [taken] = await client.receive(q, max=1, vt=60)  # another consumer takes it
        await asyncio.wait_for(cancelled.wait(), 5)  # the next heartbeat finds out
        worker.stop()
        stats = await asyncio.wait_for(run, 10)
        assert stats.lost == 1 and stats.done == 0
        assert await client.ack(taken)  # still the other consumer's to settle
    finally:
        await client.close()


WORKER_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from conveyor.client import AsyncClient, Worker

    async def main():
        client = AsyncClient.http(sys.argv[1], "t")
        worker = Worker(client, visibility_timeout=60, shutdown_timeout=float(sys.argv[3]), wait=0.5)

        @worker.handler(sys.argv[2])
        async def job(message):
            print("started", flush=True)
            await asyncio.sleep(float(sys.argv[4]))

        stats = await worker.run()
        print("stopped", stats.done, stats.released, flush=True)
        await client.close()

    asyncio.run(main())
""")


@pytest.mark.parametrize("job_seconds, outcome", [(30.0, "released"), (1.0, "finished")])
async def test_sigterm_mid_job_releases_or_finishes_it(module_dsn, server, queue_name, job_seconds, outcome):
    q = await _queue(module_dsn, queue_name)
    client = AsyncClient.http(server.url, "t")
    try:
        await client.send(q, "job")
        proc = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, server.url, q, "3", str(job_seconds)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        os.kill(proc.pid, signal.SIGTERM)
        began = time.monotonic()
        out, _ = await asyncio.to_thread(proc.communicate, timeout=15)
        assert proc.returncode == 0 and time.monotonic() - began < 6
        done, released = (int(x) for x in out.split()[1:3])
        if outcome == "released":  # not finished in the shutdown time: back at once, not after 60 s
            assert (done, released) == (0, 1)
            [again] = await client.receive(q, max=1, vt=30)
            assert again.receive_count == 2
        else:  # finished within the shutdown time: acknowledged
            assert (done, released) == (1, 0)
            assert await client.receive(q, max=1, wait=0.3) == []
    finally:
        await client.close()
