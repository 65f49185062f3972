"""Queen's own Python client (queen-mq 1.3.0, unmodified) against Conveyor's /api/v1:
queues and their configuration, push idempotency, pops in queue and consumer-group mode,
leases and their renewal, acks, retries and dead letters, transactions, traces, consume
with concurrency, and the admin API."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import httpx
import pytest
from queen import Queen

from support.server import ServerProcess


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(server: ServerProcess):
    # the server's default auth mode (header) wants an Authorization header: any bearer
    q = Queen(server.url, bearer_token="anything", retry_attempts=1)
    yield q
    await q.close()


async def test_push_pop_ack_in_queue_mode(client):
    queue = _name("orders")
    await client.queue(queue).config({"lease_time": 30, "retry_limit": 2, "priority": 3}).create()
    pushed = await client.queue(queue).partition("customer-1").push(
        [{"data": {"n": i}, "transactionId": f"t{i}"} for i in range(3)])
    assert [r["status"] for r in pushed] == ["queued"] * 3
    again = await client.queue(queue).partition("customer-1").push([{"data": {"n": 0}, "transactionId": "t0"}])
    assert again[0]["status"] == "duplicate"  # idempotent per (partition, transactionId)

    msgs = await client.queue(queue).batch(10).pop()
    assert [m["data"] for m in msgs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {m["partition"] for m in msgs} == {"customer-1"} and all(m["leaseId"] for m in msgs)
    assert await client.queue(queue).batch(10).wait(False).pop() == []  # the partition is leased
    result = await client.ack(msgs, True)
    assert result["success"] is True and all(r["success"] for r in result["results"])
    assert await client.queue(queue).batch(10).wait(False).pop() == []  # all done


async def test_consumer_groups_read_every_message_from_where_they_subscribed(client):
    queue = _name("events")
    await client.queue(queue).push([{"data": {"old": True}}])
    late = await client.queue(queue).group("late").subscription_mode("new").batch(10).wait(False).pop()
    assert late == []
    await client.queue(queue).push([{"data": {"new": True}}])
    for group, want in (("audit", [{"old": True}, {"new": True}]), ("late", [{"new": True}])):
        got = await client.queue(queue).group(group).batch(10).pop()
        assert [m["data"] for m in got] == want, group
        assert (await client.ack(got, True, {"group": group}))["success"]
    groups = {(g["name"], g["queueName"]) for g in await client.admin.list_consumer_groups()}
    assert {("audit", queue), ("late", queue)} <= groups


async def test_an_expired_lease_moves_on_and_fences_the_late_ack(client):
    queue = _name("slow")
    await client.queue(queue).config({"lease_time": 1}).create()
    await client.queue(queue).push([{"data": "job"}])
    [first] = await client.queue(queue).pop()
    await asyncio.sleep(1.3)
    [second] = await client.queue(queue).pop()
    assert second["transactionId"] == first["transactionId"] and second["leaseId"] != first["leaseId"]
    late = await client.ack(first, True)
    assert late["success"] is False and "lease" in late["error"].lower()
    assert (await client.ack(second, True))["success"] is True


async def test_an_ack_without_a_lease_cannot_settle_what_another_consumer_holds(client, server):
    """Issue 25, item 2: A's lease runs out, B pops the message, A acks it without a
    leaseId. Through Queen's client (a message without its leaseId), single, batch and in
    a transaction, and through raw HTTP: refused while B holds it, and B's ack succeeds."""
    queue = _name("fenced")
    await client.queue(queue).config({"lease_time": 1}).create()
    await client.queue(queue).push([{"data": "job", "transactionId": "j1"}])
    [first] = await client.queue(queue).pop()
    await asyncio.sleep(1.3)
    [second] = await client.queue(queue).pop()
    stale = {k: v for k, v in first.items() if k != "leaseId"}
    single = await client.ack(stale, True)
    assert single["success"] is False and "lease" in single["error"].lower()
    batch = await client.ack([stale], True)
    assert [r["success"] for r in batch["results"]] == [False]
    for message in (stale, first):  # no lease at all, or its own lease (sent as requiredLeases), ran out
        with pytest.raises(Exception, match="lease"):
            await client.transaction().ack(message).queue(_name("out")).push([{"data": 1}]).commit()
    auth = {"Authorization": "Bearer x"}
    key = {"transactionId": "j1", "partitionId": first["partitionId"]}
    async with httpx.AsyncClient(base_url=server.url, headers=auth) as raw:
        [one] = (await raw.post("/api/v1/ack", json={**key, "status": "completed"})).json()
        assert one["success"] is False
        [many] = (await raw.post("/api/v1/ack/batch", json={"acknowledgments": [key]})).json()
        assert many["success"] is False
        tx = (await raw.post("/api/v1/transaction", json={"operations": [{"type": "ack", **key}]})).json()
        assert tx["success"] is False and "lease" in tx["error"]
        r = await raw.post("/api/v1/transaction", json={"operations": [{"type": "ack", **key}], "requiredLeases": 7})
        assert r.status_code == 400 and "requiredLeases" in r.json()["error"]
    assert (await client.renew(second))["success"] is True  # B's lease was not touched
    done = await client.transaction().ack(second).queue(_name("out")).push([{"data": 1}]).commit()
    assert done["success"] is True
    assert await client.queue(queue).wait(False).pop() == []


