"""``conveyor topics`` end to end against a real database through click's runner."""

from __future__ import annotations

import asyncio
import json

from click.testing import Result

from conveyor.core import signing
from conveyor.core import topics as ops
from conveyor.db import pool
from support.cli import failed, ok, ok_json, rows, run


def topics(dsn: str, *args: str, input: str | None = None) -> Result:
    return run(dsn, "topics", *args, input=input)


async def _certificate(dsn: str) -> str:
    async with pool.connect(dsn) as conn:
        return await signing.certificate(conn)


def test_topic_commands(dsn):
    assert ok(topics(dsn, "list")) == "no topics\n"
    created = ok_json(topics(dsn, "create", "orders", "-a", "DisplayName=Orders", "-t", "team=a", "--json"))
    assert (created["name"], created["attributes"], created["tags"]) == ("orders", {"DisplayName": "Orders"},
                                                                         {"team": "a"})
    ok(topics(dsn, "create", "orders.fifo"))
    assert [r[:2] for r in rows(ok(topics(dsn, "list")))] == [["orders", "no"], ["orders.fifo", "yes"]]
    assert [t["name"] for t in ok_json(topics(dsn, "list", "--prefix", "orders.", "--json"))] == ["orders.fifo"]
    ok(run(dsn, "queues", "create", "q"))
    ok(topics(dsn, "subscribe", "orders", "--queue", "q"))
    shown = ok(topics(dsn, "show", "orders"))
    record = dict(line.split(None, 1) if " " in line else (line, "") for line in shown.split("\n\n")[0].splitlines())
    assert record["subscriptions"].strip() == "1"
    assert "attribute DisplayName" in shown and shown.split("attribute DisplayName")[1].split()[0] == "Orders"
    assert [r[1:4] for r in rows(shown.split("\n\n")[1])] == [["orders", "sqs", "q"]]
    detail = ok_json(topics(dsn, "show", "orders", "--json"))
    assert detail["topic"]["subscriptions"] == 1 and detail["subscriptions"][0]["queue"] == "q"
    assert "does not exist" in failed(topics(dsn, "show", "nope"))
    assert "different attributes" in failed(topics(dsn, "create", "orders", "-a", "DisplayName=Other"))
    assert "KEY=VALUE" in failed(topics(dsn, "create", "x", "-a", "novalue"), code=2)
    failed(topics(dsn, "delete", "orders"), code=1)  # asks, and aborts without an answer
    assert ok(topics(dsn, "delete", "orders", "--yes")) == "deleted topic orders\n"
    assert ok_json(topics(dsn, "subscriptions", "--json")) == []  # its subscription went with it
    assert "does not exist" in failed(topics(dsn, "delete", "orders", "-y"))


