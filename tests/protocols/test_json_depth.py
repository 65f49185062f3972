"""One JSON nesting limit for every protocol (``conveyor.json_input.MAX_DEPTH``), against a
real server: a body nested deeper is refused with 400 in the protocol's own error format
at every entry where JSON comes in, and a body at the limit is stored and answered back
unchanged (before, hq took 300 levels and then answered every receive of it 500, and hq
and Queen answered 500 to bodies near orjson's 1024)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from botocore.exceptions import ClientError

from conveyor.json_input import MAX_DEPTH
from support.server import ServerProcess
from support.sns_clients import sns_client
from support.sqs_clients import client as sqs_client

DEEP = (MAX_DEPTH + 1, 300, 1000, 1100)  # just past the limit; the poison; near and past orjson's 1024


def nested(levels: int, leaf: Any = "leaf") -> Any:
    """``levels`` arrays and objects, alternating, around ``leaf`` (0 levels: the leaf)."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def text(levels: int) -> str:
    """The same as JSON text, built without a parser's limits."""
    head = "".join('{"k":' if i % 2 == 0 else "[" for i in reversed(range(levels)))
    tail = "".join("}" if i % 2 == 0 else "]" for i in range(levels))
    return head + '"leaf"' + tail


@pytest.fixture(scope="module")
def srv(module_dsn) -> Iterator[ServerProcess]:
    proc = ServerProcess(module_dsn, env={"CONVEYOR_DIALECTS": "hq"}).start()
    yield proc
    proc.kill()


@pytest.fixture
def http(srv) -> Iterator[httpx.Client]:
    with srv.client() as c:
        yield c


def post(http: httpx.Client, path: str, body: str, **headers: str) -> httpx.Response:
    return http.post(path, content=body.encode(), headers={"Content-Type": "application/json", **headers})


def test_text_and_nested_agree():
    assert orjson.loads(text(7)) == nested(7)


# -- REST --------------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", DEEP)
def test_rest_refuses_too_deep_bodies_everywhere(http, queue_name, levels):
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    entries = [
        (f"/v1/queues/{queue_name}/messages", lambda inner: '{"message":' + inner + "}"),
        (f"/v1/queues/{queue_name}/messages", lambda inner: '[{"message":' + inner + "}]"),
        ("/v1/queues", lambda inner: '{"name":"x","tags":' + inner + "}"),
        ("/v1/streams/s/events", lambda inner: '{"payload":' + inner + "}"),
        ("/v1/events/k.x", lambda inner: '{"message":' + inner + "}"),
        ("/v1/schedules", lambda inner: '{"name":"s","every":"1h","target":"' + queue_name + '","message":'
         + inner + "}"),
    ]
    for path, wrap in entries:
        r = post(http, path, wrap(text(levels)))
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        assert r.json()["code"] == "InvalidInput" and f"deeper than {MAX_DEPTH}" in r.json()["error"], path
    assert http.get(f"/v1/queues/{queue_name}/messages").json() == []  # nothing was stored


def test_rest_bodies_at_the_limit_round_trip(http, queue_name):
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    message = nested(MAX_DEPTH - 1)  # inside {"message": ...}: the body is MAX_DEPTH deep
    assert post(http, f"/v1/queues/{queue_name}/messages", orjson.dumps({"message": message}).decode()
                ).status_code == 201
    [got] = http.get(f"/v1/queues/{queue_name}/messages").json()
    assert got["message"] == message
    schedule = {"name": queue_name, "every": "1h", "target": queue_name, "message": nested(MAX_DEPTH - 1)}
    assert post(http, "/v1/schedules", orjson.dumps(schedule).decode()).status_code == 201
    assert http.get(f"/v1/schedules/{queue_name}").json()["message"] == schedule["message"]