async def test_an_ack_without_a_lease_settles_a_message_nobody_holds(client):
    """With no live lease on the partition, Queen's server takes an ack without a
    leaseId, and so does Conveyor."""
    queue = _name("loose")
    await client.queue(queue).config({"lease_time": 1}).create()
    await client.queue(queue).push([{"data": "job"}])
    [msg] = await client.queue(queue).pop()
    await asyncio.sleep(1.3)
    late = await client.ack({k: v for k, v in msg.items() if k != "leaseId"}, True)
    assert late["success"] is True
    assert await client.queue(queue).wait(False).pop() == []
    again = await client.ack({k: v for k, v in msg.items() if k != "leaseId"}, True)
    assert again["success"] is False and again["error"] == "Message already acknowledged"


async def test_renew_keeps_a_lease(client):
    queue = _name("long")
    await client.queue(queue).config({"lease_time": 1}).create()
    await client.queue(queue).push([{"data": "job"}])
    [msg] = await client.queue(queue).pop()
    for _ in range(3):
        await asyncio.sleep(0.6)
        renewed = await client.renew(msg)
        assert renewed["success"] is True and renewed["newExpiresAt"]
    assert await client.queue(queue).wait(False).pop() == []  # still held after 1.8 s of a 1 s lease
    assert (await client.ack(msg, True))["success"] is True
    assert (await client.renew(msg))["success"] is False  # released with the ack


async def test_failures_retry_then_land_in_the_dead_letters_and_come_back(client):
    queue = _name("flaky")
    await client.queue(queue).config({"retry_limit": 1}).create()
    await client.queue(queue).push([{"data": {"job": 1}, "transactionId": "j1"}])
    for attempt in range(2):
        [msg] = await client.queue(queue).pop()
        assert msg["retryCount"] == attempt
        assert (await client.ack(msg, False, {"error": f"boom {attempt}"}))["success"]
    assert await client.queue(queue).wait(False).pop() == []
    dlq = await client.queue(queue).dlq().limit(10).get()
    assert dlq["total"] == 1 and dlq["messages"][0]["errorMessage"] == "boom 1"
    assert dlq["messages"][0]["data"] == {"job": 1}
    looked_up = await client.admin.get_message(msg["partitionId"], "j1")
    assert looked_up["status"] == "dead_letter" and looked_up["errorMessage"] == "boom 1"
    retried = await client.admin.retry_message(msg["partitionId"], "j1")
    assert retried["success"] is True
    [back] = await client.queue(queue).pop()
    assert back["data"] == {"job": 1}


async def test_a_transaction_acks_and_pushes_together_or_not_at_all(client):
    src, dst = _name("in"), _name("out")
    await client.queue(src).config({"lease_time": 1}).create()
    await client.queue(src).push([{"data": {"order": 1}}, {"data": {"order": 2}}])
    msgs = await client.queue(src).batch(2).pop()
    done = await client.transaction().ack(msgs[0]).queue(dst).push([{"data": {"shipped": 1}}]).commit()
    assert done["success"] is True
    [out] = await client.queue(dst).pop()
    assert out["data"] == {"shipped": 1}
    await asyncio.sleep(1.3)  # msgs[1]'s lease has expired: its transaction must leave nothing
    with pytest.raises(Exception, match="lease"):
        await client.transaction().ack(msgs[1]).queue(dst).push([{"data": {"shipped": 2}}]).commit()
    assert await client.queue(dst).wait(False).pop() == []
    [again] = await client.queue(src).pop()
    assert again["data"] == {"order": 2}  # still not acknowledged


async def test_consume_with_concurrency_traces_and_several_groups(client):
    queue = _name("work")
    await client.queue(queue).push([{"data": {"n": i}} for i in range(30)])
    for p in range(5):
        await client.queue(queue).partition(f"p{p}").push([{"data": {"n": 100 + p * 10 + i}} for i in range(4)])
    seen: dict[str, list[int]] = {"billing": [], "analytics": []}

    def handler_for(group: str):
        async def handle(message):
            seen[group].append(message["data"]["n"])
            if message["data"]["n"] == 7:
                await message["trace"]({"traceName": f"trace-{queue}", "data": {"group": group}})
        return handle

    await asyncio.gather(*(
        client.queue(queue).group(group).concurrency(3).batch(5).each().limit(50).idle_millis(1500).timeout_millis(1000)
        .consume(handler_for(group)) for group in seen))
    want = sorted(list(range(30)) + [100 + p * 10 + i for p in range(5) for i in range(4)])
    for group in seen:
        assert sorted(seen[group]) == want, group  # every message once per group
    traces = await client.admin.get_traces_by_name(f"trace-{queue}")
    assert sorted(t["data"]["group"] for t in traces["traces"]) == ["analytics", "billing"]


