"""Queen's create-on-push within bounds (issue 25, item 6): a push creates the queues it
names only for the roles CONVEYOR_QUEEN_CREATE_ON_PUSH allows, at most
CONVEYOR_QUEEN_CREATE_PER_PUSH of them, and none once CONVEYOR_QUEEN_CREATE_MAX_QUEUES
partitioned queues exist; beyond, 403 in Queen's error format and nothing created. Each
role in token mode, through raw HTTP and Queen's own client (queen-mq 1.3.0)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest
from queen import Queen

from support.server import ServerProcess

TOKENS = "admin-token:admin,writer-token:write,reader-token:read"
ROLES = {"admin": "admin-token", "write": "writer-token", "read": "reader-token"}
MODES = ("any", "admin", "off")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _as(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ROLES[role]}"}


def _env(mode: str, **more: str) -> dict[str, str]:
    return {"CONVEYOR_AUTH": "token", "CONVEYOR_AUTH_TOKENS": TOKENS, "CONVEYOR_QUEEN_CREATE_ON_PUSH": mode,
            "CONVEYOR_QUEEN_CREATE_PER_PUSH": "3", **more}


@pytest.fixture(scope="module")
def servers(module_dsn):
    started: dict[str, ServerProcess] = {}
    try:
        for mode in MODES:
            started[mode] = ServerProcess(module_dsn, env=_env(mode)).start()
        yield started
    finally:
        for proc in started.values():
            proc.kill()


def _push(url: str, role: str, *queues: str) -> httpx.Response:
    return httpx.post(url + "/api/v1/push", headers=_as(role),
                      json={"items": [{"queue": q, "payload": {"to": q}} for q in queues]})


def _exists(url: str, queue: str) -> bool:
    r = httpx.get(f"{url}/api/v1/resources/queues/{queue}", headers=_as("admin"))
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def _created_on_push(url: str) -> float:
    found = re.search(r"^pqueue_queues_created_on_push_total (\S+)$", httpx.get(url + "/metrics").text, re.M)
    assert found, "the counter is exported from the start"
    return float(found.group(1))


# (mode, role) -> what a push naming a queue that does not exist gets
CREATES = {("any", "admin"): 201, ("any", "write"): 201, ("admin", "admin"): 201}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("role", ["read", "write", "admin"])
def test_who_may_create_a_queue_by_pushing(servers, mode, role):
    url = servers[mode].url
    queue = _name(f"{mode}-{role}")
    before = _created_on_push(url)
    r = _push(url, role, queue)
    if role == "read":
        assert r.status_code == 403 and r.json()["code"] == "PermissionDenied", r.text  # may not push at all
    elif (mode, role) in CREATES:
        assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text
    else:
        body = r.json()
        assert r.status_code == 403 and body["code"] == "QueueLimitReached", r.text
        assert queue in body["error"] and "/api/v1/configure" in body["error"]
    assert _exists(url, queue) is (r.status_code == 201)
    assert _created_on_push(url) == before + (1 if r.status_code == 201 else 0)
    # a queue that exists takes pushes from every role that may push, whatever the mode
    existing = _name("configured")
    assert httpx.post(url + "/api/v1/configure", json={"queue": existing}, headers=_as("admin")).status_code == 200
    r = _push(url, role, existing)
    assert r.status_code == (403 if role == "read" else 201), r.text


@pytest.mark.parametrize("mode", ["admin", "off"])
async def test_queens_client_and_transactions_are_refused_alike(servers, mode):
    """A write token's pushes and transactions through Queen's client: refused when they
    would create a queue (nothing of the transaction is kept), served when they do not."""
    url = servers[mode].url
    src, new = _name("src"), _name("new")
    async with Queen(url, bearer_token=ROLES["admin"], retry_attempts=1) as admin:
        await admin.queue(src).create()
    async with Queen(url, bearer_token=ROLES["write"], retry_attempts=1) as writer:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await writer.queue(new).push([{"data": 1}])
        assert refused.value.response.status_code == 403
        assert refused.value.code == "QueueLimitReached"  # type: ignore[attr-defined]
        await writer.queue(src).push([{"data": {"n": 1}}])
        [msg] = await writer.queue(src).pop()
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await writer.transaction().ack(msg).queue(new).push([{"data": 2}]).commit()
        assert refused.value.response.status_code == 403
        assert not _exists(url, new)
        done = await writer.transaction().ack(msg).queue(src).push([{"data": {"n": 2}}]).commit()
        assert done["success"] is True  # the ack was not spent by the refused transaction


def test_a_push_creates_at_most_its_share(servers):
    """One push created 2,000 queues; now at most CONVEYOR_QUEEN_CREATE_PER_PUSH (3 here),
    or none."""
    url = servers["any"].url
    before = _created_on_push(url)
    flood = [_name("flood") for _ in range(2000)]
    r = _push(url, "write", *flood)
    assert r.status_code == 403 and r.json()["code"] == "QueueLimitReached"
    assert "2000 queues that do not exist" in r.json()["error"] and "at most 3" in r.json()["error"]
    listed = httpx.get(url + "/api/v1/resources/queues", params={"limit": 10000}, headers=_as("read")).json()
    assert not {q["name"] for q in listed["queues"]} & set(flood)
    four = [_name("four") for _ in range(4)]
    assert _push(url, "admin", *four).status_code == 403  # admins too: configure creates any number
    three = four[:3]
    r = _push(url, "write", *three, *three)  # each named twice: three queues
    assert r.status_code == 201 and all(_exists(url, q) for q in three)
    assert _created_on_push(url) == before + 3
    r = _push(url, "write", "bad name!")
    assert r.status_code == 400 and "invalid queue name" in r.json()["error"]


async def test_pushes_create_no_queue_past_the_bound_even_at_once(dsn):
    """CONVEYOR_QUEEN_CREATE_MAX_QUEUES bounds the partitioned queues pushes may create up
    to; concurrent pushes cannot overshoot it together, and configuring still creates."""
    server = ServerProcess(dsn, env=_env("any", CONVEYOR_QUEEN_CREATE_MAX_QUEUES="5")).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for q in ("first", "second"):
                assert (await c.post("/api/v1/configure", json={"queue": q}, headers=_as("admin"))).status_code == 200
            answers = await asyncio.gather(*(
                c.post("/api/v1/push", headers=_as("write"), json={"items": [{"queue": f"racer-{i}", "payload": i}]})
                for i in range(20)))
            codes = sorted(r.status_code for r in answers)
            assert codes == [201] * 3 + [403] * 17, codes
            refusal = next(r.json() for r in answers if r.status_code == 403)
            assert refusal["code"] == "QueueLimitReached" and "5" in refusal["error"]
            overview = (await c.get("/api/v1/resources/overview", headers=_as("read"))).json()
            assert overview["queues"] == 5
            winner = next(r.json()[0]["queue"] for r in answers if r.status_code == 201)
            again = await c.post("/api/v1/push", headers=_as("write"),
                                 json={"items": [{"queue": q, "payload": 0} for q in ("first", winner)]})
            assert again.status_code == 201  # queues that exist take pushes
            assert (await c.post("/api/v1/configure", json={"queue": "sixth"}, headers=_as("admin"))).status_code == 200
            metrics = (await c.get("/metrics")).text
        assert re.search(r"^pqueue_queues_created_on_push_total 3.0$", metrics, re.M)
    finally:
        server.kill()
