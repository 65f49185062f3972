"""Snapshot correctness, as a property: whatever the interleaving of concurrent producers
(committing in random order, some rolling back), every committed event reaches every
consumer exactly once, no rolled-back event reaches anyone, and each batch is in id order."""

from __future__ import annotations

import asyncio
import collections
import random
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.core import streams
from conveyor.db import pool

# one producer's plan: transactions of (events, commit?, hold seconds before the end)
TRANSACTION = st.tuples(st.integers(1, 6), st.booleans(), st.floats(0, 0.03))
PLAN = st.lists(st.lists(TRANSACTION, min_size=1, max_size=5), min_size=2, max_size=5)


async def _produce(dsn: str, stream: str, producer: int, plan, committed: list[str], rolled_back: list[str]) -> None:
    async with pool.connect(dsn, autocommit=False) as conn:
        for txn, (count, commit, hold) in enumerate(plan):
            payloads = [f"p{producer}-t{txn}-e{i}" for i in range(count)]
            await conn.execute("SELECT conveyor.stream_send_batch(%s, 'prop', %s::text[])", (stream, payloads))
            await asyncio.sleep(hold)  # others start, insert and commit meanwhile
            if commit:
                await conn.commit()
                committed.extend(payloads)
            else:
                await conn.rollback()
                rolled_back.extend(payloads)


async def _consume(dsn: str, stream: str, consumer: str, received: list[str], stop: asyncio.Event) -> None:
    async with pool.connect(dsn) as conn:
        while True:
            events = await streams.receive(conn, stream, consumer, 100000)
            if events:
                ids = [e.id for e in events]
                assert ids == sorted(ids), "a batch is in id order"
                assert len({e.batch_id for e in events}) == 1
                received.extend(e.payload for e in events)
                await streams.ack(conn, events[0].batch_id)
            elif stop.is_set():
                return
            else:
                await asyncio.sleep(0.005)


async def _tick(dsn: str, stream: str, stop: asyncio.Event) -> None:
    async with pool.connect(dsn) as conn:
        while not stop.is_set():
            await streams.force_tick(conn, stream)
            await asyncio.sleep(random.uniform(0.001, 0.01))


async def _scenario(dsn: str, plans) -> None:
    stream = "s" + uuid.uuid4().hex[:8]
    async with pool.connect(dsn) as conn:
        await streams.create(conn, stream)
        for consumer in ("c1", "c2"):
            await streams.subscribe(conn, stream, consumer)
    committed: list[str] = []
    rolled_back: list[str] = []
    received = {"c1": [], "c2": []}
    producers_done, drain = asyncio.Event(), asyncio.Event()
    ticker = asyncio.create_task(_tick(dsn, stream, drain))
    consumers = [asyncio.create_task(_consume(dsn, stream, c, received[c], drain)) for c in received]
    await asyncio.gather(*(_produce(dsn, stream, n, plan, committed, rolled_back) for n, plan in enumerate(plans)))
    producers_done.set()
    await asyncio.sleep(0.05)  # a few more ticks past the last commit
    async with pool.connect(dsn) as conn:
        await streams.force_tick(conn, stream)
    drain.set()
    await asyncio.wait_for(asyncio.gather(ticker, *consumers), 30)
    async with pool.connect(dsn) as conn:  # anything left after the last tick
        for consumer, got in received.items():
            await streams.force_tick(conn, stream)
            while events := await streams.receive(conn, stream, consumer, 100000):
                got.extend(e.payload for e in events)
                await streams.ack(conn, events[0].batch_id)
        await streams.drop(conn, stream)
    for consumer, got in received.items():
        counts = collections.Counter(got)
        assert set(counts) == set(committed), f"{consumer}: every committed event, nothing else"
        assert max(counts.values(), default=1) == 1, f"{consumer}: exactly once"
        assert not set(got) & set(rolled_back)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=PLAN)
def test_every_committed_event_reaches_every_consumer_exactly_once(dsn, plans):
    asyncio.run(_scenario(dsn, plans))
