"""REST /v1/queues end to end, through HTTP against a running server."""

from __future__ import annotations

from support.sqs_clients import client


def test_create_get_list_delete(http, queue_name):
    r = http.post("/v1/queues", json={"name": queue_name, "visibility_timeout": 45})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v1/queues/{queue_name}"
    body = r.json()
    assert body["name"] == queue_name and body["visibility_timeout"] == 45 and body["fifo"] is False

    assert http.post("/v1/queues", json={"name": queue_name, "visibility_timeout": 45}).status_code == 201
    conflict = http.post("/v1/queues", json={"name": queue_name, "visibility_timeout": 46})
    assert conflict.status_code == 409 and conflict.json()["code"] == "QueueAlreadyExists"

    detail = http.get(f"/v1/queues/{queue_name}").json()
    assert detail["queue_length"] == 0 and detail["total_messages"] == 0 and "scrape_time" in detail
    assert queue_name in [q["name"] for q in http.get("/v1/queues").json()]
    assert [q["name"] for q in http.get("/v1/queues", params={"prefix": queue_name}).json()] == [queue_name]

    assert http.delete(f"/v1/queues/{queue_name}").status_code == 204
    gone = http.delete(f"/v1/queues/{queue_name}")
    assert gone.status_code == 404 and "does not exist" in gone.json()["error"]
    assert http.get(f"/v1/queues/{queue_name}").status_code == 404


def test_fifo_and_redrive_attributes(http, queue_name):
    dlq = queue_name + "-dlq.fifo"
    assert http.post("/v1/queues", json={"name": dlq}).status_code == 201
    r = http.post("/v1/queues", json={"name": queue_name + ".fifo", "max_receive_count": 3,
                                      "dead_letter_queue": dlq, "content_based_deduplication": True})
    assert r.status_code == 201, r.text
    assert r.json()["fifo"] is True and r.json()["dead_letter_queue"] == dlq


