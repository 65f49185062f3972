"""Admission control under overload: a server with small limits, hit by many more
concurrent requests than it admits, answers each at once with success or the protocol's
own throttling error (SQS RequestThrottled, REST 503 + Retry-After), never anything else,
and stores every message it acknowledged, exactly once. Figures (latency of refusals,
memory) come from bench/overload_bench.py, not from here."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import psycopg
import pytest

from support.server import ServerProcess

LIMITS = {"CONVEYOR_MAX_REQUESTS": "40", "CONVEYOR_POOL_MAX": "2", "CONVEYOR_POOL_MAX_WAITING": "4",
          "CONVEYOR_FUSION_MAX_PENDING": "30", "CONVEYOR_FUSION_MAX_INFLIGHT": "1"}
CLIENTS = 400


@pytest.fixture(scope="module")
def small_server(module_dsn):
    proc = ServerProcess(module_dsn, env=LIMITS).start()
    yield proc
    proc.kill()


async def _sqs_send(session: aiohttp.ClientSession, url: str, queue_url: str, body: str) -> tuple[int, str]:
    async with session.post(url + "/", json={"QueueUrl": queue_url, "MessageBody": body}, headers={
            "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage",
            "Authorization": "x"}) as r:
        return r.status, await r.text()


async def _rest_send(session: aiohttp.ClientSession, url: str, queue: str, body: str) -> tuple[int, str, str | None]:
    async with session.post(f"{url}/v1/queues/{queue}/messages", json={"message": body},
                            headers={"Authorization": "x"}) as r:
        return r.status, await r.text(), r.headers.get("Retry-After")


async def _blast(url: str, queue: str, burst: int) -> tuple[list, list]:
    queue_url = f"{url}/000000000000/{queue}"
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        sqs = [_sqs_send(session, url, queue_url, f"sqs-{burst}-{i}") for i in range(CLIENTS // 2)]
        rest = [_rest_send(session, url, queue, f"rest-{burst}-{i}") for i in range(CLIENTS // 2)]
        return await asyncio.gather(*sqs), await asyncio.gather(*rest)


def test_overload_is_refused_fast_in_each_protocol_and_loses_nothing(small_server, module_dsn):
    queue = f"overload-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(module_dsn, autocommit=True) as c:
        c.execute("SELECT conveyor.queue_create(%s)", (queue,))
    throttled, accepted = 0, set()
    for burst in range(3):  # a few bursts: enough to be refused on any machine
        sqs, rest = asyncio.run(_blast(small_server.url, queue, burst))
        for i, (status, text) in enumerate(sqs):
            if status == 200:
                accepted.add(f"sqs-{burst}-{i}")
                continue
            assert status == 400 and "RequestThrottled" in text, (status, text)
            throttled += 1
        for i, (status, text, retry_after) in enumerate(rest):
            if status == 201:
                accepted.add(f"rest-{burst}-{i}")
                continue
            assert status == 503 and '"code":"Throttled"' in text and retry_after == "1", (status, text)
            throttled += 1
    assert throttled > 0 and accepted
    with psycopg.connect(module_dsn, autocommit=True) as c:
        rows = c.execute("SELECT body FROM conveyor.message_peek(%s, 10000)", (queue,)).fetchall()
    bodies = [r[0] for r in rows]
    assert len(bodies) == len(set(bodies))  # nothing stored twice, and exactly what was acknowledged
    assert set(bodies) == accepted
    metrics = small_server_metrics(small_server)
    assert "conveyor_admission_refused_total{stage=" in metrics  # refused at the edge or by fusion


def small_server_metrics(server: ServerProcess) -> str:
    import httpx
    return httpx.get(server.url + "/metrics").text
