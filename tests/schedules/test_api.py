"""REST /v1/schedules and /v1/previews end to end, against a real server whose scheduler
polls every 0.2 s. Status codes, validation errors (400 JSON, never a 500), manual runs,
previews, and a one-shot fired by the server's own scheduler."""

from __future__ import annotations

import datetime as dt
import json
import re
import time

import httpx
import pytest

from conftest import unique_name
from support.server import ServerProcess

UTC = dt.UTC


@pytest.fixture(scope="module")
def sched_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_SCHEDULE_POLL_SECONDS": "0.2"}).start()
    yield proc
    proc.kill()


@pytest.fixture
def http(sched_server):
    with sched_server.client() as client:
        yield client


@pytest.fixture
def queue(http):
    name = unique_name("q")
    assert http.post("/v1/queues", json={"name": name}).status_code == 201
    return name


@pytest.fixture
def name():
    return unique_name("sch")


def bad(r: httpx.Response, *fragments: str) -> dict:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] in ("InvalidInput", "DataException"), body
    for fragment in fragments:
        assert fragment in body["error"], body
    return body


def test_create_is_strict_and_answers_201_with_location(http, queue, name):
    r = http.post("/v1/schedules", json={"name": name, "cron": "0 9 * * 1-5", "timezone": "Europe/Paris",
                                         "target": queue, "message": {"report": "daily"},
                                         "headers": {"team": "data"}})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v1/schedules/{name}"
    s = r.json()
    assert (s["kind"], s["cron"], s["timezone"], s["status"], s["target_kind"]) == (
        "cron", "0 9 * * 1-5", "Europe/Paris", "active", "queue")
    assert s["message"] == {"report": "daily"} and s["headers"] == {"team": "data"}
    assert s["human_readable"] == "At 09:00, Monday through Friday (Europe/Paris)"
    assert len(s["next_fires"]) == 5 and s["next_fires"][0] == s["next_fire_at"]
    assert s["expression"] == {"cron": "0 9 * * 1-5", "timezone": "Europe/Paris"}
    again = http.post("/v1/schedules", json={"name": name, "every": "5m", "target": queue})
    assert again.status_code == 409 and again.json()["code"] == "ScheduleAlreadyExists"
    assert http.get(f"/v1/schedules/{name}").json() == s


def test_put_upserts_idempotently(http, queue, name):
    spec = {"every": "15m", "target": queue, "message": "tick"}
    r1 = http.put(f"/v1/schedules/{name}", json=spec)
    assert r1.status_code == 201 and r1.headers["location"] == f"/v1/schedules/{name}"
    r2 = http.put(f"/v1/schedules/{name}", json=spec)
    assert r2.status_code == 200
    assert r2.json() == r1.json()  # nothing moved: same next fire time, same updated_at
    assert r2.json()["message"] == "tick"
    r3 = http.put(f"/v1/schedules/{name}", json={**spec, "every": "30m", "catchup": True})
    assert r3.status_code == 200 and r3.json()["cron"] == "*/30 * * * *" and r3.json()["catchup"] is True


def test_patch_pauses_resumes_and_changes_fields(http, queue, name):
    assert http.post("/v1/schedules", json={"name": name, "when": "every day at 09:00", "target": queue}).status_code == 201
    paused = http.patch(f"/v1/schedules/{name}", json={"status": "paused"}).json()
    assert paused["status"] == "paused" and paused["next_fires"] == []
    assert [s["name"] for s in http.get("/v1/schedules", params={"status": "paused"}).json()
            if s["name"] == name] == [name]
    resumed = http.patch(f"/v1/schedules/{name}", json={"status": "active"}).json()
    assert resumed["status"] == "active" and len(resumed["next_fires"]) == 5
    tz = http.patch(f"/v1/schedules/{name}", json={"timezone": "Asia/Tokyo"}).json()
    assert (tz["cron"], tz["timezone"]) == ("0 9 * * *", "Asia/Tokyo")
    assert tz["next_fire_at"].endswith("T00:00:00+00:00")  # 09:00 in Tokyo
    changed = http.patch(f"/v1/schedules/{name}", json={"message": {"v": 2}, "headers": {"h": 1},
                                                        "failure_threshold": 3}).json()
    assert (changed["message"], changed["headers"], changed["failure_threshold"]) == ({"v": 2}, {"h": 1}, 3)
    cleared = http.patch(f"/v1/schedules/{name}", json={"headers": None, "message": "plain"}).json()
    assert cleared["headers"] is None and cleared["message"] == "plain"
    bad(http.patch(f"/v1/schedules/{name}", json={"catchup": None}), "catchup cannot be null")
    missing = http.patch("/v1/schedules/nope-" + name, json={"status": "paused"})
    assert missing.status_code == 404 and missing.json()["code"] == "ScheduleNotFound"


