"""The webhook delivery worker (conveyor.server.webhooks) against a real database and a
real HTTP endpoint (an aiohttp server in the test's event loop): delivery and deletion on
2xx, retries as the delivery policy says (the test makes a row due again instead of sleeping),
exhaustion, a subscription's throttle and content type, held destinations that are never attempted, timeouts and refused connections,
two workers sharing the outbox without delivering anything twice, and the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg
import pytest
from aiohttp import web

from conveyor import types
from conveyor.core import topics
from conveyor.db.pool import Database
from conveyor.server import egress, webhooks
from conveyor.server.metrics import Metrics
from support.server import free_port

URLS = types.TopicUrls(base_url="http://conveyor.test")
LOOPBACK = egress.Allowlist.parse("127.0.0.1/32")


@dataclass
class Hook:
    """A local endpoint: records requests, answers with the next of ``statuses`` (then 200),
    waiting ``delay`` seconds first."""

    url: str = ""
    requests: list[tuple[dict[str, str], str]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    delay: float = 0.0


@contextlib.asynccontextmanager
async def hook_server() -> AsyncIterator[Hook]:
    hook = Hook()

    async def handle(request: web.Request) -> web.Response:
        hook.requests.append(({k.lower(): v for k, v in request.headers.items()}, await request.text()))
        if hook.delay:
            await asyncio.sleep(hook.delay)
        status = hook.statuses.pop(0) if hook.statuses else 200
        return web.Response(status=status, text="nope" if status >= 300 else "ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    hook.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield hook
    finally:
        await runner.cleanup()


@pytest.fixture
async def database(dsn: str) -> AsyncIterator[Database]:
    db = Database(dsn, min_size=1, max_size=4)
    await db.open(wait=True)
    yield db
    await db.close()


async def publish(db: Database, endpoint: str, body: str = "hello", *, raw: bool = False, count: int = 1,
                  key: str = "orders", policy: str | None = None, topic_policy: str | None = None
                  ) -> types.Subscription:
    async with db.connection() as conn:
        if topic_policy is not None:
            await topics.create(conn, key, {"DeliveryPolicy": topic_policy})
        sub = await topics.subscribe(conn, types.NewSubscription(
            pattern=key, protocol=endpoint.split(":")[0], endpoint=endpoint, raw_delivery=raw,
            attributes=None if policy is None else {"DeliveryPolicy": policy}))
        for i in range(count):
            await topics.publish(conn, key, types.Publication(body=f"{body}{i if count > 1 else ''}"),
                                 signer=None, urls=URLS)
    return sub


async def rows(db: Database) -> list[types.Delivery]:
    async with db.connection() as conn:
        return await topics.delivery_list(conn)


def make_due(dsn: str) -> None:
    """Skip the backoff: what the worker would do 20 s later, it may do now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE conveyor.http_deliveries SET next_attempt_at = now()")


def config(allowlist: egress.Allowlist = LOOPBACK, timeout: float = 2.0, batch: int = 50) -> webhooks.Config:
    return webhooks.Config(allowlist=allowlist, timeout=timeout, batch=batch, poll=0.05)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_2xx_deletes_the_row_and_sns_headers_are_sent(database):
    metrics = Metrics()
    async with hook_server() as hook:
        sub = await publish(database, hook.url, "hi")
        async with webhooks.session(config()) as http:
            assert await webhooks.step(database, metrics, http, config()) == 1
    [(headers, body)] = hook.requests
    assert body == '{\n  "Type" : "Notification",' + body.split(",", 1)[1] and '"Message" : "hi"' in body
    assert headers["content-type"] == "text/plain; charset=UTF-8"
    assert headers["x-amz-sns-message-type"] == "Notification"
    assert headers["x-amz-sns-topic-arn"] == URLS.topic_arn("orders")
    assert headers["x-amz-sns-subscription-arn"] == URLS.subscription_arn("orders", sub.uuid)
    assert headers["x-amz-sns-message-id"] and headers["user-agent"] == webhooks.USER_AGENT
    assert await rows(database) == []
    assert sample(metrics, "queue_delivery_attempts_total", outcome="success") == 1
    assert sample(metrics, "queue_delivery_attempt_duration_seconds_count", outcome="success") == 1


async def test_raw_delivery_posts_the_body(database):
    async with hook_server() as hook:
        await publish(database, hook.url, "raw body", raw=True)
        async with webhooks.session(config()) as http:
            await webhooks.step(database, Metrics(), http, config())
    [(headers, body)] = hook.requests
    assert body == "raw body" and headers["x-amz-sns-rawdelivery"] == "true"