def test_subscribe_publish_and_receive(dsn):
    ok(run(dsn, "queues", "create", "raw"))
    ok(run(dsn, "queues", "create", "env"))
    raw = ok_json(topics(dsn, "subscribe", "orders.*", "-q", "raw", "--filter-policy", '{"kind": ["big"]}',
                         "--json"))
    env = ok_json(topics(dsn, "subscribe", "orders.#", "-q", "env", "--envelope", "--json"))
    assert (raw["raw_delivery"], env["raw_delivery"], raw["filter_policy"]) == (True, False, {"kind": ["big"]})
    hook = ok_json(topics(dsn, "subscribe", "#", "-e", "http://127.0.0.1:9/hook", "--json"))
    table = rows(ok(topics(dsn, "subscriptions")))
    assert [r[:5] for r in table] == [[str(raw["id"]), "orders.*", "sqs", "raw", "raw"],
                                      [str(env["id"]), "orders.#", "sqs", "env", "envelope"],
                                      [str(hook["id"]), "#", "http", "http://127.0.0.1:9/hook", "raw"]]
    assert [s["id"] for s in ok_json(topics(dsn, "subscriptions", "orders.*", "--json"))] == [raw["id"]]
    assert [s["id"] for s in ok_json(topics(dsn, "subscriptions", "-q", "env", "--json"))] == [env["id"]]

    out = ok(topics(dsn, "publish", "orders.created", "hello", "-a", "kind=big", "--subject", "S"))
    assert out.startswith("published ") and "to 2 queue(s) (raw, env) and 1 endpoint(s)" in out
    p = ok_json(topics(dsn, "publish", "orders.created", "--json", "-a", "kind=small", input="piped"))
    assert p["queues"] == ["env"] and p["endpoints"] == 1
    got = ok_json(run(dsn, "receive", "raw", "--max", "10", "--json"))
    assert [m["body"] for m in got] == ["hello"]
    envelopes = [json.loads(m["body"]) for m in ok_json(run(dsn, "receive", "env", "--max", "10", "--json"))]
    assert [e["Message"] for e in envelopes] == ["hello", "piped"]
    pem = asyncio.run(_certificate(dsn))  # the stored key signed what the CLI published
    assert all(signing.verify(pem, e) for e in envelopes)

    assert "give exactly one of --queue and --endpoint" in failed(topics(dsn, "subscribe", "x"), code=2)
    assert "FilterPolicy" in failed(topics(dsn, "subscribe", "x", "-q", "raw", "--filter-policy", "{bad"))
    assert "protocol must be" in failed(topics(dsn, "subscribe", "x", "-e", "ftp://h/x"))
    assert "invalid routing key" in failed(topics(dsn, "publish", "bad key", "x"))
    assert ok(topics(dsn, "unsubscribe", str(raw["id"]))) == f"deleted subscription {raw['id']}\n"
    assert "does not exist" in failed(topics(dsn, "unsubscribe", str(raw["id"])))
    ok(topics(dsn, "unsubscribe", env["uuid"]))


def test_deliveries(dsn):
    hook = ok_json(topics(dsn, "subscribe", "t", "-e", "http://127.0.0.1:9/hook", "--json"))
    for i in range(3):
        ok(topics(dsn, "publish", "t", f"m{i}"))
    listed = ok_json(topics(dsn, "deliveries", "--json"))
    assert [(d["payload"], d["state"], d["attempt"]) for d in listed] == [("m0", "pending", 0), ("m1", "pending", 0),
                                                                          ("m2", "pending", 0)]
    assert all(d["headers"]["x-amz-sns-rawdelivery"] == "true" for d in listed)
    table = rows(ok(topics(dsn, "deliveries", "--max", "2")))
    assert [r[:4] for r in table] == [[str(listed[0]["id"]), str(hook["id"]), "pending", "0/4"],
                                      [str(listed[1]["id"]), str(hook["id"]), "pending", "0/4"]]
    assert ok(topics(dsn, "deliveries", "--state", "held")) == "no deliveries\n"

    async def hold_and_exhaust() -> None:
        async with pool.connect(dsn) as conn:
            await ops.delivery_hold(conn, listed[0]["id"], "destination not allowed")
            for _ in range(5):
                await ops.delivery_failed(conn, listed[1]["id"], "HTTP 503", 10, 5)  # five attempts in all

    asyncio.run(hold_and_exhaust())
    held = rows(ok(topics(dsn, "deliveries", "--state", "held")))
    assert held[0][2] == "held" and "destination not allowed" in " ".join(held[0])
    assert [d["id"] for d in ok_json(topics(dsn, "deliveries", "--state", "exhausted", "--json"))] == [listed[1]["id"]]
    assert len(ok_json(topics(dsn, "deliveries", "-s", hook["uuid"], "--json"))) == 3
    result = topics(dsn, "deliveries", "--retry", "--json")
    assert "retrying 2 deliveries" in result.stderr
    assert {d["state"] for d in ok_json(result)} == {"pending"}
    assert "does not exist" in failed(topics(dsn, "deliveries", "-s", "999"))
