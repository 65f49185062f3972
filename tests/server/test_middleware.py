"""Middleware and app wiring, in process (Starlette's TestClient runs the lifespan)."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from conveyor.server.app import create_app
from conveyor.settings import Settings


@pytest.fixture
def client(dsn):
    app = create_app(Settings(max_request_bytes=1000, auth_mode="header", depth_scrape_interval=0.1,
                              history_interval=0.1), dsn)
    with TestClient(app, headers={"Authorization": "x"}) as c:
        yield c


def test_body_limit_by_content_length_and_by_stream(client):
    client.post("/v1/queues", json={"name": "jobs"})
    r = client.post("/v1/queues/jobs/messages", content=b"x" * 2000)
    assert r.status_code == 413 and r.json()["code"] == "RequestTooLarge"

    def chunks():
        for _ in range(20):
            yield b"y" * 100

    r = client.post("/v1/queues/jobs/messages", content=chunks())  # chunked, no length
    assert r.status_code == 413


def test_aws_clients_get_an_oversized_body_refused_in_their_own_protocol(client):
    big = b"x" * 2000  # announced by Content-Length: refused before it is read
    sns = client.post("/", content=big, headers={"Content-Type": "application/x-amz-json-1.0",
                                                 "X-Amz-Target": "AmazonSNS.Publish"})
    assert sns.status_code == 413 and sns.json()["__type"] == "com.amazonaws.sns#RequestEntityTooLarge"
    assert sns.headers["x-amzn-query-error"] == "RequestEntityTooLarge;Sender" and sns.headers["x-amzn-RequestId"]
    query = client.post("/", content=b"Action=SendMessage&MessageBody=" + big,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert query.status_code == 413 and query.headers["content-type"].startswith("text/xml")
    assert "<Code>RequestEntityTooLarge</Code>" in query.text and "<RequestId>" in query.text


def test_missing_authorization_is_401_with_a_challenge_but_health_is_open(client):
    assert client.get("/v1/queues", headers={"Authorization": ""}).status_code == 200
    bare = TestClient(client.app)
    refused = bare.get("/v1/queues")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Bearer realm="conveyor"'
    assert refused.json()["code"] == "Unauthorized"
    assert bare.get("/livez").json()["status"] == "ok"


def test_metrics_families(client):
    client.post("/v1/queues", json={"name": "jobs"})
    client.post("/v1/queues/jobs/messages", json={"message": "x"})
    [m] = client.get("/v1/queues/jobs/messages").json()
    client.delete(f"/v1/queues/jobs/messages/{m['id']}")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the next depth scrape (paced: later on a busy machine)
        text = client.get("/metrics").text
        if 'queue_depth{queue="jobs"} 0.0' in text:
            break
        time.sleep(0.1)
    for family in ("http_requests_total", "http_request_duration_seconds", "http_connections_active",
                   "queue_messages_sent_total", "queue_messages_received_total", "queue_messages_deleted_total",
                   "queue_messages_redelivered_total", "queue_message_send_duration_seconds",
                   "queue_message_receive_duration_seconds", "queue_message_delete_duration_seconds",
                   "queue_message_age_at_receive_seconds", "queue_coalescer_flush_batch_size",
                   "queue_depth", "queue_in_flight", "db_pool_size", "db_pool_idle", "db_pool_active",
                   "db_pool_acquire_timeouts_total"):
        assert f"\n# TYPE {family}" in text or f"# TYPE {family.removesuffix('_total')}" in text, family
    assert 'queue_messages_sent_total{queue="jobs"} 1.0' in text
    assert 'http_requests_total{method="POST",path="/v1/queues/{name}/messages",status="201"} 1.0' in text
    assert 'queue_depth{queue="jobs"} 0.0' in text


def test_stream_consumer_and_group_series(client):
    client.post("/v1/streams", json={"name": "audit"})
    client.post("/v1/streams/audit/consumers", json={"name": "billing"})
    client.post("/v1/streams/audit/events", json={"payload": "e"})
    client.post("/api/v1/push", json={"items": [{"queue": "orders", "partition": "p1", "payload": 1}]})
    client.get("/api/v1/pop/queue/orders", params={"consumerGroup": "shipping", "wait": "false", "autoAck": "true"})
    client.post("/api/v1/push", json={"items": [{"queue": "orders", "partition": "p2", "payload": 2}]})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the next depth scrape
        text = client.get("/metrics").text
        if 'pqueue_group_lag_messages{group="shipping",queue="orders"} 1.0' in text:
            break
        time.sleep(0.1)
    assert 'stream_depth{stream="audit"}' in text and 'stream_dead_letters{stream="audit"} 0.0' in text
    assert 'stream_consumer_pending_events{consumer="billing",stream="audit"}' in text
    assert "stream_consumer_lag_seconds" in text
    assert 'pqueue_group_lag_messages{group="shipping",queue="orders"} 1.0' in text
    assert 'pqueue_group_partitions_behind{group="shipping",queue="orders"} 1.0' in text


def test_unhandled_errors_are_json_500_without_internals(dsn):
    app = create_app(Settings(auth_mode="none"), dsn)

    async def boom(request):
        raise RuntimeError("secret internals")

    app.router.add_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
    assert r.status_code == 500 and r.json() == {"error": "internal error", "code": "InternalError"}


def test_aws_endpoints_take_the_short_path_with_telemetry_and_body_limit(client):
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    assert client.post("/", content=b"{}", headers=headers).status_code == 200
    r = client.post("/000000000000/nope", content=b"{}",
                    headers={**headers, "X-Amz-Target": "AmazonSQS.GetQueueAttributes"})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"

    def chunks():
        for _ in range(20):
            yield b"y" * 100

    too_large = client.post("/", content=chunks(), headers=headers)  # streamed, no length
    assert too_large.status_code == 413
    assert too_large.json() == {"__type": "com.amazonaws.sqs#RequestEntityTooLarge",
                                "message": "request body larger than 1000 bytes"}
    text = client.get("/metrics").text
    assert 'http_requests_total{method="POST",path="/",status="200"} 1.0' in text
    assert 'http_requests_total{method="POST",path="/{account_id}/{queue_name}",status="400"} 1.0' in text
    assert 'http_requests_total{method="POST",path="/",status="413"} 1.0' in text
