"""REST /v1/streams end to end, against a real server that ticks every 0.5 s and runs
stream maintenance every 0.5 s too (so nacked events come back within a second or two).
Test streams tick as soon as events arrive (ticker_max_lag 0) and at least every second."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from openapi_spec_validator import validate

from conftest import unique_name
from support.server import ServerProcess

FAST = {"ticker_max_lag": 0, "ticker_idle_period": 1}


@pytest.fixture(scope="module")
def stream_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_STREAM_MAINT_INTERVAL": "0.5"}).start()
    yield proc
    proc.kill()


@pytest.fixture
def http(stream_server):
    with stream_server.client() as client:
        yield client


@pytest.fixture
def stream_name() -> str:
    return unique_name("s")


@pytest.fixture
def s(http, stream_name):
    """A fast-ticking stream; its path."""
    r = http.post("/v1/streams", json={"name": stream_name, **FAST})
    assert r.status_code == 201, r.text
    return f"/v1/streams/{stream_name}"


def subscribe(http, s, *consumers):
    for c in consumers:
        assert http.post(f"{s}/consumers", json={"name": c}).status_code == 201


def receive(http, s, consumer, wait=10, max=1000, after=None):
    params = {"wait": wait, "max": max} | ({"after": after} if after is not None else {})
    r = http.get(f"{s}/consumers/{consumer}/batch", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def receive_all(http, s, consumer, n, deadline=15.0):
    """Receive and acknowledge batches until n events arrived."""
    events, stop = [], time.monotonic() + deadline
    while len(events) < n and time.monotonic() < stop:
        batch = receive(http, s, consumer, wait=5)
        if batch["events"]:
            assert batch["batch_id"] is not None
            events += batch["events"]
            assert http.post(f"{s}/batches/{batch['batch_id']}/ack").status_code == 204
    return events


def error(r, status, code):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    return body["error"]


# -- streams ---------------------------------------------------------------------------

def test_create_list_get_patch_delete(http, stream_name):
    r = http.post("/v1/streams", json={"name": stream_name, "ticker_max_lag": 0.25, "ticker_idle_period": 1,
                                       "max_retries": 3, "event_ttl": 86400})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v1/streams/{stream_name}"
    created = r.json()
    assert created["name"] == stream_name
    assert created["ticker_max_lag"] == 0.25 and created["ticker_idle_period"] == 1.0
    assert created["rotation_period"] == 7200.0 and created["ticker_max_count"] == 500
    assert created["max_retries"] == 3 and created["event_ttl"] == 86400.0
    assert created["ticker_paused"] is False and created["consumers"] == 0
    assert created["created_at"].endswith("+00:00")

    # again: the existing stream if every given option matches, else 409
    again = http.post("/v1/streams", json={"name": stream_name, "max_retries": 3})
    assert again.status_code == 201 and again.json() == created
    assert http.post("/v1/streams", json={"name": stream_name}).status_code == 201
    msg = error(http.post("/v1/streams", json={"name": stream_name, "max_retries": 4}), 409, "Conflict")
    assert "max_retries is 3" in msg

    assert stream_name in [x["name"] for x in http.get("/v1/streams").json()]

    s = f"/v1/streams/{stream_name}"
    subscribe(http, s, "c1")
    detail = http.get(s).json()
    assert {k: detail[k] for k in created if k != "consumers"} == {k: v for k, v in created.items() if k != "consumers"}
    assert detail["consumers"] == 1
    assert detail["stats"]["stream"] == stream_name and detail["stats"]["consumers"] == 1
    assert detail["stats"]["rotation_period"] == 7200.0 and detail["stats"]["dead_letters"] == 0
    [c1] = detail["consumer_stats"]
    assert c1["name"] == "c1" and c1["batch_active"] is False and c1["batch_id"] is None
    assert c1["pending_events"] == 0

    r = http.patch(s, json={"ticker_paused": True, "max_retries": 0, "rotation_period": 60.5, "event_ttl": None})
    assert r.status_code == 200, r.text
    patched = r.json()
    assert patched["ticker_paused"] is True and patched["max_retries"] == 0
    assert patched["rotation_period"] == 60.5 and patched["event_ttl"] is None
    assert patched["ticker_max_lag"] == 0.25, "options left out are unchanged"
    assert http.patch(s, json={}).json() == patched

    stats = http.get(f"{s}/stats").json()
    assert stats["stream"] == stream_name and stats["ticker_paused"] is True
    assert isinstance(stats["rotation_age"], float) and stats["depth"] == 0
    checks = {h["check"]: h["status"] for h in stats["health"]}
    assert {"rotation", "dead_letters", "consumer_lag:c1"} <= set(checks)
    assert "ticker" not in checks, "a paused stream's ticker is not checked"

    assert http.delete(s).status_code == 204
    error(http.delete(s), 404, "StreamNotFound")
    error(http.get(s), 404, "StreamNotFound")
    assert stream_name not in [x["name"] for x in http.get("/v1/streams").json()]


def test_intervals_are_seconds_with_microseconds(http, stream_name):
    r = http.post("/v1/streams", json={"name": stream_name, "rotation_period": 315360000, "ticker_max_lag": 0.000001,
                                       "ticker_idle_period": 90061.5, "event_ttl": 0.25})
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["rotation_period"], got["ticker_max_lag"], got["ticker_idle_period"], got["event_ttl"]) == (
        315360000.0, 0.000001, 90061.5, 0.25)
    assert http.post("/v1/streams", json={"name": stream_name, "ticker_idle_period": 90061.5}).status_code == 201
    r = http.patch(f"/v1/streams/{stream_name}", json={"ticker_max_lag": 2, "max_retries": 7.0})
    assert (r.json()["ticker_max_lag"], r.json()["max_retries"]) == (2.0, 7)


def test_append_single_and_batch_payloads_round_trip(http, s):
    subscribe(http, s, "c")
    r = http.post(f"{s}/events", json={"payload": {"order": 1, "items": [1, 2, {"x": None}]}, "type": "order.created",
                                       "extra1": "tenant-7", "extra4": "trace"})
    assert r.status_code == 201, r.text
    first = r.json()["id"]
    values = [[1, "two"], 3.5, True, None, 0, {"ü": "🎉"}]
    texts = ["plain", '{"looks": "like json" }', "  spaces  ", "ünï 🎉", "a\r\nb\tc", "", "42"]
    batch = [{"payload": v} for v in values] + [{"payload": t, "type": "text"} for t in texts]
    r = http.post(f"{s}/events", json=batch)
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]
    assert len(ids) == len(values) + len(texts) and ids == sorted(ids) and ids[0] > first

    events = receive_all(http, s, "c", 1 + len(ids))
    assert [e["id"] for e in events] == [first, *ids]
    head = events[0]
    assert json.loads(head["payload"]) == {"order": 1, "items": [1, 2, {"x": None}]}
    assert head["payload"] == '{"order":1,"items":[1,2,{"x":null}]}', "compact JSON text"
    assert (head["type"], head["extra1"], head["extra2"], head["extra3"], head["extra4"]) == (
        "order.created", "tenant-7", None, None, "trace")
    assert head["retry_count"] is None and head["created_at"].endswith("+00:00")
    assert [json.loads(e["payload"]) for e in events[1:1 + len(values)]] == values
    assert [e["type"] for e in events[1:1 + len(values)]] == ["default"] * len(values)
    assert [e["payload"] for e in events[1 + len(values):]] == texts, "strings are stored byte-exact"


def test_consumers_fan_out(http, s):
    subscribe(http, s, "a", "b")
    r = http.post(f"{s}/consumers", json={"name": "a"})
    assert r.status_code == 200 and r.json() == {"stream": s.rsplit("/", 1)[1], "name": "a"}
    ids = http.post(f"{s}/events", json=[{"payload": str(i)} for i in range(5)]).json()["ids"]
    batch_a, batch_b = receive(http, s, "a"), receive(http, s, "b")
    for batch in (batch_a, batch_b):
        assert [e["id"] for e in batch["events"]] == ids, "each consumer receives every event"
        assert [e["payload"] for e in batch["events"]] == [str(i) for i in range(5)]
    assert batch_a["batch_id"] != batch_b["batch_id"]

    listed = {c["name"]: c for c in http.get(f"{s}/consumers").json()}
    assert set(listed) == {"a", "b"}
    assert listed["a"]["batch_active"] is True and listed["a"]["batch_id"] == batch_a["batch_id"]
    assert isinstance(listed["a"]["batch_age"], float)

    assert http.delete(f"{s}/consumers/b").status_code == 204
    error(http.delete(f"{s}/consumers/b"), 404, "ConsumerNotFound")
    error(http.get(f"{s}/consumers/b/batch"), 404, "ConsumerNotFound")
    assert [c["name"] for c in http.get(f"{s}/consumers").json()] == ["a"]


def test_a_batch_received_in_part_cannot_be_acknowledged(http, s):
    """max cuts a batch into pages: the answer says so, and acknowledging before the last
    page was received is refused, so no event is finished unseen."""
    subscribe(http, s, "c")
    ids = http.post(f"{s}/events", json=[{"payload": str(i)} for i in range(5)]).json()["ids"]
    first = receive(http, s, "c", max=2)
    assert [e["id"] for e in first["events"]] == ids[:2] and first["complete"] is False
    batch = first["batch_id"]
    assert "after" in error(http.post(f"{s}/batches/{batch}/ack"), 409, "BatchPartlyReceived")
    second = receive(http, s, "c", max=2, after=ids[1])
    assert [e["id"] for e in second["events"]] == ids[2:4] and second["complete"] is False
    error(http.post(f"{s}/batches/{batch}/ack"), 409, "BatchPartlyReceived")
    last = receive(http, s, "c", max=2, after=ids[3])
    assert [e["id"] for e in last["events"]] == ids[4:] and last["complete"] is True
    assert http.post(f"{s}/batches/{batch}/ack").status_code == 204


def test_the_open_batch_until_ack_then_the_next(http, s):
    subscribe(http, s, "c")
    ids = http.post(f"{s}/events", json=[{"payload": "one"}, {"payload": "two"}, {"payload": "three"}]).json()["ids"]
    part = receive(http, s, "c", max=2)
    assert [e["id"] for e in part["events"]] == ids[:2]
    whole = receive(http, s, "c", wait=0)
    assert whole["batch_id"] == part["batch_id"] and [e["id"] for e in whole["events"]] == ids
    assert http.post(f"{s}/batches/{whole['batch_id']}/ack").status_code == 204
    assert receive(http, s, "c", wait=0) == {"batch_id": None, "events": [], "complete": True}
    error(http.post(f"{s}/batches/{whole['batch_id']}/ack"), 404, "BatchNotFound")

    later = http.post(f"{s}/events", json={"payload": "four"}).json()["id"]
    nxt = receive(http, s, "c")
    assert [e["id"] for e in nxt["events"]] == [later] and nxt["batch_id"] != whole["batch_id"]


def test_nack_retries_for_that_consumer_only(http, s):
    subscribe(http, s, "a", "b")
    eid = http.post(f"{s}/events", json={"payload": "flaky", "extra2": "x"}).json()["id"]
    batch = receive(http, s, "a")
    r = http.post(f"{s}/batches/{batch['batch_id']}/nack", json={"event_id": eid, "retry_after": 0})
    assert r.status_code == 200 and r.json() == {"outcome": "retry"}
    assert http.post(f"{s}/batches/{batch['batch_id']}/ack").status_code == 204

    [again] = receive_all(http, s, "a", 1)
    assert (again["id"], again["payload"], again["extra2"], again["retry_count"]) == (eid, "flaky", "x", 1)
    [seen_by_b] = receive_all(http, s, "b", 1)
    assert seen_by_b["id"] == eid and seen_by_b["retry_count"] is None
    assert receive(http, s, "b", wait=2)["events"] == [], "the retry is a's alone"


def test_nack_with_retry_after_keeps_it_back(http, s):
    subscribe(http, s, "c")
    eid = http.post(f"{s}/events", json={"payload": "later"}).json()["id"]
    batch = receive(http, s, "c")
    assert http.post(f"{s}/batches/{batch['batch_id']}/nack",
                     json={"event_id": eid, "retry_after": 3600, "reason": "not now"}).json() == {"outcome": "retry"}
    http.post(f"{s}/batches/{batch['batch_id']}/ack")
    assert receive(http, s, "c", wait=2)["events"] == []
    assert http.get(f"{s}/stats").json()["pending_retries"] == 1


def test_dead_letters_nack_past_max_retries_replay_and_purge(http, stream_name):
    s = f"/v1/streams/{stream_name}"
    assert http.post("/v1/streams", json={"name": stream_name, **FAST, "max_retries": 1}).status_code == 201
    subscribe(http, s, "c")
    eid = http.post(f"{s}/events", json={"payload": {"n": 1}, "type": "job", "extra3": "e3"}).json()["id"]

    batch = receive(http, s, "c")
    assert http.post(f"{s}/batches/{batch['batch_id']}/nack", json={"event_id": eid, "retry_after": 0}).json() == {
        "outcome": "retry"}
    http.post(f"{s}/batches/{batch['batch_id']}/ack")
    batch = receive(http, s, "c")
    assert [(e["id"], e["retry_count"]) for e in batch["events"]] == [(eid, 1)]
    r = http.post(f"{s}/batches/{batch['batch_id']}/nack", json={"event_id": eid, "reason": "broken"})
    assert r.json() == {"outcome": "dead"}
    http.post(f"{s}/batches/{batch['batch_id']}/ack")

    [dead] = http.get(f"{s}/dead-letters").json()
    assert dead["consumer"] == "c" and dead["reason"] == "broken" and dead["dead_at"].endswith("+00:00")
    assert dead["event"] == {**dead["event"], "id": eid, "type": "job", "payload": '{"n":1}', "retry_count": 1,
                             "extra1": None, "extra3": "e3"}
    assert http.get(f"{s}/stats").json()["dead_letters"] == 1

    # replay one: a new event every consumer sees
    r = http.post(f"{s}/dead-letters/{dead['id']}/replay")
    assert r.status_code == 200, r.text
    new_id = r.json()["event_id"]
    assert new_id > eid and http.get(f"{s}/dead-letters").json() == []
    error(http.post(f"{s}/dead-letters/{dead['id']}/replay"), 404, "DeadLetterNotFound")
    batch = receive(http, s, "c")
    assert [(e["id"], e["payload"], e["type"], e["extra3"], e["retry_count"]) for e in batch["events"]] == [
        (new_id, '{"n":1}', "job", "e3", None)]

    # the dead-letter endpoint, replay all, purge
    r = http.post(f"{s}/batches/{batch['batch_id']}/dead-letter", json={"event_id": new_id, "reason": "poison"})
    assert r.status_code == 204, r.text
    http.post(f"{s}/batches/{batch['batch_id']}/ack")
    [dead] = http.get(f"{s}/dead-letters", params={"max": 10}).json()
    assert dead["reason"] == "poison" and dead["event"]["id"] == new_id
    assert http.post(f"{s}/dead-letters/replay").json() == {"replayed": 1}
    assert http.post(f"{s}/dead-letters/replay").json() == {"replayed": 0}
    batch = receive(http, s, "c")
    [event] = batch["events"]
    assert event["payload"] == '{"n":1}'
    http.post(f"{s}/batches/{batch['batch_id']}/dead-letter", json={"event_id": event["id"]})
    http.post(f"{s}/batches/{batch['batch_id']}/ack")
    assert http.get(f"{s}/dead-letters").json()[0]["reason"] == "dead-lettered by consumer"
    assert http.request("DELETE", f"{s}/dead-letters", params={"older_than": 3600}).json() == {"purged": 0}
    assert http.request("DELETE", f"{s}/dead-letters").json() == {"purged": 1}
    assert http.get(f"{s}/dead-letters").json() == []


def test_a_dead_letter_of_another_stream_is_not_found(http, s, stream_name):
    other = unique_name("s")
    http.post("/v1/streams", json={"name": other, **FAST})
    subscribe(http, f"/v1/streams/{other}", "c")
    eid = http.post(f"/v1/streams/{other}/events", json={"payload": "x"}).json()["id"]
    batch = receive(http, f"/v1/streams/{other}", "c")
    # a batch of another stream is not this stream's
    error(http.post(f"{s}/batches/{batch['batch_id']}/ack"), 404, "BatchNotFound")
    error(http.post(f"{s}/batches/{batch['batch_id']}/dead-letter", json={"event_id": eid}), 404, "BatchNotFound")
    http.post(f"/v1/streams/{other}/batches/{batch['batch_id']}/dead-letter", json={"event_id": eid})
    [dead] = http.get(f"/v1/streams/{other}/dead-letters").json()
    error(http.post(f"{s}/dead-letters/{dead['id']}/replay"), 404, "DeadLetterNotFound")
    assert len(http.get(f"/v1/streams/{other}/dead-letters").json()) == 1


# -- long polling ----------------------------------------------------------------------

async def _client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=60,
                             limits=httpx.Limits(max_connections=200, max_keepalive_connections=200))


async def test_long_poll_returns_promptly_after_an_append(stream_server, s):
    async with await _client(stream_server) as c:
        assert (await c.post(f"{s}/consumers", json={"name": "c"})).status_code == 201
        waiting = asyncio.create_task(c.get(f"{s}/consumers/c/batch", params={"wait": 15}))
        await asyncio.sleep(1.5)
        assert not waiting.done()
        appended = time.monotonic()
        eid = (await c.post(f"{s}/events", json={"payload": "wake"})).json()["id"]
        r = await waiting
        assert time.monotonic() - appended < 8, "woken by the tick, not at the end of the wait"
        assert [e["id"] for e in r.json()["events"]] == [eid]


async def test_long_poll_times_out_empty(stream_server, s):
    async with await _client(stream_server) as c:
        await c.post(f"{s}/consumers", json={"name": "c"})
        started = time.monotonic()
        r = await c.get(f"{s}/consumers/c/batch", params={"wait": 1.5})
        assert r.json() == {"batch_id": None, "events": [], "complete": True}
        assert 1.4 <= time.monotonic() - started < 5


async def test_long_pollers_hold_no_database_connection(stream_server, s):
    pollers = 40  # more than the server's pool (16 connections)
    async with await _client(stream_server) as c:
        for i in range(pollers):
            await c.post(f"{s}/consumers", json={"name": f"c{i}"})
        tasks = [asyncio.create_task(c.get(f"{s}/consumers/c{i}/batch", params={"wait": 15}))
                 for i in range(pollers)]
        # every poller parked, and then the pool (almost) idle: waited for rather than
        # slept on (a poller holds a connection for its first look, which a busy machine
        # stretches), well within the pollers' 15 s
        deadline = time.monotonic() + 10
        while True:
            metrics = (await c.get("/metrics")).text
            parked, active = _metric(metrics, "queue_long_pollers"), _metric(metrics, "db_pool_active")
            if (parked == pollers and active <= 2) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert parked == pollers, "every poller is parked"
        assert active <= 2
        assert (await c.get("/readyz")).status_code == 200, "the pool is free while they wait"
        eid = (await c.post(f"{s}/events", json={"payload": "all"})).json()["id"]
        results = await asyncio.gather(*tasks)
        assert all([e["id"] for e in r.json()["events"]] == [eid] for r in results)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    pytest.fail(f"metric {name} not found")


# -- errors ----------------------------------------------------------------------------

def test_unknown_stream_consumer_batch_are_404(http, s):
    gone = "/v1/streams/" + unique_name("nope")
    for method, path, body in [
        ("GET", gone, None), ("PATCH", gone, {"max_retries": 1}), ("DELETE", gone, None),
        ("GET", gone + "/stats", None), ("POST", gone + "/events", {"payload": "x"}),
        ("POST", gone + "/events", [{"payload": "x"}]), ("GET", gone + "/consumers", None),
        ("POST", gone + "/consumers", {"name": "c"}), ("DELETE", gone + "/consumers/c", None),
        ("GET", gone + "/consumers/c/batch", None), ("POST", gone + "/batches/1/ack", None),
        ("POST", gone + "/batches/1/nack", {"event_id": 1}),
        ("POST", gone + "/batches/1/dead-letter", {"event_id": 1}), ("GET", gone + "/dead-letters", None),
        ("DELETE", gone + "/dead-letters", None), ("POST", gone + "/dead-letters/replay", None),
        ("POST", gone + "/dead-letters/1/replay", None),
    ]:
        r = http.request(method, path, json=body)
        assert "does not exist" in error(r, 404, "StreamNotFound"), (method, path)

    error(http.get(f"{s}/consumers/nobody/batch"), 404, "ConsumerNotFound")
    error(http.delete(f"{s}/consumers/nobody"), 404, "ConsumerNotFound")
    assert http.get(f"{s}/consumers").json() == []
    for action, body in [("ack", None), ("nack", {"event_id": 1}), ("dead-letter", {"event_id": 1})]:
        error(http.post(f"{s}/batches/123456789/{action}", json=body), 404, "BatchNotFound")
    error(http.post(f"{s}/dead-letters/123456789/replay"), 404, "DeadLetterNotFound")


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("POST", "", {"max_retries": 1}, "name"),
    ("POST", "", {"name": "bad name"}, "name"),
    ("POST", "", {"name": "x" * 81}, "name"),
    ("POST", "", {"name": "ok", "rotation_period": 0.5}, "rotation_period"),
    ("POST", "", {"name": "ok", "rotation_period": None}, "rotation_period"),
    ("POST", "", {"name": "ok", "ticker_max_lag": -1}, "ticker_max_lag"),
    ("POST", "", {"name": "ok", "ticker_max_lag": "3"}, "ticker_max_lag"),
    ("POST", "", {"name": "ok", "ticker_idle_period": 1e12}, "ticker_idle_period"),
    ("POST", "", {"name": "ok", "ticker_max_count": 0}, "ticker_max_count"),
    ("POST", "", {"name": "ok", "max_retries": 1001}, "max_retries"),
    ("POST", "", {"name": "ok", "max_retries": True}, "max_retries"),
    ("POST", "", {"name": "ok", "event_ttl": 0}, "event_ttl"),
    ("POST", "", {"name": "ok", "colour": "red"}, "colour"),
    ("POST", "", [], "body"),
    ("PATCH", "/{s}", {"ticker_paused": "yes"}, "ticker_paused"),
    ("PATCH", "/{s}", {"ticker_max_count": None}, "ticker_max_count"),
    ("PATCH", "/{s}", {"name": "renamed"}, "name"),
    ("POST", "/{s}/events", {}, "payload"),
    ("POST", "/{s}/events", {"payload": "x", "type": ""}, "type"),
    ("POST", "/{s}/events", {"payload": "x", "type": 3}, "type"),
    ("POST", "/{s}/events", {"payload": "x", "extra5": "y"}, "extra5"),
    ("POST", "/{s}/events", {"payload": "x", "extra1": 1}, "extra1"),
    ("POST", "/{s}/events", [], "at least 1"),
    ("POST", "/{s}/events", [{"payload": "x"}, {"type": "t"}], "1.payload"),
    ("POST", "/{s}/events", "just a string", "event object"),
    ("POST", "/{s}/events", 7, "event object"),
    ("POST", "/{s}/consumers", {}, "name"),
    ("POST", "/{s}/consumers", {"name": "."}, "name"),
    ("POST", "/{s}/consumers", {"name": "a/b"}, "name"),
    ("POST", "/{s}/consumers", {"name": "c", "group": "g"}, "group"),
    ("GET", "/{s}/consumers/c/batch?max=0", None, "max"),
    ("GET", "/{s}/consumers/c/batch?max=10001", None, "max"),
    ("GET", "/{s}/consumers/c/batch?max=many", None, "max"),
    ("GET", "/{s}/consumers/c/batch?wait=21", None, "wait"),
    ("GET", "/{s}/consumers/c/batch?wait=-1", None, "wait"),
    ("GET", "/{s}/consumers/c/batch?vt=30", None, "vt"),
    ("GET", "/{s}/consumers/bad%20name/batch", None, "consumer name"),
    ("POST", "/{s}/batches/1/nack", {}, "event_id"),
    ("POST", "/{s}/batches/1/nack", {"event_id": 0}, "event_id"),
    ("POST", "/{s}/batches/1/nack", {"event_id": 2**63}, "event_id"),
    ("POST", "/{s}/batches/1/nack", {"event_id": 1, "retry_after": -1}, "retry_after"),
    ("POST", "/{s}/batches/1/nack", {"event_id": 1, "retry_after": 1.5}, "retry_after"),
    ("POST", "/{s}/batches/1/nack", {"event_id": 1, "reason": 5}, "reason"),
    ("POST", "/{s}/batches/1/nack", None, "body"),
    ("POST", "/{s}/batches/1/dead-letter", {"event_id": 1, "why": "x"}, "why"),
    ("POST", "/{s}/batches/abc/ack", None, "batch id"),
    ("POST", "/{s}/batches/0/ack", None, "batch id"),
    ("POST", "/{s}/batches/99999999999999999999/ack", None, "batch id"),
    ("POST", "/{s}/batches/%C2%B2/ack", None, "batch id"),
    ("POST", "/{s}/dead-letters/-1/replay", None, "dead letter id"),
    ("GET", "/{s}/dead-letters?max=0", None, "max"),
    ("DELETE", "/{s}/dead-letters?older_than=-5", None, "older_than"),
    ("DELETE", "/{s}/dead-letters?older_than=soon", None, "older_than"),
    ("GET", "/bad.name", None, "stream name"),
    ("DELETE", "/bad%20name", None, "stream name"),
])
def test_bad_input_is_400_naming_the_field(http, s, method, path, body, field):
    url = "/v1/streams" + path.replace("/{s}", "/" + s.rsplit("/", 1)[1])
    subscribe_first = "/consumers/c/batch" in url
    if subscribe_first:
        http.post(f"{s}/consumers", json={"name": "c"})
    r = http.request(method, url, json=body) if body is not None else http.request(method, url)
    assert field in error(r, 400, "InvalidInput")


def test_bodies_that_are_not_json_are_400(http, s):
    for path in ("/v1/streams", f"{s}/events", f"{s}/consumers", f"{s}/batches/1/nack"):
        r = http.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert "not valid JSON" in error(r, 400, "InvalidInput")
    assert "required" in error(http.patch(s), 400, "InvalidInput")


def test_an_event_not_in_the_batch_is_400(http, s):
    subscribe(http, s, "c")
    eid = http.post(f"{s}/events", json={"payload": "x"}).json()["id"]
    batch = receive(http, s, "c")
    msg = error(http.post(f"{s}/batches/{batch['batch_id']}/nack", json={"event_id": eid + 1000}), 400, "InvalidInput")
    assert f"event {eid + 1000} is not in batch" in msg
    error(http.post(f"{s}/batches/{batch['batch_id']}/dead-letter", json={"event_id": eid + 1000}), 400, "InvalidInput")


def test_nul_characters_in_text_are_400_in_json_values_fine(http, s):
    assert "payload" in error(http.post(f"{s}/events", json={"payload": "a\u0000b"}), 400, "InvalidInput")
    assert "extra1" in error(http.post(f"{s}/events", json={"payload": "x", "extra1": "\u0000"}), 400, "InvalidInput")
    assert "reason" in error(http.post(f"{s}/batches/1/nack", json={"event_id": 1, "reason": "\u0000"}),
                             400, "InvalidInput")
    subscribe(http, s, "c")
    eid = http.post(f"{s}/events", json={"payload": {"a": "\u0000"}}).json()["id"]
    [event] = receive(http, s, "c")["events"]
    assert event["id"] == eid and json.loads(event["payload"]) == {"a": "\u0000"}


# -- roles -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "token",
                                          "CONVEYOR_AUTH_TOKENS": "r-tok:read,w-tok:write,a-tok:admin"}).start()
    yield proc
    proc.kill()


def test_roles(token_server, stream_name):
    admin, writer, reader = (httpx.Client(base_url=token_server.url, headers={"Authorization": f"Bearer {t}"})
                             for t in ("a-tok", "w-tok", "r-tok"))
    s = f"/v1/streams/{stream_name}"
    for who in (reader, writer):
        error(who.post("/v1/streams", json={"name": stream_name}), 403, "PermissionDenied")
    assert admin.post("/v1/streams", json={"name": stream_name, **FAST}).status_code == 201
    for who in (reader, writer):
        error(who.patch(s, json={"max_retries": 1}), 403, "PermissionDenied")
        error(who.delete(s), 403, "PermissionDenied")
        error(who.post(f"{s}/dead-letters/replay"), 403, "PermissionDenied")
        error(who.post(f"{s}/dead-letters/1/replay"), 403, "PermissionDenied")
        error(who.request("DELETE", f"{s}/dead-letters"), 403, "PermissionDenied")
    error(reader.post(f"{s}/consumers", json={"name": "c"}), 403, "PermissionDenied")
    assert writer.post(f"{s}/consumers", json={"name": "c"}).status_code == 201
    error(reader.post(f"{s}/events", json={"payload": "x"}), 403, "PermissionDenied")
    assert writer.post(f"{s}/events", json={"payload": "x"}).status_code == 201
    error(reader.get(f"{s}/consumers/c/batch"), 403, "PermissionDenied")
    batch = writer.get(f"{s}/consumers/c/batch", params={"wait": 10}).json()
    error(reader.post(f"{s}/batches/{batch['batch_id']}/ack"), 403, "PermissionDenied")
    assert writer.post(f"{s}/batches/{batch['batch_id']}/ack").status_code == 204
    for path in ("/v1/streams", s, f"{s}/stats", f"{s}/consumers", f"{s}/dead-letters"):
        assert reader.get(path).status_code == 200, path
    error(reader.delete(f"{s}/consumers/c"), 403, "PermissionDenied")
    assert admin.delete(s).status_code == 204


# -- the OpenAPI document --------------------------------------------------------------

def test_openapi_document_lists_the_stream_paths(http):
    doc = http.get("/v1/openapi.json").json()
    validate(doc)
    paths = doc["paths"]
    for path, methods in {
        "/v1/streams": {"get", "post"},
        "/v1/streams/{name}": {"get", "patch", "delete"},
        "/v1/streams/{name}/stats": {"get"},
        "/v1/streams/{name}/events": {"post"},
        "/v1/streams/{name}/consumers": {"get", "post"},
        "/v1/streams/{name}/consumers/{consumer}": {"delete"},
        "/v1/streams/{name}/consumers/{consumer}/batch": {"get"},
        "/v1/streams/{name}/batches/{batch_id}/ack": {"post"},
        "/v1/streams/{name}/batches/{batch_id}/nack": {"post"},
        "/v1/streams/{name}/batches/{batch_id}/dead-letter": {"post"},
        "/v1/streams/{name}/dead-letters": {"get", "delete"},
        "/v1/streams/{name}/dead-letters/replay": {"post"},
        "/v1/streams/{name}/dead-letters/{id}/replay": {"post"},
    }.items():
        assert methods == set(paths[path]), path
    name = paths["/v1/streams/{name}"]["get"]["parameters"][0]
    assert name["schema"]["pattern"] == "^[A-Za-z0-9_-]{1,80}$"
    create = doc["components"]["schemas"]["StreamCreate"]["properties"]
    assert create["ticker_max_lag"]["type"] == "number" and "seconds" in create["ticker_max_lag"]["description"]