async def test_failures_back_off_then_succeed(database, dsn):
    metrics = Metrics()
    async with hook_server() as hook:
        hook.statuses = [500, 502]
        await publish(database, hook.url)
        async with webhooks.session(config()) as http:
            assert await webhooks.step(database, metrics, http, config()) == 1
            [row] = await rows(database)
            assert row.attempt == 1 and row.state == "pending" and row.last_error == "HTTP 500: nope"
            wait = (row.next_attempt_at - dt.datetime.now(dt.UTC)).total_seconds()
            assert 18 < wait <= 20  # SNS's default policy: 3 retries, 20 s apart
            assert await webhooks.step(database, metrics, http, config()) == 0  # not due yet
            make_due(dsn)
            assert await webhooks.step(database, metrics, http, config()) == 1
            [row] = await rows(database)
            assert row.attempt == 2 and row.last_error == "HTTP 502: nope"
            assert 18 < (row.next_attempt_at - dt.datetime.now(dt.UTC)).total_seconds() <= 20
            make_due(dsn)
            assert await webhooks.step(database, metrics, http, config()) == 1
    assert len(hook.requests) == 3 and await rows(database) == []
    assert sample(metrics, "queue_delivery_attempts_total", outcome="failure") == 2
    assert sample(metrics, "queue_delivery_attempts_total", outcome="success") == 1


async def test_exhausted_rows_stay_with_the_last_error(database, dsn):
    metrics = Metrics()
    async with hook_server() as hook:
        hook.statuses = [503] * 10
        await publish(database, hook.url)
        async with webhooks.session(config()) as http:
            for _ in range(4):  # the first try and SNS's default 3 retries
                assert await webhooks.step(database, metrics, http, config()) == 1
                make_due(dsn)
            assert await webhooks.step(database, metrics, http, config()) == 0
    [row] = await rows(database)
    assert row.state == "exhausted" and row.attempt == 4 and row.last_error == "HTTP 503: nope"
    assert len(hook.requests) == 4
    assert sample(metrics, "queue_delivery_exhausted_total") == 1
    assert sample(metrics, "queue_delivery_attempts_total", outcome="failure") == 4


def _due_in(row: types.Delivery) -> float:
    return (row.next_attempt_at - dt.datetime.now(dt.UTC)).total_seconds()


async def test_the_subscriptions_delivery_policy_sets_retries_and_content_type(database, dsn):
    """A subscription's DeliveryPolicy: two retries, 5 s then 40 s (linear backoff from
    minDelayTarget to maxDelayTarget), and its requestPolicy's content type."""
    policy = ('{"healthyRetryPolicy": {"numRetries": 2, "minDelayTarget": 5, "maxDelayTarget": 40, '
              '"numMinDelayRetries": 1}, "requestPolicy": {"headerContentType": "application/json"}}')
    async with hook_server() as hook:
        hook.statuses = [500] * 5
        await publish(database, hook.url, policy=policy)
        async with webhooks.session(config()) as http:
            await webhooks.step(database, Metrics(), http, config())
            [row] = await rows(database)
            assert (row.attempt, row.max_attempts, row.state) == (1, 3, "pending") and 3 < _due_in(row) <= 5
            make_due(dsn)
            await webhooks.step(database, Metrics(), http, config())
            [row] = await rows(database)
            assert row.attempt == 2 and 38 < _due_in(row) <= 40
            make_due(dsn)
            await webhooks.step(database, Metrics(), http, config())
    [row] = await rows(database)
    assert (row.attempt, row.state) == (3, "exhausted")
    assert [h["content-type"] for h, _ in hook.requests] == ["application/json"] * 3


async def test_the_topics_policy_applies_and_may_forbid_overrides(database, dsn):
    """The topic's http defaults apply to subscriptions without a policy of their own, and
    to every subscription when it sets disableSubscriptionOverrides."""
    topic_policy = ('{"http": {"defaultHealthyRetryPolicy": {"numRetries": 0}, '
                    '"disableSubscriptionOverrides": true}}')
    async with hook_server() as hook:
        hook.statuses = [500] * 3
        await publish(database, hook.url, topic_policy=topic_policy,
                      policy='{"healthyRetryPolicy": {"numRetries": 5}}')
        async with webhooks.session(config()) as http:
            await webhooks.step(database, Metrics(), http, config())
    [row] = await rows(database)
    assert (row.attempt, row.max_attempts, row.state) == (1, 1, "exhausted")


async def test_a_throttled_subscription_is_deferred_without_counting_attempts(database):
    """maxReceivesPerSecond 2: of 5 due rows, 2 are posted this second, 3 wait (attempt 0)."""
    async with hook_server() as hook:
        await publish(database, hook.url, count=5, policy='{"throttlePolicy": {"maxReceivesPerSecond": 2}}')
        throttle = webhooks.Throttle()
        async with webhooks.session(config()) as http:
            assert await webhooks.step(database, Metrics(), http, config(), throttle=throttle) == 5
            assert len(hook.requests) == 2
            left = await rows(database)
            assert len(left) == 3 and all(r.attempt == 0 for r in left)
            assert sorted(round(_due_in(r)) for r in left) == [1, 1, 2]
            await asyncio.sleep(1.1)
            assert await webhooks.step(database, Metrics(), http, config(), throttle=throttle) == 2
    assert len(hook.requests) == 4