def test_delete_is_idempotent(http, queue, name):
    assert http.post("/v1/schedules", json={"name": name, "every": "1h", "target": queue}).status_code == 201
    assert http.delete(f"/v1/schedules/{name}").status_code == 204
    assert http.delete(f"/v1/schedules/{name}").status_code == 204
    r = http.get(f"/v1/schedules/{name}")
    assert r.status_code == 404 and r.json()["code"] == "ScheduleNotFound"


def test_list_filters_and_cap(http, queue):
    prefix = unique_name("lst")
    for i in range(3):
        assert http.post("/v1/schedules", json={"name": f"{prefix}-{i}", "every": "1h", "target": queue}).status_code == 201
    assert http.post("/v1/schedules", json={"name": f"{prefix}-t", "every": "1h", "target": "orders.created",
                                            "target_kind": "topic"}).status_code == 201
    names = [s["name"] for s in http.get("/v1/schedules", params={"name_prefix": prefix}).json()]
    assert names == [f"{prefix}-0", f"{prefix}-1", f"{prefix}-2", f"{prefix}-t"]
    topics = http.get("/v1/schedules", params={"name_prefix": prefix, "target_kind": "topic"}).json()
    assert [s["name"] for s in topics] == [f"{prefix}-t"]
    assert len(http.get("/v1/schedules", params={"name_prefix": prefix, "limit": 2}).json()) == 2
    bad(http.get("/v1/schedules", params={"limit": 1001}), "limit")
    bad(http.get("/v1/schedules", params={"status": "sleeping"}), "status")


def test_validation_errors_are_400_json(http, queue, name):
    base = {"name": name, "target": queue}
    bad(http.post("/v1/schedules", json={**base, "cron": "* * * * * *"}), "6 fields", "seconds are not supported")
    bad(http.post("/v1/schedules", json={**base, "cron": "0 9 * *"}), "4 fields")
    bad(http.post("/v1/schedules", json={**base, "cron": "61 * * * *"}), "bad minute")
    bad(http.post("/v1/schedules", json={**base, "every": "30s"}), "minute resolution")
    bad(http.post("/v1/schedules", json={**base, "every": "7m"}), "does not divide an hour")
    bad(http.post("/v1/schedules", json={**base, "when": "now and then"}), "cannot read when")
    bad(http.post("/v1/schedules", json={**base, "cron": "* * * * *", "every": "5m"}), "exactly one")
    bad(http.post("/v1/schedules", json=base), "exactly one")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "timezone": "Mars/Olympus"}), "unknown time zone")
    bad(http.post("/v1/schedules", json={**base, "fire_at": "soon"}), "ISO 8601")
    bad(http.post("/v1/schedules", json={**base, "fire_at": "2001-01-01T00:00:00Z"}), "in the past")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "target_kind": "workflow"}), "target_kind")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "catchup_limit": 0}), "catchup_limit")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "surprise": 1}), "surprise")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "headers": {"_schedule": "mine"}}), "_schedule")
    bad(http.post("/v1/schedules", json={"name": ".dot", "every": "5m", "target": queue}), "name")
    bad(http.post("/v1/schedules", json={**base, "every": "5m", "target": "no/such queue"}))
    bad(http.post("/v1/schedules", content=b"{not json", headers={"content-type": "application/json"}), "not valid JSON")
    bad(http.get("/v1/schedules/.hidden"), "invalid schedule name")
    bad(http.put(f"/v1/schedules/{name}", json={"target": queue, "every": "1h", "message": "a\u0000b"}))
    assert http.get(f"/v1/schedules/{name}").status_code == 404  # nothing was stored


