"""SNS to HTTP endpoints end to end: a real HTTP server in the test receives signed
deliveries from the running Conveyor server (its webhook worker), verifies them as an SNS
subscriber would, fails twice and then succeeds — the attempts visible in /metrics — and
a destination outside the allowlist is held, never attempted, while Subscribe succeeds.

The server allows loopback 127.0.0.1 only (CONVEYOR_WEBHOOK_ALLOW=127.0.0.1/32). Retries
are made due at once by moving next_attempt_at in SQL, instead of waiting out 10 s, 30 s."""

from __future__ import annotations

import base64
import json
import re
import time

import botocore.exceptions
import httpx
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from support.server import ServerProcess
from support.sns_clients import metric, sns_client, subscribe_http, unique

pytestmark = pytest.mark.slow


def verify(envelope: dict[str, str]) -> None:
    """As an SNS subscriber verifies a message (SignatureVersion 1: SHA1, 2: SHA256)."""
    assert re.search(r"/SimpleNotificationService-[0-9a-f]{32}\.pem$", envelope["SigningCertURL"])
    pem = httpx.get(envelope["SigningCertURL"]).raise_for_status().content
    key = x509.load_pem_x509_certificate(pem).public_key()
    names = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    canonical = "".join(f"{n}\n{envelope[n]}\n" for n in names if n in envelope)
    digest = {"1": hashes.SHA1(), "2": hashes.SHA256()}[envelope["SignatureVersion"]]
    key.verify(base64.b64decode(envelope["Signature"]), canonical.encode(), padding.PKCS1v15(), digest)


def make_due(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE conveyor.http_deliveries SET next_attempt_at = now() WHERE held_reason IS NULL")


def outbox(dsn: str, endpoint: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT attempt, last_error, held_reason FROM conveyor.http_deliveries "
                            "WHERE endpoint = %s ORDER BY id", [endpoint]).fetchall()


def wait_until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_signed_delivery_fails_twice_then_succeeds(server: ServerProcess, module_dsn, sns, make_topic, endpoint):
    topic = make_topic()
    sub = subscribe_http(sns, topic, endpoint)
    before = {o: metric(server.url, "queue_delivery_attempts_total", outcome=o) for o in ("success", "failure")}
    endpoint.statuses = [500, 503]
    message_id = sns.publish(TopicArn=topic, Message="deliver me", Subject="Hi")["MessageId"]

    endpoint.wait_for(1)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [(1, "HTTP 500: try again later", None)])
    make_due(module_dsn)
    endpoint.wait_for(2)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [(2, "HTTP 503: try again later", None)])
    make_due(module_dsn)
    received = endpoint.wait_for(3)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [])
    assert len(received) == 3

    for request in received:  # the same signed envelope each time
        assert request.path == "/hook"
        headers = request.headers
        assert headers["content-type"] == "text/plain; charset=UTF-8"
        assert headers["x-amz-sns-message-type"] == "Notification"
        assert headers["x-amz-sns-message-id"] == message_id
        assert headers["x-amz-sns-topic-arn"] == topic
        assert headers["x-amz-sns-subscription-arn"] == sub
        envelope = json.loads(request.body)
        assert envelope["Type"] == "Notification" and envelope["MessageId"] == message_id
        assert envelope["Message"] == "deliver me" and envelope["Subject"] == "Hi"
        assert envelope["TopicArn"] == topic
        # the link carries the subscription's token (the endpoint alone gets it), after the ARN
        link, _, token = envelope["UnsubscribeURL"].partition("&Token=")
        assert link.endswith(f"SubscriptionArn={sub}") and len(token) == 22
        verify(envelope)
    assert received[1].at - received[0].at < 5  # made due by the test, not after 10 s

    wait_until(lambda: metric(server.url, "queue_delivery_attempts_total", outcome="success") >= before["success"] + 1)
    assert metric(server.url, "queue_delivery_attempts_total", outcome="failure") == before["failure"] + 2
    assert metric(server.url, "queue_delivery_attempts_total", outcome="success") == before["success"] + 1
    assert metric(server.url, "queue_delivery_attempt_duration_seconds_count", outcome="failure") >= 2
    assert metric(server.url, "topic_messages_published_total", topic=topic.rsplit(":", 1)[1]) == 1
    assert metric(server.url, "topic_fanout_total", topic=topic.rsplit(":", 1)[1], kind="webhook") == 1


