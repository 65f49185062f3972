"""Routing keys and patterns (validated and matched in SQL), topic objects, and
subscriptions: create, idempotence, look-ups, changes, cascades and roles."""

from __future__ import annotations

import uuid

import pytest

from conveyor import errors, types
from conveyor.core import messages, queues, topics

Sub = types.NewSubscription
P = types.Publication
URLS = types.TopicUrls(region="us-east-1", account_id="123456789012", base_url="http://sns.test:9324")

MATCHES = [
    # pattern, routing key, matches
    ("orders", "orders", True),
    ("orders", "orders.created", False),
    ("orders.created", "orders.created", True),
    ("orders.*", "orders.created", True),
    ("orders.*", "orders", False),
    ("orders.*", "orders.created.eu", False),
    ("*.created", "orders.created", True),
    ("*.created", "created", False),
    ("*", "orders", True),
    ("*", "orders.created", False),
    ("orders.#", "orders", True),
    ("orders.#", "orders.created", True),
    ("orders.#", "orders.created.eu.west", True),
    ("orders.#", "ordersx", False),
    ("orders.#", "invoices.orders", False),
    ("#", "anything.at.all", True),
    ("#", "x", True),
    ("#.created", "created", True),
    ("#.created", "orders.eu.created", True),
    ("#.created", "orders.created.not", False),
    ("orders.#.eu", "orders.eu", True),
    ("orders.#.eu", "orders.a.b.eu", True),
    ("orders.#.eu", "orders.a.b.us", False),
    ("*.#.done", "a.done", True),
    ("*.#.done", "done", False),
    ("#.#", "a.b", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("Orders-1_x.*", "Orders-1_x.Y", True),
    ("orders", "Orders", False),  # case matters
    ("eu-west-1:orders.*", "eu-west-1:orders.x", True),
    ("eu-west-1:orders.*", "orders.x", False),
    ("orders.*", "eu-west-1:orders.x", False),
    ("#", "eu-west-1:orders", False),  # a region is part of the key, never matched by #
    ("eu-west-1:#", "eu-west-1:orders", True),
    ("a.fifo", "a.fifo", True),
]


async def test_pattern_matching(conn):
    wrong = [(p, k, want) for p, k, want in MATCHES if await topics.pattern_matches(conn, p, k) is not want]
    assert wrong == []


async def test_invalid_routing_keys_and_patterns(conn):
    for key in ["", "a..b", ".a", "a.", "a b", "a/b", "a.*", "a.#", "é", "x" * 257, "EU:orders", "a:b:c"]:
        with pytest.raises(errors.InvalidInput, match="invalid routing key"):
            await topics.pattern_matches(conn, "#", key)
    for pattern in ["", "a..b", "a.**", "a#", "*a", "a.b c", "a.*/", "x" * 257]:
        with pytest.raises(errors.InvalidInput, match="invalid routing-key pattern"):
            await topics.subscribe(conn, Sub(pattern=pattern, protocol="http", endpoint="http://127.0.0.1/x"))


async def test_longest_keys_and_patterns(conn):
    key = ".".join(["abcdefg"] * 32) + "h"
    assert len(key) == 256
    assert await topics.pattern_matches(conn, "#", key)
    assert await topics.pattern_matches(conn, key, key)


# -- topics ----------------------------------------------------------------------------------

async def test_topic_lifecycle(conn):
    t = await topics.create(conn, "orders", {"DisplayName": "Orders"}, {"team": "a"})
    assert (t.name, t.fifo, t.attributes, t.tags, t.subscriptions) == ("orders", False, {"DisplayName": "Orders"},
                                                                       {"team": "a"}, 0)
    # idempotent: equal attributes are fine, new tags are added
    again = await topics.create(conn, "orders", {"DisplayName": "Orders"}, {"env": "prod"})
    assert again.tags == {"team": "a", "env": "prod"} and again.created_at == t.created_at
    with pytest.raises(errors.InvalidInput, match="different attributes"):
        await topics.create(conn, "orders", {"DisplayName": "Other"})
    fifo = await topics.create(conn, "orders.fifo", {"FifoTopic": "true"})
    assert fifo.fifo
    assert [x.name for x in await topics.list_all(conn)] == ["orders", "orders.fifo"]
    assert [x.name for x in await topics.list_all(conn, prefix="orders.")] == ["orders.fifo"]
    assert [x.name for x in await topics.list_all(conn, after="orders", limit=5)] == ["orders.fifo"]
    changed = await topics.set_attributes(conn, "orders", {"DisplayName": None, "Policy": "{}"})
    assert changed.attributes == {"Policy": "{}"}
    assert await topics.tag(conn, "orders", {"team": None, "x": "1"}) == {"env": "prod", "x": "1"}
    assert await topics.untag(conn, "orders", ["x", "missing"]) == {"env": "prod"}
    assert await topics.delete(conn, "orders")
    assert not await topics.delete(conn, "orders")
    with pytest.raises(errors.TopicNotFound):
        await topics.get(conn, "orders")
    for call in (topics.set_attributes(conn, "nope", {}), topics.tag(conn, "nope", {"a": "b"}),
                 topics.untag(conn, "nope", ["a"])):
        with pytest.raises(errors.TopicNotFound):
            await call


async def test_invalid_topic_names(conn):
    for name in ["", "a.b", "a b", "x" * 257, "y" * 252 + ".fifo", ".fifo", "A:b", "a:b:c"]:
        with pytest.raises(errors.InvalidInput, match="invalid topic name"):
            await topics.create(conn, name)


async def test_topic_names_follow_sns_rules(conn):
    for name in ("x" * 256, "y" * 251 + ".fifo", "eu-west-1:orders", "A-b_9"):
        assert (await topics.create(conn, name)).name == name


async def test_deleting_a_topic_drops_its_subscriptions_only(conn):
    await queues.create(conn, "q")
    await topics.create(conn, "orders")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q"))
    other = await topics.subscribe(conn, Sub(pattern="orders.*", queue="q"))
    assert (await topics.get(conn, "orders")).subscriptions == 1
    await topics.delete(conn, "orders")
    assert [s.id for s in await topics.subscriptions_list(conn)] == [other.id]


# -- subscriptions ---------------------------------------------------------------------------

async def test_subscribe_is_idempotent_per_pattern_and_target(conn):
    await queues.create(conn, "q")
    first = await topics.subscribe(conn, Sub(pattern="orders.*", queue="q"))
    again = await topics.subscribe(conn, Sub(pattern="orders.*", queue="q", raw_delivery=True))
    assert again == first  # the existing subscription, unchanged
    http = await topics.subscribe(conn, Sub(pattern="orders.*", protocol="https", endpoint="https://h.example/x"))
    assert await topics.subscribe(conn, Sub(pattern="orders.*", protocol="https",
                                            endpoint="https://h.example/x")) == http
    other = await topics.subscribe(conn, Sub(pattern="orders.#", queue="q"))
    assert len({first.id, http.id, other.id}) == 3
    assert first.protocol == "sqs" and first.queue == "q" and first.endpoint is None
    assert http.queue is None and http.endpoint == "https://h.example/x"
    assert first.confirmed and not first.raw_delivery and first.filter_policy_scope == "MessageAttributes"


async def test_subscription_lookups(conn):
    await queues.create(conn, "q")
    await queues.create(conn, "r")
    a = await topics.subscribe(conn, Sub(pattern="orders", queue="q"))
    b = await topics.subscribe(conn, Sub(pattern="orders", queue="r"))
    c = await topics.subscribe(conn, Sub(pattern="#", queue="q"))
    for ref in (a.id, a.uuid, str(a.uuid), str(a.id), str(a.uuid).replace("-", "").upper()):
        assert await topics.subscription_get(conn, ref) == a
    assert [s.id for s in await topics.subscriptions_list(conn)] == [a.id, b.id, c.id]
    assert [s.id for s in await topics.subscriptions_list(conn, pattern="orders")] == [a.id, b.id]
    assert [s.id for s in await topics.subscriptions_list(conn, queue="q")] == [a.id, c.id]
    assert [s.id for s in await topics.subscriptions_list(conn, after_id=a.id, limit=1)] == [b.id]
    with pytest.raises(errors.QueueNotFound):
        await topics.subscriptions_list(conn, queue="missing")
    for ref in (uuid.uuid4(), 999999, "not-a-ref", "'; DROP TABLE x; --"):
        with pytest.raises(errors.SubscriptionNotFound):
            await topics.subscription_get(conn, ref)
        assert not await topics.unsubscribe(conn, ref)
    assert await topics.unsubscribe(conn, a.uuid)
    assert not await topics.unsubscribe(conn, a.id)


async def test_subscription_validation(conn):
    await queues.create(conn, "q")
    await queues.create(conn, "f.fifo")
    bad = [
        (Sub(pattern="a", queue="missing"), errors.QueueNotFound),
        (Sub(pattern="a", protocol="sqs"), errors.InvalidInput),
        (Sub(pattern="a", protocol="email", endpoint="x@y.z"), errors.InvalidInput),
        (Sub(pattern="a", protocol="http"), errors.InvalidInput),
        (Sub(pattern="a", protocol="http", endpoint="https://h/x"), errors.InvalidInput),
        (Sub(pattern="a", protocol="https", endpoint="ftp://h/x"), errors.InvalidInput),
        (Sub(pattern="a", protocol="http", endpoint="http://h/x y"), errors.InvalidInput),
        (Sub(pattern="a", protocol="http", endpoint="http://" + "h" * 2050), errors.InvalidInput),
        (Sub(pattern="a", protocol="http", endpoint="http://h/x", queue="q"), errors.InvalidInput),
        (Sub(pattern="a", queue="q", filter_policy_scope="Body"), errors.InvalidInput),
        (Sub(pattern="a", queue="q", filter_policy={"a": "not-a-list"}), errors.InvalidInput),
        # a FIFO queue needs the group id only FIFO routing keys carry
        (Sub(pattern="orders.*", queue="f.fifo"), errors.InvalidInput),
    ]
    for spec, error in bad:
        with pytest.raises(error):
            await topics.subscribe(conn, spec)
    assert (await topics.subscribe(conn, Sub(pattern="*.fifo", queue="f.fifo"))).queue == "f.fifo"
    ok = await topics.subscribe(conn, Sub(pattern="a", protocol="http", endpoint="http://127.0.0.1:8080/p?q=1"))
    assert ok.endpoint == "http://127.0.0.1:8080/p?q=1"


async def test_subscription_changes(conn):
    await queues.create(conn, "q")
    s = await topics.subscribe(conn, Sub(pattern="orders", queue="q", attributes={"DeliveryPolicy": "{}"}))
    s = await topics.subscription_set_attributes(conn, s.uuid, {
        "raw_delivery": True, "filter_policy": '{"kind": ["a"]}',
        "attributes": {"RedrivePolicy": '{"x": 1}', "DeliveryPolicy": None}})
    assert s.raw_delivery and s.filter_policy == {"kind": ["a"]}
    assert s.attributes == {"RedrivePolicy": '{"x": 1}'}
    s = await topics.subscription_set_attributes(conn, s.id, {"filter_policy_scope": "MessageBody"})
    assert s.filter_policy_scope == "MessageBody" and s.filter_policy == {"kind": ["a"]}
    # a nested policy is fine in body scope, and is checked again when the scope changes
    s = await topics.subscription_set_attributes(conn, s.id, {"filter_policy": {"a": {"b": ["c"]}}})
    with pytest.raises(errors.InvalidInput, match="nested"):
        await topics.subscription_set_attributes(conn, s.id, {"filter_policy_scope": "MessageAttributes"})
    s = await topics.subscription_set_attributes(conn, s.id, {"filter_policy": None})
    assert s.filter_policy is None
    s = await topics.subscription_set_attributes(conn, s.id, {"filter_policy": {"k": ["v"]}})
    s = await topics.subscription_set_attributes(conn, s.id, {"filter_policy": ""})
    assert s.filter_policy is None
    s = await topics.subscription_set_attributes(conn, s.id, {"confirmed": False})
    assert not s.confirmed and (await topics.confirm(conn, s.id)).confirmed
    for changes in ({"nope": 1}, {"raw_delivery": "yes"}, {"attributes": []}):
        with pytest.raises(errors.InvalidInput):
            await topics.subscription_set_attributes(conn, s.id, changes)
    with pytest.raises(errors.SubscriptionNotFound):
        await topics.subscription_set_attributes(conn, uuid.uuid4(), {"raw_delivery": True})


async def test_dropping_a_queue_keeps_its_subscriptions(conn):
    """As SNS keeps them (migration 0022): they wait for a queue of that name, as one made
    before its queue existed does, and deliver to it once it is created again."""
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q", raw_delivery=True))
    await queues.drop(conn, "q")
    [kept] = await topics.subscriptions_list(conn)
    assert kept.queue == "q"
    await topics.publish(conn, "orders", P("while gone"), signer=None, urls=URLS)
    await queues.create(conn, "q")
    await topics.publish(conn, "orders", P("back"), signer=None, urls=URLS)
    assert [m.body for m in await messages.receive(conn, "q", qty=10)] == ["while gone", "back"]


# -- roles -----------------------------------------------------------------------------------

async def test_roles_gate_the_topic_functions(conn):
    await queues.create(conn, "q")
    await topics.create(conn, "orders")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q"))
    urls = types.TopicUrls()
    await conn.execute("SET ROLE conveyor_reader")
    assert [t.name for t in await topics.list_all(conn)] == ["orders"]
    assert len(await topics.subscriptions_list(conn)) == 1
    assert await topics.pattern_matches(conn, "#", "a.b")
    with pytest.raises(errors.PermissionDenied):
        await topics.publish(conn, "orders", types.Publication("x"), signer=None, urls=urls)
    await conn.execute("RESET ROLE")
    await conn.execute("SET ROLE conveyor_writer")
    assert (await topics.publish(conn, "orders", types.Publication("x"), signer=None, urls=urls)).queues == ("q",)
    assert await topics.delivery_claim(conn, 10, 30) == []
    for call in (topics.create(conn, "other"), topics.delete(conn, "orders"),
                 topics.subscribe(conn, Sub(pattern="x", queue="q")), topics.unsubscribe(conn, 1)):
        with pytest.raises(errors.PermissionDenied):
            await call
    await conn.execute("RESET ROLE")
    await conn.execute("SET ROLE conveyor_admin")
    assert await topics.unsubscribe(conn, 1)
