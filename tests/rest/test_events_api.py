"""REST /v1/events end to end against a real server: publish to routing keys, pattern
subscriptions (raw by default, the signed envelope on request), filter policies, the
queue's view of its subscriptions, and errors as REST JSON."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from conftest import unique_name
from conveyor.core import signing


@pytest.fixture
def q(http) -> str:
    name = unique_name("q")
    assert http.post("/v1/queues", json={"name": name}).status_code == 201
    return name


@pytest.fixture
def key() -> str:
    """A routing-key prefix no other test uses."""
    return unique_name("k")


def receive(http, queue: str, **params) -> list[dict]:
    r = http.get(f"/v1/queues/{queue}/messages", params={"max": 10, **params})
    assert r.status_code == 200, r.text
    return r.json()


def subscribe(http, pattern: str, **body) -> dict:
    r = http.post(f"/v1/events/{pattern.replace('#', '%23')}/subscriptions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_publish_with_no_subscribers(http, key):
    r = http.post(f"/v1/events/{key}.created", json={"message": "hi"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["queues_matched"], body["endpoints_matched"], body["queues"]) == (0, 0, [])
    assert len(body["message_id"]) == 36


def test_raw_delivery_by_default(http, q, key):
    sub = subscribe(http, f"{key}.*", queue_name=q)
    assert (sub["pattern"], sub["protocol"], sub["queue"], sub["envelope"]) == (f"{key}.*", "sqs", q, False)
    r = http.post(f"/v1/events/{key}.created", json={"message": {"order": 7}, "headers": {
        "kind": "big", "n": 5, "tags": ["a", 1], "meta": {"x": True}}})
    assert r.status_code == 201 and r.json()["queues"] == [q]
    [m] = receive(http, q)
    assert m["message"] == {"order": 7}  # JSON stays JSON
    assert m["headers"] == {"kind": {"DataType": "String", "StringValue": "big"},
                            "n": {"DataType": "Number", "StringValue": "5"},
                            "tags": {"DataType": "String.Array", "StringValue": '["a",1]'},
                            "meta": {"DataType": "String", "StringValue": '{"x":true}'}}


def test_envelope_is_signed_with_the_served_certificate(http, server, q, key):
    subscribe(http, f"{key}.#", queue_name=q, envelope=True)
    r = http.post(f"/v1/events/{key}.a.b", json={"message": "text", "subject": "Subj"})
    published = r.json()
    [m] = receive(http, q)
    envelope = m["message"]  # the envelope is JSON, so REST shows it as an object
    assert envelope["Type"] == "Notification" and envelope["Message"] == "text" and envelope["Subject"] == "Subj"
    assert envelope["MessageId"] == published["message_id"]
    assert envelope["TopicArn"] == f"arn:aws:sns:us-east-1:000000000000:{key}.a.b"
    assert envelope["SigningCertURL"].startswith(f"{server.url}/SimpleNotificationService-")
    assert f"SubscriptionArn=arn:aws:sns:us-east-1:000000000000:{key}.%23:" in envelope["UnsubscribeURL"]
    cert = httpx.get(envelope["SigningCertURL"]).text  # fetched as an SNS client does
    assert signing.verify(cert, envelope)
    assert http.get("/v1/cert").text == cert


def test_subscription_crud(http, q, key):
    pattern = f"{key}.#"
    a = subscribe(http, pattern, queue_name=q)
    assert subscribe(http, pattern, queue_name=q) == a  # idempotent
    b = subscribe(http, pattern, protocol="http", endpoint="http://127.0.0.1:9/hook", envelope=True)
    path = f"/v1/events/{key}.%23/subscriptions"
    listed = http.get(path).json()
    assert [s["id"] for s in listed] == [a["id"], b["id"]]
    assert http.get(path, params={"after": a["id"]}).json() == [b]
    assert http.get(f"{path}/{b['id']}").json() == b
    assert b["endpoint"] == "http://127.0.0.1:9/hook" and b["queue"] is None and b["envelope"]
    assert [s["id"] for s in http.get(f"/v1/queues/{q}/subscriptions").json()] == [a["id"]]
    published = http.post(f"/v1/events/{key}.x", json={"message": "m"}).json()
    assert (published["queues_matched"], published["endpoints_matched"]) == (1, 1)
    [copy] = published["messages"]  # seed 000: the messages the publish stored
    assert copy["queue"] == q
    [got] = http.get(f"/v1/queues/{q}/messages").json()
    assert got["id"] == copy["id"]
    assert http.delete(f"{path}/{a['id']}").status_code == 204
    assert http.delete(f"{path}/{a['id']}").status_code == 404
    assert http.get(f"{path}/{a['id']}").status_code == 404
    # a subscription is found under its own pattern only
    assert http.get(f"/v1/events/{key}.other/subscriptions/{b['id']}").status_code == 404
    assert http.get(f"/v1/queues/{q}/subscriptions").json() == []


def test_filter_policies(http, q, key):
    subscribe(http, key, queue_name=q, filter_policy={"kind": ["big"], "n": [{"numeric": [">", 3]}]})
    other = unique_name("q")
    http.post("/v1/queues", json={"name": other})
    subscribe(http, key, queue_name=other, filter_policy_scope="MessageBody",
              filter_policy={"order": {"total": [{"numeric": [">=", 100]}]}})
    sent = [
        ({"message": {"order": {"total": 150}}, "headers": {"kind": "big", "n": 4}}, [q, other]),
        ({"message": {"order": {"total": 5}}, "headers": {"kind": "big", "n": 2}}, []),
        ({"message": "plain", "headers": {"kind": "big", "n": 9}}, [q]),
    ]
    for body, queues in sent:
        assert http.post(f"/v1/events/{key}", json=body).json()["queues"] == queues
    assert len(receive(http, q)) == 2 and len(receive(http, other)) == 1


def test_a_publish_wakes_a_long_poll(http, server, q, key):
    subscribe(http, key, queue_name=q)
    got: list = []

    def poll() -> None:
        with server.client() as c:
            got.extend(c.get(f"/v1/queues/{q}/messages", params={"wait": 10}).json())

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    http.post(f"/v1/events/{key}", json={"message": "wake"})
    t.join(15)
    assert [m["message"] for m in got] == ["wake"] and time.monotonic() - started < 5


def test_fifo_routing_keys(http, key):
    fifo = unique_name("f") + ".fifo"
    assert http.post("/v1/queues", json={"name": fifo, "content_based_deduplication": True}).status_code == 201
    subscribe(http, f"{key}.fifo", queue_name=fifo)
    r = http.post(f"/v1/events/{key}.fifo", json={"message": "x"})
    assert r.status_code == 400 and "group_id" in r.json()["error"]
    r = http.post(f"/v1/events/{key}.fifo", json={"message": "x", "group_id": "g"})
    assert r.status_code == 201 and r.json()["sequence_number"] and r.json()["queues"] == [fifo]
    [m] = receive(http, fifo)
    assert (m["group_id"], m["message"]) == ("g", "x")


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    ("POST", "/v1/events/bad key", {"message": "x"}, 400, "InvalidInput"),
    ("POST", "/v1/events/a..b", {"message": "x"}, 400, "InvalidInput"),
    ("POST", "/v1/events/a.%23", {"message": "x"}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok", {"msg": "x"}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok", {"message": "x", "delay": 901}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok/subscriptions", {"queue_name": "missing-queue"}, 404, "QueueNotFound"),
    ("POST", "/v1/events/ok/subscriptions", {}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok/subscriptions", {"protocol": "http"}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok/subscriptions", {"protocol": "http", "endpoint": "ftp://x/y"}, 400, "InvalidInput"),
    ("POST", "/v1/events/a**/subscriptions", {"protocol": "http", "endpoint": "http://h/"}, 400, "InvalidInput"),
    ("POST", "/v1/events/ok/subscriptions", {"protocol": "http", "endpoint": "http://h/",
                                             "filter_policy": {"a": [{"numeric": ["<", "x"]}]}}, 400, "InvalidInput"),
    ("GET", "/v1/events/ok/subscriptions/123456789", None, 404, "SubscriptionNotFound"),
    ("GET", "/v1/events/ok/subscriptions/abc", None, 400, "InvalidInput"),
    ("DELETE", "/v1/events/ok/subscriptions/0", None, 400, "InvalidInput"),
    ("GET", "/v1/events/ok/subscriptions?max=0", None, 400, "InvalidInput"),
    ("GET", "/v1/queues/missing-queue/subscriptions", None, 404, "QueueNotFound"),
])
def test_errors_are_rest_json(http, method, path, body, status, code):
    r = http.request(method, path, json=body)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert r.json()["error"]


def test_the_events_api_is_in_the_openapi_document(http):
    paths = http.get("/v1/openapi.json").json()["paths"]
    assert {"post"} <= set(paths["/v1/events/{routing_key}"])
    assert {"get", "post"} <= set(paths["/v1/events/{pattern}/subscriptions"])
    assert {"get", "delete"} <= set(paths["/v1/events/{pattern}/subscriptions/{id}"])
    assert {"get"} <= set(paths["/v1/queues/{name}/subscriptions"])