def test_the_delivery_policy_decides_retries_delays_and_content_type(module_dsn, sns, make_topic, endpoint):
    """A topic's DeliveryPolicy (one retry after 7 s, JSON content type) and a subscription
    that sets its own retries (two) but may not: the topic disables overrides. The
    first failure is retried 7 s later, the second leaves the row exhausted."""
    topic = make_topic()
    policy = {"http": {"defaultHealthyRetryPolicy": {"numRetries": 1, "minDelayTarget": 7, "maxDelayTarget": 7},
                       "defaultRequestPolicy": {"headerContentType": "application/json"},
                       "disableSubscriptionOverrides": True}}
    sns.set_topic_attributes(TopicArn=topic, AttributeName="DeliveryPolicy", AttributeValue=json.dumps(policy))
    sub = subscribe_http(sns, topic, endpoint)
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="DeliveryPolicy",
                                    AttributeValue='{"healthyRetryPolicy": {"numRetries": 2}}')
    effective = json.loads(sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]["EffectiveDeliveryPolicy"])
    assert effective["healthyRetryPolicy"]["numRetries"] == 1
    assert effective["requestPolicy"] == {"headerContentType": "application/json"}
    endpoint.statuses = [500, 500, 500]
    sns.publish(TopicArn=topic, Message="retry me")
    endpoint.wait_for(1)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [(1, "HTTP 500: try again later", None)])
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        wait, attempts = conn.execute("SELECT extract(epoch FROM next_attempt_at - now()), max_attempts "
                                      "FROM conveyor.http_deliveries WHERE endpoint = %s", [endpoint.url]).fetchone()
    assert 5 < wait <= 7 and attempts == 2
    make_due(module_dsn)
    received = endpoint.wait_for(2)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [(2, "HTTP 500: try again later", None)])
    time.sleep(0.5)
    assert len(endpoint.received) == 2  # exhausted: no third attempt
    assert [r.headers["content-type"] for r in received] == ["application/json"] * 2


def test_an_exhausted_http_delivery_goes_to_the_subscriptions_dead_letter_queue(module_dsn, sns, sqs, make_topic,
                                                                              make_queue, endpoint):
    """SNS dead-letters an HTTP(S) delivery whose policy is used up when the subscription
    has a RedrivePolicy: the envelope arrives in that queue and the outbox row goes."""
    topic = make_topic()
    dlq_url, dlq_arn = make_queue()
    sub = subscribe_http(sns, topic, endpoint)
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="DeliveryPolicy",
                                    AttributeValue='{"healthyRetryPolicy": {"numRetries": 0}}')
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="RedrivePolicy",
                                    AttributeValue=json.dumps({"deadLetterTargetArn": dlq_arn}))
    endpoint.statuses = [500]
    message_id = sns.publish(TopicArn=topic, Message="nobody home")["MessageId"]
    endpoint.wait_for(1)
    wait_until(lambda: outbox(module_dsn, endpoint.url) == [])
    [dead] = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=2)["Messages"]
    envelope = json.loads(dead["Body"])
    assert envelope["MessageId"] == message_id and envelope["Message"] == "nobody home"


def test_a_delivery_policy_sns_refuses_is_invalid_parameter(sns, make_topic, endpoint):
    topic = make_topic()
    sub = subscribe_http(sns, topic, endpoint)
    for call, kwargs in ((sns.set_subscription_attributes, {"SubscriptionArn": sub}),
                         (sns.set_topic_attributes, {"TopicArn": topic})):
        value = ('{"healthyRetryPolicy": {"numRetries": 101}}' if "SubscriptionArn" in kwargs
                 else '{"http": {"defaultHealthyRetryPolicy": {"minDelayTarget": 30, "maxDelayTarget": 20}}}')
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            call(AttributeName="DeliveryPolicy", AttributeValue=value, **kwargs)
        error = caught.value.response["Error"]
        assert error["Code"] == "InvalidParameter" and "DeliveryPolicy" in error["Message"], error
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url + "/2",
                      Attributes={"DeliveryPolicy": '{"throttlePolicy": {"maxReceivesPerSecond": 0}}'})
    assert caught.value.response["Error"]["Code"] == "InvalidParameter"


