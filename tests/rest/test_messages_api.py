"""REST /v1/queues/{name}/messages end to end."""

from __future__ import annotations

import pytest


@pytest.fixture
def q(http, queue_name):
    assert http.post("/v1/queues", json={"name": queue_name}).status_code == 201
    return f"/v1/queues/{queue_name}"


def test_send_receive_delete(http, q):
    r = http.post(f"{q}/messages", json={"message": {"task": "resize", "size": 3}, "headers": {"trace": "t1"}})
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    [m] = http.get(f"{q}/messages", params={"vt": 30}).json()
    assert m["id"] == mid and m["message"] == {"task": "resize", "size": 3}
    assert m["headers"] == {"trace": "t1"} and m["receive_count"] == 1
    assert m["visible_at"] > m["sent_at"]
    assert http.get(f"{q}/messages").json() == []
    assert http.delete(f"{q}/messages/{mid}").status_code == 204
    assert http.delete(f"{q}/messages/{mid}").status_code == 404


def test_receipts_act_only_for_the_current_delivery(http, q):
    """A worker whose visibility timeout ran out cannot delete, complete, fail or extend the
    message once another worker received it: its receipt is stale (409), the message stays."""
    mid = http.post(f"{q}/messages", json={"message": "job"}).json()["id"]
    [late] = http.get(f"{q}/messages", params={"vt": 0}).json()
    [current] = http.get(f"{q}/messages", params={"vt": 60}).json()
    assert late["receipt"] != current["receipt"] and late["id"] == current["id"] == mid
    stale = {"receipt": late["receipt"]}
    for method, path, body in (("DELETE", "", None), ("PATCH", "", {"vt": 0}), ("POST", "/complete", None),
                               ("POST", "/fail", {"error": "late"})):
        r = http.request(method, f"{q}/messages/{mid}{path}", params=stale, json=body)
        assert r.status_code == 409 and r.json()["code"] == "StaleReceipt", (method, path, r.text)
    assert http.request("DELETE", f"{q}/messages", json={"receipts": [late["receipt"]]}).json() == {"deleted": []}
    assert http.get(f"/v1/queues/{q.rsplit('/', 1)[1]}").json()["in_flight"] == 1
    r = http.patch(f"{q}/messages/{mid}", params={"receipt": current["receipt"]}, json={"vt": 30})
    assert r.status_code == 200
    assert http.request("DELETE", f"{q}/messages", json={"receipts": [current["receipt"]]}).json() == {"deleted": [mid]}
    r = http.delete(f"{q}/messages/{mid}", params={"receipt": current["receipt"]})
    assert r.status_code == 404 and r.json()["code"] == "MessageNotFound"


def test_receipts_are_checked(http, q, queue_name):
    ids = http.post(f"{q}/messages", json=[{"message": "a"}, {"message": "b"}]).json()["ids"]
    got = http.get(f"{q}/messages", params={"max": 2}).json()
    for bad in ("x", got[0]["receipt"][:-2], got[0]["receipt"] + "A"):
        r = http.delete(f"{q}/messages/{ids[0]}", params={"receipt": bad})
        assert r.status_code == 400 and r.json()["code"] == "InvalidInput", r.text
    r = http.delete(f"{q}/messages/{ids[1]}", params={"receipt": got[0]["receipt"]})
    assert r.status_code == 400 and f"for message {ids[0]}" in r.json()["error"]
    other = f"{queue_name}-other"
    http.post("/v1/queues", json={"name": other})
    r = http.delete(f"/v1/queues/{other}/messages/{ids[0]}", params={"receipt": got[0]["receipt"]})
    assert r.status_code == 400
    r = http.request("DELETE", f"{q}/messages", json={"ids": [1], "receipts": [got[0]["receipt"]]})
    assert r.status_code == 400


def test_string_bodies_are_byte_exact(http, q):
    bodies = ["plain", '{"looks": "like json" }', "  spaces  ", "ünï 🎉", "a\r\nb\tc"]
    ids = http.post(f"{q}/messages", json=[{"message": b} for b in bodies]).json()["ids"]
    got = http.get(f"{q}/messages", params={"max": 10}).json()
    assert [m["id"] for m in got] == ids
    assert [m["message"] for m in got] == bodies