def test_manual_run_fires_out_of_band(http, queue, name):
    assert http.post("/v1/schedules", json={"name": name, "every": "1h", "target": queue,
                                            "message": {"job": 1}, "headers": {"k": "v"}}).status_code == 201
    before = http.get(f"/v1/schedules/{name}").json()
    r = http.post(f"/v1/schedules/{name}/runs")
    assert r.status_code == 202, r.text
    run = r.json()
    assert (run["schedule"], run["out_of_band"], run["target"], run["queues"]) == (name, True, queue, [queue])
    [msg_id] = run["msg_ids"]
    [m] = http.get(f"/v1/queues/{queue}/messages", params={"max": 10}).json()
    assert m["id"] == msg_id and m["message"] == {"job": 1}
    assert m["headers"]["k"] == "v"
    assert m["headers"]["_schedule"] == {"name": name, "scheduled_for": m["headers"]["_schedule"]["scheduled_for"],
                                         "out_of_band": True}
    assert http.get(f"/v1/schedules/{name}").json() == before  # next_fire_at, fire_count untouched
    missing = http.post(f"/v1/schedules/{name}-nope/runs")
    assert missing.status_code == 404 and missing.json()["code"] == "ScheduleNotFound"


def test_manual_run_into_a_missing_queue_is_404(http, name):
    assert http.post("/v1/schedules", json={"name": name, "every": "1h", "target": unique_name("gone")}).status_code == 201
    r = http.post(f"/v1/schedules/{name}/runs")
    assert r.status_code == 404 and r.json()["code"] == "QueueNotFound"


def test_previews(http):
    r = http.post("/v1/previews", json={"cron": "30 2 * * *", "timezone": "America/New_York",
                                        "after": "2026-03-06T12:00:00+00:00", "count": 3})
    assert r.status_code == 200, r.text
    assert r.json() == {"kind": "cron", "cron": "30 2 * * *", "timezone": "America/New_York", "fire_at": None,
                        "human_readable": "At 02:30 (America/New_York)",
                        "next_fires": ["2026-03-07T07:30:00+00:00", "2026-03-08T07:00:00+00:00", "2026-03-09T06:30:00+00:00"]}
    every = http.post("/v1/previews", json={"every": "2h", "after": "2026-01-01T00:30:00Z"}).json()
    assert (every["cron"], every["human_readable"]) == ("0 */2 * * *", "Every 2 hours (UTC)")
    assert every["next_fires"] == ["2026-01-01T02:00:00+00:00", "2026-01-01T04:00:00+00:00", "2026-01-01T06:00:00+00:00",
                                   "2026-01-01T08:00:00+00:00", "2026-01-01T10:00:00+00:00"]
    when = http.post("/v1/previews", json={"when": "every monday at 8am", "timezone": "Europe/Paris",
                                           "after": "2026-01-01T00:00:00+00:00", "count": 2}).json()
    assert when["cron"] == "0 8 * * 1" and when["next_fires"] == ["2026-01-05T07:00:00+00:00", "2026-01-12T07:00:00+00:00"]
    once = http.post("/v1/previews", json={"fire_at": "2030-05-01T09:00:00", "timezone": "Europe/Paris"}).json()
    assert once == {"kind": "once", "cron": None, "timezone": "Europe/Paris", "fire_at": "2030-05-01T07:00:00+00:00",
                    "human_readable": "Once, at 2030-05-01 07:00:00 UTC", "next_fires": ["2030-05-01T07:00:00+00:00"]}
    now = http.post("/v1/previews", json={"every": "1m"}).json()["next_fires"]
    first = dt.datetime.fromisoformat(now[0])
    assert dt.timedelta(0) < first - dt.datetime.now(UTC) <= dt.timedelta(minutes=1, seconds=5)
    bad(http.post("/v1/previews", json={"cron": "0 9 *"}), "3 fields")
    bad(http.post("/v1/previews", json={"every": "5m", "count": 101}), "count")
    bad(http.post("/v1/previews", json={"every": "5m", "after": "later"}), "ISO 8601")