async def test_a_disallowed_destination_is_held_and_never_attempted(database):
    metrics = Metrics()
    async with hook_server() as hook:
        await publish(database, hook.url)
        await publish(database, hook.url.replace("127.0.0.1", "localhost"), key="other")
        strict = config(allowlist=egress.Allowlist.parse("10.0.0.0/8"))
        async with webhooks.session(strict) as http:
            assert await webhooks.step(database, metrics, http, strict) == 2
            assert await webhooks.step(database, metrics, http, strict) == 0  # held rows are not claimed
    assert hook.requests == []
    held = await rows(database)
    assert [r.state for r in held] == ["held", "held"] and all(r.attempt == 0 for r in held)
    assert "destination 127.0.0.1 is not allowed" in held[0].held_reason
    assert "resolved from localhost" in held[1].held_reason
    assert sample(metrics, "queue_delivery_held_total") == 2
    assert sample(metrics, "queue_delivery_attempts_total", outcome="failure") == 0


async def test_ipv6_forms_of_internal_ipv4_addresses_are_held_under_public(database):
    """Issue 25, item 13: NAT64, 6to4, IPv4-compatible and SIIT forms of loopback, and a
    site-local address, as subscribers' endpoints under the default ``public``: held with
    the reason, never attempted."""
    metrics = Metrics()
    endpoints = ["http://[64:ff9b::7f00:1]/hook", "http://[64:ff9b:1::7f00:1]/hook", "http://[2002:7f00:1::1]/hook",
                 "http://[::127.0.0.1]/hook", "https://[::ffff:0:7f00:1]:8443/hook", "http://[fec0::1]/hook"]
    for n, endpoint in enumerate(endpoints):
        await publish(database, endpoint, key=f"k{n}")
    public = config(allowlist=egress.Allowlist.parse("public"))
    async with webhooks.session(public) as http:
        assert await webhooks.step(database, metrics, http, public) == len(endpoints)
    held = await rows(database)
    assert [r.state for r in held] == ["held"] * len(endpoints) and all(r.attempt == 0 for r in held)
    assert "destination 64:ff9b::7f00:1 (which leads to 127.0.0.1) is not allowed" in held[0].held_reason
    assert all("is not allowed by CONVEYOR_WEBHOOK_ALLOW (public)" in r.held_reason for r in held)
    assert sample(metrics, "queue_delivery_attempts_total", outcome="failure") == 0


async def test_timeouts_and_refused_connections_are_failures(database):
    metrics = Metrics()
    async with hook_server() as hook:
        hook.delay = 3.0
        await publish(database, hook.url, key="slow")
        await publish(database, f"http://127.0.0.1:{free_port()}/closed", key="closed")
        quick = config(timeout=0.3)
        async with webhooks.session(quick) as http:
            started = time.monotonic()
            assert await webhooks.step(database, metrics, http, quick) == 2
            assert time.monotonic() - started < 2.0  # concurrent, bounded by the timeout, not the delay
    errors = sorted(r.last_error for r in await rows(database))
    assert errors[0].startswith("ClientConnectorError") and errors[1] == "timed out after 0.3 s"
    assert sample(metrics, "queue_delivery_attempts_total", outcome="failure") == 2


async def test_two_workers_never_deliver_a_row_twice(database, dsn):
    async with hook_server() as hook:
        await publish(database, hook.url, count=40)
        small = config(batch=7)
        async with webhooks.session(small) as a, webhooks.session(small) as b:
            for _ in range(10):
                done = await asyncio.gather(webhooks.step(database, Metrics(), a, small),
                                            webhooks.step(database, Metrics(), b, small))
                if not any(done):
                    break
    bodies = sorted(body for _, body in hook.requests)
    assert len(bodies) == 40 and len(set(bodies)) == 40
    assert await rows(database) == []


async def test_the_worker_loop_delivers_and_reports_the_outbox(database):
    metrics = Metrics()
    async with hook_server() as hook:
        await publish(database, hook.url, count=3)
        await publish(database, "http://10.1.2.3/hook", key="internal")  # held by the loopback-only list
        task = asyncio.create_task(webhooks.run(database, metrics, config()))
        try:
            deadline = time.monotonic() + 5
            while sample(metrics, "queue_delivery_outbox", state="held") < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await publish(database, hook.url, "later", key="later")  # found by a later round
            while len(hook.requests) < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert sorted(body.split('"Message" : "')[1].split('"')[0] for _, body in hook.requests) == [
        "hello0", "hello1", "hello2", "later"]
    # the gauges were refreshed after the first round: 3 delivered, 1 held
    assert sample(metrics, "queue_delivery_outbox", state="held") == 1
    assert sample(metrics, "queue_delivery_outbox", state="pending") == 0
    assert sample(metrics, "queue_delivery_held_total") == 1