def test_json_values_round_trip(http, q):
    values = [{"a": [1, 2, {"b": None}]}, [1, "two"], 3.5, True, None, 0]
    http.post(f"{q}/messages", json=[{"message": v} for v in values])
    assert [m["message"] for m in http.get(f"{q}/messages", params={"max": 10}).json()] == values


def test_batch_delete_and_delay(http, q):
    ids = http.post(f"{q}/messages", json=[{"message": "a"}, {"message": "b"}, {"message": "c", "delay": 60}]).json()["ids"]
    got = http.get(f"{q}/messages", params={"max": 10}).json()
    assert [m["message"] for m in got] == ["a", "b"]
    r = http.request("DELETE", f"{q}/messages", json={"ids": [*ids, 999999]})
    assert r.status_code == 200 and r.json() == {"deleted": ids}


def test_change_visibility(http, q):
    mid = http.post(f"{q}/messages", json={"message": "x"}).json()["id"]
    http.get(f"{q}/messages", params={"vt": 300})
    r = http.patch(f"{q}/messages/{mid}", json={"vt": 0})
    assert r.status_code == 200 and r.json()["id"] == mid and "visible_at" in r.json()
    [again] = http.get(f"{q}/messages").json()
    assert again["receive_count"] == 2
    assert http.patch(f"{q}/messages/424242", json={"vt": 5}).status_code == 404
    assert http.patch(f"{q}/messages/{mid}", json={"vt": 43201}).status_code == 400


def test_complete_and_fail(http, q, queue_name):
    a, b = http.post(f"{q}/messages", json=[{"message": "a"}, {"message": "b"}]).json()["ids"]
    assert http.post(f"{q}/messages/{a}/complete").status_code == 204
    assert http.post(f"{q}/messages/{a}/complete").status_code == 404
    assert http.post(f"{q}/messages/{b}/fail", json={"error": "bad input"}).status_code == 204
    assert http.post(f"{q}/messages/{b}/fail").status_code == 404
    assert http.get(f"{q}/messages").json() == []


def test_fail_moves_to_dead_letter_queue(http, queue_name):
    dlq = queue_name + "-dlq"
    http.post("/v1/queues", json={"name": dlq})
    http.post("/v1/queues", json={"name": queue_name, "max_receive_count": 2, "dead_letter_queue": dlq})
    mid = http.post(f"/v1/queues/{queue_name}/messages", json={"message": "x"}).json()["id"]
    http.post(f"/v1/queues/{queue_name}/messages/{mid}/fail")
    assert [m["message"] for m in http.get(f"/v1/queues/{dlq}/messages").json()] == ["x"]


def test_max_receive_count_dead_letters_through_rest(http, queue_name):
    dlq = queue_name + "-dlq"
    http.post("/v1/queues", json={"name": dlq})
    http.post("/v1/queues", json={"name": queue_name, "max_receive_count": 1, "dead_letter_queue": dlq})
    http.post(f"/v1/queues/{queue_name}/messages", json={"message": "poison"})
    assert len(http.get(f"/v1/queues/{queue_name}/messages", params={"vt": 0}).json()) == 1
    assert http.get(f"/v1/queues/{queue_name}/messages").json() == []
    assert http.get(f"/v1/queues/{dlq}").json()["queue_length"] == 1


def test_fifo_through_rest(http, queue_name):
    name = queue_name + ".fifo"
    http.post("/v1/queues", json={"name": name})
    base = f"/v1/queues/{name}/messages"
    r = http.post(base, json=[{"message": "1", "group_id": "g", "dedup_id": "d1"},
                              {"message": "2", "group_id": "g", "dedup_id": "d2"}])
    assert r.status_code == 201, r.text
    [first] = http.get(base).json()
    assert first["message"] == "1" and first["group_id"] == "g"
    assert http.get(base).json() == []  # group blocked while "1" is in flight
    http.delete(f"{base}/{first['id']}")
    assert [m["message"] for m in http.get(base).json()] == ["2"]
    r = http.post(base, json={"message": "no group"})
    assert r.status_code == 400 and "group_id" in r.json()["error"]