def test_the_server_scheduler_fires_a_one_shot_and_deletes_it(http, queue, name):
    fire_at = (dt.datetime.now(UTC) + dt.timedelta(seconds=1)).isoformat()
    r = http.post("/v1/schedules", json={"name": name, "fire_at": fire_at, "target": queue, "message": "ping"})
    assert r.status_code == 201 and r.json()["kind"] == "once"
    deadline = time.monotonic() + 15
    got = []
    while not got and time.monotonic() < deadline:
        got = http.get(f"/v1/queues/{queue}/messages", params={"wait": 2}).json()
    assert [m["message"] for m in got] == ["ping"]
    assert got[0]["headers"]["_schedule"]["out_of_band"] is False
    assert dt.datetime.fromisoformat(got[0]["headers"]["_schedule"]["scheduled_for"]) == \
        dt.datetime.fromisoformat(fire_at)
    assert http.get(f"/v1/schedules/{name}").status_code == 404
    assert "schedule_fires_total" in httpx.get(f"{http.base_url}/metrics").text


def test_openapi_lists_the_schedule_endpoints(http):
    paths = http.get("/v1/openapi.json").json()["paths"]
    assert {"get", "post"} <= set(paths["/v1/schedules"])
    assert {"get", "put", "patch", "delete"} <= set(paths["/v1/schedules/{name}"])
    assert "post" in paths["/v1/schedules/{name}/runs"] and "post" in paths["/v1/previews"]


def test_topic_targets_through_the_server(http, queue, name):
    """A one-shot fired by the server's scheduler and a manual run, both published to a
    routing key whose subscription delivers signed envelopes into a queue."""
    key = f"sched.{name}"
    r = http.post(f"/v1/events/{key}.%23/subscriptions", json={"queue_name": queue, "envelope": True})
    assert r.status_code == 201, r.text
    fire_at = (dt.datetime.now(UTC) + dt.timedelta(seconds=1)).isoformat()
    assert http.post("/v1/schedules", json={"name": name, "fire_at": fire_at, "target_kind": "topic",
                                            "target": f"{key}.tick", "message": {"n": 1}}).status_code == 201
    deadline = time.monotonic() + 15
    got = []
    while not got and time.monotonic() < deadline:
        got = http.get(f"/v1/queues/{queue}/messages", params={"wait": 2}).json()
    [m] = got
    envelope = m["message"]
    assert envelope["TopicArn"].endswith(f":{key}.tick") and envelope["Message"] == '{"n":1}'
    assert envelope["Signature"] and re.search(r"/SimpleNotificationService-[0-9a-f]{32}\.pem$", envelope["SigningCertURL"])
    sched = json.loads(envelope["MessageAttributes"]["_schedule"]["Value"])
    assert sched["name"] == name and sched["out_of_band"] is False
    assert http.get(f"/v1/schedules/{name}").status_code == 404  # the one-shot is gone

    assert http.put(f"/v1/schedules/{name}", json={"every": "1h", "target_kind": "topic", "target": f"{key}.run",
                                                  "message": "manual"}).status_code == 201
    run = http.post(f"/v1/schedules/{name}/runs").json()
    assert run["queues"] == [queue] and run["msg_ids"] == []
    [m] = http.get(f"/v1/queues/{queue}/messages", params={"wait": 5}).json()
    assert m["message"]["Message"] == "manual" and m["message"]["MessageId"] == run["message_id"]


def test_a_missing_target_queue_is_warned_of_at_once(http, queue, name):
    missing = unique_name("nosuchq")
    r = http.post("/v1/schedules", json={"name": name, "every": "5m", "target": missing})
    assert r.status_code == 201, r.text
    [warning] = r.json()["warnings"]
    assert f"queue {missing!r} does not exist" in warning and "pauses after 5 failures" in warning
    assert "warnings" not in http.get(f"/v1/schedules/{name}").json()  # said when saved, not stored
    fixed = http.patch(f"/v1/schedules/{name}", json={"target": queue})
    assert fixed.status_code == 200 and "warnings" not in fixed.json()
    again = http.put(f"/v1/schedules/{name}", json={"every": "5m", "target": missing})
    assert again.status_code == 200 and again.json()["warnings"]
