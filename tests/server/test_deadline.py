"""CONVEYOR_REQUEST_TIMEOUT: a request still running after it is answered 408 in its
protocol's format, while a long poll waits its whole time; JSON log lines
(CONVEYOR_LOG_FORMAT=json) record the cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import boto3
import botocore.config
import botocore.exceptions
import httpx
import orjson
import psycopg
import pytest

from conveyor.server import deadline
from support.server import ServerProcess

AUTH = {"Authorization": "x"}


@pytest.fixture(scope="module")
def server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_REQUEST_TIMEOUT": "1", "CONVEYOR_LOG_FORMAT": "json"}).start()
    yield proc
    proc.kill()


def _queue(dsn: str) -> str:
    name = f"deadline-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT conveyor.queue_create(%s)", (name,))
    return name


class _Blocked:
    """Holds an exclusive lock on the messages table: every send waits behind it."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn)

    def __enter__(self) -> _Blocked:
        self.conn.execute("LOCK TABLE conveyor.messages IN ACCESS EXCLUSIVE MODE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.rollback()
        self.conn.close()


def test_a_request_over_the_timeout_is_answered_408_in_rest_and_sqs(server, module_dsn):
    queue = _queue(module_dsn)
    sqs = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="k",
                       aws_secret_access_key="s", config=botocore.config.Config(retries={"total_max_attempts": 1}))
    with _Blocked(module_dsn):
        started = time.monotonic()
        r = httpx.post(f"{server.url}/v1/queues/{queue}/messages", json={"message": "late"}, headers=AUTH, timeout=30)
        took = time.monotonic() - started
        assert r.status_code == 408, r.text
        assert r.json()["code"] == "RequestTimeout"
        assert 0.9 < took < 10
        with pytest.raises(botocore.exceptions.ClientError) as info:
            sqs.send_message(QueueUrl=f"{server.url}/000000000000/{queue}", MessageBody="late")
        assert info.value.response["Error"]["Code"] == "RequestTimeout"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 408
    # the server is well afterwards: its connections were not left mid-query
    for _ in range(5):
        assert httpx.post(f"{server.url}/v1/queues/{queue}/messages", json={"message": "ok"}, headers=AUTH,
                          timeout=30).status_code == 201
    metrics = httpx.get(server.url + "/metrics").text
    assert "conveyor_request_timeouts_total 2.0" in metrics, "|".join(x for x in metrics.splitlines() if "request_timeout" in x)
    lines = [orjson.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    cancelled = [line for line in lines if "CONVEYOR_REQUEST_TIMEOUT" in line["message"]]
    assert len(cancelled) == 2 and cancelled[0]["level"] == "warning"
    assert {"ts", "logger", "pid"} <= set(cancelled[0])


def test_a_long_poll_waits_beyond_the_timeout(server, module_dsn):
    queue = _queue(module_dsn)
    started = time.monotonic()
    r = httpx.get(f"{server.url}/v1/queues/{queue}/messages", params={"wait": 3}, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json() == []
    assert time.monotonic() - started >= 2.9

    def send_later() -> None:
        time.sleep(2)
        httpx.post(f"{server.url}/v1/queues/{queue}/messages", json={"message": "woke"}, headers=AUTH, timeout=30)

    sender = threading.Thread(target=send_later)
    sender.start()
    r = httpx.get(f"{server.url}/v1/queues/{queue}/messages", params={"wait": 10}, headers=AUTH, timeout=30)
    sender.join()
    assert r.status_code == 200 and [m["message"] for m in r.json()] == ["woke"]


# -- the deadline table and its sweep, in process -----------------------------------------

async def _request(seconds: float, work) -> bool:
    """A request as the edge runs one: whether its deadline cancelled it."""
    task = deadline.start(seconds)
    cancelling = task.cancelling()
    try:
        await work()
    except asyncio.CancelledError:
        if not deadline.end(task, cancelling):
            raise
        return True
    finally:
        deadline.end(task, cancelling)
    return False


async def test_a_request_past_its_deadline_is_cancelled_within_a_sweep():
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.create_task(_request(0.2, lambda: asyncio.sleep(5))) is True
    assert 0.2 <= loop.time() - started < 0.2 + 0.02 + 0.5  # one sweep interval (0.02 s) late, on a busy machine
    assert await asyncio.create_task(_request(0.2, lambda: asyncio.sleep(0.05))) is False
    await asyncio.sleep(0.1)
    assert deadline._sweeping is None and not deadline._ends and not deadline._expired  # nothing left behind


async def test_waiting_does_not_count_and_other_cancellations_pass():
    async def long_poll() -> None:
        with deadline.waiting(0.5):
            await asyncio.sleep(0.4)
        await asyncio.sleep(0.05)

    assert await asyncio.create_task(_request(0.2, long_poll)) is False

    async def work_after_the_wait() -> None:
        with deadline.waiting(0.5):
            await asyncio.sleep(0.1)
        await asyncio.sleep(5)  # only the wait is excused

    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.create_task(_request(0.2, work_after_the_wait)) is True
    assert 0.3 <= loop.time() - started < 1.5

    stopped = asyncio.create_task(_request(10, lambda: asyncio.sleep(5)))
    await asyncio.sleep(0.05)
    stopped.cancel()  # the client went away: not the deadline's cancellation
    with pytest.raises(asyncio.CancelledError):
        await stopped
    assert not deadline._ends and not deadline._expired