def test_fifo_read_of_a_standard_queue_goes_by_group(http, q):
    # seed 000: ?fifo=true reads in group order, one group to one consumer at a time, on any
    # queue; messages without a group id form one group of their own
    r = http.post(f"{q}/messages", json=[{"message": "a1", "group_id": "a"}, {"message": "b1", "group_id": "b"},
                                          {"message": "a2", "group_id": "a"}, {"message": "n1"},
                                          {"message": "n2"}])
    assert r.status_code == 201, r.text
    first = http.get(f"{q}/messages", params={"fifo": "true", "max": 10}).json()
    # every group's messages together and in order (the oldest group first), and no group
    # split between two consumers
    assert [m["message"] for m in first] == ["a1", "a2", "b1", "n1", "n2"]
    assert http.get(f"{q}/messages", params={"fifo": "true", "max": 10}).json() == []
    # the other groups back (visible again) while "a" stays in flight: "a" stays blocked
    for m in first:
        if m.get("group_id") != "a":
            http.patch(f"{q}/messages/{m['id']}", json={"vt": 0})
    again = http.get(f"{q}/messages", params={"fifo": "true", "max": 10}).json()
    assert sorted(m["message"] for m in again) == ["b1", "n1", "n2"]
    assert http.get(f"{q}/messages", params={"fifo": "true", "max": 10}).json() == []


def test_fifo_read_gives_one_group_to_one_consumer_at_a_time(http, q):
    http.post(f"{q}/messages", json=[{"message": f"{g}{i}", "group_id": g} for i in range(3) for g in "xy"])
    one = http.get(f"{q}/messages", params={"fifo": "true", "max": 1}).json()
    two = http.get(f"{q}/messages", params={"fifo": "true", "max": 1}).json()
    three = http.get(f"{q}/messages", params={"fifo": "true", "max": 1}).json()
    assert [m["message"] for m in one + two] == ["x0", "y0"] and three == []


@pytest.mark.parametrize("payload, status, fragment", [
    ({}, 400, "message"),
    ({"message": "x", "delay": 901}, 400, "delay"),
    ({"message": "x", "headers": "not an object"}, 400, "headers"),
    ({"message": "x", "extra": 1}, 400, "extra"),
    ([], 400, "at least 1"),
    ("just a string", 400, "message"),
    ({"message": "a\u0000b"}, 400, "NUL"),
    ({"message": "x" * 1048577}, 413, "at most"),
])
def test_bad_sends(http, q, payload, status, fragment):
    r = http.post(f"{q}/messages", json=payload)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]


@pytest.mark.parametrize("params, fragment", [
    ({"max": 0}, "max"), ({"max": "lots"}, "max"), ({"vt": -1}, "vt"), ({"wait": 21}, "wait"),
    ({"bogus": 1}, "bogus"), ({"fifo": "maybe"}, "fifo"),
])
def test_bad_receives(http, q, params, fragment):
    r = http.get(f"{q}/messages", params=params)
    assert r.status_code == 400 and fragment in r.json()["error"]


@pytest.mark.parametrize("path", ["abc", "0", "-1", "99999999999999999999999", "1.5"])
def test_bad_message_ids(http, q, path):
    r = http.delete(f"{q}/messages/{path}")
    assert r.status_code == 400 and "message id" in r.json()["error"]


def test_unknown_queue_is_404_everywhere(http):
    base = "/v1/queues/does-not-exist"
    for method, path, body in [("POST", "/messages", {"message": "x"}), ("GET", "/messages", None),
                               ("DELETE", "/messages", {"ids": [1]}), ("DELETE", "/messages/1", None),
                               ("PATCH", "/messages/1", {"vt": 1}), ("POST", "/messages/1/complete", None),
                               ("POST", "/messages/1/fail", None), ("GET", "", None)]:
        r = http.request(method, base + path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["code"] == "QueueNotFound"


def test_request_size_limit(http, q):
    r = http.post(f"{q}/messages", content=b'{"message": "' + b"x" * (9 * 1024 * 1024) + b'"}',
                  headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "RequestTooLarge"