def test_raw_delivery_and_per_protocol_message(sns, make_topic, endpoint):
    topic = make_topic()
    subscribe_http(sns, topic, endpoint, RawMessageDelivery="true")
    sns.publish(TopicArn=topic, MessageStructure="json",
                Message=json.dumps({"default": "everyone", "http": "just for http", "sqs": "queues"}))
    [request] = endpoint.wait_for(1)
    assert request.body == "just for http"
    assert request.headers["x-amz-sns-rawdelivery"] == "true"
    assert request.headers["content-type"] == "text/plain; charset=UTF-8"


def test_disallowed_endpoint_is_held_and_never_attempted(server: ServerProcess, module_dsn, sns, make_topic,
                                                         endpoint):
    topic = make_topic()
    outside = endpoint.url.replace("127.0.0.1", "127.0.0.2")  # loopback, but not on the list
    before = metric(server.url, "queue_delivery_held_total")
    sub = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=outside,
                        ReturnSubscriptionArn=True)["SubscriptionArn"]  # still succeeds
    # its SubscriptionConfirmation is held like any delivery there, so it stays pending
    assert sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]["PendingConfirmation"] == "true"
    subscribe_http(sns, topic, endpoint)
    sns.publish(TopicArn=topic, Message="to both")
    [request] = endpoint.wait_for(1)  # the allowed one arrives
    assert json.loads(request.body)["Message"] == "to both"
    wait_until(lambda: outbox(module_dsn, outside) and outbox(module_dsn, outside)[0][2] is not None)
    [(attempt, last_error, reason)] = outbox(module_dsn, outside)
    assert attempt == 0 and last_error is None
    assert reason.startswith("destination 127.0.0.2 is not allowed by CONVEYOR_WEBHOOK_ALLOW")
    assert metric(server.url, "queue_delivery_held_total") == before + 1
    time.sleep(0.3)  # a few more worker rounds: still held, still never attempted
    assert outbox(module_dsn, outside) == [(0, None, reason)]
    assert all(r.path == "/hook" for r in endpoint.received) and len(endpoint.received) == 1


def test_certificate_is_served_and_survives_a_restart(module_dsn, endpoint):
    """/SimpleNotificationService.pem (open) and /v1/cert (REST, authenticated) serve the
    stored key's certificate; another server process on the same database serves the same
    one, and its deliveries verify with it."""
    first = ServerProcess(module_dsn, env={"CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32",
                                           "CONVEYOR_WEBHOOK_POLL": "0.1"}).start()
    try:
        pem = httpx.get(first.url + "/SimpleNotificationService.pem")
        assert pem.status_code == 200 and pem.text.startswith("-----BEGIN CERTIFICATE-----")
        x509.load_pem_x509_certificate(pem.content)
        with first.client() as rest:
            assert rest.get("/v1/cert").text == pem.text
        assert httpx.get(first.url + "/v1/cert").status_code == 401  # REST asks who is calling
    finally:
        first.terminate()
    second = ServerProcess(module_dsn, env={"CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32",
                                            "CONVEYOR_WEBHOOK_POLL": "0.1"}).start()
    try:
        assert httpx.get(second.url + "/SimpleNotificationService.pem").text == pem.text
        other = sns_client(second.url, "query")
        topic = other.create_topic(Name=unique())["TopicArn"]
        subscribe_http(other, topic, endpoint)
        other.publish(TopicArn=topic, Message="after restart")
        [request] = endpoint.wait_for(1)
        envelope = json.loads(request.body)
        assert envelope["SigningCertURL"].startswith(second.url + "/SimpleNotificationService-")
        verify(envelope)
    finally:
        second.terminate()