async def test_admin_reads_and_seek(client):
    queue = _name("admin")
    await client.queue(queue).namespace("shop").task("ship").config({"priority": 2}).create()
    await client.queue(queue).partition("a").push([{"data": 1}, {"data": 2}])
    queues = await client.admin.list_queues()
    [mine] = [q for q in queues["queues"] if q["name"] == queue]
    assert mine["namespace"] == "shop" and mine["messages"]["pending"] == 2 and mine["partitions"] == 1
    detail = await client.admin.get_queue(queue)
    assert detail["config"]["priority"] == 2 and detail["partitionDetails"][0]["name"] == "a"
    assert (await client.admin.get_overview())["queues"] >= 1
    assert any(n["namespace"] == "shop" for n in (await client.admin.get_namespaces())["namespaces"])
    status = await client.admin.get_status()
    assert sum(p["pushed"] for p in status["throughput"]) >= 2
    depth = await client.admin.get_queue_depth(queue)
    assert depth["pending"] == 2 and depth["partitions"] == [{"partition": "a", "pending": 2}]
    # the namespace pop, then a replay of the group from before the first push
    got = await client.queue().namespace("shop").group("g").batch(5).pop()
    assert [m["data"] for m in got] == [1, 2]
    await client.ack(got, True, {"group": "g"})
    moved = await client.admin.seek_consumer_group("g", queue, {"timestamp": "2000-01-01T00:00:00Z"})
    assert moved["success"] is True
    again = await client.queue(queue).group("g").batch(5).pop()
    assert [m["data"] for m in again] == [1, 2]
    assert (await client.admin.get_message(again[0]["partitionId"], again[0]["transactionId"]))["queue"] == queue


async def test_long_poll_on_one_server_is_woken_by_a_push_on_another(server, module_dsn):
    other = ServerProcess(module_dsn).start()
    queue = _name("wake")
    try:
        async with Queen(server.url, bearer_token="x") as a, Queen(other.url, bearer_token="x") as b:
            await a.queue(queue).create()
            waiting = asyncio.create_task(a.queue(queue).wait(True).timeout_millis(20000).pop())
            await asyncio.sleep(1.0)  # parked on server A, holding no connection
            started = asyncio.get_running_loop().time()
            await b.queue(queue).push([{"data": "ping"}])
            got = await waiting
            took = asyncio.get_running_loop().time() - started
    finally:
        other.kill()
    assert [m["data"] for m in got] == ["ping"]
    assert took < 2.0, took  # woken by the push's notification, not by the end of the wait


def test_errors_are_json_and_routes_need_the_servers_authentication(server):
    r = httpx.post(server.url + "/api/v1/push", json={"items": [{"queue": "x", "payload": 1}]})
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="conveyor"'  # as REST
    auth = {"Authorization": "Bearer x"}
    r = httpx.post(server.url + "/api/v1/push", json={"items": "nope"}, headers=auth)
    assert r.status_code == 400 and "items" in r.json()["error"]
    r = httpx.post(server.url + "/api/v1/ack", json={"transactionId": "t"}, headers=auth)
    assert r.status_code == 400 and "partitionId" in r.json()["error"]
    r = httpx.get(server.url + "/api/v1/messages/not-a-uuid/t", headers=auth)
    assert r.status_code == 400 and "UUID" in r.json()["error"]
    r = httpx.post(server.url + "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend", json={}, headers=auth)
    assert r.status_code == 409
    r = httpx.get(server.url + "/api/v1/nothing", headers=auth)
    assert r.status_code == 404 and r.json()["code"] == "no_such_route"
    r = httpx.post(server.url + "/api/v1/push", content=b"{", headers=auth)
    assert r.status_code == 400


async def test_subscription_timestamp_replays_every_queue_of_a_group(client):
    queue = _name("replay")
    await client.queue(queue).push([{"data": 1}])
    got = await client.queue(queue).group("r").pop()
    await client.ack(got, True, {"group": "r"})
    before = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    assert (await client.update_consumer_group_timestamp("r", before))["success"] is True
    assert [m["data"] for m in await client.queue(queue).group("r").pop()] == [1]
    assert (await client.delete_consumer_group("r"))["success"] is True