# -- hq ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", DEEP)
def test_hq_refuses_too_deep_bodies_in_its_format(http, queue_name, levels):
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    r = post(http, f"/hq/queues/{queue_name}/enqueue", text(levels))
    assert r.status_code == 400, r.text[:200]
    assert r.text.startswith("Failed to parse the request body as JSON: nested deeper than")
    assert http.get(f"/hq/queues/{queue_name}/receive").json() is None  # nothing was stored


def test_hq_bodies_at_the_limit_round_trip(http, queue_name):
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    assert post(http, f"/hq/queues/{queue_name}/enqueue", text(MAX_DEPTH)).status_code == 200
    r = http.get(f"/hq/queues/{queue_name}/receive")
    assert r.status_code == 200 and r.json()["args"] == nested(MAX_DEPTH)


def test_hq_answers_a_deeper_body_sent_through_sqs_as_a_string(srv, http, queue_name):
    """SQS bodies are strings: one that happens to be deeply nested JSON text is no poison
    for hq's receive, which answers it as a string (it never took such a body itself)."""
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    sqs = sqs_client(srv.url)
    url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=text(300))
    r = http.get(f"/hq/queues/{queue_name}/receive")
    assert r.status_code == 200, r.text[:200]
    assert r.json()["args"] == text(300)


# -- Queen ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", DEEP)
def test_queen_refuses_too_deep_pushes_in_its_format(http, queue_name, levels):
    body = '{"items":[{"queue":"' + queue_name + '","partition":"p","payload":' + text(levels) + "}]}"
    r = post(http, "/api/v1/push", body)
    assert r.status_code == 400, r.text[:200]
    assert f"deeper than {MAX_DEPTH}" in r.json()["error"]
    assert http.get(f"/api/v1/pop/queue/{queue_name}").status_code in (204, 404)  # nothing was stored


def test_queen_payloads_at_the_limit_round_trip(http, queue_name):
    payload = nested(MAX_DEPTH - 3)  # inside {"items": [{"payload": ...}]}
    pushed = http.post("/api/v1/push", json={"items": [{"queue": queue_name, "partition": "p", "payload": payload}]})
    assert pushed.status_code == 201, pushed.text
    popped = http.get(f"/api/v1/pop/queue/{queue_name}")
    assert popped.status_code == 200, popped.text[:200]
    assert popped.json()["messages"][0]["data"] == payload


# -- SQS and SNS: the AWS JSON protocol and JSON documents inside attributes -----------------------

def aws_json(http: httpx.Client, target: str, body: str) -> httpx.Response:
    return post(http, "/", body, **{"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": target})


@pytest.mark.parametrize("levels", DEEP)
def test_aws_json_protocol_refuses_too_deep_bodies_in_aws_shape(http, levels):
    for target in ("AmazonSQS.SendMessage", "AmazonSNS.Publish"):
        r = aws_json(http, target, '{"QueueUrl":"x","MessageBody":"b","MessageAttributes":' + text(levels) + "}")
        assert r.status_code == 400, (target, r.text[:200])
        assert r.json()["__type"].endswith("#SerializationException"), r.text[:200]
        assert f"deeper than {MAX_DEPTH}" in r.json()["message"]


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_json_inside_sqs_and_sns_attributes_is_limited_too(srv, queue_name, protocol):
    sqs = sqs_client(srv.url, protocol)
    url = sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    for levels in (MAX_DEPTH + 1, 1100):
        with pytest.raises(ClientError) as refused:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": text(levels)})
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    sns = sns_client(srv.url, protocol)
    arn = sns.create_topic(Name=queue_name)["TopicArn"]
    for levels in (MAX_DEPTH + 1, 1100):
        for call in (lambda t: sns.publish(TopicArn=arn, Message=t, MessageStructure="json"),
                     lambda t: sns.set_topic_attributes(TopicArn=arn, AttributeName="DeliveryPolicy", AttributeValue=t),
                     lambda t: sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=sqs.get_queue_attributes(
                         QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"],
                         Attributes={"FilterPolicy": t, "FilterPolicyScope": "MessageBody"})):
            with pytest.raises(ClientError) as refused:
                call(text(levels))
            assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