def test_fifo_true_names_the_queue_with_the_suffix(http, queue_name, server):
    sqs = client(server.url, "json")
    # seed 000: {"name": ..., "fifo": true}; the queue's one name ends in .fifo everywhere
    r = http.post("/v1/queues", json={"name": queue_name, "fifo": True})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == queue_name + ".fifo" and r.json()["fifo"] is True
    assert r.headers["location"] == f"/v1/queues/{queue_name}.fifo"
    # the same queue again, by either spelling, is the same queue (idempotent create)
    assert http.post("/v1/queues", json={"name": queue_name + ".fifo", "fifo": True}).status_code == 201
    url = sqs.get_queue_url(QueueName=queue_name + ".fifo")["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["FifoQueue"])["Attributes"]["FifoQueue"] == "true"
    assert http.get(f"/v1/queues/{queue_name}").status_code == 404


def test_list_items_carry_the_storage_kinds(http, queue_name):
    http.post("/v1/queues", json={"name": queue_name})
    [item] = [q for q in http.get("/v1/queues").json() if q["name"] == queue_name]
    assert item["is_partitioned"] is False and item["is_unlogged"] is False and "created_at" in item
    assert item["storage"] == "logged" and item["partitioning"] is None


def test_create_unlogged_and_partitioned_queues(http, queue_name):
    r = http.post("/v1/queues", json={"name": queue_name + "-u", "storage": "unlogged"})
    assert r.status_code == 201, r.text
    assert (r.json()["storage"], r.json()["is_unlogged"], r.json()["is_partitioned"]) == ("unlogged", True, False)
    r = http.post("/v1/queues", json={"name": queue_name + "-p", "storage": "partitioned", "partition_interval": 1000,
                                      "partition_retention": 5000, "partition_premake": 2})
    assert r.status_code == 201, r.text
    assert r.json()["is_partitioned"] is True
    assert r.json()["partitioning"] == {"by": "id", "interval": 1000, "retention": 5000, "premake": 2}
    r = http.post("/v1/queues", json={"name": queue_name + "-t", "storage": "partitioned",
                                      "partition_interval": "1 day"})
    assert r.json()["partitioning"] == {"by": "time", "interval": "1 day", "retention": None, "premake": 4}
    listed = {q["name"]: q["storage"] for q in http.get("/v1/queues", params={"prefix": queue_name}).json()}
    assert listed == {queue_name + "-u": "unlogged", queue_name + "-p": "partitioned",
                      queue_name + "-t": "partitioned"}
    for suffix in ("-u", "-p", "-t"):
        q = queue_name + suffix
        assert http.post(f"/v1/queues/{q}/messages", json=[{"message": {"n": i}} for i in range(3)]).status_code == 201
        got = http.get(f"/v1/queues/{q}/messages", params={"max": 5}).json()
        assert sorted(m["message"]["n"] for m in got) == [0, 1, 2]
        assert http.delete(f"/v1/queues/{q}/messages/{got[0]['id']}").status_code == 204
        assert http.get(f"/v1/queues/{q}").json()["queue_length"] == 0  # two in flight
    # the storage is chosen once: the same again is the same queue, another kind a conflict
    assert http.post("/v1/queues", json={"name": queue_name + "-u", "storage": "unlogged"}).status_code == 201
    assert http.post("/v1/queues", json={"name": queue_name + "-u", "storage": "logged"}).status_code == 409
    r = http.patch(f"/v1/queues/{queue_name}-u", json={"storage": "logged"})
    assert r.status_code == 400
    for payload, fragment in [({"storage": "sideways"}, "storage"),
                              ({"storage": "unlogged", "partition_interval": 10}, "partitioned queues only"),
                              ({"storage": "partitioned", "partition_interval": "10 seconds"}, "from 1 minute"),
                              ({"storage": "partitioned", "partition_premake": 0}, "partition_premake")]:
        r = http.post("/v1/queues", json={"name": queue_name + "-x", **payload})
        assert r.status_code == 400 and fragment in r.json()["error"], (payload, r.text)
    assert http.delete(f"/v1/queues/{queue_name}-p").status_code == 204


def test_alter(http, queue_name):
    http.post("/v1/queues", json={"name": queue_name})
    r = http.patch(f"/v1/queues/{queue_name}", json={"delay_seconds": 3, "visibility_timeout": 9})
    assert r.status_code == 200 and (r.json()["delay_seconds"], r.json()["visibility_timeout"]) == (3, 9)
    r = http.patch(f"/v1/queues/{queue_name}", json={"delay_seconds": None})
    assert r.json()["delay_seconds"] == 0 and r.json()["visibility_timeout"] == 9
    assert http.patch("/v1/queues/nope-nope", json={"delay_seconds": 1}).status_code == 404


def test_purge(http, queue_name):
    http.post("/v1/queues", json={"name": queue_name})
    http.post(f"/v1/queues/{queue_name}/messages", json=[{"message": str(i)} for i in range(3)])
    r = http.post(f"/v1/queues/{queue_name}/purge")
    assert r.status_code == 200 and r.json() == {"deleted": 3}
    assert http.post("/v1/queues/missing-queue/purge").status_code == 404


def test_invalid_create_requests_are_400_with_the_reason(http):
    cases = [
        ({"name": "bad name"}, "name"),
        ({"name": "x" * 81}, "name"),
        ({"name": "ok", "visibility_timeout": -1}, "visibility_timeout"),
        ({"name": "ok", "colour": "red"}, "colour"),
        ({}, "name"),
        ({"name": "ok.fifo", "fifo": False}, "FIFO"),
        ({"name": "x" * 76, "fifo": True}, "75 characters"),
    ]
    for payload, fragment in cases:
        r = http.post("/v1/queues", json=payload)
        assert r.status_code == 400, (payload, r.text)
        assert fragment in r.json()["error"], (payload, r.json())
        assert r.json()["code"] == "InvalidInput"
    for raw in (b"{", b"", b"[1,2", b"\xff\xfe"):
        r = http.post("/v1/queues", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == "InvalidInput"


def test_unknown_routes_and_methods_are_json(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["code"] == "NotFound"
    r = http.put("/v1/queues")
    assert r.status_code == 405 and r.json()["code"] == "MethodNotAllowed"
